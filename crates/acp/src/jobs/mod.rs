//! Jobs: shell commands the daemon runs in the background on behalf of one agent (its
//! owner), and the processes behind the ACP client terminals agents open.
//!
//! A job runs in a process group of its own, started from the spawner thread so it dies with
//! the daemon (`core::child::spawn_tied`), in the owner's cwd by default, with an explicit
//! environment: the agents' allowlist, the caller's additions and the job's marker. Its
//! stdout and stderr go to one pipe, read by one thread into [`output::Output`] (a ring in
//! memory, the log on disk). Its record (`record`) is written before the start is
//! acknowledged and again when it ends; a daemon killed meanwhile is succeeded by a boot that
//! ends what is left of the job and marks it `lost`.
//!
//! Rules:
//! - Kill is TERM to the group, a grace of [`KILL_GRACE`], then KILL. When the job's leader
//!   exits on its own, what it left in its group is killed (nothing outlives its job).
//! - A job that ends tells its owner with a queued followup (exit status, the tail of its
//!   output) through the owner's durable inbox, never an interruption, unless
//!   `notifyOnExit: false`. A turn woken by a job's notice that starts a job whose notice
//!   wakes a turn ... is cut at [`MAX_SELF_WAKES`]: that notice is queued as an `inject`
//!   (context for the next turn, which something else must start).
//! - The owner's runtime ending (hibernation, a crash of the agent) does not end its jobs;
//!   it ends the ACP terminals that runtime opened (they belong to its ACP session, and keep
//!   it from hibernating while they run). The
//!   archive of the owner refuses while a job runs (the `job` activity family), and with
//!   `stopActivity` kills them. Daemon shutdown kills every job (`killedBy: shutdown`).

pub mod output;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use drover_core::admission::{ActivityFamily, ActivityItem};
use drover_core::child::{self, signal_group};
use drover_core::error::ErrorCode;
use drover_core::inbox::{Delivery, InboxMessage};
use drover_core::store::StoreError;
use drover_core::view::AgentsView;
use drover_core::{Agent, AgentId, BoxFuture};
use jiff::Timestamp;
use nix::sys::signal::Signal;
use tokio::sync::{broadcast, watch};

use crate::Shared;
use output::{Chunk, Output, Writer};
pub use record::{JobRecord, JobStatus, KillCause};

/// Between TERM and KILL when a job is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// How many job exits in a row may wake their owner (see the module's rules).
pub const MAX_SELF_WAKES: u32 = 5;
/// How many ended jobs each agent keeps, records and logs: when one more ends (and at boot)
/// the oldest beyond these are deleted.
pub const KEEP_ENDED: usize = 20;
/// The most lines and bytes of output an exit notice quotes.
const NOTICE_LINES: usize = 20;
const NOTICE_BYTES: usize = 4096;
/// How long an exit notice may wait to be queued.
const NOTICE_TIMEOUT: Duration = Duration::from_secs(30);
/// How many job events a subscriber may fall behind before it lags.
const EVENT_CAPACITY: usize = 1024;
/// One read of a job's pipe.
const READ_BYTES: usize = 64 * 1024;

