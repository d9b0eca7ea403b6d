//! The requests about one agent: send, wait, stop, archive and unarchive, retry, set, budget,
//! detach, permit.

use std::fmt::Write as _;
use std::time::Duration;

use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, AgentStatus, AttentionReason, DaemonMessage, Delivery, ErrorCode,
};
use serde_json::{Value, json};

use crate::args::PermitAnswer;
use crate::client::SessionState;
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::{CliError, exit};
use crate::output::{self};
use crate::resolve::{Prefer, ShortIds, resolve};

/// How `drover send` delivers: `--steer`, `--inject`, or after the turn.
pub fn delivery(steer: bool, inject: bool) -> Delivery {
    if steer {
        Delivery::Steer
    } else if inject {
        Delivery::Inject
    } else {
        Delivery::Followup
    }
}

pub async fn send(
    ctx: &Ctx,
    id: &str,
    message: String,
    delivery: Delivery,
    json: bool,
) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(rq::SendMessage {
            agent_id: agent.id.clone(),
            text: message,
            delivery,
            notify_upstream: false,
        })
        .await?;
    let answers::MessageQueued { message_id, .. } =
        answer.into_answer().map_err(|m| unexpected(&m))?;
    // The message is kept either way; say so when it cannot run now.
    let now = connection
        .request(rq::GetAgent {
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    if let DaemonMessage::Agent(Answer {
        body: answers::Agent { agent: now, .. },
        ..
    }) = &now
    {
        if now.start_failure.is_some() {
            eprintln!("{}", not_running(now, &name));
        } else if let Some(limited) = &now.limited {
            eprintln!(
                "{name} waits for its provider's usage limit: this message runs after the prompt that waits, which goes again {} (`drover retry {name}` sends it now)",
                output::when_ahead(&limited.retry_at, jiff::Timestamp::now()),
            );
        }
    }
    let delivery = match delivery {
        Delivery::Followup => "followup",
        Delivery::Steer => "steer",
        Delivery::Inject => "inject",
    };
    if json {
        return print_json(
            &json!({"agentId": agent.id, "messageId": message_id, "delivery": delivery}),
        );
    }
    outln!("queued {delivery} for {name} (message {message_id})");
    Ok(())
}

/// What to say of an agent whose last start failed: why, that its messages are kept, and
/// how it starts again.
fn not_running(agent: &AgentInfo, name: &str) -> String {
    let why = agent.error.as_deref().unwrap_or("its start failed");
    let queued = agent.queued.as_ref().map_or(0, Vec::len);
    let how = match (&agent.start_failure, &agent.runtime.retry_at) {
        (Some(f), _) if f.sign_in.is_some() => {
            format!(
                "`drover login {}` signs it in and starts it",
                agent.provider
            )
        }
        (_, Some(at)) => format!(
            "it tries again {}; `drover retry {name}` now",
            output::when_ahead(at, jiff::Timestamp::now())
        ),
        _ => format!("`drover retry {name}` starts it again"),
    };
    format!("{name} is not running: {why}\n{queued} message(s) kept for it, not delivered; {how}")
}

/// Waits for every agent named to be idle with nothing queued, under one deadline; says which
/// are idle (and whose last turn failed) and, at the timeout, which are still busy. Exits 6
/// when one is still busy at the timeout, else 1 when the last turn of one failed.
pub async fn wait(ctx: &Ctx, ids: &[String], timeout: Option<f64>) -> anyhow::Result<()> {
    let timeout = match timeout {
        Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => anyhow::bail!("--timeout must be a number of seconds, not {s}"),
        None => None,
    };
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let short = ShortIds::new(&agents);
    let mut waited: Vec<(AgentInfo, String)> = Vec::new();
    for id in ids {
        let agent = resolve(&agents, id, Prefer::Live)?.clone();
        if !waited.iter().any(|(a, _)| a.id == agent.id) {
            let name = short.get(&agent.id).to_string();
            waited.push((agent, name));
        }
    }
    let mut busy = Vec::new();
    let mut failed_names = Vec::new();
    for (agent, name) in &waited {
        let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        let answer = connection
            .request(rq::WaitIdle {
                agent_id: agent.id.clone(),
                timeout_ms: left.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            })
            .await?;
        match answer {
            DaemonMessage::Idle(Answer {
                body: answers::Idle { idle: true, .. },
                ..
            }) => {
                // What it is now, not what it was when the wait began.
                let now = connection
                    .request(rq::GetAgent {
                        agent_id: agent.id.clone(),
                    })
                    .await
                    .ok();
                let failed = matches!(
                    now,
                    Some(DaemonMessage::Agent(Answer { ref body, .. })) if body.agent.status == AgentStatus::Error
                );
                if failed {
                    eprintln!(
                        "drover: {name} is idle; its last turn failed (`drover logs {name}` says why)"
                    );
                    failed_names.push(name.clone());
                } else {
                    eprintln!("drover: {name} is idle");
                }
            }
            DaemonMessage::Idle(Answer {
                body: answers::Idle { idle: false, .. },
                ..
            }) => busy.push(name.clone()),
            other => return Err(unexpected(&other)),
        }
    }
    connection.close().await;
    if busy.is_empty() {
        // A script that waits (`drover wait a b && next`) must not go on past a failed turn.
        if failed_names.is_empty() {
            return Ok(());
        }
        return Err(CliError::Reported {
            code: exit::ERROR,
            message: format!("the last turn of {} failed", failed_names.join(", ")),
        }
        .into());
    }
    Err(CliError::Timeout(format!(
        "{} still busy after {:.1}s",
        if busy.len() == 1 {
            format!("{} is", busy[0])
        } else {
            format!("{} are", busy.join(", "))
        },
        timeout.unwrap_or_default().as_secs_f64()
    ))
    .into())
}

pub async fn stop(ctx: &Ctx, id: &str, drop_queue: bool) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(rq::Cancel {
            agent_id: agent.id.clone(),
            keep_inbox: !drop_queue,
        })
        .await?;
    connection.close().await;
    if drop_queue {
        outln!("stopped {name} and discarded its queued messages");
    } else {
        outln!("stopped {name}");
    }
    Ok(())
}

