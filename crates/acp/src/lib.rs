//! drover's agent runtimes: each agent's provider process speaking the Agent Client Protocol
//! (v1, JSON-RPC over stdio), its turns, its durable inbox and timeline.
//!
//! [`RuntimeManager`] is the entry point for clients: create an agent and start it, deliver
//! messages (followup, steer, inject), cancel, answer permissions, wait until idle, read
//! timelines. One task per agent owns that agent's process, connection, inbox and timeline;
//! everything else talks to it through a bounded channel.
//!
//! [`RuntimeManager::open`] wires everything once, in order, before any agent starts: the
//! registry opens with a weak [`RuntimeControl`] onto the agents' tasks (ownership runs from
//! the manager to the registry, never back), and the MCP servers agents get are an argument,
//! so an agent woken at boot has them too.
//!
//! Nothing here decides lifecycle rules: the registry does. Nothing here knows about
//! WebSocket or HTTP.

mod actor;
pub mod auth;
pub mod handshake;
pub mod jobs;
mod limits;
mod listing;
pub mod metrics;
pub mod process;
pub mod providers;
pub mod records;
pub mod rpc;
mod slots;
pub mod warm;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use drover_core::admission::{ActivityFamily, ActivityItem};
use drover_core::error::ErrorCode;
use drover_core::inbox::{Delivery, Inbox, InboxMessage};
use drover_core::timeline::{Page, Timeline, TimelinePage};
use drover_core::view::AgentsView;
use drover_core::{
    Agent, AgentId, BootReport, BoxFuture, CancelCause, NewAgent, Registry, RegistryError,
    RuntimeControl, RuntimeError, store::StoreError,
};
use drover_protocol::{ConfigOptionInfo, OwnSubagentInfo};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use actor::{LastStderr, LaunchError};
/// A change to one agent's timeline: the timeline log's own entry, as live clients get it.
pub use drover_core::timeline::Entry as TimelineUpdate;
/// The kinds of timeline item the runtimes write, for readers of timelines.
pub use listing::ProviderSession;
pub use providers::{
    Availability, ConfigError, DEFAULT_IDLE_TIMEOUT, LiveProviders, Provider, Providers,
    RuntimeSettings,
};

use actor::Command;

/// How long a closing agent gets between TERM and KILL.
pub const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// How many timeline updates a subscriber may fall behind before it lags.
const UPDATE_CAPACITY: usize = 8192;
/// How many runtime-state changes a subscriber may fall behind before it lags (each is one
/// agent id; a fleet hibernating at once sends one per agent).
const RUNTIME_CHANGE_CAPACITY: usize = 4096;

/// Where an agent's runtime is: the protocol's `RuntimeInfo.state`.
pub use drover_protocol::RuntimeState;

/// An agent's runtime as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeView {
    pub state: RuntimeState,
    /// The agent process (its process group leader) while there is one.
    pub pid: Option<u32>,
    /// When an idle runtime will hibernate (`None`: it is busy, cold, or never hibernates).
    pub hibernate_at: Option<jiff::Timestamp>,
    /// When it tries to start again by itself after a failed start.
    pub retry_at: Option<jiff::Timestamp>,
    /// The background processes that keep an otherwise idle runtime live (work the agent
    /// started itself that hibernation would kill; see [`process::background_processes`]):
    /// while it is above 0 the runtime neither hibernates nor makes room under `max_live`.
    pub background: usize,
}

impl RuntimeView {
    pub const COLD: RuntimeView = RuntimeView {
        state: RuntimeState::Cold,
        pid: None,
        hibernate_at: None,
        retry_at: None,
        background: 0,
    };
}

/// What an agent's process said of itself in its `initialize` answer: who it is, the ACP
/// version it speaks, and what it can do beyond prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// `agentInfo.name` (with `title`, `version` where given).
    pub name: Option<String>,
    pub title: Option<String>,
    pub version: Option<String>,
    pub protocol_version: u64,
    /// Its capabilities by name: `load` (`session/load`), `resume`, `close`, `list`, `fork`
    /// (`sessionCapabilities`), `image`, `audio`, `embedded-context` (prompts), `mcp-http`,
    /// `mcp-sse`.
    pub capabilities: Vec<String>,
}

/// The runtimes at one moment ([`RuntimeManager::census`]); an agent not counted is cold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCensus {
    /// Starts waiting for a slot under `max_live`.
    pub queued: usize,
    /// Processes being spawned or in their ACP handshake.
    pub starting: usize,
    /// Processes with an open session.
    pub live: usize,
    /// The agent processes (group leaders) there are now.
    pub pids: Vec<u32>,
    /// Messages queued in the inboxes, not yet delivered.
    pub inbox_messages: usize,
}

/// What an agent's process tree holds (see [`process::tree_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeMemory {
    pub processes: usize,
    pub rss_bytes: u64,
}

/// A change to one agent's timeline, for live clients.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    pub agent_id: AgentId,
    /// The timeline's revision after this change (see `TimelinePage::revision`).
    pub revision: u64,
    pub update: TimelineUpdate,
}

/// How a client answers a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionChoice {
    /// By option kind: `allow_once`, `allow_always`, `reject_once`, `reject_always`.
    Kind(String),
    /// By the agent's own option id.
    OptionId(String),
    /// Decline to choose (the agent treats it as cancelled).
    Cancel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionAnswer {
    /// The permission item's timeline seq; `None` answers the oldest pending request.
    pub request: Option<u64>,
    pub choice: PermissionChoice,
}

