//! Real coding agents (codex-acp, claude-agent-acp, gemini-cli) run through the drover daemon,
//! driven over its client protocol, against the scripted model on 127.0.0.1: a plain turn, a
//! shell command allowed and one rejected, three turns in one session, a cancel during a
//! streaming reply, and a daemon restart followed by another turn on the same agent; and a
//! runtime that hibernated between two turns, whose second model request carries the first
//! turn (codex-acp; pinned gemini-cli answers `session/load` after its process ended with
//! "No previous sessions found", so it gets the context-lost note instead); and a server that
//! codex's shell tool left running keeping its runtime live past the idle timeout until it
//! ends. (claude-agent-acp 0.23 does not end a turn while a `run_in_background` shell of
//! Claude Code runs, so its runtime is busy anyway.)
//! Needs `scripts/install-agents`.

use std::path::{Path, PathBuf};

use drover_fakes::model::ModelServer;
use drover_fakes::real_agents::{RealAgent, provider_toml};
use drover_testkit::daemon::{Client, TestDaemon, string_at};
use drover_testkit::{RealGround, agent_processes, no_agent_processes_left};
use serde_json::json;
use tempfile::TempDir;

/// Generous: claude's `session/new` alone takes a second or two on 2 cores.
const TURN_MS: u64 = 90_000;

/// What a test of a real agent through the daemon runs on: its own folders, the scripted model
/// it asks, and a daemon whose `config.toml` is the agent's provider then `extra`.
struct RealSetup {
    cwd: PathBuf,
    model: ModelServer,
    config: String,
    daemon: TestDaemon,
    /// The daemon's home, the agent's cwd and its scratch folder: they go with the test.
    dirs: [TempDir; 3],
}

async fn real_setup(agent: RealAgent, extra: &str) -> RealSetup {
    let home = TempDir::new().expect("home");
    let ground = RealGround::new().await;
    let config = format!(
        "{}{extra}",
        provider_toml(agent.name(), &ground.command(agent))
    );
    let daemon =
        TestDaemon::start_with_config(home.path().to_path_buf(), None, config.clone()).await;
    let RealGround {
        model,
        cwd,
        scratch,
        cwd_dir,
    } = ground;
    RealSetup {
        cwd,
        model,
        config,
        daemon,
        dirs: [home, cwd_dir, scratch],
    }
}

async fn last_reply(client: &mut Client, id: &str) -> String {
    let items = client.timeline(id).await;
    let start = items
        .iter()
        .rposition(|i| i["kind"] == "turn_started")
        .unwrap_or(0);
    items[start..]
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str())
        .collect()
}

async fn settle(client: &mut Client, name: &str, id: &str, turns: usize) {
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": TURN_MS}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{name}: {idle}");
    let events = client.turn_events(id).await;
    assert_eq!(
        events.len(),
        turns,
        "{name}: {:#?}",
        client.timeline(id).await
    );
}

async fn answer_permission(client: &mut Client, name: &str, id: &str, kind: &str) {
    // The request shows up as a `permission` item on the agent's stream.
    client
        .update_where(id, |n| {
            n["op"] == "item" && n["item"]["kind"] == "permission"
        })
        .await;
    let answered = client
        .request(json!({"type": "answer_permission", "agentId": id, "kind": kind}))
        .await;
    assert_eq!(answered["type"], "ok", "{name}: {answered}");
}

