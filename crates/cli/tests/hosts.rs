//! Hosts: a hub daemon and other machines' daemons, each in a network namespace of its own
//! joined by veth pairs, the hosts reached over Debian's OpenSSH with keys the test made, as a
//! user sets them up (`drover host add NAME ssh://root@ADDRESS --identity KEY`). Everything the
//! user does goes through the `drover` binary run inside the hub's namespace; the agents are the
//! demo provider's (the scripted agent the binary ships).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use drover_testkit::hermetic;
use drover_testkit::netns::{Machine, SshServer, link};
use drover_testkit::wait::poll_until_blocking;
use serde_json::{Value, json};

const DROVER: &str = env!("CARGO_BIN_EXE_drover");

/// `drover ARGS` on a machine of the fleet, as its user.
fn drover(machine: &Machine, args: &[&str]) -> Output {
    machine.command(args).output().expect("run drover")
}

/// `drover ARGS` that must succeed, its stdout as JSON.
fn json(machine: &Machine, args: &[&str]) -> Value {
    let out = drover(machine, args);
    assert!(out.status.success(), "drover {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A hub and one host `b` behind its own sshd, linked at 10.77.1.1 ↔ 10.77.1.2; `b`'s user
/// finds `drover` on its `PATH` (this build's).
struct Fleet {
    hub: Machine,
    b: Machine,
    ssh: SshServer,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn new() -> Fleet {
        Fleet::with_drover(true)
    }

    /// `drover_on_path`: whether b's user finds this build's `drover` on its `PATH`.
    fn with_drover(drover_on_path: bool) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let hub = Machine::new(dir.path(), "hub", Path::new(DROVER)).expect("hub machine");
        let (b, ssh) = ssh_machine(dir.path(), (&hub, "hub"), "b", "10.77.1", drover_on_path);
        // A ceiling on the hub's own runtimes: `--host auto` finds more room on b (none).
        std::fs::create_dir_all(&hub.drover_home).expect("hub home");
        std::fs::write(
            hub.drover_home.join("config.toml"),
            "[runtimes]\nmax_live = 2\n",
        )
        .expect("hub config");
        let started = drover(&hub, &["daemon", "start"]);
        assert!(started.status.success(), "hub start: {}", text(&started));
        Fleet { hub, b, ssh, dir }
    }

    /// `drover host add b ssh://root@10.77.1.2 --identity KEY` with the test's ssh options.
    fn add_b(&self, key: &Path) -> Output {
        self.add_b_with(key, &[])
    }

    fn add_b_with(&self, key: &Path, more: &[&str]) -> Output {
        host_add(&self.hub, "b", &self.ssh, key, more)
    }

    /// Asserts that `drover logs ID` on the hub shows `said`.
    fn logs_contain(&self, id: &str, said: &str) {
        let logs = drover(&self.hub, &["logs", id]);
        assert!(
            String::from_utf8_lossy(&logs.stdout).contains(said),
            "{}",
            text(&logs)
        );
    }

    fn host_b(&self) -> Value {
        let hosts = json(&self.hub, &["host", "ls", "--json"]);
        hosts
            .as_array()
            .and_then(|h| h.iter().find(|h| h["name"] == "b"))
            .cloned()
            .expect("host b listed")
    }

    fn wait_host_state(&self, state: &str, within: Duration) -> Value {
        poll_until_blocking(within, || {
            let host = self.host_b();
            (host["state"] == state).then_some(host)
        })
        .unwrap_or_else(|| panic!("host b not {state} within {within:?}: {}", self.host_b()))
    }

    /// Runs a demo agent on `b` (detached); its id.
    fn run_on_b(&self, prompt: &str) -> String {
        let work = self.b.work.display().to_string();
        let out = drover(
            &self.hub,
            &[
                "run",
                "--host",
                "b",
                "--cwd",
                &work,
                "--provider",
                "demo",
                "--detach",
                prompt,
            ],
        );
        assert!(out.status.success(), "run --host b: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// `drover host add NAME ssh://root@ADDRESS --identity KEY` on `machine`, for `ssh`'s server,
/// with the test's ssh options and `more`.
fn host_add(machine: &Machine, name: &str, ssh: &SshServer, key: &Path, more: &[&str]) -> Output {
    let mut args = vec![
        "host".to_string(),
        "add".to_string(),
        name.to_string(),
        format!("ssh://root@{}", ssh.address),
        "--identity".to_string(),
        key.display().to_string(),
    ];
    for option in ssh.ssh_options() {
        args.extend(["--ssh-option".to_string(), option]);
    }
    args.extend(more.iter().map(ToString::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    drover(machine, &args)
}

/// A machine `name` under `dir` behind its own sshd, linked to `from` (named `from_name`) at
/// `subnet`.1 (there) ↔ `subnet`.2 (here), interfaces `to-NAME` and `to-FROM_NAME`; with
/// `drover_on_path` its user finds this build's `drover` on its `PATH`.
fn ssh_machine(
    dir: &Path,
    (from, from_name): (&Machine, &str),
    name: &str,
    subnet: &str,
    drover_on_path: bool,
) -> (Machine, SshServer) {
    let machine = Machine::new(dir, name, Path::new(DROVER)).expect("machine");
    let address = format!("{subnet}.2");
    link(
        &from.ns,
        &format!("to-{name}"),
        &format!("{subnet}.1/24"),
        &machine.ns,
        &format!("to-{from_name}"),
        &format!("{address}/24"),
    )
    .expect("veth");
    let bin_dir = Path::new(DROVER)
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let path = if drover_on_path {
        format!("{bin_dir}:{}", hermetic::SYSTEM_PATH)
    } else {
        hermetic::SYSTEM_PATH.to_string()
    };
    // b's keeps the directory it always had.
    let ssh_dir = if name == "b" {
        dir.join("sshd")
    } else {
        dir.join(format!("sshd-{name}"))
    };
    let ssh = SshServer::start(
        &machine.ns,
        &address,
        &ssh_dir,
        &[
            ("PATH", &path),
            ("HOME", &machine.home.display().to_string()),
            ("DROVER_HOME", &machine.drover_home.display().to_string()),
            ("DROVER_LISTEN", "127.0.0.1:7717"),
        ],
    )
    .expect("sshd");
    (machine, ssh)
}

fn agent<'a>(agents: &'a Value, id: &str) -> Option<&'a Value> {
    agents.as_array()?.iter().find(|a| a["id"] == id)
}

#[test]
fn a_remote_agent_is_driven_from_the_hub_like_a_local_one() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    assert!(
        text(&added).contains("host `b` is reachable"),
        "{}",
        text(&added)
    );
    let host = fleet.host_b();
    assert_eq!(host["version"], env!("CARGO_PKG_VERSION"), "{host}");
    assert_eq!(host["target"], "ssh://root@10.77.1.2", "{host}");

    // Streamed from b through the hub, as `drover run` shows it.
    let work = fleet.b.work.display().to_string();
    let run = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "b",
            "--cwd",
            &work,
            "--provider",
            "demo",
            "say streamed from b",
        ],
    );
    assert!(run.status.success(), "{}", text(&run));
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("streamed from b"),
        "{}",
        text(&run)
    );

    // One fleet: the hub lists it with its host; b's own daemon holds it.
    let on_hub = json(&fleet.hub, &["ls", "--json"]);
    let remote = on_hub.as_array().expect("agents")[0].clone();
    let id = remote["id"].as_str().expect("id").to_string();
    assert_eq!(remote["host"], "b", "{remote}");
    assert_eq!(remote["cwd"], work, "{remote}");
    let on_b = json(&fleet.b, &["ls", "--json"]);
    assert!(
        agent(&on_b, &id).is_some(),
        "b's daemon does not hold {id}: {on_b}"
    );
    assert!(agent(&on_b, &id).is_some_and(|a| a.get("host").is_none()));
    let table = drover(&fleet.hub, &["ls"]);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("HOST") && table.contains(" b "), "{table}");
    assert_eq!(
        json(&fleet.hub, &["ls", "--json", "--host", "local"]),
        Value::Array(Vec::new())
    );
    assert!(agent(&json(&fleet.hub, &["ls", "--json", "--host", "b"]), &id).is_some());

    // Every other command works on it: send, wait, logs, archive, unarchive.
    let sent = drover(&fleet.hub, &["send", &id, "say second words"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let waited = drover(&fleet.hub, &["wait", &id, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));
    fleet.logs_contain(&id, "second words");
    a_job_runs_on_b(&fleet, &id);

    // `--host auto`: the reachable machine with the most free slots.
    let auto = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "auto",
            "--cwd",
            &work,
            "--provider",
            "demo",
            "--detach",
            "say placed",
        ],
    );
    assert!(auto.status.success(), "{}", text(&auto));
    let placed = String::from_utf8_lossy(&auto.stdout).trim().to_string();
    assert!(
        agent(&json(&fleet.b, &["ls", "--json"]), &placed).is_some(),
        "not placed on b"
    );

    let archived = drover(&fleet.hub, &["archive", &id]);
    assert!(archived.status.success(), "{}", text(&archived));
    let on_b = json(&fleet.b, &["ls", "--json", "--all"]);
    assert!(
        agent(&on_b, &id).is_some_and(|a| !a["archivedAt"].is_null()),
        "archived on b: {on_b}"
    );
    let seen = poll_until_blocking(Duration::from_secs(5), || {
        let all = json(&fleet.hub, &["ls", "--json", "--all"]);
        agent(&all, &id)
            .is_some_and(|a| !a["archivedAt"].is_null())
            .then_some(())
    });
    assert!(seen.is_some(), "the hub did not hear of the archive");

    mistakes_are_named(&fleet);
}

