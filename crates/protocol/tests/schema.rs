//! The committed JSON Schema (`schema/protocol.json`) must be what the Rust types generate:
//! a change to a wire type without regenerating the schema fails here.
//!
//! Regenerate with `DROVER_BLESS=1 cargo test -p drover-protocol --test schema`.

mod golden;

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
    golden::check(
        &committed_path(),
        &generated(),
        "schema/protocol.json",
        "DROVER_BLESS=1 cargo test -p drover-protocol --test schema",
        "update docs/protocol.md to match and commit both",
    );
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