pub async fn archive(ctx: &Ctx, id: &str, stop: bool, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let agent = resolve(&agents, id, Prefer::Live)?.clone();
    let short = ShortIds::new(&agents);
    let name = short.get(&agent.id).to_string();
    let answer = connection
        .request(rq::Archive {
            agent_id: agent.id.clone(),
            stop_activity: stop,
            dry_run: false,
        })
        .await;
    connection.close().await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            if let Some(CliError::Daemon {
                code,
                details: Some(details),
                ..
            }) = e.downcast_ref::<CliError>()
                && ErrorCode::parse(code) == Some(ErrorCode::AgentActive)
            {
                eprintln!("drover: cannot archive {name}: work still runs:");
                for line in activity_lines(details, &short) {
                    eprintln!("  {line}");
                }
                eprintln!("archive it anyway, stopping that work: drover archive {name} --stop");
                return Err(CliError::Reported {
                    code: exit::REFUSED,
                    message: "agent_active".to_string(),
                }
                .into());
            }
            return Err(e);
        }
    };
    let DaemonMessage::Archived(Answer {
        body: answers::Archived {
            archived, stopped, ..
        },
        ..
    }) = &answer
    else {
        return Err(unexpected(&answer));
    };
    if json {
        return print_json(&json!({"agentId": agent.id, "archived": archived, "stopped": stopped}));
    }
    if !archived.contains(&agent.id) {
        outln!("{name} was already archived");
        return Ok(());
    }
    let others = archived.iter().filter(|a| **a != agent.id).count();
    let mut line = format!("archived {name}");
    if others > 0 {
        // Writing to a `String` cannot fail.
        let _ = write!(
            line,
            " and {others} subagent{}",
            if others == 1 { "" } else { "s" }
        );
    }
    outln!("{line}");
    for item in activity_lines(stopped, &short) {
        outln!("  stopped {item}");
    }
    Ok(())
}

/// One line per running item of an activity report (`{agentId, families: {name: [items]}}`),
/// agents named by their handles.
fn activity_lines(report: &Value, short: &ShortIds) -> Vec<String> {
    let Some(families) = report.get("families").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for (family, items) in families {
        for item in items.as_array().into_iter().flatten() {
            let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
            let who = match item.get("agentId").and_then(Value::as_str) {
                Some(id) => short.get(id).to_string(),
                None => text("id").to_string(),
            };
            let title = match text("title") {
                "" => String::new(),
                t => format!(" \"{t}\""),
            };
            lines.push(format!("{family}: {who}{title}: {}", text("detail")));
        }
    }
    lines
}

