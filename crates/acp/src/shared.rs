//! What the agents of one daemon share (`Shared`): the registry, the live sessions and
//! runtime views clients see, the slots, the jobs, the counters; and the `subagent` activity
//! family of the subagents an agent's process runs itself.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use drover_core::admission::{ActivityFamily, ActivityItem};
use drover_core::inbox::InboxMessage;
use drover_core::view::AgentsView;
use drover_core::{Agent, AgentId, BoxFuture, Registry};
use tokio::sync::broadcast;

use crate::actors::Actors;
use crate::providers::{LiveProviders, RuntimeSettings};
use crate::{
    Advertised, LiveSession, McpServers, RuntimeView, TimelineEvent, TimelineUpdate, actor, auth,
    jobs, metrics, slots,
};

/// The subagents an agent's process runs itself are `subagent` activity while they run. They
/// end with the process, which the archive closes: there is nothing more to stop.
pub(crate) struct OwnSubagentFamily(pub(crate) Arc<Mutex<HashMap<AgentId, LiveSession>>>);

impl ActivityFamily for OwnSubagentFamily {
    fn name(&self) -> &'static str {
        "subagent"
    }

    fn running(&self, _: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        let sessions = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(session) = sessions.get(&agent.id) else {
            return Vec::new();
        };
        session
            .own_subagents
            .iter()
            .filter(|s| actor::own_subagent_running(s))
            .map(|s| ActivityItem {
                id: s.id.clone(),
                agent_id: Some(agent.id),
                title: Some(s.title.clone()),
                detail: format!("`{}`, the agent's own subagent, is running", s.title),
            })
            .collect()
    }

    fn stop(&self, _: AgentId, _: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// What the agents of one daemon share.
pub(crate) struct Shared {
    pub(crate) home: PathBuf,
    pub(crate) providers: LiveProviders,
    pub(crate) registry: Registry,
    pub(crate) updates: broadcast::Sender<TimelineEvent>,
    pub(crate) actors: Arc<Actors>,
    /// What each live runtime's session offers to set (modes, config options), for clients.
    pub(crate) sessions: Arc<Mutex<HashMap<AgentId, LiveSession>>>,
    /// What each agent's process said of itself at its last `initialize`.
    pub(crate) advertised: Mutex<HashMap<AgentId, Advertised>>,
    /// Each agent's queued messages as its task last published them (kept after the task
    /// ends: only a task changes an inbox).
    pub(crate) queued: Mutex<HashMap<AgentId, Vec<InboxMessage>>>,
    /// The MCP servers given to an agent's session (`mcpServers` of `session/new`).
    pub(crate) mcp: McpServers,
    /// How many agent processes are running now (see [`LiveCount`]).
    pub(crate) live_runtimes: AtomicUsize,
    /// The `max_live` ceiling's slots.
    pub(crate) slots: Arc<slots::Slots>,
    /// Each agent's runtime that is not cold, for clients.
    pub(crate) runtimes: Mutex<HashMap<AgentId, RuntimeView>>,
    /// The agents whose runtime view changed.
    pub(crate) runtime_changes: broadcast::Sender<AgentId>,
    /// The background jobs agents own (and the ACP terminals they open).
    pub(crate) jobs: jobs::Jobs,
    /// Each provider's sign-in, as its agents' last starts saw it.
    pub(crate) sign_ins: auth::SignIns,
    /// Turns and streamed text, counted as they happen.
    pub(crate) metrics: metrics::RuntimeMetrics,
    /// What agents tell agents of the hub that links to this daemon, until the hub has it.
    pub(crate) outbox: Arc<drover_core::outbox::Outbox>,
}

/// Counts one agent process in [`Shared`] for as long as it is held (the actor's `Live`).
pub(crate) struct LiveCount(Arc<Shared>);

impl LiveCount {
    pub(crate) fn new(shared: &Arc<Shared>) -> LiveCount {
        shared.live_runtimes.fetch_add(1, Ordering::Relaxed);
        LiveCount(shared.clone())
    }
}

impl Drop for LiveCount {
    fn drop(&mut self) {
        self.0.live_runtimes.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shared {
    pub(crate) fn emit(&self, agent_id: AgentId, revision: u64, update: TimelineUpdate) {
        let _ = self.updates.send(TimelineEvent {
            agent_id,
            revision,
            update,
        });
    }

    pub(crate) fn forget(&self, id: AgentId, generation: u64) {
        self.actors.forget(id, generation);
    }

    /// The `[runtimes]` settings as `config.toml` says now (the defaults while it does not
    /// read: the error answers every command that needs the providers).
    pub(crate) fn settings(&self) -> RuntimeSettings {
        self.providers
            .current()
            .map(|p| p.runtime_settings())
            .unwrap_or_default()
    }

    /// Records the agent's runtime view and tells clients when it changed.
    pub(crate) fn set_runtime(&self, id: AgentId, view: RuntimeView) {
        let changed = {
            let mut runtimes = self
                .runtimes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let old = if view == RuntimeView::COLD {
                runtimes.remove(&id)
            } else {
                runtimes.insert(id, view)
            };
            old.unwrap_or(RuntimeView::COLD) != view
        };
        if changed {
            let _ = self.runtime_changes.send(id);
        }
    }

    pub(crate) fn runtime(&self, id: AgentId) -> RuntimeView {
        self.runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .copied()
            .unwrap_or(RuntimeView::COLD)
    }
}