/// A permission request waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPermission {
    /// The permission item's timeline seq: what an answer names.
    pub seq: u64,
    pub tool_call_id: Option<String>,
    pub title: Option<String>,
    pub options: Vec<Value>,
}

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("unknown provider `{name}`; the providers are {}", .known.join(", "))]
    UnknownProvider { name: String, known: Vec<String> },
    /// `reason` names the provider and says what to install.
    #[error("{reason}")]
    ProviderUnavailable { provider: String, reason: String },
    #[error("agent `{0}` has no pending permission request")]
    NoPendingPermission(AgentId),
    #[error("agent `{agent}`: {message}")]
    Permission { agent: AgentId, message: String },
    #[error("agent `{agent}` could not start: {error}")]
    StartFailed {
        agent: AgentId,
        error: Box<LaunchError>,
    },
    #[error("agent `{agent}`: {message}")]
    Agent { agent: AgentId, message: String },
    #[error("the runtime of agent `{0}` stopped")]
    Stopped(AgentId),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// A sign-in that cannot be done as asked (`message` says what to give instead).
    #[error("{message}")]
    InvalidSignIn { message: String },
    /// A config option the agent does not offer, or a value it does not take.
    #[error("agent `{agent}`: {message}")]
    NoSuchOption { agent: AgentId, message: String },
    /// The provider's agent does not advertise `sessionCapabilities.list`.
    #[error(
        "the agent of provider `{provider}` cannot list its sessions (it advertises no `sessionCapabilities.list`)"
    )]
    CannotList { provider: String },
    /// Listing the provider's sessions failed (see [`RuntimeManager::provider_sessions`]).
    #[error("listing the sessions of provider `{provider}` failed: {message}")]
    Listing { provider: String, message: String },
}

impl AcpError {
    /// The stable code clients match on.
    pub fn code(&self) -> ErrorCode {
        match self {
            AcpError::Registry(e) => e.code(),
            AcpError::Store(_) => ErrorCode::StoreFailed,
            AcpError::Config(_) => ErrorCode::InvalidConfig,
            AcpError::UnknownProvider { .. } => ErrorCode::UnknownProvider,
            AcpError::ProviderUnavailable { .. } => ErrorCode::ProviderUnavailable,
            AcpError::NoPendingPermission(_) | AcpError::Permission { .. } => {
                ErrorCode::NoSuchPermission
            }
            AcpError::StartFailed { .. } => ErrorCode::AgentStartFailed,
            AcpError::Agent { .. } | AcpError::Listing { .. } => ErrorCode::AgentError,
            AcpError::Stopped(_) => ErrorCode::RuntimeStopped,
            AcpError::ShuttingDown => ErrorCode::ShuttingDown,
            AcpError::InvalidSignIn { .. }
            | AcpError::CannotList { .. }
            | AcpError::NoSuchOption { .. } => ErrorCode::InvalidInput,
        }
    }
}

/// Gives an agent its MCP servers: called with the agent and whether it advertised HTTP MCP
/// support; returns the `mcpServers` array of ACP `session/new`.
pub type McpServers = Arc<dyn Fn(AgentId, bool) -> Value + Send + Sync>;

/// Agents that get no MCP server (`mcpServers: []`): runtimes without a daemon.
pub fn no_mcp_servers() -> McpServers {
    Arc::new(|_, _| Value::Array(Vec::new()))
}

/// What a live session offers to set, as clients see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveSession {
    /// The session's modes (`{currentModeId, availableModes}`), where it offers them.
    pub modes: Option<Value>,
    /// Its config options (ACP `configOptions`), where it offers them.
    pub config_options: Option<Vec<ConfigOptionInfo>>,
    /// The subagents its process runs itself.
    pub own_subagents: Vec<OwnSubagentInfo>,
}

/// The subagents an agent's process runs itself are `subagent` activity while they run. They
/// end with the process, which the archive closes: there is nothing more to stop.
struct OwnSubagentFamily(Arc<Mutex<HashMap<AgentId, LiveSession>>>);

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
    actors: Arc<Actors>,
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
    live_runtimes: AtomicUsize,
    /// The `max_live` ceiling's slots.
    pub(crate) slots: Arc<slots::Slots>,
    /// Each agent's runtime that is not cold, for clients.
    runtimes: Mutex<HashMap<AgentId, RuntimeView>>,
    /// The agents whose runtime view changed.
    pub(crate) runtime_changes: broadcast::Sender<AgentId>,
    /// The background jobs agents own (and the ACP terminals they open).
    pub(crate) jobs: jobs::Jobs,
    /// Each provider's sign-in, as its agents' last starts saw it.
    pub(crate) sign_ins: auth::SignIns,
    /// Turns and streamed text, counted as they happen.
    pub(crate) metrics: metrics::RuntimeMetrics,
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

    fn runtime(&self, id: AgentId) -> RuntimeView {
        self.runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .copied()
            .unwrap_or(RuntimeView::COLD)
    }
}

/// Asks agent `agent`'s task to hibernate its idle runtime (its task checks it still is).
fn ask_to_hibernate(actors: &Weak<Actors>, agent: AgentId) {
    let Some(handle) = actors.upgrade().and_then(|a| a.existing(agent)) else {
        return;
    };
    if let Err(mpsc::error::TrySendError::Full(command)) =
        handle.commands.try_send(Command::Hibernate)
    {
        // A full channel means the task is busy: it asks again when idle; sending later is
        // enough, and never blocks whoever freed or asked for a slot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = handle.commands.send(command).await;
            });
        }
    }
}