/// A job started on b's agent from the hub: its id names its host (each daemon numbers its
/// own jobs), its output and listing reach the hub.
fn a_job_runs_on_b(fleet: &Fleet, id: &str) {
    let job = json(
        &fleet.hub,
        &[
            "job",
            "start",
            id,
            "--no-notify",
            "--json",
            "--",
            "sh",
            "-c",
            "echo job ran on b",
        ],
    );
    let job_id = job["id"].as_str().expect("job id").to_string();
    assert!(job_id.ends_with("@b"), "{job}");
    let ran = poll_until_blocking(Duration::from_secs(20), || {
        let out = drover(&fleet.hub, &["job", "logs", &job_id]);
        String::from_utf8_lossy(&out.stdout)
            .contains("job ran on b")
            .then_some(())
    });
    assert!(ran.is_some(), "the job's output never reached the hub");
    // Followed live through the hub: what it writes as it writes it, to its end.
    let slow = json(
        &fleet.hub,
        &[
            "job",
            "start",
            id,
            "--no-notify",
            "--json",
            "--",
            "sh",
            "-c",
            "echo first; sleep 2; echo second",
        ],
    );
    let slow_id = slow["id"].as_str().expect("job id").to_string();
    let mut follow = fleet
        .hub
        .command(&["job", "logs", "--follow", &slow_id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("follow");
    let ended = poll_until_blocking(Duration::from_secs(30), || follow.try_wait().ok().flatten());
    if ended.is_none() {
        let _ = follow.kill();
    }
    let out = follow.wait_with_output().expect("follow output");
    assert!(ended.is_some_and(|s| s.success()), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "first\nsecond\n",
        "{}",
        text(&out)
    );
    let jobs = json(&fleet.hub, &["job", "ls", "--json"]);
    assert!(
        jobs.as_array()
            .is_some_and(|j| j.iter().any(|j| j["id"] == job_id)),
        "{jobs}"
    );
    let on_b = json(&fleet.b, &["job", "ls", "--json"]);
    let plain = job_id.trim_end_matches("@b");
    assert!(
        on_b.as_array()
            .is_some_and(|j| j.iter().any(|j| j["id"] == plain)),
        "{on_b}"
    );
}

fn mistakes_are_named(fleet: &Fleet) {
    let no_cwd = drover(
        &fleet.hub,
        &["run", "--host", "b", "--provider", "demo", "hi"],
    );
    assert!(!no_cwd.status.success());
    assert!(text(&no_cwd).contains("give --cwd"), "{}", text(&no_cwd));
    let unknown = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "nope",
            "--cwd",
            "/",
            "--provider",
            "demo",
            "hi",
        ],
    );
    assert!(!unknown.status.success());
    assert!(
        text(&unknown).contains("no host named `nope`"),
        "{}",
        text(&unknown)
    );

    // A removed host's agents leave the hub's view and go on over there.
    let before = json(&fleet.b, &["ls", "--json", "--all"]);
    let removed = drover(&fleet.hub, &["host", "rm", "b"]);
    assert!(removed.status.success(), "{}", text(&removed));
    let on_hub = json(&fleet.hub, &["ls", "--json", "--all"]);
    assert!(
        on_hub
            .as_array()
            .is_some_and(|a| a.iter().all(|a| a.get("host").is_none())),
        "{on_hub}"
    );
    let ids = |agents: &Value| -> Vec<String> {
        agents
            .as_array()
            .map(|a| a.iter().map(|a| a["id"].to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        ids(&json(&fleet.b, &["ls", "--json", "--all"])),
        ids(&before)
    );
    assert!(!ids(&before).is_empty());
}

#[test]
fn a_refused_key_on_b_says_to_replace_it_on_b() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    // codex-acp's words when its model API answers 401.
    let id = fleet.run_on_b("fail unexpected status 401 Unauthorized: Incorrect API key provided");
    let failed = |machine: &Machine| {
        let logs = drover(machine, &["logs", &id]);
        String::from_utf8_lossy(&logs.stdout)
            .lines()
            .find(|l| l.contains("failed:"))
            .map(str::to_string)
    };
    let on_hub = poll_until_blocking(Duration::from_secs(20), || failed(&fleet.hub));
    let on_hub = on_hub.unwrap_or_default();
    assert!(
        on_hub.contains("[providers.demo] env in the config.toml of host `b`")
            && on_hub.contains("on host `b`, `drover login demo`"),
        "{on_hub}"
    );
    // b's own user is told of its own config.toml.
    let on_b = failed(&fleet.b).unwrap_or_default();
    assert!(
        on_b.contains("[providers.demo] env in config.toml") && !on_b.contains("host `b`"),
        "{on_b}"
    );
}

#[test]
fn a_cut_link_shows_unreachable_fails_fast_and_heals() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    // A turn that outlasts the cut.
    let id = fleet.run_on_b("sleep 9000\nsay finished on b");
    // A subagent b refuses (it has no such folder) leaves its parent nothing there.
    let hub_work = fleet.hub.work.display().to_string();
    let made = drover(
        &fleet.hub,
        &[
            "run",
            "--cwd",
            &hub_work,
            "--provider",
            "demo",
            "--detach",
            "say hi",
        ],
    );
    assert!(made.status.success(), "{}", text(&made));
    let parent = String::from_utf8_lossy(&made.stdout).trim().to_string();
    let refused = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "b",
            "--parent",
            &parent,
            "--cwd",
            "/no/such/folder",
            "--provider",
            "demo",
            "--detach",
            "hi",
        ],
    );
    assert!(
        !refused.status.success(),
        "b made an agent in a missing folder"
    );
    assert!(
        text(&refused).contains("/no/such/folder"),
        "{}",
        text(&refused)
    );

    fleet
        .b
        .ns
        .exec(&["ip", "link", "set", "to-hub", "down"])
        .expect("cut");
    let cut_at = Instant::now();
    let host = fleet.wait_host_state("unreachable", Duration::from_secs(20));
    assert!(
        !host["since"].as_str().unwrap_or_default().is_empty(),
        "{host}"
    );
    assert!(!host["error"].is_null(), "{host}");
    let table = String::from_utf8_lossy(&drover(&fleet.hub, &["ls"]).stdout).to_string();
    assert!(table.contains("b (unreachable"), "{table}");
    // So archiving it need not ask b.
    let waited = drover(&fleet.hub, &["wait", &parent, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));
    let archived = drover(&fleet.hub, &["archive", &parent]);
    assert!(archived.status.success(), "{}", text(&archived));

    // A request for it fails at once, naming the host.
    let asked = Instant::now();
    let sent = drover(&fleet.hub, &["send", &id, "say are you there"]);
    assert!(!sent.status.success());
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );
    assert!(
        text(&sent).contains("host `b` is unreachable"),
        "{}",
        text(&sent)
    );

    // The agent goes on over there.
    fleet
        .b
        .ns
        .exec(&["ip", "link", "set", "to-hub", "up"])
        .expect("heal");
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    let done = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&fleet.hub, &["ls", "--json"]);
        agent(&agents, &id)
            .is_some_and(|a| a["status"] == "idle")
            .then_some(())
    });
    assert!(
        done.is_some(),
        "the turn did not end on b (cut {:?} ago)",
        cut_at.elapsed()
    );
    fleet.logs_contain(&id, "finished on b");
}

