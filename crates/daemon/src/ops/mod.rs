//! The operations: everything a client can ask of drover, one function each, with typed
//! arguments, typed results and one error type.
//!
//! The front-ends (the client protocol in `ws`, the MCP server in `mcp`, and through the
//! protocol the CLI and the web UI) only decode a request, call one operation and encode its
//! answer. What an operation means lives here once: which defaults apply, who may do it (an
//! agent controls itself and its descendants; a user controls everything), and how a
//! half-done operation is undone.
//!
//! - [`agents`]: create, initialize, read, wait for, and configure agents.
//! - [`messages`]: send messages and cancel turns.
//! - [`budgets`]: budgets per agent tree, and the refusal when one is spent.
//! - [`archive`]: archive, unarchive, detach, archive idle children.
//! - [`permissions`]: answer permission requests.
//! - [`workspaces`]: workspaces and the git worktrees drover makes.
//! - [`providers`]: the providers agents can be created with.
//! - [`changes`]: what a workspace changed against its base (git, bounded).
//! - [`schedules`]: prompts on a timetable, and how they fire.
//! - [`jobs`]: background commands agents own.
//! - [`pty`]: workspace terminals, interactive shells for people.
//! - [`import`]: agents brought in from a Paseo home.
//! - [`remote`]: an agent's subagents on other hosts: created there, archived with it.
//! - [`notify`]: what clients watch, and the notification sinks' status and samples.

pub(crate) mod agents;
pub(crate) mod archive;
pub(crate) mod budgets;
pub(crate) mod changes;
pub(crate) mod import;
pub(crate) mod jobs;
pub(crate) mod messages;
pub(crate) mod notify;
pub(crate) mod permissions;
pub(crate) mod providers;
pub(crate) mod pty;
pub(crate) mod remote;
pub(crate) mod schedules;
pub(crate) mod sessions;
pub(crate) mod workspaces;

use std::sync::Arc;

use drover_acp::{AcpError, LiveSession, RuntimeManager, RuntimeView, TimelineEvent};
use drover_core::{
    ActivityBucket, Agent, AgentId, Registry, RegistryError, RegistryEvent, Workspace, WorkspaceId,
};
use drover_protocol::ErrorCode;
use tokio::sync::broadcast;

use crate::agent_tokens::AgentTokens;
use crate::schedules::{ScheduleError, Schedules};

/// What the operations work on: the daemon's registry and runtimes.
#[derive(Clone, Debug)]
pub(crate) struct Ops {
    pub(crate) registry: Registry,
    pub(crate) runtimes: RuntimeManager,
    /// The agents' MCP credentials.
    pub(crate) agent_tokens: Arc<AgentTokens>,
    pub(crate) schedules: Schedules,
    /// One import at a time: each checks what came in before, then writes.
    pub(crate) imports: Arc<tokio::sync::Mutex<()>>,
    /// Notifications (`[notify]`), and what each session watches.
    pub(crate) notifier: crate::notify::Notifier,
    /// The other machines' daemons this one links to (`drover host`).
    pub(crate) hosts: crate::hosts::Hosts,
    /// The workspace terminals people opened.
    pub(crate) ptys: crate::ptys::Ptys,
}

/// Who asks. A user (any client of the protocol) may do anything; an agent (over MCP) may
/// control only itself and its descendants, and read everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    User,
    Agent(AgentId),
}

impl Caller {
    /// The calling agent, if an agent calls.
    pub(crate) fn agent(self) -> Option<AgentId> {
        match self {
            Caller::User => None,
            Caller::Agent(id) => Some(id),
        }
    }

    /// The source recorded on messages this caller sends.
    pub(crate) fn source(self) -> String {
        match self {
            Caller::User => "user".to_string(),
            Caller::Agent(id) => format!("agent:{id}"),
        }
    }
}

