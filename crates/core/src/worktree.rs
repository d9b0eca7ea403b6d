//! Git worktrees drover makes for agents: `git worktree add` under
//! `$DROVER_HOME/worktrees/<project>/<name>`, the repository's project file (`drover.toml`:
//! setup, teardown, files to copy), status (uncommitted changes, commits found nowhere else),
//! and removal that never loses a commit.
//!
//! Everything here shells out to `git` and `sh` and blocks: the registry calls it from
//! blocking threads, never under its writer lock. Nothing here touches a record. One
//! repository's `git worktree add`, `remove` and `prune` run one at a time (git itself fails
//! when two adds overlap).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;

/// The project file at the root of a source checkout.
pub const PROJECT_FILE: &str = "drover.toml";

/// How long setup (or teardown) may run, all its commands together, unless the project file
/// says otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How much of a command's output is kept (its end).
const OUTPUT_LIMIT: usize = 64 * 1024;

/// How many status entries and commits a status lists (the counts are exact).
const LIST_LIMIT: usize = 200;

/// Longest worktree or project name.
const MAX_NAME: usize = 64;

/// Environment variables that would point git at another repository than the one we name.
const GIT_LOCATION_VARS: [&str; 5] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
];

/// A worktree operation that failed. Each has a stable code (see [`WorktreeError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error("`{}` is not a git checkout with a commit to branch from: {message}", path.display())]
    NotARepository { path: PathBuf, message: String },
    #[error("invalid `{field}`: {message}")]
    InvalidInput {
        field: &'static str,
        message: String,
    },
    #[error("`git {args}` failed in `{}`: {message}", dir.display())]
    Git {
        dir: PathBuf,
        args: String,
        message: String,
    },
    #[error("invalid project file `{}`: {message}", path.display())]
    ProjectFile { path: PathBuf, message: String },
    #[error("worktree setup failed: {run}")]
    SetupFailed { run: Box<CommandRun> },
    #[error("worktree teardown failed (archive with force to remove the worktree anyway): {run}")]
    TeardownFailed { run: Box<CommandRun> },
    #[error(
        "worktree `{}` has {}; commit and push (or merge) it, or archive with force",
        .0.path.display(),
        .0.summary()
    )]
    Dirty(Box<WorktreeStatus>),
    #[error("workspace `{0}` is being archived already")]
    Busy(String),
    #[error("cannot {op} `{}`: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl WorktreeError {
    /// The stable code clients match on.
    pub fn code(&self) -> ErrorCode {
        match self {
            WorktreeError::NotARepository { .. } => ErrorCode::NotAGitRepository,
            WorktreeError::InvalidInput { .. } => ErrorCode::InvalidInput,
            WorktreeError::Git { .. } => ErrorCode::GitFailed,
            WorktreeError::ProjectFile { .. } => ErrorCode::InvalidProjectFile,
            WorktreeError::SetupFailed { .. } => ErrorCode::WorktreeSetupFailed,
            WorktreeError::TeardownFailed { .. } => ErrorCode::WorktreeTeardownFailed,
            WorktreeError::Dirty(_) => ErrorCode::WorktreeDirty,
            WorktreeError::Busy(_) => ErrorCode::WorktreeBusy,
            WorktreeError::Io { .. } => ErrorCode::WorktreeIoFailed,
        }
    }

    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WorktreeError + 'a {
        move |source| WorktreeError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    fn invalid(field: &'static str, message: impl Into<String>) -> WorktreeError {
        WorktreeError::InvalidInput {
            field,
            message: message.into(),
        }
    }
}

// ---- the project file -----------------------------------------------------------------------

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

    fn timeout(&self) -> Duration {
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

// ---- records and results --------------------------------------------------------------------

/// What a workspace record keeps about the worktree drover made for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeInfo {
    /// The root of the source checkout the worktree was made from.
    pub source: PathBuf,
    /// The branch made for the worktree.
    pub branch: String,
    /// What the branch was made from, as named (the source's branch when defaulted, or the
    /// commit when the source's HEAD was detached).
    pub base: String,
    /// The commit `base` named at creation.
    pub base_commit: String,
    /// The `copy` entries that were copied from the source.
    pub copied: Vec<String>,
}

