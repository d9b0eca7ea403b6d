//! The web UI's generated protocol module (`crates/daemon/src/ui/assets/protocol.gen.js`) must
//! be what the Rust types generate: a change to a wire type without regenerating it fails here.
//!
//! Regenerate with `DROVER_BLESS=1 cargo test -p drover-protocol --test js`.

mod golden;

use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../daemon/src/ui/assets/protocol.gen.js")
}

#[test]
fn committed_js_module_matches_the_types() {
    golden::check(
        &committed_path(),
        &drover_protocol::js::module(),
        "crates/daemon/src/ui/assets/protocol.gen.js",
        "DROVER_BLESS=1 cargo test -p drover-protocol --test js",
        "commit it",
    );
}

#[test]
fn the_module_names_every_value_and_message() {
    let js = drover_protocol::js::module();
    for code in drover_protocol::ErrorCode::ALL {
        assert!(js.contains(&format!("('{code}')")), "{code} missing");
    }
    for kind in drover_protocol::ItemKind::ALL {
        assert!(js.contains(&format!("('{kind}')")), "{kind} missing");
    }
    for t in drover_protocol::CLIENT_TYPES {
        assert!(js.contains(&format!("('{t}')")), "{t} missing");
    }
    for t in [
        "session_state",
        "agent_status",
        "agent_update",
        "request_error",
    ] {
        assert!(js.contains(&format!("('{t}')")), "{t} missing");
    }
    for typedef in [
        "AgentInfo",
        "DaemonMessage",
        "ClientMessage",
        "ClientRequest",
    ] {
        assert!(
            js.contains(&format!("}} {typedef}\n")),
            "typedef {typedef} missing"
        );
    }
}
