//! No two files of one crate import each other, directly or around a loop: dependencies
//! between a crate's files point one way, as they do between crates. For every crate of the
//! workspace this reads its `src/` files, takes the paths each names (`crate::…`, `super::…`,
//! `self::…`, and a child module's name), and fails on any cycle, naming its files and the line
//! of each step.
//!
//! What counts as an edge: file `a` names an item of file `b`, where `b` is not `a` itself nor
//! one of its ancestors (a module using what its parent holds is the tree's own direction; the
//! parent using its child's items is an edge). A path resolves to the deepest file its
//! segments name, so a name the crate root re-exports counts as the root's. Inline test
//! modules (`#[cfg(test)] mod tests { … }`) are left out: they are their file's own. The
//! `src/bin/` programs are crates of their own, one file each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A module path: the crate root is `[]`.
type ModPath = Vec<String>;

/// Every `.rs` file under `dir` but `src/bin/`, with its module path.
fn modules(src: &Path, dir: &Path, out: &mut BTreeMap<ModPath, PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path != src.join("bin") {
                modules(src, &path, out);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).expect("under src");
        let mut segments: ModPath = relative
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let last = segments.pop().expect("a file name");
        match last.as_str() {
            "lib.rs" | "main.rs" if segments.is_empty() => {}
            "mod.rs" => {}
            name => segments.push(name.trim_end_matches(".rs").to_string()),
        }
        out.insert(segments, path);
    }
}

