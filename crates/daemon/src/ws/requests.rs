//! The client protocol's requests: each decoded [`ClientMessage`] calls one operation and
//! encodes its answer. Nothing here decides anything; see `crate::ops`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_core::AgentId;
use drover_core::WorktreeOptions;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{ClientMessage, ClientRequest, DaemonMessage, ErrorCode, NewWorktree};
use serde_json::Value;

use super::{jobs, pty, request_error};
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
pub(super) async fn handle(request: ClientRequest, ops: &Ops) -> Reply {
    let ClientRequest {
        request_id,
        message,
    } = request;
    match answer(message, request_id.clone(), ops).await {
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
/// The correlation id a request came with, for its answer.
type Id = Option<String>;

/// The protocol's dispatch table: one line per client request, each handled by the function
/// named after it (the job requests in `super::jobs`).
async fn answer(message: ClientMessage, id: Id, ops: &Ops) -> Answered {
    use ClientMessage as M;
    match message {
        M::Hello(_) => hello_again(),
        M::InitializeAgentRequest(r) => initialize_agent(ops, id, r).await,
        M::FetchTimeline(r) => fetch_timeline(ops, id, r).await,
        M::CreateAgent(r) => create_agent(ops, id, r).await,
        M::SendMessage(r) => send_message(ops, id, r).await,
        M::Cancel(r) => on_agent(id, &r.agent_id, |a| ops.cancel(CALLER, a, r.keep_inbox)).await,
        M::Archive(r) => archive(ops, id, r).await,
        M::Unarchive(r) => on_agent(id, &r.agent_id, |a| ops.unarchive(CALLER, a)).await,
        M::Detach(r) => on_agent(id, &r.agent_id, |a| ops.detach(CALLER, a)).await,
        M::ArchiveIdleChildren(r) => archive_idle_children(ops, id, r).await,
        M::AnswerPermission(r) => {
            on_agent(id, &r.agent_id, |a| {
                ops.answer_permission(CALLER, a, r.seq, r.kind, r.option_id, r.cancel)
            })
            .await
        }
        M::SetMode(r) => on_agent(id, &r.agent_id, |a| ops.set_mode(CALLER, a, r.mode_id)).await,
        M::SetModel(r) => on_agent(id, &r.agent_id, |a| ops.set_model(CALLER, a, r.model_id)).await,
        M::SetConfigOption(r) => {
            on_agent(id, &r.agent_id, |a| {
                ops.set_config_option(CALLER, a, r.config_id, r.value)
            })
            .await
        }
        M::SetTitle(r) => on_agent(id, &r.agent_id, |a| ops.set_title(CALLER, a, r.title)).await,
        M::SetBudget(r) => on_agent(id, &r.agent_id, |a| ops.set_budget(CALLER, a, r.budget)).await,
        M::ClearAttention(r) => on_agent(id, &r.agent_id, |a| ops.clear_attention(CALLER, a)).await,
        M::WorkspaceChanges(r) => workspace_changes(ops, id, r).await,
        M::ListProviders(r) => list_providers(ops, id, r).await,
        M::ListAgents(r) => list_agents(ops, id, &r),
        M::GetAgent(r) => get_agent(ops, id, r).await,
        M::RestartAgent(r) => on_agent(id, &r.agent_id, |a| ops.restart_agent(CALLER, a)).await,
        M::SignIn(r) => sign_in(ops, id, r).await,
        M::ImportPaseo(r) => import_paseo(ops, id, r).await,
        M::ImportSessions(r) => import_sessions(ops, id, r).await,
        M::WaitIdle(r) => wait_idle(ops, id, r).await,
        M::ListWorkspaces(r) => list_workspaces(ops, id, &r),
        M::ListHosts(_) => list_hosts(ops, id),
        M::AddHost(r) => add_host(ops, id, r),
        M::RemoveHost(r) => remove_host(ops, id, &r),
        M::Ping(_) => ping(id),
        M::CreateWorktree(r) => create_worktree(ops, id, r).await,
        M::GetWorktreeStatus(r) => get_worktree_status(ops, id, r).await,
        M::ArchiveWorkspace(r) => archive_workspace(ops, id, r).await,
        M::CreateSchedule(r) => create_schedule(ops, id, r).await,
        M::ListSchedules(r) => list_schedules(ops, id, &r),
        M::PauseSchedule(r) => pause_schedule(ops, id, r).await,
        M::ResumeSchedule(r) => resume_schedule(ops, id, r).await,
        M::DeleteSchedule(r) => delete_schedule(ops, id, r).await,
        M::Watching(_) => answered_by_the_session(id, "watching"),
        M::NotifyStatus(_) => notify_status(ops, id),
        M::NotifyTest(r) => notify_test(ops, id, r).await,
        M::TakeNotices(_) => take_notices(ops, id),
        M::AckNotices(r) => ack_notices(ops, id, &r),
        M::SetUpstreamGate(r) => set_upstream_gate(ops, id, r).await,
        M::SetUpstreamBudget(r) => set_upstream_budget(ops, id, r).await,
        M::StartJob(r) => send(jobs::start_job(ops, id, r).await?),
        M::ListJobs(r) => send(jobs::list_jobs(ops, id, &r)?),
        M::JobOutput(r) => send(jobs::job_output(ops, id, r).await?),
        M::KillJob(r) => send(jobs::kill_job(ops, id, r).await?),
        M::WaitJob(r) => send(jobs::wait_job(ops, id, r).await?),
        // The session answers these itself (see `super::jobs::Follows`).
        M::FollowJob(_) => answered_by_the_session(id, "follow_job"),
        M::UnfollowJob(_) => answered_by_the_session(id, "unfollow_job"),
        M::CreateTerminal(r) => send(pty::create_terminal(ops, id, r).await?),
        M::ListTerminals(r) => send(pty::list_terminals(ops, id, &r)?),
        M::ResizeTerminal(r) => send(pty::resize_terminal(ops, id, &r)?),
        M::CloseTerminal(r) => send(pty::close_terminal(ops, id, r).await?),
        // The session answers these itself (see `super::pty`).
        M::AttachTerminal(_) => answered_by_the_session(id, "attach_terminal"),
        M::TerminalInput(_) => answered_by_the_session(id, "terminal_input"),
        M::DetachTerminal(_) => answered_by_the_session(id, "detach_terminal"),
    }
}

// Always `Ok`: it gives a plain answer the `Answered` shape every handler returns.
#[expect(clippy::unnecessary_wraps)]
fn hello_again() -> Answered {
    Ok(Reply::Send(request_error(
        None,
        ErrorCode::InvalidMessage,
        "`hello` was already sent".into(),
        None,
    )))
}

// Always `Ok`: it gives a plain answer the `Answered` shape every handler returns.
#[expect(clippy::unnecessary_wraps)]
fn answered_by_the_session(id: Id, kind: &str) -> Answered {
    Ok(Reply::Send(request_error(
        id,
        ErrorCode::InvalidMessage,
        format!("`{kind}` is answered by the session"),
        None,
    )))
}

async fn send_message(ops: &Ops, request_id: Id, r: rq::SendMessage) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let sent = if r.notify_upstream {
        ops.send_from_upstream(id, r.text, r.delivery).await?
    } else {
        ops.send_message(CALLER, id, r.text, r.delivery, false)
            .await?
    };
    reply(
        request_id,
        answers::MessageQueued {
            agent_id: id.to_string(),
            message_id: sent.message_id,
        },
    )
}

async fn workspace_changes(ops: &Ops, request_id: Id, r: rq::WorkspaceChanges) -> Answered {
    let id = parse_workspace(&r.workspace_id)?;
    let changes = ops.workspace_changes(id).await?;
    reply(
        request_id,
        answers::WorkspaceChanges {
            workspace_id: id.to_string(),
            changes: wire::workspace_changes(changes),
        },
    )
}

async fn list_providers(ops: &Ops, request_id: Id, r: rq::ListProviders) -> Answered {
    reply(
        request_id,
        answers::Providers {
            providers: ops
                .list_providers_asking(r.ask_sign_in.as_deref())
                .await?
                .into_iter()
                .map(wire::provider)
                .collect(),
        },
    )
}

/// A session answers it from the hub's cache (`Session::answer_here`); this is the same
/// answer encoded afresh.
fn list_agents(ops: &Ops, request_id: Id, r: &rq::ListAgents) -> Answered {
    reply(
        request_id,
        answers::Agents {
            agents: ops
                .list_agents(AgentScope::All, r.include_archived)
                .iter()
                .map(|a| wire::agent_info_now(ops, a))
                .collect(),
        },
    )
}

async fn get_agent(ops: &Ops, request_id: Id, r: rq::GetAgent) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let (agent, runtime, memory) = ops.get_agent(id).await?;
    let mut info = wire::agent_info(&agent, ops.live_session(id), &runtime, memory);
    info.queued = Some(ops.queued(id).await?.iter().map(wire::queued).collect());
    info.tree_spend = ops.tree_spend(id).as_ref().map(wire::tree_spend_info);
    info.runtime.agent = ops.advertised(id).map(wire::advertised);
    reply(request_id, answers::Agent { agent: info })
}

