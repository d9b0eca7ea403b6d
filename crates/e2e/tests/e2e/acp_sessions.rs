//! ACP as agents speak it today: what an agent advertises at `initialize` is kept and shown;
//! a session comes back through `session/resume` (no replay) where the agent offers it, else
//! `session/load`; a stopping runtime closes its session with `session/close` where offered;
//! an agent that answers with an ACP version drover does not speak fails its start, saying so.

use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, string_at};
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);

/// A daemon with the scripted provider (`env` added to its environment) whose runtimes
/// hibernate after half a second; the agents' state dir goes with it.
async fn daemon_with(env: &str) -> (TestDaemon, TempDir) {
    crate::hibernation::daemon_with("idle_timeout = \"500ms\"", env).await
}

/// Waits until the agent's runtime is cold (hibernated).
async fn cold(client: &mut Client, agent: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if client.get_agent(agent).await["runtime"]["state"] == "cold" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{agent} never hibernated"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The session's history as the scripted agent keeps it (one JSON object per line).
fn history(state: &TempDir, session: &str) -> Vec<Value> {
    std::fs::read_to_string(state.path().join(format!("{session}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `via` of each "resumed the agent's session" notice.
async fn resumed_via(client: &mut Client, agent: &str) -> Vec<String> {
    client
        .timeline(agent)
        .await
        .iter()
        .filter(|i| i["kind"] == "notice" && i["data"]["restored"] == true)
        .filter_map(|i| i["data"]["via"].as_str().map(str::to_string))
        .collect()
}

async fn first_turn(client: &mut Client, daemon: &TestDaemon) -> (String, Value) {
    let id = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": "say first"}))
        .await;
    client.wait_idle(&id).await;
    let agent = client.get_agent(&id).await;
    (id, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_closed_when_its_runtime_stops_and_resumed_without_replay() {
    let (daemon, state) = daemon_with("").await;
    let (mut client, _) = daemon.client().await;
    let (id, live) = first_turn(&mut client, &daemon).await;
    let advertised = &live["runtime"]["agent"];
    assert_eq!(advertised["name"], "drover-scripted-agent", "{live}");
    assert_eq!(advertised["protocolVersion"], 1, "{live}");
    let capabilities = advertised["capabilities"].as_array().expect("capabilities");
    for capability in ["load", "resume", "close", "mcp-http", "embedded-context"] {
        assert!(
            capabilities.iter().any(|c| c == capability),
            "{capability}: {live}"
        );
    }
    let session = live["sessionId"].as_str().expect("a session").to_string();

    // Hibernation stops the runtime: the session is closed first.
    cold(&mut client, &id).await;
    assert!(
        history(&state, &session)
            .iter()
            .any(|e| e["type"] == "closed"),
        "{:?}",
        history(&state, &session)
    );
    // What the agent advertised is still known while it is cold.
    let asleep = client.get_agent(&id).await;
    assert_eq!(asleep["runtime"]["agent"], *advertised, "{asleep}");

    // The next message continues the same session through session/resume: the agent knows
    // its first prompt.
    client
        .request(json!({"type": "send_message", "agentId": id, "text": "recall"}))
        .await;
    client.wait_idle(&id).await;
    assert_eq!(
        client.replies(&id).await.last().map(String::as_str),
        Some("recall: 1 earlier: say first")
    );
    assert_eq!(resumed_via(&mut client, &id).await, ["session/resume"]);
    assert_eq!(client.get_agent(&id).await["sessionId"], session.as_str());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_predates_resume_loads_its_session_and_is_not_asked_to_close_it() {
    let (daemon, state) = daemon_with("SCRIPTED_AGENT_NO_RESUME = \"1\"").await;
    let (mut client, _) = daemon.client().await;
    let (id, live) = first_turn(&mut client, &daemon).await;
    let capabilities = live["runtime"]["agent"]["capabilities"]
        .as_array()
        .expect("capabilities")
        .clone();
    assert!(capabilities.iter().any(|c| c == "load"), "{live}");
    assert!(
        !capabilities.iter().any(|c| c == "resume" || c == "close"),
        "{live}"
    );
    let session = live["sessionId"].as_str().expect("a session").to_string();
    cold(&mut client, &id).await;
    assert!(
        !history(&state, &session)
            .iter()
            .any(|e| e["type"] == "closed"),
        "session/close sent to an agent that does not offer it"
    );
    client
        .request(json!({"type": "send_message", "agentId": id, "text": "recall"}))
        .await;
    client.wait_idle(&id).await;
    assert_eq!(
        client.replies(&id).await.last().map(String::as_str),
        Some("recall: 1 earlier: say first")
    );
    assert_eq!(resumed_via(&mut client, &id).await, ["session/load"]);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_speaks_another_acp_version_fails_its_start_saying_so() {
    let (daemon, _state) = daemon_with("SCRIPTED_AGENT_PROTOCOL_VERSION = \"2\"").await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi"}))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let agent = loop {
        let agent = client.get_agent(&id).await;
        if agent["status"] == "error" {
            break agent;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never failed: {agent}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = agent["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("speaks ACP version 2") && error.contains("drover speaks version 1"),
        "{agent}"
    );
    assert_eq!(agent["runtime"]["agent"]["protocolVersion"], 2, "{agent}");
    assert_eq!(agent["queued"].as_array().map(Vec::len), Some(1), "{agent}");
    daemon.stop().await;
}

/// `(value, via)` of each `kind` (`mode`, `model`) the session's history records as set.
fn settings(state: &TempDir, session: &str, kind: &str) -> Vec<(String, String)> {
    history(state, session)
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| {
            (
                e["text"].as_str().unwrap_or_default().to_string(),
                e["via"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_and_model_are_set_through_config_options_where_the_agent_offers_them() {
    let config_options = "session/set_config_option";
    for (env, mode_via, model_via) in [
        (
            "SCRIPTED_AGENT_CONFIG_OPTIONS = \"1\"",
            config_options,
            config_options,
        ),
        ("", "session/set_mode", "session/set_model"),
    ] {
        let (daemon, state) = daemon_with(env).await;
        let (mut client, _) = daemon.client().await;
        let id = client
            .create_agent(json!({
                "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi",
                "mode": "plan", "model": "scripted-large",
            }))
            .await;
        client.wait_idle(&id).await;
        let session = string_at(&client.get_agent(&id).await["sessionId"]);
        assert_eq!(
            settings(&state, &session, "mode"),
            [("plan".to_string(), mode_via.to_string())],
            "{env}"
        );
        assert_eq!(
            settings(&state, &session, "model"),
            [("scripted-large".to_string(), model_via.to_string())],
            "{env}"
        );

        // A mode the user sets goes the same way (now, or as the runtime starts again).
        let set = client
            .request(json!({"type": "set_mode", "agentId": id, "modeId": "default"}))
            .await;
        assert_ne!(set["type"], "request_error", "{set}");
        client
            .request(json!({"type": "send_message", "agentId": id, "text": "say again"}))
            .await;
        client.wait_idle(&id).await;
        assert_eq!(
            settings(&state, &session, "mode").last(),
            Some(&("default".to_string(), mode_via.to_string())),
            "{env}: {:?}",
            history(&state, &session)
        );
        daemon.stop().await;
    }
}

/// The live session's config option `id`, as clients see it.
fn option<'a>(agent: &'a Value, id: &str) -> &'a Value {
    agent["configOptions"]
        .as_array()
        .and_then(|all| all.iter().find(|o| o["id"] == id))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_effort_and_the_agents_settings_are_shown_and_set_as_config_options() {
    let (daemon, state) = daemon_with("SCRIPTED_AGENT_CONFIG_OPTIONS = \"1\"").await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi", "effort": "high",
        }))
        .await;
    client.wait_idle(&id).await;
    let agent = client.get_agent(&id).await;
    let session = agent["sessionId"].as_str().expect("a session").to_string();
    // The effort asked for at creation reached the agent through its `thought_level` option.
    assert_eq!(
        settings(&state, &session, "effort"),
        [("high".to_string(), "session/set_config_option".to_string())]
    );
    assert_eq!(agent["effort"], "high", "{agent}");
    let effort = option(&agent, "effort");
    assert_eq!(effort["category"], "thought_level", "{agent}");
    assert_eq!(effort["currentValue"], "high", "{agent}");
    let values: Vec<&str> = effort["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v["value"].as_str())
        .collect();
    assert_eq!(values, ["low", "medium", "high"]);
    assert_eq!(
        option(&agent, "session-mode")["category"],
        "mode",
        "{agent}"
    );

    // What the agent does not offer is refused, saying what it does offer.
    let refused = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "effort", "value": "extreme"}))
        .await;
    assert_eq!(refused["payload"]["code"], "invalid_input", "{refused}");
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("low, medium, high"), "{refused}");
    let refused = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "verbosity", "value": "loud"}))
        .await;
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("session-mode, llm, effort"), "{refused}");

    // A change by the option's own id reaches the agent, and every client sees it.
    let set = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "effort", "value": "low"}))
        .await;
    assert_eq!(set["type"], "ok", "{set}");
    let status = client
        .recv_where(|m| {
            let agent = &m["payload"]["agent"];
            m["type"] == "agent_status"
                && agent["effort"] == "low"
                && option(agent, "effort")["currentValue"] == "low"
        })
        .await;
    assert_eq!(status["payload"]["agent"]["id"], id.as_str(), "{status}");
    assert_eq!(
        settings(&state, &session, "effort").last(),
        Some(&("low".to_string(), "session/set_config_option".to_string()))
    );

    // Cold, the options are gone from view but the choice is kept, and a new runtime shows
    // (and has) it.
    cold(&mut client, &id).await;
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["configOptions"], Value::Null, "{agent}");
    assert_eq!(agent["effort"], "low", "{agent}");
    client
        .request(json!({"type": "send_message", "agentId": id, "text": "say again"}))
        .await;
    client.wait_idle(&id).await;
    let agent = client.get_agent(&id).await;
    assert_eq!(option(&agent, "effort")["currentValue"], "low", "{agent}");
    daemon.stop().await;
}

