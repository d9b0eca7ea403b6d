//! The pinned real agents as a user installs and configures them: the npm packages' own
//! launchers on `PATH` under the preset names, and only an API key in `config.toml` (plus the
//! address of the scripted model standing in for the vendor's API). No pre-made login: codex
//! gets its key through ACP `authenticate` (`openai-api-key`, an `env_var` method), gemini
//! through its `gemini-api-key` method, claude through its environment. Each runs a turn
//! against the scripted model through the daemon. Needs `scripts/install-agents`.

use std::path::Path;
use std::time::Duration;

use drover_fakes::model;
use drover_fakes::real_agents::agents_dir;
use drover_testkit::daemon::TestDaemon;
use serde_json::json;
use tempfile::TempDir;

const TURN_MS: u64 = 90_000;
const KEY: &str = "sk-drover-test-key";

/// `PATH` as `npm install -g` leaves it: the launchers, then the system (for `node`).
fn user_path() -> String {
    let bin = agents_dir().join("node_modules/.bin");
    assert!(
        bin.join("codex-acp").exists(),
        "the agents are not installed in {}: run scripts/install-agents",
        bin.display()
    );
    format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display())
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

/// `[providers.NAME] env = { … }` with a private HOME and the user's PATH.
fn provider(name: &str, home: &Path, vars: &[(&str, String)]) -> String {
    let mut env = vec![
        format!("HOME = {}", quote(&home.display().to_string())),
        format!("PATH = {}", quote(&user_path())),
    ];
    env.extend(vars.iter().map(|(k, v)| format!("{k} = {}", quote(v))));
    format!("[providers.{name}]\nenv = {{ {} }}\n", env.join(", "))
}

async fn one_turn(name: &str, config: String, cwd: &Path) -> String {
    let home = TempDir::new().expect("drover home");
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), Some(home), config).await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({"provider": name, "cwd": cwd, "prompt": format!("reply {name} signed in with a key")}))
        .await;
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": TURN_MS}))
        .await;
    let timeline = client.timeline(&id).await;
    assert_eq!(
        idle["payload"]["idle"], true,
        "{name}: {idle} {timeline:#?}"
    );
    let agent = client
        .request(json!({"type": "get_agent", "agentId": id}))
        .await;
    assert_eq!(
        agent["payload"]["agent"]["status"], "idle",
        "{name}: {agent} {timeline:#?}"
    );
    assert_eq!(
        client.turn_events(&id).await,
        ["turn_completed"],
        "{name}: {timeline:#?}"
    );
    let reply: String = timeline
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str())
        .collect();
    drop(client);
    daemon.stop().await;
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_signin_with_only_an_api_key_in_config_toml() {
    let model = model::serve(
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind"),
    );
    let url = model.url();
    let cwd = TempDir::new().expect("cwd");
    let cwd = std::fs::canonicalize(cwd.path()).expect("canonical cwd");
    let scratch = TempDir::new().expect("scratch");

    // codex: the key, and where "OpenAI" is (codex's own config file, as a user with a
    // gateway writes it). No auth.json: drover signs it in.
    let codex_home = scratch.path().join("codex-user");
    std::fs::create_dir_all(codex_home.join(".codex")).expect("codex home");
    std::fs::write(
        codex_home.join(".codex/config.toml"),
        format!("openai_base_url = {}\n", quote(&format!("{url}/v1"))),
    )
    .expect("codex config");
    let codex = provider("codex", &codex_home, &[("OPENAI_API_KEY", KEY.to_string())]);
    let reply = one_turn("codex", codex, &cwd).await;
    assert!(
        reply.contains("codex signed in with a key"),
        "codex: {reply}"
    );
    let auth = std::fs::read_to_string(codex_home.join(".codex/auth.json"))
        .expect("codex kept the key drover signed it in with");
    assert!(auth.contains("apikey"), "{auth}");

    // gemini: the key and the model's address; drover picks `gemini-api-key`.
    let gemini_home = scratch.path().join("gemini-user");
    std::fs::create_dir_all(&gemini_home).expect("gemini home");
    let gemini = provider(
        "gemini",
        &gemini_home,
        &[
            ("GEMINI_API_KEY", KEY.to_string()),
            ("GOOGLE_GEMINI_BASE_URL", url.clone()),
        ],
    );
    let reply = one_turn("gemini", gemini, &cwd).await;
    assert!(
        reply.contains("gemini signed in with a key"),
        "gemini: {reply}"
    );

    // claude: the key and the model's address; it asks for no sign-in over ACP.
    let claude_home = scratch.path().join("claude-user");
    std::fs::create_dir_all(&claude_home).expect("claude home");
    let claude = provider(
        "claude",
        &claude_home,
        &[
            ("ANTHROPIC_API_KEY", KEY.to_string()),
            ("ANTHROPIC_BASE_URL", url.clone()),
        ],
    );
    let reply = one_turn("claude", claude, &cwd).await;
    assert!(
        reply.contains("claude signed in with a key"),
        "claude: {reply}"
    );

    tokio::time::timeout(Duration::from_secs(5), model.shutdown())
        .await
        .ok();
}