#[derive(Clone)]
struct ActorHandle {
    commands: mpsc::Sender<Command>,
    busy: watch::Receiver<bool>,
    /// Its sender is dropped when the task has ended (see [`ActorHandle::ended`]).
    ended: watch::Receiver<()>,
    generation: u64,
}

impl ActorHandle {
    /// Resolves once the task has ended: its files are closed and it left the task table.
    async fn ended(&self) {
        // Nothing is ever sent: `changed` returns (an error) when the sender is dropped.
        let _ = self.ended.clone().changed().await;
    }

    /// Sends the command `command` builds around a reply channel and awaits the reply.
    async fn request<T>(
        &self,
        agent: AgentId,
        command: impl FnOnce(oneshot::Sender<Result<T, AcpError>>) -> Command,
    ) -> Result<T, AcpError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| AcpError::Stopped(agent))?;
        rx.await.map_err(|_| AcpError::Stopped(agent))?
    }
}

/// The agents' tasks. The manager starts them; the registry reaches them (cancel, close,
/// shutdown) through [`Runtimes`], without the rest of the manager.
struct Actors {
    home: PathBuf,
    /// Set once the registry is open: whether a closed agent is archived (its inbox goes).
    /// The registry holds the actors weakly, so this makes no cycle.
    registry: std::sync::OnceLock<Registry>,
    tasks: Mutex<HashMap<AgentId, ActorHandle>>,
    /// The providers' warm spares (they end first when the daemon stops).
    spares: Arc<warm::Spares>,
    shutting_down: AtomicBool,
    generation: AtomicU64,
}

impl Actors {
    fn tasks(&self) -> MutexGuard<'_, HashMap<AgentId, ActorHandle>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn archived(&self, agent: AgentId) -> bool {
        self.registry
            .get()
            .and_then(|r| r.get(agent))
            .is_some_and(|a| a.is_archived())
    }

    fn existing(&self, agent: AgentId) -> Option<ActorHandle> {
        self.tasks().get(&agent).cloned()
    }

    fn forget(&self, id: AgentId, generation: u64) {
        let mut tasks = self.tasks();
        if tasks.get(&id).is_some_and(|h| h.generation == generation) {
            tasks.remove(&id);
        }
    }

    /// Cancels the agent's turn; without `keep_inbox` its queued messages go too, also from
    /// the disk of an agent with no task.
    async fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> Result<(), AcpError> {
        let Some(handle) = self.existing(agent) else {
            if !keep_inbox {
                // A cold agent may still hold queued messages on disk.
                let home = self.home.clone();
                tokio::task::spawn_blocking(move || {
                    Inbox::open(&home, agent).and_then(|mut i| i.discard_all())
                })
                .await
                .map_err(|_| AcpError::ShuttingDown)??;
            }
            return Ok(());
        };
        handle
            .request(agent, |reply| Command::Cancel {
                cause,
                keep_inbox,
                reply,
            })
            .await
    }

    async fn close(&self, agent: AgentId, cause: CancelCause) {
        let Some(handle) = self.existing(agent) else {
            self.discard_cold_inbox(agent);
            return;
        };
        let (reply, rx) = oneshot::channel();
        if handle
            .commands
            .send(Command::Close { cause, reply })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        // The task may have been closing already (another close, or it is ending): whoever
        // closed it, nothing of it runs once this returns. An unarchive that follows an
        // archive therefore finds the inbox the archive's close discarded, not one a task
        // still ending left behind (the task decides to discard at its very end).
        handle.ended().await;
        self.discard_cold_inbox(agent);
    }

    /// If the agent is archived and has no task: what its inbox held never runs (archive wins), and the
    /// file goes. Done under the task table's lock, so no task of this agent opens the inbox
    /// meanwhile (a task starts under it); the work is one read, one fsynced line, one unlink.
    fn discard_cold_inbox(&self, agent: AgentId) {
        let tasks = self.tasks();
        // Not archived (any more): nothing to discard. A task took it over: its close discards.
        if !self.archived(agent) || tasks.contains_key(&agent) {
            return;
        }
        let discarded = Inbox::open(&self.home, agent)
            .and_then(|mut inbox| inbox.discard_all())
            .and_then(|dropped| Inbox::remove(&self.home, agent).map(|()| dropped));
        drop(tasks);
        match discarded {
            Ok(dropped) if !dropped.is_empty() => {
                tracing::info!(%agent, count = dropped.len(), "archive dropped the queued messages of a cold agent");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%agent, error = %e, "cannot discard the inbox of an archived agent; boot removes it");
            }
        }
    }

    /// Stops every runtime and takes no new work.
    async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.spares.shutdown().await;
        let handles: Vec<ActorHandle> = self.tasks().values().cloned().collect();
        let mut closing = tokio::task::JoinSet::new();
        for handle in handles {
            closing.spawn(async move {
                let (reply, rx) = oneshot::channel();
                if handle
                    .commands
                    .send(Command::Shutdown { reply })
                    .await
                    .is_ok()
                {
                    let _ = rx.await;
                }
            });
        }
        while closing.join_next().await.is_some() {}
    }
}