/// What to make. Every field is optional.
#[derive(Debug, Clone, Default)]
pub struct WorktreeOptions {
    /// The worktree's folder name (sanitized; suffixed `-2`, `-3`, ... when taken). Generated
    /// when absent.
    pub name: Option<String>,
    /// The new branch; `drover/<name>` by default. It must not exist yet.
    pub branch: Option<String>,
    /// What to branch from (a branch, tag or commit); the source checkout's HEAD by default.
    pub base: Option<String>,
    /// Overrides the project file's `timeout` for setup.
    pub setup_timeout: Option<Duration>,
}

/// One setup or teardown command as it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRun {
    pub command: String,
    /// `None` when it was killed (by a signal, or because it ran out of time).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// stdout and stderr as they came, the last 64 KiB.
    pub output: String,
    pub duration_ms: u64,
}

impl CommandRun {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }
}

impl fmt::Display for CommandRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ", self.command)?;
        match (self.timed_out, self.exit_code) {
            (true, _) => write!(f, "ran out of time after {} ms", self.duration_ms)?,
            (false, Some(code)) => write!(f, "exited with status {code}")?,
            (false, None) => write!(f, "was killed by a signal")?,
        }
        let output = self.output.trim_end();
        if output.is_empty() {
            write!(f, " (no output)")
        } else {
            write!(f, "; its output:\n{output}")
        }
    }
}

/// What a worktree holds that exists nowhere else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeStatus {
    pub path: PathBuf,
    pub branch: String,
    /// The folder (or its `.git` link) is gone: removed outside drover.
    pub missing: bool,
    /// `git status --porcelain` entries (`XY path`), files drover copied in left out; at most
    /// 200.
    pub uncommitted: Vec<String>,
    pub uncommitted_count: usize,
    /// Commits on the worktree's HEAD or branch reachable neither from the source checkout's
    /// HEAD, nor from any remote-tracking branch, nor from the base (`abc1234 subject`, newest
    /// first); at most 200.
    pub unpushed: Vec<String>,
    pub unpushed_count: usize,
}

impl WorktreeStatus {
    /// Nothing would be lost by removing the worktree.
    pub fn is_clean(&self) -> bool {
        self.uncommitted_count == 0 && self.unpushed_count == 0
    }

    /// "2 uncommitted changes (M a.txt, ?? b.txt) and 1 unpushed commit on `drover/x` (…)".
    pub fn summary(&self) -> String {
        fn some(items: &[String]) -> String {
            let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
            let more = if items.len() > shown.len() {
                ", …"
            } else {
                ""
            };
            format!("{}{more}", shown.join(", "))
        }
        let plural = |n: usize, one: &str, many: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {many}")
            }
        };
        let mut parts = Vec::new();
        if self.uncommitted_count > 0 {
            parts.push(format!(
                "{} ({})",
                plural(
                    self.uncommitted_count,
                    "uncommitted change",
                    "uncommitted changes"
                ),
                some(&self.uncommitted)
            ));
        }
        if self.unpushed_count > 0 {
            parts.push(format!(
                "{} on `{}` ({})",
                plural(self.unpushed_count, "unpushed commit", "unpushed commits"),
                self.branch,
                some(&self.unpushed)
            ));
        }
        if parts.is_empty() {
            "nothing uncommitted or unpushed".to_string()
        } else {
            parts.join(" and ")
        }
    }
}

/// A worktree made by [`create`], with its setup done.
#[derive(Debug, Clone)]
pub struct Created {
    /// Canonical.
    pub path: PathBuf,
    pub name: String,
    pub info: WorktreeInfo,
    pub setup: Vec<CommandRun>,
}

