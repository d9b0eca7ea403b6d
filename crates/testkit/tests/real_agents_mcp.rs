use drover_testkit::daemon::TestDaemon;
use drover_testkit::model;
use drover_testkit::real_agents::{RealAgent, agents_dir};
use serde_json::json;
use tempfile::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe() {
    let home = TempDir::new().unwrap();
    let cwd_dir = TempDir::new().unwrap();
    let scratch = TempDir::new().unwrap();
    let cwd = std::fs::canonicalize(cwd_dir.path()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let model = model::serve(listener).await;
    let command = RealAgent::Codex.command(&agents_dir(), &model.url(), scratch.path(), &cwd).unwrap();
    let mut argv = vec![serde_json::to_string(&command.program.display().to_string()).unwrap()];
    argv.extend(command.args.iter().map(|a| serde_json::to_string(a).unwrap()));
    let env: Vec<String> = command.env.iter().map(|(k, v)| format!("{} = {}", serde_json::to_string(k).unwrap(), serde_json::to_string(v).unwrap())).collect();
    let config = format!("[providers.codex]\ncommand = [{}]\nenv = {{ {} }}\n", argv.join(", "), env.join(", "));
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), None, config).await;
    let (mut client, _) = daemon.client().await;
    let created = client.request(json!({"type": "create_agent", "provider": "codex", "cwd": cwd, "prompt": "reply hi"})).await;
    let id = created["payload"]["agent"]["id"].as_str().unwrap().to_string();
    client.request(json!({"type": "initialize_agent_request", "agentId": id})).await;
    let idle = client.request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 60000})).await;
    eprintln!("{idle}");
    std::fs::write("/tmp/probe/requests.json", serde_json::to_string_pretty(&model.requests()).unwrap()).unwrap();
    daemon.stop().await;
}
