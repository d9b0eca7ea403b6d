//! The file store under `$DROVER_HOME`: one JSON document per agent and per workspace,
//! written atomically, read back at boot with damaged files moved aside.
//!
//! Layout (see `docs/storage.md`):
//!
//! ```text
//! agents/{cwd-with-dashes}/{agent-id}.json
//! workspaces/{workspace-id}.json
//! journal/archive-{agent-id}.json      an archive cascade being written
//! quarantine/                          files that could not be read, moved aside at boot
//! ```
//!
//! The store knows nothing about the lifecycle: it turns records into files and back.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::agent::{
    Agent, AuthMethod, Limited, OnInterrupt, OnLimit, PermissionPolicy, ProviderConfig,
    ResumeHandle, Spend, StartFailure,
};
use crate::file_error::FileError;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention, AttentionReason};
use crate::workspace::{Workspace, WorkspaceKind};
use crate::worktree::WorktreeInfo;

/// The document version this build writes. A file with a newer version is left untouched.
pub const AGENT_DOC_VERSION: u32 = 1;
pub const WORKSPACE_DOC_VERSION: u32 = 1;
const JOURNAL_DOC_VERSION: u32 = 1;

/// Longest folder name we derive from a cwd (file systems allow 255 bytes).
const MAX_DIR_NAME: usize = 200;

/// A store operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Io(#[from] FileError),
    #[error("cannot encode the record for `{}`: {source}", path.display())]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    /// What `map_err` takes: the failure of `op` on `path`.
    pub fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
        FileError::on(op, path)
    }

    /// The file the failed operation was about.
    pub fn path(&self) -> &Path {
        match self {
            StoreError::Io(FileError { path, .. }) | StoreError::Encode { path, .. } => path,
        }
    }
}

/// A file that could not be loaded and was moved aside.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub original: PathBuf,
    /// Where it is now; `None` when moving it failed too (it was left in place and skipped).
    pub moved_to: Option<PathBuf>,
    pub reason: String,
}

/// What a boot-time load found.
#[derive(Debug)]
pub struct Loaded<T> {
    pub records: Vec<T>,
    pub quarantined: Vec<Quarantined>,
    /// Files written by a newer drover: left in place, not loaded.
    pub skipped_newer: Vec<PathBuf>,
}

impl<T> Default for Loaded<T> {
    fn default() -> Self {
        Loaded {
            records: Vec::new(),
            quarantined: Vec::new(),
            skipped_newer: Vec::new(),
        }
    }
}

/// An archive cascade that was being written when the process stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveJournal {
    pub version: u32,
    pub root: AgentId,
    pub archived_at: Timestamp,
    pub agents: Vec<AgentId>,
}