/// Why a job operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("job `{0}` not found")]
    Unknown(String),
    #[error("`{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("job could not start `{command}` in `{cwd}`: {source}")]
    Spawn {
        command: String,
        cwd: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// Its agent was archived (or its lineage was) while it started.
    #[error(transparent)]
    Refused(#[from] drover_core::RegistryError),
}

impl JobError {
    pub fn code(&self) -> ErrorCode {
        match self {
            JobError::Unknown(_) => ErrorCode::UnknownJob,
            JobError::Invalid { .. } => ErrorCode::InvalidInput,
            JobError::Spawn { .. } => ErrorCode::JobStartFailed,
            JobError::Store(_) => ErrorCode::StoreFailed,
            JobError::ShuttingDown => ErrorCode::ShuttingDown,
            JobError::Refused(e) => e.code(),
        }
    }

    fn invalid(field: &'static str, message: impl Into<String>) -> JobError {
        JobError::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub owner: AgentId,
    pub command: JobCommand,
    pub cwd: PathBuf,
    /// Added to the agents' allowlist.
    pub env: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
    pub notify_on_exit: bool,
    /// `user`, `agent:<id>`, `terminal`.
    pub started_by: String,
    /// Opened as an ACP terminal.
    pub terminal: bool,
}

#[derive(Debug, Clone)]
pub enum JobCommand {
    /// Run by `sh -c`.
    Shell(String),
    /// A program and its arguments (ACP terminals).
    Exec { program: String, args: Vec<String> },
}

/// One follower of a job's output: it reads by offset and waits for the job to write more
/// (or end), so a subscription reads the next chunk only when its client has room for it.
#[derive(Debug)]
pub struct JobReader {
    job: Arc<Job>,
    /// The output's end, as the writer announces it.
    end: watch::Receiver<u64>,
    /// The job ended and its record says how; its output's end is final.
    done: watch::Receiver<bool>,
}

impl JobReader {
    /// Waits until the output reaches past `offset`, or the job ended.
    pub async fn wait_past(&mut self, offset: u64) {
        loop {
            if *self.end.borrow_and_update() > offset || *self.done.borrow_and_update() {
                return;
            }
            tokio::select! {
                changed = self.end.changed() => if changed.is_err() { return },
                changed = self.done.changed() => if changed.is_err() { return },
            }
        }
    }

    /// The first offset still kept.
    pub fn first_kept(&self) -> u64 {
        self.job.output.first_kept()
    }

    /// Reads up to `max` bytes from `offset`, and whether the job had ended before the read
    /// (so `chunk.end` is its final size).
    pub fn read(&self, offset: u64, max: usize) -> (Chunk, bool) {
        // Ended first: read after, the chunk's end is then the last byte.
        let ended = *self.done.borrow();
        (self.job.output.read(offset, max), ended)
    }

    /// The job's record now.
    pub fn record(&self) -> JobRecord {
        self.job.snapshot()
    }
}

/// A job started or ended, for live clients.
#[derive(Debug, Clone)]
pub struct JobEvent {
    pub record: JobRecord,
}

/// One job in memory.
#[derive(Debug)]
struct Job {
    record: Mutex<JobRecord>,
    output: Arc<Output>,
    /// `true` once it ended and its record says how.
    done: watch::Sender<bool>,
    kill_cause: Mutex<Option<KillCause>>,
}

impl Job {
    fn record(&self) -> MutexGuard<'_, JobRecord> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshot(&self) -> JobRecord {
        let mut record = self.record().clone();
        if record.is_running() {
            record.output_bytes = self.output.end();
        }
        record
    }
}

#[derive(Debug)]
struct Inner {
    home: PathBuf,
    next: AtomicU64,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    /// The depth of each agent's current turn: 0, or 1 + the `wakeDepth` of the job whose
    /// notice started it.
    turn_depth: Mutex<HashMap<AgentId, u32>>,
    events: broadcast::Sender<JobEvent>,
    shutting_down: AtomicBool,
    /// The runtimes, for exit notices (weak: the runtimes own the jobs).
    shared: OnceLock<Weak<Shared>>,
    /// Jobs whose exit notice is pending (found lost by this boot, or ended before a kill cut
    /// their notice off) and whose owner asked to hear how they end: told once the runtimes
    /// are up ([`Jobs::notify_lost`]).
    lost: Mutex<Vec<String>>,
}

/// The daemon's jobs (cheap to clone).
#[derive(Debug, Clone)]
pub struct Jobs(Arc<Inner>);

impl Jobs {
    /// Loads the records under `home`, ends what a killed daemon left of its running jobs and
    /// marks them `lost`. Blocking: call it at boot, before anything can start a job.
    pub fn open(home: &std::path::Path) -> (Jobs, usize) {
        let loaded = record::load(home);
        let mut records = loaded.records;
        let lost = record::reconcile(home, &mut records);
        // The jobs found lost now, and those whose exit notice a killed daemon did not queue.
        let unfinished: Vec<String> = records
            .iter()
            .filter(|r| r.notice_pending)
            .map(|r| r.id.clone())
            .collect();
        // Past every number on disk, the files boot left alone included: none is taken over.
        let next = loaded.highest + 1;
        let mut jobs = BTreeMap::new();
        for record in records {
            let Some(n) = record::number(&record.id) else {
                continue;
            };
            let output = Output::from_disk(
                record::log_path(home, record.owner, &record.id),
                record.output_bytes,
                record.segments(),
            );
            let (done, _) = watch::channel(true);
            jobs.insert(
                n,
                Arc::new(Job {
                    record: Mutex::new(record),
                    output: Arc::new(output),
                    done,
                    kill_cause: Mutex::new(None),
                }),
            );
        }
        let owners: std::collections::BTreeSet<AgentId> =
            jobs.values().map(|j| j.record().owner).collect();
        for owner in owners {
            for old in prune(&mut jobs, owner) {
                record::remove(home, &old);
            }
        }
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        (
            Jobs(Arc::new(Inner {
                home: home.to_path_buf(),
                next: AtomicU64::new(next),
                jobs: Mutex::new(jobs),
                turn_depth: Mutex::new(HashMap::new()),
                events,
                shutting_down: AtomicBool::new(false),
                shared: OnceLock::new(),
                lost: Mutex::new(unfinished),
            })),
            lost,
        )
    }

    pub(crate) fn attach(&self, shared: &Arc<Shared>) {
        let _ = self.0.shared.set(Arc::downgrade(shared));
    }

    /// Tells each owner of a job this boot found lost, or whose exit notice a killed daemon
    /// did not queue (and that asked to hear how it ends), how it ended: once, through the
    /// owner's inbox. A notice the inbox or timeline names already is not queued again; a
    /// crash before it is queued leaves it pending for the next boot.
    pub(crate) fn notify_lost(&self) {
        let ids = std::mem::take(&mut *self.0.lost.lock().unwrap_or_else(PoisonError::into_inner));
        let Some(shared) = self.0.shared.get().and_then(Weak::upgrade) else {
            return;
        };
        for id in ids {
            let Ok(job) = self.job(&id) else {
                // Pruned at boot: an owner with many newer jobs.
                continue;
            };
            let record = job.snapshot();
            if drover_core::inbox::Inbox::reached(&self.0.home, record.owner, &record.notice_id()) {
                // Queued before the kill; only its record did not say so yet.
                let jobs = self.clone();
                tokio::task::spawn_blocking(move || jobs.notice_queued(&id));
                continue;
            }
            let text = exit_notice(&record, &job.output);
            tokio::spawn(notify(
                shared.clone(),
                record.clone(),
                text,
                notice_delivery(&record),
            ));
        }
    }

    /// The job's exit notice was queued (or its owner refused it for good): its record stops
    /// saying it is pending (not once the daemon shuts down). Blocking (it writes the record).
    fn notice_queued(&self, id: &str) {
        // A daemon that shuts down writes nothing more: the next boot finds the notice queued.
        if self.0.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let Ok(job) = self.job(id) else { return };
        let record = {
            let mut record = job.record();
            if !record.notice_pending {
                return;
            }
            record.notice_pending = false;
            record.clone()
        };
        if let Err(e) = record::write(&self.0.home, &record) {
            // Pending on disk: the next boot finds the notice queued and says so then.
            tracing::warn!(job = %record.id, error = %e, "cannot record that a job's exit notice was queued");
        }
    }

    fn jobs(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Job>>> {
        self.0.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn job(&self, id: &str) -> Result<Arc<Job>, JobError> {
        record::number(id)
            .and_then(|n| self.jobs().get(&n).cloned())
            .ok_or_else(|| JobError::Unknown(id.chars().take(80).collect()))
    }

    /// Jobs started or ended, live.
    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.0.events.subscribe()
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<JobRecord> {
        let jobs: Vec<Arc<Job>> = self.jobs().values().cloned().collect();
        jobs.iter().map(|j| j.snapshot()).collect()
    }

    /// How many jobs are in each status (running, exited, killed, lost), read without copying
    /// a record: for `/metrics`.
    pub fn count_by_status(&self) -> [(JobStatus, usize); 4] {
        let mut counts = [
            (JobStatus::Running, 0),
            (JobStatus::Exited, 0),
            (JobStatus::Killed, 0),
            (JobStatus::Lost, 0),
        ];
        for job in self.jobs().values() {
            let status = job.record().status;
            if let Some((_, n)) = counts.iter_mut().find(|(s, _)| *s == status) {
                *n += 1;
            }
        }
        counts
    }

    pub fn get(&self, id: &str) -> Result<JobRecord, JobError> {
        Ok(self.job(id)?.snapshot())
    }

    /// The running jobs of `owner`.
    pub fn running_of(&self, owner: AgentId) -> Vec<JobRecord> {
        let jobs: Vec<Arc<Job>> = self.jobs().values().cloned().collect();
        jobs.iter()
            .filter(|j| {
                let r = j.record();
                r.owner == owner && r.is_running()
            })
            .map(|j| j.snapshot())
            .collect()
    }

    /// A turn of `agent` started with a message from `source` (the actor says so): the depth
    /// the jobs it starts inherit.
    pub(crate) fn turn_started(&self, agent: AgentId, source: &str) {
        let depth = source
            .strip_prefix("job:")
            .and_then(|id| self.job(id).ok())
            .map_or(0, |job| job.record().wake_depth + 1);
        self.0
            .turn_depth
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent, depth);
    }

    fn depth_of(&self, agent: AgentId) -> u32 {
        self.0
            .turn_depth
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&agent)
            .copied()
            .unwrap_or(0)
    }

    /// Starts a job; returns once its record is durable.
    pub async fn start(&self, spec: JobSpec) -> Result<JobRecord, JobError> {
        if self.0.shutting_down.load(Ordering::SeqCst) {
            return Err(JobError::ShuttingDown);
        }
        let (command, argv) = validate(&spec)?;
        let n = self.0.next.fetch_add(1, Ordering::SeqCst);
        let id = format!("job-{n}");
        let home = self.0.home.clone();
        let log = record::log_path(&home, spec.owner, &id);
        let env = job_env(&spec, &id);
        let wake_depth = if spec.started_by == "user" {
            0
        } else {
            self.depth_of(spec.owner)
        };

        let owner = spec.owner;
        let cwd = spec.cwd.clone();
        let argv_spawn = argv.clone();
        let log_dir = record::owner_dir(&home, owner);
        let spawned =
            tokio::task::spawn_blocking(move || spawn(&log_dir, log, &argv_spawn, &cwd, &env))
                .await
                .map_err(|_| JobError::ShuttingDown)?;
        let (mut child, output, writer, reader) = spawned.map_err(|source| JobError::Spawn {
            command: command.clone(),
            cwd: spec.cwd.display().to_string(),
            source,
        })?;
        let pid = child.id();
        let start_time = drover_core::procfs::Stat::read(pid).map_or(0, |s| s.start_time);
        let record = JobRecord {
            version: record::VERSION,
            id: id.clone(),
            owner,
            command,
            argv,
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
            started_by: spec.started_by.clone(),
            started_at: Timestamp::now(),
            ended_at: None,
            status: JobStatus::Running,
            exit_code: None,
            signal: None,
            exit: None,
            killed_by: None,
            duration_ms: None,
            timeout_s: spec.timeout.map(|t| t.as_secs().max(1)),
            notify_on_exit: spec.notify_on_exit,
            terminal: spec.terminal,
            wake_depth,
            pid,
            pgid: pid,
            start_time,
            daemon_pid: std::process::id(),
            output_bytes: 0,
            older_start: None,
            current_start: 0,
            spilled: 0,
            spill_error: None,
            notice_pending: false,
        };
        // Durable before it is acknowledged: a daemon killed from here on is succeeded by a
        // boot that ends the job and says it was lost.
        let written = {
            let home = home.clone();
            let record = record.clone();
            tokio::task::spawn_blocking(move || record::write(&home, &record))
                .await
                .map_err(|_| JobError::ShuttingDown)
        };
        if let Err(e) = written.and_then(|r| r.map_err(JobError::from)) {
            signal_group(pid, Some(Signal::SIGKILL));
            let _ = child.wait();
            return Err(e);
        }
        let (done, _) = watch::channel(false);
        let job = Arc::new(Job {
            record: Mutex::new(record.clone()),
            output: output.clone(),
            done,
            kill_cause: Mutex::new(None),
        });
        self.list_or_end(n, &job, &mut child).await?;
        tracing::info!(job = %id, %owner, pid, "job started");

        if let Err(source) = self.watch(&job, child, reader, writer, spec.timeout) {
            // Its record says running: the next boot says it was lost.
            signal_group(pid, Some(Signal::SIGKILL));
            return Err(JobError::Spawn {
                command: record.command,
                cwd: record.cwd.display().to_string(),
                source,
            });
        }
        let _ = self.0.events.send(JobEvent {
            record: record.clone(),
        });
        Ok(record)
    }

    /// Lists the job (seen by archive admission from then on) only while its agent is not
    /// archived: an archive written since the caller looked is found here, and the job ends
    /// unseen, its process killed and its files removed.
    async fn list_or_end(
        &self,
        n: u64,
        job: &Arc<Job>,
        child: &mut std::process::Child,
    ) -> Result<(), JobError> {
        let admitted = {
            let jobs = self.clone();
            let job = job.clone();
            tokio::task::spawn_blocking(move || jobs.admit(n, &job))
                .await
                .map_err(|_| JobError::ShuttingDown)
        };
        let Err(e) = admitted.and_then(|a| a.map_err(JobError::from)) else {
            return Ok(());
        };
        let record = job.record().clone();
        signal_group(record.pgid, Some(Signal::SIGKILL));
        let _ = child.wait();
        let home = self.0.home.clone();
        let _ = tokio::task::spawn_blocking(move || record::remove(&home, &record)).await;
        Err(e)
    }

    /// Lists the job, if its owner passes the turn gate (under the registry's writer lock, so
    /// no archive is written meanwhile). Blocking.
    fn admit(&self, n: u64, job: &Arc<Job>) -> Result<(), drover_core::RegistryError> {
        let owner = job.record().owner;
        let insert = || {
            self.jobs().insert(n, job.clone());
        };
        if let Some(shared) = self.0.shared.get().and_then(Weak::upgrade) {
            shared.registry.while_unarchived(owner, insert)
        } else {
            insert();
            Ok(())
        }
    }

    /// Starts the job's output thread (its pipe into its output), its waiting thread (its
    /// end), and its timeout.
    fn watch(
        &self,
        job: &Arc<Job>,
        mut child: std::process::Child,
        reader: std::io::PipeReader,
        writer: Writer,
        timeout: Option<Duration>,
    ) -> std::io::Result<()> {
        let id = job.record().id.clone();
        let (read_done_tx, read_done) = std::sync::mpsc::channel::<()>();
        {
            let job = job.clone();
            let home = self.0.home.clone();
            std::thread::Builder::new()
                .name(format!("drover-{id}-output"))
                .spawn(move || pump(reader, writer, &job, &home, &read_done_tx))?;
        }
        let runtime = tokio::runtime::Handle::current();
        {
            let jobs = self.clone();
            let job = job.clone();
            let started = Instant::now();
            std::thread::Builder::new()
                .name(format!("drover-{id}-wait"))
                .spawn(move || {
                    let status = child.wait();
                    jobs.finish(&job, &status, started, &read_done, &runtime);
                })?;
        }
        if let Some(timeout) = timeout {
            let jobs = self.clone();
            let mut done = job.done.subscribe();
            tokio::spawn(async move {
                if tokio::time::timeout(timeout, done.wait_for(|d| *d))
                    .await
                    .is_err()
                {
                    let _ = jobs.kill(&id, KillCause::Timeout).await;
                }
            });
        }
        Ok(())
    }

    /// The job's leader exited: ends what it left in its group, waits (briefly) for the rest
    /// of its output, records how it ended, then tells its owner. Runs on the job's waiting
    /// thread.
    fn finish(
        &self,
        job: &Arc<Job>,
        status: &std::io::Result<std::process::ExitStatus>,
        started: Instant,
        read_done: &std::sync::mpsc::Receiver<()>,
        runtime: &tokio::runtime::Handle,
    ) {
        let pgid = job.record().pgid;
        // Nothing outlives its job: what it left running in its group goes now.
        signal_group(pgid, Some(Signal::SIGKILL));
        // A process that left the group may still hold the pipe: do not wait for it long.
        let _ = read_done.recv_timeout(Duration::from_secs(2));
        let cause = *job
            .kill_cause
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let record = {
            let mut record = job.record();
            record.ended_at = Some(Timestamp::now());
            record.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(0));
            match status {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    record.exit_code = status.code();
                    record.signal = status.signal();
                    record.exit = Some(child::describe_exit(status));
                }
                Err(e) => record.exit = Some(format!("cannot wait for the job: {e}")),
            }
            record.status = if cause.is_some() {
                JobStatus::Killed
            } else {
                JobStatus::Exited
            };
            record.killed_by = cause;
            let segments = job.output.segments();
            record.output_bytes = job.output.end();
            record.older_start = segments.older_start;
            record.current_start = segments.current_start;
            record.spilled = segments.spilled;
            record.spill_error = job.output.spill_error();
            // Recorded with the end: a kill before the notice is queued leaves it to the next
            // boot.
            record.notice_pending =
                record.notify_on_exit && !self.0.shutting_down.load(Ordering::SeqCst);
            record.clone()
        };
        if let Err(e) = record::write(&self.0.home, &record) {
            tracing::warn!(job = %record.id, error = %e, "cannot record how a job ended");
        }
        job.output.release_ring();
        tracing::info!(job = %record.id, owner = %record.owner, exit = ?record.exit, "job ended");
        let old = prune(&mut self.jobs(), record.owner);
        for old in old {
            record::remove(&self.0.home, &old);
        }
        job.done.send_replace(true);
        let _ = self.0.events.send(JobEvent {
            record: record.clone(),
        });
        if record.notice_pending {
            let text = exit_notice(&record, &job.output);
            let delivery = notice_delivery(&record);
            let shared = self.0.shared.get().and_then(Weak::upgrade);
            if let Some(shared) = shared {
                runtime.spawn(notify(shared, record, text, delivery));
            }
        }
    }

    /// Reads the job's output: from `offset`, or the last `tail` bytes, or from the first byte
    /// kept.
    pub fn output(
        &self,
        id: &str,
        offset: Option<u64>,
        tail: Option<usize>,
        max: usize,
    ) -> Result<Chunk, JobError> {
        let job = self.job(id)?;
        Ok(match (offset, tail) {
            (Some(offset), _) => job.output.read(offset, max),
            (None, Some(tail)) => job.output.tail(tail),
            (None, None) => job.output.read(0, max),
        })
    }

    /// Reads from `offset`, waiting (at most `wait`) for bytes past it while the job runs.
    pub async fn follow(
        &self,
        id: &str,
        offset: u64,
        max: usize,
        wait: Duration,
    ) -> Result<(Chunk, bool), JobError> {
        let job = self.job(id)?;
        let mut end = job.output.follow();
        let mut done = job.done.subscribe();
        let _ = tokio::time::timeout(wait, async {
            loop {
                if *end.borrow_and_update() > offset || *done.borrow() {
                    return;
                }
                tokio::select! {
                    changed = end.changed() => if changed.is_err() { return },
                    changed = done.changed() => if changed.is_err() { return },
                }
            }
        })
        .await;
        // Ended first, read after: a chunk read after the end was seen holds the last byte.
        let ended = *done.borrow();
        let chunk = job.output.read(offset, max);
        let at_end = ended && chunk.next >= chunk.end;
        Ok((chunk, at_end))
    }

    /// A reader of the job's output that can wait for more (see [`JobReader`]).
    pub fn reader(&self, id: &str) -> Result<JobReader, JobError> {
        let job = self.job(id)?;
        Ok(JobReader {
            end: job.output.follow(),
            done: job.done.subscribe(),
            job,
        })
    }

    /// Kills the job (TERM, grace, KILL of its group) and returns its record once it ended. A
    /// job that already ended is left as it is.
    pub async fn kill(&self, id: &str, cause: KillCause) -> Result<JobRecord, JobError> {
        let job = self.job(id)?;
        let mut done = job.done.subscribe();
        // The guard is dropped before `snapshot`, which takes the same lock.
        let pgid = {
            let record = job.record();
            (record.is_running() && !*done.borrow()).then_some(record.pgid)
        };
        let Some(pgid) = pgid else {
            return Ok(job.snapshot());
        };
        job.kill_cause
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(cause);
        signal_group(pgid, Some(Signal::SIGTERM));
        if tokio::time::timeout(KILL_GRACE, done.wait_for(|d| *d))
            .await
            .is_err()
        {
            signal_group(pgid, Some(Signal::SIGKILL));
            let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
        }
        Ok(job.snapshot())
    }

    /// Waits (at most `timeout`) for the job to end; `true` when it did.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<(JobRecord, bool), JobError> {
        let job = self.job(id)?;
        let mut done = job.done.subscribe();
        let ended = tokio::time::timeout(timeout, done.wait_for(|d| *d))
            .await
            .is_ok();
        Ok((job.snapshot(), ended))
    }

    /// Kills every running job (daemon shutdown), all at once, and waits for them.
    pub async fn shutdown(&self) {
        self.0.shutting_down.store(true, Ordering::SeqCst);
        let running: Vec<String> = self
            .list()
            .into_iter()
            .filter(JobRecord::is_running)
            .map(|r| r.id)
            .collect();
        let mut kills = tokio::task::JoinSet::new();
        for id in running {
            let jobs = self.clone();
            kills.spawn(async move { jobs.kill(&id, KillCause::Shutdown).await });
        }
        while kills.join_next().await.is_some() {}
    }

    /// The `job` activity family of archive admission.
    pub fn family(&self) -> Arc<dyn ActivityFamily> {
        Arc::new(JobFamily(self.clone()))
    }
}

