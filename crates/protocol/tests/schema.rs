//! The committed JSON Schema (`schema/protocol.json`) must be what the Rust types generate:
//! a change to a wire type without regenerating the schema fails here.
//!
//! Regenerate with `DROVER_BLESS=1 cargo test -p drover-protocol --test schema`.

use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schema/protocol.json")
}

fn generated() -> String {
    let mut text =
        serde_json::to_string_pretty(&drover_protocol::schema()).expect("the schema serializes");
    text.push('\n');
    text
}

#[test]
fn committed_schema_matches_the_types() {
    let path = committed_path();
    let generated = generated();
    if std::env::var_os("DROVER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write schema/protocol.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || committed.lines().count().min(generated.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "schema/protocol.json is out of date with the wire types in crates/protocol \
             (first difference at line {line}).\n\
             Regenerate it with:\n\n    \
             DROVER_BLESS=1 cargo test -p drover-protocol --test schema\n\n\
             then update docs/protocol.md to match and commit both."
        );
    }
}

#[test]
fn schema_describes_both_directions() {
    let schema = drover_protocol::schema();
    assert_eq!(schema["version"], drover_protocol::PROTOCOL_VERSION);
    let client = schema["client"].to_string();
    for t in drover_protocol::CLIENT_TYPES {
        assert!(client.contains(&format!("\"{t}\"")), "{t} missing");
    }
    let daemon = schema["daemon"].to_string();
    for t in [
        "welcome",
        "session_state",
        "agent_initialized",
        "agent_status",
        "agent_update",
        "workspace_update",
        "timeline_page",
        "request_error",
        "resync_required",
    ] {
        assert!(daemon.contains(&format!("\"{t}\"")), "{t} missing");
    }
}
