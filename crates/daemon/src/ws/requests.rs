//! The client protocol's requests: each decoded [`ClientMessage`] calls one operation and
//! encodes its answer. Nothing here decides anything; see `crate::ops`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_core::AgentId;
use drover_core::WorktreeOptions;
use drover_protocol::{ClientMessage, DaemonMessage, ErrorCode, NewWorktree};
use serde_json::Value;

use super::request_error;
use crate::ops::agents::{AgentScope, CreateAgent, Placement};
use crate::ops::schedules::{CreateSchedule, ScheduleFor};
use crate::ops::{Caller, OpError, Ops, parse_agent, parse_workspace};
use crate::wire;

/// Every client of the protocol is the machine's user.
const CALLER: Caller = Caller::User;

/// What a request hands back to the session loop.
pub(super) enum Reply {
    Send(DaemonMessage),
    /// `agent_initialized`: send it, then let through only the updates newer than `revision`.
    Initialized {
        agent: AgentId,
        revision: u64,
        message: DaemonMessage,
    },
}

/// Answers one request (never `hello`: the session answers that itself).
pub(super) async fn handle(message: ClientMessage, ops: &Ops) -> Reply {
    let request_id = message.request_id().map(str::to_string);
    match answer(message, ops).await {
        Ok(reply) => reply,
        Err(e) => Reply::Send(request_error(
            request_id,
            e.code(),
            e.to_string(),
            crate::wire::error_details(&e),
        )),
    }
}

type Answered = Result<Reply, OpError>;