/// What removing a worktree did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeRemoval {
    /// What the worktree held just before (what `force` discarded, if anything).
    pub status: WorktreeStatus,
    pub teardown: Vec<CommandRun>,
    /// The folder was removed by drover (`false` when it had vanished already).
    pub removed: bool,
    /// The branch was deleted: every commit on it is reachable from another branch, a
    /// remote-tracking branch, a tag or the source's HEAD. Otherwise it is kept.
    pub branch_deleted: bool,
}

// ---- create ---------------------------------------------------------------------------------

/// The source checkout as git sees it.
struct Source {
    /// The checkout's root (its top-level folder).
    root: PathBuf,
    /// The repository's folder name, sanitized: worktrees of one repository share it.
    project: String,
    /// The repository (`git rev-parse --git-common-dir`).
    common_dir: PathBuf,
    base: String,
    base_commit: String,
}

/// Asks git, in one call, for the checkout's root, its repository, the base commit and the
/// name of the checkout's HEAD.
fn resolve_source(source: &Path, base: Option<&str>) -> Result<Source, WorktreeError> {
    let rev = format!("{}^{{commit}}", base.unwrap_or("HEAD"));
    let out = git(
        source,
        [
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-common-dir",
            &rev,
            "--abbrev-ref",
            "HEAD",
            "--",
        ],
    )
    .map_err(|e| {
        let WorktreeError::Git { message, .. } = e else {
            return e;
        };
        // Only on failure: ask git whether this is a repository at all, to tell a bad base
        // from a bad source whatever language git speaks.
        let in_repo = git(source, ["rev-parse", "--git-dir"]).is_ok();
        match base {
            Some(base) if in_repo => {
                WorktreeError::invalid("base", format!("`{base}` names no commit: {message}"))
            }
            None if in_repo => WorktreeError::NotARepository {
                path: source.to_path_buf(),
                message: format!("its HEAD names no commit yet: {message}"),
            },
            _ => WorktreeError::NotARepository {
                path: source.to_path_buf(),
                message,
            },
        }
    })?;
    let mut lines = out.lines();
    let (Some(root), Some(common), Some(commit), Some(head)) =
        (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err(WorktreeError::NotARepository {
            path: source.to_path_buf(),
            message: format!("unexpected `git rev-parse` output: {out}"),
        });
    };
    // `/x/repo/.git` → `repo`; a bare `/x/repo.git` → `repo`.
    let common = Path::new(common);
    let folder = match common.file_name() {
        Some(n) if n == ".git" => common.parent().and_then(Path::file_name),
        other => other,
    };
    let folder = folder.map(|n| n.to_string_lossy().into_owned());
    let folder = folder.as_deref().unwrap_or("project");
    let project = sanitize_name(folder.strip_suffix(".git").unwrap_or(folder));
    let base = match base {
        Some(base) => base.to_string(),
        // A detached HEAD has no name; the commit is the base.
        None if head == "HEAD" => commit.to_string(),
        None => head.to_string(),
    };
    Ok(Source {
        root: PathBuf::from(root),
        common_dir: common.to_path_buf(),
        project: if project.is_empty() {
            "project".to_string()
        } else {
            project
        },
        base,
        base_commit: commit.to_string(),
    })
}