/// The job's whole environment: the agents' allowlist from the daemon's, the caller's
/// additions, and the job's id and marker.
fn job_env(spec: &JobSpec, id: &str) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = crate::process::inherited_env();
    env.extend(spec.env.clone());
    env.insert("DROVER_JOB_ID".to_string(), id.to_string());
    env.insert(
        record::MARKER_VAR.to_string(),
        format!("{}/{id}", spec.owner),
    );
    env
}

/// Creates the job's log and starts its process (blocking): stdout and stderr on one pipe, a
/// process group of its own, tied to the daemon.
fn spawn(
    log_dir: &std::path::Path,
    log: PathBuf,
    argv: &[String],
    cwd: &std::path::Path,
    env: &BTreeMap<String, String>,
) -> std::io::Result<(
    std::process::Child,
    Arc<Output>,
    Writer,
    std::io::PipeReader,
)> {
    drover_core::private::create_dir_all(log_dir)?;
    let output = Arc::new(Output::new(log, output::RING_BYTES));
    let writer = Writer::create(&output)?;
    let (reader, pipe) = std::io::pipe()?;
    let mut command = child::command(&argv[0], cwd);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(env)
        .stdout(pipe.try_clone()?)
        .stderr(pipe);
    let child = child::spawn_tied(command)?;
    Ok((child, output, writer, reader))
}