#[test]
fn daemons_killed_on_either_side_come_back_linked() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let id = fleet.run_on_b("say before the kills");
    let waited = drover(&fleet.hub, &["wait", &id, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));

    // The hub dies by SIGKILL and starts again: the host is linked again from hosts.json.
    assert!(fleet.hub.kill_daemon(), "the hub's daemon outlived SIGKILL");
    let started = drover(&fleet.hub, &["daemon", "start"]);
    assert!(started.status.success(), "{}", text(&started));
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    assert!(agent(&json(&fleet.hub, &["ls", "--json"]), &id).is_some());

    // b's daemon dies by SIGKILL: the link ends, and the next one starts it again
    // (`drover connect --stdio`); its agent is there, its process gone.
    assert!(fleet.b.kill_daemon(), "b's daemon outlived SIGKILL");
    let back = poll_until_blocking(Duration::from_secs(30), || {
        let host = fleet.host_b();
        let b_pid = fleet.b.daemon_pid()?;
        (host["state"] == "reachable").then_some(b_pid)
    });
    assert!(
        back.is_some(),
        "b's daemon was not started again: {}",
        fleet.host_b()
    );
    let remote = poll_until_blocking(Duration::from_secs(10), || {
        let agents = json(&fleet.hub, &["ls", "--json"]);
        agent(&agents, &id)
            .filter(|a| a["runtime"]["state"] == "cold")
            .cloned()
    })
    .expect("the hub shows b's agent with no process after b's daemon died");
    assert_eq!(remote["host"], "b");
    let sent = drover(&fleet.hub, &["send", &id, "say after the kills"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let waited = drover(&fleet.hub, &["wait", &id, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));
    fleet.logs_contain(&id, "after the kills");
}

/// `drover daemon stop` on the hub names the turns it cut off: its own agents', not those of
/// its hosts, which keep running on their own daemon.
#[test]
fn stopping_the_hub_names_only_its_own_cut_turns() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let remote = fleet.run_on_b("sleep 60000");
    let hub_work = fleet.hub.work.display().to_string();
    let made = drover(
        &fleet.hub,
        &[
            "run",
            "--cwd",
            &hub_work,
            "--provider",
            "demo",
            "--title",
            "local",
            "--detach",
            "sleep 60000",
        ],
    );
    assert!(made.status.success(), "{}", text(&made));
    let local = String::from_utf8_lossy(&made.stdout).trim().to_string();
    wait_status(&fleet.hub, &remote, "running");
    wait_status(&fleet.hub, &local, "running");
    let stopped = drover(&fleet.hub, &["daemon", "stop"]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    let said = String::from_utf8_lossy(&stopped.stderr);
    let handle = |id: &str| id.replace('-', "")[24..].to_string();
    assert!(
        said.contains("it cut off 1 turn(s)")
            && said.contains(&format!("    {}  local\n", handle(&local)))
            && !said.contains(&handle(&remote)),
        "{}",
        text(&stopped)
    );
}

#[test]
fn a_refused_login_is_a_clear_error() {
    let fleet = Fleet::new();
    let wrong = fleet.dir.path().join("wrong_key");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&wrong)
        .status()
        .expect("ssh-keygen");
    assert!(made.success());
    let added = fleet.add_b(&wrong);
    assert!(!added.status.success(), "{}", text(&added));
    let said = text(&added);
    assert!(
        said.contains("host `b` was added but is unreachable"),
        "{said}"
    );
    assert!(said.contains("Permission denied"), "{said}");
    let host = fleet.host_b();
    assert_eq!(host["state"], "unreachable");
    assert!(
        host["error"]
            .as_str()
            .unwrap_or_default()
            .contains("Permission denied"),
        "{host}"
    );
    let removed = drover(&fleet.hub, &["host", "rm", "b"]);
    assert!(removed.status.success(), "{}", text(&removed));
    assert_eq!(
        json(&fleet.hub, &["host", "ls", "--json"]),
        Value::Array(Vec::new())
    );
}

#[test]
fn a_host_without_drover_gets_this_one_with_install() {
    let fleet = Fleet::with_drover(false);
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(!added.status.success(), "{}", text(&added));
    assert!(
        text(&added).contains("drover: not found"),
        "{}",
        text(&added)
    );
    let removed = drover(&fleet.hub, &["host", "rm", "b"]);
    assert!(removed.status.success(), "{}", text(&removed));

    let installed = fleet.add_b_with(&fleet.ssh.key, &["--install"]);
    assert!(installed.status.success(), "{}", text(&installed));
    let said = text(&installed);
    assert!(
        said.contains("installed drover") && said.contains("it had none"),
        "{said}"
    );
    assert!(said.contains("host `b` is reachable"), "{said}");
    assert!(fleet.b.home.join(".local/bin/drover").is_file());
    assert_eq!(fleet.host_b()["version"], env!("CARGO_PKG_VERSION"));

    // The same version there: nothing is copied.
    let removed = drover(&fleet.hub, &["host", "rm", "b"]);
    assert!(removed.status.success(), "{}", text(&removed));
    let again = fleet.add_b_with(&fleet.ssh.key, &["--install"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("has drover"), "{}", text(&again));
}

/// The user messages in `parent`'s timeline on the hub that `kid` sent (its notices) and that
/// say `marker`.
fn notices(fleet: &Fleet, parent: &str, kid: &str, marker: &str) -> usize {
    let logs = drover(&fleet.hub, &["logs", parent, "--json"]);
    String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .map(|line| line["item"].clone())
        .filter(|item| {
            item["kind"] == "user_message"
                && item["data"]["source"] == format!("agent:{kid}")
                && item["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(marker))
        })
        .count()
}

impl Fleet {
    /// A demo agent on the hub (`drover run` with `more` options) whose first turn runs `mcp
    /// create_agent` for a subagent on b (`kid_prompt`); the parent's id and the subagent's.
    fn parent_with_kid_on_b(
        &self,
        title: &str,
        kid_prompt: &str,
        more: &[&str],
    ) -> (String, String) {
        let call = json!({
            "relationship": {"kind": "subagent"},
            "workspace": {"kind": "current", "cwd": self.b.work},
            "host": "b",
            "title": title,
            "prompt": kid_prompt,
        });
        let hub_work = self.hub.work.display().to_string();
        let prompt = format!("mcp create_agent {call}");
        let mut args = vec!["run", "--cwd", &hub_work, "--provider", "demo", "--detach"];
        args.extend(more);
        args.push(&prompt);
        let out = drover(&self.hub, &args);
        assert!(out.status.success(), "run: {}", text(&out));
        let parent = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let kid = poll_until_blocking(Duration::from_secs(30), || {
            // Archived ones too: an `autoArchive` parent may take its subagent along at once.
            let agents = json(&self.hub, &["ls", "--json", "--all"]);
            agents
                .as_array()?
                .iter()
                .find(|a| a["parentAgentId"] == parent.as_str())
                .and_then(|a| a["id"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| {
            let logs = drover(&self.hub, &["logs", &parent]);
            panic!("no subagent of {parent} on the hub: {}", text(&logs))
        });
        (parent, kid)
    }

    fn cut(&self, down: bool) {
        let state = if down { "down" } else { "up" };
        self.b
            .ns
            .exec(&["ip", "link", "set", "to-hub", state])
            .expect("ip link");
    }
}

/// The activity `machine`'s daemon gives its workspace at `path`, if any.
fn workspace_activity(machine: &Machine, path: &str) -> Option<String> {
    let workspaces = json(machine, &["workspaces", "--json"]);
    workspaces
        .as_array()?
        .iter()
        .find(|w| w["path"] == path && w.get("host").is_none())?["activity"]
        .as_str()
        .map(str::to_string)
}

/// Waits until `machine`'s daemon says agent `id` is `status`.
fn wait_status(machine: &Machine, id: &str, status: &str) -> Value {
    poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(machine, &["ls", "--json", "--all"]);
        agent(&agents, id)
            .filter(|a| a["status"] == status)
            .cloned()
    })
    .unwrap_or_else(|| panic!("{id} not {status}"))
}

#[test]
fn a_subagent_on_another_host_belongs_to_its_parent_on_the_hub() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));

    // An agent on the hub delegates to b over MCP: the subagent is b's, and its parent's.
    let (parent, kid) = fleet.parent_with_kid_on_b("kid", "sleep 1000\nsay kid reporting", &[]);
    let on_hub = json(&fleet.hub, &["ls", "--json"]);
    let seen = agent(&on_hub, &kid).expect("kid on the hub");
    assert_eq!(seen["host"], "b", "{seen}");
    assert_eq!(seen["title"], "kid", "{seen}");
    let on_b = json(&fleet.b, &["ls", "--json"]);
    let held = agent(&on_b, &kid).expect("b's daemon holds the kid");
    assert_eq!(held["parentAgentId"], parent.as_str(), "{held}");
    assert_eq!(held["cwd"], fleet.b.work.display().to_string(), "{held}");

    // Its first turn's end reaches the parent once, through b's outbox.
    let told = poll_until_blocking(Duration::from_secs(30), || {
        (notices(&fleet, &parent, &kid, "kid reporting") > 0).then_some(())
    });
    assert!(
        told.is_some(),
        "the parent was not told: {}",
        text(&drover(&fleet.hub, &["logs", &parent]))
    );

    // A notice across a cut link: the kid's turn ends while b cannot reach the hub; the
    // notice waits on b and arrives once when the link is back, and once after the hub dies.
    let asked = json!({"agentId": kid, "prompt": "sleep 4000\nsay kid again"});
    let sent = drover(
        &fleet.hub,
        &["send", &parent, &format!("mcp send_prompt {asked}")],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&fleet.b, &kid, "running");
    fleet.cut(true);
    fleet.wait_host_state("unreachable", Duration::from_secs(20));
    wait_status(&fleet.b, &kid, "idle");
    let outbox = fleet.b.drover_home.join("outbox.jsonl");
    let kept = std::fs::read_to_string(&outbox).unwrap_or_default();
    assert!(kept.contains("kid again"), "b keeps the notice: {kept:?}");
    fleet.cut(false);
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    let told = poll_until_blocking(Duration::from_secs(30), || {
        (notices(&fleet, &parent, &kid, "kid again") > 0).then_some(())
    });
    assert!(told.is_some(), "the notice did not cross the healed link");
    let acked = poll_until_blocking(Duration::from_secs(10), || {
        let left = std::fs::read_to_string(&outbox).unwrap_or_default();
        (!left.contains("kid again")).then_some(())
    });
    assert!(acked.is_some(), "b still keeps the delivered notice");
    assert!(fleet.hub.kill_daemon(), "the hub outlived SIGKILL");
    let started = drover(&fleet.hub, &["daemon", "start"]);
    assert!(started.status.success(), "{}", text(&started));
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    assert_eq!(
        notices(&fleet, &parent, &kid, "kid again"),
        1,
        "delivered exactly once"
    );
    assert_eq!(notices(&fleet, &parent, &kid, "kid reporting"), 1);

    // Archive admission counts the kid's running turn, on b, and names its host.
    let sent = drover(&fleet.hub, &["send", &kid, "sleep 60000"]);
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&fleet.b, &kid, "running");
    // Its running turn shows on its root parent's workspace, on the hub (seed 000), not on b's.
    let hub_work = fleet.hub.work.display().to_string();
    let running = poll_until_blocking(Duration::from_secs(20), || {
        workspace_activity(&fleet.hub, &hub_work).filter(|a| a == "running")
    });
    assert!(
        running.is_some(),
        "{}",
        json(&fleet.hub, &["workspaces", "--json"])
    );
    let b_work = fleet.b.work.display().to_string();
    assert_eq!(workspace_activity(&fleet.b, &b_work), None);
    let refused = drover(&fleet.hub, &["archive", &parent]);
    assert!(!refused.status.success(), "archived with the kid running");
    assert!(text(&refused).contains("on host `b`"), "{}", text(&refused));
    assert!(
        agent(&json(&fleet.b, &["ls", "--json"]), &kid).is_some(),
        "the kid was archived"
    );

    // With --stop the cascade crosses to b: the kid is archived there, its turn canceled.
    let archived = drover(&fleet.hub, &["archive", &parent, "--stop", "--json"]);
    assert!(archived.status.success(), "{}", text(&archived));
    let outcome: Value = serde_json::from_slice(&archived.stdout).expect("json");
    let list: Vec<&str> = outcome["archived"]
        .as_array()
        .expect("archived")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(list, [parent.as_str(), kid.as_str()], "{outcome}");
    let on_b = json(&fleet.b, &["ls", "--json", "--all"]);
    assert!(
        agent(&on_b, &kid).is_some_and(|a| !a["archivedAt"].is_null()),
        "archived on b: {on_b}"
    );

    the_lineage_gate_holds_across_the_link(&fleet, &parent, &kid);
    an_auto_archive_takes_its_subagent_on_b(&fleet);
}

