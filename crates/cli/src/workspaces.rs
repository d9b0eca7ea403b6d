//! The workspace commands: `drover workspaces` and `drover worktree ls|new|status|rm`, each
//! over the client protocol (the CLI never reads the store).

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, CommandRunInfo, DaemonMessage, ErrorCode, NewWorktree, WorkspaceActivity,
    WorkspaceInfo, WorktreeStatusInfo,
};
use serde_json::json;

use crate::args::WorktreeAction;
use crate::client::SessionState;
use crate::commands::{Ctx, print_json, unexpected, working_directory};
use crate::error::{CliError, exit};
use crate::output::{self, Paint, Table};
use crate::resolve::{Prefer, ShortIds, resolve_workspace};

/// Handles for the workspaces (of every workspace the daemon knows, so that they do not
/// change with `--all`).
fn handles(workspaces: &[WorkspaceInfo]) -> ShortIds {
    let ids: Vec<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
    ShortIds::of(&ids)
}

/// `drover worktree ...`.
pub async fn worktree(ctx: &Ctx, action: WorktreeAction) -> anyhow::Result<()> {
    match action {
        WorktreeAction::Ls { all, json } => list(ctx, all, true, json).await,
        WorktreeAction::New {
            name,
            repo,
            branch,
            base,
            json,
        } => new(ctx, name, repo, branch, base, json).await,
        WorktreeAction::Status { ws, json } => status(ctx, &ws, json).await,
        WorktreeAction::Rm { ws, force, json } => remove(ctx, &ws, force, json).await,
    }
}