/// Checks what a job would run: its display text and argv.
fn validate(spec: &JobSpec) -> Result<(String, Vec<String>), JobError> {
    let (command, argv) = match &spec.command {
        JobCommand::Shell(command) => {
            if command.trim().is_empty() {
                return Err(JobError::invalid("command", "is empty"));
            }
            (
                command.clone(),
                vec!["sh".to_string(), "-c".to_string(), command.clone()],
            )
        }
        JobCommand::Exec { program, args } => {
            if program.trim().is_empty() {
                return Err(JobError::invalid("command", "is empty"));
            }
            let mut argv = vec![program.clone()];
            argv.extend(args.iter().cloned());
            (argv.join(" "), argv)
        }
    };
    if command.contains('\0') {
        return Err(JobError::invalid("command", "contains a NUL byte"));
    }
    if !spec.cwd.is_absolute() {
        return Err(JobError::invalid(
            "cwd",
            format!("`{}` is not an absolute path", spec.cwd.display()),
        ));
    }
    if !spec.cwd.is_dir() {
        return Err(JobError::invalid(
            "cwd",
            format!("`{}` is not a directory", spec.cwd.display()),
        ));
    }
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(JobError::invalid(
                "env",
                format!("`{key}` is not a valid variable"),
            ));
        }
        if key.starts_with("DROVER_JOB") || key == "DROVER_AGENT_ID" {
            return Err(JobError::invalid("env", format!("`{key}` is drover's own")));
        }
    }
    Ok((command, argv))
}