/// Makes a worktree of the checkout at `source` under `root/<project>/<name>`, copies the
/// project file's files into it and runs its setup. On any failure nothing is left behind: no
/// folder, no branch, no worktree entry. A folder in `reserved` (one a workspace record still
/// names, though it vanished) is never reused.
///
/// The same git processes as `git worktree add -b` (which runs `git branch` itself), plus one
/// `git rev-parse` run alongside the `git branch`: the branch, created atomically by git, is
/// what reserves a name.
pub fn create(
    root: &Path,
    source: &Path,
    options: &WorktreeOptions,
    reserved: &HashSet<PathBuf>,
) -> Result<Created, WorktreeError> {
    if let Some(branch) = &options.branch {
        check_ref_arg("branch", branch)?;
    }
    if let Some(base) = &options.base {
        check_ref_arg("base", base)?;
    }
    let wanted = match &options.name {
        Some(raw) => {
            let name = sanitize_name(raw);
            if name.is_empty() {
                return Err(WorktreeError::invalid(
                    "name",
                    format!("`{raw}` has nothing usable in a folder or branch name"),
                ));
            }
            Some(name)
        }
        None => None,
    };
    let candidate = |attempt: usize| match &wanted {
        Some(name) if attempt == 1 => name.clone(),
        Some(name) => format!("{name}-{attempt}"),
        None => generated_name(),
    };
    let branch_for = |name: &str| {
        options
            .branch
            .clone()
            .unwrap_or_else(|| format!("drover/{name}"))
    };

    let mut name = candidate(1);
    let mut branch = branch_for(&name);
    let base_arg = options.base.as_deref().unwrap_or("HEAD");
    let (resolved, mut made_branch) = std::thread::scope(|scope| {
        let resolving = scope.spawn(|| resolve_source(source, options.base.as_deref()));
        let made = make_branch(source, &branch, base_arg);
        let resolved = resolving
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (resolved, made)
    });
    let src = match resolved {
        Ok(src) => src,
        Err(e) => {
            if made_branch.is_ok() {
                delete_branch(source, &branch);
            }
            return Err(e);
        }
    };
    let config = match ProjectConfig::load(&src.root) {
        Ok(config) => config,
        Err(e) => {
            if made_branch.is_ok() {
                delete_branch(&src.root, &branch);
            }
            return Err(e);
        }
    };
    let project_dir = root.join(&src.project);
    let project_dir = fs::create_dir_all(&project_dir)
        .map_err(WorktreeError::io("create folder", &project_dir))
        // Canonical, as the registry stores every path.
        .and_then(|()| {
            fs::canonicalize(&project_dir).map_err(WorktreeError::io("resolve", &project_dir))
        });
    let project_dir = match project_dir {
        Ok(dir) => dir,
        Err(e) => {
            if made_branch.is_ok() {
                delete_branch(&src.root, &branch);
            }
            return Err(e);
        }
    };

    let mut attempt = 1;
    let path = loop {
        match made_branch {
            Ok(()) => {
                let path = project_dir.join(&name);
                // The branch is ours; the folder may still be taken (by another repository
                // with the same folder name, or by a record of a worktree that vanished).
                // Creating it reserves it; git accepts an empty folder.
                let created = if reserved.contains(&path) {
                    Err(io::ErrorKind::AlreadyExists.into())
                } else {
                    fs::create_dir(&path)
                };
                match created {
                    Ok(()) => break path,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        delete_branch(&src.root, &branch);
                    }
                    Err(e) => {
                        delete_branch(&src.root, &branch);
                        return Err(WorktreeError::io("create folder", &path)(e));
                    }
                }
            }
            Err(e) => {
                let exists = branch_exists(&src.root, &branch);
                match &options.branch {
                    Some(given) if exists => {
                        return Err(WorktreeError::invalid(
                            "branch",
                            format!("branch `{given}` exists already"),
                        ));
                    }
                    // Kept from an earlier worktree of that name (it had unmerged commits), or
                    // taken by a concurrent creation: try the next name.
                    None if exists => {}
                    _ => return Err(e),
                }
            }
        }
        attempt += 1;
        if attempt > 1000 {
            return Err(WorktreeError::invalid(
                "name",
                "no free worktree name after 1000 tries",
            ));
        }
        name = candidate(attempt);
        branch = branch_for(&name);
        made_branch = make_branch(&src.root, &branch, &src.base_commit);
    };

    let serial = repo_lock(&src.common_dir);
    let added = git_serial(
        &serial,
        &src.root,
        [
            OsStr::new("worktree"),
            OsStr::new("add"),
            OsStr::new("--quiet"),
            path.as_os_str(),
            OsStr::new(&branch),
        ],
    );
    if let Err(e) = added {
        // A failing post-checkout hook fails the command after the worktree was made.
        let _ = fs::remove_dir_all(&path);
        let _ = git_serial(&serial, &src.root, ["worktree", "prune"]);
        delete_branch(&src.root, &branch);
        let _ = fs::remove_dir(&project_dir);
        return Err(e);
    }
    let mut made = Created {
        path,
        name,
        info: WorktreeInfo {
            source: src.root.clone(),
            branch,
            base: src.base,
            base_commit: src.base_commit,
            copied: Vec::new(),
        },
        setup: Vec::new(),
    };
    match finish(&mut made, &config, options) {
        Ok(()) => Ok(made),
        Err(e) => {
            discard(&made);
            Err(e)
        }
    }
}

