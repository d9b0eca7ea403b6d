//! Warm spares (`[providers.X] warm = N`), with the daemon in a process of its own (so its
//! guard and cgroups are the real ones): an agent takes a spare and works in its own directory
//! with its own MCP server and its provider's environment, nothing of one agent reaches the
//! next, a spare that dies or whose provider changed is replaced, spares count against
//! `max_live` and are given up first, and no spare outlives a daemon killed by SIGKILL.

use std::path::Path;
use std::time::Duration;

use drover_fakes::procs;
use drover_testkit::daemon::{Client, find_where};
use drover_testkit::wait::{eventually, poll_until};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::orphans::assert_all_gone_within;
use crate::processes::{DaemonProcess, alive, create};

const WAIT: Duration = Duration::from_secs(20);

/// A provider `warmed` (the scripted agent) keeping `warm` spares, with `MARK` in its
/// environment, and the same agent as `plain`, without spares; `runtimes` is the `[runtimes]`
/// section's body.
fn config(state: &Path, warm: usize, mark: &str, runtimes: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_drover-scripted-agent");
    format!(
        "[runtimes]\n{runtimes}\n[providers.plain]\ncommand = [{bin:?}]\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {state:?} }}\n\
         [providers.warmed]\ncommand = [{bin:?}]\nwarm = {warm}\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, MARK = {mark:?} }}\n",
        state = state.display().to_string(),
    )
}

/// The spare processes of the daemon: its children working in `$DROVER_HOME/warm` that no
/// agent has as its process.
async fn spares(client: &mut Client, daemon: &DaemonProcess, home: &Path) -> Vec<i32> {
    let neutral = home.join("warm");
    let agents: Vec<i64> = client
        .agents(false)
        .await
        .iter()
        .filter_map(|a| a["runtime"]["pid"].as_i64())
        .collect();
    let daemon = i32::try_from(daemon.pid()).expect("pid");
    procs::live()
        .into_iter()
        .filter(|p| p.ppid == daemon && p.cwd().is_some_and(|c| c == neutral))
        .map(|p| p.pid)
        .filter(|pid| !agents.contains(&i64::from(*pid)))
        .collect()
}

/// Waits until the daemon has exactly `n` spares, all `initialize`d (the listing says so),
/// and returns their pids.
async fn spares_ready(
    client: &mut Client,
    daemon: &DaemonProcess,
    home: &Path,
    n: usize,
) -> Vec<i32> {
    spares_of("warmed", client, daemon, home, n, WAIT).await
}

async fn spares_of(
    provider: &str,
    client: &mut Client,
    daemon: &DaemonProcess,
    home: &Path,
    n: usize,
    within: Duration,
) -> Vec<i32> {
    eventually(
        &format!("{n} spares of {provider} ready"),
        within,
        async || {
            let (ready, wanted) = warm_of(client, provider).await;
            let found = spares(client, daemon, home).await;
            (ready == n && wanted > 0 && found.len() == n).then_some(found)
        },
    )
    .await
}

/// The provider's spares as `list_providers` says: (ready, wanted).
async fn warm_of(client: &mut Client, provider: &str) -> (usize, usize) {
    let providers = client.request(json!({"type": "list_providers"})).await;
    let warmed = find_where(&providers["payload"]["providers"], "provider listed", |p| {
        p["name"] == provider
    });
    let n = |k: &str| usize::try_from(warmed["warm"][k].as_u64().unwrap_or(99)).expect("n");
    (n("ready"), n("wanted"))
}

async fn pid_of(client: &mut Client, id: &str) -> i32 {
    let runtime = client.get_agent(id).await["runtime"].clone();
    i32::try_from(runtime["pid"].as_i64().expect("a live runtime")).expect("pid")
}

fn canonical_dir() -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new().expect("cwd");
    let path = std::fs::canonicalize(dir.path()).expect("cwd");
    (dir, path)
}