/// Forgets `owner`'s oldest ended jobs beyond [`KEEP_ENDED`]; their records, for the caller
/// to delete their files (outside the lock).
fn prune(jobs: &mut BTreeMap<u64, Arc<Job>>, owner: AgentId) -> Vec<JobRecord> {
    let ended: Vec<u64> = jobs
        .iter()
        .filter(|(_, j)| {
            let r = j.record();
            r.owner == owner && !r.is_running()
        })
        .map(|(n, _)| *n)
        .collect();
    let extra = ended.len().saturating_sub(KEEP_ENDED);
    ended[..extra]
        .iter()
        .filter_map(|n| jobs.remove(n))
        .map(|job| job.record().clone())
        .collect()
}

/// What the owner reads when its job ends.
/// The last lines the job wrote, quoted, for its notice.
fn push_tail(text: &mut String, record: &JobRecord, output: &Output) {
    let tail = output.tail(NOTICE_BYTES);
    let (tail_text, _) = output::utf8_prefix(&tail.bytes, true);
    let lines: Vec<&str> = tail_text.lines().collect();
    let skip = lines.len().saturating_sub(NOTICE_LINES);
    if lines.is_empty() {
        text.push_str("\nIt wrote nothing.");
    } else {
        // Writing to a `String` cannot fail.
        let _ = writeln!(
            text,
            "\nLast output ({} bytes in all; read more with job_output):",
            record.output_bytes
        );
        for line in &lines[skip..] {
            text.push_str("> ");
            text.push_str(line);
            text.push('\n');
        }
    }
}