async fn sign_in(ops: &Ops, request_id: Id, r: rq::SignIn) -> Answered {
    let retried = ops.sign_in(&r.provider, &r.method_id, r.vars).await?;
    reply(
        request_id,
        answers::SignedIn {
            provider: r.provider,
            method_id: r.method_id,
            retried: retried.iter().map(ToString::to_string).collect(),
        },
    )
}

async fn import_paseo(ops: &Ops, request_id: Id, r: rq::ImportPaseo) -> Answered {
    let report = ops.import_paseo(Path::new(&r.path), r.apply).await?;
    send(wire::imported(request_id, report))
}

async fn import_sessions(ops: &Ops, request_id: Id, r: rq::ImportSessions) -> Answered {
    let cwd = r.cwd.as_deref().map(Path::new);
    let report = ops
        .import_sessions(&r.provider, cwd, &r.sessions, r.apply)
        .await?;
    send(wire::imported(request_id, report))
}

async fn wait_idle(ops: &Ops, request_id: Id, r: rq::WaitIdle) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let idle = ops
        .wait_idle(id, r.timeout_ms.map(Duration::from_millis))
        .await?;
    reply(
        request_id,
        answers::Idle {
            agent_id: id.to_string(),
            idle,
        },
    )
}

fn list_workspaces(ops: &Ops, request_id: Id, r: &rq::ListWorkspaces) -> Answered {
    reply(
        request_id,
        answers::Workspaces {
            workspaces: workspace_infos(ops, r.include_archived)
                .into_iter()
                .chain(
                    ops.hosts
                        .workspaces()
                        .into_iter()
                        .filter_map(|w| serde_json::from_value(w).ok()),
                )
                .filter(|w: &drover_protocol::WorkspaceInfo| {
                    r.include_archived || w.archived_at.is_none()
                })
                .collect(),
        },
    )
}