pub async fn retry(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    // Nothing failed and nothing waits for a limit: say so, and what the agent waits for.
    if agent.start_failure.is_none()
        && agent.limited.is_none()
        && agent.status != AgentStatus::Error
    {
        connection.close().await;
        let status = agent.status.as_str();
        if agent.attention_reason == Some(AttentionReason::Interrupted) {
            eprintln!(
                "{name} has no failed start to retry ({status}): its turn was cut off when the \
                 daemon stopped; to go on, send it a message: drover send {name} \"continue\""
            );
        } else {
            eprintln!("{name} has no failed start to retry ({status}); nothing was done");
        }
        return Ok(());
    }
    let answer = connection
        .request(rq::RestartAgent {
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    answer
        .into_answer::<answers::Ok>()
        .map_err(|m| unexpected(&m))?;
    if agent.limited.is_some() {
        eprintln!(
            "sending {name}'s prompt now, without waiting for the usage limit's reset (`drover attach {name}` to watch)"
        );
    } else {
        eprintln!("starting {name} again (`drover attach {name}` to watch)");
    }
    Ok(())
}

/// `drover set AGENT SETTING VALUE`: mode, model, reasoning effort or another option the
/// agent offers.
pub async fn set(ctx: &Ctx, id: &str, setting: &str, value: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(rq::SetConfigOption {
            agent_id: agent.id.clone(),
            config_id: setting.to_string(),
            value: value.to_string(),
        })
        .await?;
    connection.close().await;
    answer
        .into_answer::<answers::Ok>()
        .map_err(|m| unexpected(&m))?;
    outln!("{name}: {setting} = {value}");
    Ok(())
}

/// `drover budget AGENT --tokens N --cost X` (or `--clear`).
pub async fn budget(
    ctx: &Ctx,
    id: &str,
    tokens: Option<u64>,
    cost: Option<f64>,
    hard: bool,
    clear: bool,
) -> anyhow::Result<()> {
    if !clear && tokens.is_none() && cost.is_none() {
        anyhow::bail!("give --tokens and/or --cost, or --clear");
    }
    let budget = (!clear).then_some(drover_protocol::Budget { tokens, cost, hard });
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(rq::SetBudget {
            agent_id: agent.id.clone(),
            budget: budget.clone(),
        })
        .await?;
    connection.close().await;
    answer
        .into_answer::<answers::Ok>()
        .map_err(|m| unexpected(&m))?;
    if let Some(b) = &budget {
        outln!("{name}: budget {}", budget_line(b));
    } else {
        outln!("{name}: no budget");
    }
    Ok(())
}

/// "1000 tokens, 2.5000 cost".
pub(crate) fn budget_line(budget: &drover_protocol::Budget) -> String {
    let mut parts = Vec::new();
    if let Some(tokens) = budget.tokens {
        parts.push(format!("{tokens} tokens"));
    }
    if let Some(cost) = budget.cost {
        parts.push(format!("{cost:.4} cost"));
    }
    let mut line = parts.join(", ");
    if budget.hard {
        line.push_str(", hard (running turns are cancelled at 100 %)");
    }
    line
}

pub async fn unarchive(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent_preferring(id, Prefer::Archived).await?;
    connection
        .request(rq::Unarchive {
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    if agent.archived_at.is_none() {
        outln!("{name} was not archived");
    } else {
        outln!("unarchived {name}");
    }
    Ok(())
}

pub async fn detach(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(rq::Detach {
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    if agent.parent_agent_id.is_none() {
        outln!("{name} is a top-level agent already");
    } else {
        outln!("detached {name}: it is a top-level agent now");
    }
    Ok(())
}

pub async fn permit(ctx: &Ctx, id: &str, answer: PermitAnswer, always: bool) -> anyhow::Result<()> {
    let kind = match (answer, always) {
        (PermitAnswer::Allow, false) => "allow_once",
        (PermitAnswer::Allow, true) => "allow_always",
        (PermitAnswer::Deny, false) => "reject_once",
        (PermitAnswer::Deny, true) => "reject_always",
    };
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(rq::AnswerPermission {
            agent_id: agent.id.clone(),
            seq: None,
            kind: Some(kind.to_string()),
            option_id: None,
            cancel: false,
        })
        .await?;
    connection.close().await;
    let verb = match answer {
        PermitAnswer::Allow => "allowed",
        PermitAnswer::Deny => "denied",
    };
    outln!("{verb} the oldest request of {name} ({kind})");
    Ok(())
}