/// `git branch <branch> <base>`: fails, creating nothing, when the branch exists. The branch
/// does not track its base (a plain `git push` from the worktree must not go to the base's
/// remote branch).
fn make_branch(dir: &Path, branch: &str, base: &str) -> Result<(), WorktreeError> {
    git(dir, ["branch", "--no-track", branch, base]).map(drop)
}

/// Deletes a branch this module just made (it holds nothing of its own). Logged on failure.
fn delete_branch(dir: &Path, branch: &str) {
    if let Err(e) = git(dir, ["branch", "-D", "--", branch]) {
        tracing::warn!(error = %e, %branch, "cannot delete the branch of a half-made worktree");
    }
}

/// Copies the project's files and runs its setup in a fresh worktree.
fn finish(
    made: &mut Created,
    config: &ProjectConfig,
    options: &WorktreeOptions,
) -> Result<(), WorktreeError> {
    for entry in &config.worktree.copy {
        let from = made.info.source.join(entry);
        let to = made.path.join(entry);
        if fs::symlink_metadata(&from).is_err() || fs::symlink_metadata(&to).is_ok() {
            // Nothing to copy, or the checkout has it (a tracked file wins).
            continue;
        }
        copy_tree(&from, &to)?;
        made.info.copied.push(entry.clone());
    }
    let timeout = options.setup_timeout.unwrap_or_else(|| config.timeout());
    made.setup = run_commands(&config.worktree.setup, &made.path, &made.info, timeout)
        .map_err(|run| WorktreeError::SetupFailed { run })?;
    Ok(())
}