/// What an agent says about where it works and what it was given.
const SCRIPT: &str = "session-cwd\nsay |\nenv MARK\nsay |\nmcp-servers\nsay |\n\
    mcp create_agent {\"relationship\": {\"kind\": \"subagent\"}, \"workspace\": {\"kind\": \"current\"}, \"prompt\": \"say kid\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_an_agent_takes_a_spare_and_works_as_its_own_and_the_spare_is_replaced() {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 1, "one", ""),
    )
    .expect("config");
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let first_spare = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
    // The spare carries nobody's id: its own marker, the provider's variables, no agent's.
    let spare = procs::Process::read(first_spare).expect("the spare");
    assert_eq!(spare.env("MARK").as_deref(), Some("one"));
    let spare_marker = spare.env("DROVER_AGENT_ID").expect("a marker of its own");

    let mut seen = Vec::new();
    let mut urls: Vec<String> = Vec::new();
    for round in 0..2 {
        let (_dir, cwd) = canonical_dir();
        let id = create(&mut client, "warmed", &cwd, SCRIPT).await;
        client.wait_idle(&id).await;
        let pid = pid_of(&mut client, &id).await;
        if round == 0 {
            assert_eq!(pid, first_spare, "the first agent took the spare");
            assert_ne!(spare_marker, id);
        }
        let said: Vec<String> = client
            .replies(&id)
            .await
            .concat()
            .split('|')
            .map(str::to_string)
            .collect();
        // Its session is in its own directory, with the provider's variables.
        assert_eq!(said[0], cwd.display().to_string(), "{said:?}");
        assert_eq!(said[1], "one", "{said:?}");
        // Its MCP server is its own: the subagent it made is its child.
        assert!(said[2].contains("/mcp/"), "{said:?}");
        assert!(
            !urls.contains(&said[2]),
            "another agent's MCP server: {said:?}"
        );
        urls.push(said[2].clone());
        let made: Value = serde_json::from_str(
            said[3]
                .strip_prefix("mcp create_agent: ")
                .unwrap_or_else(|| panic!("{said:?}")),
        )
        .expect("tool result");
        let kid = made["agentId"].as_str().expect("the kid").to_string();
        assert_eq!(client.get_agent(&kid).await["parentAgentId"], id.as_str());
        // Whatever it starts carries one marker, which no other agent's processes carry.
        let marker = procs::Process::read(pid)
            .and_then(|p| p.env("DROVER_AGENT_ID"))
            .expect("marker");
        assert!(!seen.contains(&marker), "{marker} reused");
        seen.push(marker);
        // A replacement comes, another process.
        let replaced = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
        assert_ne!(replaced, pid);
        // Archived: the agent's processes end, found by that marker too; the spare stays.
        let archived = client
            .request(json!({"type": "archive", "agentId": id, "stopActivity": true}))
            .await;
        assert_eq!(archived["type"], "archived", "{archived}");
        poll_until(WAIT, async || (!alive(pid)).then_some(()))
            .await
            .expect("the agent's process ended");
        assert!(alive(replaced));
    }

    // A spare that dies is replaced.
    let before = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(before), Signal::SIGKILL).expect("kill");
    // (Until its exit is seen, the killed one may still be listed.)
    let after = eventually("a new spare", WAIT, async || {
        let now = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
        (now != before).then_some(now)
    })
    .await;

    // The provider changes: its spare is replaced by one with the new environment.
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 1, "two", ""),
    )
    .expect("config");
    let changed = eventually("a spare of the changed provider", WAIT, async || {
        let pids = spares_ready(&mut client, &daemon, home.path(), 1).await;
        let env = procs::Process::read(pids[0]).and_then(|p| p.env("MARK"));
        (env.as_deref() == Some("two")).then_some(pids[0])
    })
    .await;
    assert!(!alive(after), "the outdated spare ended");
    let (_dir, cwd) = canonical_dir();
    let id = create(&mut client, "warmed", &cwd, "env MARK").await;
    client.wait_idle(&id).await;
    assert_eq!(pid_of(&mut client, &id).await, changed);
    assert_eq!(client.replies(&id).await, ["two"]);

    // `warm = 0`: no spare is kept.
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 0, "two", ""),
    )
    .expect("config");
    eventually("no spare left", WAIT, async || {
        spares(&mut client, &daemon, home.path()).await.is_empty()
    })
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_spares_count_against_max_live_and_are_given_up_first() {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    let runtimes = "max_live = 2\nidle_timeout = \"0\"";
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 1, "one", runtimes),
    )
    .expect("config");
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let spare = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
    let (_dir, cwd) = canonical_dir();
    // A (no spares for its provider) takes the second slot, and stays live, idle.
    let a = create(&mut client, "plain", &cwd, "say a").await;
    client.wait_idle(&a).await;
    let a_pid = pid_of(&mut client, &a).await;
    assert_ne!(a_pid, spare);
    // B needs a slot: the spare gives up its own, before A (idle longer) hibernates.
    let b = create(&mut client, "plain", &cwd, "say b").await;
    client.wait_idle(&b).await;
    assert_eq!(client.replies(&b).await, ["b"]);
    assert_eq!(pid_of(&mut client, &a).await, a_pid, "A kept its process");
    poll_until(WAIT, async || (!alive(spare)).then_some(()))
        .await
        .expect("the spare gave up its slot");
    // No room: no spare, for as long as both run.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(warm_of(&mut client, "warmed").await, (0, 1));
    assert!(spares(&mut client, &daemon, home.path()).await.is_empty());
    // A slot frees: the spare comes back, and holds it.
    let archived = client
        .request(json!({"type": "archive", "agentId": b, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let spare = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
    // Under the full ceiling an agent of the spare's provider takes the spare with its slot:
    // nothing hibernates, nothing waits.
    let c = create(&mut client, "warmed", &cwd, "say c").await;
    client.wait_idle(&c).await;
    assert_eq!(client.replies(&c).await, ["c"]);
    assert_eq!(pid_of(&mut client, &c).await, spare, "C took the spare");
    assert_eq!(pid_of(&mut client, &a).await, a_pid, "A kept its process");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        warm_of(&mut client, "warmed").await,
        (0, 1),
        "no room for another"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_no_spare_outlives_a_sigkilled_daemon() {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 2, "one", ""),
    )
    .expect("config");
    let mut daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    spares_ready(&mut client, &daemon, home.path(), 2).await;
    // An agent on a spare, with a tool in a group of its own.
    let (_dir, cwd) = canonical_dir();
    let id = create(&mut client, "warmed", &cwd, "spawn-tool\nhang").await;
    let tool = eventually("the tool", WAIT, async || {
        let text = crate::processes::said(&mut client, &id).await;
        text.contains("tool ").then_some(())
    })
    .await;
    let () = tool;
    let tool = crate::processes::said_pid(&mut client, &id, "tool").await;
    let mut watched: Vec<i32> = spares_ready(&mut client, &daemon, home.path(), 2).await;
    watched.push(pid_of(&mut client, &id).await);
    watched.push(tool);
    for p in procs::of_daemon(daemon.pid()) {
        if !watched.contains(&p.pid) {
            watched.push(p.pid);
        }
    }
    assert!(watched.iter().all(|p| alive(*p)), "{watched:?}");
    assert_all_gone_within(&mut daemon, Signal::SIGKILL, &watched, "spares and agents").await;
}

/// codex as `npm install -g` installs it (its Node launcher), against the scripted model, with
/// `warm = 1`: the agent takes the spare, writes a file in its own directory (not the spare's),
/// and makes a subagent through its own MCP server; a new spare replaces the one taken; a
/// SIGKILL of the daemon leaves nothing of either (the launchers and their native children).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_codex_takes_a_spare_and_works_in_its_own_directory_with_its_own_mcp() {
    use drover_fakes::real_agents::RealAgent;
    const TURN: Duration = Duration::from_secs(90);
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("scripted state");
    let ground = drover_testkit::RealGround::new().await;
    let cwd = &ground.cwd;
    let codex = crate::real_agents_orphans::config(RealAgent::Codex, &ground);
    std::fs::write(
        home.path().join("config.toml"),
        format!("{}{codex}warm = 1\n", config(state.path(), 0, "one", "")),
    )
    .expect("config");
    let mut daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let spare = spares_of("codex", &mut client, &daemon, home.path(), 1, TURN).await[0];
    assert_eq!(
        procs::Process::read(spare).and_then(|p| p.cwd()),
        Some(home.path().join("warm"))
    );

    let call = json!({"relationship": {"kind": "subagent"}, "workspace": {"kind": "current"},
                      "provider": "warmed", "prompt": "say kid"});
    let id = create(
        &mut client,
        "codex",
        cwd,
        &format!("write note.txt warm\ncall create_agent {call}\nreply finished"),
    )
    .await;
    // Codex asks before it writes and before it calls an MCP tool: allowed as they come.
    eventually("codex's turn to end", TURN, async || {
        let _ = client
            .request(json!({"type": "answer_permission", "agentId": id, "kind": "allow_once"}))
            .await;
        let idle = client
            .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 500}))
            .await;
        idle["payload"]["idle"] == true && !client.turn_events(&id).await.is_empty()
    })
    .await;
    assert_eq!(
        pid_of(&mut client, &id).await,
        spare,
        "codex took the spare"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.join("note.txt"))
            .ok()
            .as_deref()
            .map(str::trim_end),
        Some("warm"),
        "{:#?}",
        client.timeline(&id).await
    );
    assert!(!home.path().join("warm/note.txt").exists());
    let kid = eventually("the subagent", WAIT, async || {
        client
            .agents(false)
            .await
            .into_iter()
            .find(|a| a["parentAgentId"] == id.as_str())
    })
    .await;
    assert_eq!(kid["type"], "warmed", "{kid}");
    let replaced = spares_of("codex", &mut client, &daemon, home.path(), 1, TURN).await[0];
    assert_ne!(replaced, spare);
    // The spare's launcher has started the native codex-acp: neither outlives a SIGKILL.
    let tree = eventually("the spare's native codex-acp", TURN, async || {
        let tree: Vec<i32> = procs::tree(replaced).iter().map(|p| p.pid).collect();
        (tree.len() > 1).then_some(tree)
    })
    .await;
    let mut watched = tree;
    watched.extend(procs::tree(spare).iter().map(|p| p.pid));
    for p in procs::of_daemon(daemon.pid()) {
        if !watched.contains(&p.pid) {
            watched.push(p.pid);
        }
    }
    assert_all_gone_within(
        &mut daemon,
        Signal::SIGKILL,
        &watched,
        "codex spare and agent",
    )
    .await;
    drop(ground);
}

