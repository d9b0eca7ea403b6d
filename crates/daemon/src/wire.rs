//! Domain records to wire types: the one place the protocol's shapes are filled in.

use drover_acp::jobs::JobRecord;
use drover_acp::{LiveSession, RuntimeMemory, RuntimeView, TimelineEvent, TimelineUpdate};
use drover_core::{ActivityBucket, Agent, CommandRun, RegistryError, Workspace, WorktreeRemoval};
use drover_protocol::answers;
use drover_protocol::{
    AgentInfo, AgentUpdate, CommandRunInfo, DaemonMessage, ImportSkip, ImportedAgentInfo, JobInfo,
    ProviderInfo, RuntimeInfo, SignInState, WorkspaceActivity, WorkspaceInfo, WorktreeRemovalInfo,
};

use crate::ops::import::ImportReport;
use crate::ops::providers::ProviderView;
use crate::ops::{OpError, Ops};
use serde_json::{Value, json};

/// What a client needs of a refusal beyond its message: the running work of an
/// `agent_active` refusal, the spend of a `budget_exhausted` one, what a `worktree_dirty`
/// worktree holds.
pub(crate) fn error_details(error: &OpError) -> Option<Value> {
    match error {
        OpError::Registry(RegistryError::AgentActive(report)) => serde_json::to_value(report).ok(),
        OpError::BudgetExhausted { info, .. } => serde_json::to_value(info).ok(),
        OpError::Remote { details, .. } => details.clone(),
        OpError::Registry(RegistryError::Worktree(drover_core::WorktreeError::Dirty(status))) => {
            serde_json::to_value(status).ok()
        }
        _ => None,
    }
}

/// The agent as clients see it now: its record, its live runtime's modes and its runtime
/// view (without the memory of its process tree, which only `get_agent` measures).
pub(crate) fn agent_info_now(ops: &Ops, agent: &Agent) -> AgentInfo {
    agent_info(
        agent,
        ops.live_session(agent.id),
        &ops.runtime(agent.id),
        None,
    )
}

