//! A first pass through the protocol: handshake, create, stream, initialize.

use drover_testkit::daemon::TestDaemon;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_run_and_initialize() {
    let daemon = TestDaemon::start().await;
    let (mut client, state) = daemon.client().await;
    assert_eq!(state["agents"], json!([]));
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hello"}))
        .await;
    assert_eq!(created["type"], "agent_created", "{created}");
    let id = created["payload"]["agent"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let init = client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    assert_eq!(init["type"], "agent_initialized", "{init}");
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 10000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true);
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id}))
        .await;
    let kinds: Vec<&str> = page["payload"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["kind"].as_str().unwrap_or(""))
        .collect();
    assert!(kinds.contains(&"agent_message"), "{page}");
    daemon.stop().await;
}
