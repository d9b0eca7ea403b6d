//! Idle runtimes hibernate and come back: after `[runtimes] idle_timeout` no process of the
//! agent is left while its record stays `idle`; the next message (or a client opening it)
//! resumes it through `session/load` with its conversation, or tells an agent that cannot load
//! that its context was not restored. `[runtimes] max_live` caps the agent processes: a start
//! past it hibernates the least recently idle runtime or waits its turn, and every message
//! runs. A runtime whose agent left work running (a child, a tool in a group of its own) is
//! kept live, by the idle timeout and by `max_live`, until that work ends. Clients see each
//! runtime state in `AgentInfo.runtime`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use drover_fakes::procs;
use drover_testkit::daemon::{Client, TestDaemon};
use drover_testkit::wait;
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long a test waits for what should happen within a second or two.
const WAIT: Duration = Duration::from_secs(20);

/// A daemon whose `config.toml` has the scripted provider (with `env` added to its
/// environment) and this `[runtimes]` section; the agents' state dir goes with it.
pub(crate) async fn daemon_with(runtimes: &str, env: &str) -> (TestDaemon, TempDir) {
    TestDaemon::start_scripted(env, &format!("[runtimes]\n{runtimes}")).await
}

/// Sets its flag when dropped: a sampling thread ends with the test, even a failed one.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

async fn create(client: &mut Client, daemon: &TestDaemon, prompt: &str) -> String {
    client
        .create_scripted(&daemon.cwd(), json!({"prompt": prompt}))
        .await
}

