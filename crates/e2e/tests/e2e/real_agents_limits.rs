//! Usage limits as the pinned agents really surface them (issue 25): codex, claude and gemini
//! from their npm launchers, against the scripted model answering HTTP 429 as each provider's
//! API does (see `drover_fakes::model`'s `limit`): each waits `limited` with its own words and
//! its prompt runs after the backoff (2 s here) once the model takes requests again. codex
//! also with a reset time, which it names to the minute (the parsing is unit-tested in
//! `drover-acp`; waiting for that minute would make this test slow). codex also with
//! `on_limit = { fallback = … }`: the work goes on on the scripted provider. Needs
//! `scripts/install-agents`.

use std::time::Duration;

use drover_fakes::real_agents::{RealAgent, provider_toml};
use drover_testkit::RealGround;
use drover_testkit::daemon::{TestDaemon, string_at};
use drover_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;

/// Generous: codex's start and turns on 2 loaded cores.
const WAIT: Duration = Duration::from_secs(90);

/// `agent` (with `env` added) against the scripted model, whose first answers to the prompt
/// are 429 for 1 s without a reset time: the agent waits `limited` (its error holds `words`)
/// and its prompt is answered after the 2 s backoff.
async fn waits_and_resumes(agent: RealAgent, env: &[(&str, &str)], words: &str) {
    let name = agent.name();
    let ground = RealGround::new().await;
    let mut command = ground.command(agent);
    for (k, v) in env {
        command.env.insert((*k).to_string(), (*v).to_string());
    }
    let config = format!("{}limit_backoff = \"2s\"\n", provider_toml(name, &command));
    let daemon = TestDaemon::start_fresh_with_config(config).await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({
            "provider": name, "cwd": ground.cwd,
            "prompt": "limit 1 noreset\nreply back after the limit",
        }))
        .await;
    let info = drover_testkit::wait::poll_until(WAIT, async || {
        let info = client.get_agent(&id).await;
        (info["attentionReason"] == "limited").then_some(info)
    })
    .await;
    let Some(info) = info else {
        let timeline = client.timeline(&id).await;
        panic!("{name} never waited for the limit: {timeline:#?}");
    };
    let error = info["limited"]["error"].as_str().unwrap_or_default();
    eprintln!("{name} says: {error}");
    assert!(error.contains(words), "{name}: {info}");
    eventually("the prompt sent again", WAIT, async || {
        client.turn_events(&id).await.len() == 2
    })
    .await;
    assert_eq!(
        client.turn_events(&id).await,
        ["turn_limited", "turn_completed"],
        "{name}"
    );
    let said: String = client.replies(&id).await.concat();
    if !said.contains("back after the limit") {
        let timeline = client.timeline(&id).await;
        let played: Vec<Value> = ground
            .model
            .requests()
            .into_iter()
            .map(|r| r["played"].clone())
            .collect();
        panic!("{name} said {said:?}: {timeline:#?} {played:?}");
    }
    daemon.stop().await;
    ground.model.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_limits_claude_waits_for_its_usage_limit_and_resumes() {
    // Claude Code retries a 429 itself, ten times with backoff, before it gives up: this
    // test tells it not to, so that what it then says is quick to see.
    waits_and_resumes(
        RealAgent::Claude,
        &[("CLAUDE_CODE_MAX_RETRIES", "0")],
        "rate_limit_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_limits_gemini_waits_for_its_usage_limit_and_resumes() {
    waits_and_resumes(RealAgent::Gemini, &[], "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_limits_codex_waits_for_its_usage_limit_and_resumes() {
    let agent = RealAgent::Codex;
    let name = agent.name();
    let ground = RealGround::new().await;
    let command = ground.command(agent);
    let config = format!("{}limit_backoff = \"2s\"\n", provider_toml(name, &command));
    let daemon = TestDaemon::start_fresh_with_config(config).await;
    let (mut client, _) = daemon.client().await;

    // The model refuses this message for 1 s.
    let id = client
        .create_agent(json!({
            "provider": name, "cwd": ground.cwd,
            "prompt": "limit 1 noreset\nreply back after the limit",
        }))
        .await;
    let info = eventually("codex to hit the limit", WAIT, async || {
        let info = client.get_agent(&id).await;
        (info["attentionReason"] == "limited").then_some(info)
    })
    .await;
    let error = info["limited"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("You've hit your usage limit. Try again later."),
        "{info}"
    );
    assert!(info["limited"]["resetAt"].is_null(), "{info}");
    assert_eq!(info["queued"].as_array().map(Vec::len), Some(1), "{info}");

    eventually("the prompt sent again", WAIT, async || {
        client.turn_events(&id).await.len() == 2
    })
    .await;
    assert_eq!(
        client.turn_events(&id).await,
        ["turn_limited", "turn_completed"]
    );
    let said: String = client.replies(&id).await.concat();
    assert!(said.contains("back after the limit"), "{said}");
    let info = client.get_agent(&id).await;
    assert!(info["limited"].is_null(), "{info}");
    // The model saw the 429 and then the prompt it answered.
    let played: Vec<Value> = ground
        .model
        .requests()
        .into_iter()
        .filter(|r| r["api"] == "openai")
        .map(|r| r["played"].clone())
        .collect();
    assert_eq!(
        played.first().map(|p| &p["directive"]),
        Some(&json!("limit"))
    );
    assert!(
        played.last().is_some_and(|p| p["directive"] == "reply"),
        "{played:?}"
    );

    // With a reset time codex names it; drover waits until that minute is over.
    let id = client
        .create_agent(json!({
            "provider": name, "cwd": ground.cwd,
            "prompt": "limit 600\nreply never",
        }))
        .await;
    let info = eventually("codex to hit the limit", WAIT, async || {
        let info = client.get_agent(&id).await;
        (info["attentionReason"] == "limited").then_some(info)
    })
    .await;
    let error = info["limited"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("Try again at "), "{info}");
    let reset: jiff::Timestamp = info["limited"]["resetAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no resetAt: {info}"));
    let expected = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(600);
    let off = reset.duration_since(expected).as_secs().abs();
    assert!(off <= 120, "reset {reset}, expected about {expected}");
    daemon.stop().await;
    ground.model.shutdown().await;
}

// codex with `on_limit = { fallback = "scripted" }`: its real usage-limit error hands the work
// to a subagent on the scripted provider, whose first prompt quotes codex's conversation (its
// first reply, as the model wrote it) and the prompt that failed; codex waits for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_limits_codex_falls_back_to_another_provider() {
    let agent = RealAgent::Codex;
    let name = agent.name();
    let ground = RealGround::new().await;
    let state = TempDir::new().expect("scripted state");
    let command = ground.command(agent);
    let scripted =
        drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), state.path())
            .replace(" }", ", SCRIPTED_AGENT_UNLIMITED = \"1\" }");
    let config = format!(
        "{}on_limit = {{ fallback = \"scripted\" }}\n{scripted}",
        provider_toml(name, &command)
    );
    let daemon = TestDaemon::start_fresh_with_config(config).await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(
            json!({"provider": name, "cwd": ground.cwd, "title": "coder",
            "prompt": "reply the first answer"}),
        )
        .await;
    eventually("codex's first turn", WAIT, async || {
        client.turn_events(&id).await == ["turn_completed"]
    })
    .await;
    let first: String = client.replies(&id).await.concat();
    assert!(first.contains("the first answer"), "{first}");

    // The model refuses the next prompt for ten minutes, without a reset time.
    client
        .send_message(&id, "limit 600 noreset\nreply never from codex")
        .await;
    let ended = eventually("codex's turn handed over", WAIT, async || {
        client
            .timeline(&id)
            .await
            .into_iter()
            .find(|i| i["kind"] == "turn_ended" && i["data"]["event"] == "turn_limited")
    })
    .await;
    let spare = string_at(&ended["data"]["fallbackAgentId"]);
    client.wait_idle(&spare).await;
    let info = client.get_agent(&spare).await;
    assert_eq!(info["type"], "scripted", "{info}");
    assert_eq!(info["parentAgentId"], id.as_str(), "{info}");
    let prompt = client
        .timeline(&spare)
        .await
        .into_iter()
        .find(|i| i["kind"] == "user_message")
        .and_then(|i| i["data"]["text"].as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(
        prompt.starts_with("[drover] You take over the work of agent \"coder\"")
            && prompt.contains("You've hit your usage limit. Try again later.")
            && prompt.contains("User:\n> reply the first answer")
            && prompt.contains("Agent:\n> the first answer")
            && prompt.ends_with("limit 600 noreset\nreply never from codex"),
        "{prompt}"
    );
    let info = client.get_agent(&id).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert!(info["limited"].is_null(), "{info}");
    assert_eq!(info["queued"].as_array().map(Vec::len), Some(0), "{info}");
    daemon.stop().await;
    ground.model.shutdown().await;
}
