//! Warm spares: `[providers.X] warm = N` keeps N processes of provider X started and
//! `initialize`d, so that the next start of one of its agents skips the spawn and the
//! handshake's first step (a Node launcher's boot and the native agent's start dominate a real
//! agent's time to ready).
//!
//! A spare must be the same process the agent would have started, so it is made only of what
//! is not the agent's own: the inherited environment and the provider's variables, an empty
//! neutral directory (`$DROVER_HOME/warm`) as its working directory, and a `DROVER_AGENT_ID`
//! of its own (a fresh id, never another agent's). What is the agent's travels in its ACP
//! session when it takes the spare: its directory (`cwd` of `session/new` or `session/load`)
//! and its MCP servers with their credentials (`mcpServers`). So `warm` is for agents that work
//! in their session's directory (codex-acp, claude-agent-acp, the demo agent), not in their
//! process's. The spare's `DROVER_AGENT_ID` stays its processes' marker after the take: the
//! agent's runtime keeps it (and its runtime record names it), so ending the agent still finds
//! the tools that left its tree, and the next boot still finds them after a crash.
//!
//! Spares count against `[runtimes] max_live`: a spare takes a slot only when one is free and
//! no start waits, and it counts as the runtime idle longest, so a start that needs room gives
//! up a spare before any agent hibernates. A spare is a process the daemon started like any
//! other: it dies with the daemon (the guard, its cgroup and marker), and it has a runtime
//! record for the next boot. A spare that dies is replaced after a backoff; a change to the
//! provider in `config.toml` replaces its spares.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use drover_core::AgentId;
use serde_json::Value;
use tokio::sync::Notify;

use crate::Shared;
use crate::handshake;
use crate::process::{self, Connected};
use crate::providers::{Availability, Provider};
use crate::records;
use crate::slots::SlotGuard;

/// How long a spare may take to answer `initialize`.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the keeper looks at the spares even when nothing told it to.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// How often it looks while no provider wants spares (for a `warm` added to `config.toml`).
const LOOK_IDLE: Duration = Duration::from_secs(2);
/// The first wait before a failed or dead spare is replaced, doubled each time in a row, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// How long after a take its replacement waits: starting a process (a Node launcher's boot)
/// while the agent that took the spare opens its session and runs its first turn would slow
/// exactly what the spare is for, on a machine with few cores.
const REFILL_AFTER_TAKE: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A process started and `initialize`d, waiting for an agent.
pub(crate) struct Spare {
    /// Its `DROVER_AGENT_ID` (the marker of everything it starts) and its slot's key.
    pub(crate) id: AgentId,
    pub(crate) process: Connected,
    /// Its answer to `initialize`.
    pub(crate) init: Value,
    /// The environment it was started with.
    pub(crate) env: BTreeMap<String, String>,
    /// The provider as it was when the spare started.
    provider: Provider,
    /// Its place under `max_live`: the agent that takes it keeps it (`Slots::rekey`), or
    /// gives it back when it already has its own.
    pub(crate) slot: Option<SlotGuard>,
}

impl Spare {
    fn alive(&self) -> bool {
        self.process.running.exited.borrow().is_none()
    }

    /// Ends its processes and removes its record.
    pub(crate) async fn end(mut self, home: &Path) {
        let marker = self.id.to_string();
        process::terminate_group(
            self.process.running.pid,
            Some(&marker),
            self.process.running.cgroup.as_deref(),
            &mut self.process.running.exited,
            crate::CLOSE_GRACE,
        )
        .await;
        records::remove_named(home, &marker);
        tracing::debug!(spare = %self.id, pid = self.process.running.pid, provider = %self.provider.name, "spare ended");
    }
}

/// One provider's spares.
#[derive(Default)]
struct Pool {
    /// The provider as its spares were started for (`None` before the first).
    provider: Option<Provider>,
    ready: Vec<Spare>,
    /// Spares being started (their ids).
    starting: HashSet<AgentId>,
    /// Failed or dead spares in a row, and when the next may start.
    failures: u32,
    retry_at: Option<Instant>,
    /// When a spare was last taken (its replacement waits [`REFILL_AFTER_TAKE`]).
    taken_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    pools: HashMap<String, Pool>,
    /// Starting spares given up for a slot: ended as soon as they are ready.
    doomed: HashSet<AgentId>,
}

/// The spares of one daemon.
pub(crate) struct Spares {
    home: PathBuf,
    state: Mutex<State>,
    shutting_down: AtomicBool,
    /// Wakes the keeper (a spare was taken or given up, the config may have changed).
    wake: Notify,
}

