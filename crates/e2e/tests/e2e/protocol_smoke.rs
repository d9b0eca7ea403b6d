//! A first pass through the protocol: handshake, create, stream, initialize.

use drover_testkit::daemon::TestDaemon;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_run_and_initialize() {
    let daemon = TestDaemon::start().await;
    let (mut client, state) = daemon.client().await;
    assert_eq!(state["agents"], json!([]));
    let id = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hello"}))
        .await;
    client.initialize_agent(&id).await;
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
