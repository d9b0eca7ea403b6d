//! The end-to-end proof of agents creating agents, with a real agent: codex-acp (against the
//! scripted model on 127.0.0.1) runs in the real daemon, in a real git repository, and its model
//! calls drover's `create_agent` MCP tool to start a subagent (the scripted ACP agent) in a new
//! git worktree. The child runs its turn in the worktree; codex hears of it as a queued
//! followup and runs a follow-up turn; archiving codex without `stopActivity` while the child
//! runs is refused and lists the child; with `stopActivity` both are archived and no process of
//! either is left; archiving the worktree runs the repository's teardown and removes it.
//! Needs `scripts/install-agents`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_fakes::model::{FINAL_REPLY, ModelServer};
use drover_fakes::procs;
use drover_fakes::real_agents::{RealAgent, agents_dir, provider_toml};
use drover_fakes::scripted_agent;
use drover_testkit::daemon::{Client, TestDaemon, string_at};
use drover_testkit::wait::{eventually, poll_until};
use drover_testkit::{agent_processes, git, no_agent_processes_left};
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long one codex turn may take (several requests of at most 20 s each).
const TURN: Duration = Duration::from_secs(90);

/// `config.toml`: codex against `model` (trusting `cwd`), and the scripted agent.
fn config(model: &ModelServer, scratch: &Path, cwd: &Path, scripted_state: &Path) -> String {
    let command = RealAgent::Codex
        .command(&agents_dir(), &model.url(), scratch, cwd)
        .unwrap_or_else(|e| panic!("{e}"));
    format!(
        "{}\n{}",
        provider_toml("codex", &command),
        scripted_agent::provider_config(
            Path::new(env!("CARGO_BIN_EXE_drover-scripted-agent")),
            scripted_state
        )
    )
}

/// Processes whose command line runs `mcp-proxy` against the daemon at `url`.
fn relays_to(url: &str) -> Vec<String> {
    procs::all()
        .iter()
        .map(procs::Process::command_line)
        .filter(|cmdline| cmdline.contains("mcp-proxy") && cmdline.contains(url))
        .collect()
}

/// Waits until `id` is idle with `turns` turns ended.
async fn settle(client: &mut Client, id: &str, turns: usize) {
    let settled = poll_until(TURN, async || {
        let idle = client
            .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 10_000}))
            .await;
        idle["payload"]["idle"] == true && client.turn_events(id).await.len() >= turns
    })
    .await;
    assert!(
        settled.is_some(),
        "{id} did not settle after {turns} turns: {:#?}",
        client.timeline(id).await
    );
    let events = client.turn_events(id).await;
    assert_eq!(events.len(), turns, "{:#?}", client.timeline(id).await);
}