/// How many spares of a provider are ready, and how many it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WarmCount {
    pub ready: usize,
    pub wanted: usize,
}

impl Spares {
    pub(crate) fn new(home: &Path) -> Spares {
        Spares {
            home: home.to_path_buf(),
            state: Mutex::default(),
            shutting_down: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ready spare of `provider` as it is now, if there is one (the keeper starts its
    /// replacement [`REFILL_AFTER_TAKE`] later).
    pub(crate) fn take(&self, provider: &Provider) -> Option<Spare> {
        if provider.warm == 0 {
            return None;
        }
        let mut state = self.lock();
        let pool = state.pools.get_mut(&provider.name)?;
        if pool.provider.as_ref() != Some(provider) {
            return None;
        }
        // A dead one is the keeper's to end and count.
        let alive = pool.ready.iter().rposition(Spare::alive)?;
        pool.taken_at = Some(Instant::now());
        Some(pool.ready.remove(alive))
    }

    /// The evictor's question: if `id` is a spare, it is given up (its slot goes to the start
    /// that needs it) and this is `true`.
    pub(crate) fn give_up(self: &Arc<Self>, id: AgentId) -> bool {
        let mut state = self.lock();
        let mut found = None;
        let mut starting = false;
        for pool in state.pools.values_mut() {
            if let Some(i) = pool.ready.iter().position(|s| s.id == id) {
                found = Some(pool.ready.remove(i));
                break;
            }
            starting |= pool.starting.contains(&id);
        }
        if starting {
            state.doomed.insert(id);
        }
        drop(state);
        if let Some(spare) = found {
            tracing::info!(spare = %id, "a spare gives up its slot under max_live");
            let home = self.home.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { spare.end(&home).await });
            }
            return true;
        }
        starting
    }

    /// How many spares of `provider` are ready, and how many it wants.
    pub(crate) fn count(&self, provider: &Provider) -> WarmCount {
        let state = self.lock();
        let ready = state
            .pools
            .get(&provider.name)
            .filter(|p| p.provider.as_ref() == Some(provider))
            .map_or(0, |p| p.ready.iter().filter(|s| s.alive()).count());
        WarmCount {
            ready,
            wanted: provider.warm,
        }
    }

    /// Ends every spare and starts no more (the daemon stops).
    pub(crate) async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let spares: Vec<Spare> = {
            let mut state = self.lock();
            state
                .pools
                .values_mut()
                .flat_map(|p| std::mem::take(&mut p.ready))
                .collect()
        };
        let mut ending = tokio::task::JoinSet::new();
        for spare in spares {
            let home = self.home.clone();
            ending.spawn(async move { spare.end(&home).await });
        }
        while ending.join_next().await.is_some() {}
    }
}

/// Keeps the spares: every [`LOOK_EVERY`] ([`LOOK_IDLE`] while none is wanted), or when woken, ends the dead and outdated ones and
/// starts the missing ones. Ends with the manager.
pub(crate) fn keep(shared: Weak<Shared>, spares: Arc<Spares>) {
    tokio::spawn(async move {
        loop {
            if spares.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            let wanted = {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                look(&shared, &spares)
            };
            let every = if wanted { LOOK_EVERY } else { LOOK_IDLE };
            tokio::select! {
                () = spares.wake.notified() => {}
                () = tokio::time::sleep(every) => {}
            }
        }
    });
}

