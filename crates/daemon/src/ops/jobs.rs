//! Jobs: background commands an agent owns (start, list, read output, kill, wait).
//!
//! Ownership: a user may do anything; an agent sees and controls only the jobs of itself and
//! its descendants (the same rule as for agents, by the job's owner). The jobs themselves are
//! drover-acp's (`drover_acp::jobs`): processes, output, records, exit notices.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use drover_acp::jobs::{JobCommand, JobError, JobRecord, JobSpec, KillCause, output};
use drover_core::{AgentId, RegistryError};

use super::{Caller, OpError, Ops};

/// The longest `timeoutS` a job may ask for: a week.
const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;
/// The most a `wait_job` or a following `job_output` waits.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);
/// What one `job_output` returns unless told otherwise.
pub(crate) const DEFAULT_READ: usize = 64 * 1024;

/// A job to start.
#[derive(Debug, Clone)]
pub(crate) struct StartJob {
    pub(crate) owner: AgentId,
    pub(crate) command: String,
    /// Absolute, or relative to the owner's cwd; default the owner's cwd.
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) timeout_s: Option<u64>,
    /// Default true.
    pub(crate) notify_on_exit: Option<bool>,
}

/// Bytes of a job's output as text (see [`Ops::job_output`]).
#[derive(Debug, Clone)]
pub(crate) struct JobOutput {
    pub(crate) job: JobRecord,
    /// The offset of the text's first byte.
    pub(crate) offset: u64,
    pub(crate) text: String,
    /// Where the next read starts; never splits a UTF-8 character.
    pub(crate) next_offset: u64,
    /// Bytes written so far.
    pub(crate) end: u64,
    /// Bytes before `offset` that were asked for but are no longer kept.
    pub(crate) skipped: u64,
    /// The job ended and everything it wrote has been read.
    pub(crate) eof: bool,
}

impl From<JobError> for OpError {
    fn from(e: JobError) -> OpError {
        OpError::Job(e)
    }
}

impl Ops {
    pub(crate) async fn start_job(
        &self,
        caller: Caller,
        request: StartJob,
    ) -> Result<JobRecord, OpError> {
        let owner = self.controlled(caller, request.owner)?;
        if owner.is_archived() {
            return Err(RegistryError::Archived { agent: owner.id }.into());
        }
        let cwd = match request.cwd {
            None => owner.cwd.clone(),
            Some(cwd) if cwd.is_absolute() => cwd,
            Some(cwd) => owner.cwd.join(cwd),
        };
        let timeout = match request.timeout_s {
            None => None,
            Some(0) => return Err(OpError::invalid("timeoutS", "must be at least 1 second")),
            Some(s) if s > MAX_TIMEOUT_S => {
                return Err(OpError::invalid(
                    "timeoutS",
                    format!("{s} is more than a week ({MAX_TIMEOUT_S} s)"),
                ));
            }
            Some(s) => Some(Duration::from_secs(s)),
        };
        let spec = JobSpec {
            owner: owner.id,
            command: JobCommand::Shell(request.command),
            cwd,
            env: request.env,
            timeout,
            notify_on_exit: request.notify_on_exit.unwrap_or(true),
            started_by: caller.source(),
            terminal: false,
        };
        Ok(self.runtimes.jobs().start(spec).await?)
    }

    /// The jobs `caller` may see (of `owner` only, if given), oldest first.
    pub(crate) fn list_jobs(
        &self,
        caller: Caller,
        owner: Option<AgentId>,
    ) -> Result<Vec<JobRecord>, OpError> {
        if let Some(owner) = owner {
            self.controlled(caller, owner)?;
        }
        Ok(self
            .runtimes
            .jobs()
            .list()
            .into_iter()
            .filter(|job| owner.is_none_or(|o| job.owner == o))
            .filter(|job| self.may_see(caller, job))
            .collect())
    }

    fn may_see(&self, caller: Caller, job: &JobRecord) -> bool {
        match caller {
            Caller::User => true,
            Caller::Agent(me) => {
                job.owner == me || self.registry.ancestors(job.owner).contains(&me)
            }
        }
    }

    /// The job `id`, if `caller` may control it.
    pub(crate) fn job(&self, caller: Caller, id: &str) -> Result<JobRecord, OpError> {
        let job = self.runtimes.jobs().get(id)?;
        if self.may_see(caller, &job) {
            Ok(job)
        } else {
            Err(OpError::NotPermitted(format!(
                "job `{}` belongs to agent `{}`, which is not yours: you may see and control the jobs of yourself and your own subagents",
                job.id, job.owner
            )))
        }
    }

    /// The job's output as text: from `offset` (waiting up to `wait` for bytes past it while
    /// the job runs), or its last `tail` bytes, or from the first byte kept; at most
    /// `max_bytes`.
    pub(crate) async fn job_output(
        &self,
        caller: Caller,
        id: &str,
        offset: Option<u64>,
        tail: Option<usize>,
        max_bytes: Option<usize>,
        wait: Option<Duration>,
    ) -> Result<JobOutput, OpError> {
        if offset.is_some() && tail.is_some() {
            return Err(OpError::invalid(
                "tail",
                "give `offset` or `tail`, not both",
            ));
        }
        self.job(caller, id)?;
        let jobs = self.runtimes.jobs();
        let max = max_bytes.unwrap_or(DEFAULT_READ).clamp(1, output::MAX_READ);
        let chunk = match (wait, offset) {
            (Some(wait), Some(offset)) => jobs.follow(id, offset, max, wait.min(MAX_WAIT)).await?.0,
            (Some(_), None) => {
                return Err(OpError::invalid("waitMs", "needs an `offset` to wait past"));
            }
            (None, _) => jobs.output(id, offset, tail, max)?,
        };
        // Read after the chunk: a job seen ended here has all its output in `end`.
        let job = jobs.get(id)?;
        let at_end = !job.is_running() && chunk.next >= chunk.end;
        let (text, consumed) = output::utf8_prefix(&chunk.bytes, at_end);
        let next_offset = chunk.offset + consumed as u64;
        Ok(JobOutput {
            eof: !job.is_running() && next_offset >= chunk.end,
            job,
            offset: chunk.offset,
            text,
            next_offset,
            end: chunk.end,
            skipped: chunk.skipped,
        })
    }

    /// Kills the job (TERM, a grace, KILL of its process group); answers once it ended.
    pub(crate) async fn kill_job(&self, caller: Caller, id: &str) -> Result<JobRecord, OpError> {
        self.job(caller, id)?;
        Ok(self.runtimes.jobs().kill(id, KillCause::Request).await?)
    }

    /// Waits (at most `timeout`, itself at most 10 minutes) for the job to end; `true` when
    /// it did.
    pub(crate) async fn wait_job(
        &self,
        caller: Caller,
        id: &str,
        timeout: Duration,
    ) -> Result<(JobRecord, bool), OpError> {
        self.job(caller, id)?;
        Ok(self.runtimes.jobs().wait(id, timeout.min(MAX_WAIT)).await?)
    }
}
