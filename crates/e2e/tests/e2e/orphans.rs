//! No process drover started outlives a killed daemon, even for a moment, and without a next
//! boot: a daemon in a process of its own (`drover-daemon-proc`) dies by SIGKILL (or a signal
//! it does not handle) with agents idle, streaming, waiting on a tool in a group of its own,
//! with a child in their group, with a tool in a session of its own that has a child, ignoring
//! stdin's end, and a job whose shell started grandchildren (one of them in a session of its
//! own); within 2 s every one of those processes is gone. Once with the daemon's cgroups (where
//! a job's grandchild that cleared its whole environment is caught too) and once with
//! `DROVER_NO_CGROUPS=1` (the marker alone).

use drover_testkit::daemon::string_at;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_fakes::procs;
use drover_testkit::wait::{eventually, poll_until};
use nix::sys::signal::Signal;
use serde_json::json;
use tempfile::TempDir;

use crate::processes::{
    DaemonProcess, Home, alive, config, create, create_each, printed_pids, said, said_pid,
};

const WAIT: Duration = Duration::from_secs(20);
/// What the issue promises: every process ends within 2 s of the daemon's death.
const WITHIN: Duration = Duration::from_secs(2);

/// The cgroup v2 directory of `pid`, when the machine has cgroup v2.
pub(crate) fn cgroup_dir(pid: i32) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// Whether a daemon started by this test process can use cgroups: a cgroup v2 below this
/// process's own can be made, and has `cgroup.kill`. Where it cannot, the daemon falls back to
/// the marker, and the cgroup tests check that fallback instead (saying so).
pub(crate) fn cgroups_here() -> bool {
    let Some(own) = cgroup_dir(i32::try_from(std::process::id()).expect("pid")) else {
        return false;
    };
    let probe = own.join(format!("drover-probe-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).is_ok();
    let usable = made && probe.join("cgroup.kill").exists();
    if made {
        let _ = std::fs::remove_dir(&probe);
    }
    if !usable {
        eprintln!("no writable cgroup v2 with cgroup.kill here: checking the marker fallback");
    }
    usable
}

/// The guard of the daemon `daemon`: the process run as `__drover-guard <daemon pid>-…`.
pub(crate) fn guard_of(daemon: u32) -> Option<i32> {
    let prefix = format!("{daemon}-");
    procs::live().into_iter().find_map(|p| {
        let argv = p.argv();
        (argv.get(1).is_some_and(|a| a == "__drover-guard")
            && argv.get(2).is_some_and(|t| t.starts_with(&prefix)))
        .then_some(p.pid)
    })
}

/// Kills the daemon with `signal`, then waits at most [`WITHIN`] for every pid of `watched`
/// and every process carrying the daemon's marker to be gone; fails naming what is left.
pub(crate) async fn assert_all_gone_within(
    daemon: &mut DaemonProcess,
    signal: Signal,
    watched: &[i32],
    what: &str,
) {
    let pid = daemon.pid();
    daemon.die_by(signal);
    let died = Instant::now();
    let gone = poll_until(WITHIN, async || {
        watched.iter().all(|p| !alive(*p)) && procs::of_daemon(pid).is_empty()
    })
    .await;
    let mut left: Vec<i32> = watched.iter().copied().filter(|p| alive(*p)).collect();
    left.extend(procs::of_daemon(pid).iter().map(|p| p.pid));
    left.sort_unstable();
    left.dedup();
    let left: Vec<(i32, String)> = left
        .into_iter()
        .map(|p| {
            (
                p,
                procs::Process::read(p)
                    .map(|p| p.command_line())
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        gone.is_some(),
        "{what}: alive {:?} after the daemon died by {signal}: {left:?}",
        died.elapsed()
    );
}

/// The daemon's environment for a run with its cgroups or without (`DROVER_NO_CGROUPS`).
pub(crate) fn cgroups_env(cgroups: bool) -> &'static [(&'static str, &'static str)] {
    if cgroups {
        &[]
    } else {
        &[("DROVER_NO_CGROUPS", "1")]
    }
}

// One story: every kind of process started, then one death.
#[expect(clippy::too_many_lines)]
async fn nothing_outlives_the_daemon(cgroups: bool, signal: Signal) {
    let cgroups = cgroups && cgroups_here();
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let env = cgroups_env(cgroups);
    let mut daemon = DaemonProcess::start_with(home.path(), env).await;
    let mut client = daemon.client().await;

    // Only a cgroup can find what the last one starts.
    let escaping = if cgroups { "spawn-escapee" } else { "say hi" };
    let [
        idle,
        streaming,
        on_tool,
        with_child,
        with_session,
        stubborn,
        escaping,
    ] = create_each(
        &mut client,
        &cwd,
        [
            ("scripted", "say hi"),
            ("scripted", "stream 1000000 20"),
            ("scripted", "spawn-tool\nhang"),
            ("scripted", "spawn-child"),
            ("scripted", "spawn-session"),
            ("stubborn", "say hi"),
            ("scripted", escaping),
        ],
    )
    .await;
    for agent in [&idle, &with_child, &with_session, &stubborn, &escaping] {
        let idle = client
            .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 15000}))
            .await;
        assert_eq!(idle["payload"]["idle"], true, "{idle}");
    }
    eventually("the streaming agent to stream", WAIT, async || {
        said(&mut client, &streaming).await.contains("chunk ")
    })
    .await;
    eventually("the agent to start its tool", WAIT, async || {
        said(&mut client, &on_tool).await.contains("tool ")
    })
    .await;

    // A job whose shell starts a grandchild in its group and one in a session of its own;
    // with cgroups, also one that clears its whole environment (no marker left to find).
    let escapee = if cgroups {
        "env -i setsid sleep 1000 & echo pid=$!; "
    } else {
        ""
    };
    let started = client
        .request(json!({"type": "start_job", "agentId": idle, "command": format!(
            "sleep 1000 & echo pid=$!; setsid sh -c 'sleep 1000 & wait' & echo pid=$!; {escapee}wait"
        )}))
        .await;
    assert_eq!(started["type"], "job", "{started}");
    let job = string_at(&started["payload"]["job"]["id"]);
    let job_leader =
        i32::try_from(started["payload"]["job"]["pid"].as_u64().expect("pid")).expect("pid");
    let expected = if cgroups { 3 } else { 2 };
    let grandchildren = eventually("the job's grandchildren", WAIT, async || {
        let out = client
            .request(json!({"type": "job_output", "jobId": job, "offset": 0}))
            .await;
        let found = printed_pids(out["payload"]["text"].as_str().unwrap_or_default());
        (found.len() == expected && found.iter().all(|p| alive(*p))).then_some(found)
    })
    .await;

    let mut watched: Vec<i32> = vec![job_leader];
    watched.extend(&grandchildren);
    watched.push(said_pid(&mut client, &with_child, "child").await);
    watched.push(said_pid(&mut client, &on_tool, "tool").await);
    let escapee = if cgroups {
        let escapee = said_pid(&mut client, &escaping, "escapee").await;
        watched.push(escapee);
        Some(escapee)
    } else {
        None
    };
    let session = said_pid(&mut client, &with_session, "session").await;
    // The session's shell and its `sleep`.
    watched.extend(procs::tree(session).iter().map(|p| p.pid));
    // Every process of the daemon's tree, found by its marker: the agents themselves included.
    for p in procs::of_daemon(daemon.pid()) {
        if !watched.contains(&p.pid) {
            watched.push(p.pid);
        }
    }
    for agent in [
        &idle,
        &streaming,
        &on_tool,
        &with_child,
        &with_session,
        &stubborn,
        &escaping,
    ] {
        let leaders = procs::of_agent(agent);
        assert!(!leaders.is_empty(), "no process of agent {agent}");
        assert!(leaders.iter().all(|p| watched.contains(&p.pid)));
    }
    assert!(watched.len() >= 7 + 1 + expected + 4, "{watched:?}");
    assert!(watched.iter().all(|p| alive(*p)), "{watched:?}");

    // Where each lives: below the daemon's cgroup, or nowhere of drover's.
    let daemon_cgroup = format!("drover-{}", daemon.pid());
    let session_cgroup = cgroup_dir(session).expect("a cgroup v2 path");
    assert_eq!(
        session_cgroup
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| *n == *daemon_cgroup),
        cgroups,
        "{}",
        session_cgroup.display()
    );
    let base = session_cgroup.parent().map(Path::to_path_buf);
    if cgroups {
        // The escapees carry no marker: only their cgroups can find them.
        for escaped in [Some(grandchildren[2]), escapee].into_iter().flatten() {
            let escaped = procs::Process::read(escaped).expect("the escapee");
            assert_eq!(escaped.env("DROVER_DAEMON_RUN"), None);
        }
        let escapee = escapee
            .and_then(procs::Process::read)
            .expect("the agent's escapee");
        assert_ne!(
            procs::Process::read(escapee.ppid).and_then(|p| p.env("DROVER_AGENT_ID")),
            Some(escaping.clone()),
            "the escapee left the agent's tree"
        );
    }
    let guard = guard_of(daemon.pid()).expect("the daemon's guard runs");

    assert_all_gone_within(&mut daemon, signal, &watched, "the daemon's processes").await;
    // The guard did its work and is gone, and with cgroups it removed them.
    let guard_gone = poll_until(WITHIN, async || !alive(guard)).await;
    assert!(guard_gone.is_some(), "the guard outlived its work");
    if cgroups {
        let base = base.expect("the daemon's cgroup");
        assert!(!base.exists(), "{} was left behind", base.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_with_cgroups_nothing_outlives_a_sigkilled_daemon() {
    nothing_outlives_the_daemon(true, Signal::SIGKILL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_without_cgroups_nothing_outlives_a_sigkilled_daemon() {
    nothing_outlives_the_daemon(false, Signal::SIGKILL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_nothing_outlives_a_daemon_killed_by_a_signal_it_does_not_handle() {
    // SIGUSR1's default action ends the process at once, with no shutdown of its own.
    nothing_outlives_the_daemon(true, Signal::SIGUSR1).await;
}

/// Archiving an agent ends what it started, even a process that left its tree and dropped its
/// markers: the agent's cgroup holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_archive_ends_what_left_the_agents_tree_through_its_cgroup() {
    if !cgroups_here() {
        // Without cgroups nothing can find that process: the limit ARCHITECTURE.md states.
        return;
    }
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let agent = create(
        &mut client,
        "scripted",
        &cwd,
        "spawn-escapee\nspawn-session",
    )
    .await;
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 15000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{idle}");
    let escapee = said_pid(&mut client, &agent, "escapee").await;
    let session = said_pid(&mut client, &agent, "session").await;
    let mut watched: Vec<i32> = procs::tree(session).iter().map(|p| p.pid).collect();
    watched.push(escapee);
    watched.extend(procs::of_agent(&agent).iter().map(|p| p.pid));
    assert!(watched.iter().all(|p| alive(*p)), "{watched:?}");
    assert!(
        cgroup_dir(escapee)
            .and_then(|c| c.parent().map(Path::to_path_buf))
            .is_some_and(|c| c.ends_with(format!("drover-{}", daemon.pid()))),
        "the agent runs in a cgroup of the daemon's"
    );

    let archived = client
        .request(json!({"type": "archive", "agentId": agent}))
        .await;
    assert_ne!(archived["type"], "rpc_error", "{archived}");
    let gone = poll_until(WAIT, async || watched.iter().all(|p| !alive(*p))).await;
    let left: Vec<&i32> = watched.iter().filter(|p| alive(**p)).collect();
    assert!(gone.is_some(), "alive after the archive: {left:?}");
}

/// An agent that crashes takes with it what it started, even a process that left its tree and
/// dropped its markers: its cgroup holds it. The daemon keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_crashed_agent_leaves_nothing_through_its_cgroup() {
    if !cgroups_here() {
        // Without cgroups nothing can find that process: the limit ARCHITECTURE.md states.
        return;
    }
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let agent = create(&mut client, "scripted", &cwd, "spawn-escapee").await;
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 15000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{idle}");
    let escapee = said_pid(&mut client, &agent, "escapee").await;
    assert!(alive(escapee));
    client.send_message(&agent, "crash").await;
    let gone = poll_until(WAIT, async || !alive(escapee)).await;
    assert!(gone.is_some(), "the escapee outlived its crashed agent");
    assert!(
        alive(i32::try_from(daemon.pid()).expect("pid")),
        "the daemon lives on"
    );
}

/// A daemon killed together with its guard leaves its cgroup behind; the next daemon started
/// on the machine (here on another home) ends what that cgroup holds, even a process no marker
/// or record can find, and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_the_next_daemon_ends_what_a_daemon_killed_with_its_guard_left_in_its_cgroup() {
    if !cgroups_here() {
        // Without cgroups nothing can find that process: the limit ARCHITECTURE.md states.
        return;
    }
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let mut daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let agent = create(&mut client, "scripted", &cwd, "spawn-escapee").await;
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 15000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{idle}");
    let escapee = said_pid(&mut client, &agent, "escapee").await;
    let base = cgroup_dir(escapee)
        .and_then(|c| c.parent().map(Path::to_path_buf))
        .expect("the daemon's cgroup");
    assert!(base.ends_with(format!("drover-{}", daemon.pid())));

    // Nothing but the guard could end the escapee now (or any daemon that starts meanwhile:
    // other tests run theirs).
    daemon.kill_guard();
    daemon.die_by(Signal::SIGKILL);

    let other_home = TempDir::new().expect("another home");
    let _next = DaemonProcess::start(other_home.path()).await;
    let gone = poll_until(WAIT, async || !alive(escapee) && !base.exists()).await;
    assert!(
        gone.is_some(),
        "escapee alive: {}, {} left: {}",
        alive(escapee),
        base.display(),
        base.exists()
    );
}