/// An `autoArchive` parent is archived by its own turn's end, not by a request the hub could
/// route: its subagent on b is archived there all the same, its running turn stopped.
fn an_auto_archive_takes_its_subagent_on_b(fleet: &Fleet) {
    let (_, kid) = fleet.parent_with_kid_on_b("long kid", "sleep 60000", &["--auto-archive"]);
    let archived = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&fleet.b, &["ls", "--json", "--all"]);
        agent(&agents, &kid)
            .is_some_and(|a| !a["archivedAt"].is_null() && a["status"] != "running")
            .then_some(())
    });
    assert!(
        archived.is_some(),
        "the kid of an auto-archived parent runs on: {}",
        json(&fleet.b, &["ls", "--json", "--all"])
    );
}

/// The kid (archived with its parent) brought back alone takes no turn while its parent on the
/// hub is archived, and takes them again once it is not.
fn the_lineage_gate_holds_across_the_link(fleet: &Fleet, parent: &str, kid: &str) {
    let back = drover(&fleet.hub, &["unarchive", kid]);
    assert!(back.status.success(), "{}", text(&back));
    let sent = drover(
        &fleet.hub,
        &["send", kid, "say while the parent is archived"],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    let blocked = poll_until_blocking(Duration::from_secs(30), || {
        last_turn_end(fleet, kid).filter(|end| end == "turn_blocked")
    });
    assert!(
        blocked.is_some(),
        "{}",
        text(&drover(&fleet.hub, &["logs", kid]))
    );
    let back = drover(&fleet.hub, &["unarchive", parent]);
    assert!(back.status.success(), "{}", text(&back));
    let free = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&fleet.b, &["ls", "--json"]);
        agent(&agents, kid)
            .is_some_and(|a| a["labels"].get("drover.upstream-archived").is_none())
            .then_some(())
    });
    assert!(free.is_some(), "the gate stays after the parent came back");
    let sent = drover(&fleet.hub, &["send", kid, "say free again"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let waited = drover(&fleet.hub, &["wait", kid, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));
    fleet.logs_contain(kid, "free again");
}

/// A user makes a subagent on b of the hub's `parent` (`drover run --host b --parent`); its id
/// once its turn ended.
fn user_subagent_on_b(fleet: &Fleet, parent: &str) -> String {
    let work = fleet.b.work.display().to_string();
    let run = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "b",
            "--parent",
            parent,
            "--cwd",
            &work,
            "--provider",
            "demo",
            "--detach",
            "say made by a user",
        ],
    );
    assert!(run.status.success(), "{}", text(&run));
    let second = String::from_utf8_lossy(&run.stdout).trim().to_string();
    let held = agent(&json(&fleet.b, &["ls", "--json"]), &second).cloned();
    assert!(
        held.as_ref().is_some_and(|a| a["parentAgentId"] == parent),
        "{held:?}"
    );
    let waited = drover(&fleet.hub, &["wait", &second, "--timeout", "30"]);
    assert!(waited.status.success(), "{}", text(&waited));
    fleet.logs_contain(&second, "made by a user");
    second
}

/// The `event` of the agent's last `turn_ended` item, read on the hub.
fn last_turn_end(fleet: &Fleet, id: &str) -> Option<String> {
    last_turn_ended(fleet, id).and_then(|data| data["event"].as_str().map(str::to_string))
}

#[test]
fn archiving_a_parent_waits_for_its_subagents_host_and_detach_lets_go() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    // The kid makes a subagent of its own on b (b's MCP).
    let grandkid_call = json!({"relationship": {"kind": "subagent"},
        "workspace": {"kind": "current"}, "title": "grandkid", "prompt": "say deep"});
    let (parent, kid) =
        fleet.parent_with_kid_on_b("kid", &format!("mcp create_agent {grandkid_call}"), &[]);
    let grandkid = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&fleet.hub, &["ls", "--json"]);
        agents
            .as_array()?
            .iter()
            .find(|a| a["parentAgentId"] == kid.as_str())
            .and_then(|a| a["id"].as_str().map(str::to_string))
    })
    .expect("the kid's own subagent on b, seen on the hub");

    // b unreachable: archiving the parent is refused, naming the host, and nothing changes.
    fleet.cut(true);
    fleet.wait_host_state("unreachable", Duration::from_secs(20));
    let refused = drover(&fleet.hub, &["archive", &parent, "--stop"]);
    assert!(!refused.status.success(), "archived without asking b");
    assert!(
        text(&refused).contains("host `b` is unreachable")
            && text(&refused).contains("has subagents there"),
        "{}",
        text(&refused)
    );
    assert!(agent(&json(&fleet.hub, &["ls", "--json"]), &parent).is_some());

    // Also after the hub restarts and before it sees b again.
    assert!(fleet.hub.kill_daemon(), "the hub outlived SIGKILL");
    let started = drover(&fleet.hub, &["daemon", "start"]);
    assert!(started.status.success(), "{}", text(&started));
    let refused = drover(&fleet.hub, &["archive", &parent, "--stop"]);
    assert!(
        !refused.status.success(),
        "archived after a restart without asking b"
    );
    fleet.cut(false);
    fleet.wait_host_state("reachable", Duration::from_secs(20));

    // The parent detaches its subagent (over MCP, on b): it stands alone, and archiving the
    // parent leaves it be.
    let asked = json!({"agentId": kid});
    let sent = drover(
        &fleet.hub,
        &["send", &parent, &format!("mcp detach_agent {asked}")],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    let alone = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&fleet.hub, &["ls", "--json"]);
        agent(&agents, &kid)
            .is_some_and(|a| a["parentAgentId"].is_null())
            .then_some(())
    });
    assert!(
        alone.is_some(),
        "{}",
        text(&drover(&fleet.hub, &["logs", &parent]))
    );
    let second = user_subagent_on_b(&fleet, &parent);

    let archived = drover(&fleet.hub, &["archive", &parent, "--json"]);
    assert!(archived.status.success(), "{}", text(&archived));
    let outcome: Value = serde_json::from_slice(&archived.stdout).expect("json");
    assert_eq!(outcome["archived"], json!([parent, second]), "{outcome}");
    let on_b = json(&fleet.b, &["ls", "--json"]);
    assert!(
        agent(&on_b, &kid).is_some(),
        "the detached kid was archived"
    );
    assert!(
        agent(&on_b, &second).is_none(),
        "the user's subagent was not archived on b"
    );

    // Archived from b's side: the kid's own tree goes, and the hub sees it.
    let archived = drover(&fleet.b, &["archive", &kid, "--stop"]);
    assert!(archived.status.success(), "{}", text(&archived));
    let seen = poll_until_blocking(Duration::from_secs(10), || {
        let all = json(&fleet.hub, &["ls", "--json", "--all"]);
        [&kid, &grandkid]
            .iter()
            .all(|id| agent(&all, id).is_some_and(|a| !a["archivedAt"].is_null()))
            .then_some(())
    });
    assert!(seen.is_some(), "the hub did not see b's archive");
}

/// `drover inspect ID --json` on `machine`.
fn inspect(machine: &Machine, id: &str) -> Value {
    json(machine, &["inspect", id, "--json"])
}