/// An exit notice wakes the owner, unless job exits have woken it too many times in a row.
fn notice_delivery(record: &JobRecord) -> Delivery {
    if record.wake_depth < MAX_SELF_WAKES {
        Delivery::Followup
    } else {
        Delivery::Inject
    }
}

fn exit_notice(record: &JobRecord, output: &Output) -> String {
    if record.status == JobStatus::Lost {
        let mut text = format!(
            "[drover] Job {} was lost: `{}`. The drover daemon stopped while it ran (a crash or a kill); the next start ended what was left of it, and how it would have ended is unknown.",
            record.id, record.command
        );
        push_tail(&mut text, record, output);
        return text;
    }
    let how = match (record.status, record.killed_by) {
        (JobStatus::Killed, Some(cause)) => format!(
            "was killed ({}; {})",
            kill_cause_text(cause),
            record.exit.as_deref().unwrap_or("")
        ),
        _ => format!("exited ({})", record.exit.as_deref().unwrap_or("unknown")),
    };
    let secs = record.duration_ms.unwrap_or(0) as f64 / 1000.0;
    let mut text = format!(
        "[drover] Job {} {how} after {secs:.1} s: `{}`",
        record.id, record.command
    );
    push_tail(&mut text, record, output);
    if record.wake_depth >= MAX_SELF_WAKES {
        let _ = write!(
            text,
            "\n(Not woken: {MAX_SELF_WAKES} job exits in a row have each started the turn that started the next job.)"
        );
    }
    text
}

