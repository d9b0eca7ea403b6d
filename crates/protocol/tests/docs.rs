//! `docs/protocol.md` is the protocol's reference: it must describe every message type (a
//! level-3 heading naming the type in backticks) and list every error code the daemon can
//! send (a row of the codes table). The codes are `drover_protocol::ErrorCode`'s, so a new
//! code fails here until it is documented, and a documented code drover no longer sends
//! fails too.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn doc() -> String {
    read("docs/protocol.md")
}

/// Every message type of one direction, from the generated schema.
fn types(schema: &serde_json::Value) -> Vec<String> {
    schema["oneOf"]
        .as_array()
        .expect("oneOf")
        .iter()
        .map(|v| {
            v["properties"]["type"]["const"]
                .as_str()
                .expect("type const")
                .to_string()
        })
        .collect()
}

#[test]
fn every_message_has_a_section() {
    let schema = drover_protocol::schema();
    let doc = doc();
    let mut missing = Vec::new();
    for t in types(&schema["client"])
        .iter()
        .chain(&types(&schema["daemon"]))
    {
        if !doc.contains(&format!("\n### `{t}`\n")) {
            missing.push(t.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/protocol.md has no section for {missing:?}"
    );
}

/// The string literal right after each `marker` in a source file.
fn codes_after(path: &str, marker: &str) -> BTreeSet<String> {
    let source = read(path);
    source
        .match_indices(marker)
        .filter_map(|(at, _)| {
            let rest = source[at + marker.len()..].strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

/// The codes of the errors table: the first cell of each row, when it is code-shaped.
fn documented_codes(doc: &str) -> BTreeSet<String> {
    let table = doc
        .split("\n## Errors\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/protocol.md has an `## Errors` section");
    table
        .lines()
        .filter_map(|line| line.strip_prefix("| "))
        .filter_map(|row| row.split(" |").next())
        .flat_map(|cell| cell.split(", "))
        .filter_map(|code| code.strip_prefix('`')?.strip_suffix('`'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_error_code_is_documented() {
    let doc = doc();
    let documented = documented_codes(&doc);
    // Requests fail only with `ErrorCode`s (the compiler sees to that); the HTTP side has two
    // codes of its own.
    let mut codes: BTreeSet<String> = drover_protocol::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    let http = codes_after("crates/daemon/src/server.rs", "\"code\": ");
    assert!(
        http.contains("not_found"),
        "the scan of server.rs is broken: {http:?}"
    );
    codes.extend(http);
    let missing: Vec<&String> = codes.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "error codes missing from docs/protocol.md's table: {missing:?}"
    );
    let stale: Vec<&String> = documented.difference(&codes).collect();
    assert!(
        stale.is_empty(),
        "docs/protocol.md's table lists codes drover never sends: {stale:?}"
    );
}

#[test]
fn error_codes_round_trip() {
    use drover_protocol::ErrorCode;
    let mut seen = BTreeSet::new();
    for code in ErrorCode::ALL {
        assert!(seen.insert(code.as_str()), "`{code}` is listed twice");
        assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
    }
    assert_eq!(ErrorCode::parse("launch_missiles"), None);
}