/// The budgets the hub holds agent `id` of b to, as b's own daemon keeps them.
fn upstream_budgets_on_b(fleet: &Fleet, id: &str) -> Option<Value> {
    upstream_budgets(&fleet.b, id)
}

/// The budgets `machine`'s hub holds its agent `id` to, as `machine`'s own daemon keeps them.
fn upstream_budgets(machine: &Machine, id: &str) -> Option<Value> {
    let agents = json(machine, &["ls", "--json", "--all"]);
    let label = agent(&agents, id)?["labels"]["drover.upstream-budget"].as_str()?;
    serde_json::from_str(label).ok()
}

#[test]
fn a_subagent_on_another_host_spends_its_hub_parents_budget() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));

    // A root on the hub with a budget of 2500 tokens delegates to b; the subagent's first turn
    // spends 2000 (the demo agent's `usage`: 1000 tokens each).
    let (root, kid) = fleet.parent_with_kid_on_b(
        "spender",
        "usage\nusage\nsay kid spent two thousand",
        &["--budget-tokens", "2500"],
    );
    let tree = poll_until_blocking(Duration::from_secs(30), || {
        let info = inspect(&fleet.hub, &root);
        (info["treeSpend"]["tokens"] == 2000).then_some(info)
    });
    assert!(
        tree.is_some(),
        "the hub's tree spend leaves out what the subagent on b spent: {}",
        inspect(&fleet.hub, &root)
    );
    let tree = tree.expect("tree")["treeSpend"].clone();
    assert_eq!(tree["agents"], 2, "{tree}");
    // b holds the subagent to what the tree has left: its 2000 and the 500 left.
    let held = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets_on_b(&fleet, &kid).filter(|b| *b == json!([{"tokens": 2500}]))
    });
    assert!(
        held.is_some(),
        "b does not hold the subagent to its parent's budget: {:?}",
        upstream_budgets_on_b(&fleet, &kid)
    );

    // With the link cut, b holds the subagent to the budget by itself: its next turn (sent on
    // b) spends 1000 more, past what the tree had left; a message sent meanwhile is accepted
    // (the budget was not spent yet) and then held, and the next send is refused.
    fleet.cut(true);
    fleet.wait_host_state("unreachable", Duration::from_secs(20));
    let sent = drover(
        &fleet.b,
        &["send", &kid, "usage\nsleep 3000\nsay kid second turn"],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&fleet.b, &kid, "running");
    let queued = drover(&fleet.b, &["send", &kid, "say held on b"]);
    assert!(queued.status.success(), "{}", text(&queued));
    wait_status(&fleet.b, &kid, "idle");
    let refused = drover(&fleet.b, &["send", &kid, "say past the budget"]);
    assert!(
        !refused.status.success(),
        "b let the subagent past its hub parent's budget while the hub was away"
    );
    // The refusal names the hub's agent whose budget it is (a budget set on b would not help).
    assert!(
        text(&refused).contains("3000 of 2500 tokens")
            && text(&refused).contains("on the hub")
            && text(&refused).contains(&format!("agent {}", &root[root.len() - 8..]))
            && !text(&refused).contains("drover budget"),
        "{}",
        text(&refused)
    );
    fleet.cut(false);
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    let spent = poll_until_blocking(Duration::from_secs(30), || {
        let info = inspect(&fleet.hub, &root);
        (info["treeSpend"]["tokens"] == 3000).then_some(())
    });
    assert!(spent.is_some(), "{}", inspect(&fleet.hub, &root));
    fleet.logs_contain(&kid, "kid second turn");

    the_spent_tree_takes_nothing_new(&fleet, &root, &kid);

    // Raised on the hub: b lets the held message run, and the tree takes prompts again.
    let raised = drover(&fleet.hub, &["budget", &root, "--tokens", "100000"]);
    assert!(raised.status.success(), "{}", text(&raised));
    let ran = poll_until_blocking(Duration::from_secs(30), || {
        let logs = drover(&fleet.hub, &["logs", &kid]);
        String::from_utf8_lossy(&logs.stdout)
            .contains("held on b")
            .then_some(())
    });
    assert!(
        ran.is_some(),
        "the held message did not run once the budget was raised: {}",
        inspect(&fleet.hub, &kid)
    );
    assert_eq!(
        upstream_budgets_on_b(&fleet, &kid),
        Some(json!([{"tokens": 100_000}]))
    );
    let sent = drover(&fleet.hub, &["send", &root, "say within budget"]);
    assert!(sent.status.success(), "{}", text(&sent));
}

/// The tree of `root` on the hub spent its budget, wherever its agents run: neither `root` nor
/// its subagent `kid` on b takes a new prompt, what was queued for `kid` stays queued on b, and
/// no new subagent is made on b under `root` (the hub refuses before asking b).
fn the_spent_tree_takes_nothing_new(fleet: &Fleet, root: &str, kid: &str) {
    // The tree's budget is spent, wherever its agents run: the root takes no new prompt...
    let refused = drover(&fleet.hub, &["send", root, "say over budget"]);
    assert!(
        !refused.status.success(),
        "the root took a prompt past its budget"
    );
    assert!(
        text(&refused).contains("3000 of 2500 tokens"),
        "{}",
        text(&refused)
    );
    // ... nor does its subagent on b (b refuses it)...
    let refused = drover(&fleet.hub, &["send", kid, "say over budget"]);
    assert!(
        !refused.status.success(),
        "the kid took a prompt past the budget"
    );
    assert!(
        text(&refused).contains("budget") && text(&refused).contains("on the hub"),
        "{}",
        text(&refused)
    );
    // ... and what was queued before stays queued on b.
    let kid_info = inspect(&fleet.hub, kid);
    let waiting: Vec<&str> = kid_info["queued"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(
        waiting,
        ["say held on b"],
        "{kid_info}\n{}",
        text(&drover(&fleet.hub, &["logs", kid]))
    );
    // No new subagent on b under it either: the hub refuses before asking b.
    let on_b_before = json(&fleet.b, &["ls", "--json", "--all"])
        .as_array()
        .map(Vec::len);
    let work = fleet.b.work.display().to_string();
    let refused = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "b",
            "--parent",
            root,
            "--cwd",
            &work,
            "--provider",
            "demo",
            "--detach",
            "say another",
        ],
    );
    assert!(
        !refused.status.success(),
        "a new subagent on b past the budget"
    );
    assert!(
        text(&refused).contains("3000 of 2500 tokens"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        json(&fleet.b, &["ls", "--json", "--all"])
            .as_array()
            .map(Vec::len),
        on_b_before
    );
}

/// The `data` of the agent's last `turn_ended` item, read on the hub.
fn last_turn_ended(fleet: &Fleet, id: &str) -> Option<Value> {
    let logs = drover(&fleet.hub, &["logs", id, "--json"]);
    String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .map(|line| line["item"].clone())
        .rev()
        .find(|item| item["kind"] == "turn_ended")
        .map(|item| item["data"].clone())
}

#[test]
fn a_hard_budget_on_the_hub_cancels_its_subagents_turn_on_another_host() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    // The subagent's turn reports 0.001, then 0.002 in all, then would sleep 20 s: past the
    // root's hard cost budget, b cancels it in the middle.
    let (root, kid) = fleet.parent_with_kid_on_b(
        "hard",
        "usage\nusage\nsleep 20000\nsay never said",
        &["--budget-cost", "0.0015", "--budget-hard"],
    );
    let ended = poll_until_blocking(Duration::from_secs(15), || {
        last_turn_ended(&fleet, &kid).filter(|end| end["event"] == "turn_canceled")
    });
    assert!(
        ended.as_ref().is_some_and(|end| end["cause"] == "budget"),
        "{ended:?}: {}",
        text(&drover(&fleet.hub, &["logs", &kid]))
    );
    let logs = drover(&fleet.hub, &["logs", &kid, "--json"]);
    let said = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .any(|line| {
            line["item"]["kind"] == "agent_message"
                && line["item"]["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("never said"))
        });
    assert!(!said, "the turn ran on past the budget: {}", text(&logs));

    // The hub's own agent pushes the tree past the hard budget: raised to 0.0035 (0.0015 left),
    // the subagent's next turn on b is running when the root spends 0.002; the hub tells b the
    // subagent may spend nothing more, and b cancels its running turn.
    let raised = drover(&fleet.hub, &["budget", &root, "--cost", "0.0035", "--hard"]);
    assert!(raised.status.success(), "{}", text(&raised));
    let lifted = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets_on_b(&fleet, &kid)
            .filter(|b| b[0]["cost"].as_f64().is_some_and(|c| c > 0.003))
    });
    assert!(
        lifted.is_some(),
        "b did not learn of the raised budget: {:?}",
        upstream_budgets_on_b(&fleet, &kid)
    );
    let sent = drover(
        &fleet.hub,
        &["send", &kid, "sleep 30000\nsay kid never again"],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&fleet.b, &kid, "running");
    let sent = drover(&fleet.hub, &["send", &root, "usage\nusage\nsay root spent"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let canceled = poll_until_blocking(Duration::from_secs(15), || {
        let logs = drover(&fleet.hub, &["logs", &kid, "--json"]);
        let budget_cancels = String::from_utf8_lossy(&logs.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| {
                line["item"]["kind"] == "turn_ended"
                    && line["item"]["data"]["event"] == "turn_canceled"
                    && line["item"]["data"]["cause"] == "budget"
            })
            .count();
        (budget_cancels == 2).then_some(())
    });
    assert!(
        canceled.is_some(),
        "the subagent's turn on b ran on after the hub's own agent spent the hard budget: {}",
        text(&drover(&fleet.hub, &["logs", &kid]))
    );
}

impl Fleet {
    /// A third machine `c` below b (10.77.2.1 ↔ 10.77.2.2), added by b's user as b's host
    /// `c`: a chain hub → b → c. b's daemon runs already (the hub's link started it).
    fn c_below_b(&self) -> (Machine, SshServer) {
        let (c, ssh) = ssh_machine(self.dir.path(), (&self.b, "b"), "c", "10.77.2", true);
        let added = host_add(&self.b, "c", &ssh, &ssh.key, &[]);
        assert!(added.status.success(), "host add c on b: {}", text(&added));
        (c, ssh)
    }
}

/// How many of agent `id`'s turns a budget canceled, as `machine`'s daemon (its own) says.
fn budget_cancels(machine: &Machine, id: &str) -> usize {
    let logs = drover(machine, &["logs", id, "--json"]);
    String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| {
            line["item"]["kind"] == "turn_ended"
                && line["item"]["data"]["event"] == "turn_canceled"
                && line["item"]["data"]["cause"] == "budget"
        })
        .count()
}

