//! `$DROVER_HOME/jobs/<owner>/<job>.json`: one durable record per job (what runs, where, how
//! it ended, and the process group a killed daemon's successor must end), written atomically;
//! loading them at boot, and the boot reconcile that ends what a daemon killed by a signal
//! left of its jobs and marks them `lost`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_core::AgentId;
use drover_core::store::{StoreError, write_atomic};
use jiff::Timestamp;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use super::output::{Segments, older_path};
use drover_core::procfs::Stat;

/// The folder of the jobs under `$DROVER_HOME`.
pub const DIR: &str = "jobs";
/// The document version this build writes.
pub const VERSION: u32 = 1;
/// The variable that marks every process of a job (`<owner>/<job>`), so the next boot finds
/// the ones that left the job's process group.
pub const MARKER_VAR: &str = "DROVER_JOB_MARKER";

/// How a job is doing, and why drover killed one: the protocol's, stored as their names.
pub use drover_protocol::{JobStatus, KillCause};

/// The on-disk record (and, cloned, what the operations report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub version: u32,
    /// `job-<n>`, unique in the home.
    pub id: String,
    pub owner: AgentId,
    /// What runs, for people: the shell command, or an ACP terminal's program and arguments.
    pub command: String,
    /// What was executed (`sh -c <command>` for a shell command).
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// The variables the caller added to the agent's allowlist.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `user`, `agent:<id>`, `terminal`.
    pub started_by: String,
    pub started_at: Timestamp,
    #[serde(default)]
    pub ended_at: Option<Timestamp>,
    pub status: JobStatus,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    /// How it ended, for people: `exit status 0`, `signal 15 (SIGTERM)`.
    #[serde(default)]
    pub exit: Option<String>,
    #[serde(default)]
    pub killed_by: Option<KillCause>,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    pub notify_on_exit: bool,
    /// Opened by the agent as an ACP client terminal.
    #[serde(default)]
    pub terminal: bool,
    /// How many job exits in a row woke the turn that started it (see the self-wake cap).
    #[serde(default)]
    pub wake_depth: u32,
    pub pid: u32,
    /// Its process group (the job is its leader).
    pub pgid: u32,
    /// Field 22 of `/proc/<pid>/stat`: with the pid, names the process uniquely.
    pub start_time: u64,
    pub daemon_pid: u32,
    /// Bytes written so far (final once it ended).
    #[serde(default)]
    pub output_bytes: u64,
    /// Where the log's segments start (see `output`).
    #[serde(default)]
    pub older_start: Option<u64>,
    #[serde(default)]
    pub current_start: u64,
    #[serde(default)]
    pub spilled: u64,
    /// Why the log stopped before the output's end, if it did.
    #[serde(default)]
    pub spill_error: Option<String>,
    /// It ended (or was found lost), its owner asked to hear of it, and its exit notice is not
    /// known to be queued: the next boot queues it (under [`JobRecord::notice_id`]) unless the
    /// owner's inbox or timeline names it already.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notice_pending: bool,
}

impl JobRecord {
    pub fn segments(&self) -> Segments {
        Segments {
            older_start: self.older_start,
            current_start: self.current_start,
            spilled: self.spilled,
        }
    }

    pub fn is_running(&self) -> bool {
        self.status == JobStatus::Running
    }

    /// The id of the message its exit notice is queued under: the same at every try, so a
    /// notice found in the owner's inbox or timeline is not queued again. The start time
    /// keeps it apart from a job of the same id whose files were deleted.
    pub fn notice_id(&self) -> String {
        format!("{}-exit-{}", self.id, self.started_at.as_millisecond())
    }
}

pub fn owner_dir(home: &Path, owner: AgentId) -> PathBuf {
    home.join(DIR).join(owner.to_string())
}

pub fn path(home: &Path, owner: AgentId, id: &str) -> PathBuf {
    owner_dir(home, owner).join(format!("{id}.json"))
}

pub fn log_path(home: &Path, owner: AgentId, id: &str) -> PathBuf {
    owner_dir(home, owner).join(format!("{id}.log"))
}

/// Writes the record: temporary file, fsync, rename, folder fsync.
pub fn write(home: &Path, record: &JobRecord) -> Result<(), StoreError> {
    let dir = owner_dir(home, record.owner);
    drover_core::private::create_dir_all(&dir).map_err(StoreError::io("create", &dir))?;
    let target = path(home, record.owner, &record.id);
    let bytes = serde_json::to_vec_pretty(record).map_err(|source| StoreError::Encode {
        path: target.clone(),
        source,
    })?;
    write_atomic(&target, &bytes)
}

/// Deletes an ended job's files: its record first, so a crash halfway leaves only log
/// segments without a record, which the next [`load`] deletes.
pub fn remove(home: &Path, record: &JobRecord) {
    let log = log_path(home, record.owner, &record.id);
    for file in [path(home, record.owner, &record.id), older_path(&log), log] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "cannot delete an old job's file");
            }
        }
    }
}

/// The number of a `job-<n>` id.
pub fn number(id: &str) -> Option<u64> {
    id.strip_prefix("job-")?.parse().ok()
}