/// `settings`: what the agent's live session offers to set (modes, config options), if any;
/// `memory`: what its process tree holds, when it was measured.
pub(crate) fn agent_info(
    agent: &Agent,
    settings: Option<LiveSession>,
    runtime: &RuntimeView,
    memory: Option<RuntimeMemory>,
) -> AgentInfo {
    let LiveSession {
        modes,
        config_options,
        own_subagents,
    } = settings.unwrap_or_default();
    let modes = modes.as_ref();
    AgentInfo {
        id: agent.id.to_string(),
        status: agent_status(agent.status),
        created_at: agent.created_at.to_string(),
        updated_at: agent.updated_at.to_string(),
        last_activity_at: agent.last_activity_at.to_string(),
        provider: agent.provider.clone(),
        session_id: agent.resume.as_ref().map(|r| r.acp_session_id.clone()),
        error: agent.last_error.clone(),
        current_mode_id: modes
            .and_then(|m| m.get("currentModeId"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| agent.config.mode.clone()),
        available_modes: modes.and_then(|m| m.get("availableModes").cloned()),
        model: agent.config.model.clone(),
        effort: agent.config.effort.clone(),
        config_options,
        own_subagents,
        title: agent.title.clone(),
        cwd: agent.cwd.display().to_string(),
        parent_agent_id: agent.parent_id().map(|p| p.to_string()),
        workspace_id: agent.workspace_id.to_string(),
        labels: agent.labels.clone(),
        archived_at: agent.archived_at.map(|t| t.to_string()),
        requires_attention: agent.attention.is_some(),
        attention_reason: agent.attention.map(|a| a.reason),
        attention_timestamp: agent.attention.map(|a| a.at.to_string()),
        auto_archive: agent.auto_archive,
        permission_policy: agent.config.permission_policy,
        on_interrupt: agent.config.on_interrupt,
        on_limit: agent.config.on_limit,
        spend: spend_info(&agent.spend),
        budget: agent.budget.clone(),
        tree_spend: None,
        limited: agent
            .limited
            .as_ref()
            .map(|l| drover_protocol::LimitedInfo {
                at: l.at.to_string(),
                reset_at: l.reset_at.map(|t| t.to_string()),
                retry_at: l.retry_at.to_string(),
                error: l.error.clone(),
            }),
        runtime: RuntimeInfo {
            state: runtime.state,
            pid: runtime.pid,
            hibernate_at: runtime.hibernate_at.map(|t| t.to_string()),
            processes: memory.map(|m| m.processes as u64),
            rss_bytes: memory.map(|m| m.rss_bytes),
            retry_at: runtime.retry_at.map(|t| t.to_string()),
            background_processes: runtime.background as u64,
            agent: None,
        },
        start_failure: agent
            .start_failure
            .as_ref()
            .map(|f| drover_protocol::StartFailureInfo {
                at: f.at.to_string(),
                sign_in: f.sign_in.clone(),
            }),
        queued: None,
        host: None,
    }
}

/// What an agent spent.
pub(crate) fn spend_info(spend: &drover_core::Spend) -> drover_protocol::SpendInfo {
    drover_protocol::SpendInfo {
        tokens: spend.tokens,
        cost: spend.cost,
        currency: spend.currency.clone(),
    }
}

/// What an agent and its subtree spent.
pub(crate) fn tree_spend_info(tree: &drover_core::TreeSpend) -> drover_protocol::TreeSpendInfo {
    drover_protocol::TreeSpendInfo {
        tokens: tree.spend.tokens,
        cost: tree.spend.cost,
        currency: tree.spend.currency.clone(),
        agents: tree.agents as u64,
        unknown: tree.unknown.iter().map(ToString::to_string).collect(),
    }
}

/// What an agent's process said of itself (`RuntimeInfo.agent`).
pub(crate) fn advertised(a: drover_acp::Advertised) -> drover_protocol::AgentAdvertised {
    drover_protocol::AgentAdvertised {
        name: a.name,
        title: a.title,
        version: a.version,
        protocol_version: a.protocol_version,
        capabilities: a.capabilities,
    }
}

/// A queued message as `AgentInfo.queued` lists it.
pub(crate) fn queued(m: &drover_core::inbox::InboxMessage) -> drover_protocol::QueuedMessageInfo {
    drover_protocol::QueuedMessageInfo {
        id: m.id.clone(),
        text: m.text.clone(),
        delivery: m.delivery,
        queued_at: m.at.to_string(),
    }
}

/// A workspace's activity as the protocol names it.
pub(crate) fn bucket(b: Option<ActivityBucket>) -> Option<WorkspaceActivity> {
    b.map(WorkspaceActivity::from)
}

/// An agent's status as the protocol names it.
pub(crate) fn agent_status(s: drover_core::AgentStatus) -> drover_protocol::AgentStatus {
    use drover_core::AgentStatus as S;
    use drover_protocol::AgentStatus as W;
    match s {
        S::Initializing => W::Initializing,
        S::Idle => W::Idle,
        S::Running => W::Running,
        S::Error => W::Error,
        S::Closed => W::Closed,
    }
}

fn workspace_kind(k: drover_core::WorkspaceKind) -> drover_protocol::WorkspaceKind {
    use drover_core::WorkspaceKind as K;
    use drover_protocol::WorkspaceKind as W;
    match k {
        K::Directory => W::Directory,
        K::LocalCheckout => W::LocalCheckout,
        K::Worktree => W::Worktree,
    }
}

pub(crate) fn workspace_info(ws: &Workspace, activity: Option<ActivityBucket>) -> WorkspaceInfo {
    WorkspaceInfo {
        id: ws.id.to_string(),
        kind: workspace_kind(ws.kind),
        path: ws.path.display().to_string(),
        name: ws.name.clone(),
        created_at: ws.created_at.to_string(),
        archived_at: ws.archived_at.map(|t| t.to_string()),
        activity: bucket(activity),
        worktree: ws.worktree.as_ref().map(|w| drover_protocol::WorktreeInfo {
            source: w.source.display().to_string(),
            branch: w.branch.clone(),
            base: w.base.clone(),
            base_commit: w.base_commit.clone(),
            created_by: w.created_by.map(|a| a.to_string()),
        }),
        host: None,
    }
}

pub(crate) fn update(event: &TimelineEvent) -> AgentUpdate {
    let timestamp = match &event.update {
        TimelineUpdate::Item { item } => item.at.to_string(),
        _ => jiff::Timestamp::now().to_string(),
    };
    AgentUpdate {
        agent_id: event.agent_id.to_string(),
        timestamp,
        notification: serde_json::to_value(&event.update).unwrap_or(Value::Null),
        revision: Some(event.revision),
    }
}

/// A stored item as the `item` notification of an update.
pub(crate) fn item_update(
    agent: &Agent,
    item: &drover_core::timeline::TimelineItem,
) -> AgentUpdate {
    AgentUpdate {
        agent_id: agent.id.to_string(),
        timestamp: item.at.to_string(),
        notification: json!({"op": "item", "item": item}),
        revision: None,
    }
}

pub(crate) fn command_run(run: &CommandRun) -> CommandRunInfo {
    CommandRunInfo {
        command: run.command.clone(),
        exit_code: run.exit_code,
        timed_out: run.timed_out,
        output: run.output.clone(),
        duration_ms: run.duration_ms,
    }
}

pub(crate) fn worktree_removal(removal: &WorktreeRemoval) -> WorktreeRemovalInfo {
    WorktreeRemovalInfo {
        status: removal.status.clone(),
        teardown: removal.teardown.iter().map(command_run).collect(),
        removed: removal.removed,
        branch_deleted: removal.branch_deleted,
    }
}

/// The answer to `import_paseo` and `import_sessions`.
pub(crate) fn imported(request_id: Option<String>, report: ImportReport) -> DaemonMessage {
    DaemonMessage::answer(
        request_id,
        answers::Imported {
            dry_run: report.dry_run,
            imported: report
                .imported
                .into_iter()
                .map(|i| ImportedAgentInfo {
                    source: i.source,
                    source_id: i.source_id,
                    agent_id: i.agent_id.map(|id| id.to_string()),
                    provider: i.provider,
                    cwd: i.cwd.display().to_string(),
                    title: i.title,
                    status: agent_status(i.status),
                    archived: i.archived,
                    parent_source_id: i.parent,
                    resumes: i.resumes,
                    note: i.note,
                })
                .collect(),
            skipped: report
                .skipped
                .into_iter()
                .map(|s| ImportSkip {
                    source: s.source,
                    source_id: s.source_id,
                    reason: s.reason,
                })
                .collect(),
        },
    )
}

pub(crate) fn provider(p: ProviderView) -> ProviderInfo {
    ProviderInfo {
        name: p.name,
        label: p.label,
        command: p.command,
        available: p.available,
        detail: p.detail,
        sign_in: drover_protocol::ProviderSignIn {
            state: match p.sign_in {
                Some(drover_acp::auth::SignInState::SignedIn) => SignInState::SignedIn,
                Some(drover_acp::auth::SignInState::NeedsSignIn) => SignInState::NeedsSignIn,
                None => SignInState::Unknown,
            },
            methods: p.methods,
            how: Some(p.how),
        },
        warm: drover_protocol::ProviderWarm {
            ready: u32::try_from(p.warm.ready).unwrap_or(u32::MAX),
            wanted: u32::try_from(p.warm.wanted).unwrap_or(u32::MAX),
        },
    }
}

/// A workspace's changes as the protocol carries them.
pub(crate) fn workspace_changes(
    c: crate::ops::changes::Changes,
) -> drover_protocol::WorkspaceChangesInfo {
    drover_protocol::WorkspaceChangesInfo {
        base: c.base,
        truncated: c.truncated,
        files: c
            .files
            .into_iter()
            .map(|f| drover_protocol::ChangedFileInfo {
                path: f.path,
                status: f.status,
                added: f.added,
                removed: f.removed,
                diff: f.diff,
            })
            .collect(),
    }
}

/// A schedule as clients see it.
pub(crate) fn schedule(s: &crate::schedules::Schedule) -> drover_protocol::ScheduleInfo {
    use crate::schedules::Target;
    let (agent_id, new_agent) = match &s.target {
        Target::Agent { agent_id } => (Some(agent_id.to_string()), None),
        Target::NewAgent(spec) => (None, serde_json::to_value(spec).ok()),
    };
    drover_protocol::ScheduleInfo {
        id: s.id.to_string(),
        title: s.title.clone(),
        created_at: s.created_at.to_string(),
        updated_at: s.updated_at.to_string(),
        created_by: s.created_by.map(|a| a.to_string()),
        agent_id,
        new_agent,
        prompt: s.prompt.clone(),
        cadence: serde_json::to_value(&s.cadence).unwrap_or(Value::Null),
        description: s.cadence.describe(),
        state: s.state(),
        next_run_at: match s.state() {
            crate::schedules::State::Active => s.next_run_at.map(|t| t.to_string()),
            _ => None,
        },
        runs: s
            .runs
            .iter()
            .map(|r| drover_protocol::ScheduleRunInfo {
                due_at: r.due_at.to_string(),
                fired_at: r.fired_at.to_string(),
                message_id: r.message_id.clone(),
                agent_id: r.agent_id.map(|a| a.to_string()),
                error: r.error.clone(),
                recovered: r.recovered,
            })
            .collect(),
    }
}

/// A job as clients see it.
/// A workspace terminal as clients see it.
pub(crate) fn terminal_info(pty: &crate::ptys::Pty) -> drover_protocol::TerminalInfo {
    let (cols, rows) = pty.size();
    drover_protocol::TerminalInfo {
        id: pty.id.clone(),
        workspace_id: pty.workspace.to_string(),
        cwd: pty.cwd.display().to_string(),
        shell: pty.shell.clone(),
        pid: pty.pid,
        cols,
        rows,
        created_at: pty.created_at.to_string(),
        output_bytes: pty.end(),
    }
}

pub(crate) fn job_info(job: &JobRecord) -> JobInfo {
    JobInfo {
        id: job.id.clone(),
        agent_id: job.owner.to_string(),
        command: job.command.clone(),
        cwd: job.cwd.display().to_string(),
        status: job.status,
        started_by: job.started_by.clone(),
        started_at: job.started_at.to_string(),
        ended_at: job.ended_at.map(|t| t.to_string()),
        exit_code: job.exit_code,
        signal: job.signal,
        exit: job.exit.clone(),
        killed_by: job.killed_by,
        duration_ms: job.duration_ms,
        output_bytes: job.output_bytes,
        pid: job.pid,
        timeout_s: job.timeout_s,
        notify_on_exit: job.notify_on_exit,
        terminal: job.terminal,
    }
}

/// A notification sink and how its deliveries went.
pub(crate) fn notify_sink(report: &crate::notify::SinkReport) -> drover_protocol::NotifySinkInfo {
    let status = &report.status;
    drover_protocol::NotifySinkInfo {
        name: report.name.clone(),
        kind: report.kind,
        target: report.target.clone(),
        events: report.events.clone(),
        all: report.all,
        sent: status.sent,
        last_sent_at: status.last_sent_at.map(|t| t.to_string()),
        failed: status.failed,
        last_error: status.last_error.clone(),
        last_error_at: status.last_error_at.map(|t| t.to_string()),
        dropped: status.dropped,
        summarized: status.summarized,
    }
}

/// A notice in the outbox as the hub reads it.
pub(crate) fn notice_info(notice: &drover_core::outbox::Notice) -> drover_protocol::NoticeInfo {
    drover_protocol::NoticeInfo {
        id: notice.id.clone(),
        at: notice.at.to_string(),
        from: notice.from.to_string(),
        to: notice.to.to_string(),
        delivery: notice.delivery,
        text: notice.text.clone(),
    }
}
