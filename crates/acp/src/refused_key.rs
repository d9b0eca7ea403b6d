//! A turn the model API refused for its key (HTTP 401, or the vendor's "invalid key" words),
//! as the agents word it, so that the failed turn says where the key is and how to replace it.
//!
//! What the agents answered `session/prompt` with, their model API answering 401 (checked
//! against a loopback model): codex-acp 0.16, -32603 `Internal error (unexpected status 401
//! Unauthorized: Incorrect API key provided: …)`; gemini-cli 0.61, the code 401 and the API's
//! JSON (`API key not valid. Please pass a valid API key.`); Anthropic's answer is
//! `authentication_error` / `invalid x-api-key` (claude-agent-acp retries it ten times first).

/// Phrases (lower case) that say the model API refused the agent's key.
const REFUSED_KEY_PHRASES: &[&str] = &[
    "401 unauthorized",
    "status 401",
    "status: 401",
    "api error: 401",
    "incorrect api key",
    "invalid api key",
    "invalid_api_key",
    "invalid x-api-key",
    "authentication_error",
    "api key not valid",
    "api_key_invalid",
    // How drover words an error whose JSON-RPC code is the HTTP status (gemini-cli).
    "with error 401:",
];

/// The part of the hint that says where to act: the machine that runs the agent. A hub
/// relaying a host's messages names the host there ([`placed_on_host`]).
const WHERE: &str = " env in config.toml (read again when it changes) or run `drover login ";

/// What to add to a failed turn's error when it says the provider's key was refused: where
/// the key is and how to give another one.
pub(crate) fn hint(error: &str, provider: &str) -> Option<String> {
    let lower = error.to_lowercase();
    REFUSED_KEY_PHRASES
        .iter()
        .any(|p| lower.contains(p))
        .then(|| {
            format!(
                "the model API refused the agent's key: replace it under \
                 [providers.{provider}]{WHERE}{provider}`, then send the message again"
            )
        })
}

/// `text` (a message of host `host`'s daemon, as its JSON line) with each refused-key hint in
/// it naming that host, whose `config.toml` and `drover login` it means, not the hub's; `None`
/// when it has none. The host's name is written as JSON string content.
pub fn placed_on_host(text: &str, host: &str) -> Option<String> {
    if !text.contains(WHERE) {
        return None;
    }
    let quoted = serde_json::to_string(host).unwrap_or_default();
    let host = quoted
        .strip_prefix('"')
        .and_then(|h| h.strip_suffix('"'))
        .unwrap_or_default();
    Some(text.replace(
        WHERE,
        &format!(
            " env in the config.toml of host `{host}` (read again when it changes) or run, on \
             host `{host}`, `drover login "
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::{hint, placed_on_host};

    #[test]
    fn the_agents_words_for_a_refused_key_get_the_hint() {
        for error in [
            "the agent answered `session/prompt` with error -32603: Internal error (unexpected status 401 Unauthorized: Incorrect API key provided: sk-bad., url: http://127.0.0.1:7602/v1/responses)",
            r#"the agent answered `session/prompt` with error 401: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}"#,
            r#"Internal error: API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        ] {
            let said = hint(error, "codex").unwrap_or_default();
            assert!(
                said.contains("[providers.codex]") && said.contains("drover login codex"),
                "{error}: {said}"
            );
        }
    }

    #[test]
    fn a_hosts_hint_names_the_host() {
        let error = "Incorrect API key provided: sk-bad.";
        let said = hint(error, "codex").unwrap_or_default();
        let line = serde_json::json!({"type": "agent_update", "payload": {"error": said}});
        let placed = placed_on_host(&line.to_string(), "b").unwrap_or_default();
        let error =
            serde_json::from_str::<serde_json::Value>(&placed).expect("json")["payload"]["error"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        assert!(
            error.contains("[providers.codex] env in the config.toml of host `b`")
                && error.contains("on host `b`, `drover login codex`"),
            "{error}"
        );
        assert_eq!(placed_on_host("{\"type\":\"agent_update\"}", "b"), None);
    }

    #[test]
    fn other_failures_get_no_hint() {
        for error in [
            "the agent answered `session/prompt` with error -32603: Internal error (stream disconnected before completion)",
            "exceeded retry limit, last status: 429 Too Many Requests",
            "wrote 401 lines to parser.rs",
        ] {
            assert_eq!(hint(error, "codex"), None, "{error}");
        }
    }
}
