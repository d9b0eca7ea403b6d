//! The front-ends adapt, they do not decide: the client protocol (`src/ws/`) and the MCP
//! server (`src/mcp/`) reach the registry and the runtimes only through the operations layer
//! (`src/ops/`), and do not repeat the checks an operation makes. This reads their sources and
//! fails on any direct use, and on a refusal (`OpError::invalid`) an operation has already.

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

/// The string literals of `OpError::invalid(field, message)` calls in `text`: `(field,
/// message)`, the message being the first literal after the field (a `format!` string too).
fn refusals(text: &str) -> Vec<(String, String)> {
    fn literal(rest: &str) -> Option<(String, &str)> {
        let start = rest.find('"')? + 1;
        let mut out = String::new();
        let mut chars = rest[start..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        out.push(escaped);
                    }
                }
                '"' => return Some((out, &rest[start + i + 1..])),
                c => out.push(c),
            }
        }
        None
    }
    text.split("OpError::invalid(")
        .skip(1)
        .filter_map(|call| {
            let (field, rest) = literal(call)?;
            let (message, _) = literal(rest)?;
            Some((field, message))
        })
        .collect()
}

fn refusals_in(dirs: &[&str]) -> Vec<(PathBuf, String, String)> {
    dirs.iter()
        .flat_map(|d| sources(d))
        .flat_map(|file| {
            let text = std::fs::read_to_string(&file).expect("read source");
            refusals(&text)
                .into_iter()
                .map(move |(field, message)| (file.clone(), field, message))
        })
        .collect()
}

#[test]
fn front_ends_do_not_repeat_a_check_an_operation_makes() {
    let ops = refusals_in(&["ops"]);
    assert!(ops.len() >= 10, "the scan found too few refusals: {ops:?}");
    let repeated: Vec<String> = refusals_in(&["ws", "mcp"])
        .into_iter()
        .filter(|(_, field, message)| ops.iter().any(|(_, f, m)| f == field && m == message))
        .map(|(file, field, message)| format!("{}: `{field}`: {message}", file.display()))
        .collect();
    assert!(
        repeated.is_empty(),
        "a front-end makes a check its operation makes already; leave it to `ops`:\n{}",
        repeated.join("\n")
    );
}

#[test]
fn the_refusal_scan_reads_a_split_call() {
    let text = "return Err(OpError::invalid(\n    \"cwd\",\n    \"give `cwd` or \\\"x\\\"\",\n));";
    assert_eq!(
        refusals(text),
        [("cwd".to_string(), "give `cwd` or \"x\"".to_string())]
    );
}