/// `drover workspaces` (every kind) and `drover worktree ls` (`worktrees`: worktrees only).
pub async fn list(ctx: &Ctx, all: bool, worktrees: bool, json: bool) -> anyhow::Result<()> {
    let (mut connection, state) = ctx.connect().await?;
    let answer = connection
        .request(rq::ListWorkspaces {
            include_archived: all,
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Workspaces(Answer {
        body: answers::Workspaces {
            workspaces: mut listed,
            ..
        },
        ..
    }) = answer
    else {
        return Err(unexpected(&answer));
    };
    let short = handles(&state.workspaces);
    if worktrees {
        listed.retain(|w| w.worktree.is_some());
    }
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    // The agents `drover ls` (with `--all`, `drover ls --all`) shows.
    let count = |w: &WorkspaceInfo| {
        state
            .agents
            .iter()
            .filter(|a: &&AgentInfo| a.workspace_id == w.id && (all || a.archived_at.is_none()))
            .count()
    };
    if json {
        let mut values = Vec::with_capacity(listed.len());
        for w in &listed {
            let mut value = serde_json::to_value(w)?;
            value["agentCount"] = json!(count(w));
            values.push(value);
        }
        return print_json(&values);
    }
    if listed.is_empty() {
        if worktrees {
            eprintln!("drover: no worktrees; make one with `drover worktree new NAME`");
        } else {
            eprintln!("drover: no workspaces; `drover run` makes one for its directory");
        }
        return Ok(());
    }
    let branch = |w: &WorkspaceInfo| {
        w.worktree
            .as_ref()
            .map_or_else(|| "-".to_string(), |t| t.branch.clone())
    };
    let mut table = if worktrees {
        Table::new(vec![
            "ID", "NAME", "BRANCH", "BASE", "ACTIVITY", "AGENTS", "PATH",
        ])
    } else {
        Table::new(vec![
            "ID", "KIND", "NAME", "ACTIVITY", "AGENTS", "BRANCH", "PATH",
        ])
    };
    for w in &listed {
        let id = (short.get(&w.id).to_string(), Paint::Plain);
        let name = (output::truncate(&w.name, 40), Paint::Bold);
        let agents = (count(w).to_string(), Paint::Plain);
        let path = (output::tilde(&w.path), Paint::Dim);
        let branch = (branch(w), Paint::Plain);
        if worktrees {
            let base = w
                .worktree
                .as_ref()
                .map_or_else(|| "-".to_string(), |t| t.base.clone());
            table.row(vec![
                id,
                name,
                branch,
                (base, Paint::Plain),
                activity(w),
                agents,
                path,
            ]);
        } else {
            let kind = (w.kind.to_string(), Paint::Plain);
            table.row(vec![id, kind, name, activity(w), agents, branch, path]);
        }
    }
    let mut out = std::io::stdout().lock();
    table.write(&mut out, ctx.style)?;
    Ok(())
}

/// A workspace's activity cell: archived, what it shows, or `-`.
fn activity(w: &WorkspaceInfo) -> (String, Paint) {
    if w.archived_at.is_some() {
        return ("archived".to_string(), Paint::Dim);
    }
    match w.activity {
        Some(a @ (WorkspaceActivity::Permission | WorkspaceActivity::Attention)) => {
            (a.to_string(), Paint::Yellow)
        }
        Some(a @ WorkspaceActivity::Error) => (a.to_string(), Paint::Red),
        Some(a @ WorkspaceActivity::Running) => (a.to_string(), Paint::Green),
        Some(a @ WorkspaceActivity::Idle) => (a.to_string(), Paint::Plain),
        None => ("-".to_string(), Paint::Plain),
    }
}

/// `drover worktree new`: prints the new worktree's path on stdout; what was made, and the
/// setup commands with their output, on stderr.
async fn new(
    ctx: &Ctx,
    name: Option<String>,
    repo: Option<PathBuf>,
    branch: Option<String>,
    base: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let repo = match repo {
        Some(dir) => dir,
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let repo = working_directory(&repo)?;
    let (mut connection, SessionState { mut workspaces, .. }) = ctx.connect().await?;
    let answer = connection
        .request(rq::CreateWorktree {
            repository: repo.display().to_string(),
            worktree: NewWorktree { name, branch, base },
        })
        .await?;
    connection.close().await;
    let DaemonMessage::WorktreeCreated(Answer {
        body: answers::WorktreeCreated {
            workspace, setup, ..
        },
        ..
    }) = answer
    else {
        return Err(unexpected(&answer));
    };
    if json {
        return print_json(&json!({"workspace": workspace, "setup": setup}));
    }
    workspaces.push(workspace.clone());
    let handle = handles(&workspaces).get(&workspace.id).to_string();
    for run in &setup {
        show_run("setup", run);
    }
    match &workspace.worktree {
        Some(t) => eprintln!(
            "drover: made worktree {handle} ({}) on branch {} from {}",
            workspace.name, t.branch, t.base
        ),
        None => eprintln!("drover: made worktree {handle} ({})", workspace.name),
    }
    outln!("{}", workspace.path);
    Ok(())
}

/// A setup or teardown command as it ran, on stderr: `setup: npm ci (exit 0, 2.3s)` and its
/// output under it.
fn show_run(what: &str, run: &CommandRunInfo) {
    let ended = match (run.exit_code, run.timed_out) {
        (_, true) => "timed out".to_string(),
        (Some(code), false) => format!("exit {code}"),
        (None, false) => "killed".to_string(),
    };
    let secs = std::time::Duration::from_millis(run.duration_ms).as_secs_f64();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{what}: {} ({ended}, {secs:.1}s)", run.command);
    for line in run.output.lines() {
        let _ = writeln!(err, "  | {line}");
    }
}

/// What a worktree holds, one line each: the counts, then the entries indented.
fn status_lines(status: &WorktreeStatusInfo) -> Vec<String> {
    let mut lines = Vec::new();
    if status.missing {
        lines.push("its folder is missing (removed outside drover)".to_string());
    }
    let mut section = |count: usize, one: &str, many: &str, items: &[String]| {
        if count == 0 {
            return;
        }
        lines.push(format!("{count} {}:", if count == 1 { one } else { many }));
        lines.extend(items.iter().map(|i| format!("  {i}")));
        if count > items.len() {
            lines.push(format!("  … and {} more", count - items.len()));
        }
    };
    section(
        status.uncommitted_count,
        "uncommitted change",
        "uncommitted changes",
        &status.uncommitted,
    );
    section(
        status.unpushed_count,
        "unpushed commit",
        "unpushed commits",
        &status.unpushed,
    );
    lines
}

/// `drover worktree status`: exit 0 when the worktree holds nothing that exists nowhere else,
/// 1 when it does.
async fn status(ctx: &Ctx, query: &str, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { workspaces, .. }) = ctx.connect().await?;
    let workspace = resolve_workspace(&workspaces, query, Prefer::Live)?;
    let handle = handles(&workspaces).get(&workspace.id).to_string();
    let answer = connection
        .request(rq::GetWorktreeStatus {
            workspace_id: workspace.id.clone(),
        })
        .await?;
    connection.close().await;
    let answers::WorktreeStatus { status, .. } =
        answer.into_answer().map_err(|m| unexpected(&m))?;
    if json {
        print_json(&status)?;
    } else {
        outln!(
            "worktree {handle} ({}) on {} at {}",
            workspace.name,
            status.branch,
            status.path
        );
        if status.is_clean() {
            outln!("clean: nothing uncommitted, nothing unpushed");
        }
        for line in status_lines(&status) {
            outln!("{line}");
        }
    }
    if status.is_clean() {
        return Ok(());
    }
    Err(CliError::Reported {
        code: exit::ERROR,
        message: format!("worktree {handle} holds uncommitted or unpushed work"),
    }
    .into())
}

/// `drover worktree rm`: archives the worktree's workspace (and agents), which removes it.
async fn remove(ctx: &Ctx, query: &str, force: bool, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { workspaces, .. }) = ctx.connect().await?;
    let workspace = resolve_workspace(&workspaces, query, Prefer::Live)?.clone();
    let handle = handles(&workspaces).get(&workspace.id).to_string();
    if workspace.worktree.is_none() {
        connection.close().await;
        eprintln!(
            "drover: {handle} ({}) is a {} workspace, not a worktree drover made: nothing to remove",
            workspace.name, workspace.kind
        );
        return Err(CliError::Reported {
            code: exit::REFUSED,
            message: ErrorCode::NotAWorktree.to_string(),
        }
        .into());
    }
    let answer = connection
        .request(rq::ArchiveWorkspace {
            workspace_id: workspace.id.clone(),
            force,
        })
        .await;
    connection.close().await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => return Err(refusal(e, &handle, &workspace.name)),
    };
    let DaemonMessage::WorkspaceArchived(Answer {
        body:
            answers::WorkspaceArchived {
                workspace_id,
                archived_at,
                already_archived,
                agents,
                worktree,
                ..
            },
        ..
    }) = answer
    else {
        return Err(unexpected(&answer));
    };
    if json {
        return print_json(&json!({
            "workspaceId": workspace_id,
            "archivedAt": archived_at,
            "alreadyArchived": already_archived,
            "agents": agents,
            "worktree": worktree,
        }));
    }
    if already_archived {
        outln!("{handle} was already removed");
        return Ok(());
    }
    let mut line = format!("removed worktree {handle} ({})", workspace.name);
    if !agents.is_empty() {
        let n = agents.len();
        // Writing to a `String` cannot fail.
        let _ = write!(
            line,
            " and archived {n} agent{}",
            if n == 1 { "" } else { "s" }
        );
    }
    let Some(removal) = worktree else {
        outln!("{line}");
        return Ok(());
    };
    for run in &removal.teardown {
        show_run("teardown", run);
    }
    outln!("{line}");
    if !removal.removed {
        outln!("  its folder was gone already");
    }
    if removal.branch_deleted {
        outln!("  deleted branch {}", removal.status.branch);
    } else {
        outln!(
            "  kept branch {}: it has commits found on no other branch",
            removal.status.branch
        );
    }
    if !removal.status.is_clean() {
        outln!("  discarded:");
        for line in status_lines(&removal.status) {
            outln!("    {line}");
        }
    }
    Ok(())
}

