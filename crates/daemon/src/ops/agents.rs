//! Agents: create one (in an existing workspace, a new directory, or a new git worktree),
//! initialize it for a client, read it and its timeline, wait for it, set its mode and model.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use drover_acp::{PendingPermission, RuntimeMemory, RuntimeView};
use drover_core::inbox::InboxMessage;
use drover_core::timeline::{Page, TimelinePage};
use drover_core::{
    Agent, AgentId, AgentStatus, AttentionReason, CreatedWorktree, NewAgent, OnInterrupt, OnLimit,
    PermissionPolicy, ProviderConfig, WorkspaceId, WorktreeOptions,
};
use drover_protocol::ItemKind;

use super::{Caller, OpError, Ops};

/// Timeline items a client gets when it initializes an agent, unless it asks for another
/// number.
pub(crate) const DEFAULT_HISTORY: usize = 200;
/// The most items one page holds.
pub(crate) const MAX_PAGE: usize = 1000;
/// The longest an agent's `wait_for_agent` waits before answering "still running": under
/// the usual MCP client tool timeout, so the caller gets an answer and can call again.
pub(crate) const MAX_AGENT_WAIT: Duration = Duration::from_secs(100);
/// The longest a client's `wait_idle` waits.
const MAX_CLIENT_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where a new agent works.
#[derive(Debug, Clone)]
pub(crate) enum Placement {
    /// In `cwd`, in the given workspace or the one registered for `cwd` (made if none is).
    /// Without `cwd`, in the workspace's directory; without either, the caller's.
    Existing {
        cwd: Option<PathBuf>,
        workspace: Option<WorkspaceId>,
    },
    /// In `path`, registered as a workspace of its own.
    NewDirectory { path: PathBuf },
    /// In a new git worktree of the checkout at `source` (the caller's cwd when absent).
    NewWorktree {
        source: Option<PathBuf>,
        options: WorktreeOptions,
    },
}

/// Which agents [`Ops::list_agents`] returns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AgentScope {
    All,
    /// The direct subagents of this agent.
    SubagentsOf(AgentId),
    /// The agents of this workspace.
    Workspace(WorkspaceId),
}

/// What a new agent is.
#[derive(Debug, Clone)]
pub(crate) struct CreateAgent {
    /// Default: the calling agent's provider (required from a user).
    pub(crate) provider: Option<String>,
    pub(crate) placement: Placement,
    pub(crate) prompt: Option<String>,
    pub(crate) title: Option<String>,
    /// Default: the calling agent's model, else the provider's.
    pub(crate) model: Option<String>,
    pub(crate) mode: Option<String>,
    /// Reasoning effort. Default: the provider's.
    pub(crate) effort: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) parent: Option<AgentId>,
    pub(crate) auto_archive: bool,
    /// Default: the calling agent's policy, else `ask`.
    pub(crate) permission_policy: Option<PermissionPolicy>,
    /// Tell this agent how the first turn goes (a queued message when it ends, fails, or
    /// waits for a permission).
    pub(crate) notify: Option<AgentId>,
    /// Default: the calling agent's own, else none (its provider's policy).
    pub(crate) on_interrupt: Option<OnInterrupt>,
    /// Default: the calling agent's own, else none (its provider's policy).
    pub(crate) on_limit: Option<OnLimit>,
    /// A budget for the new agent and its subtree.
    pub(crate) budget: Option<drover_core::Budget>,
    /// The hub's agent this one is created for over a link (see `remote`): `parent` and
    /// `notify` may name it though this daemon does not hold it.
    pub(crate) upstream: Option<AgentId>,
    /// What the hub holds its subagent to from its creation on (see
    /// `Ops::set_upstream_budget`): only with `parent` the hub's agent `upstream`.
    pub(crate) upstream_budgets: Vec<drover_core::Budget>,
}

/// A new agent, and the worktree made for it if one was.
#[derive(Debug)]
pub(crate) struct Created {
    pub(crate) agent: Agent,
    pub(crate) worktree: Option<CreatedWorktree>,
}

/// What a client gets when it opens an agent.
#[derive(Debug)]
pub(crate) struct Initialized {
    pub(crate) agent: Agent,
    pub(crate) page: TimelinePage,
    pub(crate) pending: Vec<PendingPermission>,
}

