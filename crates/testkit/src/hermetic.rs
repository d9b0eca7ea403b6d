//! An environment of its own for every process a test starts (the daemon, the CLI, the test
//! programs), so that no test depends on what the machine has installed or configured: `PATH`
//! is the system's directories only (not `~/.local/bin`, `/usr/local/bin` or npm's global
//! bin, where a user's `codex-acp` lives), `HOME` is the test's, and no `DROVER_*` variable of
//! the caller's shell leaks in.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// The `PATH` every process a test starts gets: `sh`, `git`, `node` and the like as the
/// system packages install them, and nothing a user installed globally.
pub const SYSTEM_PATH: &str = "/usr/bin:/bin";

/// Variables passed on from the test's own environment: where temporary files go, and what
/// a developer asked of the Rust programs (backtraces, logs, coverage).
const PASSED_ON: &[&str] = &["TMPDIR", "RUST_BACKTRACE", "RUST_LOG", "LLVM_PROFILE_FILE"];

/// Agents and jobs of a daemon in this test process inherit the same environment as the
/// processes [`command`] starts (`HOME` a path that does not exist), not the test's: see
/// `drover_acp::process::set_inherited_env`. Idempotent; the in-process daemon calls it.
pub fn in_process() {
    let mut env = std::collections::BTreeMap::from([
        ("PATH".to_string(), SYSTEM_PATH.to_string()),
        ("HOME".to_string(), "/nonexistent".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    if let Ok(tmp) = std::env::var("TMPDIR") {
        env.insert("TMPDIR".to_string(), tmp);
    }
    drover_acp::process::set_inherited_env(env);
}

/// `program` with a cleared environment: [`SYSTEM_PATH`], `HOME` = `home`, `LANG=C.UTF-8`,
/// `NO_COLOR=1`, and only `PASSED_ON` from the test's environment. A test adds what it needs
/// (`DROVER_HOME`, a provider's variables) on top.
pub fn command(program: impl AsRef<OsStr>, home: &Path) -> Command {
    let mut command = Command::new(program);
    apply(&mut command, home);
    command
}

/// Gives `command` the environment [`command`] describes.
pub fn apply<'a>(command: &'a mut Command, home: &Path) -> &'a mut Command {
    command
        .env_clear()
        .env("PATH", SYSTEM_PATH)
        .env("HOME", home)
        .env("LANG", "C.UTF-8")
        .env("NO_COLOR", "1");
    for key in PASSED_ON {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command
}