fn take_notices(ops: &Ops, request_id: Id) -> Answered {
    reply(
        request_id,
        answers::Notices {
            notices: ops.notices(),
        },
    )
}

fn ack_notices(ops: &Ops, request_id: Id, r: &rq::AckNotices) -> Answered {
    ops.ack_notices(&r.ids)?;
    reply(request_id, answers::Ok { agent_id: None })
}

async fn set_upstream_gate(ops: &Ops, request_id: Id, r: rq::SetUpstreamGate) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let archived = r.archived.as_deref().map(parse_agent).transpose()?;
    ops.set_upstream_gate(id, archived).await?;
    ok(request_id, id)
}

async fn set_upstream_budget(ops: &Ops, request_id: Id, r: rq::SetUpstreamBudget) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    ops.set_upstream_budget(id, r.budgets).await?;
    ok(request_id, id)
}

fn list_hosts(ops: &Ops, request_id: Id) -> Answered {
    reply(
        request_id,
        answers::Hosts {
            hosts: ops.hosts.list(),
        },
    )
}

fn add_host(ops: &Ops, request_id: Id, r: rq::AddHost) -> Answered {
    reply(
        request_id,
        answers::Hosts {
            hosts: ops.hosts.add(r.host)?,
        },
    )
}

fn remove_host(ops: &Ops, request_id: Id, r: &rq::RemoveHost) -> Answered {
    reply(
        request_id,
        answers::Hosts {
            hosts: ops.hosts.remove(&r.name)?,
        },
    )
}

fn ping(request_id: Id) -> Answered {
    reply(request_id, answers::Ok { agent_id: None })
}

async fn create_schedule(ops: &Ops, request_id: Id, r: rq::CreateSchedule) -> Answered {
    let target = match (r.agent_id, r.new_agent) {
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
        prompt: r.prompt,
        when: r.when,
        title: r.title,
    };
    let schedule = ops.create_schedule(CALLER, request).await?;
    reply(
        request_id,
        answers::Schedule {
            schedule: wire::schedule(&schedule),
        },
    )
}