/// Undoes a creation: the worktree, its branch (just made, holding nothing of its own) and its
/// folder. Best effort, logged: it runs because something else failed.
pub fn discard(made: &Created) {
    let root = &made.info.source;
    let serial = repo_lock_of(root);
    let removed = git_serial(
        &serial,
        root,
        [
            OsStr::new("worktree"),
            OsStr::new("remove"),
            OsStr::new("--force"),
            OsStr::new("--force"),
            made.path.as_os_str(),
        ],
    );
    if let Err(e) = removed {
        tracing::warn!(error = %e, "cannot remove a half-made worktree; pruning");
        let _ = fs::remove_dir_all(&made.path);
        let _ = git_serial(&serial, root, ["worktree", "prune"]);
    }
    delete_branch(root, &made.info.branch);
    if made.path.exists() {
        let _ = fs::remove_dir_all(&made.path);
    }
    if let Some(parent) = made.path.parent() {
        // Only if empty: other worktrees of the project may live there.
        let _ = fs::remove_dir(parent);
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), WorktreeError> {
    let meta = fs::symlink_metadata(from).map_err(WorktreeError::io("read", from))?;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(WorktreeError::io("create folder", parent))?;
    }
    if meta.file_type().is_symlink() {
        let target = fs::read_link(from).map_err(WorktreeError::io("read link", from))?;
        std::os::unix::fs::symlink(&target, to).map_err(WorktreeError::io("create link", to))?;
    } else if meta.is_dir() {
        fs::create_dir(to).map_err(WorktreeError::io("create folder", to))?;
        for entry in fs::read_dir(from).map_err(WorktreeError::io("read folder", from))? {
            let entry = entry.map_err(WorktreeError::io("read folder", from))?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
    } else {
        fs::copy(from, to).map_err(WorktreeError::io("copy into", to))?;
    }
    Ok(())
}

// ---- status ---------------------------------------------------------------------------------

/// Whether the worktree's folder is gone (or no longer a worktree).
pub fn is_missing(path: &Path) -> bool {
    !path.join(".git").exists()
}

/// What the worktree at `path` holds that exists nowhere else.
pub fn status(path: &Path, info: &WorktreeInfo) -> Result<WorktreeStatus, WorktreeError> {
    let mut status = WorktreeStatus {
        path: path.to_path_buf(),
        branch: info.branch.clone(),
        ..WorktreeStatus::default()
    };
    if is_missing(path) {
        // Uncommitted work went with the folder; the branch's commits stay in the repository
        // (its branch is deleted only when merged).
        status.missing = true;
        return Ok(status);
    }
    let porcelain = git(
        path,
        [
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=none",
        ],
    )?;
    let mut entries = porcelain.split('\0').filter(|e| !e.is_empty());
    while let Some(entry) = entries.next() {
        if entry.starts_with('R') || entry.starts_with('C') {
            // A rename or copy: the next field is the original path.
            entries.next();
        }
        let copied = entry.strip_prefix("?? ").is_some_and(|p| {
            info.copied.iter().any(|c| {
                let c = c.trim_start_matches("./").trim_end_matches('/');
                p == c || p.strip_prefix(c).is_some_and(|rest| rest.starts_with('/'))
            })
        });
        if copied {
            continue;
        }
        status.uncommitted_count += 1;
        if status.uncommitted.len() < LIST_LIMIT {
            status.uncommitted.push(entry.to_string());
        }
    }

    // The source's HEAD, resolved where it lives (it may be detached, or gone).
    let source_head = git(&info.source, ["rev-parse", "--verify", "--quiet", "HEAD"])
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    let branch_ref = format!("refs/heads/{}", info.branch);
    let mut args = vec![
        "log",
        "--ignore-missing",
        "--format=%h %s",
        "HEAD",
        &branch_ref,
        "--not",
        "--remotes",
        &info.base_commit,
    ];
    if let Some(head) = source_head.as_deref() {
        args.push(head);
    }
    args.push("--");
    let log = git(path, args)?;
    for line in log.lines().filter(|l| !l.is_empty()) {
        status.unpushed_count += 1;
        if status.unpushed.len() < LIST_LIMIT {
            status.unpushed.push(line.to_string());
        }
    }
    Ok(status)
}

// ---- remove ---------------------------------------------------------------------------------

/// Removes the worktree at `path`: refuses when it holds uncommitted changes or unpushed
/// commits unless `force`, runs the project's teardown, removes the worktree (or prunes it
/// when its folder vanished), and deletes its branch only when no commit would be lost.
/// A refusal or a failure before the removal leaves the worktree as it was.
pub fn remove(
    path: &Path,
    info: &WorktreeInfo,
    force: bool,
) -> Result<WorktreeRemoval, WorktreeError> {
    let source_gone = !info.source.is_dir();
    let status = if source_gone {
        // Without its repository there is nothing git can tell or do.
        WorktreeStatus {
            path: path.to_path_buf(),
            branch: info.branch.clone(),
            missing: is_missing(path),
            ..WorktreeStatus::default()
        }
    } else {
        self::status(path, info)?
    };
    if !status.is_clean() && !force {
        return Err(WorktreeError::Dirty(Box::new(status)));
    }
    let mut removal = WorktreeRemoval {
        status,
        ..WorktreeRemoval::default()
    };
    if source_gone {
        tracing::warn!(source = %info.source.display(), worktree = %path.display(),
            "the worktree's source repository is gone; nothing to remove in git");
        if path.is_dir() && force {
            fs::remove_dir_all(path).map_err(WorktreeError::io("remove", path))?;
            removal.removed = true;
        }
        return Ok(removal);
    }

    let serial = repo_lock_of(&info.source);
    if removal.status.missing {
        tracing::info!(worktree = %path.display(), "the worktree's folder vanished; pruning it from git");
        git_serial(&serial, &info.source, ["worktree", "prune"])?;
    } else {
        let config = match ProjectConfig::load(&info.source) {
            Ok(config) => config,
            Err(e) if force => {
                tracing::warn!(error = %e, "skipping teardown: the project file is invalid");
                ProjectConfig::default()
            }
            Err(e) => return Err(e),
        };
        match run_commands(&config.worktree.teardown, path, info, config.timeout()) {
            Ok(runs) => removal.teardown = runs,
            Err(run) if force => {
                tracing::warn!(worktree = %path.display(), %run, "teardown failed; removing the worktree anyway (forced)");
                removal.teardown = vec![*run];
            }
            Err(run) => return Err(WorktreeError::TeardownFailed { run }),
        }
        // The status above is the gate (it leaves out the files drover copied in); `--force`
        // lets git remove what that gate allowed. A second one also removes a locked worktree,
        // only when forced.
        let mut args = vec![
            OsStr::new("worktree"),
            OsStr::new("remove"),
            OsStr::new("--force"),
        ];
        if force {
            args.push(OsStr::new("--force"));
        }
        args.push(path.as_os_str());
        git_serial(&serial, &info.source, args)?;
        removal.removed = true;
    }

    removal.branch_deleted = delete_branch_if_merged(info);
    Ok(removal)
}

/// Deletes the worktree's branch when every commit on it is reachable from another branch, a
/// remote-tracking branch, a tag or the source's HEAD. Failures are logged: the branch stays.
fn delete_branch_if_merged(info: &WorktreeInfo) -> bool {
    let root = &info.source;
    let branch_ref = format!("refs/heads/{}", info.branch);
    if !branch_exists(root, &info.branch) {
        return false;
    }
    // `--exclude` patterns for `--branches` are written without `refs/heads/`.
    let exclude = format!("--exclude={}", info.branch);
    let own = git(
        root,
        [
            "rev-list",
            "-n1",
            &branch_ref,
            "--not",
            &exclude,
            "--branches",
            "--remotes",
            "--tags",
            "HEAD",
            "--",
        ],
    );
    match own {
        Ok(out) if out.trim().is_empty() => match git(root, ["branch", "-D", "--", &info.branch]) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot delete the merged branch of a removed worktree; kept");
                false
            }
        },
        Ok(_) => {
            tracing::info!(branch = %info.branch, "keeping the branch of a removed worktree: it has commits found nowhere else");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether a worktree's branch is merged; kept");
            false
        }
    }
}

