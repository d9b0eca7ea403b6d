//! `drover import paseo [PATH] [--apply]`: brings in the agents of a Paseo home (by default
//! `$PASEO_HOME`, else `~/.paseo`) through the daemon; `drover import sessions PROVIDER
//! [--cwd DIR] [--session ID]... [--apply]`: a provider's own past sessions, as its agent
//! lists them. Without `--apply` both only say what they would do.

use std::path::PathBuf;

use anyhow::Context;
use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{DaemonMessage, ImportedAgentInfo};

use crate::args::ImportSource;
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::CliError;
use crate::output::{self, Paint, Style};

/// `drover import ...`.
pub async fn run(ctx: &Ctx, source: ImportSource) -> anyhow::Result<()> {
    match source {
        ImportSource::Paseo { path, apply, json } => paseo(ctx, path, apply, json).await,
        ImportSource::Sessions {
            provider,
            cwd,
            sessions,
            apply,
            json,
        } => self::sessions(ctx, &provider, cwd, sessions, apply, json).await,
    }
}

async fn paseo(ctx: &Ctx, path: Option<PathBuf>, apply: bool, json: bool) -> anyhow::Result<()> {
    let path = match path {
        Some(path) => path,
        None => default_home()?,
    };
    let path = std::path::absolute(&path)
        .with_context(|| format!("cannot make `{}` absolute", path.display()))?;
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection
        .request(rq::ImportPaseo {
            path: path.display().to_string(),
            apply,
        })
        .await?;
    connection.close().await;
    report(&answer, &path.display().to_string(), json)
}

/// `drover import sessions`: the provider's sessions (in `cwd`, made absolute, when given).
async fn sessions(
    ctx: &Ctx,
    provider: &str,
    cwd: Option<PathBuf>,
    sessions: Vec<String>,
    apply: bool,
    json: bool,
) -> anyhow::Result<()> {
    let cwd = cwd
        .map(|cwd| {
            std::path::absolute(&cwd)
                .with_context(|| format!("cannot make `{}` absolute", cwd.display()))
        })
        .transpose()?;
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection
        .request(rq::ImportSessions {
            provider: provider.to_string(),
            cwd: cwd.as_ref().map(|c| c.display().to_string()),
            sessions,
            apply,
        })
        .await?;
    connection.close().await;
    let from = match &cwd {
        Some(cwd) => format!(
            "{provider}'s sessions in {}",
            output::tilde(&cwd.display().to_string())
        ),
        None => format!("{provider}'s sessions"),
    };
    report(&answer, &from, json)
}

/// Prints an `imported` answer: what came in from `from` (or would), and what was skipped.
fn report(answer: &DaemonMessage, from: &str, json: bool) -> anyhow::Result<()> {
    let DaemonMessage::Imported(Answer {
        body:
            answers::Imported {
                dry_run,
                imported,
                skipped,
                ..
            },
        ..
    }) = &answer
    else {
        return Err(unexpected(answer));
    };
    if json {
        return print_json(&serde_json::json!({
            "dryRun": dry_run, "imported": imported, "skipped": skipped,
        }));
    }
    let style = Style::detect();
    let count = |n: usize| {
        if n == 1 {
            "1 agent".to_string()
        } else {
            format!("{n} agents")
        }
    };
    if *dry_run {
        outln!(
            "would import {} from {from} (a dry run: nothing changed; --apply imports them)",
            count(imported.len()),
        );
    } else {
        outln!("imported {} from {from}", count(imported.len()));
    }
    for agent in imported {
        outln!("  {}", line(agent, style));
    }
    if !skipped.is_empty() {
        outln!("skipped {}:", skipped.len());
        for skip in skipped {
            let source = skip
                .source
                .strip_prefix(&format!("{from}/"))
                .unwrap_or(&skip.source);
            outln!("  {source}: {}", skip.reason);
        }
    }
    Ok(())
}

/// One imported agent: its new handle (or source id), provider, status, title and cwd.
fn line(agent: &ImportedAgentInfo, style: Style) -> String {
    // New ids share their time prefix: the handle is the end, as `drover ls` shows it.
    let id = agent.agent_id.as_deref().map_or_else(
        || agent.source_id.clone(),
        |id| id[id.len().saturating_sub(8)..].to_string(),
    );
    let mut status = agent.status.to_string();
    if agent.archived {
        status.push_str(" (archived)");
    }
    let mut extra = Vec::new();
    if let Some(parent) = &agent.parent_source_id {
        extra.push(format!("subagent of {parent}"));
    }
    if agent.resumes {
        extra.push("continues its session".to_string());
    }
    if let Some(note) = &agent.note {
        extra.push(note.clone());
    }
    let title = agent.title.as_deref().unwrap_or("-");
    let extra = if extra.is_empty() {
        String::new()
    } else {
        style.paint(Paint::Dim, &format!("  ({})", extra.join("; ")))
    };
    format!(
        "{id}  {}  {status}  {title}  {}{extra}",
        agent.provider,
        output::tilde(&agent.cwd)
    )
}

/// `$PASEO_HOME`, else `~/.paseo`.
fn default_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os("PASEO_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".paseo")),
        None => Err(CliError::BadArgument(
            "no PATH given and HOME is not set: give the Paseo home's path".to_string(),
        )
        .into()),
    }
}