#[test]
fn a_chain_of_three_daemons_counts_and_holds_the_bottom_hosts_spend() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let (c, _c_ssh) = fleet.c_below_b();
    // A root on the hub with a hard budget of 3500 tokens delegates to b; its subagent there
    // delegates to c, then spends 1000; the one on c spends 2000.
    let on_c = json!({
        "relationship": {"kind": "subagent"},
        "workspace": {"kind": "current", "cwd": c.work},
        "host": "c",
        "title": "bottom",
        "prompt": "usage\nusage\nsay c spent two thousand",
    });
    let (root, mid) = fleet.parent_with_kid_on_b(
        "chain",
        &format!("mcp create_agent {on_c}\nusage\nsay b spent one thousand"),
        &["--budget-tokens", "3500", "--budget-hard"],
    );
    let bottom = poll_until_blocking(Duration::from_secs(30), || {
        let agents = json(&c, &["ls", "--json", "--all"]);
        agents
            .as_array()?
            .iter()
            .find(|a| a["parentAgentId"] == mid.as_str())
            .and_then(|a| a["id"].as_str().map(str::to_string))
    })
    .unwrap_or_else(|| panic!("no subagent of {mid} on c: {}", text(&drover(&c, &["ls"]))));

    // The top hub counts what c spent under b, with the agent that spent it.
    let tree = poll_until_blocking(Duration::from_secs(30), || {
        let info = inspect(&fleet.hub, &root);
        (info["treeSpend"]["tokens"] == 3000).then_some(info)
    });
    assert!(
        tree.is_some(),
        "the hub leaves out what the bottom host spent: {}",
        inspect(&fleet.hub, &root)["treeSpend"]
    );
    assert_eq!(
        inspect(&fleet.hub, &root)["treeSpend"]["agents"],
        3,
        "the hub's tree does not count c's agent"
    );
    // b holds its subagent to the 3500 (its subtree's 3000 and the 500 left), and c its own to
    // its 2000 and the same 500.
    let hard = |tokens: u64| json!([{"tokens": tokens, "hard": true}]);
    let held = poll_until_blocking(Duration::from_secs(20), || {
        (upstream_budgets_on_b(&fleet, &mid) == Some(hard(3500))
            && upstream_budgets(&c, &bottom) == Some(hard(2500)))
        .then_some(())
    });
    assert!(
        held.is_some(),
        "b holds {:?}, c holds {:?}",
        upstream_budgets_on_b(&fleet, &mid),
        upstream_budgets(&c, &bottom)
    );

    // The hub's own root spends past the hard budget while c's agent runs a turn: c cancels it.
    let sent = drover(&c, &["send", &bottom, "sleep 30000\nsay bottom never said"]);
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&c, &bottom, "running");
    let sent = drover(&fleet.hub, &["send", &root, "usage\nsay root spent"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let canceled = poll_until_blocking(Duration::from_secs(20), || {
        (budget_cancels(&c, &bottom) == 1).then_some(())
    });
    assert!(
        canceled.is_some(),
        "c's agent ran on past the top hub's hard budget: {}",
        text(&drover(&c, &["logs", &bottom]))
    );

    c_holds_its_agent_with_its_link_cut(&fleet, &c, &root, &mid, &bottom);
}

/// The chain's tree (`root` on the hub, `mid` on b, `bottom` on c) raised to 4500 tokens after
/// it spent 4000 (c's agent 2000 of it): c, cut off from b, holds its agent to the 500 left by
/// itself, and once it is back the hub counts what it spent meanwhile.
fn c_holds_its_agent_with_its_link_cut(
    fleet: &Fleet,
    c: &Machine,
    root: &str,
    mid: &str,
    bottom: &str,
) {
    let hard = |tokens: u64| json!([{"tokens": tokens, "hard": true}]);
    // Raised on the hub to 4500 (500 left): c may spend its 2000 and 500. With c's link to b
    // cut, c holds its agent to that by itself: a turn spending 1000 runs (the budget was not
    // spent when it started), and the next prompt is refused there, naming b's agent.
    let raised = drover(&fleet.hub, &["budget", root, "--tokens", "4500", "--hard"]);
    assert!(raised.status.success(), "{}", text(&raised));
    let lifted = poll_until_blocking(Duration::from_secs(20), || {
        (upstream_budgets(c, bottom) == Some(hard(2500))
            && upstream_budgets_on_b(fleet, mid) == Some(hard(3500)))
        .then_some(())
    });
    assert!(
        lifted.is_some(),
        "b holds {:?}, c holds {:?}",
        upstream_budgets_on_b(fleet, mid),
        upstream_budgets(c, bottom)
    );
    c.ns.exec(&["ip", "link", "set", "to-b", "down"])
        .expect("ip link");
    let sent = drover(c, &["send", bottom, "usage\nsay bottom spent past it"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let past = poll_until_blocking(Duration::from_secs(20), || {
        let info = inspect(c, bottom);
        (info["spend"]["tokens"] == 3000 && info["status"] == "idle").then_some(())
    });
    assert!(past.is_some(), "{}", inspect(c, bottom));
    let refused = drover(c, &["send", bottom, "say past the budget"]);
    assert!(
        !refused.status.success()
            && text(&refused).contains("3000 of 2500 tokens")
            && text(&refused).contains(&mid[mid.len() - 8..]),
        "c let its agent past the budget with the link cut: {}",
        text(&refused)
    );
    // Once c is back, the top hub counts what it spent meanwhile: the tree is spent.
    c.ns.exec(&["ip", "link", "set", "to-b", "up"])
        .expect("ip link");
    let spent = poll_until_blocking(Duration::from_secs(30), || {
        (inspect(&fleet.hub, root)["treeSpend"]["tokens"] == 5000).then_some(())
    });
    assert!(
        spent.is_some(),
        "{}",
        inspect(&fleet.hub, root)["treeSpend"]
    );
    let refused = drover(&fleet.hub, &["send", root, "say over budget"]);
    assert!(
        !refused.status.success() && text(&refused).contains("5000 of 4500 tokens"),
        "{}",
        text(&refused)
    );
}

#[test]
fn a_new_subagent_gets_only_what_a_host_out_of_reach_cannot_spend() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    // Another host `d` of the hub's, beside b (10.77.3.1 ↔ 10.77.3.2).
    let (d, d_ssh) = ssh_machine(fleet.dir.path(), (&fleet.hub, "hub"), "d", "10.77.3", true);
    let added = host_add(&fleet.hub, "d", &d_ssh, &d_ssh.key, &[]);
    assert!(added.status.success(), "host add d: {}", text(&added));
    // A root with a budget of 3000 tokens; its subagent on b spent 1000: b holds it to 3000.
    let (root, kid) =
        fleet.parent_with_kid_on_b("away", "usage\nsay kid spent", &["--budget-tokens", "3000"]);
    let tokens = |n: u64| json!([{"tokens": n}]);
    let held = poll_until_blocking(Duration::from_secs(30), || {
        (upstream_budgets_on_b(&fleet, &kid) == Some(tokens(3000))
            && inspect(&fleet.hub, &root)["treeSpend"]["tokens"] == 1000)
            .then_some(())
    });
    assert!(held.is_some(), "{:?}", upstream_budgets_on_b(&fleet, &kid));

    // b out of reach: its subagent may still spend the 2000 left there, unseen. A new subagent
    // of the root on d gets none of it (not the 2000 the tree seems to have left).
    fleet.cut(true);
    fleet.wait_host_state("unreachable", Duration::from_secs(20));
    let on_d = || {
        let work = d.work.display().to_string();
        let out = drover(
            &fleet.hub,
            &[
                "run",
                "--host",
                "d",
                "--parent",
                &root,
                "--cwd",
                &work,
                "--provider",
                "demo",
                "--detach",
                "say on d",
            ],
        );
        assert!(out.status.success(), "run --host d: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let new = on_d();
    assert_eq!(
        upstream_budgets(&d, &new),
        Some(tokens(0)),
        "the new subagent was given what b's may spend out of reach"
    );
    // Raised to 5000 on the hub while b is away (b's subagent still holds 3000, 2000 of it
    // unspent as far as the hub knows): d's gets the 2000 provably left, not 4000.
    let raised = drover(&fleet.hub, &["budget", &root, "--tokens", "5000"]);
    assert!(raised.status.success(), "{}", text(&raised));
    let given = poll_until_blocking(Duration::from_secs(20), || {
        (upstream_budgets(&d, &new) == Some(tokens(2000))).then_some(())
    });
    assert!(given.is_some(), "{:?}", upstream_budgets(&d, &new));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(upstream_budgets(&d, &new), Some(tokens(2000)));
    // Its first turn, held while it had nothing, runs now.
    let ran = poll_until_blocking(Duration::from_secs(20), || last_turn_ended(&fleet, &new));
    assert!(
        ran.is_some(),
        "{}",
        text(&drover(&fleet.hub, &["logs", &new]))
    );
    // b back: what its subagent spent is known again, and both get what the tree has left.
    fleet.cut(false);
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    let lifted = poll_until_blocking(Duration::from_secs(20), || {
        (upstream_budgets(&d, &new) == Some(tokens(4000))
            && upstream_budgets_on_b(&fleet, &kid) == Some(tokens(5000)))
        .then_some(())
    });
    assert!(
        lifted.is_some(),
        "d holds {:?}, b holds {:?}",
        upstream_budgets(&d, &new),
        upstream_budgets_on_b(&fleet, &kid)
    );
}

#[test]
fn a_host_out_of_reach_cancels_no_running_turn_on_another_under_a_hard_budget() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let (d, d_ssh) = ssh_machine(fleet.dir.path(), (&fleet.hub, "hub"), "d", "10.77.3", true);
    let added = host_add(&fleet.hub, "d", &d_ssh, &d_ssh.key, &[]);
    assert!(added.status.success(), "host add d: {}", text(&added));
    // A root with a hard budget of 3000 tokens; its subagent on b spent 1000.
    let (root, kid) = fleet.parent_with_kid_on_b(
        "away",
        "usage\nsay kid spent",
        &["--budget-tokens", "3000", "--budget-hard"],
    );
    let hard = |n: u64| json!([{"tokens": n, "hard": true}]);
    let held = poll_until_blocking(Duration::from_secs(30), || {
        (upstream_budgets_on_b(&fleet, &kid) == Some(hard(3000))
            && inspect(&fleet.hub, &root)["treeSpend"]["tokens"] == 1000)
            .then_some(())
    });
    assert!(held.is_some(), "{:?}", upstream_budgets_on_b(&fleet, &kid));
    // Another subagent of the root, on d, spent 1000 and runs a turn again: d holds it to
    // 2000, hard.
    let work = d.work.display().to_string();
    let out = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "d",
            "--parent",
            &root,
            "--cwd",
            &work,
            "--provider",
            "demo",
            "--detach",
            "usage\nsay d spent",
        ],
    );
    assert!(out.status.success(), "run --host d: {}", text(&out));
    let on_d = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let spent = poll_until_blocking(Duration::from_secs(20), || {
        (upstream_budgets(&d, &on_d) == Some(hard(2000))
            && inspect(&fleet.hub, &root)["treeSpend"]["tokens"] == 2000)
            .then_some(())
    });
    assert!(spent.is_some(), "{:?}", upstream_budgets(&d, &on_d));
    let sent = drover(&fleet.hub, &["send", &on_d, "sleep 30000\nsay d finished"]);
    assert!(sent.status.success(), "{}", text(&sent));
    wait_status(&d, &on_d, "running");

    // b out of reach: the 2000 its subagent may still spend are held back from d's, which may
    // start no new turn past the 1000 it spent; but nobody spent them, so its running turn
    // goes on to its end.
    fleet.cut(true);
    fleet.wait_host_state("unreachable", Duration::from_secs(20));
    let reserved = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets(&d, &on_d).filter(|b| b[0]["tokens"] == 1000)
    });
    assert!(reserved.is_some(), "{:?}", upstream_budgets(&d, &on_d));
    assert_eq!(
        inspect(&d, &on_d)["status"],
        "running",
        "{}",
        text(&drover(&d, &["logs", &on_d]))
    );
    // Its second turn ends as it would have anyway: it said its last words.
    let items = || {
        let logs = drover(&d, &["logs", &on_d, "--json"]);
        String::from_utf8_lossy(&logs.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|line| line["item"].clone())
            .collect::<Vec<_>>()
    };
    let ended = poll_until_blocking(Duration::from_secs(60), || {
        let ends: Vec<Value> = items()
            .into_iter()
            .filter(|item| item["kind"] == "turn_ended")
            .map(|item| item["data"].clone())
            .collect();
        (ends.len() == 2).then(|| ends[1].clone())
    });
    assert!(
        ended
            .as_ref()
            .is_some_and(|end| end["event"] != "turn_canceled"),
        "{ended:?}: {}",
        text(&drover(&d, &["logs", &on_d]))
    );
    assert_eq!(budget_cancels(&d, &on_d), 0);
    let said = items().iter().any(|item| {
        item["kind"] == "agent_message" && item["data"]["text"].as_str() == Some("d finished")
    });
    assert!(said, "{}", text(&drover(&d, &["logs", &on_d])));
    // Held to it softly: what was really spent is not past the hard budget.
    assert_eq!(upstream_budgets(&d, &on_d), Some(json!([{"tokens": 1000}])));
    // Its next turn waits for b: the tree may have nothing left.
    let sent = drover(&d, &["send", &on_d, "say too soon"]);
    assert!(
        !sent.status.success() && text(&sent).contains("1000 of 1000 tokens"),
        "{}",
        text(&sent)
    );
}