/// Why an operation failed. Every front-end reports it with the same [`ErrorCode`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Runtime(AcpError),
    /// A request that names a wrong value or combination.
    #[error("`{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// An agent acting on what is not its own.
    #[error("{0}")]
    NotPermitted(String),
    #[error("workspace `{0}` is not a worktree drover made")]
    NotAWorktree(WorkspaceId),
    #[error(transparent)]
    Changes(#[from] changes::ChangesError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Job(drover_acp::jobs::JobError),
    /// A budget of the agent's tree is spent: no new turn starts in it (`info.upstream`: a
    /// budget of the hub that made this subagent here, what its tree there had left).
    #[error("{}", budgets::refusal(info))]
    BudgetExhausted {
        info: Box<drover_protocol::BudgetExhaustedInfo>,
    },
    #[error(transparent)]
    Host(#[from] crate::hosts::HostError),
    #[error(transparent)]
    Pty(#[from] crate::ptys::PtyError),
    #[error("workspace `{0}` is archived")]
    WorkspaceArchived(WorkspaceId),
    /// Another host's daemon refused what this one asked of it for a client.
    #[error("host `{host}`: {message}")]
    Remote {
        host: String,
        code: ErrorCode,
        message: String,
        details: Option<serde_json::Value>,
    },
}

impl From<AcpError> for OpError {
    fn from(e: AcpError) -> OpError {
        match e {
            AcpError::Registry(e) => OpError::Registry(e),
            other => OpError::Runtime(other),
        }
    }
}

impl OpError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            field,
            message: message.into(),
        }
    }

    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            OpError::Registry(e) => e.code(),
            OpError::Runtime(e) => e.code(),
            OpError::Invalid { .. } => ErrorCode::InvalidMessage,
            OpError::NotPermitted(_) => ErrorCode::NotPermitted,
            OpError::NotAWorktree(_) => ErrorCode::NotAWorktree,
            OpError::Changes(e) => e.code(),
            OpError::Schedule(e) => match e {
                ScheduleError::Unknown(_) => ErrorCode::UnknownSchedule,
                ScheduleError::Cadence(_) => ErrorCode::InvalidInput,
                ScheduleError::Store(_) => ErrorCode::StoreFailed,
                ScheduleError::ShuttingDown => ErrorCode::ShuttingDown,
            },
            OpError::Job(e) => e.code(),
            OpError::BudgetExhausted { .. } => ErrorCode::BudgetExhausted,
            OpError::Host(e) => e.code(),
            OpError::Pty(e) => match e {
                crate::ptys::PtyError::Unknown(_) => ErrorCode::UnknownTerminal,
                crate::ptys::PtyError::Limit | crate::ptys::PtyError::InputFull(_) => {
                    ErrorCode::TooManyRequests
                }
                crate::ptys::PtyError::Start { .. } | crate::ptys::PtyError::Io { .. } => {
                    ErrorCode::TerminalStartFailed
                }
                crate::ptys::PtyError::ShuttingDown => ErrorCode::ShuttingDown,
            },
            OpError::WorkspaceArchived(_) => ErrorCode::WorkspaceArchived,
            OpError::Remote { code, .. } => *code,
        }
    }
}

/// An agent id as a client wrote it: one that is not a UUID names no agent.
pub(crate) fn parse_agent(raw: &str) -> Result<AgentId, OpError> {
    raw.parse()
        .map_err(|_| RegistryError::UnknownAgent(shorten(raw)).into())
}

pub(crate) fn parse_workspace(raw: &str) -> Result<WorkspaceId, OpError> {
    raw.parse()
        .map_err(|_| RegistryError::UnknownWorkspace(shorten(raw)).into())
}

/// Enough of a client's string to recognise it in an error, not a megabyte of it.
fn shorten(raw: &str) -> String {
    raw.chars().take(80).collect()
}

impl Ops {
    /// Every change to agent and workspace records, as it happens.
    pub(crate) fn subscribe_changes(&self) -> broadcast::Receiver<RegistryEvent> {
        self.registry.subscribe()
    }

    /// Every change to every agent's timeline, as it happens.
    pub(crate) fn subscribe_timelines(&self) -> broadcast::Receiver<TimelineEvent> {
        self.runtimes.subscribe()
    }

    /// The agents whose runtime (cold, queued, starting, live; pid; hibernation) changed.
    pub(crate) fn subscribe_runtime_changes(&self) -> broadcast::Receiver<AgentId> {
        self.runtimes.subscribe_runtime_changes()
    }

