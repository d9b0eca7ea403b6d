//! `drover schedule add|ls|rm|pause|resume`, over the client protocol: the command line's
//! times and durations become the protocol's `when`, and schedules show with their next run.

use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, ClientMessage, ScheduleInfo, ScheduleNewAgent, ScheduleState, ScheduleWhen,
};
use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

use crate::args::{ScheduleAction, ScheduleAdd};
use crate::client::SessionState;
use crate::commands::{Ctx, print_json, unexpected, working_directory};
use crate::error::{CliError, arguments_refused};
use crate::output::{self, Paint, Table};
use crate::resolve::{Prefer, ShortIds, resolve};

/// `90`, `90s`, `30m`, `2h`, `1d`, `1h 30m` → seconds.
pub(crate) fn parse_duration(text: &str) -> Result<u64, CliError> {
    let bad = || {
        CliError::BadArgument(format!(
            "`{text}` is not a duration (such as 90s, 30m, 2h, 1d, or 1h 30m)"
        ))
    };
    let mut total: u64 = 0;
    let mut number = String::new();
    let mut any = false;
    for c in text.trim().chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            ' ' if number.is_empty() => continue,
            // A bare number is seconds.
            's' | ' ' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        number.clear();
        any = true;
    }
    if !any || total == 0 {
        return Err(bad());
    }
    Ok(total)
}

/// An RFC 3339 time, or a local one (`2026-12-24 09:00`), as RFC 3339.
pub(crate) fn parse_time(text: &str) -> Result<String, CliError> {
    if let Ok(ts) = text.parse::<Timestamp>() {
        return Ok(ts.to_string());
    }
    text.parse::<DateTime>()
        .ok()
        .and_then(|dt| dt.to_zoned_datetime(TimeZone::system()).ok())
        .map(|z| z.timestamp().to_string())
        .ok_or_else(|| {
            CliError::BadArgument(format!(
                "`{text}` is not a time (such as 2026-12-24T09:00:00+01:00 or 2026-12-24 09:00)"
            ))
        })
}

/// `3` → `sched-3`.
fn schedule_id(text: &str) -> String {
    if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
        format!("sched-{text}")
    } else {
        text.to_string()
    }
}

fn when_of(add: &ScheduleAdd) -> Result<ScheduleWhen, CliError> {
    Ok(ScheduleWhen {
        at: add.at.as_deref().map(parse_time).transpose()?,
        in_seconds: add.in_.as_deref().map(parse_duration).transpose()?,
        every_seconds: add.every.as_deref().map(parse_duration).transpose()?,
        start_at: add.start.as_deref().map(parse_time).transpose()?,
        cron: add.cron.clone(),
        time_zone: add.cron.as_ref().map(|_| {
            add.tz
                .clone()
                .unwrap_or_else(|| TimeZone::system().iana_name().unwrap_or("UTC").to_string())
        }),
    })
}

