//! `RuntimeManager`: the runtimes of one daemon. Opening wires everything once, in order,
//! before any agent starts; the rest reads the runtimes' state (views, census, memory) and
//! finds or starts an agent's task.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use drover_core::inbox::Inbox;
use drover_core::outbox::Outbox;
use drover_core::{Agent, AgentId, BootReport, Registry, RegistryError, RuntimeControl};
use tokio::sync::broadcast;

use crate::actor::Command;
use crate::actors::{ActorHandle, Actors, Runtimes, ask_to_hibernate};
use crate::providers::{LiveProviders, Provider, Providers, RuntimeSettings};
use crate::shared::OwnSubagentFamily;
use crate::{
    AcpError, Advertised, LiveSession, McpServers, RuntimeCensus, RuntimeMemory, RuntimeState,
    RuntimeView, Shared, TimelineEvent, actor, auth, jobs, metrics, process, records, slots, warm,
};

/// How many timeline updates a subscriber may fall behind before it lags.
const UPDATE_CAPACITY: usize = 8192;
/// How many runtime-state changes a subscriber may fall behind before it lags (each is one
/// agent id; a fleet hibernating at once sends one per agent).
const RUNTIME_CHANGE_CAPACITY: usize = 4096;

/// The runtimes of one daemon.
#[derive(Clone)]
pub struct RuntimeManager {
    pub(crate) shared: Arc<Shared>,
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
        let home_buf = home.to_path_buf();
        let outbox = tokio::task::spawn_blocking(move || Outbox::open(&home_buf))
            .await
            .map_err(|_| AcpError::ShuttingDown)?
            .map_err(RegistryError::from)?;
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
                outbox: Arc::new(outbox),
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

    /// What this daemon's agents tell the hub's agents, until the hub has it.
    pub fn outbox(&self) -> &Outbox {
        &self.shared.outbox
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
            let marker = drover_core::procfs::environ_var(pid, "DROVER_AGENT_ID")
                .unwrap_or_else(|| agent.to_string());
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
    pub(crate) async fn resume_pending(&self) {
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

    pub(crate) fn known(&self, agent: AgentId) -> Result<Agent, AcpError> {
        self.registry()
            .get(agent)
            .ok_or_else(|| RegistryError::UnknownAgent(agent.to_string()).into())
    }

    pub(crate) fn existing(&self, agent: AgentId) -> Option<ActorHandle> {
        self.shared.actors.existing(agent)
    }

    /// The agent's task, started if needed (cheap: no process until a turn needs one).
    pub(crate) async fn handle(&self, agent: AgentId) -> Result<ActorHandle, AcpError> {
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

impl RuntimeManager {
    /// Closes every runtime and kills every job (TERM, grace, KILL) at once, for the owner's
    /// shutdown (the daemon's, a test's).
    pub async fn shutdown(&self) {
        tokio::join!(self.shared.actors.shutdown(), self.shared.jobs.shutdown());
    }
}
