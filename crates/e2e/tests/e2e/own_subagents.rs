//! The subagents an agent runs itself (claude's Task tool calls, ACP child sessions announced
//! by `subagent_update`): shown in `AgentInfo.ownSubagents` while its process lives, counted
//! as `subagent` activity by archive admission while they run, their work kept out of the
//! agent's own timeline; they end with the process.

use drover_testkit::daemon::{Client, TestDaemon, WAIT};
use drover_testkit::wait::eventually;
use serde_json::{Value, json};

async fn own(client: &mut Client, agent: &str) -> Vec<Value> {
    client.get_agent(agent).await["ownSubagents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The archive's refusal: `agent_active`, with the families that still run.
async fn refused_archive(client: &mut Client, agent: &str) -> Value {
    let refused = client
        .request(json!({"type": "archive", "agentId": agent}))
        .await;
    assert_eq!(refused["payload"]["code"], "agent_active", "{refused}");
    refused["payload"]["details"]["families"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_tool_call_is_the_agents_own_subagent_while_its_turn_runs_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(),
            "prompt": "own-task Explore the repo\nsleep 60000",
        }))
        .await;
    eventually("the Task shown as running", WAIT, async || {
        own(&mut client, &id)
            .await
            .first()
            .map(|s| s["state"].clone())
            == Some(json!("running"))
    })
    .await;
    let task = own(&mut client, &id).await[0].clone();
    assert_eq!(task["title"], "Explore the repo", "{task}");
    assert_eq!(task["via"], "tool_call", "{task}");
    let families = refused_archive(&mut client, &id).await;
    assert_eq!(
        families["subagent"][0]["title"], "Explore the repo",
        "{families}"
    );
    assert!(families["turn"].is_array(), "{families}");

    // A Task cannot outlive the turn that runs it.
    client
        .request(json!({"type": "cancel", "agentId": id}))
        .await;
    client.wait_idle(&id).await;
    let task = own(&mut client, &id).await[0].clone();
    assert_eq!(task["state"], "interrupted", "{task}");
    assert!(task["endedAt"].is_string(), "{task}");
    let archived = client
        .request(json!({"type": "archive", "agentId": id}))
        .await;
    assert_ne!(archived["type"], "request_error", "{archived}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_session_runs_past_the_turn_and_holds_the_archive_until_it_is_idle() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(),
            "prompt": "own-subagent Reviewer\nsay delegated",
        }))
        .await;
    client.wait_idle(&id).await;
    let child = own(&mut client, &id).await[0].clone();
    assert_eq!(child["via"], "subagent_update", "{child}");
    assert_eq!(child["title"], "Reviewer", "{child}");
    assert_eq!(child["description"], "a scripted child session", "{child}");
    assert_eq!(child["state"], "running", "{child}");
    assert_eq!(child["toolCalls"], 1, "{child}");
    // The child's words are its own: not in the agent's timeline.
    assert_eq!(client.replies(&id).await, ["delegated"]);
    let timeline = serde_json::to_string(&client.timeline(&id).await).expect("json");
    assert!(!timeline.contains("child working on"), "{timeline}");

    // The agent's turn is over, its child's work is not.
    let families = refused_archive(&mut client, &id).await;
    assert_eq!(families["subagent"][0]["title"], "Reviewer", "{families}");
    assert!(families.get("turn").is_none(), "{families}");

    client
        .request(json!({"type": "send_message", "agentId": id, "text": "own-subagent-done"}))
        .await;
    client.wait_idle(&id).await;
    let child = own(&mut client, &id).await[0].clone();
    assert_eq!(child["state"], "idle", "{child}");
    let archived = client
        .request(json!({"type": "archive", "agentId": id}))
        .await;
    assert_ne!(archived["type"], "request_error", "{archived}");
    // Closed with the archive: its process, and the subagents in it, are gone.
    eventually(
        "the archived agent's own subagents gone",
        WAIT,
        async || own(&mut client, &id).await.is_empty(),
    )
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_activity_archives_an_agent_whose_child_session_runs_and_ends_it_with_the_process() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(), "prompt": "own-subagent Reviewer",
        }))
        .await;
    client.wait_idle(&id).await;
    assert_eq!(own(&mut client, &id).await[0]["state"], "running");
    let archived = client
        .request(json!({"type": "archive", "agentId": id, "stopActivity": true}))
        .await;
    assert_ne!(archived["type"], "request_error", "{archived}");
    eventually("the process and its subagents gone", WAIT, async || {
        let agent = client.get_agent(&id).await;
        agent["runtime"]["state"] == "cold" && agent.get("ownSubagents").is_none()
    })
    .await;
    daemon.stop().await;
}