/// A host of this protocol whose one agent (in the file `state`, as its `session_state`) reports
/// its spend over and over, 1500 and 1600 tokens in turn (`agent_status` lines in the files
/// `a` and `b`), every millisecond or so, never answering a request.
const FLOODING_HOST: &str = r#"dir=$(dirname "$0")
read hello
echo '{"type":"welcome","payload":{"daemonVersion":"0.0.1","protocolVersion":2,"sessionId":"s"}}'
cat "$dir/state"
cat >/dev/null &
while :; do
  cat "$dir/a"
  sleep 0.001
  cat "$dir/b"
  sleep 0.001
done
"#;

#[test]
fn a_removed_hosts_last_spend_report_is_counted_once() {
    let fleet = Fleet::new();
    let hub_work = fleet.hub.work.display().to_string();
    let out = drover(
        &fleet.hub,
        &[
            "run",
            "--cwd",
            &hub_work,
            "--provider",
            "demo",
            "--detach",
            "--budget-tokens",
            "100000",
            "say budgeted",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let parent = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_status(&fleet.hub, &parent, "idle");
    // Its subagent on the host, an agent like the hub's own (every field a client reads).
    let dir = fleet.dir.path().join("flood");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut kid = agent(&json(&fleet.hub, &["ls", "--json"]), &parent)
        .expect("parent listed")
        .clone();
    kid["id"] = json!("0193b1c2-7d4e-7a10-8000-0123456789ae");
    kid["parentAgentId"] = json!(parent);
    kid["labels"] = json!({});
    kid["budget"] = Value::Null;
    for (file, tokens) in [("a", 1500), ("b", 1600)] {
        kid["spend"] = json!({"tokens": tokens});
        let status = json!({"type": "agent_status", "payload": {"agent": kid}});
        std::fs::write(dir.join(file), format!("{status}\n")).expect("status");
    }
    let state = json!({"type": "session_state",
        "payload": {"agents": [kid], "workspaces": [], "hosts": []}});
    std::fs::write(dir.join("state"), format!("{state}\n")).expect("state");
    let script = dir.join("host.sh");
    std::fs::write(&script, FLOODING_HOST).expect("script");
    let command = format!("sh {}", script.display());
    let tree_tokens = || inspect(&fleet.hub, &parent)["treeSpend"]["tokens"].as_u64();
    // Removed while its reports keep coming, six times: what it spent leaves the tree as
    // `host rm` answers and no report its link took in meanwhile brings it back; added again,
    // it counts once (never both reports, nor a report of the removed link beside the new
    // one's).
    for round in 0..6 {
        let added = drover(&fleet.hub, &["host", "add", "flood", "--command", &command]);
        assert!(added.status.success(), "host add: {}", text(&added));
        let counted = poll_until_blocking(Duration::from_secs(20), || {
            tree_tokens().filter(|t| *t >= 1500)
        });
        assert!(counted.is_some(), "round {round}: {:?}", tree_tokens());
        for _ in 0..10 {
            let tokens = tree_tokens();
            assert!(
                matches!(tokens, Some(1500 | 1600)),
                "round {round}: the host's spend counted {tokens:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let removed = drover(&fleet.hub, &["host", "rm", "flood"]);
        assert!(removed.status.success(), "host rm: {}", text(&removed));
        for _ in 0..10 {
            let tokens = tree_tokens();
            assert!(
                tokens.is_none_or(|t| t == 0),
                "round {round}: a removed host's spend counted {tokens:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A host whose daemon speaks protocol 1 only (a drover from before the hub's budgets on its
/// hosts), as such a daemon answers `hello`: it takes a `hello` of version 1 and refuses any
/// other, naming its own.
const PROTOCOL_1_HOST: &str = r#"read hello
case "$hello" in
  *'"protocolVersion":1,'*|*'"protocolVersion":1}'*)
    echo '{"type":"welcome","payload":{"daemonVersion":"0.0.1","protocolVersion":1,"sessionId":"s"}}'
    echo '{"type":"session_state","payload":{"agents":[],"workspaces":[],"hosts":[]}}' ;;
  *)
    echo '{"type":"request_error","payload":{"code":"unsupported_version","message":"this daemon speaks protocol 1, not 2"}}' ;;
esac
exec sleep 600
"#;

#[test]
fn a_host_of_a_drover_before_the_hubs_budgets_is_incompatible() {
    let fleet = Fleet::new();
    let script = fleet.dir.path().join("protocol-1-host.sh");
    std::fs::write(&script, PROTOCOL_1_HOST).expect("script");
    let command = format!("sh {}", script.display());
    // The hub does not link to it (it would refuse the budgets the hub holds its subagents to):
    // the host shows `incompatible`, naming both versions and what to do.
    let _ = drover(&fleet.hub, &["host", "add", "b", "--command", &command]);
    let host = fleet.wait_host_state("incompatible", Duration::from_secs(20));
    let error = host["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("protocol 2")
            && error.contains("protocol 1")
            && error.contains("install the same drover there"),
        "{host}"
    );
}

/// A host of this protocol that refuses to hold its subagent (the agent of its `session_state`,
/// in the file `state`) to any budget: each `set_upstream_budget` it is sent is counted in
/// `asked` and refused (never answered, with a file `silent`: a slow host); anything else gets
/// `ok`; a `create_agent` makes that agent (the file `agent`). With a file `down` the link fails
/// at once.
const REFUSING_HOST: &str = r#"dir=$(dirname "$0")
[ -e "$dir/down" ] && exit 1
read hello
echo '{"type":"welcome","payload":{"daemonVersion":"0.0.1","protocolVersion":2,"sessionId":"s"}}'
cat "$dir/state"
while read line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"requestId":"\([^"]*\)".*/\1/p')
  case "$line" in
    *'"type":"create_agent"'*)
      echo "{\"type\":\"agent_created\",\"payload\":{\"requestId\":\"$id\",\"agent\":$(cat "$dir/agent")}}" ;;
    *set_upstream_budget*)
      echo asked >> "$dir/asked"
      [ -e "$dir/silent" ] || echo "{\"type\":\"request_error\",\"payload\":{\"requestId\":\"$id\",\"code\":\"invalid_message\",\"message\":\"no\"}}" ;;
    *)
      echo "{\"type\":\"ok\",\"payload\":{\"requestId\":\"$id\"}}" ;;
  esac
done
"#;

#[test]
fn a_host_refusing_the_budgets_is_asked_once_per_connection() {
    let fleet = Fleet::new();
    let hub_work = fleet.hub.work.display().to_string();
    let run = |more: &[&str]| {
        let mut args = vec!["run", "--cwd", &hub_work, "--provider", "demo", "--detach"];
        args.extend(more);
        let out = drover(&fleet.hub, &args);
        assert!(
            out.status.success(),
            "run: {}\n{}",
            text(&out),
            std::fs::read_to_string(fleet.hub.drover_home.join("daemon.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let parent = run(&["--budget-tokens", "2500", "say budgeted"]);
    let dir = fleet.dir.path().join("refusing");
    add_refusing_host(
        &fleet,
        "b",
        &dir,
        &parent,
        "0193b1c2-7d4e-7a10-8000-0123456789ab",
    );
    let asked = || std::fs::read_to_string(dir.join("asked")).map_or(0, |s| s.lines().count());
    let once = poll_until_blocking(Duration::from_secs(20), || (asked() == 1).then_some(()));
    assert!(once.is_some(), "asked {} times", asked());
    // Many registry updates on the hub (another agent's turns), none changing the budget: the
    // host is not asked again over the same connection.
    let other = run(&["say other"]);
    for n in 0..5 {
        wait_status(&fleet.hub, &other, "idle");
        let sent = drover(&fleet.hub, &["send", &other, &format!("say turn {n}")]);
        assert!(sent.status.success(), "{}", text(&sent));
    }
    wait_status(&fleet.hub, &other, "idle");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(asked(), 1, "the refusing host was asked again and again");
    assert_eq!(fleet.host_b()["state"], "reachable", "{}", fleet.host_b());
}

/// Adds to the hub a host `name` running [`REFUSING_HOST`] in `dir`, its subagent (id `kid`,
/// which spent 1500 tokens) one of the hub's agent `parent`.
fn add_refusing_host(fleet: &Fleet, name: &str, dir: &Path, parent: &str, kid: &str) {
    std::fs::create_dir_all(dir).expect("dir");
    // Its subagent there, an agent like the hub's own (every field a client reads).
    let mut agent_info = agent(&json(&fleet.hub, &["ls", "--json"]), parent)
        .expect("parent listed")
        .clone();
    agent_info["id"] = json!(kid);
    agent_info["parentAgentId"] = json!(parent);
    agent_info["labels"] = json!({});
    agent_info["budget"] = Value::Null;
    agent_info["spend"] = json!({"tokens": 1500});
    std::fs::write(dir.join("agent"), agent_info.to_string()).expect("agent");
    let state = json!({"type": "session_state",
        "payload": {"agents": [agent_info], "workspaces": [], "hosts": []}});
    std::fs::write(dir.join("state"), format!("{state}\n")).expect("state");
    let script = dir.join("host.sh");
    std::fs::write(&script, REFUSING_HOST).expect("script");
    let command = format!("sh {}", script.display());
    let added = drover(&fleet.hub, &["host", "add", name, "--command", &command]);
    assert!(added.status.success(), "host add: {}", text(&added));
}

#[test]
fn a_slow_host_does_not_hold_up_another_hosts_budgets() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let (root, kid) = fleet.parent_with_kid_on_b("slow", "say kid", &["--budget-tokens", "2500"]);
    let held = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets_on_b(&fleet, &kid).filter(|b| *b == json!([{"tokens": 2500}]))
    });
    assert!(held.is_some(), "{:?}", upstream_budgets_on_b(&fleet, &kid));
    // Another host (listed before b) with a subagent of the same root never answers the
    // budgets it is sent.
    let dir = fleet.dir.path().join("slow");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("silent"), "").expect("silent");
    add_refusing_host(
        &fleet,
        "a-slow",
        &dir,
        &root,
        "0193b1c2-7d4e-7a10-8000-0123456789ac",
    );
    let asked = poll_until_blocking(Duration::from_secs(20), || {
        dir.join("asked").exists().then_some(())
    });
    assert!(asked.is_some(), "the slow host was not asked");
    // Raised on the hub: b learns of it while the slow host is still answering.
    let raised = drover(&fleet.hub, &["budget", &root, "--tokens", "100000"]);
    assert!(raised.status.success(), "{}", text(&raised));
    // (b may spend what the tree has left: the slow host's subagent spent 1500 of it.)
    let learned = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets_on_b(&fleet, &kid).filter(|b| *b == json!([{"tokens": 98_500}]))
    });
    assert!(
        learned.is_some(),
        "b waits for the slow host: {:?}",
        upstream_budgets_on_b(&fleet, &kid)
    );
}