// One story per agent: every feature driven through the daemon in turn, as a user would.
#[expect(clippy::too_many_lines)]
async fn run_everything(agent: RealAgent) {
    let name = agent.name();
    let RealSetup {
        cwd,
        model,
        config,
        daemon,
        dirs: _dirs,
    } = real_setup(agent, "").await;
    let (mut client, _) = daemon.client().await;

    // 1. A plain turn.
    let created = client
        .request(json!({
            "type": "create_agent", "provider": name, "cwd": cwd, "title": format!("{name} end to end"),
            "prompt": "reply hello from the scripted model", "effort": "high",
        }))
        .await;
    assert_eq!(created["type"], "agent_created", "{name}: {created}");
    let id = string_at(&created["payload"]["agent"]["id"]);
    client.initialize_agent(&id).await;
    settle(&mut client, name, &id, 1).await;
    assert_eq!(client.turn_events(&id).await, ["turn_completed"], "{name}");
    let reply = last_reply(&mut client, &id).await;
    assert!(
        reply.contains("hello from the scripted model"),
        "{name}: {reply}"
    );
    // The reasoning effort asked for went through the agent's `thought_level` option, where
    // it has one (codex-acp 0.16 does; the pinned claude and gemini do not): codex asked the
    // model with it.
    let info = client
        .request(json!({"type": "get_agent", "agentId": id}))
        .await;
    let options = info["payload"]["agent"]["configOptions"].clone();
    let effort = options
        .as_array()
        .and_then(|all| all.iter().find(|o| o["category"] == "thought_level"));
    if agent == RealAgent::Codex {
        let effort = effort.unwrap_or_else(|| panic!("codex offers no effort: {options}"));
        assert_eq!(effort["currentValue"], "high", "{effort}");
        let asked = model.requests();
        assert!(
            asked
                .iter()
                .any(|r| r["body"]["reasoning"]["effort"] == "high"),
            "codex did not ask the model with effort high: {:?}",
            asked
                .iter()
                .map(|r| &r["body"]["reasoning"])
                .collect::<Vec<_>>()
        );
    } else {
        assert!(effort.is_none(), "{name}: {options}");
    }

    // 2. A shell command whose permission is allowed runs for real.
    client.clear_backlog();
    client.send_message(&id, "shell touch allowed.txt").await;
    answer_permission(&mut client, name, &id, "allow_once").await;
    settle(&mut client, name, &id, 2).await;
    assert!(
        cwd.join("allowed.txt").exists(),
        "{name}: the allowed command did not run"
    );

    // 3. One that is rejected does not.
    client.clear_backlog();
    client.send_message(&id, "shell touch rejected.txt").await;
    answer_permission(&mut client, name, &id, "reject_once").await;
    settle(&mut client, name, &id, 3).await;
    assert!(
        !cwd.join("rejected.txt").exists(),
        "{name}: the rejected command ran"
    );
    // Its tool call ends failed, denied, whether or not the agent says so itself.
    let items = client.timeline(&id).await;
    let asked = items
        .iter()
        .rev()
        .find(|i| i["kind"] == "permission")
        .expect("the permission item");
    let tool = items
        .iter()
        .find(|i| i["seq"] == asked["data"]["toolSeq"])
        .unwrap_or_else(|| panic!("{name}: no tool call for {asked}"));
    assert_eq!(tool["data"]["status"], "failed", "{name}: {tool}");
    assert_eq!(tool["data"]["permission"], "denied", "{name}: {tool}");
    // drover advertises `terminal: true`, yet each pinned agent ran its shell commands itself:
    // none opened an ACP client terminal, which would be a job of the agent.
    let jobs = client.request(json!({"type": "list_jobs"})).await;
    assert_eq!(
        jobs["payload"]["jobs"],
        json!([]),
        "{name} opened a client terminal: {jobs}"
    );

    // 4. Three more turns in one session.
    for n in 1..=3 {
        client
            .send_message(&id, &format!("reply turn number {n}"))
            .await;
        settle(&mut client, name, &id, 3 + n).await;
        let reply = last_reply(&mut client, &id).await;
        assert!(
            reply.contains(&format!("turn number {n}")),
            "{name}: {reply}"
        );
    }

    // 5. A cancel during a streaming reply, then a prompt that gets its reply: claude-agent-acp
    //    0.23 answers the next prompt after a cancel at once with an empty `end_turn`
    //    (upstream agentclientprotocol/claude-agent-acp#551), and drover sends it once more.
    client.clear_backlog();
    client.send_message(&id, "stream 400 25").await;
    client
        .update_where(&id, |n| {
            n["op"] == "append" || (n["op"] == "item" && n["item"]["kind"] == "agent_message")
        })
        .await;
    let cancelled = client
        .request(json!({"type": "cancel", "agentId": id, "keepInbox": true}))
        .await;
    assert_eq!(cancelled["type"], "ok", "{cancelled}");
    settle(&mut client, name, &id, 7).await;
    assert_eq!(client.turn_events(&id).await[6], "turn_canceled", "{name}");
    assert!(
        !agent_processes(&id).is_empty(),
        "{name}: the agent runs under its marker"
    );
    client.send_message(&id, "reply after cancel").await;
    settle(&mut client, name, &id, 8).await;
    let reply = last_reply(&mut client, &id).await;
    assert!(reply.contains("after cancel"), "{name}: {reply}");

    // 6. A daemon restart, then another turn on the same agent.
    drop(client);
    let (home_path, _) = daemon.stop().await;
    assert!(
        no_agent_processes_left(&id).await,
        "{name}: processes left after the daemon stopped: {:?}",
        agent_processes(&id)
    );
    let daemon = TestDaemon::start_with_config(home_path, None, config).await;
    let (mut client, state) = daemon.client().await;
    let listed = state["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .find(|a| a["id"] == id)
        .cloned();
    assert_eq!(
        listed.map(|a| a["status"].clone()),
        Some(json!("idle")),
        "{name}"
    );
    client.send_message(&id, "reply after the restart").await;
    settle(&mut client, name, &id, 9).await;
    let reply = last_reply(&mut client, &id).await;
    assert!(reply.contains("after the restart"), "{name}: {reply}");
    let notices = client.notices(&id).await;
    assert!(
        notices.iter().any(
            |n| n == "resumed the agent's session" || n.starts_with("context was not restored")
        ),
        "{name}: the timeline says whether context was restored: {notices:?}"
    );

    // Everything the agent asked the model went to our loopback server.
    assert!(!model.requests().is_empty());
    drop(client);
    daemon.stop().await;
    assert!(
        no_agent_processes_left(&id).await,
        "{name}: processes left after shutdown: {:?}",
        agent_processes(&id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_through_the_daemon() {
    run_everything(RealAgent::Codex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_through_the_daemon() {
    run_everything(RealAgent::Claude).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_through_the_daemon() {
    run_everything(RealAgent::Gemini).await;
}

/// A real agent whose runtime hibernated between two turns: no process of it is left, and the
/// second turn's model request carries the first turn's messages (the agent loaded its own
/// session, `session/load`).
async fn resume_after_hibernation(agent: RealAgent) {
    let name = agent.name();
    let RealSetup {
        cwd,
        model,
        daemon,
        dirs: _dirs,
        ..
    } = real_setup(agent, "\n[runtimes]\nidle_timeout = \"2s\"\n").await;
    let (mut client, _) = daemon.client().await;
    let created = client
        .request(json!({
            "type": "create_agent", "provider": name, "cwd": cwd,
            "prompt": "reply the first turn says pineapple",
        }))
        .await;
    assert_eq!(created["type"], "agent_created", "{name}: {created}");
    let id = string_at(&created["payload"]["agent"]["id"]);
    settle(&mut client, name, &id, 1).await;
    assert!(
        !agent_processes(&id).is_empty(),
        "{name}: the agent runs under its marker"
    );
    client.clear_backlog();
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == id
                && m["payload"]["agent"]["runtime"]["state"] == "cold"
        })
        .await;
    assert!(
        no_agent_processes_left(&id).await,
        "{name}: processes left after hibernation: {:?}",
        agent_processes(&id)
    );
    let before = model.requests().len();
    client.send_message(&id, "reply the second turn").await;
    settle(&mut client, name, &id, 2).await;
    let reply = last_reply(&mut client, &id).await;
    assert!(reply.contains("the second turn"), "{name}: {reply}");
    let notices = client.notices(&id).await;
    assert!(
        notices.iter().any(|n| n == "resumed the agent's session"),
        "{name}: {notices:?}"
    );
    let second: Vec<serde_json::Value> = model.requests().split_off(before);
    assert!(
        second.iter().any(|r| {
            let body = r["body"].to_string();
            body.contains("the first turn says pineapple") && body.contains("the second turn")
        }),
        "{name}: no model request of the second turn carries the first turn: {second:#?}"
    );
    drop(client);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_resumes_its_conversation_after_hibernation() {
    resume_after_hibernation(RealAgent::Codex).await;
}

/// A background process the agent's own shell tool left running keeps its runtime live past
/// the idle timeout; once it ends, the runtime hibernates. `prompt` scripts the model to
/// start it and to write its pid to `server.pid` in the agent's directory.
async fn background_shell_keeps_the_runtime_live(agent: RealAgent, prompt: &str) {
    let name = agent.name();
    // The model must answer for the whole test: `_model` keeps it.
    let RealSetup {
        cwd,
        model: _model,
        daemon,
        dirs: _dirs,
        ..
    } = real_setup(agent, "\n[runtimes]\nidle_timeout = \"2s\"\n").await;
    let (mut client, _) = daemon.client().await;
    let created = client
        .request(json!({
            "type": "create_agent", "provider": name, "cwd": cwd, "permissionPolicy": "allow",
            "prompt": prompt,
        }))
        .await;
    assert_eq!(created["type"], "agent_created", "{name}: {created}");
    let id = string_at(&created["payload"]["agent"]["id"]);
    settle(&mut client, name, &id, 1).await;
    let pid = std::fs::read_to_string(cwd.join("server.pid"))
        .unwrap_or_else(|e| panic!("{name}: the shell did not run: {e}"));
    let pid = pid.trim().to_string();
    let get = async |client: &mut Client| {
        client
            .request(json!({"type": "get_agent", "agentId": id}))
            .await["payload"]["agent"]
            .clone()
    };
    // Past the idle timeout: still live, kept by the background process.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let kept = get(&mut client).await;
    assert_eq!(kept["runtime"]["state"], "live", "{name}: {kept}");
    assert!(
        kept["runtime"]["backgroundProcesses"].as_u64() >= Some(1),
        "{name}: {kept}"
    );
    assert_eq!(kept["runtime"]["hibernateAt"], serde_json::Value::Null);
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "{name}: the background process {pid} was ended"
    );

    // It ends: the runtime hibernates, and nothing of the agent is left.
    client.clear_backlog();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == id
                && m["payload"]["agent"]["runtime"]["state"] == "cold"
        })
        .await;
    assert!(
        no_agent_processes_left(&id).await,
        "{name}: processes left after hibernation: {:?}",
        agent_processes(&id)
    );
    drop(client);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_background_shell_keeps_the_runtime_live() {
    // codex ends its command's process group when the command returns: a server that should
    // outlive it starts a session of its own, as `nohup`/`setsid` users do.
    background_shell_keeps_the_runtime_live(
        RealAgent::Codex,
        "shell setsid sh -c 'echo $$ > server.pid; exec sleep 1000' > /dev/null 2>&1 < /dev/null &",
    )
    .await;
}

/// Claude Code's Agent tool (`Task` in older versions) runs a subagent of its own: drover shows it among
/// the agent's own subagents (`tool_call` via its `_meta.claudeCode.toolName`), running while
/// the turn runs it and completed after, and the subagent's request reached the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claudes_task_tool_is_shown_as_its_own_subagent() {
    let agent = RealAgent::Claude;
    let RealSetup {
        cwd,
        model,
        daemon,
        dirs: _dirs,
        ..
    } = real_setup(agent, "").await;
    let (mut client, _) = daemon.client().await;
    let task = json!({
        "description": "Look around", "prompt": "reply found it",
        "subagent_type": "general-purpose",
    });
    let created = client
        .request(json!({
            "type": "create_agent", "provider": "claude", "cwd": cwd,
            "prompt": format!("call Agent {task}"), "permissionPolicy": "allow",
        }))
        .await;
    let id = created["payload"]["agent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    settle(&mut client, "claude", &id, 1).await;
    let info = client
        .request(json!({"type": "get_agent", "agentId": id}))
        .await;
    let own = info["payload"]["agent"]["ownSubagents"].clone();
    let first = &own[0];
    assert_eq!(
        first["via"],
        "tool_call",
        "{:#?}\n{:#?}",
        client.timeline(&id).await,
        model
            .requests()
            .iter()
            .map(|r| &r["played"])
            .collect::<Vec<_>>()
    );
    assert_eq!(first["title"], "Look around", "{info}");
    assert_eq!(first["state"], "completed", "{info}");
    let asked = model.requests();
    assert!(
        asked
            .iter()
            .any(|r| r["body"].to_string().contains("reply found it")
                && r["played"]["directive"] == "reply"),
        "the subagent never asked the model: {:?}",
        asked.iter().map(|r| &r["played"]).collect::<Vec<_>>()
    );
    drop(client);
    daemon.stop().await;
}