fn list_schedules(ops: &Ops, request_id: Id, r: &rq::ListSchedules) -> Answered {
    reply(
        request_id,
        answers::Schedules {
            schedules: ops
                .list_schedules(CALLER, r.agent_id.as_deref())?
                .iter()
                .map(wire::schedule)
                .collect(),
        },
    )
}

async fn pause_schedule(ops: &Ops, request_id: Id, r: rq::PauseSchedule) -> Answered {
    reply(
        request_id,
        answers::Schedule {
            schedule: wire::schedule(&ops.pause_schedule(CALLER, &r.schedule_id).await?),
        },
    )
}

async fn resume_schedule(ops: &Ops, request_id: Id, r: rq::ResumeSchedule) -> Answered {
    reply(
        request_id,
        answers::Schedule {
            schedule: wire::schedule(&ops.resume_schedule(CALLER, &r.schedule_id).await?),
        },
    )
}

async fn delete_schedule(ops: &Ops, request_id: Id, r: rq::DeleteSchedule) -> Answered {
    reply(
        request_id,
        answers::ScheduleDeleted {
            schedule_id: ops
                .delete_schedule(CALLER, &r.schedule_id)
                .await?
                .to_string(),
        },
    )
}

fn notify_status(ops: &Ops, request_id: Id) -> Answered {
    reply(
        request_id,
        answers::NotifyStatus {
            sinks: ops.notify_status().iter().map(wire::notify_sink).collect(),
        },
    )
}

async fn notify_test(ops: &Ops, request_id: Id, r: rq::NotifyTest) -> Answered {
    reply(
        request_id,
        answers::NotifyTested {
            results: ops
                .notify_test(r.sink.as_deref())
                .await?
                .into_iter()
                .map(|(sink, outcome)| drover_protocol::NotifyTestResult {
                    sink,
                    delivered: outcome.is_ok(),
                    error: outcome.err(),
                })
                .collect(),
        },
    )
}

/// `fetch_timeline`: one page of the agent's timeline, `before` or `after` a seq.
async fn fetch_timeline(ops: &Ops, request_id: Id, r: rq::FetchTimeline) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let page = ops.timeline(id, r.before, r.after, r.limit).await?;
    reply(
        request_id,
        answers::TimelinePage {
            agent_id: id.to_string(),
            items: page
                .items
                .iter()
                .filter_map(|i| serde_json::to_value(i).ok())
                .collect(),
            has_older: page.has_older,
            has_newer: page.has_newer,
        },
    )
}

async fn archive(ops: &Ops, request_id: Id, r: rq::Archive) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let outcome = ops.archive(CALLER, id, r.stop_activity, r.dry_run).await?;
    reply(
        request_id,
        answers::Archived {
            agent_id: id.to_string(),
            archived: outcome.archived.iter().map(ToString::to_string).collect(),
            stopped: serde_json::to_value(&outcome.stopped).unwrap_or(Value::Null),
        },
    )
}

async fn archive_idle_children(ops: &Ops, request_id: Id, r: rq::ArchiveIdleChildren) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let outcome = ops.archive_idle_children(CALLER, id).await?;
    reply(
        request_id,
        answers::ChildrenArchived {
            agent_id: id.to_string(),
            archived: outcome.archived.iter().map(ToString::to_string).collect(),
            skipped: serde_json::to_value(&outcome.skipped).unwrap_or(Value::Null),
        },
    )
}

async fn create_worktree(ops: &Ops, request_id: Id, r: rq::CreateWorktree) -> Answered {
    let created = ops
        .create_worktree(
            CALLER,
            Some(PathBuf::from(r.repository)),
            worktree_options(r.worktree),
        )
        .await?;
    let ws = &created.workspace;
    reply(
        request_id,
        answers::WorktreeCreated {
            workspace: wire::workspace_info(ws, ops.workspace_activity(ws.id)),
            setup: created.setup.iter().map(wire::command_run).collect(),
        },
    )
}

async fn get_worktree_status(ops: &Ops, request_id: Id, r: rq::GetWorktreeStatus) -> Answered {
    let id = parse_workspace(&r.workspace_id)?;
    let status = ops.worktree_status(id).await?;
    reply(
        request_id,
        answers::WorktreeStatus {
            workspace_id: id.to_string(),
            status,
        },
    )
}