/// One look; whether any provider wants spares.
fn look(shared: &Arc<Shared>, spares: &Arc<Spares>) -> bool {
    let Ok(providers) = shared.providers.current() else {
        return true;
    };
    let wanted = providers.all().any(|p| p.warm > 0);
    let max = shared.settings().max_live;
    let now = Instant::now();
    let mut to_end = Vec::new();
    let mut to_start = Vec::new();
    {
        let mut state = spares.lock();
        for pool_name in state.pools.keys().cloned().collect::<Vec<_>>() {
            if providers.get(&pool_name).is_none_or(|p| p.warm == 0)
                && let Some(pool) = state.pools.get_mut(&pool_name)
            {
                to_end.append(&mut pool.ready);
                pool.provider = None;
            }
        }
        for provider in providers.all().filter(|p| p.warm > 0) {
            let pool = state.pools.entry(provider.name.clone()).or_default();
            if pool.provider.as_ref() != Some(provider) {
                if pool.provider.is_some() {
                    tracing::info!(provider = %provider.name, "the provider changed: its spares are replaced");
                }
                to_end.append(&mut pool.ready);
                pool.provider = Some(provider.clone());
                pool.failures = 0;
                pool.retry_at = None;
            }
            let (dead, alive): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut pool.ready)
                .into_iter()
                .partition(|s| !s.alive());
            pool.ready = alive;
            if !dead.is_empty() {
                tracing::warn!(provider = %provider.name, dead = dead.len(), "a spare process exited: it is replaced");
                pool.failures += 1;
                pool.retry_at = Some(now + backoff(pool.failures));
                to_end.extend(dead);
            }
            // Fewer spares than wanted (a lowered `warm` leaves the extra ones to be taken).
            let have = pool.ready.len() + pool.starting.len();
            let quiet = pool.taken_at.is_some_and(|at| now < at + REFILL_AFTER_TAKE);
            if pool.retry_at.is_some_and(|at| at > now) || quiet || have >= provider.warm {
                continue;
            }
            let Availability::Available { path } = providers.availability(provider) else {
                continue;
            };
            for _ in have..provider.warm {
                let id = AgentId::new();
                let Some(slot) = shared.slots.acquire_spare(id, max) else {
                    break;
                };
                pool.starting.insert(id);
                to_start.push((provider.clone(), path.clone(), id, slot));
            }
        }
    }
    for spare in to_end {
        let home = spares.home.clone();
        tokio::spawn(async move { spare.end(&home).await });
    }
    for (provider, program, id, slot) in to_start {
        let spares = spares.clone();
        tokio::spawn(async move {
            let name = provider.name.clone();
            let started = start(&spares.home, provider.clone(), program, id, slot).await;
            let unwanted = {
                let mut state = spares.lock();
                let doomed = state.doomed.remove(&id);
                let closing = spares.shutting_down.load(Ordering::SeqCst);
                let pool = state.pools.entry(name.clone()).or_default();
                pool.starting.remove(&id);
                match started {
                    Ok(spare)
                        if !doomed && !closing && pool.provider.as_ref() == Some(&provider) =>
                    {
                        tracing::info!(provider = %name, pid = spare.process.running.pid, "a spare is ready");
                        pool.failures = 0;
                        pool.ready.push(spare);
                        None
                    }
                    Ok(spare) => Some(spare),
                    Err(e) => {
                        pool.failures += 1;
                        let wait = backoff(pool.failures);
                        pool.retry_at = Some(Instant::now() + wait);
                        tracing::warn!(provider = %name, error = %e, retry_in = ?wait, "a spare did not start");
                        None
                    }
                }
            };
            if let Some(spare) = unwanted {
                spare.end(&spares.home).await;
            }
            spares.wake.notify_one();
        });
    }
    wanted
}

fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(6))
        .min(MAX_BACKOFF)
}

/// Starts one spare of `provider` and runs `initialize`.
async fn start(
    home: &Path,
    provider: Provider,
    program: PathBuf,
    id: AgentId,
    slot: SlotGuard,
) -> Result<Spare, String> {
    let cwd = home.join("warm");
    drover_core::private::create_dir_all(&cwd)
        .map_err(|e| format!("cannot make {}: {e}", cwd.display()))?;
    let spec = provider.spawn_spec(program, cwd, Some(id.to_string()));
    let mut process = process::spawn_connected(&spec)
        .await
        .map_err(|e| e.to_string())?;
    let pid = process.running.pid;
    if let Some(record) = records::RuntimeRecord::of(id, pid)
        && let Err(e) = records::write(home, &record)
    {
        tracing::warn!(spare = %id, pid, error = %e, "cannot write the spare's runtime record");
    }
    let request = process.rpc.request(
        "initialize",
        handshake::initialize_params(&handshake::runtime_capabilities()),
    );
    let answer = tokio::select! {
        answer = request => answer.map_err(|e| e.to_string()),
        _ = process.running.exited.wait_for(Option::is_some) => Err("the process exited".to_string()),
        () = tokio::time::sleep(INITIALIZE_TIMEOUT) => Err(format!("no answer to initialize within {INITIALIZE_TIMEOUT:?}")),
    };
    let spare = Spare {
        id,
        process,
        init: Value::Null,
        env: spec.env,
        provider,
        slot: Some(slot),
    };
    match answer {
        Ok(init) => Ok(Spare { init, ..spare }),
        Err(e) => {
            let stderr = spare.process.running.stderr.clone();
            spare.end(home).await;
            let tail = stderr.last_words(3).await;
            Err(if tail.is_empty() {
                e
            } else {
                format!("{e}; last stderr: {}", tail.join(" | "))
            })
        }
    }
}
