//! Sign-in, the ACP way: the `authMethods` an agent offers in its `initialize` answer, which
//! of them drover may use without asking anyone, and what each provider's sign-in looked like
//! the last time one of its agents started.
//!
//! An agent that needs a sign-in answers `session/new` (or `session/load`, or a prompt) with
//! error -32000 (ACP's `auth_required`). drover then picks a method without asking when one
//! fits, in this order:
//! 1. the method the provider's `auth` names in `config.toml`, if the agent offers it;
//! 2. an `env_var` method whose required variables the agent's environment holds (the
//!    provider's `env`, or the allowlisted part of the daemon's);
//! 3. a method a preset knows to be satisfied by variables (gemini's `gemini-api-key` by
//!    `GEMINI_API_KEY`: gemini-cli 0.61 predates the method types).
//!
//! It calls `authenticate` with it and opens the session again, once. A `terminal` method is
//! never picked: it needs the user at a terminal (`drover login`). When nothing fits, the
//! agent waits with attention `auth_required` and the methods, for a sign-in.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use drover_core::AuthMethod;
use drover_protocol::{AuthKind, AuthVar};
use serde_json::Value;

use crate::providers::Provider;
use crate::rpc::RpcError;

/// ACP's error code for "authentication required".
pub const AUTH_REQUIRED: i64 = -32000;

/// Whether the agent refused because it needs a sign-in.
pub fn is_auth_required(error: &RpcError) -> bool {
    matches!(error, RpcError::Remote { code, .. } if *code == AUTH_REQUIRED)
}

/// The `authMethods` of an `initialize` answer; entries that are not objects with an `id`
/// are skipped.
pub fn parse_methods(init: &Value) -> Vec<AuthMethod> {
    let Some(list) = init.get("authMethods").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter().filter_map(parse_method).collect()
}