// ---- names ----------------------------------------------------------------------------------

/// A name usable as a folder name and in a branch name: ASCII letters, digits, `.`, `_` and
/// `-` (anything else becomes `-`), no runs of `-` or `.`, no leading or trailing `-` or `.`,
/// no `.lock` ending, at most 64 characters. May be empty.
pub fn sanitize_name(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.trim().chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '-'
        };
        if matches!(c, '-' | '.') && out.ends_with(c) {
            continue;
        }
        out.push(c);
    }
    let trim = |s: &str| s.trim_matches(|c| c == '-' || c == '.').to_string();
    let mut out = trim(&out);
    out.truncate(MAX_NAME);
    let mut out = trim(&out);
    if let Some(stem) = out.strip_suffix(".lock") {
        out = format!("{stem}-lock");
    }
    out
}

/// `wt-` and eight random hex digits.
fn generated_name() -> String {
    let id = uuid::Uuid::now_v7().simple().to_string();
    // The last digits of a UUIDv7 are random; the first ones are the clock.
    format!("wt-{}", &id[id.len() - 8..])
}

/// A branch or base given by a caller: git validates the rest, this keeps it from being read as
/// an option or a range.
fn check_ref_arg(field: &'static str, value: &str) -> Result<(), WorktreeError> {
    if value.trim().is_empty() {
        return Err(WorktreeError::invalid(field, "must not be empty"));
    }
    if value.starts_with('-') {
        return Err(WorktreeError::invalid(
            field,
            format!("`{value}` must not start with `-`"),
        ));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) || value.contains("..") {
        return Err(WorktreeError::invalid(
            field,
            format!("`{value}` is not a valid git reference name"),
        ));
    }
    Ok(())
}