/// The data directory's files.
#[derive(Debug)]
pub struct Store {
    home: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the store's folders under `home`.
    pub fn open(home: &Path) -> Result<Store, StoreError> {
        for dir in ["agents", "workspaces", "journal", "quarantine"] {
            let path = home.join(dir);
            crate::private::create_dir_all(&path)
                .map_err(StoreError::io("create folder", &path))?;
        }
        Ok(Store {
            home: home.to_path_buf(),
        })
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// `agents/{cwd-with-dashes}/{agent-id}.json`.
    pub fn agent_path(&self, id: AgentId, cwd: &Path) -> PathBuf {
        self.home
            .join("agents")
            .join(cwd_dir_name(cwd))
            .join(format!("{id}.json"))
    }

    pub fn workspace_path(&self, id: WorkspaceId) -> PathBuf {
        self.home.join("workspaces").join(format!("{id}.json"))
    }

    fn journal_path(&self, root: AgentId) -> PathBuf {
        self.home
            .join("journal")
            .join(format!("archive-{root}.json"))
    }

    // ---- agents -------------------------------------------------------------------------

    /// Reads every agent record. Unreadable files are moved to `quarantine/`; leftover temp
    /// files of interrupted writes are removed (they were never acknowledged).
    pub fn load_agents(&self) -> Result<Loaded<Agent>, StoreError> {
        let root = self.home.join("agents");
        let mut loaded = Loaded::default();
        let mut seen: HashMap<AgentId, (PathBuf, Timestamp)> = HashMap::new();
        for dir in read_dir_sorted(&root)? {
            if !dir.is_dir() {
                continue;
            }
            for path in read_dir_sorted(&dir)? {
                let Some(stem) = record_stem(&path) else {
                    continue;
                };
                match Self::read_agent(&path, &stem) {
                    Ok(Some(agent)) => match seen.get(&agent.id) {
                        // The same id twice (a copied file): the newer wins, the other goes.
                        Some((_, at)) if *at >= agent.updated_at => {
                            loaded
                                .quarantined
                                .push(self.quarantine(&path, "duplicate agent id"));
                        }
                        _ => {
                            if let Some((old, _)) =
                                seen.insert(agent.id, (path.clone(), agent.updated_at))
                            {
                                loaded.records.retain(|a: &Agent| a.id != agent.id);
                                loaded
                                    .quarantined
                                    .push(self.quarantine(&old, "duplicate agent id"));
                            }
                            loaded.records.push(agent);
                        }
                    },
                    Ok(None) => loaded.skipped_newer.push(path),
                    Err(reason) => loaded.quarantined.push(self.quarantine(&path, &reason)),
                }
            }
        }
        Ok(loaded)
    }

    /// `Ok(None)`: written by a newer drover. `Err`: why the file is damaged.
    fn read_agent(path: &Path, stem: &str) -> Result<Option<Agent>, String> {
        let bytes = fs::read(path).map_err(|e| format!("unreadable: {e}"))?;
        let doc: AgentDoc = match serde_json::from_slice(&bytes) {
            Ok(doc) => doc,
            Err(e) => {
                // A newer document may fail our schema; look at its version before calling it
                // damaged.
                if doc_version(&bytes).is_some_and(|v| v > AGENT_DOC_VERSION) {
                    return Ok(None);
                }
                return Err(format!("not a valid agent record: {e}"));
            }
        };
        if doc.version > AGENT_DOC_VERSION {
            return Ok(None);
        }
        if doc.id.to_string() != stem {
            return Err(format!(
                "file name `{stem}.json` does not match the record's id `{}`",
                doc.id
            ));
        }
        if !doc.cwd.is_absolute() {
            return Err(format!("cwd `{}` is not absolute", doc.cwd.display()));
        }
        Ok(Some(doc.into_agent()))
    }

    /// Writes one record atomically.
    pub fn write_agent(&self, agent: &Agent) -> Result<(), StoreError> {
        let path = self.agent_path(agent.id, &agent.cwd);
        let bytes = encode(&path, &AgentDoc::from_agent(agent))?;
        ensure_dir(path.parent().unwrap_or(&self.home))?;
        write_atomic(&path, &bytes)
    }

    /// Writes several records as one operation: every temp file is written and synced first,
    /// then all are renamed into place, then each folder is synced once. If anything fails the
    /// files already replaced are written back from `before`, so the disk is as it was.
    ///
    /// `changes` pairs each new record with the one it replaces (`None` for a new agent).
    pub fn write_agents(&self, changes: &[(Option<&Agent>, &Agent)]) -> Result<(), StoreError> {
        match changes {
            [] => return Ok(()),
            [(_, one)] => return self.write_agent(one),
            _ => {}
        }
        let mut staged = Vec::with_capacity(changes.len());
        let result = (|| {
            for (_, agent) in changes {
                let path = self.agent_path(agent.id, &agent.cwd);
                let bytes = encode(&path, &AgentDoc::from_agent(agent))?;
                ensure_dir(path.parent().unwrap_or(&self.home))?;
                let tmp = stage(&path, &bytes)?;
                staged.push((tmp, path));
            }
            Ok(())
        })();
        if let Err(e) = result {
            for (tmp, _) in &staged {
                let _ = fs::remove_file(tmp);
            }
            return Err(e);
        }
        let mut dirs: Vec<&Path> = Vec::new();
        for (i, (tmp, path)) in staged.iter().enumerate() {
            if let Err(source) = fs::rename(tmp, path) {
                for (tmp, _) in &staged[i..] {
                    let _ = fs::remove_file(tmp);
                }
                self.restore(&changes[..i]);
                return Err(StoreError::io("replace", path)(source));
            }
            let dir = path.parent().unwrap_or(&self.home);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// Puts back the records a failed batch had already replaced (best effort: the batch
    /// failed, the error is being reported, a second failure here can only be logged).
    fn restore(&self, replaced: &[(Option<&Agent>, &Agent)]) {
        for (before, after) in replaced {
            let result = match before {
                Some(before) => self.write_agent(before),
                None => fs::remove_file(self.agent_path(after.id, &after.cwd)).map_err(
                    StoreError::io("remove", &self.agent_path(after.id, &after.cwd)),
                ),
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "could not roll back a failed batch write");
            }
        }
    }

    /// Moves a damaged file into `quarantine/`, keeping its folder and name in the new name.
    fn quarantine(&self, path: &Path, reason: &str) -> Quarantined {
        let folder = path
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stamp = Timestamp::now().as_millisecond();
        let target = self
            .home
            .join("quarantine")
            .join(format!("{stamp}-{folder}-{}", file_name(path)));
        let moved_to = match fs::rename(path, &target) {
            Ok(()) => {
                tracing::error!(path = %path.display(), moved_to = %target.display(), %reason,
                    "damaged record moved to quarantine");
                Some(target)
            }
            Err(e) => {
                tracing::error!(path = %path.display(), %reason, error = %e,
                    "damaged record could not be moved to quarantine; skipped");
                None
            }
        };
        Quarantined {
            original: path.to_path_buf(),
            moved_to,
            reason: reason.to_string(),
        }
    }

    // ---- workspaces ---------------------------------------------------------------------

    pub fn load_workspaces(&self) -> Result<Loaded<Workspace>, StoreError> {
        let mut loaded = Loaded::default();
        for path in read_dir_sorted(&self.home.join("workspaces"))? {
            let Some(stem) = record_stem(&path) else {
                continue;
            };
            let read = || -> Result<Option<Workspace>, String> {
                let bytes = fs::read(&path).map_err(|e| format!("unreadable: {e}"))?;
                if doc_version(&bytes).is_some_and(|v| v > WORKSPACE_DOC_VERSION) {
                    return Ok(None);
                }
                let doc: WorkspaceDoc = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("not a valid workspace record: {e}"))?;
                if doc.id.to_string() != stem {
                    return Err(format!("file name does not match the id `{}`", doc.id));
                }
                Ok(Some(doc.into_workspace()))
            };
            match read() {
                Ok(Some(ws)) => loaded.records.push(ws),
                Ok(None) => loaded.skipped_newer.push(path),
                Err(reason) => loaded.quarantined.push(self.quarantine(&path, &reason)),
            }
        }
        Ok(loaded)
    }

    pub fn write_workspace(&self, ws: &Workspace) -> Result<(), StoreError> {
        let path = self.workspace_path(ws.id);
        let bytes = encode(&path, &WorkspaceDoc::from_workspace(ws))?;
        write_atomic(&path, &bytes)
    }

    // ---- journal ------------------------------------------------------------------------

    pub fn write_archive_journal(&self, journal: &ArchiveJournal) -> Result<(), StoreError> {
        let path = self.journal_path(journal.root);
        write_atomic(&path, &encode(&path, journal)?)
    }

    pub fn remove_archive_journal(&self, root: AgentId) -> Result<(), StoreError> {
        let path = self.journal_path(root);
        fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
        sync_dir(&self.home.join("journal"))
    }

    /// Removes the temp files interrupted writes left in the home itself (`config.toml`'s by
    /// a sign-in, `hosts.json`'s...): never acknowledged, and a sign-in's holds a key. Only
    /// those whose writer (the pid in the name) is gone: a `drover` writing one now keeps it.
    pub fn remove_home_leftovers(&self) {
        let Ok(paths) = read_dir_sorted(&self.home) else {
            return;
        };
        for path in paths {
            let name = file_name(&path);
            if !is_temp_name(&name) || !path.is_file() {
                continue;
            }
            let writer = name
                .rsplit_once(".tmp-")
                .and_then(|(_, tail)| tail.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            let gone = writer.is_some_and(|pid| {
                pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists()
            });
            if gone {
                remove_leftover(&path);
            }
        }
    }

    /// Cascades that were being written when the process died, oldest first.
    pub fn load_archive_journals(&self) -> Result<Loaded<ArchiveJournal>, StoreError> {
        let mut loaded = Loaded::default();
        for path in read_dir_sorted(&self.home.join("journal"))? {
            let name = file_name(&path);
            if is_temp_name(&name) {
                remove_leftover(&path);
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    let reason = format!("unreadable: {e}");
                    loaded.quarantined.push(self.quarantine(&path, &reason));
                    continue;
                }
            };
            if doc_version(&bytes).is_some_and(|v| v > JOURNAL_DOC_VERSION) {
                loaded.skipped_newer.push(path);
                continue;
            }
            match serde_json::from_slice(&bytes) {
                Ok(journal) => loaded.records.push(journal),
                Err(e) => {
                    let reason = format!("not a valid archive journal: {e}");
                    loaded.quarantined.push(self.quarantine(&path, &reason));
                }
            }
        }
        loaded
            .records
            .sort_by_key(|j: &ArchiveJournal| j.archived_at);
        Ok(loaded)
    }

    /// Removes `agent` from every archive journal still on disk (normally there is none: a
    /// journal outlives its cascade only when removing it failed).
    pub fn drop_from_archive_journals(&self, agent: AgentId) -> Result<(), StoreError> {
        for path in read_dir_sorted(&self.home.join("journal"))? {
            if is_temp_name(&file_name(&path)) {
                continue;
            }
            let Ok(mut journal) = fs::read(&path)
                .map_err(drop)
                .and_then(|b| serde_json::from_slice::<ArchiveJournal>(&b).map_err(drop))
            else {
                continue;
            };
            if !journal.agents.contains(&agent) {
                continue;
            }
            journal.agents.retain(|a| *a != agent);
            if journal.agents.is_empty() {
                fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
                sync_dir(&self.home.join("journal"))?;
            } else {
                write_atomic(&path, &encode(&path, &journal)?)?;
            }
        }
        Ok(())
    }

    pub fn new_archive_journal(
        root: AgentId,
        archived_at: Timestamp,
        agents: Vec<AgentId>,
    ) -> ArchiveJournal {
        ArchiveJournal {
            version: JOURNAL_DOC_VERSION,
            root,
            archived_at,
            agents,
        }
    }
}

/// The folder name for a cwd: `/home/me/repo` becomes `-home-me-repo`. Characters other than
/// ASCII letters, digits, `.`, `_` and `-` become `-`; a very long path is cut and suffixed
/// with a hash of the whole so two long paths do not share a folder by accident.
pub fn cwd_dir_name(cwd: &Path) -> String {
    let raw = cwd.to_string_lossy();
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() || name.chars().all(|c| c == '.') {
        name = format!("-{name}");
    }
    if name.len() > MAX_DIR_NAME {
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let hash = raw.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        name.truncate(MAX_DIR_NAME - 17);
        name = format!("{name}-{hash:016x}");
    }
    name
}

// ---- file helpers ---------------------------------------------------------------------------

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The id in a record file's name (`<id>.json`): `None` for any other file, and for the
/// leftover temp file of an interrupted write, which it removes (it was never acknowledged).
fn record_stem(path: &Path) -> Option<String> {
    let name = file_name(path);
    if is_temp_name(&name) {
        remove_leftover(path);
        return None;
    }
    name.strip_suffix(".json").map(str::to_string)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

fn remove_leftover(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed the temp file of an interrupted write");
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover temp file");
        }
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(StoreError::io("read folder", dir))? {
        paths.push(entry.map_err(StoreError::io("read folder", dir))?.path());
    }
    paths.sort();
    Ok(paths)
}

fn doc_version(bytes: &[u8]) -> Option<u32> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    serde_json::from_slice::<Versioned>(bytes)
        .ok()
        .map(|v| v.version)
}