/// A source's code: without comments, string and char literals, and its inline test module,
/// as one line per source line (so that positions keep their line numbers).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // Keeps the line breaks of what is skipped.
    let skip = |out: &mut String, from: usize, to: usize| {
        let to = to.min(chars.len());
        out.extend(chars[from..to].iter().filter(|c| **c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let end = match c {
            '/' if at(i + 1) == '/' => (i..chars.len())
                .find(|k| chars[*k] == '\n')
                .unwrap_or(chars.len()),
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                let mut k = i;
                while k < chars.len() {
                    if chars[k] == '/' && at(k + 1) == '*' {
                        depth += 1;
                        k += 2;
                    } else if chars[k] == '*' && at(k + 1) == '/' {
                        depth -= 1;
                        k += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        k += 1;
                    }
                }
                k
            }
            'r' if (at(i + 1) == '"' || at(i + 1) == '#')
                && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')) =>
            {
                let hashes = (i + 1..chars.len())
                    .take_while(|k| chars[*k] == '#')
                    .count();
                if at(i + 1 + hashes) == '"' {
                    let close: String = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', hashes))
                        .collect();
                    let body = i + 2 + hashes;
                    let rest: String = chars[body..].iter().collect();
                    rest.find(&close).map_or(chars.len(), |b| {
                        body + rest[..b].chars().count() + close.chars().count()
                    })
                } else {
                    i
                }
            }
            '"' => {
                let mut k = i + 1;
                while k < chars.len() && chars[k] != '"' {
                    k += if chars[k] == '\\' { 2 } else { 1 };
                }
                k + 1
            }
            '\'' if at(i + 1) == '\\' => (i + 2..chars.len())
                .find(|k| chars[*k] == '\'')
                .map_or(chars.len(), |k| k + 1),
            '\'' if at(i + 2) == '\'' => i + 3,
            _ => i,
        };
        if end > i {
            skip(&mut out, i, end);
            out.push(' ');
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The paths `code` names that start with `crate`, `super`, `self` or one of `children`,
/// with the line each is on; `use` groups (`a::{b, c::{d}}`) are expanded.
fn paths(code: &str, children: &BTreeSet<String>) -> Vec<(Vec<String>, usize)> {
    let bytes: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < bytes.len() {
        if bytes[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && ident(bytes[i]) {
            i += 1;
        }
        let word: String = bytes[start..i].iter().collect();
        let starts =
            matches!(word.as_str(), "crate" | "super" | "self") || children.contains(&word);
        if !starts || bytes.get(i..i + 2) != Some(&[':', ':']) {
            continue;
        }
        let (mut tails, end) = path_tail(&bytes, i);
        for tail in &mut tails {
            tail.insert(0, word.clone());
        }
        found.extend(tails.into_iter().map(|t| (t, line)));
        line += bytes[i..end].iter().filter(|c| **c == '\n').count();
        i = end;
    }
    found
}

/// The segments after a `::` at `at` (a group gives one path per member), and where they end.
fn path_tail(bytes: &[char], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    loop {
        if bytes.get(at..at + 2) != Some(&[':', ':']) {
            return (vec![segments], at);
        }
        at += 2;
        while bytes.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        if bytes.get(at) == Some(&'{') {
            let mut members = Vec::new();
            at += 1;
            loop {
                while bytes
                    .get(at)
                    .is_some_and(|c| c.is_whitespace() || *c == ',')
                {
                    at += 1;
                }
                match bytes.get(at) {
                    None => return (members, at),
                    Some('}') => return (members, at + 1),
                    _ => {}
                }
                let start = at;
                while bytes
                    .get(at)
                    .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                {
                    at += 1;
                }
                let word: String = bytes[start..at].iter().collect();
                if word.is_empty() {
                    at += 1;
                    continue;
                }
                let (tails, end) = path_tail(bytes, at);
                for mut tail in tails {
                    tail.insert(0, word.clone());
                    let mut path = segments.clone();
                    path.extend(tail);
                    members.push(path);
                }
                at = end;
                // Skip `as name` and anything else up to the next member.
                while bytes.get(at).is_some_and(|c| *c != ',' && *c != '}') {
                    at += 1;
                }
            }
        }
        let start = at;
        while bytes
            .get(at)
            .is_some_and(|c| c.is_alphanumeric() || *c == '_')
        {
            at += 1;
        }
        if start == at {
            return (vec![segments], at);
        }
        segments.push(bytes[start..at].iter().collect());
    }
}

/// The file a path written in module `from` names: the deepest module its segments reach.
fn resolve(from: &ModPath, path: &[String], files: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    let mut absolute: ModPath = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super" | "self") => {
            absolute.clone_from(from);
            while let Some(word) = rest.first().map(String::as_str) {
                match word {
                    "super" => {
                        absolute.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => absolute.clone_from(from),
    }
    let mut best = absolute.clone();
    for segment in rest {
        absolute.push(segment.clone());
        if files.contains_key(&absolute) {
            best.clone_from(&absolute);
        } else {
            break;
        }
    }
    files.contains_key(&best).then_some(best)
}

/// One step of an import: `from` names an item of `to` on `line`.
#[derive(Debug, Clone)]
struct Edge {
    to: ModPath,
    line: usize,
}

/// The import graph of one crate's files.
fn graph(files: &BTreeMap<ModPath, PathBuf>) -> BTreeMap<ModPath, Vec<Edge>> {
    let mut graph = BTreeMap::new();
    for (module, file) in files {
        let text = std::fs::read_to_string(file).expect("read source");
        let children: BTreeSet<String> = files
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .filter_map(|m| m.last().cloned())
            .collect();
        let mut edges: Vec<Edge> = Vec::new();
        for (path, line) in paths(&code(&text), &children) {
            let Some(to) = resolve(module, &path, files) else {
                continue;
            };
            if to == *module || module.starts_with(&to) {
                continue;
            }
            if !edges.iter().any(|e| e.to == to) {
                edges.push(Edge { to, line });
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

/// Every cycle's files (the strongly connected parts with more than one file), Tarjan's way.
fn cycles(graph: &BTreeMap<ModPath, Vec<Edge>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        graph: &'a BTreeMap<ModPath, Vec<Edge>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a ModPath) {
        let n = s.index.len();
        s.index.insert(node, n);
        s.low.insert(node, n);
        s.stack.push(node);
        s.on_stack.insert(node);
        let graph = s.graph;
        for edge in graph.get(node).into_iter().flatten() {
            let Some((to, _)) = graph.get_key_value(&edge.to) else {
                continue;
            };
            if !s.index.contains_key(to) {
                visit(s, to);
                let low = s.low[node].min(s.low[to]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(to) {
                let low = s.low[node].min(s.index[to]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut part = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                part.push(top.clone());
                if top == node {
                    break;
                }
            }
            if part.len() > 1 {
                part.sort();
                s.found.push(part);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

/// A cycle's files and the steps between them, for the failure message.
fn describe(
    part: &[ModPath],
    graph: &BTreeMap<ModPath, Vec<Edge>>,
    files: &BTreeMap<ModPath, PathBuf>,
) -> String {
    let base = root();
    let name = |m: &ModPath| {
        let file = &files[m];
        file.strip_prefix(&base)
            .unwrap_or(file)
            .display()
            .to_string()
    };
    let mut lines = Vec::new();
    for from in part {
        for edge in graph[from].iter().filter(|e| part.contains(&e.to)) {
            lines.push(format!(
                "  {}:{} uses {}",
                name(from),
                edge.line,
                name(&edge.to)
            ));
        }
    }
    lines.join("\n")
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let root = root();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    assert!(
        crates.len() >= 9,
        "the scan found too few crates: {crates:?}"
    );
    let mut failures = Vec::new();
    let mut edges = 0;
    for src in &crates {
        let mut files = BTreeMap::new();
        modules(src, src, &mut files);
        let graph = graph(&files);
        edges += graph.values().map(Vec::len).sum::<usize>();
        for part in cycles(&graph) {
            failures.push(describe(&part, &graph, &files));
        }
    }
    assert!(edges >= 100, "the scan found too few imports ({edges})");
    assert!(
        failures.is_empty(),
        "files of one crate import each other (make the dependency point one way):\n{}",
        failures.join("\n\n")
    );
}

/// The check itself: a cycle through a `use` group and a `super::` path is found, a child
/// using its parent is not one, and comments, strings and test modules are not read.
#[test]
fn the_check_sees_a_cycle_and_only_a_cycle() {
    let dir = tempfile::tempdir().expect("dir");
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(path, text).expect("write");
    };
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\npub struct Root;\nuse a::A;\n",
    );
    write("a/mod.rs", "mod x;\nuse crate::Root;\npub struct A;\n");
    write("a/x.rs", "use super::A;\nuse crate::{b::B, c};\n");
    write(
        "b.rs",
        "// crate::c::C is only mentioned\nconst S: &str = \"crate::c::C\";\npub struct B;\n\
         fn f() { let _ = crate::a::x::X; }\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n}\n",
    );
    write("c.rs", "pub struct C;\n");
    let mut files = BTreeMap::new();
    modules(src, src, &mut files);
    let graph = graph(&files);
    let found = cycles(&graph);
    let a_x: ModPath = vec!["a".to_string(), "x".to_string()];
    let b: ModPath = vec!["b".to_string()];
    assert_eq!(found, vec![vec![a_x, b.clone()]], "{graph:?}");
    let message = describe(&found[0], &graph, &files);
    assert!(
        message.contains("x.rs:2 uses") && message.contains("b.rs:4 uses"),
        "{message}"
    );
    // What b.rs names only in a comment, a string and its tests is no edge.
    assert!(graph[&b].iter().all(|e| e.to != vec!["c".to_string()]));
}
