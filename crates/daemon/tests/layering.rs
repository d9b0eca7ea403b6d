//! The front-ends adapt, they do not decide: the client protocol (`src/ws/`) and the MCP
//! server (`src/mcp/`) reach the registry and the runtimes only through the operations layer
//! (`src/ops/`). This reads their sources and fails on any direct use.

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    files
}

/// Identifiers that name the registry or the runtime manager, or a way to get at them.
const FORBIDDEN: &[&str] = &[
    "registry",
    "Registry",
    "runtimes",
    "RuntimeManager",
    "drover_core::registry",
];

/// The code of a line: without its string literals (prose such as "registry events") and its
/// `//` comment. A `//` or a quote inside a string could only hide code from the check, never
/// fail it.
fn code(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (in_string, c) {
            (true, '\\') => {
                chars.next();
            }
            (_, '"') => in_string = !in_string,
            (false, '/') if chars.peek() == Some(&'/') => break,
            (false, c) => out.push(c),
            (true, _) => {}
        }
    }
    out
}

/// The identifier-like words of a line of code.
fn words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

#[test]
fn front_ends_reach_the_registry_and_runtimes_only_through_ops() {
    let mut found = Vec::new();
    let files: Vec<PathBuf> = ["ws", "mcp"].iter().flat_map(|d| sources(d)).collect();
    assert!(files.len() >= 4, "the scan found too few files: {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = code(line);
            for word in words(&code) {
                if FORBIDDEN.contains(&word) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the front-ends use the registry or runtimes directly; go through `ops`:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_a_direct_use() {
    // The scan itself must be able to fail.
    let line = "        let agent = self.registry.get(id); // fine in ops";
    assert!(words(&code(line)).any(|w| FORBIDDEN.contains(&w)));
    assert!(!words(&code("// the registry decides")).any(|w| FORBIDDEN.contains(&w)));
    assert!(!words(&code(r#"format!("{n} registry events")"#)).any(|w| FORBIDDEN.contains(&w)));
}