/// The daemon's description of when it fires, a one-off's time in local time as the next
/// run is (`once at 2026-12-06 12:56:58`; the daemon writes it in UTC).
fn fires(schedule: &ScheduleInfo) -> String {
    let once_at = (schedule
        .cadence
        .get("kind")
        .and_then(serde_json::Value::as_str)
        == Some("once"))
    .then(|| {
        schedule
            .cadence
            .get("at")
            .and_then(serde_json::Value::as_str)
    })
    .flatten()
    .and_then(|at| at.parse::<Timestamp>().ok());
    match once_at {
        Some(at) => format!(
            "once at {}",
            at.to_zoned_datetime(TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S")
        ),
        None => schedule.description.clone(),
    }
}

/// `2026-12-24 09:00:00 (in 29m)` in local time, or `-` when there is no next run.
pub(crate) fn next_run(at: Option<&str>, now: Timestamp) -> String {
    at.map_or_else(|| "-".to_string(), |at| output::when_ahead(at, now))
}

/// `drover schedule ...`.
pub async fn run(ctx: &Ctx, action: ScheduleAction) -> anyhow::Result<()> {
    match action {
        ScheduleAction::Add(add) => self::add(ctx, add).await,
        ScheduleAction::Ls { agent, json } => list(ctx, agent.as_deref(), json).await,
        ScheduleAction::Rm { schedule } => remove(ctx, &schedule).await,
        ScheduleAction::Pause { schedule } => set_paused(ctx, &schedule, true).await,
        ScheduleAction::Resume { schedule } => set_paused(ctx, &schedule, false).await,
    }
}

async fn add(ctx: &Ctx, add: Box<ScheduleAdd>) -> anyhow::Result<()> {
    let when = when_of(&add)?;
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let find = |query: &str| -> Result<String, CliError> {
        Ok(resolve(&agents, query, Prefer::Live)?.id.clone())
    };
    let (agent_id, new_agent) = match (&add.agent, &add.new) {
        (Some(agent), _) => (Some(find(agent)?), None),
        (None, provider) => {
            let cwd = match &add.cwd {
                Some(dir) => working_directory(dir)?,
                None => working_directory(&std::env::current_dir()?)?,
            };
            let spec = ScheduleNewAgent {
                provider: provider.clone(),
                cwd: Some(cwd.display().to_string()),
                parent_agent_id: add.parent.as_deref().map(find).transpose()?,
                ..ScheduleNewAgent::default()
            };
            (None, Some(spec))
        }
    };
    let answer = connection
        .request(rq::CreateSchedule {
            prompt: add.prompt.clone(),
            when,
            agent_id,
            new_agent,
            title: add.title.clone(),
        })
        .await
        .map_err(arguments_refused)?;
    connection.close().await;
    let answers::Schedule { schedule, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if add.json {
        return print_json(&schedule);
    }
    outln!(
        "scheduled {}: {}, next run {}",
        schedule.id,
        fires(&schedule),
        next_run(schedule.next_run_at.as_deref(), Timestamp::now())
    );
    Ok(())
}

async fn list(ctx: &Ctx, agent: Option<&str>, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let agent_id = agent
        .map(|q| resolve(&agents, q, Prefer::Live).map(|a| a.id.clone()))
        .transpose()?;
    let answer = connection.request(rq::ListSchedules { agent_id }).await?;
    connection.close().await;
    let answers::Schedules { schedules, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if json {
        return print_json(&schedules);
    }
    if schedules.is_empty() {
        eprintln!("drover: no schedules; add one with `drover schedule add`");
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    table(&schedules, &agents).write(&mut out, ctx.style)?;
    Ok(())
}

fn table(schedules: &[ScheduleInfo], agents: &[AgentInfo]) -> Table {
    let short = ShortIds::new(agents);
    let now = Timestamp::now();
    let mut table = Table::new(vec![
        "ID", "STATE", "WHEN", "NEXT", "TARGET", "LAST", "PROMPT",
    ]);
    for s in schedules {
        let state = match s.state {
            ScheduleState::Active => (s.state.to_string(), Paint::Green),
            ScheduleState::Paused => (s.state.to_string(), Paint::Yellow),
            ScheduleState::Finished => (s.state.to_string(), Paint::Dim),
        };
        let target = match (&s.agent_id, &s.new_agent) {
            (Some(agent), _) => short.get(agent).to_string(),
            (None, Some(spec)) => format!("new {}", spec["provider"].as_str().unwrap_or("agent")),
            (None, None) => "-".to_string(),
        };
        let last = match s.runs.last() {
            None => ("-".to_string(), Paint::Plain),
            Some(run) if run.error.is_some() => (
                format!("{} ago, failed", output::age(&run.fired_at, now)),
                Paint::Red,
            ),
            Some(run) => (
                format!("{} ago", output::age(&run.fired_at, now)),
                Paint::Plain,
            ),
        };
        let prompt = s.title.clone().unwrap_or_else(|| s.prompt.clone());
        table.row(vec![
            (s.id.clone(), Paint::Bold),
            state,
            (fires(s), Paint::Plain),
            (next_run(s.next_run_at.as_deref(), now), Paint::Plain),
            (target, Paint::Plain),
            last,
            (output::truncate(&prompt.replace('\n', " "), 40), Paint::Dim),
        ]);
    }
    table
}

async fn remove(ctx: &Ctx, schedule: &str) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let schedule_id = schedule_id(schedule);
    let answer = connection
        .request(rq::DeleteSchedule { schedule_id })
        .await?;
    connection.close().await;
    let answers::ScheduleDeleted { schedule_id, .. } =
        answer.into_answer().map_err(|m| unexpected(&m))?;
    outln!("deleted {schedule_id}");
    Ok(())
}

async fn set_paused(ctx: &Ctx, schedule: &str, paused: bool) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let schedule_id = schedule_id(schedule);
    let answer = connection
        .request(if paused {
            ClientMessage::PauseSchedule(rq::PauseSchedule { schedule_id })
        } else {
            ClientMessage::ResumeSchedule(rq::ResumeSchedule { schedule_id })
        })
        .await?;
    connection.close().await;
    let answers::Schedule { schedule, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if paused {
        outln!("paused {}", schedule.id);
    } else {
        outln!(
            "resumed {}: next run {}",
            schedule.id,
            next_run(schedule.next_run_at.as_deref(), Timestamp::now())
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (text, secs) in [
            ("90", 90),
            ("90s", 90),
            ("30m", 1800),
            ("2h", 7200),
            ("1d", 86_400),
            ("1h 30m", 5400),
            ("1h30m", 5400),
        ] {
            assert_eq!(parse_duration(text).ok(), Some(secs), "{text}");
        }
        for bad in ["", "0", "5x", "h", "soon", "99999999999999999999d"] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.to_string().contains("not a duration"), "{e}");
        }
    }

    #[test]
    fn times_are_rfc3339_or_local() {
        assert_eq!(
            parse_time("2026-12-24T09:00:00+01:00").ok().as_deref(),
            Some("2026-12-24T08:00:00Z")
        );
        assert!(parse_time("2026-12-24 09:00").is_ok());
        let e = parse_time("tomorrow").expect_err("not a time");
        assert!(e.to_string().contains("`tomorrow`"), "{e}");
    }

    #[test]
    fn a_bare_number_names_a_schedule() {
        assert_eq!(schedule_id("3"), "sched-3");
        assert_eq!(schedule_id("sched-3"), "sched-3");
    }
}