fn kill_cause_text(cause: KillCause) -> &'static str {
    match cause {
        KillCause::Request => "on request",
        KillCause::Timeout => "its timeout passed",
        KillCause::Archive => "its agent was archived",
        KillCause::Shutdown => "the daemon stopped",
        KillCause::RuntimeEnded => "the agent runtime that opened it ended",
    }
}

/// Reads the job's pipe to its end into its output. Runs on the job's output thread.
fn pump(
    mut reader: std::io::PipeReader,
    mut writer: Writer,
    job: &Arc<Job>,
    home: &std::path::Path,
    done: &std::sync::mpsc::Sender<()>,
) {
    let mut buf = vec![0u8; READ_BYTES];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if writer.push(&job.output, &buf[..n]) {
                    // The next boot must know where the log's segments start.
                    let record = {
                        let mut record = job.record();
                        let segments = job.output.segments();
                        record.older_start = segments.older_start;
                        record.current_start = segments.current_start;
                        record.clone()
                    };
                    if let Err(e) = record::write(home, &record) {
                        tracing::warn!(job = %record.id, error = %e, "cannot record a job's log segments");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a job's output");
                break;
            }
        }
    }
    let _ = done.send(());
}

/// Queues the exit notice for the job's owner through its durable inbox (never an
/// interruption). An archived owner gets nothing.
async fn notify(shared: Arc<Shared>, record: JobRecord, text: String, delivery: Delivery) {
    let jobs = shared.jobs.clone();
    let manager = crate::RuntimeManager { shared };
    let mut message = InboxMessage::new(delivery, text, format!("job:{}", record.id));
    message.id = record.notice_id();
    let settled = match tokio::time::timeout(
        NOTICE_TIMEOUT,
        manager.deliver_message(record.owner, message),
    )
    .await
    {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::info!(job = %record.id, owner = %record.owner, error = %e, "job exit notice not delivered");
            true
        }
        Err(_) => {
            // It may still be queued: the next boot looks for it before queueing it again.
            tracing::warn!(job = %record.id, owner = %record.owner, "job exit notice timed out");
            false
        }
    };
    if settled {
        let id = record.id.clone();
        let _ = tokio::task::spawn_blocking(move || jobs.notice_queued(&id)).await;
    }
}

/// Running jobs are `job` activity of their owner.
struct JobFamily(Jobs);

impl ActivityFamily for JobFamily {
    fn name(&self) -> &'static str {
        "job"
    }

    fn running(&self, _: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        self.0
            .running_of(agent.id)
            .into_iter()
            .map(|r| ActivityItem {
                id: r.id.clone(),
                agent_id: Some(r.owner),
                title: None,
                detail: format!("{} `{}` is running (pid {})", r.id, r.command, r.pid),
            })
            .collect()
    }

    fn stop(&self, _owner: AgentId, item: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        let jobs = self.0.clone();
        Box::pin(async move {
            // Issued, not awaited: the kill runs its grace in a task of its own.
            tokio::spawn(async move {
                if let Err(e) = jobs.kill(&item.id, KillCause::Archive).await {
                    tracing::warn!(job = %item.id, error = %e, "cannot kill a job of an archived agent");
                }
            });
            Ok(())
        })
    }
}