#[test]
fn a_restarted_hub_raises_no_budget_before_a_host_with_spend_in_the_tree_reports() {
    let fleet = Fleet::new();
    let added = fleet.add_b(&fleet.ssh.key);
    assert!(added.status.success(), "host add: {}", text(&added));
    let (root, kid) =
        fleet.parent_with_kid_on_b("restart", "say kid", &["--budget-tokens", "2500"]);
    // The root's other subagent, made on host a-c, spent 1500 there: b may spend 1000.
    let dir = fleet.dir.path().join("c");
    add_refusing_host(
        &fleet,
        "a-c",
        &dir,
        &root,
        "0193b1c2-7d4e-7a10-8000-0123456789ad",
    );
    let made = drover(
        &fleet.hub,
        &[
            "run",
            "--host",
            "a-c",
            "--parent",
            &root,
            "--cwd",
            "/tmp",
            "--provider",
            "demo",
            "--detach",
            "say on c",
        ],
    );
    assert!(made.status.success(), "{}", text(&made));
    let held = poll_until_blocking(Duration::from_secs(20), || {
        upstream_budgets_on_b(&fleet, &kid).filter(|b| *b == json!([{"tokens": 1000}]))
    });
    assert!(
        held.is_some(),
        "{:?}: {}",
        upstream_budgets_on_b(&fleet, &kid),
        inspect(&fleet.hub, &root)
    );
    // The hub restarts while a-c is out of reach: until a-c reports, the hub does not know
    // its 1500 and must not give b the whole 2500 again.
    std::fs::write(dir.join("down"), "").expect("down");
    assert!(fleet.hub.kill_daemon(), "the hub's daemon outlived SIGKILL");
    let started = drover(&fleet.hub, &["daemon", "start"]);
    assert!(started.status.success(), "{}", text(&started));
    fleet.wait_host_state("reachable", Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        upstream_budgets_on_b(&fleet, &kid),
        Some(json!([{"tokens": 1000}])),
        "b was given more than the tree had left"
    );
}
