//! A file operation that failed, naming what was done and to which file: the I/O variant of
//! the store's and the worktrees' errors.

use std::io;
use std::path::{Path, PathBuf};

/// Says ``cannot read `/a/b`: No such file or directory``: the operation, the path, the cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} `{}`: {source}", path.display())]
pub struct FileError {
    /// What was done, as a verb: `read`, `create folder`, `replace`...
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FileError {
    /// What `map_err` takes: the failure of `op` on `path`, as an `E` (a `StoreError`, a
    /// `WorktreeError`).
    pub fn on<'a, E: From<FileError>>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(io::Error) -> E + 'a {
        move |source| {
            FileError {
                op,
                path: path.to_path_buf(),
                source,
            }
            .into()
        }
    }
}