// The protocol's dispatch table, one arm per client message: each arm takes the message's
// fields and calls one operation or one handler below.
#[allow(clippy::too_many_lines)]
async fn answer(message: ClientMessage, ops: &Ops) -> Answered {
    use ClientMessage as M;
    match message {
        M::Hello { .. } => Ok(Reply::Send(request_error(
            None,
            ErrorCode::InvalidMessage,
            "`hello` was already sent".into(),
            None,
        ))),
        M::InitializeAgentRequest {
            agent_id,
            request_id,
            limit,
        } => initialize_agent(ops, request_id, &agent_id, limit).await,
        M::FetchTimeline {
            agent_id,
            request_id,
            before,
            after,
            limit,
        } => fetch_timeline(ops, request_id, &agent_id, before, after, limit).await,
        message @ M::CreateAgent { .. } => create_agent(ops, message).await,
        M::SendMessage {
            request_id,
            agent_id,
            text,
            delivery,
        } => {
            let id = parse_agent(&agent_id)?;
            let sent = ops.send_message(CALLER, id, text, delivery, false).await?;
            send(DaemonMessage::MessageQueued {
                request_id,
                agent_id: id.to_string(),
                message_id: sent.message_id,
            })
        }
        M::Cancel {
            request_id,
            agent_id,
            keep_inbox,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.cancel(CALLER, id, keep_inbox).await?;
            ok(request_id, id)
        }
        M::Archive {
            request_id,
            agent_id,
            stop_activity,
        } => archive(ops, request_id, &agent_id, stop_activity).await,
        M::Unarchive {
            request_id,
            agent_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.unarchive(CALLER, id).await?;
            ok(request_id, id)
        }
        M::Detach {
            request_id,
            agent_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.detach(CALLER, id).await?;
            ok(request_id, id)
        }
        M::ArchiveIdleChildren {
            request_id,
            agent_id,
        } => archive_idle_children(ops, request_id, &agent_id).await,
        M::AnswerPermission {
            request_id,
            agent_id,
            seq,
            kind,
            option_id,
            cancel,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.answer_permission(CALLER, id, seq, kind, option_id, cancel)
                .await?;
            ok(request_id, id)
        }
        M::SetMode {
            request_id,
            agent_id,
            mode_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.set_mode(CALLER, id, mode_id).await?;
            ok(request_id, id)
        }
        M::SetModel {
            request_id,
            agent_id,
            model_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.set_model(CALLER, id, model_id).await?;
            ok(request_id, id)
        }
        M::SetConfigOption {
            request_id,
            agent_id,
            config_id,
            value,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.set_config_option(CALLER, id, config_id, value).await?;
            ok(request_id, id)
        }
        M::SetTitle {
            request_id,
            agent_id,
            title,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.set_title(CALLER, id, title).await?;
            ok(request_id, id)
        }
        M::SetBudget {
            request_id,
            agent_id,
            budget,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.set_budget(CALLER, id, budget).await?;
            ok(request_id, id)
        }
        M::ClearAttention {
            request_id,
            agent_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.clear_attention(CALLER, id).await?;
            ok(request_id, id)
        }
        M::WorkspaceChanges {
            request_id,
            workspace_id,
        } => {
            let id = parse_workspace(&workspace_id)?;
            let changes = ops.workspace_changes(id).await?;
            send(DaemonMessage::WorkspaceChanges {
                request_id,
                workspace_id: id.to_string(),
                changes: wire::workspace_changes(changes),
            })
        }
        M::ListProviders { request_id } => send(DaemonMessage::Providers {
            request_id,
            providers: ops
                .list_providers()?
                .into_iter()
                .map(wire::provider)
                .collect(),
        }),
        // A session answers it from the hub's cache (`Session::answer_here`); this is the
        // same answer encoded afresh.
        M::ListAgents {
            request_id,
            include_archived,
        } => send(DaemonMessage::Agents {
            request_id,
            agents: ops
                .list_agents(AgentScope::All, include_archived)
                .iter()
                .map(|a| wire::agent_info_now(ops, a))
                .collect(),
        }),
        M::GetAgent {
            request_id,
            agent_id,
        } => {
            let id = parse_agent(&agent_id)?;
            let (agent, runtime, memory) = ops.get_agent(id).await?;
            let mut info = wire::agent_info(&agent, ops.live_session(id), &runtime, memory);
            info.queued = Some(ops.queued(id).await?.iter().map(wire::queued).collect());
            info.tree_spend = ops.tree_spend(id).as_ref().map(wire::tree_spend_info);
            info.runtime.agent = ops.advertised(id).map(wire::advertised);
            send(DaemonMessage::Agent {
                request_id,
                agent: info,
            })
        }
        M::RestartAgent {
            request_id,
            agent_id,
        } => {
            let id = parse_agent(&agent_id)?;
            ops.restart_agent(CALLER, id).await?;
            ok(request_id, id)
        }
        M::SignIn {
            request_id,
            provider,
            method_id,
            vars,
        } => {
            let retried = ops.sign_in(&provider, &method_id, vars).await?;
            send(DaemonMessage::SignedIn {
                request_id,
                provider,
                method_id,
                retried: retried.iter().map(ToString::to_string).collect(),
            })
        }
        M::ImportPaseo {
            request_id,
            path,
            apply,
        } => {
            let report = ops.import_paseo(Path::new(&path), apply).await?;
            send(wire::imported(request_id, report))
        }
        M::ImportSessions {
            request_id,
            provider,
            cwd,
            sessions,
            apply,
        } => {
            let report = ops
                .import_sessions(&provider, cwd.as_deref().map(Path::new), &sessions, apply)
                .await?;
            send(wire::imported(request_id, report))
        }
        M::WaitIdle {
            request_id,
            agent_id,
            timeout_ms,
        } => {
            let id = parse_agent(&agent_id)?;
            let idle = ops
                .wait_idle(id, timeout_ms.map(Duration::from_millis))
                .await?;
            send(DaemonMessage::Idle {
                request_id,
                agent_id: id.to_string(),
                idle,
            })
        }
        M::ListWorkspaces {
            request_id,
            include_archived,
        } => send(DaemonMessage::Workspaces {
            request_id,
            workspaces: workspace_infos(ops, include_archived)
                .into_iter()
                .chain(
                    ops.hosts
                        .workspaces()
                        .into_iter()
                        .filter_map(|w| serde_json::from_value(w).ok()),
                )
                .filter(|w: &drover_protocol::WorkspaceInfo| {
                    include_archived || w.archived_at.is_none()
                })
                .collect(),
        }),
        M::ListHosts { request_id } => send(DaemonMessage::Hosts {
            request_id,
            hosts: ops.hosts.list(),
        }),
        M::AddHost { request_id, host } => send(DaemonMessage::Hosts {
            request_id,
            hosts: ops.hosts.add(host)?,
        }),
        M::RemoveHost { request_id, name } => send(DaemonMessage::Hosts {
            request_id,
            hosts: ops.hosts.remove(&name)?,
        }),
        M::Ping { request_id } => send(DaemonMessage::Ok {
            request_id,
            agent_id: None,
        }),
        M::CreateWorktree {
            request_id,
            repository,
            name,
            branch,
            base,
        } => {
            create_worktree(
                ops,
                request_id,
                repository,
                NewWorktree { name, branch, base },
            )
            .await
        }
        M::GetWorktreeStatus {
            request_id,
            workspace_id,
        } => worktree_status(ops, request_id, &workspace_id).await,
        M::ArchiveWorkspace {
            request_id,
            workspace_id,
            force,
        } => archive_workspace(ops, request_id, &workspace_id, force).await,
        M::CreateSchedule {
            request_id,
            prompt,
            when,
            agent_id,
            new_agent,
            title,
        } => {
            let target = match (agent_id, new_agent) {
                (Some(agent), None) => ScheduleFor::Agent(agent),
                (None, Some(spec)) => ScheduleFor::NewAgent(spec),
                _ => {
                    return Err(OpError::invalid(
                        "agentId",
                        "give exactly one of `agentId` and `newAgent`",
                    ));
                }
            };
            let request = CreateSchedule {
                target,
                prompt,
                when,
                title,
            };
            let schedule = ops.create_schedule(CALLER, request).await?;
            send(DaemonMessage::Schedule {
                request_id,
                schedule: wire::schedule(&schedule),
            })
        }
        M::ListSchedules {
            request_id,
            agent_id,
        } => send(DaemonMessage::Schedules {
            request_id,
            schedules: ops
                .list_schedules(CALLER, agent_id.as_deref())?
                .iter()
                .map(wire::schedule)
                .collect(),
        }),
        M::PauseSchedule {
            request_id,
            schedule_id,
        } => send(DaemonMessage::Schedule {
            request_id,
            schedule: wire::schedule(&ops.pause_schedule(CALLER, &schedule_id).await?),
        }),
        M::ResumeSchedule {
            request_id,
            schedule_id,
        } => send(DaemonMessage::Schedule {
            request_id,
            schedule: wire::schedule(&ops.resume_schedule(CALLER, &schedule_id).await?),
        }),
        M::DeleteSchedule {
            request_id,
            schedule_id,
        } => send(DaemonMessage::ScheduleDeleted {
            request_id,
            schedule_id: ops.delete_schedule(CALLER, &schedule_id).await?.to_string(),
        }),
        M::Watching { request_id, .. } => Ok(Reply::Send(request_error(
            request_id,
            ErrorCode::InvalidMessage,
            "`watching` is answered by the session".into(),
            None,
        ))),
        M::NotifyStatus { request_id } => send(DaemonMessage::NotifyStatus {
            request_id,
            sinks: ops.notify_status().iter().map(wire::notify_sink).collect(),
        }),
        M::NotifyTest { request_id, sink } => send(DaemonMessage::NotifyTested {
            request_id,
            results: ops
                .notify_test(sink.as_deref())
                .await?
                .into_iter()
                .map(|(sink, outcome)| drover_protocol::NotifyTestResult {
                    sink,
                    delivered: outcome.is_ok(),
                    error: outcome.err(),
                })
                .collect(),
        }),
        message @ (M::StartJob { .. }
        | M::ListJobs { .. }
        | M::JobOutput { .. }
        | M::KillJob { .. }
        | M::WaitJob { .. }
        // The session answers these itself (see `super::jobs::Follows`).
        | M::FollowJob { .. }
        | M::UnfollowJob { .. }) => send(super::jobs::answer(message, ops).await?),
    }
}

