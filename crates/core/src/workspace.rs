//! Workspaces: concrete working directories registered with the daemon under opaque ids.

use std::fmt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::ids::WorkspaceId;
use crate::worktree::WorktreeInfo;

/// What kind of directory a workspace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceKind {
    /// A plain directory.
    Directory,
    /// The main checkout of a git repository (its `.git` is a directory).
    LocalCheckout,
    /// A linked git worktree (its `.git` is a file pointing at the main repository).
    Worktree,
}

impl WorkspaceKind {
    /// Tells the kind of `path` from its `.git` entry, without running git.
    pub fn detect(path: &Path) -> WorkspaceKind {
        match std::fs::symlink_metadata(path.join(".git")) {
            Ok(meta) if meta.is_dir() => WorkspaceKind::LocalCheckout,
            Ok(meta) if meta.is_file() => WorkspaceKind::Worktree,
            _ => WorkspaceKind::Directory,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceKind::Directory => "directory",
            WorkspaceKind::LocalCheckout => "local_checkout",
            WorkspaceKind::Worktree => "worktree",
        }
    }
}

impl fmt::Display for WorkspaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One registered workspace. Many workspaces may share one directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub id: WorkspaceId,
    pub kind: WorkspaceKind,
    pub path: PathBuf,
    pub name: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
    /// Set for a worktree drover made (`Registry::create_worktree_workspace`): where it comes
    /// from and its branch. Archiving such a workspace removes the worktree.
    pub worktree: Option<WorktreeInfo>,
    pub(crate) unknown: serde_json::Map<String, serde_json::Value>,
}