fn encode<T: Serialize>(path: &Path, doc: &T) -> Result<Vec<u8>, StoreError> {
    let mut bytes = serde_json::to_vec_pretty(doc).map_err(|source| StoreError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Creates `dir` if missing, syncing its parent so the new folder itself is durable.
fn ensure_dir(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    crate::private::create_dir_all(dir).map_err(StoreError::io("create folder", dir))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("sync folder", dir))
}

/// Writes `bytes` to a fresh temp file beside `path` and syncs it; returns the temp path.
fn stage(path: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        file_name(path),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = crate::private::open_options()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
    match written {
        Ok(()) => Ok(tmp),
        Err(source) => {
            let _ = fs::remove_file(&tmp);
            // Name the file the caller asked for: the temp name means nothing to a user.
            Err(StoreError::io("write", path)(source))
        }
    }
}

/// Temp file in the same folder, fsync, rename over `path`, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = stage(path, bytes)?;
    if let Err(source) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("replace", path)(source));
    }
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

// ---- documents ------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentDoc {
    version: u32,
    id: AgentId,
    provider: String,
    cwd: PathBuf,
    workspace_id: WorkspaceId,
    created_at: Timestamp,
    updated_at: Timestamp,
    last_activity_at: Timestamp,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    last_status: AgentStatus,
    #[serde(default)]
    last_error: Option<String>,
    #[serde(default)]
    archived_at: Option<Timestamp>,
    #[serde(default)]
    requires_attention: bool,
    #[serde(default)]
    attention_reason: Option<AttentionReason>,
    #[serde(default)]
    attention_timestamp: Option<Timestamp>,
    #[serde(default)]
    auto_archive: bool,
    #[serde(default)]
    config: ConfigDoc,
    #[serde(default)]
    resume_handle: Option<ResumeDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_failure: Option<StartFailureDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limited: Option<LimitedDoc>,
    #[serde(default, skip_serializing_if = "SpendDoc::is_unknown")]
    spend: SpendDoc,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<crate::Budget>,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartFailureDoc {
    at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sign_in: Option<Vec<AuthMethod>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpendDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    currency: Option<String>,
}

