//! The job commands: `drover job start AGENT -- CMD…`, `drover job ls`, `drover job logs ID
//! [-f]`, `drover job kill ID`, each over the client protocol.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{ClientMessage, DaemonMessage, JobInfo, JobStatus};
use jiff::Timestamp;

use crate::args::JobAction;
use crate::client::{Connection, SessionState};
use crate::commands::{Ctx, print_json, unexpected, working_directory};
use crate::error::{CliError, arguments_refused};
use crate::output::{self, Paint, Table};
use crate::resolve::{Prefer, ShortIds, resolve};

/// What one read of `logs` asks for.
const READ_BYTES: usize = 256 * 1024;

pub async fn run(ctx: &Ctx, action: JobAction) -> anyhow::Result<()> {
    match action {
        JobAction::Start {
            agent,
            cwd,
            env,
            timeout,
            no_notify,
            json,
            command,
        } => start(ctx, &agent, cwd, env, timeout, no_notify, json, command).await,
        JobAction::Ls { agent, json } => list(ctx, agent.as_deref(), json).await,
        JobAction::Logs { id, follow, tail } => logs(ctx, &id, follow, tail).await,
        JobAction::Kill { id, json } => kill(ctx, &id, json).await,
    }
}

#[expect(clippy::too_many_arguments)] // the command line's own flags
async fn start(
    ctx: &Ctx,
    agent: &str,
    cwd: Option<PathBuf>,
    env: Vec<String>,
    timeout: Option<u64>,
    no_notify: bool,
    json: bool,
    command: Vec<String>,
) -> anyhow::Result<()> {
    let mut vars = BTreeMap::new();
    for var in env {
        let Some((name, value)) = var.split_once('=') else {
            return Err(
                CliError::BadArgument(format!("--env `{var}`: expected NAME=VALUE")).into(),
            );
        };
        vars.insert(name.to_string(), value.to_string());
    }
    if command.is_empty() {
        return Err(
            CliError::BadArgument("no command: `drover job start AGENT -- CMD…`".into()).into(),
        );
    }
    // The words as the shell would join them; one word is taken as a shell command itself.
    let command = if command.len() == 1 {
        command[0].clone()
    } else {
        command
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Missing or not a directory: a bad argument, as for `drover run --cwd`.
    let cwd = cwd.map(|c| working_directory(&c)).transpose()?;
    let (connection, SessionState { agents, .. }) = ctx.connect().await?;
    let owner = resolve(&agents, agent, Prefer::Live)?.clone();
    let request = rq::StartJob {
        agent_id: owner.id.clone(),
        command,
        cwd: cwd.map(|c| c.display().to_string()),
        env: vars,
        timeout_s: timeout,
        notify_on_exit: Some(!no_notify),
    };
    let job = job_request(connection, request).await?;
    if json {
        return print_json(&job);
    }
    outln!("{}", job.id);
    eprintln!(
        "drover: started {} for {} (pid {}): {}",
        job.id,
        ShortIds::new(&agents).get(&owner.id),
        job.pid,
        job.command
    );
    Ok(())
}

async fn list(ctx: &Ctx, agent: Option<&str>, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let owner = agent
        .map(|a| resolve(&agents, a, Prefer::Live).map(|a| a.id.clone()))
        .transpose()?;
    let answer = connection.request(rq::ListJobs { agent_id: owner }).await;
    connection.close().await;
    let answer = answer?;
    let answers::Jobs { jobs, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if json {
        return print_json(&jobs);
    }
    if jobs.is_empty() {
        eprintln!("drover: no jobs; start one with `drover job start AGENT -- CMD…`");
        return Ok(());
    }
    let short = ShortIds::new(&agents);
    let now = Timestamp::now();
    let mut table = Table::new(vec![
        "ID", "AGENT", "STATUS", "EXIT", "STARTED", "TIME", "OUTPUT", "COMMAND",
    ]);
    for job in &jobs {
        table.row(vec![
            (job.id.clone(), Paint::Plain),
            (short.get(&job.agent_id).to_string(), Paint::Plain),
            (job.status.to_string(), status_paint(job)),
            (exit_text(job), Paint::Plain),
            (output::when(&job.started_at, now), Paint::Dim),
            (duration(job, now), Paint::Plain),
            (bytes(job.output_bytes), Paint::Plain),
            (output::truncate(&job.command, 60), Paint::Bold),
        ]);
    }
    let mut out = std::io::stdout().lock();
    table.write(&mut out, ctx.style)?;
    Ok(())
}

/// `drover job logs ID [-f] [--tail N]`: the output on stdout, as it came; with `-f`, pushed
/// by the daemon as the job writes it (`follow_job`) until the job ends (every byte once:
/// the output goes by offset).
async fn logs(ctx: &Ctx, id: &str, follow: bool, tail: Option<usize>) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let mut offset = None;
    if let Some(tail) = tail {
        let answer = connection
            .request(rq::JobOutput {
                job_id: id.to_string(),
                offset: None,
                tail: Some(tail),
                max_bytes: Some(READ_BYTES),
                wait_ms: None,
            })
            .await?;
        let (next, eof) = write_output(&answer)?;
        offset = Some(next);
        if eof || !follow {
            connection.close().await;
            return Ok(());
        }
    }
    let mut offset = offset.unwrap_or(0);
    if follow {
        let result = follow_output(&mut connection, id, offset).await;
        connection.close().await;
        return result;
    }
    loop {
        let answer = connection
            .request(rq::JobOutput {
                job_id: id.to_string(),
                offset: Some(offset),
                tail: None,
                max_bytes: Some(READ_BYTES),
                wait_ms: None,
            })
            .await?;
        // Events (other agents' changes) are of no use here: never keep them.
        connection.discard_backlog();
        let before = offset;
        let (next, eof) = write_output(&answer)?;
        offset = next;
        if eof || offset == before {
            break;
        }
    }
    connection.close().await;
    Ok(())
}

/// Writes the job's output from `offset` as the daemon pushes it, until its end.
async fn follow_output(
    connection: &mut crate::client::Connection,
    id: &str,
    offset: u64,
) -> anyhow::Result<()> {
    let answer = connection
        .request(rq::FollowJob {
            job_id: id.to_string(),
            offset: Some(offset),
        })
        .await?;
    let answers::JobFollowed { job, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    // What came before the answer is of no use here.
    connection.discard_backlog();
    loop {
        let message = connection.recv().await?;
        let DaemonMessage::JobOutputUpdate {
            job_id,
            text,
            skipped,
            eof,
            ..
        } = message
        else {
            continue; // other agents' changes
        };
        if job_id != job.id {
            continue;
        }
        write_text(&text, skipped)?;
        if eof {
            return Ok(());
        }
    }
}

/// Writes a `job_output` answer's text; its next offset and whether the job's output ended.
fn write_output(answer: &DaemonMessage) -> anyhow::Result<(u64, bool)> {
    let DaemonMessage::JobOutput(Answer {
        body:
            answers::JobOutput {
                text,
                next_offset,
                skipped,
                eof,
                ..
            },
        ..
    }) = answer
    else {
        return Err(unexpected(answer));
    };
    write_text(text, *skipped)?;
    Ok((*next_offset, *eof))
}

/// Writes output to stdout, after a note on stderr of the bytes before it no longer kept.
fn write_text(text: &str, skipped: u64) -> anyhow::Result<()> {
    if skipped > 0 {
        eprintln!("drover: [{skipped} earlier bytes are no longer kept]");
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

async fn kill(ctx: &Ctx, id: &str, json: bool) -> anyhow::Result<()> {
    let (connection, _) = ctx.connect().await?;
    let request = rq::KillJob {
        job_id: id.to_string(),
    };
    let job = job_request(connection, request).await?;
    if json {
        return print_json(&job);
    }
    outln!("{} {}: {}", job.id, job.status, exit_text(&job));
    Ok(())
}

/// Sends `request` (`start_job`, `kill_job`) and closes the connection: the job it answers
/// with. A refused argument is the user's mistake.
async fn job_request(
    mut connection: Connection,
    request: impl Into<ClientMessage>,
) -> anyhow::Result<JobInfo> {
    let answer = connection.request(request).await;
    connection.close().await;
    let answer = answer.map_err(arguments_refused)?;
    let answers::Job { job } = answer.into_answer().map_err(|m| unexpected(&m))?;
    Ok(job)
}

fn status_paint(job: &JobInfo) -> Paint {
    match job.status {
        JobStatus::Running => Paint::Green,
        JobStatus::Lost => Paint::Red,
        JobStatus::Exited if job.exit_code == Some(0) => Paint::Plain,
        _ => Paint::Yellow,
    }
}

/// `0`, `3`, `SIGTERM` (`9`): how it ended; `-` while it runs.
fn exit_text(job: &JobInfo) -> String {
    match (job.exit_code, job.signal, &job.killed_by) {
        (Some(code), _, _) => code.to_string(),
        (None, Some(sig), Some(by)) => format!("signal {sig} ({by})"),
        (None, Some(sig), None) => format!("signal {sig}"),
        (None, None, _) if job.status == "lost" => "lost".to_string(),
        _ => "-".to_string(),
    }
}

fn duration(job: &JobInfo, now: Timestamp) -> String {
    let ms = job.duration_ms.or_else(|| {
        let started: Timestamp = job.started_at.parse().ok()?;
        u64::try_from(now.duration_since(started).as_millis()).ok()
    });
    match ms {
        Some(ms) if ms < 1000 => format!("{ms}ms"),
        Some(ms) if ms < 120_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 7_200_000 => format!("{}m", ms / 60_000),
        Some(ms) => format!("{}h", ms / 3_600_000),
        None => "-".to_string(),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n < 1024 => format!("{n}B"),
        n if n < 1024 * 1024 => format!("{:.1}K", n as f64 / 1024.0),
        n => format!("{:.1}M", n as f64 / (1024.0 * 1024.0)),
    }
}

/// One word as `sh` reads it back: unquoted when it is plain, else in single quotes.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("make"), "make");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