/// A mode the agent does not have (a typo, another agent's name for it) is said in the
/// timeline with the modes it has, and the turn runs in the mode it was in; it was dropped
/// without a word. Set live, it is refused with the modes it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_the_agent_does_not_have_is_said_with_the_ones_it_has() {
    let (daemon, _state) = daemon_with("").await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi", "mode": "yolo",
        }))
        .await;
    client.wait_idle(&id).await;
    let notices = client.notices(&id).await;
    assert!(
        notices
            .iter()
            .any(|n| n == "mode `yolo` not applied: the agent's modes are default, plan"),
        "{notices:?}"
    );
    assert_eq!(client.replies(&id).await, ["hi"]);
    // A mode it has is taken without a word.
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi", "mode": "plan",
        }))
        .await;
    client.wait_idle(&id).await;
    let notices = client.notices(&id).await;
    assert!(
        !notices.iter().any(|n| n.contains("not applied")),
        "{notices:?}"
    );
    assert_eq!(client.get_agent(&id).await["currentModeId"], "plan");
    // Live, a mode it does not have is refused naming the ones it has, and a setting it does
    // not have names mode and model among the ones it has (it said "it offers: none").
    let refused = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "mode", "value": "yolo"}))
        .await;
    assert_eq!(refused["payload"]["code"], "invalid_input", "{refused}");
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("give one of: default, plan"), "{refused}");
    assert_eq!(client.get_agent(&id).await["currentModeId"], "plan");
    let refused = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "colour", "value": "blue"}))
        .await;
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("it offers: mode, model"), "{refused}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effort_the_agent_cannot_take_is_said_in_its_timeline() {
    let (daemon, _state) = daemon_with("").await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({
            "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi", "effort": "high",
        }))
        .await;
    client.wait_idle(&id).await;
    let notices = client.notices(&id).await;
    assert!(
        notices
            .iter()
            .any(|n| n == "reasoning effort `high` not applied: the agent offers no such setting"),
        "{notices:?}"
    );
    assert_eq!(client.replies(&id).await, ["hi"]);
    // Live, with no such option: refused, saying so.
    let refused = client
        .request(json!({"type": "set_config_option", "agentId": id, "configId": "effort", "value": "low"}))
        .await;
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("offers no setting `effort`"), "{refused}");
    daemon.stop().await;
}