/// The runtimes as the registry sees them. It holds the actors weakly: the actors hold the
/// registry, and ownership runs from the manager to the registry, never back. Once the
/// manager is gone there is nothing left to cancel or close.
struct Runtimes(Weak<Actors>);

impl RuntimeControl for Runtimes {
    fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            let Some(actors) = actors else { return Ok(()) };
            actors
                .cancel(agent, cause, keep_inbox)
                .await
                .map_err(|e| RuntimeError {
                    agent,
                    message: e.to_string(),
                })
        })
    }

    fn close(
        &self,
        agent: AgentId,
        cause: CancelCause,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            if let Some(actors) = actors {
                actors.close(agent, cause).await;
            }
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            if let Some(actors) = actors {
                actors.shutdown().await;
            }
        })
    }
}

/// The runtimes of one daemon.
#[derive(Clone)]
pub struct RuntimeManager {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RuntimeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeManager")
            .field("home", &self.shared.home)
            .finish_non_exhaustive()
    }
}

impl RuntimeManager {
    /// Opens the registry with these runtimes, then delivers what the inbox kept across a
    /// restart. `mcp` gives each agent its MCP servers: it is wired here, before any agent
    /// can start, so none starts without them.
    pub async fn open(
        home: &Path,
        providers: Providers,
        mcp: McpServers,
    ) -> Result<(RuntimeManager, Registry, BootReport), AcpError> {
        let actors = Arc::new(Actors {
            home: home.to_path_buf(),
            registry: std::sync::OnceLock::new(),
            tasks: Mutex::new(HashMap::new()),
            spares: Arc::new(warm::Spares::new(home)),
            shutting_down: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        });
        let runtimes: Arc<dyn RuntimeControl> = Arc::new(Runtimes(Arc::downgrade(&actors)));
        let home_buf = home.to_path_buf();
        let policies = providers.clone();
        let (registry, boot) = tokio::task::spawn_blocking(move || {
            // The agent's own policy, else its provider's, else `notify`.
            let on_interrupt = |agent: &drover_core::Agent| {
                agent
                    .config
                    .on_interrupt
                    .or_else(|| policies.get(&agent.provider)?.on_interrupt)
                    .unwrap_or_default()
            };
            Registry::open_with(&home_buf, runtimes, &on_interrupt)
        })
        .await
        .map_err(|_| AcpError::ShuttingDown)??;
        // Before any runtime can start: what a daemon killed by a signal left running goes
        // first, so that an agent never has two.
        let agents: Vec<String> = registry.agents().iter().map(|a| a.id.to_string()).collect();
        let home_buf = home.to_path_buf();
        let reconciled =
            tokio::task::spawn_blocking(move || records::reconcile(&home_buf, &agents))
                .await
                .map_err(|_| AcpError::ShuttingDown)?;
        if reconciled.records > 0 || !reconciled.killed.is_empty() {
            tracing::warn!(
                records = reconciled.records,
                killed = reconciled.killed.len(),
                reused_pids = reconciled.reused.len(),
                "ended the agent processes a previous daemon left running"
            );
        }
        // Also before anything can start a job: what a killed daemon left of its jobs ends,
        // and they are marked lost.
        let home_buf = home.to_path_buf();
        let (jobs, lost) = tokio::task::spawn_blocking(move || jobs::Jobs::open(&home_buf))
            .await
            .map_err(|_| AcpError::ShuttingDown)?;
        if lost > 0 {
            tracing::warn!(
                lost,
                "jobs a previous daemon left running were ended and marked lost"
            );
        }
        registry.register_family(jobs.family());
        let sessions = Arc::new(Mutex::new(HashMap::new()));
        registry.register_family(Arc::new(OwnSubagentFamily(Arc::clone(&sessions))));
        let _ = actors.registry.set(registry.clone());
        let (updates, _) = broadcast::channel(UPDATE_CAPACITY);
        let (runtime_changes, _) = broadcast::channel(RUNTIME_CHANGE_CAPACITY);
        let weak = Arc::downgrade(&actors);
        let spares = Arc::downgrade(&actors.spares);
        let slots = Arc::new(slots::Slots::new(Box::new(move |agent| {
            // A spare is given up before any runtime hibernates.
            if spares.upgrade().is_some_and(|s| s.give_up(agent)) {
                return;
            }
            ask_to_hibernate(&weak, agent);
        })));
        let manager = RuntimeManager {
            shared: Arc::new(Shared {
                home: home.to_path_buf(),
                providers: LiveProviders::new(home, providers),
                registry: registry.clone(),
                updates,
                actors,
                sessions,
                advertised: Mutex::new(HashMap::new()),
                queued: Mutex::new(HashMap::new()),
                mcp,
                live_runtimes: AtomicUsize::new(0),
                slots,
                runtimes: Mutex::new(HashMap::new()),
                runtime_changes,
                jobs: jobs.clone(),
                sign_ins: auth::SignIns::default(),
                metrics: metrics::RuntimeMetrics::default(),
            }),
        };
        jobs.attach(&manager.shared);
        manager.resume_pending().await;
        warm::keep(
            Arc::downgrade(&manager.shared),
            manager.shared.actors.spares.clone(),
        );
        manager.shared.jobs.notify_lost();
        Ok((manager, registry, boot))
    }

    /// How many warm spares of `provider` are ready, and how many it wants (`warm`).
    pub fn warm(&self, provider: &Provider) -> warm::WarmCount {
        self.shared.actors.spares.count(provider)
    }