/// `fetch_timeline`: one page of the agent's timeline, `before` or `after` a seq.
async fn fetch_timeline(
    ops: &Ops,
    request_id: Option<String>,
    agent_id: &str,
    before: Option<u64>,
    after: Option<u64>,
    limit: Option<usize>,
) -> Answered {
    let id = parse_agent(agent_id)?;
    let page = ops.timeline(id, before, after, limit).await?;
    send(DaemonMessage::TimelinePage {
        request_id,
        agent_id: id.to_string(),
        items: page
            .items
            .iter()
            .filter_map(|i| serde_json::to_value(i).ok())
            .collect(),
        has_older: page.has_older,
        has_newer: page.has_newer,
    })
}

async fn archive(
    ops: &Ops,
    request_id: Option<String>,
    agent_id: &str,
    stop_activity: bool,
) -> Answered {
    let id = parse_agent(agent_id)?;
    let outcome = ops.archive(CALLER, id, stop_activity).await?;
    send(DaemonMessage::Archived {
        request_id,
        agent_id: id.to_string(),
        archived: outcome.archived.iter().map(ToString::to_string).collect(),
        stopped: serde_json::to_value(&outcome.stopped).unwrap_or(Value::Null),
    })
}

async fn archive_idle_children(ops: &Ops, request_id: Option<String>, agent_id: &str) -> Answered {
    let id = parse_agent(agent_id)?;
    let outcome = ops.archive_idle_children(CALLER, id).await?;
    send(DaemonMessage::ChildrenArchived {
        request_id,
        agent_id: id.to_string(),
        archived: outcome.archived.iter().map(ToString::to_string).collect(),
        skipped: serde_json::to_value(&outcome.skipped).unwrap_or(Value::Null),
    })
}

