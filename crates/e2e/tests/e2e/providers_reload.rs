//! `config.toml` takes effect without a restart: a provider added while the daemon runs can
//! be used at once, and a file that no longer reads is an error naming it until it is fixed.

use drover_testkit::daemon::TestDaemon;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_added_while_the_daemon_runs_is_used_at_once() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let create = json!({"type": "create_agent", "provider": "late", "cwd": daemon.cwd()});
    let refused = client.request(create.clone()).await;
    assert_eq!(refused["payload"]["code"], "unknown_provider", "{refused}");

    // The user adds a provider (a copy of the scripted one under another name).
    let path = daemon.home.join("config.toml");
    let config = std::fs::read_to_string(&path).expect("config.toml");
    let late = config.replace("[providers.scripted]", "[providers.late]");
    assert_ne!(late, config, "the scripted provider's section was found");
    std::fs::write(&path, format!("{config}\n{late}")).expect("write config.toml");
    let providers = client.request(json!({"type": "list_providers"})).await;
    assert!(
        providers["payload"]["providers"]
            .as_array()
            .expect("providers")
            .iter()
            .any(|p| p["name"] == "late"),
        "{providers}"
    );
    let created = client.request(create.clone()).await;
    assert_eq!(created["type"], "agent_created", "{created}");
    assert_eq!(created["payload"]["agent"]["type"], "late");

    // A typo: every use says which file is wrong, until it is fixed.
    std::fs::write(
        &path,
        format!("{config}\n[providers.broken]\ncomand = [\"x\"]\n"),
    )
    .expect("write config.toml");
    let broken = client.request(create.clone()).await;
    assert_eq!(broken["payload"]["code"], "invalid_config", "{broken}");
    let message = broken["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("config.toml"), "{message}");
    let listed = client.request(json!({"type": "list_providers"})).await;
    assert_eq!(listed["payload"]["code"], "invalid_config", "{listed}");
    std::fs::write(&path, &config).expect("write config.toml");
    let fixed = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    assert_eq!(fixed["type"], "agent_created", "{fixed}");
    daemon.stop().await;
}