/// Without its guard (killed first) and without cgroups, what an agent on a spare started in a
/// session of its own outlives the daemon's SIGKILL; the next boot finds it by the spare's
/// marker, which the agent's runtime record names, and ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_the_next_boot_ends_what_an_agent_on_a_spare_left_by_the_spares_marker() {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    std::fs::write(
        home.path().join("config.toml"),
        config(state.path(), 1, "one", ""),
    )
    .expect("config");
    let no_cgroups = [("DROVER_NO_CGROUPS", "1")];
    let mut daemon = DaemonProcess::start_with(home.path(), &no_cgroups).await;
    let mut client = daemon.client().await;
    let spare = spares_ready(&mut client, &daemon, home.path(), 1).await[0];
    let (_dir, cwd) = canonical_dir();
    let id = create(&mut client, "warmed", &cwd, "spawn-session").await;
    client.wait_idle(&id).await;
    assert_eq!(pid_of(&mut client, &id).await, spare);
    let session = crate::processes::said_pid(&mut client, &id, "session").await;
    let marker = procs::Process::read(session)
        .and_then(|p| p.env("DROVER_AGENT_ID"))
        .expect("the tool's marker");
    assert_ne!(marker, id, "the spare's own marker");
    let record: Value = serde_json::from_slice(
        &std::fs::read(home.path().join(format!("runtimes/{id}.json"))).expect("record"),
    )
    .expect("record JSON");
    assert_eq!(record["marker"], marker.as_str(), "{record}");
    assert_eq!(record["pid"], spare, "{record}");
    let tree: Vec<i32> = procs::tree(session).iter().map(|p| p.pid).collect();

    daemon.kill_guard();
    daemon.die_by(Signal::SIGKILL);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(tree.iter().any(|p| alive(*p)), "nothing was left to find");

    let next = DaemonProcess::start_with(home.path(), &no_cgroups).await;
    let gone = poll_until(WAIT, async || tree.iter().all(|p| !alive(*p))).await;
    assert!(gone.is_some(), "left: {tree:?}");
    next.stop().await;
}