async fn create_worktree(
    ops: &Ops,
    request_id: Option<String>,
    repository: String,
    worktree: NewWorktree,
) -> Answered {
    let created = ops
        .create_worktree(
            CALLER,
            Some(PathBuf::from(repository)),
            worktree_options(worktree),
        )
        .await?;
    let ws = &created.workspace;
    send(DaemonMessage::WorktreeCreated {
        request_id,
        workspace: wire::workspace_info(ws, ops.workspace_activity(ws.id)),
        setup: created.setup.iter().map(wire::command_run).collect(),
    })
}

async fn worktree_status(ops: &Ops, request_id: Option<String>, workspace_id: &str) -> Answered {
    let id = parse_workspace(workspace_id)?;
    let status = ops.worktree_status(id).await?;
    send(DaemonMessage::WorktreeStatus {
        request_id,
        workspace_id: id.to_string(),
        status: wire::worktree_status(&status),
    })
}

async fn archive_workspace(
    ops: &Ops,
    request_id: Option<String>,
    workspace_id: &str,
    force: bool,
) -> Answered {
    let id = parse_workspace(workspace_id)?;
    let outcome = ops.archive_workspace(CALLER, id, force).await?;
    send(DaemonMessage::WorkspaceArchived {
        request_id,
        workspace_id: id.to_string(),
        archived_at: outcome.archived_at.map(|t| t.to_string()),
        already_archived: outcome.already_archived,
        agents: outcome.agents.iter().map(ToString::to_string).collect(),
        worktree: outcome.worktree.as_ref().map(wire::worktree_removal),
    })
}