/// What [`load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<JobRecord>,
    /// The highest `job-<n>` any file is named after or names, those left alone included: a
    /// new job's number is past it, so no file is ever taken over.
    pub highest: u64,
}

/// Every readable record under `$DROVER_HOME/jobs`. One that cannot be read, was written by
/// a newer drover, or is not where its id and owner put it is logged and left in place (never
/// rewritten); log segments whose record is gone (a deletion cut off) are deleted.
pub fn load(home: &Path) -> Loaded {
    let mut found = Vec::new();
    let mut highest = 0;
    let Ok(owners) = std::fs::read_dir(home.join(DIR)) else {
        return Loaded::default();
    };
    for owner in owners.flatten() {
        let Ok(files) = std::fs::read_dir(owner.path()) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            if let Some(id) = log_owner(&path) {
                highest = highest.max(number(id).unwrap_or(0));
                if !path.with_file_name(format!("{id}.json")).exists() {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let Some(named) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .filter(|id| number(id).is_some())
            else {
                continue;
            };
            highest = highest.max(number(named).unwrap_or(0));
            let parsed = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            let newer = parsed
                .as_ref()
                .and_then(|v| v.get("version"))
                .and_then(serde_json::Value::as_u64)
                .is_some_and(|v| v > u64::from(VERSION));
            let record = parsed.and_then(|v| serde_json::from_value::<JobRecord>(v).ok());
            if let Some(n) = record.as_ref().and_then(|r| number(&r.id)) {
                highest = highest.max(n);
            }
            let in_place = record.as_ref().is_some_and(|r| {
                r.id == named && owner.file_name().to_str() == Some(r.owner.to_string().as_str())
            });
            match record {
                _ if newer => {
                    tracing::warn!(path = %path.display(), "left alone a job record written by a newer drover");
                }
                Some(record) if in_place => found.push(record),
                Some(record) => {
                    tracing::error!(path = %path.display(), id = %record.id, owner = %record.owner,
                        "a job record names another job or owner; left in place");
                }
                None => {
                    tracing::error!(path = %path.display(), "cannot read a job record; left in place");
                }
            }
        }
    }
    found.sort_by_key(|r| number(&r.id));
    Loaded {
        records: found,
        highest,
    }
}

/// The job id a log segment (`job-<n>.log`, `job-<n>.log.1`) belongs to.
fn log_owner(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    let id = name
        .strip_suffix(".log")
        .or_else(|| name.strip_suffix(".log.1"))?;
    number(id).map(|_| id)
}

/// Ends what is left of jobs that were running when a daemon died: the recorded group when
/// its leader is alive with the recorded start time or gone with members left (a pid that
/// still names a live group is never given to a new process), and every process carrying
/// the job's marker. Then marks them `lost` (with the output the log holds) and writes them.
/// Blocking; call it before anything can start a job.
pub fn reconcile(home: &Path, records: &mut [JobRecord]) -> usize {
    let unfinished: Vec<usize> = (0..records.len())
        .filter(|i| records[*i].is_running())
        .collect();
    if unfinished.is_empty() {
        return 0;
    }
    let table = drover_core::procfs::processes();
    let own_group = nix::unistd::getpgrp().as_raw().cast_unsigned();
    let mut killed: Vec<u32> = Vec::new();
    for &i in &unfinished {
        let record = &records[i];
        let ours = match table.iter().find(|(pid, _)| *pid == record.pid) {
            Some((_, stat)) => stat.start_time == record.start_time,
            None => table.iter().any(|(_, s)| s.pgid == record.pgid),
        };
        if ours && record.pgid != own_group {
            drover_core::child::signal_group(record.pgid, Some(Signal::SIGKILL));
        }
        let marker = format!("{}/{}", record.owner, record.id);
        for (pid, stat) in &table {
            let in_group = ours && stat.pgid == record.pgid;
            if in_group
                || drover_core::procfs::environ_var(*pid, MARKER_VAR).as_deref() == Some(&marker)
            {
                tracing::warn!(pid, job = %record.id, "ending a job process a previous daemon left running");
                if let Ok(raw) = i32::try_from(*pid)
                    && raw > 1
                {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), Signal::SIGKILL);
                }
                killed.push(*pid);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && killed
            .iter()
            .any(|pid| Stat::read(*pid).is_some_and(|s| !s.zombie))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let now = Timestamp::now();
    for &i in &unfinished {
        let record = &mut records[i];
        record.status = JobStatus::Lost;
        record.ended_at = Some(now);
        record.exit = Some("the daemon died while it ran".to_string());
        // What the log holds is all there is.
        let log = log_path(home, record.owner, &record.id);
        let current = std::fs::metadata(&log).map_or(0, |m| m.len());
        record.spilled = record.current_start + current;
        record.output_bytes = record.spilled;
        record.notice_pending = record.notify_on_exit;
        if let Err(e) = write(home, record) {
            tracing::warn!(job = %record.id, error = %e, "cannot record a lost job");
        }
    }
    unfinished.len()
}
