//! The project file, `drover.toml` at the root of a source checkout, and running its setup and
//! teardown commands.

use std::fs;
use std::io;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::git::GIT_LOCATION_VARS;
use super::{CommandRun, WorktreeError, WorktreeInfo};
use crate::child;

/// The project file at the root of a source checkout.
pub const PROJECT_FILE: &str = "drover.toml";

/// How long setup (or teardown) may run, all its commands together, unless the project file
/// says otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How much of a command's output is kept (its end).
const OUTPUT_LIMIT: usize = 64 * 1024;

/// `drover.toml` at the root of a source checkout. Every key is optional; unknown keys and
/// sections are ignored (they may belong to a newer drover).
///
/// ```toml
/// [worktree]
/// setup = ["npm ci", "cp .env.example .env.local"]   # run in a new worktree, in order
/// teardown = ["docker compose down"]                 # run before a worktree is removed
/// copy = [".env", "config/local.yml"]                # untracked files copied from the source
/// timeout = 600                                      # seconds for all setup (or teardown) commands
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ProjectConfig {
    #[serde(default)]
    pub worktree: WorktreeConfig,
}

/// The `[worktree]` section of `drover.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct WorktreeConfig {
    /// Shell commands (`sh -c`) run in a new worktree, in order; the first failure fails the
    /// creation.
    #[serde(default)]
    pub setup: Vec<String>,
    /// Shell commands run in a worktree before it is removed.
    #[serde(default)]
    pub teardown: Vec<String>,
    /// Paths relative to the checkout root (files or folders), copied from the source into a
    /// new worktree when the source has them and the worktree does not (e.g. `.env`).
    #[serde(default)]
    pub copy: Vec<String>,
    /// Seconds all setup commands together (and, separately, all teardown commands) may run.
    #[serde(default)]
    pub timeout: Option<u64>,
}

impl ProjectConfig {
    /// Reads `root/drover.toml`; a missing file is the empty configuration.
    pub fn load(root: &Path) -> Result<ProjectConfig, WorktreeError> {
        let path = root.join(PROJECT_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ProjectConfig::default()),
            Err(e) => {
                return Err(WorktreeError::ProjectFile {
                    path,
                    message: e.to_string(),
                });
            }
        };
        let config: ProjectConfig =
            toml::from_str(&text).map_err(|e| WorktreeError::ProjectFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
        for entry in &config.worktree.copy {
            if let Err(message) = check_relative(entry) {
                return Err(WorktreeError::ProjectFile {
                    path,
                    message: format!("`worktree.copy` entry `{entry}`: {message}"),
                });
            }
        }
        Ok(config)
    }

    pub(super) fn timeout(&self) -> Duration {
        self.worktree
            .timeout
            .map_or(DEFAULT_COMMAND_TIMEOUT, Duration::from_secs)
    }
}

/// A `copy` entry must stay inside the checkout and out of `.git`.
fn check_relative(entry: &str) -> Result<(), &'static str> {
    let path = Path::new(entry);
    if entry.trim().is_empty() {
        return Err("is empty");
    }
    let mut normal = 0;
    for component in path.components() {
        match component {
            Component::Normal(part) if normal == 0 && part == ".git" => {
                return Err("must not reach into `.git`");
            }
            Component::Normal(_) => normal += 1,
            Component::CurDir => {}
            _ => return Err("must be a relative path inside the checkout"),
        }
    }
    if normal == 0 {
        return Err("names no file");
    }
    Ok(())
}

/// Runs `commands` one after another in `cwd` within `timeout` all together. Returns every
/// run, or the first that failed.
pub(super) fn run_commands(
    commands: &[String],
    cwd: &Path,
    info: &WorktreeInfo,
    timeout: Duration,
) -> Result<Vec<CommandRun>, Box<CommandRun>> {
    let deadline = Instant::now() + timeout;
    let mut runs = Vec::with_capacity(commands.len());
    for command in commands {
        let run = run_shell(command, cwd, info, deadline);
        if !run.succeeded() {
            return Err(Box::new(run));
        }
        runs.push(run);
    }
    Ok(runs)
}

/// `sh -c command` in `cwd`, in a process group of its own (killed whole when the deadline
/// passes), with `DROVER_WORKTREE`, `DROVER_SOURCE` and `DROVER_BRANCH` set.
fn run_shell(command: &str, cwd: &Path, info: &WorktreeInfo, deadline: Instant) -> CommandRun {
    let started = Instant::now();
    let mut cmd = child::command("sh", cwd);
    cmd.arg("-c")
        .arg(command)
        .env("DROVER_WORKTREE", cwd)
        .env("DROVER_SOURCE", &info.source)
        .env("DROVER_BRANCH", &info.branch);
    for var in GIT_LOCATION_VARS {
        cmd.env_remove(var);
    }
    match child::run(cmd, deadline, OUTPUT_LIMIT) {
        Ok(finished) => CommandRun {
            command: command.to_string(),
            exit_code: finished.status.and_then(|s| s.code()),
            timed_out: finished.timed_out,
            output: finished.output,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        },
        Err(e) => CommandRun {
            command: command.to_string(),
            exit_code: None,
            timed_out: false,
            output: format!("cannot start `sh`: {e}"),
            duration_ms: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_entries_stay_inside_the_checkout() {
        assert!(check_relative(".env").is_ok());
        assert!(check_relative("config/local.yml").is_ok());
        assert!(check_relative("../secret").is_err());
        assert!(check_relative("/etc/passwd").is_err());
        assert!(check_relative(".git/config").is_err());
        assert!(check_relative(".").is_err());
        assert!(check_relative("").is_err());
    }

    #[test]
    fn the_project_file_reads_every_key() {
        let config: ProjectConfig = toml::from_str(
            "[worktree]\nsetup = [\"a\"]\nteardown = [\"b\"]\ncopy = [\".env\"]\ntimeout = 5\n[other]\nx = 1\n",
        )
        .expect("parses");
        assert_eq!(config.worktree.setup, ["a"]);
        assert_eq!(config.worktree.teardown, ["b"]);
        assert_eq!(config.worktree.copy, [".env"]);
        assert_eq!(config.timeout(), Duration::from_secs(5));
        let empty: ProjectConfig = toml::from_str("").expect("parses");
        assert_eq!(empty.timeout(), DEFAULT_COMMAND_TIMEOUT);
    }
}