/// An agent at a glance: what an agent asks about another.
#[derive(Debug)]
pub(crate) struct Summary {
    pub(crate) agent: Agent,
    /// The text of its last `agent_message`, if any of its recent items is one.
    pub(crate) last_message: Option<String>,
    pub(crate) pending: Vec<PendingPermission>,
}

impl Ops {
    /// Creates an agent, starts its runtime and queues its first message. Everything that can
    /// be checked is checked before anything is made; a workspace made for an agent that then
    /// cannot be recorded is removed again: a new directory's workspace record (never the
    /// directory, which was the user's), a worktree with its branch (see
    /// `Registry::create_agent_in_worktree`).
    pub(crate) async fn create_agent(
        &self,
        caller: Caller,
        request: CreateAgent,
    ) -> Result<Created, OpError> {
        let me = match caller {
            Caller::Agent(id) => Some(self.agent(id)?),
            Caller::User => None,
        };
        // An agent whose tree spent its budget makes no new agent, subagent or not.
        if let Some(me) = &me {
            self.check_budget(me.id)?;
        }
        let mut new = new_agent(&request, me.as_ref())?;
        if let Some(parent) = new.parent
            && new.upstream != Some(parent)
        {
            self.controlled(caller, parent)?;
            self.check_budget(parent)?;
        }
        if let Some(notify) = request.notify
            && request.upstream != Some(notify)
        {
            self.agent(notify)?;
        }
        self.runtimes.prepare(&mut new)?;
        let (agent, worktree) = self
            .create_placed(caller, request.placement, new, me.as_ref())
            .await?;
        self.runtimes
            .start_new(&agent, request.prompt, caller.source(), request.notify)
            .await?;
        // In the client request's span (its `request_id`), when one asked.
        tracing::info!(agent = %agent.id, provider = %agent.provider, parent = agent.parent_id().map(tracing::field::display),
            by = caller.agent().map(tracing::field::display), "agent created");
        Ok(Created { agent, worktree })
    }

    /// Records `new` where `placement` says (a new worktree, a new directory, or an existing
    /// workspace or folder, `me`'s by default); the worktree it made, if any.
    async fn create_placed(
        &self,
        caller: Caller,
        placement: Placement,
        mut new: NewAgent,
        me: Option<&Agent>,
    ) -> Result<(Agent, Option<CreatedWorktree>), OpError> {
        Ok(match placement {
            Placement::NewWorktree {
                source,
                mut options,
            } => {
                options.created_by = caller.agent();
                let source = source
                    .or_else(|| me.map(|m| m.cwd.clone()))
                    .ok_or_else(|| OpError::invalid("cwd", "name the repository"))?;
                let (agent, made) = self
                    .registry
                    .create_agent_in_worktree(new, source, options)
                    .await?;
                (agent, Some(made))
            }
            Placement::NewDirectory { path } => {
                new.cwd = path;
                (
                    self.registry.create_agent_in_new_workspace(new).await?,
                    None,
                )
            }
            Placement::Existing { cwd, workspace } => {
                let workspace = workspace.or(me.map(|m| m.workspace_id));
                new.cwd = match (cwd, workspace) {
                    (Some(cwd), _) => cwd,
                    (None, Some(ws)) => self.workspace(ws)?.path,
                    (None, None) => {
                        return Err(OpError::invalid("cwd", "give `cwd` or `workspaceId`"));
                    }
                };
                new.workspace_id = workspace;
                (self.registry.create_agent(new).await?, None)
            }
        })
    }

    /// Starts the agent's runtime if needed and reads what a client shows when it opens it:
    /// the last `limit` timeline items and the permissions waiting for an answer.
    pub(crate) async fn initialize_agent(
        &self,
        id: AgentId,
        limit: Option<usize>,
    ) -> Result<Initialized, OpError> {
        self.agent(id)?;
        self.runtimes.ensure_started(id).await?;
        let limit = limit.unwrap_or(DEFAULT_HISTORY).min(MAX_PAGE);
        let page = self.runtimes.timeline(id, Page::Tail { limit }).await?;
        // Read after the page: the record is at least as new as the history.
        let agent = self.agent(id)?;
        let pending = self.runtimes.pending_permissions(id).await?;
        Ok(Initialized {
            agent,
            page,
            pending,
        })
    }

