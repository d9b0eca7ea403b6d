//! Git worktrees drover makes for agents: `git worktree add` under
//! `$DROVER_HOME/worktrees/<project>/<name>`, the repository's project file (`drover.toml`:
//! setup, teardown, files to copy), status (uncommitted changes, commits found nowhere else),
//! and removal that never loses a commit.
//!
//! This file holds the errors, the records, and create / status / remove / discard;
//! `project.rs` reads `drover.toml` and runs its commands, `git.rs` runs git.
//!
//! Everything here shells out to `git` and `sh` and blocks: the registry calls it from
//! blocking threads, never under its writer lock. Nothing here touches a record. One
//! repository's `git worktree add`, `remove` and `prune` run one at a time (git itself fails
//! when two adds overlap).

mod git;
mod project;

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::hash::BuildHasher;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

pub use git::read_bounded;
use git::{branch_exists, delete_branch, git, git_serial, make_branch, repo_lock, repo_lock_of};
use project::run_commands;
pub use project::{DEFAULT_COMMAND_TIMEOUT, PROJECT_FILE, ProjectConfig, WorktreeConfig};

use crate::file_error::FileError;
use crate::ids::AgentId;
use drover_protocol::ErrorCode;
/// What a worktree holds that exists nowhere else, as clients see it too.
pub use drover_protocol::WorktreeStatusInfo;

/// How many status entries and commits a status lists (the counts are exact).
const LIST_LIMIT: usize = 200;

/// Longest worktree or project name.
const MAX_NAME: usize = 64;

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
        .0.path,
        .0.summary()
    )]
    Dirty(Box<WorktreeStatusInfo>),
    #[error("workspace `{0}` is being archived already")]
    Busy(String),
    #[error(transparent)]
    Io(#[from] FileError),
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
            WorktreeError::Io(_) => ErrorCode::WorktreeIoFailed,
        }
    }

    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WorktreeError + 'a {
        FileError::on(op, path)
    }

    fn invalid(field: &'static str, message: impl Into<String>) -> WorktreeError {
        WorktreeError::InvalidInput {
            field,
            message: message.into(),
        }
    }
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
    /// The agent that asked for it (over MCP); `None` when a user did. An agent may archive
    /// only worktrees it or its descendants made, or whose agents are all its own.
    pub created_by: Option<AgentId>,
}

