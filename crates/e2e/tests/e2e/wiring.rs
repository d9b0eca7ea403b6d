//! The order in which the daemon's parts are wired and tell each other things: an agent woken
//! at boot already has its MCP server, and a parent told that its child's turn ended finds the
//! child idle.

use std::path::Path;
use std::time::Duration;

use drover_acp::{RuntimeManager, TimelineUpdate, no_mcp_servers};
use drover_core::{AgentStatus, NewAgent};
use drover_protocol::ItemKind;
use drover_testkit::daemon::{Client, TestDaemon};
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);

async fn create(client: &mut Client, cwd: &Path, prompt: &str) -> String {
    client.create_scripted(cwd, json!({"prompt": prompt})).await
}

/// Polls the agent's timeline until `want` holds.
async fn until(client: &mut Client, id: &str, what: &str, want: impl Fn(&[Value]) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let items = client.timeline(id).await;
        if want(&items) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what}; timeline: {items:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_before_a_restart_reaches_an_agent_that_has_its_mcp_server() {
    let home = TempDir::new().expect("home");
    // The agent's directory outlives the first daemon.
    let cwd_dir = TempDir::new().expect("cwd");
    let cwd = std::fs::canonicalize(cwd_dir.path()).expect("cwd");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    // A turn that never ends, and a call to drover's MCP server queued behind it.
    let id = create(&mut client, &cwd, "hang").await;
    until(&mut client, &id, "turn_started", |items| {
        items
            .iter()
            .any(|i| i["kind"] == ItemKind::TurnStarted.as_str())
    })
    .await;
    let queued = client
        .request(json!({"type": "send_message", "agentId": id, "text": "mcp list_agents {\"scope\": \"all\"}"}))
        .await;
    assert_eq!(queued["type"], "message_queued", "{queued}");
    drop(client);
    daemon.stop().await;

    // The next daemon wakes the agent as it opens its runtimes. (Its session is not there
    // to load: this daemon's scripted agent keeps another state dir, so the prompt starts
    // with drover's note that context was lost, which the agent answers `ok: …` first.)
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    until(&mut client, &id, "answer from the MCP call", |items| {
        items.iter().any(|i| {
            i["kind"] == ItemKind::AgentMessage.as_str()
                && i["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("mcp list_agents"))
        })
    })
    .await;
    let said = client.replies(&id).await.concat();
    let said = said
        .split_once("mcp list_agents: ")
        .map_or("", |(_, answer)| answer);
    assert!(
        said.contains(&id),
        "the agent woken at boot had no working MCP server: {said}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_told_that_its_childs_turn_ended_finds_the_child_idle() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let state = TempDir::new().expect("agent state");
    let config =
        drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), state.path());
    std::fs::write(home.path().join("config.toml"), config).expect("config.toml");
    let providers = drover_acp::Providers::load(home.path()).expect("providers");
    let (manager, registry, _) = RuntimeManager::open(home.path(), providers, no_mcp_servers())
        .await
        .expect("open");
    let new_agent = |title: &str| NewAgent {
        provider: "scripted".to_string(),
        cwd: cwd.path().to_path_buf(),
        title: Some(title.to_string()),
        ..NewAgent::default()
    };
    let parent = drover_testkit::create_agent(
        &manager,
        new_agent("parent"),
        Some("say ready".to_string()),
        None,
    )
    .await
    .expect("parent");
    assert!(manager.wait_idle(parent.id, WAIT).await.expect("wait"));

    let mut updates = manager.subscribe();
    let child = drover_testkit::create_agent(
        &manager,
        new_agent("child"),
        Some("say done".to_string()),
        Some(parent.id),
    )
    .await
    .expect("child");
    // The first the parent hears of it: the notice, as it becomes the parent's turn.
    let source = format!("agent:{}", child.id);
    let notice = tokio::time::timeout(WAIT, async {
        loop {
            let event = updates.recv().await.expect("updates");
            if let TimelineUpdate::Item { item } = event.update
                && event.agent_id == parent.id
                && item.is(ItemKind::UserMessage)
                && item.data["source"] == source.as_str()
            {
                return item;
            }
        }
    })
    .await
    .expect("the parent was not told");
    let seen = registry.get(child.id).expect("child").status;
    assert_eq!(
        seen,
        AgentStatus::Idle,
        "the parent was told before the child's turn end was recorded: {notice:?}"
    );
    assert!(
        notice.data["text"]
            .as_str()
            .is_some_and(|t| t.contains("finished its turn") && t.contains("> done")),
        "{notice:?}"
    );

    // Closes the runtimes too.
    registry.shutdown().await;
}