impl SpendDoc {
    fn is_unknown(&self) -> bool {
        self.tokens.is_none() && self.cost.is_none()
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LimitedDoc {
    at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reset_at: Option<Timestamp>,
    retry_at: Timestamp,
    #[serde(default)]
    count: u32,
    #[serde(default)]
    error: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigDoc {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    mode_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    effort: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    options: BTreeMap<String, String>,
    #[serde(default)]
    permission_policy: PermissionPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_interrupt: Option<OnInterrupt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_limit: Option<OnLimit>,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeDoc {
    acp_session_id: String,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

// Keys this version does not know inside `config` and `resumeHandle` ride in the agent's
// `unknown` map under the object's own name (never an unknown top-level key, since it is a
// known one) and go back where they came from on the next write.
const CONFIG_KEY: &str = "config";
const RESUME_KEY: &str = "resumeHandle";
const SESSION_KEY: &str = "acpSessionId";

fn take_object(
    map: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> serde_json::Map<String, serde_json::Value> {
    match map.remove(key) {
        Some(serde_json::Value::Object(object)) => object,
        _ => serde_json::Map::new(),
    }
}

impl AgentDoc {
    fn from_agent(a: &Agent) -> AgentDoc {
        let mut unknown = a.unknown.clone();
        let config_unknown = take_object(&mut unknown, CONFIG_KEY);
        let mut resume_unknown = take_object(&mut unknown, RESUME_KEY);
        // What a newer drover kept beside a session belongs to that session only.
        let same_session = resume_unknown.remove(SESSION_KEY).is_some_and(|s| {
            a.resume
                .as_ref()
                .is_some_and(|r| s.as_str() == Some(r.acp_session_id.as_str()))
        });
        if !same_session {
            resume_unknown.clear();
        }
        AgentDoc {
            version: AGENT_DOC_VERSION,
            id: a.id,
            provider: a.provider.clone(),
            cwd: a.cwd.clone(),
            workspace_id: a.workspace_id,
            created_at: a.created_at,
            updated_at: a.updated_at,
            last_activity_at: a.last_activity_at,
            title: a.title.clone(),
            labels: a.labels.clone(),
            last_status: a.status,
            last_error: a.last_error.clone(),
            archived_at: a.archived_at,
            requires_attention: a.attention.is_some(),
            attention_reason: a.attention.map(|x| x.reason),
            attention_timestamp: a.attention.map(|x| x.at),
            auto_archive: a.auto_archive,
            config: ConfigDoc {
                model: a.config.model.clone(),
                mode_id: a.config.mode.clone(),
                effort: a.config.effort.clone(),
                options: a.config.options.clone(),
                permission_policy: a.config.permission_policy,
                on_interrupt: a.config.on_interrupt,
                on_limit: a.config.on_limit,
                unknown: config_unknown,
            },
            resume_handle: a.resume.as_ref().map(|r| ResumeDoc {
                acp_session_id: r.acp_session_id.clone(),
                unknown: resume_unknown,
            }),
            start_failure: a.start_failure.as_ref().map(|f| StartFailureDoc {
                at: f.at,
                sign_in: f.sign_in.clone(),
            }),
            limited: a.limited.as_ref().map(|l| LimitedDoc {
                at: l.at,
                reset_at: l.reset_at,
                retry_at: l.retry_at,
                count: l.count,
                error: l.error.clone(),
            }),
            spend: SpendDoc {
                tokens: a.spend.tokens,
                cost: a.spend.cost,
                currency: a.spend.currency.clone(),
            },
            budget: a.budget.clone(),
            unknown,
        }
    }

    fn into_agent(self) -> Agent {
        let attention = match (self.requires_attention, self.attention_reason) {
            (true, Some(reason)) => Some(Attention {
                reason,
                at: self.attention_timestamp.unwrap_or(self.updated_at),
            }),
            _ => None,
        };
        let mut unknown = self.unknown;
        if !self.config.unknown.is_empty() {
            unknown.insert(
                CONFIG_KEY.to_string(),
                serde_json::Value::Object(self.config.unknown),
            );
        }
        let resume = self.resume_handle.map(|r| {
            if !r.unknown.is_empty() {
                let mut stash = r.unknown;
                stash.insert(SESSION_KEY.to_string(), r.acp_session_id.clone().into());
                unknown.insert(RESUME_KEY.to_string(), serde_json::Value::Object(stash));
            }
            ResumeHandle {
                acp_session_id: r.acp_session_id,
            }
        });
        Agent {
            id: self.id,
            provider: self.provider,
            cwd: self.cwd,
            workspace_id: self.workspace_id,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_activity_at: self.last_activity_at,
            title: self.title,
            labels: self.labels,
            status: self.last_status,
            last_error: self.last_error,
            archived_at: self.archived_at,
            attention,
            auto_archive: self.auto_archive,
            config: ProviderConfig {
                model: self.config.model,
                mode: self.config.mode_id,
                effort: self.config.effort,
                options: self.config.options,
                permission_policy: self.config.permission_policy,
                on_interrupt: self.config.on_interrupt,
                on_limit: self.config.on_limit,
            },
            resume,
            start_failure: self.start_failure.map(|f| StartFailure {
                at: f.at,
                sign_in: f.sign_in,
            }),
            limited: self.limited.map(|l| Limited {
                at: l.at,
                reset_at: l.reset_at,
                retry_at: l.retry_at,
                count: l.count,
                error: l.error,
            }),
            spend: Spend {
                tokens: self.spend.tokens,
                cost: self.spend.cost,
                currency: self.spend.currency,
            },
            budget: self.budget,
            unknown,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkspaceDoc {
    version: u32,
    id: WorkspaceId,
    kind: WorkspaceKind,
    path: PathBuf,
    name: String,
    created_at: Timestamp,
    updated_at: Timestamp,
    #[serde(default)]
    archived_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    worktree: Option<WorktreeDoc>,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

/// The `worktree` object of a workspace drover made a git worktree for.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorktreeDoc {
    source: PathBuf,
    branch: String,
    base: String,
    base_commit: String,
    #[serde(default)]
    copied: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_by: Option<AgentId>,
    #[serde(flatten)]
    unknown: serde_json::Map<String, serde_json::Value>,
}

// Like `config` in an agent record: keys this version does not know inside `worktree` ride in
// the workspace's `unknown` map under this key.
const WORKTREE_KEY: &str = "worktree";

impl WorkspaceDoc {
    fn from_workspace(w: &Workspace) -> WorkspaceDoc {
        let mut unknown = w.unknown.clone();
        let worktree_unknown = take_object(&mut unknown, WORKTREE_KEY);
        WorkspaceDoc {
            version: WORKSPACE_DOC_VERSION,
            id: w.id,
            kind: w.kind,
            path: w.path.clone(),
            name: w.name.clone(),
            created_at: w.created_at,
            updated_at: w.updated_at,
            archived_at: w.archived_at,
            worktree: w.worktree.as_ref().map(|t| WorktreeDoc {
                source: t.source.clone(),
                branch: t.branch.clone(),
                base: t.base.clone(),
                base_commit: t.base_commit.clone(),
                copied: t.copied.clone(),
                created_by: t.created_by,
                unknown: worktree_unknown,
            }),
            unknown,
        }
    }

    fn into_workspace(self) -> Workspace {
        let mut unknown = self.unknown;
        let worktree = self.worktree.map(|t| {
            if !t.unknown.is_empty() {
                unknown.insert(
                    WORKTREE_KEY.to_string(),
                    serde_json::Value::Object(t.unknown),
                );
            }
            WorktreeInfo {
                source: t.source,
                branch: t.branch,
                base: t.base,
                base_commit: t.base_commit,
                copied: t.copied,
                created_by: t.created_by,
            }
        });
        Workspace {
            id: self.id,
            kind: self.kind,
            path: self.path,
            name: self.name,
            created_at: self.created_at,
            updated_at: self.updated_at,
            archived_at: self.archived_at,
            worktree,
            unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_folder_names() {
        assert_eq!(cwd_dir_name(Path::new("/home/me/repo")), "-home-me-repo");
        assert_eq!(cwd_dir_name(Path::new("/a b/c:d")), "-a-b-c-d");
        assert_eq!(cwd_dir_name(Path::new("/")), "-");
        let long_a = format!("/{}", "a".repeat(400));
        let long_b = format!("/{}b", "a".repeat(399));
        let (na, nb) = (
            cwd_dir_name(Path::new(&long_a)),
            cwd_dir_name(Path::new(&long_b)),
        );
        assert!(na.len() <= MAX_DIR_NAME && nb.len() <= MAX_DIR_NAME);
        assert_ne!(na, nb);
    }
}