    /// The providers as `config.toml` says now (it is read again when it changed).
    pub fn providers(&self) -> Result<Arc<Providers>, AcpError> {
        Ok(self.shared.providers.current()?)
    }

    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// The daemon's background jobs.
    pub fn jobs(&self) -> &jobs::Jobs {
        &self.shared.jobs
    }

    /// What the agent's process said of itself at its last start (`None` before any).
    pub fn advertised(&self, agent: AgentId) -> Option<Advertised> {
        self.shared
            .advertised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&agent)
            .cloned()
    }

    /// What the agent's live session offers to set, if it is live and offers anything.
    pub fn live_session(&self, agent: AgentId) -> Option<LiveSession> {
        self.shared
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&agent)
            .cloned()
    }

    /// Starts the agent's runtime if it is not running (an archived agent is left alone).
    pub async fn ensure_started(&self, agent: AgentId) -> Result<(), AcpError> {
        if self.known(agent)?.is_archived() {
            return Ok(());
        }
        let handle = self.handle(agent).await?;
        handle
            .commands
            .send(Command::Start)
            .await
            .map_err(|_| AcpError::Stopped(agent))
    }

    /// Looks again at what waits in the inbox of each of `agents` (a budget that held it was
    /// raised): an agent with queued messages gets its task, which delivers them if nothing
    /// holds them any more. Archived agents are left alone.
    pub async fn wake_queued(&self, agents: &[AgentId]) {
        for &agent in agents {
            if self.registry().get(agent).is_none_or(|a| a.is_archived()) {
                continue;
            }
            // A task (live or closing) owns the inbox: it is told; a cold agent's inbox is
            // read here, as at boot.
            let has_task = self.shared.actors.tasks().contains_key(&agent);
            if !has_task && !Inbox::open(&self.shared.home, agent).is_ok_and(|i| i.has_wake()) {
                continue;
            }
            if let Ok(handle) = self.handle(agent).await {
                let _ = handle.commands.send(Command::Wake).await;
            }
        }
    }

    /// Starts the agent's runtime again after a failed start, now (the user's retry): its
    /// queued messages then run.
    pub async fn restart(&self, agent: AgentId) -> Result<(), AcpError> {
        if self.known(agent)?.is_archived() {
            return Err(RegistryError::Archived { agent }.into());
        }
        let handle = self.handle(agent).await?;
        handle
            .commands
            .send(Command::Retry)
            .await
            .map_err(|_| AcpError::Stopped(agent))
    }

    /// The messages queued for the agent and not delivered yet, oldest first.
    pub async fn queued(&self, agent: AgentId) -> Result<Vec<InboxMessage>, AcpError> {
        if self.known(agent)?.is_archived() {
            return Ok(Vec::new());
        }
        let published = || {
            self.shared
                .queued
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&agent)
                .cloned()
        };
        // Published by the agent's task: no waiting for a task busy starting the agent.
        if let Some(queued) = published() {
            return Ok(queued);
        }
        let handle = self.handle(agent).await?;
        if let Some(queued) = published() {
            return Ok(queued);
        }
        let (reply, rx) = oneshot::channel();
        handle
            .commands
            .send(Command::Queued { reply })
            .await
            .map_err(|_| AcpError::Stopped(agent))?;
        rx.await.map_err(|_| AcpError::Stopped(agent))
    }

    /// A provider's sign-in as the daemon knows it: the state its agents' last starts saw
    /// (`None`: none started since the daemon did), the methods it offered, and what to tell
    /// people.
    pub fn sign_in_status(
        &self,
        provider: &Provider,
    ) -> (
        Option<auth::SignInState>,
        Vec<drover_core::AuthMethod>,
        String,
    ) {
        let (state, methods) = match self.shared.sign_ins.get(&provider.name) {
            Some((state, methods)) => (Some(state), methods),
            None => (
                None,
                self.recorded_methods(&provider.name).unwrap_or_default(),
            ),
        };
        let state = state.or_else(|| {
            self.recorded_methods(&provider.name)
                .map(|_| auth::SignInState::NeedsSignIn)
        });
        let how = auth::how_to_sign_in(provider, &methods);
        (state, methods, how)
    }

    /// The methods recorded with an agent of `provider` that waits for a sign-in.
    fn recorded_methods(&self, provider: &str) -> Option<Vec<drover_core::AuthMethod>> {
        self.registry().agents().iter().find_map(|a| {
            (a.provider == provider && !a.is_archived())
                .then(|| a.start_failure.as_ref()?.sign_in.clone())
                .flatten()
        })
    }

    /// Signs `provider` in with `method_id` (see `ClientMessage::SignIn`): an `env_var`
    /// method's `vars` go into the provider's `env` in `config.toml`, an `agent` method
    /// becomes its `auth`, a `terminal` one (run by the user) needs nothing kept. Then every
    /// agent of the provider waiting for a sign-in starts again; their ids are returned.
    pub async fn sign_in(
        &self,
        provider_name: &str,
        method_id: &str,
        vars: BTreeMap<String, String>,
    ) -> Result<Vec<AgentId>, AcpError> {
        let providers = self.providers()?;
        let provider = providers
            .get(provider_name)
            .ok_or_else(|| AcpError::UnknownProvider {
                name: provider_name.to_string(),
                known: providers.all().map(|p| p.name.clone()).collect(),
            })?;
        let (_, methods, _) = self.sign_in_status(provider);
        let method = methods.iter().find(|m| m.id == method_id);
        if method.is_none() && !methods.is_empty() {
            let ids: Vec<&str> = methods.iter().map(|m| m.id.as_str()).collect();
            return Err(AcpError::InvalidSignIn {
                message: format!(
                    "{provider_name} offers no sign-in method `{method_id}`; its methods are {}",
                    ids.join(", ")
                ),
            });
        }
        let unlisted = if vars.is_empty() {
            drover_protocol::AuthKind::Agent
        } else {
            drover_protocol::AuthKind::EnvVar
        };
        let kind = method.map_or(unlisted, |m| m.kind);
        let entry = match kind {
            drover_protocol::AuthKind::EnvVar => {
                if let Some(method) = method {
                    let missing: Vec<&str> = method
                        .vars
                        .iter()
                        .filter(|v| !v.optional && vars.get(&v.name).is_none_or(String::is_empty))
                        .map(|v| v.name.as_str())
                        .collect();
                    if !missing.is_empty() {
                        return Err(AcpError::InvalidSignIn {
                            message: format!(
                                "sign-in `{method_id}` of {provider_name} needs {}",
                                missing.join(", ")
                            ),
                        });
                    }
                    if let Some(extra) = vars
                        .keys()
                        .find(|k| !method.vars.iter().any(|v| &v.name == *k))
                    {
                        return Err(AcpError::InvalidSignIn {
                            message: format!(
                                "sign-in `{method_id}` of {provider_name} takes no variable `{extra}`"
                            ),
                        });
                    }
                }
                Some(providers::SignInEntry::Env(vars))
            }
            drover_protocol::AuthKind::Agent => {
                Some(providers::SignInEntry::Auth(method_id.to_string()))
            }
            drover_protocol::AuthKind::Terminal => None,
        };
        if let Some(entry) = entry {
            let home = self.shared.home.clone();
            let name = provider_name.to_string();
            tokio::task::spawn_blocking(move || providers::store_sign_in(&home, &name, &entry))
                .await
                .map_err(|_| AcpError::ShuttingDown)??;
        }
        let waiting: Vec<AgentId> = self
            .registry()
            .agents()
            .iter()
            .filter(|a| {
                a.provider == provider_name
                    && !a.is_archived()
                    && a.start_failure
                        .as_ref()
                        .is_some_and(|f| f.sign_in.is_some())
            })
            .map(|a| a.id)
            .collect();
        // The sign-in is kept: one agent that cannot start again (archived meanwhile, say)
        // keeps none of the others waiting.
        let mut started = Vec::with_capacity(waiting.len());
        for agent in waiting {
            match self.restart(agent).await {
                Ok(()) => started.push(agent),
                Err(e) => {
                    tracing::warn!(%agent, error = %e, "not started again after the sign-in");
                }
            }
        }
        Ok(started)
    }

    /// How many agents have a task (a live or starting runtime, or queued work).
    pub fn active_count(&self) -> usize {
        self.shared.actors.tasks().len()
    }

    /// How many agent processes are running now (runtimes that are live, not cold).
    pub fn live_count(&self) -> usize {
        self.shared.live_runtimes.load(Ordering::Relaxed)
    }

    /// How many starts wait for a slot under `[runtimes] max_live`.
    pub fn queued_count(&self) -> usize {
        self.shared.slots.queued()
    }

    /// The runtimes' counters (turns, streamed text), for the daemon's `/metrics`.
    pub fn metrics(&self) -> &metrics::RuntimeMetrics {
        &self.shared.metrics
    }

    /// The runtimes at this moment, for `/metrics`: how many are queued, starting and live,
    /// the pids of the agent processes, and how many messages wait in the inboxes. Two short
    /// lock holds, no allocation per agent beyond the pids.
    pub fn census(&self) -> RuntimeCensus {
        let mut census = RuntimeCensus::default();
        {
            let runtimes = self
                .shared
                .runtimes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for view in runtimes.values() {
                match view.state {
                    RuntimeState::Cold => {}
                    RuntimeState::Queued => census.queued += 1,
                    RuntimeState::Starting => census.starting += 1,
                    RuntimeState::Live => census.live += 1,
                }
                census.pids.extend(view.pid);
            }
        }
        census.inbox_messages = self
            .shared
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum();
        census
    }

    /// The `[runtimes]` settings in force (as `config.toml` says now).
    pub fn runtime_settings(&self) -> RuntimeSettings {
        self.shared.settings()
    }

    /// Timeline updates of every agent, live.
    pub fn subscribe(&self) -> broadcast::Receiver<TimelineEvent> {
        self.shared.updates.subscribe()
    }

    /// The ids of agents whose runtime view ([`RuntimeManager::runtime`]) changed, live.
    pub fn subscribe_runtime_changes(&self) -> broadcast::Receiver<AgentId> {
        self.shared.runtime_changes.subscribe()
    }

    /// Where the agent's runtime is (cold when it has none).
    pub fn runtime(&self, agent: AgentId) -> RuntimeView {
        self.shared.runtime(agent)
    }

    /// The processes and resident memory of the agent's process tree, if it has a process.
    /// Reads `/proc` on a blocking thread.
    pub async fn runtime_memory(&self, agent: AgentId) -> Option<RuntimeMemory> {
        let pid = self.shared.runtime(agent).pid?;
        let (processes, rss_bytes) = tokio::task::spawn_blocking(move || {
            // The marker its process carries: the agent's id, or the warm spare's it took.
            let marker =
                records::environ_var(pid, "DROVER_AGENT_ID").unwrap_or_else(|| agent.to_string());
            process::tree_memory(pid, Some(&marker))
        })
        .await
        .ok()?;
        Some(RuntimeMemory {
            processes,
            rss_bytes,
        })
    }

    /// Starts the runtime of every agent whose inbox kept a message that wakes it.
    async fn resume_pending(&self) {
        let dir = self.shared.home.join("inbox");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_suffix(".jsonl")
                .and_then(|s| s.parse::<AgentId>().ok())
            else {
                continue;
            };
            let Some(record) = self.registry().get(id) else {
                continue;
            };
            if record.is_archived() {
                // Archive wins, also over a message that slipped in before it (older drovers).
                self.shared.actors.discard_cold_inbox(id);
                continue;
            }
            let has_wake = Inbox::open(&self.shared.home, id).is_ok_and(|i| i.has_wake());
            if has_wake {
                tracing::info!(agent = %id, "delivering messages queued before the restart");
                if let Ok(handle) = self.handle(id).await {
                    let _ = handle.commands.send(Command::Wake).await;
                }
            }
        }
    }

    /// Checks the provider, creates the agent, starts its runtime, and queues `prompt` as its
    /// first message.
    pub async fn create_agent(
        &self,
        new: NewAgent,
        prompt: Option<String>,
    ) -> Result<Agent, AcpError> {
        self.create_agent_notifying(new, prompt, None).await
    }

    /// [`RuntimeManager::create_agent`], telling `notify` how the first turn goes.
    pub async fn create_agent_notifying(
        &self,
        mut new: NewAgent,
        prompt: Option<String>,
        notify: Option<AgentId>,
    ) -> Result<Agent, AcpError> {
        self.prepare(&mut new)?;
        let agent = self.registry().create_agent(new).await?;
        // Told of the first turn: the agent that asked for it sent it.
        let source = notify.map_or_else(|| "user".to_string(), |a| format!("agent:{a}"));
        self.start_new(&agent, prompt, source, notify).await?;
        Ok(agent)
    }

    /// Checks that the agent's provider is known and available, and fills in the provider's
    /// default model, mode and effort: what must hold before an agent is recorded.
    pub fn prepare(&self, new: &mut NewAgent) -> Result<(), AcpError> {
        let providers = self.providers()?;
        let provider = providers
            .get(&new.provider)
            .ok_or_else(|| AcpError::UnknownProvider {
                name: new.provider.clone(),
                known: providers.all().map(|p| p.name.clone()).collect(),
            })?;
        if let Availability::Unavailable { reason } = providers.availability(provider) {
            return Err(AcpError::ProviderUnavailable {
                provider: new.provider.clone(),
                reason,
            });
        }
        if new.config.model.is_none() {
            new.config.model = provider.default_model.clone();
        }
        if new.config.mode.is_none() {
            new.config.mode = provider.default_mode.clone();
        }
        if new.config.effort.is_none() {
            new.config.effort = provider.default_effort.clone();
        }
        Ok(())
    }

    /// Starts a newly recorded agent's runtime and queues `prompt` as its first message (from
    /// `source`: `user`, `agent:{id}`), telling `notify` how that turn goes.
    pub async fn start_new(
        &self,
        agent: &Agent,
        prompt: Option<String>,
        source: String,
        notify: Option<AgentId>,
    ) -> Result<(), AcpError> {
        let handle = self.handle(agent.id).await?;
        if let Some(prompt) = prompt.filter(|p| !p.trim().is_empty()) {
            let message = InboxMessage::new(Delivery::Followup, prompt, source).notifying(notify);
            handle
                .request(agent.id, |reply| Command::Deliver { message, reply })
                .await
        } else {
            let _ = handle.commands.send(Command::Start).await;
            Ok(())
        }
    }

    /// Queues a message. `followup` waits for the current turn, `steer` cancels it (keeping
    /// the inbox) and goes first, `inject` rides along with the next prompt. Returns the
    /// message id once it is durable.
    pub async fn deliver(
        &self,
        agent: AgentId,
        delivery: Delivery,
        text: String,
        source: String,
    ) -> Result<String, AcpError> {
        self.deliver_message(agent, InboxMessage::new(delivery, text, source))
            .await
    }

    /// [`RuntimeManager::deliver`] for a message built by the caller (e.g. one whose turn
    /// notifies another agent when it ends).
    pub async fn deliver_message(
        &self,
        agent: AgentId,
        message: InboxMessage,
    ) -> Result<String, AcpError> {
        let record = self.known(agent)?;
        // Archive wins: an archived agent takes no message (its task checks again, after
        // any archive that raced this one).
        if record.is_archived() {
            return Err(RegistryError::Archived { agent }.into());
        }
        let id = message.id.clone();
        // A task that is closing (its agent was just archived or closed) takes no more
        // commands: the message goes to a fresh one.
        for attempt in 0..3 {
            let handle = self.handle(agent).await?;
            let message = message.clone();
            match handle
                .request(agent, |reply| Command::Deliver { message, reply })
                .await
            {
                // It began to close after `handle`: the next `handle` waits for its end.
                Err(AcpError::Stopped(_)) if attempt < 2 => {}
                other => return other.map(|()| id),
            }
        }
        Ok(id)
    }

    /// Cancels the running turn; without `keep_inbox`, queued messages are dropped too.
    pub async fn cancel_turn(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        self.shared.actors.cancel(agent, cause, keep_inbox).await
    }

    pub async fn answer_permission(
        &self,
        agent: AgentId,
        answer: PermissionAnswer,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self
            .existing(agent)
            .ok_or(AcpError::NoPendingPermission(agent))?;
        handle
            .request(agent, |reply| Command::Answer { answer, reply })
            .await
    }

    pub async fn pending_permissions(
        &self,
        agent: AgentId,
    ) -> Result<Vec<PendingPermission>, AcpError> {
        self.known(agent)?;
        let Some(handle) = self.existing(agent) else {
            return Ok(Vec::new());
        };
        handle
            .request(agent, |reply| Command::Pending { reply })
            .await
    }

    /// Sets the mode (recorded, and sent to a live agent).
    pub async fn set_mode(&self, agent: AgentId, mode: String) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetMode { mode, reply })
            .await
    }

    /// Sets the model (recorded, and sent to a live agent).
    pub async fn set_model(&self, agent: AgentId, model: String) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetModel { model, reply })
            .await
    }

    /// Sets one of the agent's config options, named by its id or its category (recorded,
    /// and sent to a live agent).
    pub async fn set_config_option(
        &self,
        agent: AgentId,
        key: String,
        value: String,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetConfigOption {
                key,
                value,
                reply,
            })
            .await
    }

    /// Resolves when the agent is idle with nothing queued that would wake it, or after
    /// `timeout` (then `false`).
    pub async fn wait_idle(&self, agent: AgentId, timeout: Duration) -> Result<bool, AcpError> {
        self.known(agent)?;
        let Some(handle) = self.existing(agent) else {
            return Ok(true);
        };
        let mut busy = handle.busy.clone();
        let settled = async move {
            // Commands sent before this call (a delivery) must count.
            let (reply, rx) = oneshot::channel();
            if handle.commands.send(Command::Ping { reply }).await.is_ok() {
                let _ = rx.await;
            }
            let _ = busy.wait_for(|b| !*b).await;
        };
        Ok(tokio::time::timeout(timeout, settled).await.is_ok())
    }

    /// A page of the agent's timeline (from disk: appends are written as they happen).
    pub async fn timeline(&self, agent: AgentId, page: Page) -> Result<TimelinePage, AcpError> {
        self.known(agent)?;
        let home = self.shared.home.clone();
        Ok(
            tokio::task::spawn_blocking(move || Timeline::read_page(&home, agent, page))
                .await
                .map_err(|_| AcpError::ShuttingDown)??,
        )
    }

    /// The process id of the agent's live runtime (its process group id), if any.
    pub async fn runtime_pid(&self, agent: AgentId) -> Option<u32> {
        let handle = self.existing(agent)?;
        let (reply, rx) = oneshot::channel();
        handle.commands.send(Command::Pid { reply }).await.ok()?;
        rx.await.ok().flatten()
    }

    fn known(&self, agent: AgentId) -> Result<Agent, AcpError> {
        self.registry()
            .get(agent)
            .ok_or_else(|| RegistryError::UnknownAgent(agent.to_string()).into())
    }

    fn existing(&self, agent: AgentId) -> Option<ActorHandle> {
        self.shared.actors.existing(agent)
    }

    /// The agent's task, started if needed (cheap: no process until a turn needs one).
    async fn handle(&self, agent: AgentId) -> Result<ActorHandle, AcpError> {
        let actors = &self.shared.actors;
        // A task that is closing still owns the agent's inbox, timeline and process: a new
        // one starts only once it has ended, so one agent never has two. Bounded: each round
        // waits for one task's end.
        for _ in 0..8 {
            if actors.shutting_down.load(Ordering::SeqCst) {
                return Err(AcpError::ShuttingDown);
            }
            let closing = {
                let mut tasks = actors.tasks();
                match tasks.get(&agent) {
                    Some(handle) if !handle.commands.is_closed() => return Ok(handle.clone()),
                    Some(handle) => handle.clone(),
                    None => {
                        let generation = actors.generation.fetch_add(1, Ordering::Relaxed);
                        let (commands, busy, ended) =
                            actor::spawn(self.shared.clone(), agent, generation)?;
                        let handle = ActorHandle {
                            commands,
                            busy,
                            ended,
                            generation,
                        };
                        tasks.insert(agent, handle.clone());
                        return Ok(handle);
                    }
                }
            };
            closing.ended().await;
        }
        Err(AcpError::Stopped(agent))
    }
}

/// The manager is the runtimes too, for its owner (the daemon's shutdown, tests): the same
/// operations as [`Runtimes`], through the manager's checks.
impl RuntimeControl for RuntimeManager {
    fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let manager = self.clone();
        Box::pin(async move {
            manager
                .cancel_turn(agent, cause, keep_inbox)
                .await
                .map_err(|e| RuntimeError {
                    agent,
                    message: e.to_string(),
                })
        })
    }

    fn close(
        &self,
        agent: AgentId,
        cause: CancelCause,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let actors = self.shared.actors.clone();
        Box::pin(async move {
            actors.close(agent, cause).await;
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let actors = self.shared.actors.clone();
        let jobs = self.shared.jobs.clone();
        // Every job is killed (TERM, grace, KILL) while the runtimes close.
        Box::pin(async move {
            tokio::join!(actors.shutdown(), jobs.shutdown());
        })
    }
}
