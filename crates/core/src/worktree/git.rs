//! The git runner: `git -C dir …` that never prompts and ignores the caller's `GIT_DIR` and
//! friends, one lock per repository for the commands that touch its worktree list, and the
//! branch commands. Every git drover runs starts here ([`git`] for the worktree commands,
//! [`read_bounded`] for reads whose output and time are bounded), through `crate::child`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::WorktreeError;
use crate::child::{self, describe_exit};

/// Environment variables that would point git at another repository than the one we name.
pub(super) const GIT_LOCATION_VARS: [&str; 5] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
];

/// The most of a failing git's stderr a [`read_bounded`] error quotes.
const STDERR_LIMIT: u64 = 64 * 1024;

/// `git -C dir args…` made by [`child::command`] (a process group of its own, stdin closed,
/// stdout and stderr piped), never prompting, the caller's `GIT_DIR` and friends removed. Its
/// working directory is `/`: `-C` names the checkout, so a missing one is git's own error.
fn git_command<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Command {
    let mut cmd = child::command("git", Path::new("/"));
    cmd.arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0");
    for var in GIT_LOCATION_VARS {
        cmd.env_remove(var);
    }
    cmd
}

fn git_error<S: AsRef<OsStr>>(dir: &Path, args: &[S], message: String) -> WorktreeError {
    WorktreeError::Git {
        dir: dir.to_path_buf(),
        args: args
            .iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        message,
    }
}

/// Runs `git -C dir args…`, returning its stdout. Its stdin is closed and it never prompts.
pub(super) fn git<I, S>(dir: &Path, args: I) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let out = git_command(dir, &args)
        .output()
        .map_err(|e| git_error(dir, &args, format!("cannot run git: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let message = match (stderr.trim(), stdout.trim()) {
            ("", "") => describe_exit(&out.status),
            ("", out) => out.to_string(),
            (err, _) => err.to_string(),
        };
        return Err(git_error(dir, &args, message));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `git -C dir args…` for at most `timeout`, tied to the daemon ([`child::spawn_tied`]),
/// and returns at most `limit` bytes of its stdout and whether it was cut. Past the limit the
/// rest is not wanted: git's group is killed instead of drained, and the read succeeds. Past
/// the timeout the group is killed and the read fails. Blocking.
pub fn read_bounded<S: AsRef<OsStr>>(
    dir: &Path,
    args: &[S],
    limit: usize,
    timeout: Duration,
) -> Result<(String, bool), WorktreeError> {
    let failed = |message: String| git_error(dir, args, message);
    let mut process = child::spawn_tied(git_command(dir, args))
        .map_err(|e| failed(format!("cannot run git: {e}")))?;
    let pid = process.id();
    let stdout = process.stdout.take();
    let stderr = process.stderr.take();
    let (tx, rx) = mpsc::channel();
    // Both pipes are read at once (a git that fills its stderr must not stall its stdout);
    // detached, so that a read a killed git leaves hanging holds no one up.
    std::thread::spawn(move || {
        let errors = std::thread::spawn(move || {
            let mut err = Vec::new();
            if let Some(stderr) = stderr {
                let _ = stderr.take(STDERR_LIMIT).read_to_end(&mut err);
            }
            err
        });
        let mut out = Vec::new();
        let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
        let read = stdout.map_or(Ok(0), |s| s.take(cap).read_to_end(&mut out));
        let cut = out.len() > limit;
        if cut {
            out.truncate(limit);
            child::signal_group(pid, Some(Signal::SIGKILL));
        }
        let err = errors.join().unwrap_or_default();
        let _ = tx.send(read.map(|_| (out, err, cut)));
    });
    let read = rx.recv_timeout(timeout);
    if read.is_err() {
        child::signal_group(pid, Some(Signal::SIGKILL));
    }
    let status = process.wait();
    let (out, err, cut) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(failed(format!("took longer than {timeout:?}"))),
    };
    let status = status.map_err(|e| failed(e.to_string()))?;
    if !cut && !status.success() {
        let err = String::from_utf8_lossy(&err).trim().to_string();
        return Err(failed(if err.is_empty() {
            describe_exit(&status)
        } else {
            err
        }));
    }
    Ok((String::from_utf8_lossy(&out).into_owned(), cut))
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