/// A failed `archive_workspace`: a `worktree_dirty` refusal lists what the worktree holds and
/// the command that removes it anyway; a failed teardown says the same command.
fn refusal(error: anyhow::Error, handle: &str, name: &str) -> anyhow::Error {
    let Some(CliError::Daemon {
        code,
        message,
        details,
    }) = error.downcast_ref::<CliError>()
    else {
        return error;
    };
    let anyway = format!("drover worktree rm {handle} --force");
    match ErrorCode::parse(code) {
        Some(ErrorCode::WorktreeDirty) => {
            let status = details
                .clone()
                .and_then(|d| serde_json::from_value::<WorktreeStatusInfo>(d).ok());
            eprintln!(
                "drover: cannot remove worktree {handle} ({name}): it holds work found nowhere else:"
            );
            match status {
                Some(status) => {
                    for line in status_lines(&status) {
                        eprintln!("  {line}");
                    }
                }
                None => eprintln!("  {message}"),
            }
            eprintln!("remove it anyway, discarding that work: {anyway}");
            CliError::Reported {
                code: exit::REFUSED,
                message: code.clone(),
            }
            .into()
        }
        Some(ErrorCode::WorktreeTeardownFailed) => {
            eprintln!("drover: {message}");
            eprintln!("remove it anyway, without the teardown: {anyway}");
            CliError::Reported {
                code: exit::ERROR,
                message: code.clone(),
            }
            .into()
        }
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_list_what_a_worktree_holds() {
        let status = WorktreeStatusInfo {
            path: "/w".to_string(),
            branch: "drover/x".to_string(),
            missing: false,
            uncommitted: vec![" M a.txt".to_string(), "?? b.txt".to_string()],
            uncommitted_count: 3,
            unpushed: vec!["abc1234 subject".to_string()],
            unpushed_count: 1,
        };
        assert_eq!(
            status_lines(&status),
            [
                "3 uncommitted changes:",
                "   M a.txt",
                "  ?? b.txt",
                "  … and 1 more",
                "1 unpushed commit:",
                "  abc1234 subject",
            ]
        );
        assert!(!status.is_clean());
    }

    #[test]
    fn a_refusal_without_details_keeps_its_error() {
        let error: anyhow::Error = CliError::Daemon {
            code: "git_failed".to_string(),
            message: "boom".to_string(),
            details: None,
        }
        .into();
        let kept = refusal(error, "abcd1234", "x");
        assert_eq!(crate::error::exit_code(&kept), exit::ERROR);
        assert_eq!(kept.to_string(), "boom");
    }
}
