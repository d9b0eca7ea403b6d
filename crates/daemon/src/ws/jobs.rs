//! The client protocol's job requests (`start_job`, `list_jobs`, `job_output`, `kill_job`,
//! `wait_job`): decode, call the operation in `crate::ops::jobs`, encode.

use std::path::PathBuf;
use std::time::Duration;

use drover_protocol::{ClientMessage, DaemonMessage};

use crate::ops::jobs::StartJob;
use crate::ops::{Caller, OpError, Ops, parse_agent};
use crate::wire;

/// Every client of the protocol is the machine's user.
const CALLER: Caller = Caller::User;

/// How long `wait_job` waits unless told.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Answers one job request (the dispatch in `requests` sends only these here).
pub(super) async fn answer(message: ClientMessage, ops: &Ops) -> Result<DaemonMessage, OpError> {
    use ClientMessage as M;
    match message {
        M::StartJob {
            request_id,
            agent_id,
            command,
            cwd,
            env,
            timeout_s,
            notify_on_exit,
        } => {
            let request = StartJob {
                owner: parse_agent(&agent_id)?,
                command,
                cwd: cwd.map(PathBuf::from),
                env,
                timeout_s,
                notify_on_exit,
            };
            let job = ops.start_job(CALLER, request).await?;
            Ok(DaemonMessage::Job {
                request_id,
                job: wire::job_info(&job),
            })
        }
        M::ListJobs {
            request_id,
            agent_id,
        } => {
            let owner = agent_id.as_deref().map(parse_agent).transpose()?;
            let jobs = ops.list_jobs(CALLER, owner)?;
            Ok(DaemonMessage::Jobs {
                request_id,
                jobs: jobs.iter().map(wire::job_info).collect(),
            })
        }
        M::JobOutput {
            request_id,
            job_id,
            offset,
            tail,
            max_bytes,
            wait_ms,
        } => {
            let wait = wait_ms.map(Duration::from_millis);
            let out = ops
                .job_output(CALLER, &job_id, offset, tail, max_bytes, wait)
                .await?;
            Ok(DaemonMessage::JobOutput {
                request_id,
                job_id: out.job.id,
                offset: out.offset,
                text: out.text,
                next_offset: out.next_offset,
                end: out.end,
                skipped: out.skipped,
                eof: out.eof,
            })
        }
        M::KillJob { request_id, job_id } => {
            let job = ops.kill_job(CALLER, &job_id).await?;
            Ok(DaemonMessage::Job {
                request_id,
                job: wire::job_info(&job),
            })
        }
        M::WaitJob {
            request_id,
            job_id,
            timeout_ms,
        } => {
            let timeout = timeout_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
            let (job, ended) = ops.wait_job(CALLER, &job_id, timeout).await?;
            Ok(DaemonMessage::JobWaited {
                request_id,
                job: wire::job_info(&job),
                ended,
            })
        }
        other => Err(OpError::invalid(
            "type",
            format!(
                "`{}` is not a job request",
                other.request_id().unwrap_or("")
            ),
        )),
    }
}
