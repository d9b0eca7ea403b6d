//! `drover providers`: presets and config.toml providers with their availability.

use std::path::Path;
use std::process::Command;

/// `drover` with the test's own environment: the system's `PATH` (no preset installed), `HOME`
/// the data directory.
fn drover(home: &Path) -> Command {
    drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover"), home)
}

#[test]
fn lists_presets_and_custom_providers_with_availability() {
    let home = tempfile::tempdir().expect("home");
    std::fs::write(
        home.path().join("config.toml"),
        "[providers.mine]\ncommand = [\"/bin/cat\"]\nenv = { SECRET_TOKEN = \"hunter2\" }\n\n[providers.gone]\ncommand = [\"/no/such/agent\"]\n",
    )
    .expect("config");
    let out = drover(home.path())
        .args(["providers", "--home"])
        .arg(home.path())
        .output()
        .expect("run");
    drover_testkit::assert_succeeded(&out, "drover providers");
    let table = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no `{name}` row in:\n{table}"))
            .to_string()
    };
    assert!(line("mine").contains("available") && line("mine").contains("/bin/cat"));
    assert!(line("gone").contains("unavailable") && line("gone").contains("/no/such/agent"));
    // The demo is always there: the drover binary runs it.
    assert!(
        line("demo").contains("available") && line("demo").contains("demo — scripted, no model"),
        "{}",
        line("demo")
    );
    for preset in ["codex", "claude", "gemini", "opencode", "qwen", "copilot"] {
        let row = line(preset);
        assert!(
            row.contains("unavailable") && row.contains("npm install -g"),
            "{row}"
        );
    }

    let out = drover(home.path())
        .args(["providers", "--json", "--home"])
        .arg(home.path())
        .output()
        .expect("run");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mine = json
        .as_array()
        .expect("array")
        .iter()
        .find(|p| p["provider"]["name"] == "mine")
        .expect("mine");
    assert_eq!(mine["availability"]["state"], "available");
    assert_eq!(
        mine["provider"]["env"]["SECRET_TOKEN"], "<set>",
        "values are hidden"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
}

#[test]
fn a_broken_config_is_named_in_the_error() {
    let home = tempfile::tempdir().expect("home");
    std::fs::write(
        home.path().join("config.toml"),
        "[providers.x]\ncomand = [\"a\"]\n",
    )
    .expect("config");
    let out = drover(home.path())
        .args(["providers", "--home"])
        .arg(home.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.toml") && err.contains("comand"),
        "{err}"
    );
}