/// What to make. Every field is optional.
#[derive(Debug, Clone, Default)]
pub struct WorktreeOptions {
    /// The worktree's folder name (sanitized; a taken one is refused). Generated when absent.
    pub name: Option<String>,
    /// The new branch; `drover/<name>` by default. It must not exist yet.
    pub branch: Option<String>,
    /// What to branch from (a branch, tag or commit); the source checkout's HEAD by default.
    pub base: Option<String>,
    /// Overrides the project file's `timeout` for setup.
    pub setup_timeout: Option<Duration>,
    /// The agent asking (see [`WorktreeInfo::created_by`]).
    pub created_by: Option<AgentId>,
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
    pub status: WorktreeStatusInfo,
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

/// Where the worktree named `name` (sanitized) of the checkout at `source` is or would be:
/// `root/<project>/<name>`, as [`create`] makes it (the project folder canonical when it
/// exists, as the registry stores paths).
pub fn planned_path(root: &Path, source: &Path, name: &str) -> Result<PathBuf, WorktreeError> {
    let wanted = sanitize_name(name);
    if wanted.is_empty() {
        return Err(WorktreeError::invalid(
            "name",
            format!("`{name}` has nothing usable in a folder or branch name"),
        ));
    }
    let src = resolve_source(source, None)?;
    let project = root.join(&src.project);
    let project = fs::canonicalize(&project).unwrap_or(project);
    Ok(project.join(wanted))
}

/// Makes a worktree of the checkout at `source` under `root/<project>/<name>`, copies the
/// project file's files into it and runs its setup. On any failure nothing is left behind: no
/// folder, no branch, no worktree entry. A folder in `reserved` (one a workspace record still
/// names, though it vanished) is never reused. A generated name that is taken is tried again
/// with another; a name the caller gave whose folder or branch is taken is refused, never
/// replaced by another (`NAME-2` would be a second worktree the caller did not ask for).
///
/// The same git processes as `git worktree add -b` (which runs `git branch` itself), plus one
/// `git rev-parse` run alongside the `git branch`: the branch, created atomically by git, is
/// what reserves a name.
pub fn create<S: BuildHasher>(
    root: &Path,
    source: &Path,
    options: &WorktreeOptions,
    reserved: &HashSet<PathBuf, S>,
) -> Result<Created, WorktreeError> {
    let names = Names::new(options)?;
    let first = names.candidate();
    let first_branch = names.branch_for(&first);
    let base_arg = options.base.as_deref().unwrap_or("HEAD");
    let (resolved, made_branch) = std::thread::scope(|scope| {
        let resolving = scope.spawn(|| resolve_source(source, options.base.as_deref()));
        let made = make_branch(source, &first_branch, base_arg);
        let resolved = resolving
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (resolved, made)
    });
    let src = match resolved {
        Ok(src) => src,
        Err(e) => {
            if made_branch.is_ok() {
                delete_branch(source, &first_branch);
            }
            return Err(e);
        }
    };
    let prepared = ProjectConfig::load(&src.root)
        .and_then(|config| Ok((config, project_folder(root, &src.project)?)));
    let (config, project_dir) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            if made_branch.is_ok() {
                delete_branch(&src.root, &first_branch);
            }
            return Err(e);
        }
    };
    let first = (first, first_branch, made_branch);
    let (name, branch, path) = reserve(&src, &project_dir, reserved, &names, first)?;
    add_worktree(&src, &project_dir, &path, &branch)?;
    let mut made = Created {
        path,
        name,
        info: WorktreeInfo {
            source: src.root.clone(),
            branch,
            base: src.base,
            base_commit: src.base_commit,
            copied: Vec::new(),
            created_by: options.created_by,
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

/// The names a creation tries: the caller's (sanitized) alone, or generated ones; and the
/// branch for each.
struct Names {
    wanted: Option<String>,
    branch: Option<String>,
}

impl Names {
    fn new(options: &WorktreeOptions) -> Result<Names, WorktreeError> {
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
        Ok(Names {
            wanted,
            branch: options.branch.clone(),
        })
    }

    fn candidate(&self) -> String {
        match &self.wanted {
            Some(name) => name.clone(),
            None => generated_name(),
        }
    }

    fn branch_for(&self, name: &str) -> String {
        self.branch
            .clone()
            .unwrap_or_else(|| format!("drover/{name}"))
    }
}

/// `root/<project>`, made if needed, canonical (as the registry stores every path).
fn project_folder(root: &Path, project: &str) -> Result<PathBuf, WorktreeError> {
    let dir = root.join(project);
    crate::private::create_dir_all(&dir).map_err(WorktreeError::io("create folder", &dir))?;
    fs::canonicalize(&dir).map_err(WorktreeError::io("resolve", &dir))
}

/// Finds a free name: its branch made (`first` is the first try, already attempted) and its
/// folder created. Returns the name, the branch and the folder.
fn reserve<S: BuildHasher>(
    src: &Source,
    project_dir: &Path,
    reserved: &HashSet<PathBuf, S>,
    names: &Names,
    first: (String, String, Result<(), WorktreeError>),
) -> Result<(String, String, PathBuf), WorktreeError> {
    let (mut name, mut branch, mut made_branch) = first;
    let mut attempt = 1;
    loop {
        match made_branch {
            Ok(()) => {
                let path = project_dir.join(&name);
                // The branch is ours; the folder may still be taken (by another repository
                // with the same folder name, or by a record of a worktree that vanished).
                // Creating it reserves it; git accepts an empty folder.
                let created = if reserved.contains(&path) {
                    Err(io::ErrorKind::AlreadyExists.into())
                } else {
                    crate::private::create_dir(&path)
                };
                match created {
                    Ok(()) => return Ok((name, branch, path)),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        delete_branch(&src.root, &branch);
                        if names.wanted.is_some() {
                            return Err(WorktreeError::invalid(
                                "name",
                                format!(
                                    "the worktree folder `{}` is taken (by a worktree of another \
                                     repository, or one whose folder vanished): name another",
                                    path.display()
                                ),
                            ));
                        }
                    }
                    Err(e) => {
                        delete_branch(&src.root, &branch);
                        return Err(WorktreeError::io("create folder", &path)(e));
                    }
                }
            }
            Err(e) => {
                let exists = branch_exists(&src.root, &branch);
                match &names.branch {
                    Some(given) if exists => {
                        return Err(WorktreeError::invalid(
                            "branch",
                            format!("branch `{given}` exists already"),
                        ));
                    }
                    None if exists && names.wanted.is_some() => {
                        return Err(WorktreeError::invalid(
                            "name",
                            format!(
                                "branch `{branch}` exists already (kept from an earlier worktree \
                                 `{name}` for its unmerged commits, or made outside drover): name \
                                 another worktree, or delete the branch"
                            ),
                        ));
                    }
                    // A generated name taken by a concurrent creation: try another.
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
        name = names.candidate();
        branch = names.branch_for(&name);
        made_branch = make_branch(&src.root, &branch, &src.base_commit);
    }
}

/// `git worktree add` into the reserved folder; on failure undoes the folder and the branch.
fn add_worktree(
    src: &Source,
    project_dir: &Path,
    path: &Path,
    branch: &str,
) -> Result<(), WorktreeError> {
    let serial = repo_lock(&src.common_dir);
    let added = git_serial(
        &serial,
        &src.root,
        [
            OsStr::new("worktree"),
            OsStr::new("add"),
            OsStr::new("--quiet"),
            path.as_os_str(),
            OsStr::new(branch),
        ],
    );
    if let Err(e) = added {
        // A failing post-checkout hook fails the command after the worktree was made.
        let _ = fs::remove_dir_all(path);
        let _ = git_serial(&serial, &src.root, ["worktree", "prune"]);
        delete_branch(&src.root, branch);
        let _ = fs::remove_dir(project_dir);
        return Err(e);
    }
    Ok(())
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

/// What the worktree at `path` holds that exists nowhere else: its `git status` entries
/// (files drover copied in left out), and the commits on its HEAD or branch reachable neither
/// from the source checkout's HEAD, nor from any remote-tracking branch, nor from the base
/// (newest first); at most 200 of each (`LIST_LIMIT`), the counts exact.
pub fn status(path: &Path, info: &WorktreeInfo) -> Result<WorktreeStatusInfo, WorktreeError> {
    let mut status = WorktreeStatusInfo {
        path: path.display().to_string(),
        branch: info.branch.clone(),
        ..WorktreeStatusInfo::default()
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
        WorktreeStatusInfo {
            path: path.display().to_string(),
            branch: info.branch.clone(),
            missing: is_missing(path),
            ..WorktreeStatusInfo::default()
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
}
