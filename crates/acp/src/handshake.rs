//! ACP's `initialize`, as drover sends it and reads its answer: one place for the version
//! drover speaks and the client it says it is, whoever starts an agent (a runtime, a warm
//! spare, a session listing, `drover login`); each says which client capabilities it serves.

use serde_json::{Value, json};

/// The ACP version drover speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// What a runtime (or a warm spare, which becomes one) serves of the client's side.
pub fn runtime_capabilities() -> Value {
    json!({
        "fs": {"readTextFile": false, "writeTextFile": false},
        // `actor/terminals.rs` answers the terminal methods, on jobs.
        "terminal": true,
        // `drover login` runs a terminal sign-in in the user's terminal.
        "auth": {"terminal": true},
        // `actor/own_subagents.rs` keeps the child sessions it announces.
        "subagents": {}
    })
}

/// The parameters of drover's `initialize`, offering `capabilities`.
pub fn initialize_params(capabilities: &Value) -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": capabilities,
        "clientInfo": {"name": "drover", "version": env!("CARGO_PKG_VERSION")}
    })
}

/// The version the agent chose in its answer (ours when it names none).
pub fn answered_version(init: &Value) -> u64 {
    init.get("protocolVersion")
        .and_then(Value::as_u64)
        .unwrap_or(PROTOCOL_VERSION)
}

/// Says why an answer in another version cannot be spoken, and what to do: whoever started the
/// agent (a launch, a listing, the question of its sign-in methods) refuses it in these words.
pub fn version_mismatch(version: u64) -> String {
    format!(
        "the agent speaks ACP version {version} and drover speaks version {PROTOCOL_VERSION}: \
         install a version of the agent that speaks ACP {PROTOCOL_VERSION}"
    )
}