async fn archive_workspace(ops: &Ops, request_id: Id, r: rq::ArchiveWorkspace) -> Answered {
    let id = parse_workspace(&r.workspace_id)?;
    let outcome = ops.archive_workspace(CALLER, id, r.force).await?;
    reply(
        request_id,
        answers::WorkspaceArchived {
            workspace_id: id.to_string(),
            archived_at: outcome.archived_at.map(|t| t.to_string()),
            already_archived: outcome.already_archived,
            agents: outcome.agents.iter().map(ToString::to_string).collect(),
            worktree: outcome.worktree.as_ref().map(wire::worktree_removal),
        },
    )
}

// Always `Ok`: it gives a plain answer the `Answered` shape every handler returns.
#[expect(clippy::unnecessary_wraps)]
fn send(message: DaemonMessage) -> Answered {
    Ok(Reply::Send(message))
}

/// A request on one agent whose answer is a plain `ok`: the agent's id parsed, `op` done.
async fn on_agent<T, F: Future<Output = Result<T, OpError>>>(
    request_id: Id,
    agent_id: &str,
    op: impl FnOnce(AgentId) -> F,
) -> Answered {
    let id = parse_agent(agent_id)?;
    op(id).await?;
    ok(request_id, id)
}

/// Sends the answer `body` to the request `request_id` came with.
fn reply<T>(request_id: Id, body: T) -> Answered
where
    drover_protocol::Answer<T>: Into<DaemonMessage>,
{
    send(DaemonMessage::answer(request_id, body))
}

fn ok(request_id: Id, agent: AgentId) -> Answered {
    reply(
        request_id,
        answers::Ok {
            agent_id: Some(agent.to_string()),
        },
    )
}

async fn initialize_agent(ops: &Ops, request_id: Id, r: rq::InitializeAgentRequest) -> Answered {
    let id = parse_agent(&r.agent_id)?;
    let opened = ops.initialize_agent(id, r.limit).await?;
    let agent = &opened.agent;
    let message = DaemonMessage::answer(
        request_id,
        answers::AgentInitialized {
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
        },
    );
    Ok(Reply::Initialized {
        agent: id,
        revision: opened.page.revision,
        message,
    })
}

async fn create_agent(ops: &Ops, request_id: Id, r: rq::CreateAgent) -> Answered {
    let workspace = r.workspace_id.as_deref().map(parse_workspace).transpose()?;
    let placement = match (r.worktree, r.cwd) {
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
    let mut parent = r.parent_agent_id.as_deref().map(parse_agent).transpose()?;
    let mut notify = None;
    let mut upstream_budgets = Vec::new();
    let upstream = match r.upstream {
        Some(upstream) => {
            let agent = parse_agent(&upstream.agent_id)?;
            if upstream.subagent {
                parent = Some(agent);
            }
            upstream_budgets = upstream.budgets;
            if upstream.notify_on_finish {
                notify = Some(agent);
            }
            Some(agent)
        }
        None => None,
    };
    let request = CreateAgent {
        provider: Some(r.provider),
        placement,
        prompt: r.prompt,
        title: r.title,
        model: r.model,
        mode: r.mode,
        effort: r.effort,
        labels: r.labels,
        parent,
        auto_archive: r.auto_archive,
        permission_policy: Some(r.permission_policy),
        notify,
        on_interrupt: r.on_interrupt,
        on_limit: r.on_limit,
        budget: r.budget,
        upstream,
        upstream_budgets,
    };
    // Another host's is forwarded before it gets here (`crate::hosts`), unless its parent is
    // this daemon's.
    if let Some(host) = r.host
        && let Some(host) = ops.hosts.resolve(&host)?
    {
        let agent = ops.create_on_host(CALLER, request, &host).await?;
        let agent = serde_json::from_value(agent).map_err(|e| {
            OpError::invalid(
                "host",
                format!("host `{host}` answered an agent this daemon cannot read: {e}"),
            )
        })?;
        return reply(
            request_id,
            answers::AgentCreated {
                agent,
                reused_worktree: false,
            },
        );
    }
    let created = ops.create_agent(CALLER, request).await?;
    reply(
        request_id,
        answers::AgentCreated {
            agent: wire::agent_info_now(ops, &created.agent),
            reused_worktree: created.worktree.as_ref().is_some_and(|w| w.reused),
        },
    )
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