/// The `agent_status` that shows `agent`'s runtime in `state` (an agent is announced `cold`
/// when it is created: clear the backlog first to wait for a later one).
async fn runtime_becomes(client: &mut Client, agent: &str, state: &str) -> Value {
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == agent
                && m["payload"]["agent"]["runtime"]["state"] == state
        })
        .await["payload"]["agent"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_ends_the_tree_and_a_message_resumes_the_conversation() {
    // The agent and the helper it starts before its session (as real agents start an engine
    // or MCP servers): its own processes, so they hibernate, and the whole tree goes.
    let (daemon, _state) =
        daemon_with("idle_timeout = \"1s\"", "SCRIPTED_AGENT_HELPER = \"1\"").await;
    let (mut client, _) = daemon.client().await;
    let id = create(&mut client, &daemon, "say first").await;
    // A client watching the agent does not keep its runtime (see docs/lifecycle.md).
    client.initialize_agent(&id).await;
    client.wait_idle(&id).await;

    let live = client.get_agent(&id).await;
    let runtime = &live["runtime"];
    assert_eq!(runtime["state"], "live", "{live}");
    assert!(runtime["pid"].as_u64().is_some(), "{live}");
    assert!(runtime["hibernateAt"].is_string(), "{live}");
    assert_eq!(runtime["processes"], 2, "agent, helper: {live}");
    assert_eq!(runtime["backgroundProcesses"], 0, "{live}");
    assert!(runtime["rssBytes"].as_u64() > Some(0), "{live}");
    assert_eq!(procs::of_agent(&id).len(), 2, "{:?}", procs::of_agent(&id));

    // After the timeout: cold, the record still idle, and nothing of the agent runs.
    client.clear_backlog();
    let cold = runtime_becomes(&mut client, &id, "cold").await;
    assert_eq!(cold["status"], "idle", "{cold}");
    assert_eq!(cold["runtime"]["pid"], Value::Null, "{cold}");
    assert_eq!(cold["availableModes"], Value::Null, "{cold}");
    assert!(
        drover_testkit::no_agent_processes_left(&id).await,
        "left running: {:?}",
        drover_testkit::agent_processes(&id)
    );
    let measured = client.get_agent(&id).await;
    assert_eq!(measured["runtime"]["state"], "cold", "{measured}");
    assert_eq!(measured["runtime"]["rssBytes"], Value::Null, "{measured}");
    assert_eq!(daemon.health().await["liveRuntimes"], 0);

    // The next message resumes it through session/load: the agent knows its first prompt.
    client.send_message(&id, "recall").await;
    client.wait_idle(&id).await;
    let replies = client.replies(&id).await;
    assert_eq!(
        replies.last().map(String::as_str),
        Some("recall: 1 earlier: say first"),
        "{replies:?}"
    );
    let said = client.notices(&id).await;
    assert!(
        said.iter()
            .any(|n| n == "the runtime hibernated (idle timeout); the next message resumes it"),
        "{said:?}"
    );
    assert!(
        said.iter().any(|n| n == "resumed the agent's session"),
        "{said:?}"
    );

    // It hibernates again, and a client opening the agent resumes it too.
    client.clear_backlog();
    runtime_becomes(&mut client, &id, "cold").await;
    client.clear_backlog();
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    runtime_becomes(&mut client, &id, "live").await;
    assert!(!procs::of_agent(&id).is_empty());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_of_an_agent_that_cannot_load_tells_it_context_was_lost() {
    let (daemon, _state) = daemon_with(
        "idle_timeout = \"500ms\"",
        "SCRIPTED_AGENT_NO_LOAD = \"1\", SCRIPTED_AGENT_NO_RESUME = \"1\"",
    )
    .await;
    let (mut client, _) = daemon.client().await;
    let id = create(&mut client, &daemon, "say first").await;
    client.wait_idle(&id).await;
    client.clear_backlog();
    runtime_becomes(&mut client, &id, "cold").await;
    assert!(drover_testkit::no_agent_processes_left(&id).await);

    client.send_message(&id, "echo-prompt").await;
    client.wait_idle(&id).await;
    let replies = client.replies(&id).await;
    let echoed = replies.last().cloned().unwrap_or_default();
    // The agent got the notice as the prompt's first paragraph (the scripted agent plays it
    // as a line it does not know, then echoes the whole prompt).
    let notice = "[drover] Earlier context of this conversation was not restored";
    assert!(
        echoed.starts_with(&format!("ok: {notice}"))
            && echoed.contains(&format!("before.{notice}"))
            && echoed.ends_with("before.\n\necho-prompt"),
        "the first prompt of the new session says so: {echoed:?}"
    );
    let said = client.notices(&id).await;
    assert!(
        said.iter()
            .any(|n| n.starts_with("context was not restored")),
        "{said:?}"
    );
    // Only the first prompt of the new session carries it.
    client.send_message(&id, "echo-prompt").await;
    client.wait_idle(&id).await;
    assert_eq!(
        client.replies(&id).await.last().map(String::as_str),
        Some("echo-prompt")
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_max_live_caps_the_processes_and_every_message_runs() {
    // No idle timeout: only the ceiling makes runtimes hibernate.
    let (daemon, _state) = daemon_with("idle_timeout = 0\nmax_live = 3", "").await;
    let (mut client, _) = daemon.client().await;
    let health = daemon.health().await;
    assert_eq!(health["maxLive"], 3, "{health}");
    assert_eq!(health["idleTimeoutSecs"], 0, "{health}");

    // Every 5 ms (for at most 2 minutes), how many processes carry the marker of one of the
    // agents. A thread of its own, stopped when the test ends, failed or not.
    let agents: Arc<std::sync::Mutex<BTreeSet<String>>> = Arc::default();
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(done.clone());
    let sampler = {
        let (agents, most, done) = (agents.clone(), most.clone(), done.clone());
        let until = std::time::Instant::now() + Duration::from_secs(120);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                let ids: Vec<String> = agents.lock().expect("ids").iter().cloned().collect();
                let live = procs::live();
                let count = live
                    .iter()
                    .filter(|p| ids.iter().any(|id| p.has_env("DROVER_AGENT_ID", id)))
                    .count();
                most.fetch_max(count, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let mut ids = Vec::new();
    for n in 0..5 {
        let id = create(&mut client, &daemon, &format!("sleep 400\nsay one {n}")).await;
        agents.lock().expect("ids").insert(id.clone());
        ids.push(id);
    }
    // Two starts wait for a slot, and clients see it.
    let queued = client
        .recv_where(|m| {
            m["type"] == "agent_status" && m["payload"]["agent"]["runtime"]["state"] == "queued"
        })
        .await;
    let queued_id = queued["payload"]["agent"]["id"]
        .as_str()
        .unwrap_or_default();
    assert!(ids[3..].iter().any(|id| id == queued_id), "{queued}");
    for id in &ids {
        client.wait_idle(id).await;
    }
    // A second round: the hibernated ones resume (with their conversation), others make room.
    for id in &ids {
        client.send_message(id, "recall").await;
    }
    for id in &ids {
        client.wait_idle(id).await;
    }
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(
            client.replies(id).await,
            [
                format!("one {n}"),
                "recall: 1 earlier: sleep 400".to_string()
            ],
            "agent {n}"
        );
    }
    let most = most.load(Ordering::Relaxed);
    assert!(
        most <= 3,
        "{most} agent processes at once under max_live = 3"
    );
    assert_eq!(most, 3, "the slots were used");
    let health = daemon.health().await;
    assert_eq!(health["liveRuntimes"], 3, "{health}");
    assert_eq!(health["queuedRuntimes"], 0, "{health}");
    // Nothing hibernates on a timer here.
    let live = client.get_agent(&ids[4]).await;
    assert_eq!(live["runtime"]["state"], "live", "{live}");
    assert_eq!(live["runtime"]["hibernateAt"], Value::Null, "{live}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_waits_for_a_running_turn_and_a_queued_start_can_be_archived() {
    let (daemon, _state) = daemon_with("idle_timeout = \"300ms\"\nmax_live = 1", "").await;
    let (mut client, _) = daemon.client().await;
    // A turn longer than the timeout: its runtime stays.
    let busy = create(&mut client, &daemon, "sleep 1500\nsay done").await;
    runtime_becomes(&mut client, &busy, "live").await;
    let waiting = create(&mut client, &daemon, "say never").await;
    runtime_becomes(&mut client, &waiting, "queued").await;
    let pid = client.get_agent(&busy).await["runtime"]["pid"].clone();
    // The queued one is archived while it waits: nothing of it ever runs.
    let archived = client
        .request(json!({"type": "archive", "agentId": waiting, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let still = client.get_agent(&busy).await;
    assert_eq!(still["runtime"]["state"], "live", "mid-turn: {still}");
    assert_eq!(still["runtime"]["pid"], pid, "the same process: {still}");
    client.wait_idle(&busy).await;
    assert_eq!(client.replies(&busy).await, ["done"]);
    client.clear_backlog();
    runtime_becomes(&mut client, &busy, "cold").await;
    assert!(client.replies(&waiting).await.is_empty());
    assert!(procs::of_agent(&waiting).is_empty());
    let ended = wait::poll_until(Duration::from_secs(5), async || {
        daemon.health().await["liveRuntimes"] == 0
    })
    .await;
    assert!(ended.is_some(), "{}", daemon.health().await);
    daemon.stop().await;
}

/// Ends a process the agent started, as the work would end by itself.
fn kill(pid: i32) {
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success(), "kill {pid}: {killed}");
}

/// The pids an agent's replies name after `word` (`child 4242` → 4242; a reply joins the
/// chunks its turn said).
fn said_pids(replies: &[String], word: &str) -> Vec<i32> {
    replies
        .iter()
        .flat_map(|r| r.match_indices(word).map(|(at, _)| &r[at + word.len()..]))
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_keeps_a_runtime_with_background_work_live_until_it_ends() {
    let (daemon, _state) = daemon_with(
        "idle_timeout = \"1s\"\nmax_live = 1",
        "SCRIPTED_AGENT_HELPER = \"1\"",
    )
    .await;
    let (mut client, _) = daemon.client().await;
    // Work the agent leaves running: a child in its group, a tool in a group of its own.
    let busy = create(&mut client, &daemon, "say go\nspawn-child\nspawn-tool").await;
    client.wait_idle(&busy).await;
    let replies = client.replies(&busy).await;
    let work: Vec<i32> = [said_pids(&replies, "child "), said_pids(&replies, "tool ")].concat();
    assert_eq!(work.len(), 2, "{replies:?}");
    let kept = wait::eventually("the runtime kept live by 2 processes", WAIT, async || {
        let agent = client.get_agent(&busy).await;
        (agent["runtime"]["backgroundProcesses"] == 2).then_some(agent)
    })
    .await;
    let pid = kept["runtime"]["pid"].clone();
    assert_eq!(kept["runtime"]["state"], "live", "{kept}");
    assert_eq!(kept["runtime"]["hibernateAt"], Value::Null, "{kept}");
    assert_eq!(
        kept["runtime"]["processes"], 4,
        "agent, helper, child, tool: {kept}"
    );

    // Another agent wants the only slot under max_live: it waits, the busy one is not chosen.
    client.clear_backlog();
    let other = create(&mut client, &daemon, "say other").await;
    runtime_becomes(&mut client, &other, "queued").await;
    // Past the idle timeout and several looks: nothing hibernated, nothing was killed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = client.get_agent(&busy).await;
    assert_eq!(still["runtime"]["state"], "live", "{still}");
    assert_eq!(still["runtime"]["pid"], pid, "{still}");
    assert_eq!(still["runtime"]["backgroundProcesses"], 2, "{still}");
    assert_eq!(
        procs::of_agent(&busy).len(),
        4,
        "{:?}",
        procs::of_agent(&busy)
    );
    let waiting = client.get_agent(&other).await;
    assert_eq!(waiting["runtime"]["state"], "queued", "{waiting}");

    // The work ends: the runtime is idle, hibernates for the waiting start, and it runs.
    for pid in &work {
        kill(*pid);
    }
    client.wait_idle(&other).await;
    assert_eq!(client.replies(&other).await, ["other"]);
    let cold = client.get_agent(&busy).await;
    assert_eq!(cold["runtime"]["state"], "cold", "{cold}");
    assert_eq!(cold["status"], "idle", "{cold}");
    assert!(
        drover_testkit::no_agent_processes_left(&busy).await,
        "left running: {:?}",
        drover_testkit::agent_processes(&busy)
    );
    let said = client.notices(&busy).await;
    assert!(
        said.iter()
            .any(|n| n.starts_with("the runtime hibernated (")),
        "{said:?}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernation_follows_the_idle_timeout_once_background_work_ends() {
    let (daemon, _state) = daemon_with("idle_timeout = \"1s\"", "").await;
    let (mut client, _) = daemon.client().await;
    let id = create(&mut client, &daemon, "spawn-tool").await;
    client.wait_idle(&id).await;
    let work = said_pids(&client.replies(&id).await, "tool ");
    assert_eq!(work.len(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = client.get_agent(&id).await;
    assert_eq!(kept["runtime"]["state"], "live", "{kept}");
    assert_eq!(kept["runtime"]["backgroundProcesses"], 1, "{kept}");
    assert!(procs::Process::read(work[0]).is_some_and(|p| !p.zombie()));

    client.clear_backlog();
    kill(work[0]);
    let cold = runtime_becomes(&mut client, &id, "cold").await;
    assert_eq!(cold["status"], "idle", "{cold}");
    daemon.stop().await;
}
