//! `docs/protocol.md` is the protocol's reference: it must describe every message type (a
//! `### \`type\`` section) and list every error code the daemon can send (a row of the codes
//! table). The codes are collected from the sources that produce them, so a new code fails
//! here until it is documented.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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

/// The `snake_case` string literals in the body of `fn code` of a source file.
fn codes_of_fn(path: &str) -> BTreeSet<String> {
    let source = read(path);
    let Some(start) = source.find("pub fn code(&self)") else {
        return BTreeSet::new();
    };
    let body = &source[start..];
    let end = body.find("\n    }\n").unwrap_or(body.len());
    literals(&body[..end])
}

/// The first `snake_case` literal after each `marker` in a source file, if it comes before
/// the marker's `stop` character (the end of the call or of the line).
fn codes_after(path: &str, markers: &[(&str, char)]) -> BTreeSet<String> {
    let source = read(path);
    let mut codes = BTreeSet::new();
    for (marker, stop) in markers {
        for (at, _) in source.match_indices(marker) {
            let rest = &source[at + marker.len()..];
            let scope = rest.split(*stop).next().unwrap_or_default();
            // `literals` reads every other `"`-separated piece: start at a quote.
            let from_quote = scope.find('"').map_or("", |i| &scope[i..]);
            if let Some(code) = literals(&format!("x{from_quote}")).into_iter().next() {
                codes.insert(code);
            }
        }
    }
    codes
}

/// The string literals of `text` (between `"`s) that look like codes.
fn literals(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            !s.is_empty()
                && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                && !s.starts_with('_')
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_error_code_is_documented() {
    let mut codes = BTreeSet::new();
    for path in [
        "crates/core/src/error.rs",
        "crates/core/src/worktree.rs",
        "crates/acp/src/lib.rs",
    ] {
        if Path::new(&repo().join(path)).exists() {
            codes.extend(codes_of_fn(path));
        }
    }
    codes.extend(codes_after(
        "crates/daemon/src/ws.rs",
        &[("code: ", '\n'), ("request_error(", ')')],
    ));
    codes.extend(codes_after(
        "crates/protocol/src/lib.rs",
        &[("code: ", '\n')],
    ));
    codes.extend(codes_after(
        "crates/daemon/src/server.rs",
        &[("\"code\": ", '\n')],
    ));
    // The literal scan must find the well-known ones, or it is broken.
    for known in [
        "invalid_message",
        "unknown_type",
        "unknown_agent",
        "agent_active",
    ] {
        assert!(
            codes.contains(known),
            "the scan missed `{known}`: {codes:?}"
        );
    }
    let doc = doc();
    let missing: Vec<&String> = codes
        .iter()
        .filter(|code| !doc.contains(&format!("`{code}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "error codes missing from docs/protocol.md: {missing:?}"
    );
}
