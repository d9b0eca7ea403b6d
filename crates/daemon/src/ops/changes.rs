//! What a workspace changed: the files that differ from its base (a worktree's base commit,
//! else `HEAD`), with lines added and removed and a unified diff each, read from git by the
//! daemon, bounded in time and size. Read-only: it changes nothing.

use std::path::Path;
use std::time::Duration;

use drover_core::WorkspaceId;
use drover_protocol::{ChangeStatus, ErrorCode};
use serde::Serialize;

use super::{OpError, Ops};

/// How long one git command may take: a huge repository must not hold a request forever.
const GIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most diff text one answer carries; past it the rest is cut and `truncated` is set.
pub(crate) const MAX_DIFF_BYTES: usize = 512 * 1024;
/// The most files one answer lists.
pub(crate) const MAX_FILES: usize = 1000;

/// One changed file.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChangedFile {
    pub(crate) path: String,
    /// `added`, `modified`, `deleted`, `renamed`, `copied`, `type_changed`, `untracked`.
    pub(crate) status: drover_protocol::ChangeStatus,
    /// `None` for binary files.
    pub(crate) added: Option<u64>,
    pub(crate) removed: Option<u64>,
    pub(crate) diff: String,
}

/// The changes of a workspace against its base.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Changes {
    /// What was compared against: a commit for a worktree, `HEAD` otherwise.
    pub(crate) base: String,
    pub(crate) files: Vec<ChangedFile>,
    /// Files or diff text were left out to stay within the bounds.
    pub(crate) truncated: bool,
}

/// Why the changes could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangesError {
    #[error("`{0}` is not a git checkout")]
    NotARepository(String),
    #[error("git {args} in `{dir}` failed: {message}")]
    Git {
        dir: String,
        args: String,
        message: String,
    },
}

impl ChangesError {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            ChangesError::NotARepository(_) => ErrorCode::NotAGitRepository,
            ChangesError::Git { .. } => ErrorCode::GitFailed,
        }
    }
}

impl Ops {
    /// The files the workspace changed against its base, for a git checkout or worktree.
    pub(crate) async fn workspace_changes(&self, id: WorkspaceId) -> Result<Changes, OpError> {
        let workspace = self.workspace(id)?;
        let base = workspace
            .worktree
            .as_ref()
            .map_or_else(|| "HEAD".to_string(), |w| w.base_commit.clone());
        Ok(read_changes(&workspace.path, &base).await?)
    }
}

/// Reads the changes of the checkout at `dir` against `base`.
pub(crate) async fn read_changes(dir: &Path, base: &str) -> Result<Changes, ChangesError> {
    let shown = dir.display().to_string();
    let inside = git(dir, &["rev-parse", "--is-inside-work-tree"], 64).await;
    if !matches!(&inside, Ok((out, _)) if out.trim() == "true") {
        return Err(ChangesError::NotARepository(shown));
    }
    let (status, _) = git(
        dir,
        &["diff", "--name-status", "-z", "--no-renames", base],
        MAX_DIFF_BYTES,
    )
    .await?;
    let (numstat, _) = git(
        dir,
        &["diff", "--numstat", "-z", "--no-renames", base],
        MAX_DIFF_BYTES,
    )
    .await?;
    let (patch, cut) = git(
        dir,
        &["diff", "--no-color", "--no-ext-diff", "--no-renames", base],
        MAX_DIFF_BYTES,
    )
    .await?;
    let (untracked, _) = git(
        dir,
        &["ls-files", "--others", "--exclude-standard", "-z"],
        MAX_DIFF_BYTES,
    )
    .await?;
    let mut truncated = cut;
    let mut files = Vec::new();
    let mut fields = status.split('\0').filter(|s| !s.is_empty());
    while let (Some(code), Some(path)) = (fields.next(), fields.next()) {
        files.push(ChangedFile {
            path: path.to_string(),
            status: status_name(code),
            added: None,
            removed: None,
            diff: String::new(),
        });
    }
    // `--numstat -z`: `added\tremoved\tpath\0`, `-` for binary files.
    for record in numstat.split('\0').filter(|s| !s.is_empty()) {
        let mut parts = record.splitn(3, '\t');
        let (Some(a), Some(r), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if let Some(file) = files.iter_mut().find(|f| f.path == path) {
            file.added = a.parse().ok();
            file.removed = r.parse().ok();
        }
    }
    for (path, diff) in split_patch(&patch) {
        if let Some(file) = files.iter_mut().find(|f| f.path == path) {
            file.diff = diff;
        }
    }
    for path in untracked.split('\0').filter(|s| !s.is_empty()) {
        files.push(ChangedFile {
            path: path.to_string(),
            status: ChangeStatus::Untracked,
            added: None,
            removed: None,
            diff: String::new(),
        });
    }
    if files.len() > MAX_FILES {
        files.truncate(MAX_FILES);
        truncated = true;
    }
    Ok(Changes {
        base: base.to_string(),
        files,
        truncated,
    })
}

fn status_name(code: &str) -> ChangeStatus {
    match code.chars().next() {
        Some('A') => ChangeStatus::Added,
        Some('D') => ChangeStatus::Deleted,
        Some('R') => ChangeStatus::Renamed,
        Some('C') => ChangeStatus::Copied,
        Some('T') => ChangeStatus::TypeChanged,
        _ => ChangeStatus::Modified,
    }
}

/// Splits `git diff` output into `(path, that file's diff)`, by its `diff --git a/… b/…`
/// headers.
fn split_patch(patch: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in patch.split_inclusive('\n') {
        if let Some(header) = line.strip_prefix("diff --git ") {
            let path = header
                .trim_end()
                .rsplit_once(" b/")
                .map_or_else(|| header.trim_end().to_string(), |(_, p)| p.to_string());
            out.push((path, String::new()));
        }
        if let Some((_, diff)) = out.last_mut() {
            diff.push_str(line);
        }
    }
    out
}

/// Reads `git -C dir args…` through the one git runner
/// ([`drover_core::worktree::read_bounded`]) within [`GIT_TIMEOUT`], on a blocking thread: at
/// most `limit` bytes of its stdout and whether it was cut.
async fn git(dir: &Path, args: &[&str], limit: usize) -> Result<(String, bool), ChangesError> {
    let owned_dir = dir.to_path_buf();
    let owned: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
    let read = tokio::task::spawn_blocking(move || {
        drover_core::worktree::read_bounded(&owned_dir, &owned, limit, GIT_TIMEOUT)
    })
    .await;
    let failed = |message: String| ChangesError::Git {
        dir: dir.display().to_string(),
        args: args.join(" "),
        message,
    };
    match read {
        Ok(Ok(read)) => Ok(read),
        Ok(Err(drover_core::worktree::WorktreeError::Git { message, .. })) => Err(failed(message)),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(e) => Err(failed(format!("the git reader ended: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_splits_by_file() {
        let patch = "diff --git a/x.rs b/x.rs\n--- a/x.rs\n+++ b/x.rs\n@@ -1 +1 @@\n-a\n+b\ndiff --git a/d/y b/d/y\n+z\n";
        let parts = split_patch(patch);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0, "x.rs");
        assert!(parts[0].1.ends_with("+b\n"));
        assert_eq!(
            parts[1],
            (
                "d/y".to_string(),
                "diff --git a/d/y b/d/y\n+z\n".to_string()
            )
        );
    }
}