    /// Where the agent's runtime is.
    pub(crate) fn runtime(&self, id: AgentId) -> RuntimeView {
        self.runtimes.runtime(id)
    }

    /// Every change to a schedule, as it happens.
    pub(crate) fn subscribe_schedules(
        &self,
    ) -> broadcast::Receiver<crate::schedules::ScheduleEvent> {
        self.schedules.subscribe()
    }

    /// Every workspace terminal opened, resized or ended, as it happens.
    pub(crate) fn subscribe_terminals(&self) -> broadcast::Receiver<crate::ptys::PtyEvent> {
        self.ptys.subscribe()
    }

    /// Every job start and end, as it happens.
    pub(crate) fn subscribe_jobs(&self) -> broadcast::Receiver<drover_acp::jobs::JobEvent> {
        self.runtimes.jobs().subscribe()
    }

    /// The workspace's activity bucket (`None`: no agent contributes).
    pub(crate) fn workspace_activity(&self, id: WorkspaceId) -> Option<ActivityBucket> {
        self.merge_activity(id, self.registry.workspace_activity(id))
    }

    /// A workspace's activity as this daemon counts it (`local`), with its root agents'
    /// subagents running on other hosts.
    pub(crate) fn merge_activity(
        &self,
        id: WorkspaceId,
        local: Option<ActivityBucket>,
    ) -> Option<ActivityBucket> {
        if self.hosts.any() {
            self.hosts.merge_activity(id, local)
        } else {
            local
        }
    }

    /// What the agent's live session offers to set, if it is live and offers anything.
    pub(crate) fn live_session(&self, id: AgentId) -> Option<LiveSession> {
        self.runtimes.live_session(id)
    }

    /// What the agent's process said of itself at its last start.
    pub(crate) fn advertised(&self, id: AgentId) -> Option<drover_acp::Advertised> {
        self.runtimes.advertised(id)
    }

    pub(crate) fn agent(&self, id: AgentId) -> Result<Agent, OpError> {
        self.registry
            .get(id)
            .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()).into())
    }

    /// Whether this daemon holds the agent (`agentId`, `parentAgentId`) or workspace
    /// (`workspaceId`) a request names: such a request is never sent to another host.
    pub(crate) fn holds(&self, key: &str, id: &str) -> bool {
        match key {
            "workspaceId" => id
                .parse::<WorkspaceId>()
                .is_ok_and(|id| self.workspace(id).is_ok()),
            _ => id.parse::<AgentId>().is_ok_and(|id| self.agent(id).is_ok()),
        }
    }

    pub(crate) fn workspace(&self, id: WorkspaceId) -> Result<Workspace, OpError> {
        self.registry
            .workspace(id)
            .ok_or_else(|| RegistryError::UnknownWorkspace(id.to_string()).into())
    }

    /// The agent an MCP token stands for. An archived agent's token is refused and forgotten,
    /// so it does not come back with an unarchive.
    pub(crate) fn mcp_caller(&self, token: &str) -> Result<AgentId, String> {
        let Some(agent) = self.agent_tokens.agent(token) else {
            return Err("unknown or missing agent token in the MCP URL (`/mcp/<token>`)".into());
        };
        match self.registry.get(agent) {
            Some(a) if !a.is_archived() => Ok(agent),
            Some(_) => {
                self.agent_tokens.revoke(agent);
                Err("the calling agent is archived".into())
            }
            None => Err("the calling agent no longer exists".into()),
        }
    }

    /// The agent `id`, if `caller` may control it: a user always, an agent itself and its
    /// descendants.
    pub(crate) fn controlled(&self, caller: Caller, id: AgentId) -> Result<Agent, OpError> {
        let target = self.agent(id)?;
        let Caller::Agent(me) = caller else {
            return Ok(target);
        };
        if target.id == me {
            return Ok(target);
        }
        if self.registry.ancestors(target.id).contains(&me) {
            Ok(target)
        } else {
            Err(OpError::NotPermitted(format!(
                "agent `{}` is not yours: you may control yourself and your own subagents (read-only tools work on any agent)",
                target.id
            )))
        }
    }
}