    /// A page of the agent's timeline: items before `before`, after `after`, or the tail.
    pub(crate) async fn timeline(
        &self,
        id: AgentId,
        before: Option<u64>,
        after: Option<u64>,
        limit: Option<usize>,
    ) -> Result<TimelinePage, OpError> {
        self.agent(id)?;
        let limit = limit.unwrap_or(DEFAULT_HISTORY).clamp(1, MAX_PAGE);
        let page = match (before, after) {
            (Some(_), Some(_)) => {
                return Err(OpError::invalid(
                    "before",
                    "give `before` or `after`, not both",
                ));
            }
            (Some(seq), None) => Page::Before { seq, limit },
            (None, Some(seq)) => Page::After { seq, limit },
            (None, None) => Page::Tail { limit },
        };
        Ok(self.runtimes.timeline(id, page).await?)
    }

    /// The agent, its runtime, and what its process tree holds now (read from `/proc`; `None`
    /// while it has no process). Reading it does not start a cold runtime.
    pub(crate) async fn get_agent(
        &self,
        id: AgentId,
    ) -> Result<(Agent, RuntimeView, Option<RuntimeMemory>), OpError> {
        self.agent(id)?;
        let memory = self.runtimes.runtime_memory(id).await;
        // Read after the measure: a runtime that ended meanwhile shows cold.
        let runtime = self.runtimes.runtime(id);
        let memory = memory.filter(|_| runtime.pid.is_some());
        Ok((self.agent(id)?, runtime, memory))
    }

    /// What the agent and every agent below it spent.
    pub(crate) fn tree_spend(&self, id: AgentId) -> Option<drover_core::TreeSpend> {
        self.registry.tree_spend(id)
    }

    /// The messages queued for the agent and not delivered yet (e.g. while it cannot start).
    pub(crate) async fn queued(&self, id: AgentId) -> Result<Vec<InboxMessage>, OpError> {
        self.agent(id)?;
        Ok(self.runtimes.queued(id).await?)
    }