// One story: codex drives drover's MCP tools end to end, checked at every step.
#[expect(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_creates_a_subagent_in_a_worktree() {
    let home = TempDir::new().expect("home");
    let repo_dir = TempDir::new().expect("repo");
    let scratch = TempDir::new().expect("scratch");
    let state = TempDir::new().expect("scripted state");
    let outside = TempDir::new().expect("outside");
    let repo = std::fs::canonicalize(repo_dir.path()).expect("repo");
    let outside = std::fs::canonicalize(outside.path()).expect("outside");
    let teardown_marker = outside.join("teardown-ran");

    // A repository with a project file: setup leaves a (git-ignored) mark in the new worktree,
    // teardown leaves one outside it.
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "hello\n").expect("README");
    std::fs::write(repo.join(".gitignore"), "setup-ran\n").expect(".gitignore");
    std::fs::write(
        repo.join("drover.toml"),
        format!(
            "[worktree]\nsetup = [\"echo set up > setup-ran\"]\nteardown = [{}]\n",
            serde_json::to_string(&format!("touch {}", teardown_marker.display()))
                .expect("a string")
        ),
    )
    .expect("drover.toml");
    git(&repo, &["add", "README", ".gitignore", "drover.toml"]);
    git(&repo, &["commit", "-q", "-m", "first"]);

    let model = drover_testkit::model_server().await;
    let config = config(&model, scratch.path(), &repo, state.path());
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), None, config).await;
    let (mut client, _) = daemon.client().await;

    // 1. Codex's model calls create_agent: a subagent, in a new worktree, with the scripted
    //    agent as provider.
    let call = json!({
        "relationship": {"kind": "subagent"},
        "workspace": {"kind": "create", "source": {"kind": "worktree", "name": "child"}},
        "provider": "scripted",
        "prompt": "cwd\nsleep 300\nsay child done",
        "title": "child",
    });
    let created = client
        .request(json!({
            "type": "create_agent", "provider": "codex", "cwd": repo, "title": "parent",
            "prompt": format!("call create_agent {call}\nreply the child is on its way"),
        }))
        .await;
    assert_eq!(created["type"], "agent_created", "{created}");
    let parent = string_at(&created["payload"]["agent"]["id"]);
    client.initialize_agent(&parent).await;

    // Codex asks before running an MCP tool (approval policy `untrusted`): the user allows it.
    let asked = client
        .update_where(&parent, |n| {
            n["op"] == "item" && n["item"]["kind"] == "permission"
        })
        .await;
    let title = asked["payload"]["notification"]["item"]["data"]["title"].clone();
    assert_eq!(title, "Approve MCP tool call", "{asked}");
    // Codex advertises `mcpCapabilities.http`, so it got drover's MCP server as an `http`
    // entry: no stdio relay (`<daemon executable> mcp-proxy <url>`) runs anywhere.
    let relays = relays_to(&daemon.url);
    assert!(relays.is_empty(), "a stdio MCP relay runs: {relays:?}");
    let allowed = client
        .request(json!({"type": "answer_permission", "agentId": parent, "kind": "allow_once"}))
        .await;
    assert_eq!(allowed["type"], "ok", "{allowed}");

    // 2. The child shows under codex and runs its turn in the new worktree.
    let child = eventually("a subagent to appear", TURN, async || {
        let kids: Vec<Value> = client
            .agents(true)
            .await
            .into_iter()
            .filter(|a| a["parentAgentId"] == parent.as_str())
            .collect();
        let kid = kids.first()?;
        assert_eq!(kids.len(), 1, "{kids:?}");
        Some(kid.clone())
    })
    .await;
    let child_id = child["id"].as_str().expect("child id").to_string();
    assert_eq!(child["type"], "scripted", "{child}");
    assert_eq!(child["title"], "child", "{child}");
    let worktree = PathBuf::from(child["cwd"].as_str().expect("cwd"));
    assert!(
        worktree.starts_with(home.path().join("worktrees")),
        "{worktree:?}"
    );
    assert_ne!(
        child["workspaceId"],
        created["payload"]["agent"]["workspaceId"]
    );
    let workspace = child["workspaceId"].as_str().expect("ws").to_string();
    assert!(
        worktree.join("README").is_file(),
        "the worktree is a checkout"
    );
    assert_eq!(
        std::fs::read_to_string(worktree.join("setup-ran"))
            .ok()
            .as_deref(),
        Some("set up\n"),
        "setup ran in the new worktree"
    );
    settle(&mut client, &child_id, 1).await;
    let said: String = client
        .timeline(&child_id)
        .await
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str())
        .collect();
    assert!(
        said.starts_with(&worktree.display().to_string()) && said.ends_with("child done"),
        "the child ran in the worktree: {said:?}"
    );

    // 3. Codex is told (a queued followup from the child) and runs a follow-up turn, which
    //    its model answers.
    settle(&mut client, &parent, 2).await;
    let timeline = client.timeline(&parent).await;
    let source = format!("agent:{child_id}");
    let notices: Vec<&Value> = timeline
        .iter()
        .filter(|i| i["kind"] == "user_message" && i["data"]["source"] == source.as_str())
        .collect();
    assert_eq!(notices.len(), 1, "{timeline:#?}");
    assert_eq!(notices[0]["data"]["delivery"], "followup", "{timeline:#?}");
    let notice = notices[0]["data"]["text"].as_str().unwrap_or_default();
    assert!(
        notice.contains("finished its turn") && notice.contains("child done"),
        "{notice}"
    );
    assert_eq!(
        client.turn_events(&parent).await,
        ["turn_completed", "turn_completed"]
    );
    let replies: Vec<&str> = timeline
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str())
        .collect();
    assert_eq!(
        replies,
        ["the child is on its way", FINAL_REPLY],
        "{timeline:#?}"
    );
    // What codex's model saw: the tool's result (the new agent's id), then the notice.
    let requests = model.requests();
    let tool_output = requests
        .iter()
        .flat_map(|r| r["body"]["input"].as_array().cloned().unwrap_or_default())
        .find(|i| i["type"] == "function_call_output")
        .expect("the tool's result went back to the model");
    assert!(tool_output.to_string().contains(&child_id), "{tool_output}");
    let last_input = requests
        .last()
        .and_then(|r| r["body"]["input"].as_array().cloned())
        .unwrap_or_default();
    assert!(
        last_input
            .iter()
            .any(|i| i["role"] == "user" && i.to_string().contains("finished its turn")),
        "the follow-up turn carries the notice: {last_input:?}"
    );

    // 4. The child works again (a long turn); archiving codex without stopActivity is refused
    //    and names the child as running subagent work.
    client.send_message(&child_id, "sleep 60000").await;
    eventually("the child to start working", TURN, async || {
        client.listed_agent(&child_id).await["status"] == "running"
    })
    .await;
    let refused = client
        .request(json!({"type": "archive", "agentId": parent}))
        .await;
    assert_eq!(refused["type"], "request_error", "{refused}");
    assert_eq!(refused["payload"]["code"], "agent_active", "{refused}");
    let subagents = refused["payload"]["details"]["families"]["subagent"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        subagents.iter().any(|s| s["agentId"] == child_id.as_str()),
        "{refused}"
    );
    assert!(client.listed_agent(&parent).await["archivedAt"].is_null());
    assert!(client.listed_agent(&child_id).await["archivedAt"].is_null());
    assert!(
        !agent_processes(&child_id).is_empty(),
        "the child still runs"
    );

    // 5. With stopActivity both are archived and no process of either is left.
    let archived = client
        .request(json!({"type": "archive", "agentId": parent, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let mut list: Vec<&str> = archived["payload"]["archived"]
        .as_array()
        .expect("archived")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    list.sort_unstable();
    let mut both = [parent.as_str(), child_id.as_str()];
    both.sort_unstable();
    assert_eq!(list, both, "{archived}");
    for id in [&parent, &child_id] {
        assert!(client.listed_agent(id).await["archivedAt"].is_string());
        assert!(
            no_agent_processes_left(id).await,
            "processes of {id} left: {:?}",
            agent_processes(id)
        );
    }
    assert!(worktree.is_dir(), "archiving agents keeps their worktree");

    // 6. The worktree is archived by the user (an unrelated agent may not: its agents are
    //    not that agent's own): the teardown runs and the worktree is removed.
    let archived = client
        .request(json!({"type": "archive_workspace", "workspaceId": workspace}))
        .await;
    assert_eq!(archived["type"], "workspace_archived", "{archived}");
    let outcome = archived["payload"].clone();
    assert_eq!(outcome["worktree"]["removed"], true, "{outcome}");
    assert_eq!(
        outcome["agents"],
        json!([]),
        "its agents were archived already: {outcome}"
    );
    assert_eq!(
        outcome["worktree"]["teardown"].as_array().map(Vec::len),
        Some(1),
        "{outcome}"
    );
    assert!(teardown_marker.exists(), "the teardown ran");
    assert!(!worktree.exists(), "the worktree is removed");
    let state = daemon.client().await.1;
    let ws = state["workspaces"]
        .as_array()
        .expect("workspaces")
        .iter()
        .find(|w| w["id"] == workspace.as_str())
        .cloned()
        .expect("the workspace is kept");
    assert_eq!(ws["kind"], "worktree", "{ws}");
    assert!(ws["archivedAt"].is_string(), "{ws}");

    drop(client);
    daemon.stop().await;
    for id in [&parent, &child_id] {
        assert!(
            no_agent_processes_left(id).await,
            "{id}: {:?}",
            agent_processes(id)
        );
    }
}
