//! Jobs: background commands an agent owns (start, list, read output, follow output, kill,
//! wait).
//!
//! Ownership: a user may do anything; an agent sees and controls only the jobs of itself and
//! its descendants (the same rule as for agents, by the job's owner). The jobs themselves are
//! drover-acp's (`drover_acp::jobs`): processes, output, records, exit notices.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use drover_acp::jobs::{JobCommand, JobError, JobReader, JobRecord, JobSpec, KillCause, output};
use drover_core::{AgentId, RegistryError};

use super::{Caller, OpError, Ops};

/// The longest `timeoutS` a job may ask for: a week.
const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;
/// The most a `wait_job` or a following `job_output` waits.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);
/// How long a `wait_job` waits unless told, for every front-end: under the usual MCP client's
/// tool timeout (60 s), so an agent's call is answered and it can call again.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(50);
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

/// The most one chunk of a followed job's output holds (see [`JobFollower`]): large enough
/// that a fast job costs few messages, small enough that a session holds little.
pub(crate) const FOLLOW_CHUNK: usize = 256 * 1024;

/// Bytes of a job's output as text (see [`Ops::job_output`]): the job, read after the bytes,
/// and the bytes as a chunk (its `skipped`: bytes before its offset that were asked for but
/// are no longer kept; its `eof`: the job ended and everything it wrote has been read).
#[derive(Debug, Clone)]
pub(crate) struct JobOutput {
    pub(crate) job: JobRecord,
    pub(crate) chunk: JobChunk,
}

/// One chunk of a followed job's output (see [`JobFollower::next_chunk`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobChunk {
    /// The offset of the text's first byte: the previous chunk's `next_offset`, later by
    /// `skipped` when bytes were no longer kept.
    pub(crate) offset: u64,
    pub(crate) text: String,
    /// Where the next chunk starts; never splits a UTF-8 character.
    pub(crate) next_offset: u64,
    /// Bytes written so far.
    pub(crate) end: u64,
    /// Bytes before `offset` that the follower had not had and that are no longer kept (or
    /// could not be read back).
    pub(crate) skipped: u64,
    /// The job ended and this is the last chunk.
    pub(crate) eof: bool,
}

/// A follow of one job's output, from an offset to its end: every byte once, in order, in
/// chunks read only when the caller asks for the next one (so a slow consumer lags; it never
/// makes anything buffer). Bytes it lagged past the output kept are counted in `skipped`.
#[derive(Debug)]
pub(crate) struct JobFollower {
    reader: JobReader,
    job_id: String,
    /// Where the next chunk starts.
    offset: u64,
    /// Bytes read but not sent (the start of a UTF-8 character) end here: the next chunk
    /// waits for output past it.
    held_until: u64,
    /// The `eof` chunk was handed out.
    finished: bool,
}

impl JobFollower {
    /// The job followed.
    pub(crate) fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Where the next chunk starts.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The job's record now.
    pub(crate) fn record(&self) -> JobRecord {
        self.reader.record()
    }

    /// Waits until there is a chunk to read; `false` once the last one was handed out.
    pub(crate) async fn ready(&mut self) -> bool {
        if self.finished {
            return false;
        }
        self.reader.wait_past(self.held_until).await;
        true
    }

    /// The output there is now from the follower's offset, at most `max` bytes (and at most
    /// [`output::MAX_READ`]); `None` when there is nothing to hand out yet (call
    /// [`Self::ready`] first) or the `eof` chunk was handed out.
    pub(crate) fn next_chunk(&mut self, max: usize) -> Option<JobChunk> {
        if self.finished {
            return None;
        }
        let (chunk, ended) = self.reader.read(self.offset, max);
        let mut text = to_text(chunk, ended);
        if ended && !text.eof && text.text.is_empty() {
            // The job ended but its bytes from here cannot be read back (its log failed):
            // say how many are missing rather than wait for them forever.
            text.skipped += text.end.saturating_sub(text.next_offset);
            text.next_offset = text.end;
            text.eof = true;
        }
        self.held_until = if text.text.is_empty() && !text.eof {
            // Nothing whole to hand out (an incomplete character, or nothing read): wait for
            // more than what is there.
            text.end.max(self.offset)
        } else {
            text.next_offset
        };
        self.offset = text.next_offset;
        if text.eof {
            self.finished = true;
        }
        (text.eof || !text.text.is_empty()).then_some(text)
    }
}

/// A chunk read from a job's output as text: a UTF-8 character is never split unless the
/// job ended (`ended`: it had ended before the read) and the chunk reaches its end.
fn to_text(chunk: output::Chunk, ended: bool) -> JobChunk {
    let at_end = ended && chunk.next >= chunk.end;
    let read = chunk.bytes.len();
    let (text, consumed) = match String::from_utf8(chunk.bytes) {
        // Valid UTF-8 (the usual case: it ends on a whole character) becomes text without a
        // copy.
        Ok(text) => (text, read),
        Err(e) => output::utf8_prefix(e.as_bytes(), at_end),
    };
    let next_offset = chunk.offset + consumed as u64;
    JobChunk {
        offset: chunk.offset,
        text,
        next_offset,
        end: chunk.end,
        skipped: chunk.skipped,
        eof: at_end && consumed == read,
    }
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
        // Read after the chunk: a job seen ended here has all its output in its record's
        // `output_bytes` (the chunk's `end` may be from before its last bytes).
        let job = jobs.get(id)?;
        let ended = !job.is_running() && chunk.end >= job.output_bytes;
        Ok(JobOutput {
            job,
            chunk: to_text(chunk, ended),
        })
    }

    /// Follows the job's output from `offset` (from the first byte kept if `None`, or if
    /// `offset` is older than that: the first chunk says how many bytes were skipped).
    pub(crate) fn follow_job(
        &self,
        caller: Caller,
        id: &str,
        offset: Option<u64>,
    ) -> Result<JobFollower, OpError> {
        let job = self.job(caller, id)?;
        let reader = self.runtimes.jobs().reader(&job.id)?;
        let offset = offset.unwrap_or_else(|| reader.first_kept());
        Ok(JobFollower {
            reader,
            job_id: job.id,
            offset,
            held_until: offset,
            finished: false,
        })
    }

    /// Kills the job (TERM, a grace, KILL of its process group); answers once it ended.
    pub(crate) async fn kill_job(&self, caller: Caller, id: &str) -> Result<JobRecord, OpError> {
        self.job(caller, id)?;
        Ok(self.runtimes.jobs().kill(id, KillCause::Request).await?)
    }

    /// Waits (at most `timeout`, [`DEFAULT_WAIT`] when `None`, and at most 10 minutes) for the
    /// job to end; `true` when it did.
    pub(crate) async fn wait_job(
        &self,
        caller: Caller,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<(JobRecord, bool), OpError> {
        self.job(caller, id)?;
        let timeout = timeout.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT);
        Ok(self.runtimes.jobs().wait(id, timeout).await?)
    }
}