// Always `Ok`: it gives a plain answer the `Answered` shape every handler returns.
#[allow(clippy::unnecessary_wraps)]
fn send(message: DaemonMessage) -> Answered {
    Ok(Reply::Send(message))
}

fn ok(request_id: Option<String>, agent: AgentId) -> Answered {
    send(DaemonMessage::Ok {
        request_id,
        agent_id: Some(agent.to_string()),
    })
}

async fn initialize_agent(
    ops: &Ops,
    request_id: Option<String>,
    raw: &str,
    limit: Option<usize>,
) -> Answered {
    let id = parse_agent(raw)?;
    let opened = ops.initialize_agent(id, limit).await?;
    let agent = &opened.agent;
    let message = DaemonMessage::AgentInitialized {
        agent_id: id.to_string(),
        info: wire::agent_info_now(ops, agent),
        updates: opened
            .page
            .items
            .iter()
            .map(|i| wire::item_update(agent, i))
            .collect(),
        has_older: opened.page.has_older,
        cursor: opened.page.items.first().map(|i| i.seq),
        pending_permissions: opened
            .pending
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect(),
        revision: opened.page.revision,
        request_id,
    };
    Ok(Reply::Initialized {
        agent: id,
        revision: opened.page.revision,
        message,
    })
}

async fn create_agent(ops: &Ops, message: ClientMessage) -> Answered {
    let ClientMessage::CreateAgent {
        request_id,
        provider,
        cwd,
        workspace_id,
        prompt,
        title,
        model,
        mode,
        effort,
        labels,
        parent_agent_id,
        auto_archive,
        permission_policy,
        on_interrupt,
        on_limit,
        budget,
        worktree,
        // Another host's is forwarded before it gets here (`crate::hosts`).
        host: _,
    } = message
    else {
        return Err(OpError::invalid("type", "expected `create_agent`"));
    };
    let workspace = workspace_id.as_deref().map(parse_workspace).transpose()?;
    let placement = match (worktree, cwd) {
        (Some(_), _) if workspace.is_some() => {
            return Err(OpError::invalid(
                "worktree",
                "a new worktree is a new workspace: give `cwd` (its repository), not `workspaceId`",
            ));
        }
        (Some(worktree), Some(cwd)) => Placement::NewWorktree {
            source: Some(PathBuf::from(cwd)),
            options: worktree_options(worktree),
        },
        (Some(_), None) => {
            return Err(OpError::invalid(
                "cwd",
                "give the repository to make the worktree of",
            ));
        }
        // Neither `cwd` nor `workspaceId`: the operation refuses it.
        (None, cwd) => Placement::Existing {
            cwd: cwd.map(PathBuf::from),
            workspace,
        },
    };
    let parent = parent_agent_id.as_deref().map(parse_agent).transpose()?;
    let request = CreateAgent {
        provider: Some(provider),
        placement,
        prompt,
        title,
        model,
        mode,
        effort,
        labels,
        parent,
        auto_archive,
        permission_policy: Some(permission_policy),
        notify: None,
        on_interrupt,
        on_limit,
        budget,
    };
    let created = ops.create_agent(CALLER, request).await?;
    send(DaemonMessage::AgentCreated {
        request_id,
        agent: wire::agent_info_now(ops, &created.agent),
    })
}

fn worktree_options(worktree: NewWorktree) -> WorktreeOptions {
    WorktreeOptions {
        name: worktree.name,
        branch: worktree.branch,
        base: worktree.base,
        setup_timeout: None,
        // The operation says who asks.
        created_by: None,
    }
}

pub(super) fn workspace_infos(
    ops: &Ops,
    include_archived: bool,
) -> Vec<drover_protocol::WorkspaceInfo> {
    ops.list_workspaces(include_archived)
        .iter()
        .map(|w| wire::workspace_info(w, ops.workspace_activity(w.id)))
        .collect()
}