fn parse_method(value: &Value) -> Option<AuthMethod> {
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_string);
    let id = text("id").or_else(|| text("methodId"))?;
    let kind = match value.get("type").and_then(Value::as_str) {
        Some("env_var") => AuthKind::EnvVar,
        Some("terminal") => AuthKind::Terminal,
        // `agent`, none, or a type this version does not know: the agent handles it.
        _ => AuthKind::Agent,
    };
    let vars = value
        .get("vars")
        .and_then(Value::as_array)
        .map(|vars| {
            vars.iter()
                .filter_map(|v| {
                    Some(AuthVar {
                        name: v.get("name")?.as_str()?.to_string(),
                        label: v.get("label").and_then(Value::as_str).map(str::to_string),
                        optional: v.get("optional").and_then(Value::as_bool).unwrap_or(false),
                        secret: v.get("secret").and_then(Value::as_bool).unwrap_or(true),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let args = value
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    // `env` is an object in ACP v1 and a list of `{name, value}` in the v2 draft.
    let env = match value.get("env") {
        Some(Value::Object(map)) => map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|e| {
                Some((
                    e.get("name")?.as_str()?.to_string(),
                    e.get("value")?.as_str()?.to_string(),
                ))
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    Some(AuthMethod {
        name: text("name").unwrap_or_else(|| id.clone()),
        id,
        description: text("description"),
        kind,
        vars,
        args,
        env,
        link: text("link"),
    })
}

/// The method drover uses without asking, if one fits (see the module doc), given the
/// environment the agent runs with.
pub fn choose<'a>(
    methods: &'a [AuthMethod],
    provider: &Provider,
    env: &BTreeMap<String, String>,
) -> Option<&'a AuthMethod> {
    let has = |name: &str| env.get(name).is_some_and(|v| !v.is_empty());
    if let Some(named) = &provider.auth
        && let Some(method) = methods
            .iter()
            .find(|m| &m.id == named && m.kind != AuthKind::Terminal)
    {
        return Some(method);
    }
    if let Some(method) = methods.iter().find(|m| {
        m.kind == AuthKind::EnvVar
            && m.vars.iter().any(|v| !v.optional)
            && m.vars.iter().filter(|v| !v.optional).all(|v| has(&v.name))
    }) {
        return Some(method);
    }
    provider.auth_env.iter().find_map(|(id, vars)| {
        let method = methods.iter().find(|m| &m.id == id)?;
        vars.iter().all(|v| has(v)).then_some(method)
    })
}

/// What to tell people about signing in to `provider`, given the methods it offered.
pub fn how_to_sign_in(provider: &Provider, methods: &[AuthMethod]) -> String {
    let name = &provider.name;
    let mut ways = Vec::new();
    for method in methods {
        match method.kind {
            AuthKind::EnvVar => {
                let vars: Vec<&str> = method
                    .vars
                    .iter()
                    .filter(|v| !v.optional)
                    .map(|v| v.name.as_str())
                    .collect();
                ways.push(format!(
                    "set {} under [providers.{name}] env in config.toml",
                    vars.join(" and ")
                ));
            }
            AuthKind::Terminal | AuthKind::Agent => {}
        }
    }
    for (id, vars) in &provider.auth_env {
        if methods.iter().any(|m| &m.id == id) {
            ways.push(format!(
                "set {} under [providers.{name}] env in config.toml",
                vars.join(" and ")
            ));
        }
    }
    ways.dedup();
    let login = format!("`drover login {name}`");
    if ways.is_empty() {
        format!("run {login}")
    } else {
        format!("run {login}, or {}", ways.join(", or "))
    }
}

/// A provider's sign-in as the daemon last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignInState {
    /// A session of it opened (after a sign-in, or none was needed).
    SignedIn,
    /// It refused a session and drover could not sign it in without the user.
    NeedsSignIn,
}

/// What the daemon knows of each provider's sign-in (in memory: "unknown" after a restart
/// until one of its agents starts).
#[derive(Debug, Default)]
pub(crate) struct SignIns {
    by_provider: Mutex<HashMap<String, (SignInState, Vec<AuthMethod>)>>,
    /// The methods a provider's agent offered when it was started only to ask (a sign-in
    /// before any of its agents started): known, its state still unknown.
    offered: Mutex<HashMap<String, Vec<AuthMethod>>>,
}

impl SignIns {
    /// The methods `provider`'s agent offered when asked alone (none: an empty list).
    pub(crate) fn set_offered(&self, provider: &str, methods: Vec<AuthMethod>) {
        self.offered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(provider.to_string(), methods);
    }

    pub(crate) fn offered(&self, provider: &str) -> Option<Vec<AuthMethod>> {
        self.offered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(provider)
            .cloned()
    }

    pub(crate) fn set(&self, provider: &str, state: SignInState, methods: Vec<AuthMethod>) {
        self.by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(provider.to_string(), (state, methods));
    }

    pub(crate) fn get(&self, provider: &str) -> Option<(SignInState, Vec<AuthMethod>)> {
        self.by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(provider)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn codex_methods() -> Vec<AuthMethod> {
        parse_methods(&json!({"authMethods": [
            {"id": "chatgpt", "name": "Login with ChatGPT", "description": "paid"},
            {"type": "env_var", "id": "codex-api-key", "name": "Use CODEX_API_KEY",
             "vars": [{"name": "CODEX_API_KEY"}]},
            {"type": "env_var", "id": "openai-api-key", "name": "Use OPENAI_API_KEY",
             "vars": [{"name": "OPENAI_API_KEY"}]},
            {"type": "terminal", "id": "tui", "name": "Terminal", "args": ["--login"],
             "env": {"A": "1"}},
            "not an object"
        ]}))
    }

    fn provider(auth: Option<&str>, auth_env: &[(&str, &[&str])]) -> Provider {
        let mut p = crate::Providers::presets()
            .get("codex")
            .cloned()
            .expect("preset");
        p.auth = auth.map(str::to_string);
        p.auth_env = auth_env
            .iter()
            .map(|(id, vars)| {
                (
                    (*id).to_string(),
                    vars.iter().map(|v| (*v).to_string()).collect(),
                )
            })
            .collect();
        p
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn methods_are_read_with_their_types() {
        let methods = codex_methods();
        assert_eq!(methods.len(), 4);
        assert_eq!(methods[0].kind, AuthKind::Agent);
        assert_eq!(methods[2].kind, AuthKind::EnvVar);
        assert_eq!(methods[2].vars[0].name, "OPENAI_API_KEY");
        assert!(methods[2].vars[0].secret);
        assert_eq!(methods[3].kind, AuthKind::Terminal);
        assert_eq!(methods[3].args, ["--login"]);
        assert_eq!(methods[3].env.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn an_env_var_method_fits_when_its_variables_are_set() {
        let methods = codex_methods();
        let p = provider(None, &[]);
        let chosen = choose(&methods, &p, &env(&[("OPENAI_API_KEY", "sk-1")]));
        assert_eq!(chosen.map(|m| m.id.as_str()), Some("openai-api-key"));
        assert!(choose(&methods, &p, &env(&[("OPENAI_API_KEY", "")])).is_none());
        assert!(choose(&methods, &p, &env(&[])).is_none());
    }

    #[test]
    fn the_configured_method_wins_but_never_a_terminal_one() {
        let methods = codex_methods();
        let named = provider(Some("chatgpt"), &[]);
        let chosen = choose(&methods, &named, &env(&[("OPENAI_API_KEY", "sk-1")]));
        assert_eq!(chosen.map(|m| m.id.as_str()), Some("chatgpt"));
        let terminal = provider(Some("tui"), &[]);
        assert!(choose(&methods, &terminal, &env(&[])).is_none());
    }

    #[test]
    fn a_preset_hint_covers_an_untyped_method() {
        let methods = parse_methods(&json!({"authMethods": [
            {"id": "oauth-personal", "name": "Log in with Google"},
            {"id": "gemini-api-key", "name": "Gemini API key"}
        ]}));
        let p = provider(None, &[("gemini-api-key", &["GEMINI_API_KEY"])]);
        let chosen = choose(&methods, &p, &env(&[("GEMINI_API_KEY", "k")]));
        assert_eq!(chosen.map(|m| m.id.as_str()), Some("gemini-api-key"));
        assert!(choose(&methods, &p, &env(&[])).is_none());
        let how = how_to_sign_in(&p, &methods);
        assert!(
            how.contains("drover login codex") && how.contains("GEMINI_API_KEY"),
            "{how}"
        );
    }
}