fn branch_exists(root: &Path, branch: &str) -> bool {
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

// ---- processes ------------------------------------------------------------------------------

/// Runs `git -C dir args…`, returning its stdout. Its stdin is closed and it never prompts.
fn git<I, S>(dir: &Path, args: I) -> Result<String, WorktreeError>
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
            ("", "") => describe(out.status),
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
fn repo_lock(common_dir: &Path) -> Arc<Mutex<()>> {
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
fn repo_lock_of(root: &Path) -> Arc<Mutex<()>> {
    let common = git(
        root,
        ["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map(|out| PathBuf::from(out.trim()))
    .unwrap_or_else(|_| root.to_path_buf());
    repo_lock(&common)
}

/// [`git`], holding the repository's worktree lock.
fn git_serial<I, S>(lock: &Mutex<()>, dir: &Path, args: I) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let _serial = lock.lock().unwrap_or_else(PoisonError::into_inner);
    git(dir, args)
}

fn describe(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "killed by a signal".to_string(),
    }
}

/// Runs `commands` one after another in `cwd` within `timeout` all together. Returns every
/// run, or the first that failed.
fn run_commands(
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
    let mut run = CommandRun {
        command: command.to_string(),
        exit_code: None,
        timed_out: false,
        output: String::new(),
        duration_ms: 0,
    };
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env("DROVER_WORKTREE", cwd)
        .env("DROVER_SOURCE", &info.source)
        .env("DROVER_BRANCH", &info.branch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for var in GIT_LOCATION_VARS {
        cmd.env_remove(var);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            run.output = format!("cannot start `sh`: {e}");
            return run;
        }
    };
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (done_tx, done_rx) = mpsc::channel();
    let mut readers = 0;
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    for mut stream in streams.into_iter().flatten() {
        let tail = tail.clone();
        let done = done_tx.clone();
        readers += 1;
        // Detached: a background process the command started may hold the pipe open; the
        // thread ends when it closes it.
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(&buf[..n]);
            }
            let _ = done.send(());
        });
    }
    drop(done_tx);

    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                run.timed_out = true;
                kill_group(child.id());
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                tail.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("cannot wait for the command: {e}\n").as_bytes());
                kill_group(child.id());
                let _ = child.wait();
                break None;
            }
        }
    };
    // The output is complete once both pipes closed; a process left in the background may
    // keep one open, so wait only briefly.
    let grace = Instant::now() + Duration::from_millis(200);
    for _ in 0..readers {
        if done_rx
            .recv_timeout(grace.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }
    run.exit_code = status.and_then(|s| s.code());
    run.output = tail.lock().unwrap_or_else(PoisonError::into_inner).text();
    run.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    run
}

fn kill_group(pid: u32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Ok(raw) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
    }
}

/// The end of a command's output.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    cut: bool,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > OUTPUT_LIMIT {
            let excess = self.bytes.len() - OUTPUT_LIMIT;
            self.bytes.drain(..excess);
            self.cut = true;
        }
    }

    fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        if self.cut {
            format!("[… earlier output cut …]\n{text}")
        } else {
            text.into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_for_folders_and_branches() {
        assert_eq!(sanitize_name("Fix the flaky test!"), "Fix-the-flaky-test");
        assert_eq!(sanitize_name("../../etc"), "etc");
        assert_eq!(sanitize_name("a..b"), "a.b");
        assert_eq!(sanitize_name("x.lock"), "x-lock");
        assert_eq!(sanitize_name("..."), "");
        assert_eq!(sanitize_name("ünïcödé"), "n-c-d");
        assert_eq!(sanitize_name(&"a".repeat(100)).len(), MAX_NAME);
    }

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
