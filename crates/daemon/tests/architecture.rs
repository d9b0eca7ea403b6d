//! ARCHITECTURE.md's code map names every source file of the workspace: a file added,
//! moved or renamed without a line there fails here. A file is named when its crate's part
//! of the map mentions its name (and, for a file in a folder, the folder).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, as paths relative to `base`.
fn rust_files(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(base, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(base).expect("under base").to_path_buf());
        }
    }
}

/// The part of the map about `crates/<name>`: from its heading or bullet to the next one.
fn section<'a>(map: &'a str, name: &str) -> Option<&'a str> {
    let start = map.find(&format!("`crates/{name}`"))?;
    let rest = &map[start + 1..];
    let end = ["\n### `crates/", "\n- `crates/"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

#[test]
fn every_source_file_is_in_the_code_map() {
    let root = root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut missing = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    crates.sort();
    assert!(
        crates.len() >= 9,
        "the scan found too few crates: {crates:?}"
    );
    for dir in &crates {
        let name = dir.file_name().and_then(|n| n.to_str()).expect("name");
        let Some(text) = section(&map, name) else {
            missing.push(format!("crates/{name} (no part of the map)"));
            continue;
        };
        let mut files = Vec::new();
        for part in ["src", "tests", "benches"] {
            rust_files(dir, &dir.join(part), &mut files);
        }
        for file in files {
            let base = file
                .file_name()
                .and_then(|n| n.to_str())
                .expect("file name");
            let folder = file
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .filter(|f| !["src", "tests", "benches"].contains(f));
            let named =
                text.contains(base) && folder.is_none_or(|f| text.contains(&format!("{f}/")));
            if !named {
                missing.push(format!("crates/{name}/{}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name:\n{}",
        missing.join("\n")
    );
}
