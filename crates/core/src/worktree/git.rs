//! The git runner: `git -C dir …` that never prompts and ignores the caller's `GIT_DIR` and
//! friends, one lock per repository for the commands that touch its worktree list, and the
//! branch commands.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::WorktreeError;
use crate::child::describe_exit;

/// Environment variables that would point git at another repository than the one we name.
pub(super) const GIT_LOCATION_VARS: [&str; 5] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
];

/// Runs `git -C dir args…`, returning its stdout. Its stdin is closed and it never prompts.
pub(super) fn git<I, S>(dir: &Path, args: I) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(dir)
        .args(&args)
        .stdin(Stdio::null())
        .env("GIT_TERMINAL_PROMPT", "0");
    for var in GIT_LOCATION_VARS {
        cmd.env_remove(var);
    }
    let shown = || {
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let out = cmd.output().map_err(|e| WorktreeError::Git {
        dir: dir.to_path_buf(),
        args: shown(),
        message: format!("cannot run git: {e}"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let message = match (stderr.trim(), stdout.trim()) {
            ("", "") => describe_exit(&out.status),
            ("", out) => out.to_string(),
            (err, _) => err.to_string(),
        };
        return Err(WorktreeError::Git {
            dir: dir.to_path_buf(),
            args: shown(),
            message,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The lock that runs one repository's `git worktree add`, `remove` and `prune` one at a time:
/// while git adds a worktree it reads every other worktree's entry, and fails (`failed to read
/// .git/worktrees/…/commondir`) on one another `add` is still writing.
pub(super) fn repo_lock(common_dir: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(common_dir.to_path_buf())
        .or_default()
        .clone()
}

/// [`repo_lock`] for the repository of the checkout at `root`.
pub(super) fn repo_lock_of(root: &Path) -> Arc<Mutex<()>> {
    let common = git(
        root,
        ["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map_or_else(|_| root.to_path_buf(), |out| PathBuf::from(out.trim()));
    repo_lock(&common)
}

/// [`git`], holding the repository's worktree lock.
pub(super) fn git_serial<I, S>(
    lock: &Mutex<()>,
    dir: &Path,
    args: I,
) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let _serial = lock.lock().unwrap_or_else(PoisonError::into_inner);
    git(dir, args)
}

/// `git branch <branch> <base>`: fails, creating nothing, when the branch exists. The branch
/// does not track its base (a plain `git push` from the worktree must not go to the base's
/// remote branch).
pub(super) fn make_branch(dir: &Path, branch: &str, base: &str) -> Result<(), WorktreeError> {
    git(dir, ["branch", "--no-track", branch, base]).map(drop)
}

/// Deletes a branch this module just made (it holds nothing of its own). Logged on failure.
pub(super) fn delete_branch(dir: &Path, branch: &str) {
    if let Err(e) = git(dir, ["branch", "-D", "--", branch]) {
        tracing::warn!(error = %e, %branch, "cannot delete the branch of a half-made worktree");
    }
}

pub(super) fn branch_exists(root: &Path, branch: &str) -> bool {
    git(
        root,
        [
            "show-ref",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )
    .is_ok()
}