    /// Starts the agent again after its start failed (the user's retry): its queued messages
    /// then run.
    pub(crate) async fn restart_agent(&self, caller: Caller, id: AgentId) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        self.runtimes.restart(id).await?;
        Ok(())
    }

    /// The agents in `scope`, archived ones too if asked.
    pub(crate) fn list_agents(&self, scope: AgentScope, include_archived: bool) -> Vec<Agent> {
        self.registry
            .agents()
            .into_iter()
            .filter(|a| include_archived || !a.is_archived())
            .filter(|a| match scope {
                AgentScope::All => true,
                AgentScope::SubagentsOf(parent) => a.parent_id() == Some(parent),
                AgentScope::Workspace(ws) => a.workspace_id == ws,
            })
            .collect()
    }

    /// The agent, its last message and its pending permissions.
    pub(crate) async fn summary(&self, id: AgentId) -> Result<Summary, OpError> {
        let agent = self.agent(id)?;
        let last_message = self
            .runtimes
            .timeline(id, Page::Tail { limit: 50 })
            .await
            .ok()
            .and_then(|page| {
                page.items
                    .iter()
                    .rev()
                    .find(|i| i.is(ItemKind::AgentMessage))
                    .and_then(|i| i.data.get("text")?.as_str().map(str::to_string))
            });
        let pending = self
            .runtimes
            .pending_permissions(id)
            .await
            .unwrap_or_default();
        Ok(Summary {
            agent,
            last_message,
            pending,
        })
    }

    /// Waits until the agent is idle with nothing queued that would wake it, or `timeout`
    /// (then `false`). An agent with no runtime is idle.
    pub(crate) async fn wait_idle(
        &self,
        id: AgentId,
        timeout: Option<Duration>,
    ) -> Result<bool, OpError> {
        self.agent(id)?;
        let timeout = timeout.unwrap_or(MAX_CLIENT_WAIT).min(MAX_CLIENT_WAIT);
        Ok(self.runtimes.wait_idle(id, timeout).await?)
    }

    /// Waits (at most [`MAX_AGENT_WAIT`]) until the agent needs someone: idle, asking for a
    /// permission, or failed. Returns its summary and whether the wait timed out instead.
    pub(crate) async fn wait_until_settled(
        &self,
        id: AgentId,
        timeout: Duration,
    ) -> Result<(Summary, bool), OpError> {
        self.agent(id)?;
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_AGENT_WAIT);
        loop {
            let now = self.agent(id)?;
            let permission = now.attention.map(|a| a.reason) == Some(AttentionReason::Permission);
            let failed = now.status == AgentStatus::Error;
            let idle = self
                .runtimes
                .wait_idle(id, Duration::from_millis(200))
                .await?;
            let settled = permission || failed || idle;
            if settled || tokio::time::Instant::now() >= deadline {
                return Ok((self.summary(id).await?, !settled));
            }
        }
    }

    /// Sets the mode (recorded, and sent to a live agent).
    pub(crate) async fn set_mode(
        &self,
        caller: Caller,
        id: AgentId,
        mode: String,
    ) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        Ok(self.runtimes.set_mode(id, mode).await?)
    }

    /// Sets the model (recorded, and sent to a live agent).
    pub(crate) async fn set_model(
        &self,
        caller: Caller,
        id: AgentId,
        model: String,
    ) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        Ok(self.runtimes.set_model(id, model).await?)
    }

    /// Sets one of the agent's config options, by its id or category (recorded, and sent to a
    /// live agent).
    pub(crate) async fn set_config_option(
        &self,
        caller: Caller,
        id: AgentId,
        key: String,
        value: String,
    ) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        Ok(self.runtimes.set_config_option(id, key, value).await?)
    }

    /// Sets (or, with `None` or blank, clears) the agent's title.
    pub(crate) async fn set_title(
        &self,
        caller: Caller,
        id: AgentId,
        title: Option<String>,
    ) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        self.registry.set_title(id, title).await?;
        Ok(())
    }

    /// Marks the agent's attention as seen, unless it waits for a permission (that attention
    /// ends when the request is answered).
    pub(crate) async fn clear_attention(&self, caller: Caller, id: AgentId) -> Result<(), OpError> {
        let agent = self.controlled(caller, id)?;
        if agent
            .attention
            .as_ref()
            .is_some_and(|a| a.reason != drover_core::AttentionReason::Permission)
        {
            self.registry.clear_attention(id).await?;
        }
        Ok(())
    }
}

/// The agent a create records, from the request and the caller's defaults (`me`, an agent
/// creating another): its provider, model, permission policy and what to do on an interrupt
/// or a limit.
fn new_agent(request: &CreateAgent, me: Option<&Agent>) -> Result<NewAgent, OpError> {
    let provider = request
        .provider
        .clone()
        .or_else(|| me.map(|m| m.provider.clone()))
        .ok_or_else(|| OpError::invalid("provider", "name a provider"))?;
    let budget = request
        .budget
        .clone()
        .map(super::budgets::valid_budget)
        .transpose()?;
    let upstream_budgets = request
        .upstream_budgets
        .iter()
        .cloned()
        .map(super::budgets::valid_budget)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NewAgent {
        provider,
        budget,
        upstream_budgets,
        cwd: PathBuf::new(),
        workspace_id: None,
        title: request.title.clone(),
        labels: request.labels.clone(),
        parent: request.parent,
        upstream: request.upstream,
        auto_archive: request.auto_archive,
        config: ProviderConfig {
            model: request
                .model
                .clone()
                .or_else(|| me.and_then(|m| m.config.model.clone())),
            mode: request.mode.clone(),
            effort: request.effort.clone(),
            options: BTreeMap::new(),
            permission_policy: request
                .permission_policy
                .or_else(|| me.map(|m| m.config.permission_policy))
                .unwrap_or_default(),
            on_interrupt: request
                .on_interrupt
                .or_else(|| me.and_then(|m| m.config.on_interrupt)),
            on_limit: request
                .on_limit
                .or_else(|| me.and_then(|m| m.config.on_limit)),
        },
    })
}
