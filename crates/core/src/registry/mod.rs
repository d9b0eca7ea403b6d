//! The registry: owns every agent's lifecycle, relationships, archive and workspace.
//!
//! Invariants (also in ARCHITECTURE.md):
//! - Every mutation is written to disk before it is applied in memory and before it is
//!   announced. A failed write changes nothing, in memory or on disk.
//! - Mutations are serialized by one writer lock, so events come out in the order the changes
//!   were made. The state lock is held only to read or to apply, never across disk I/O or an
//!   `.await`; disk I/O runs on blocking threads.
//! - After boot no agent is `running` or `initializing`: a crash left them `idle` with
//!   attention `interrupted`.
//!
//! This file holds the handle, the reads, and the record mutations with their one write path
//! (`mutate` → `commit` → `emit`); `boot.rs` opens the registry, `archive.rs` archives agents,
//! `workspaces.rs` registers and archives workspaces and the worktrees drover makes, `import.rs`
//! records agents brought in from another tool.

mod archive;
mod boot;
mod import;
mod workspaces;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use jiff::Timestamp;
use tokio::sync::broadcast;

use crate::activity::{ActivityBucket, ActivityChange, ActivityIndex};
use crate::admission::{ActivityFamily, ActivityReport, Family};
use crate::agent::{
    Agent, PARENT_LABEL, ProviderConfig, ResumeHandle, UPSTREAM_ARCHIVED_LABEL,
    UPSTREAM_BUDGET_LABEL, UPSTREAM_LABEL,
};
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention, AttentionReason, TurnOutcome};
use crate::runtime::RuntimeControl;
use crate::store::Store;
use crate::view::{AgentTable, AgentsView, ancestors, descendants};
use crate::workspace::Workspace;
use crate::worktree;

pub use archive::{ArchiveOptions, ArchiveOutcome, BulkArchiveOutcome, SkippedChild};
pub use boot::BootReport;
pub use import::{ImportWorkspace, ImportedAgent};
pub use workspaces::{CreatedWorktree, WORKTREES_DIR, WorkspaceArchiveOutcome, WorktreeCheck};

use workspaces::{new_workspace, worktree_workspace};

/// How many events a subscriber may fall behind before it is told it lagged
/// (`broadcast::error::RecvError::Lagged`) and must re-read the state.
const EVENT_CAPACITY: usize = 4096;
/// The share of a budget past which its agent gets attention `budget_warning`.
const BUDGET_WARNING: f64 = 0.8;

/// Something changed. `seq` increases by one per event, in the order of the changes.
#[derive(Debug, Clone)]
pub struct RegistryEvent {
    pub seq: u64,
    pub change: Change,
}

#[derive(Debug, Clone)]
pub enum Change {
    AgentCreated(Box<Agent>),
    /// Status, title, labels, archive, detach, attention, config: the whole new record.
    AgentUpdated(Box<Agent>),
    /// A workspace was registered, or its record changed (archived): the whole new record.
    WorkspaceRegistered(Box<Workspace>),
    WorkspaceActivity(ActivityChange),
}

/// Marks an agent created together with its workspace (a worktree made for it): its
/// autoArchive archives that workspace too.
pub const CREATED_WORKSPACE_LABEL: &str = "drover.created-workspace";

/// What a new agent is made of.
#[derive(Debug, Clone, Default)]
pub struct NewAgent {
    pub provider: String,
    /// Must be an existing directory; stored canonical.
    pub cwd: PathBuf,
    /// The workspace to join; by default the first workspace registered for `cwd`, or a new one.
    pub workspace_id: Option<WorkspaceId>,
    pub title: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Makes the new agent a subagent of this one.
    pub parent: Option<AgentId>,
    /// An agent of the hub that links to this daemon, which asked for this one (see
    /// [`crate::agent::UPSTREAM_LABEL`]); `parent` may name it, though this daemon does not
    /// hold it.
    pub upstream: Option<AgentId>,
    pub auto_archive: bool,
    pub config: ProviderConfig,
    /// A budget for it and its subtree, recorded with it.
    pub budget: Option<crate::Budget>,
    /// The budgets the hub holds it to from its creation on (see [`UPSTREAM_BUDGET_LABEL`]):
    /// only for a subagent of the hub's agent (`parent` is `upstream`).
    pub upstream_budgets: Vec<crate::Budget>,
}

/// Where a new agent's workspace comes from.
#[derive(Clone, Copy)]
enum Home<'a> {
    /// `NewAgent::workspace_id`, else the first workspace registered for its cwd, else a new
    /// one.
    Existing,
    /// A new workspace of its own for its cwd.
    NewWorkspace,
    /// The worktree just made for it.
    Worktree(&'a worktree::Created),
    /// A worktree drover made earlier, given to it as it is (`NewAgent::workspace_id`): in
    /// it as in [`Home::Existing`], labelled as in [`Home::Worktree`].
    ReusedWorktree,
}

/// A cheap, cloneable handle on the registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("home", &self.inner.store.home())
            .finish_non_exhaustive()
    }
}

struct Inner {
    store: Store,
    /// Serializes mutations; held across disk I/O, only on blocking threads.
    writer: Mutex<()>,
    state: RwLock<State>,
    events: broadcast::Sender<RegistryEvent>,
    families: RwLock<Vec<Family>>,
    runtimes: Arc<dyn RuntimeControl>,
    /// Workspaces whose archive is running git or teardown (outside the writer lock).
    archiving: Mutex<HashSet<WorkspaceId>>,
    /// Worktrees already reported missing, so each is reported once.
    missing_reported: Mutex<HashSet<WorkspaceId>>,
    /// What agents of other daemons spent below this daemon's agents, as each host last said
    /// (see [`Registry::set_remote_spend`]): host → this daemon's agent → the host's agents
    /// below it and what each spent.
    remote_spend: RwLock<BTreeMap<String, RemoteSpend>>,
}

/// A host's agents below each of this daemon's agents (the first of this daemon's on their
/// lineage), and what each spent.
pub type RemoteSpend = BTreeMap<AgentId, Vec<(AgentId, crate::Spend)>>;

#[derive(Default)]
struct State {
    agents: AgentTable,
    workspaces: HashMap<WorkspaceId, Workspace>,
    activity: ActivityIndex,
    next_seq: u64,
}

impl Registry {
    /// Adds an activity family to archive admission (jobs, schedules, ...). An archive asks it
    /// about the target and about every descendant the cascade would archive.
    pub fn register_family(&self, family: Arc<dyn ActivityFamily>) {
        write(&self.inner.families).push(Family {
            family,
            whole_subtree: false,
        });
    }

    /// Events from now on. A subscriber that falls more than `EVENT_CAPACITY` behind gets
    /// `Lagged` and must re-read the state.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.inner.events.subscribe()
    }

    pub fn home(&self) -> &Path {
        self.inner.store.home()
    }

    // ---- reads ---------------------------------------------------------------------------

    pub fn get(&self, id: AgentId) -> Option<Agent> {
        read(&self.inner.state).agents.get(id).cloned()
    }

    /// Every agent, archived ones included, oldest first.
    pub fn agents(&self) -> Vec<Agent> {
        let mut all: Vec<Agent> = read(&self.inner.state).agents.values().cloned().collect();
        all.sort_by_key(|a| a.id);
        all
    }

    /// Calls `f` with every agent, archived ones included, in no order, under the state's read
    /// lock and without copying a record: for counts taken at a moment (`/metrics`). `f` must
    /// be quick and must not call the registry.
    pub fn for_each_agent(&self, mut f: impl FnMut(&Agent)) {
        let state = read(&self.inner.state);
        for agent in state.agents.values() {
            f(agent);
        }
    }

    pub fn agent_count(&self) -> usize {
        read(&self.inner.state).agents.len()
    }

    /// The subagents track of `id`: its unarchived children, oldest first.
    pub fn subagents(&self, id: AgentId) -> Vec<Agent> {
        let state = read(&self.inner.state);
        state
            .agents
            .children(id)
            .into_iter()
            .filter_map(|c| state.agents.get(c))
            .filter(|c| !c.is_archived())
            .cloned()
            .collect()
    }

    /// The agent's parent, its parent's parent, and so on (cycle-safe).
    pub fn ancestors(&self, id: AgentId) -> Vec<AgentId> {
        ancestors(&read(&self.inner.state).agents, id)
    }

    /// Every agent below `id` (its subagents, theirs, and so on), archived ones too.
    pub fn descendants(&self, id: AgentId) -> Vec<AgentId> {
        crate::view::descendants(&read(&self.inner.state).agents, id)
    }

    pub fn workspace(&self, id: WorkspaceId) -> Option<Workspace> {
        read(&self.inner.state).workspaces.get(&id).cloned()
    }

    /// Every workspace, oldest first.
    pub fn workspaces(&self) -> Vec<Workspace> {
        let mut all: Vec<Workspace> = read(&self.inner.state)
            .workspaces
            .values()
            .cloned()
            .collect();
        all.sort_by_key(|w| w.id);
        all
    }

    pub fn workspace_activity(&self, id: WorkspaceId) -> Option<ActivityBucket> {
        read(&self.inner.state).activity.workspace(id)
    }

    /// Agent evaluations the activity index has done: what workspace activity costs.
    pub fn activity_evaluations(&self) -> u64 {
        read(&self.inner.state).activity.evaluated()
    }

    /// What still runs for an agent and for the descendants its archive would archive, by
    /// family.
    pub fn activity(&self, id: AgentId) -> Result<ActivityReport, RegistryError> {
        let state = read(&self.inner.state);
        let agent = state
            .agents
            .get(id)
            .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()))?;
        Ok(self.inner.admission(&state.agents, agent).1)
    }

    /// The gate at the single place where a turn starts: refuses an archived agent, or one
    /// whose subagent lineage reaches an archived agent.
    pub fn check_turn_gate(&self, id: AgentId) -> Result<(), RegistryError> {
        let state = read(&self.inner.state);
        turn_gate(&state.agents, id)
    }

    /// Runs `f` if `id` passes the turn gate, while no archive can be written: work started
    /// for an agent (a job) is made visible to archive admission in `f`, so an archive either
    /// finds it running or was written before, and this refuses. Blocking (it waits for an
    /// archive being written): call it off the async workers.
    pub fn while_unarchived<T>(
        &self,
        id: AgentId,
        f: impl FnOnce() -> T,
    ) -> Result<T, RegistryError> {
        let _w = lock(&self.inner.writer);
        {
            let state = read(&self.inner.state);
            turn_gate(&state.agents, id)?;
        }
        Ok(f())
    }

    // ---- mutations -----------------------------------------------------------------------

    pub async fn create_agent(&self, new: NewAgent) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| inner.create_agent(new, Home::Existing))
            .await
    }

    /// Creates an agent in `new.cwd`, registered as a workspace of its own (another one if
    /// the directory has some already; `new.workspace_id` is ignored). The workspace is
    /// written with the agent: when the agent cannot be recorded, neither is it.
    pub async fn create_agent_in_new_workspace(
        &self,
        new: NewAgent,
    ) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| inner.create_agent(new, Home::NewWorkspace))
            .await
    }

    /// Records an agent brought in from another tool's records, with a new id.
    pub async fn import_agent(&self, new: ImportedAgent) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| inner.import_agent(new)).await
    }

    /// A lifecycle transition reported by the agent's runtime. `error` is recorded with
    /// `error` status. Entering `running` passes the turn gate.
    pub async fn set_status(
        &self,
        id: AgentId,
        to: AgentStatus,
        error: Option<String>,
    ) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| {
            let _w = lock(&inner.writer);
            inner.set_status(id, to, error)
        })
        .await
    }

    /// The agent's runtime could not start: `error` status with the agent's own words, the
    /// start failure recorded (with the sign-in methods when what it needs is a sign-in, and
    /// attention `auth_required` then, `error` otherwise), in one write. A start that then
    /// succeeds (`idle`, `running`) clears it.
    pub async fn record_start_failure(
        &self,
        id: AgentId,
        error: String,
        sign_in: Option<Vec<crate::AuthMethod>>,
    ) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| {
            let _w = lock(&inner.writer);
            inner.mutate(id, |a| {
                if a.is_archived() {
                    // The archive closed the start it cut short; nothing to record.
                    return Ok(());
                }
                if a.status != AgentStatus::Error && !a.status.can_become(AgentStatus::Error) {
                    return Err(RegistryError::IllegalTransition {
                        agent: id,
                        from: a.status,
                        to: AgentStatus::Error,
                    });
                }
                let now = Timestamp::now();
                a.status = AgentStatus::Error;
                a.last_error = Some(error);
                let reason = if sign_in.is_some() {
                    AttentionReason::AuthRequired
                } else {
                    AttentionReason::Error
                };
                a.attention = Some(Attention { reason, at: now });
                a.start_failure = Some(crate::StartFailure { at: now, sign_in });
                Ok(())
            })
        })
        .await
    }

    /// A terminal turn event: moves the agent out of `running`, sets attention, and archives
    /// an `autoArchive` agent (stopping what it left running).
    pub async fn record_turn_end(
        &self,
        id: AgentId,
        outcome: TurnOutcome,
    ) -> Result<Agent, RegistryError> {
        let (agent, plan) = self
            .blocking(move |inner| {
                let _w = lock(&inner.writer);
                let agent = inner.record_turn_end(id, &outcome)?;
                if !agent.auto_archive || agent.is_archived() {
                    return Ok((agent, None));
                }
                let plan = inner.archive(id, true)?;
                let agent = inner.agent(id)?;
                Ok((agent, Some(plan)))
            })
            .await?;
        if let Some(plan) = plan {
            tracing::info!(agent = %id, archived = plan.archived.len(), "autoArchive after the first terminal turn event");
            self.dispatch(plan);
            // A worktree made for this agent goes with it (refused, and kept, if it holds
            // uncommitted or unpushed work).
            if let Some(ws) = agent
                .labels
                .get(CREATED_WORKSPACE_LABEL)
                .and_then(|w| w.parse::<WorkspaceId>().ok())
                .filter(|w| *w == agent.workspace_id)
            {
                match self.archive_workspace(ws, false).await {
                    Ok(_) => {
                        tracing::info!(agent = %id, workspace = %ws, "autoArchive archived the agent's worktree");
                    }
                    Err(e) => {
                        tracing::warn!(agent = %id, workspace = %ws, error = %e, "autoArchive kept the agent's worktree");
                    }
                }
            }
        }
        Ok(agent)
    }

    /// A turn that hit its provider's usage limit whose work went on another provider (a
    /// new agent): the agent is idle, waits for nothing (no `limited`), and its turn counts as
    /// finished. No autoArchive: that would archive the agent that took the work over.
    pub async fn record_turn_handed_off(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.end_running_turn(id, AttentionReason::Finished, |_| {})
            .await
    }

    /// A turn ended on the provider's usage limit and the agent waits for it (its runtime
    /// queued the prompt again): `idle` with attention `limited` and `limited` recorded, in one
    /// write. Not a terminal turn event: no autoArchive; the turn that follows is its end.
    pub async fn record_turn_limited(
        &self,
        id: AgentId,
        limited: crate::Limited,
    ) -> Result<Agent, RegistryError> {
        self.end_running_turn(id, AttentionReason::Limited, move |a| {
            a.last_error = Some(limited.error.clone());
            a.limited = Some(limited);
        })
        .await
    }

    /// A running turn's end that is not a terminal turn event: the agent becomes `idle` with
    /// attention `reason`, `also` changing the record in the same write. An archived agent
    /// that no longer runs is left as it is.
    async fn end_running_turn(
        &self,
        id: AgentId,
        reason: AttentionReason,
        also: impl FnOnce(&mut Agent) + Send + 'static,
    ) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| {
            let _w = lock(&inner.writer);
            inner.mutate(id, |a| {
                if !has_turn_to_end(a, AgentStatus::Idle)? {
                    return Ok(());
                }
                let now = Timestamp::now();
                a.status = AgentStatus::Idle;
                a.last_activity_at = now;
                a.attention = Some(Attention { reason, at: now });
                also(a);
                Ok(())
            })
        })
        .await
    }

    /// Adds what the agent's runtime says it spent: `tokens`, and `cost` in `currency` (a
    /// cost in another currency than the one recorded is added all the same: agents report
    /// one). Recorded for an archived agent too: it was spent.
    pub async fn add_spend(
        &self,
        id: AgentId,
        tokens: Option<u64>,
        cost: Option<(f64, String)>,
    ) -> Result<Agent, RegistryError> {
        let (cost, currency) = cost
            .filter(|(c, _)| c.is_finite() && *c >= 0.0)
            .map_or((None, None), |(c, currency)| (Some(c), Some(currency)));
        let added_cost = cost.unwrap_or(0.0);
        let added = crate::Spend {
            tokens,
            cost,
            currency,
        };
        let agent = self
            .mutate(id, move |a| {
                a.spend.add(&added);
                Ok(())
            })
            .await?;
        self.warn_budgets(id, tokens.unwrap_or(0), added_cost).await;
        Ok(agent)
    }

    /// After `id` spent `tokens` and `cost` more (or a subagent on another host below it did):
    /// each budgeted agent of its lineage whose tree this spend took past 80 % of its budget
    /// gets attention `budget_warning` (unless it needs its user for something else: a
    /// permission, an error...).
    pub async fn warn_budgets(&self, id: AgentId, tokens: u64, cost: f64) {
        let lineage = std::iter::once(id).chain(self.ancestors(id));
        for at in lineage.collect::<Vec<_>>() {
            let Some(agent) = self.get(at) else { continue };
            let Some(budget) = &agent.budget else {
                continue;
            };
            let Some(tree) = self.tree_spend(at) else {
                continue;
            };
            let share = |limit: Option<f64>, spent: Option<f64>, added: f64| {
                limit.zip(spent).is_some_and(|(limit, spent)| {
                    spent >= limit * BUDGET_WARNING && spent - added < limit * BUDGET_WARNING
                })
            };
            #[expect(clippy::cast_precision_loss)]
            let crossed = share(
                budget.tokens.map(|t| t as f64),
                tree.spend.tokens.map(|t| t as f64),
                tokens as f64,
            ) || share(budget.cost, tree.spend.cost, cost);
            let quiet = agent
                .attention
                .is_none_or(|a| a.reason == AttentionReason::Finished);
            if crossed
                && quiet
                && let Err(e) = self.set_attention(at, AttentionReason::BudgetWarning).await
            {
                tracing::warn!(agent = %at, error = %e, "could not record the budget warning");
            }
        }
    }

    /// Sets (or, with `None`, clears) the budget of `id` and its subtree.
    pub async fn set_budget(
        &self,
        id: AgentId,
        budget: Option<crate::Budget>,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| a.budget = budget).await
    }

    /// What each agent of `id`'s tree (itself first) spent, its subagents on other hosts
    /// (and theirs) after the agents here.
    pub fn spend_by_agent(&self, id: AgentId) -> Vec<(AgentId, crate::Spend)> {
        let state = read(&self.inner.state);
        let Some(root) = state.agents.get(id) else {
            return Vec::new();
        };
        let below = crate::view::descendants(&state.agents, id);
        let mut by_agent: Vec<(AgentId, crate::Spend)> = std::iter::once(root)
            .chain(below.iter().filter_map(|d| state.agents.get(*d)))
            .map(|a| (a.id, a.spend.clone()))
            .collect();
        self.each_remote_spend(std::iter::once(id).chain(below), |agent, spend| {
            by_agent.push((agent, spend.clone()));
        });
        by_agent
    }

    /// Calls `f` with each agent on another host below each of `at` (this daemon's agents)
    /// and what it spent, as its host last said.
    fn each_remote_spend(
        &self,
        at: impl IntoIterator<Item = AgentId>,
        mut f: impl FnMut(AgentId, &crate::Spend),
    ) {
        let remote = read(&self.inner.remote_spend);
        for at in at {
            for host in remote.values() {
                for (agent, spend) in host.get(&at).into_iter().flatten() {
                    f(*agent, spend);
                }
            }
        }
    }

    /// `id` and every agent below it (archived ones too), `id` first.
    pub fn tree(&self, id: AgentId) -> Vec<AgentId> {
        let state = read(&self.inner.state);
        if state.agents.get(id).is_none() {
            return Vec::new();
        }
        let mut tree = vec![id];
        tree.extend(crate::view::descendants(&state.agents, id));
        tree
    }

    /// The nearest budget on `id`'s lineage (its own, then each ancestor's) whose tree has
    /// spent it, if any: no new turn starts for `id` while there is one.
    pub fn spent_budget(&self, id: AgentId) -> Option<crate::SpentBudget> {
        self.spent_budgets(id).into_iter().next()
    }

    /// Every budget on `id`'s lineage whose tree has spent it, nearest first (see
    /// [`Registry::lineage_budgets`]).
    pub fn spent_budgets(&self, id: AgentId) -> Vec<crate::SpentBudget> {
        self.lineage_budgets(id)
            .into_iter()
            .filter(|b| crate::budget_reached(&b.budget, &b.tree.spend))
            .collect()
    }

    /// Every budget on `id`'s lineage with what its tree spent, spent or not, nearest first:
    /// each agent's own, and the ones the hub that links to this daemon holds a subagent it
    /// made here to (see [`UPSTREAM_BUDGET_LABEL`]).
    pub fn lineage_budgets(&self, id: AgentId) -> Vec<crate::SpentBudget> {
        let mut all = Vec::new();
        for at in std::iter::once(id).chain(self.ancestors(id)) {
            let Some(agent) = self.get(at) else { continue };
            let own = agent.budget.clone().map(|b| (b, false));
            let budgets: Vec<(crate::Budget, bool)> = own
                .into_iter()
                .chain(agent.upstream_budgets().into_iter().map(|b| (b, true)))
                .collect();
            if budgets.is_empty() {
                continue;
            }
            let Some(tree) = self.tree_spend(at) else {
                continue;
            };
            all.extend(
                budgets
                    .into_iter()
                    .map(|(budget, upstream)| crate::SpentBudget {
                        agent: at,
                        budget,
                        tree: tree.clone(),
                        upstream,
                    }),
            );
        }
        all
    }

    /// What `id` and every agent below it spent (`None`: no such agent), its subagents on other
    /// hosts included, as their hosts last said.
    pub fn tree_spend(&self, id: AgentId) -> Option<crate::TreeSpend> {
        let state = read(&self.inner.state);
        let root = state.agents.get(id)?;
        let mut tree = crate::TreeSpend::default();
        let below = crate::view::descendants(&state.agents, id);
        let mut count = |agent: AgentId, spend: &crate::Spend| {
            tree.agents += 1;
            if spend.is_unknown() {
                tree.unknown.push(agent);
            }
            tree.spend.add(spend);
        };
        for agent in std::iter::once(root).chain(below.iter().filter_map(|d| state.agents.get(*d)))
        {
            count(agent.id, &agent.spend);
        }
        drop(state);
        self.each_remote_spend(std::iter::once(id).chain(below), count);
        Some(tree)
    }

    /// What `host`'s agents below this daemon's agents spent now, replacing what it said
    /// before (`spends` empty: nothing, the host was removed). It counts in those agents'
    /// trees at once (`tree_spend`, `spent_budgets`: no new turn starts in a tree it spent).
    /// The agents of this daemon whose remote spend changed, and by how much in tokens and cost
    /// (negative: less, as when a host is removed): give the increases to
    /// [`Registry::warn_budgets`].
    pub fn set_remote_spend(&self, host: &str, spends: RemoteSpend) -> Vec<(AgentId, i128, f64)> {
        let sum = |list: Option<&Vec<(AgentId, crate::Spend)>>| {
            let mut total = crate::Spend::default();
            for (_, spend) in list.into_iter().flatten() {
                total.add(spend);
            }
            total
        };
        let mut remote = write(&self.inner.remote_spend);
        let before = remote.get(host);
        let changed = before
            .into_iter()
            .flat_map(BTreeMap::keys)
            .chain(spends.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|agent| before.and_then(|b| b.get(agent)) != spends.get(agent))
            .map(|agent| {
                let was = sum(before.and_then(|b| b.get(agent)));
                let now = sum(spends.get(agent));
                let tokens =
                    i128::from(now.tokens.unwrap_or(0)) - i128::from(was.tokens.unwrap_or(0));
                let cost = now.cost.unwrap_or(0.0) - was.cost.unwrap_or(0.0);
                (*agent, tokens, cost)
            })
            .collect();
        if spends.is_empty() {
            remote.remove(host);
        } else {
            remote.insert(host.to_string(), spends);
        }
        changed
    }

    /// The wait for a usage limit ends without a turn (the user's `restart_agent` sends the
    /// prompt now; an archive): `limited` and its attention go.
    pub async fn clear_limited(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.update(id, |a| {
            if a.limited.take().is_some()
                && a.attention
                    .is_some_and(|x| x.reason == AttentionReason::Limited)
            {
                a.attention = None;
            }
        })
        .await
    }

    pub async fn set_attention(
        &self,
        id: AgentId,
        reason: AttentionReason,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| {
            a.attention = Some(Attention {
                reason,
                at: Timestamp::now(),
            });
        })
        .await
    }

    pub async fn clear_attention(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.update(id, |a| a.attention = None).await
    }

    pub async fn set_title(
        &self,
        id: AgentId,
        title: Option<String>,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| {
            a.title = title
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty());
        })
        .await
    }

    /// Sets and removes labels. The parent label is not a plain label: it is set at creation
    /// and removed by [`Registry::detach`].
    pub async fn update_labels(
        &self,
        id: AgentId,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    ) -> Result<Agent, RegistryError> {
        self.mutate(id, move |a| {
            if set.contains_key(PARENT_LABEL) || remove.iter().any(|k| k == PARENT_LABEL) {
                return Err(RegistryError::invalid(
                    "labels",
                    format!("`{PARENT_LABEL}` is set by creating a subagent and removed by detach"),
                ));
            }
            for reserved in [
                UPSTREAM_LABEL,
                UPSTREAM_ARCHIVED_LABEL,
                UPSTREAM_BUDGET_LABEL,
            ] {
                if set.contains_key(reserved) || remove.iter().any(|k| k == reserved) {
                    return Err(RegistryError::invalid(
                        "labels",
                        format!("`{reserved}` is set by the hub that links to this daemon"),
                    ));
                }
            }
            for key in &remove {
                a.labels.remove(key);
            }
            a.labels.extend(set);
            Ok(())
        })
        .await
    }

    pub async fn set_config(
        &self,
        id: AgentId,
        config: ProviderConfig,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| a.config = config).await
    }

    pub async fn set_resume_handle(
        &self,
        id: AgentId,
        resume: Option<ResumeHandle>,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| a.resume = resume).await
    }

    /// Removes the parent label, nothing else: the agent keeps running (or not), keeps its cwd
    /// and workspace, and from now on is a root for cascade and activity.
    pub async fn detach(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.update(id, |a| {
            a.labels.remove(PARENT_LABEL);
            // Its parent on the hub no longer gates it, nor holds it to its budgets.
            a.labels.remove(UPSTREAM_ARCHIVED_LABEL);
            a.labels.remove(UPSTREAM_BUDGET_LABEL);
        })
        .await
    }

    /// The hub says whether the parent it holds of this subagent is archived, or has an
    /// archived ancestor (`archived`): while it is, no turn starts for the subagent or below it.
    pub async fn set_upstream_gate(
        &self,
        id: AgentId,
        archived: Option<AgentId>,
    ) -> Result<Agent, RegistryError> {
        self.update(id, move |a| match archived {
            Some(archived) => {
                a.labels
                    .insert(UPSTREAM_ARCHIVED_LABEL.to_string(), archived.to_string());
            }
            None => {
                a.labels.remove(UPSTREAM_ARCHIVED_LABEL);
            }
        })
        .await
    }

    /// The hub says what this subagent it made here may spend with its subtree under each
    /// budget of its parent's lineage there (`budgets` empty: none applies): each is a budget
    /// of its tree beside its own (see [`UPSTREAM_BUDGET_LABEL`]).
    pub async fn set_upstream_budgets(
        &self,
        id: AgentId,
        budgets: Vec<crate::Budget>,
    ) -> Result<Agent, RegistryError> {
        let value = (!budgets.is_empty())
            .then(|| upstream_budget_label(&budgets))
            .transpose()?;
        self.update(id, move |a| match value {
            Some(value) => {
                a.labels.insert(UPSTREAM_BUDGET_LABEL.to_string(), value);
            }
            None => {
                a.labels.remove(UPSTREAM_BUDGET_LABEL);
            }
        })
        .await
    }

    /// Waits for the mutation in flight, if any, then closes every runtime. Every acknowledged
    /// mutation is already on disk; after this returns nothing more is written.
    pub async fn shutdown(&self) {
        self.inner.runtimes.shutdown().await;
        let inner = self.inner.clone();
        let _ = tokio::task::spawn_blocking(move || drop(lock(&inner.writer))).await;
    }

    // ---- helpers -------------------------------------------------------------------------

    /// `mutate` with a change that cannot fail (a setter).
    async fn update(
        &self,
        id: AgentId,
        change: impl FnOnce(&mut Agent) + Send + 'static,
    ) -> Result<Agent, RegistryError> {
        self.mutate(id, move |a| {
            change(a);
            Ok(())
        })
        .await
    }

    async fn mutate(
        &self,
        id: AgentId,
        change: impl FnOnce(&mut Agent) -> Result<(), RegistryError> + Send + 'static,
    ) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| {
            let _w = lock(&inner.writer);
            inner.mutate(id, change)
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T, RegistryError> + Send + 'static,
    ) -> Result<T, RegistryError> {
        let inner = self.inner.clone();
        match tokio::task::spawn_blocking(move || work(&inner)).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(RegistryError::ShuttingDown),
        }
    }
}

impl Inner {
    fn agent(&self, id: AgentId) -> Result<Agent, RegistryError> {
        read(&self.state)
            .agents
            .get(id)
            .cloned()
            .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()))
    }

    /// Applies `change` to a copy of the agent and commits it. The caller holds the writer.
    fn mutate(
        &self,
        id: AgentId,
        change: impl FnOnce(&mut Agent) -> Result<(), RegistryError>,
    ) -> Result<Agent, RegistryError> {
        let old = self.agent(id)?;
        let mut new = old.clone();
        change(&mut new)?;
        if new == old {
            return Ok(new);
        }
        new.updated_at = Timestamp::now();
        self.commit(vec![(Some(old), new.clone())])?;
        Ok(new)
    }

    /// Writes the changed records, then applies them, updates workspace activity for what they
    /// touch, and announces it all. The caller holds the writer.
    fn commit(&self, changes: Vec<(Option<Agent>, Agent)>) -> Result<(), RegistryError> {
        self.commit_with(None, changes)
    }

    /// `commit`, first applying and announcing a workspace the caller has written already.
    fn commit_with(
        &self,
        workspace: Option<Workspace>,
        changes: Vec<(Option<Agent>, Agent)>,
    ) -> Result<(), RegistryError> {
        let refs: Vec<(Option<&Agent>, &Agent)> =
            changes.iter().map(|(o, n)| (o.as_ref(), n)).collect();
        self.store.write_agents(&refs)?;

        let mut state = write(&self.state);
        if let Some(ws) = workspace {
            state.workspaces.insert(ws.id, ws.clone());
            self.emit(&mut state, Change::WorkspaceRegistered(Box::new(ws)));
        }
        let mut touched: Vec<AgentId> = Vec::with_capacity(changes.len());
        let mut seen: HashSet<AgentId> = HashSet::new();
        let mut events = Vec::with_capacity(changes.len());
        for (old, new) in changes {
            let moves_subtree = old.as_ref().is_none_or(|o| {
                o.parent_id() != new.parent_id() || o.workspace_id != new.workspace_id
            });
            let id = new.id;
            events.push(match old {
                None => Change::AgentCreated(Box::new(new.clone())),
                Some(_) => Change::AgentUpdated(Box::new(new.clone())),
            });
            state.agents.insert(new);
            if seen.insert(id) {
                touched.push(id);
            }
            if moves_subtree {
                for d in descendants(&state.agents, id) {
                    if seen.insert(d) {
                        touched.push(d);
                    }
                }
            }
        }
        let State {
            agents, activity, ..
        } = &mut *state;
        let activity_changes = activity.update(agents, touched);
        for event in events {
            self.emit(&mut state, event);
        }
        for change in activity_changes {
            self.emit(&mut state, Change::WorkspaceActivity(change));
        }
        Ok(())
    }

    fn emit(&self, state: &mut State, change: Change) {
        let seq = state.next_seq;
        state.next_seq += 1;
        // No subscriber is fine: the state is the truth, events are a convenience.
        let _ = self.events.send(RegistryEvent { seq, change });
    }

    /// What [`Inner::create_agent`] refuses whatever the workspace: checked again under the
    /// writer lock, and before a worktree is made for the agent.
    fn check_new_agent(&self, new: &NewAgent) -> Result<(), RegistryError> {
        if new.provider.trim().is_empty() {
            return Err(RegistryError::invalid("provider", "must not be empty"));
        }
        // The hub's budgets come with the creation of its subagent (from its first turn on).
        let hubs_subagent = new.upstream.is_some() && new.parent == new.upstream;
        if !new.upstream_budgets.is_empty() && !hubs_subagent {
            return Err(RegistryError::invalid(
                "upstream.budgets",
                "only for a subagent of the hub's agent",
            ));
        }
        for reserved in [
            PARENT_LABEL,
            UPSTREAM_LABEL,
            UPSTREAM_ARCHIVED_LABEL,
            UPSTREAM_BUDGET_LABEL,
            CREATED_WORKSPACE_LABEL,
        ] {
            if new.labels.contains_key(reserved) {
                return Err(RegistryError::invalid(
                    "labels",
                    format!("`{reserved}` is set by drover, not as a label"),
                ));
            }
        }
        if let Some(parent) = new.parent
            && new.upstream != Some(parent)
            && self.agent(parent)?.is_archived()
        {
            return Err(RegistryError::Archived { agent: parent });
        }
        Ok(())
    }

    /// Creates the agent in its `home`. A workspace made for it (a new one, or the worktree
    /// made for it) is removed again if the agent cannot be recorded.
    fn create_agent(&self, new: NewAgent, home: Home<'_>) -> Result<Agent, RegistryError> {
        let made = match home {
            Home::Worktree(made) => Some(made),
            Home::Existing | Home::NewWorkspace | Home::ReusedWorktree => None,
        };
        let cwd = match made {
            Some(made) => Ok(made.path.clone()),
            None => existing_dir(&new.cwd),
        };
        let _w = lock(&self.writer);
        if matches!(home, Home::ReusedWorktree)
            && let Some(id) = new.workspace_id
        {
            self.check_worktree_free(&self.workspace(id)?)?;
        }
        let cwd = match cwd.and_then(|cwd| self.check_new_agent(&new).map(|()| cwd)) {
            Ok(cwd) => cwd,
            Err(e) => {
                if let Some(made) = made {
                    worktree::discard(made);
                }
                return Err(e);
            }
        };
        let drover = drover_labels(&new, matches!(home, Home::ReusedWorktree))?;
        let mut labels = new.labels;
        labels.extend(drover);
        let (workspace, registered) = {
            let state = read(&self.state);
            match (home, new.workspace_id) {
                (Home::NewWorkspace, _) => (new_workspace(WorkspaceId::new(), &cwd, None), true),
                (Home::Worktree(made), _) => {
                    let ws = worktree_workspace(made);
                    labels.insert(CREATED_WORKSPACE_LABEL.to_string(), ws.id.to_string());
                    (ws, true)
                }
                (Home::Existing | Home::ReusedWorktree, Some(id)) => {
                    match state.workspaces.get(&id) {
                        Some(ws) if ws.archived_at.is_none() => (ws.clone(), false),
                        Some(_) => {
                            return Err(RegistryError::invalid(
                                "workspaceId",
                                format!("workspace `{id}` is archived"),
                            ));
                        }
                        None => return Err(RegistryError::UnknownWorkspace(id.to_string())),
                    }
                }
                (Home::Existing | Home::ReusedWorktree, None) => match state
                    .workspaces
                    .values()
                    .filter(|w| w.archived_at.is_none() && w.path == cwd)
                    .min_by_key(|w| w.id)
                {
                    Some(ws) => (ws.clone(), false),
                    None => (new_workspace(WorkspaceId::new(), &cwd, None), true),
                },
            }
        };
        let now = Timestamp::now();
        let agent = Agent {
            id: AgentId::new(),
            provider: new.provider.trim().to_string(),
            cwd,
            workspace_id: workspace.id,
            created_at: now,
            updated_at: now,
            last_activity_at: now,
            title: new
                .title
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            labels,
            status: AgentStatus::Initializing,
            last_error: None,
            archived_at: None,
            attention: None,
            auto_archive: new.auto_archive,
            config: new.config,
            resume: None,
            start_failure: None,
            limited: None,
            spend: crate::Spend::default(),
            budget: new.budget,
            unknown: serde_json::Map::new(),
        };
        if let Err(e) = self.record_new_agent(registered.then_some(workspace), &agent) {
            if let Some(made) = made {
                worktree::discard(made);
            }
            return Err(e);
        }
        Ok(agent)
    }

    /// Writes a new agent, and the workspace registered for it if any (removed again when the
    /// agent cannot be written: the workspace existed only for this agent).
    fn record_new_agent(
        &self,
        registered: Option<Workspace>,
        agent: &Agent,
    ) -> Result<(), RegistryError> {
        let written = match &registered {
            Some(ws) => self.store.write_workspace(ws).map_err(RegistryError::from),
            None => Ok(()),
        }
        .and_then(|()| self.commit_with(registered.clone(), vec![(None, agent.clone())]));
        if written.is_err()
            && let Some(ws) = registered
        {
            let _ = std::fs::remove_file(self.store.workspace_path(ws.id));
        }
        written
    }

    fn set_status(
        &self,
        id: AgentId,
        to: AgentStatus,
        error: Option<String>,
    ) -> Result<Agent, RegistryError> {
        if to == AgentStatus::Running {
            turn_gate(&read(&self.state).agents, id)?;
        }
        self.mutate(id, |a| {
            let from = a.status;
            if a.is_archived() && from == AgentStatus::Closed && !to.is_busy() {
                // The runtime reports leaving a busy state the archive already moved the
                // agent out of (a start or turn it cut short): nothing is left to change.
                return Ok(());
            }
            if !from.can_become(to) {
                return Err(RegistryError::IllegalTransition {
                    agent: id,
                    from,
                    to,
                });
            }
            if to.is_busy() && a.is_archived() {
                return Err(RegistryError::Archived { agent: id });
            }
            let now = Timestamp::now();
            a.status = to;
            if matches!(to, AgentStatus::Idle | AgentStatus::Running) {
                // The runtime started: whatever kept it from starting is over.
                if a.start_failure.take().is_some()
                    && a.attention
                        .is_some_and(|x| x.reason == AttentionReason::AuthRequired)
                {
                    a.attention = None;
                }
            }
            match to {
                AgentStatus::Running => {
                    // The user engaged with the agent: what it asked attention for is seen.
                    // A usage limit it waited for is over (the turn is its retry, or newer).
                    a.limited = None;
                    a.attention = None;
                    a.last_error = None;
                    a.last_activity_at = now;
                }
                AgentStatus::Error => {
                    a.last_error = Some(error.unwrap_or_else(|| "the runtime failed".to_string()));
                    a.attention = Some(Attention {
                        reason: AttentionReason::Error,
                        at: now,
                    });
                }
                _ => {}
            }
            Ok(())
        })
    }

    fn record_turn_end(&self, id: AgentId, outcome: &TurnOutcome) -> Result<Agent, RegistryError> {
        self.mutate(id, |a| {
            let to = match outcome {
                TurnOutcome::Failed { .. } => AgentStatus::Error,
                _ => AgentStatus::Idle,
            };
            if !has_turn_to_end(a, to)? {
                return Ok(());
            }
            let now = Timestamp::now();
            a.status = to;
            a.last_activity_at = now;
            match outcome {
                // A budget warning outlasts the turn's end: it says more.
                TurnOutcome::Completed
                    if a.attention
                        .is_some_and(|x| x.reason == AttentionReason::BudgetWarning) => {}
                TurnOutcome::Completed => {
                    a.attention = Some(Attention {
                        reason: AttentionReason::Finished,
                        at: now,
                    });
                }
                TurnOutcome::Failed { error } => {
                    a.last_error = Some(error.clone());
                    a.attention = Some(Attention {
                        reason: AttentionReason::Error,
                        at: now,
                    });
                }
                // Whoever cancelled knows; a pending permission is moot now.
                TurnOutcome::Canceled => a.attention = None,
            }
            Ok(())
        })
    }
}

/// Whether `a` has a running turn for its runtime's report of the end to end (as `to`):
/// `false` when an archive ended it already (it normalized `running` away, so the report comes
/// after and changes nothing); an illegal transition when it is not running otherwise.
fn has_turn_to_end(a: &Agent, to: AgentStatus) -> Result<bool, RegistryError> {
    if a.status == AgentStatus::Running {
        Ok(true)
    } else if a.is_archived() {
        Ok(false)
    } else {
        Err(RegistryError::IllegalTransition {
            agent: a.id,
            from: a.status,
            to,
        })
    }
}

fn turn_gate(view: &AgentTable, id: AgentId) -> Result<(), RegistryError> {
    let agent = view
        .get(id)
        .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()))?;
    if agent.is_archived() {
        return Err(RegistryError::Archived { agent: id });
    }
    let lineage = std::iter::once(id).chain(ancestors(view, id));
    let archived = lineage.into_iter().find_map(|a| {
        let agent = view.get(a)?;
        if a != id && agent.is_archived() {
            return Some(a);
        }
        // The hub's archived agent above a subagent it made here.
        agent.upstream_archived()
    });
    match archived {
        Some(archived) => Err(RegistryError::TurnBlocked {
            agent: id,
            archived,
        }),
        None => Ok(()),
    }
}

fn existing_dir(path: &Path) -> Result<PathBuf, RegistryError> {
    if !path.is_absolute() {
        return Err(RegistryError::invalid(
            "cwd",
            format!("`{}` is not an absolute path", path.display()),
        ));
    }
    match std::fs::canonicalize(path) {
        Ok(p) if p.is_dir() => Ok(p),
        Ok(_) => Err(RegistryError::invalid(
            "cwd",
            format!("`{}` is not a directory", path.display()),
        )),
        Err(e) => Err(RegistryError::invalid(
            "cwd",
            format!("`{}`: {e}", path.display()),
        )),
    }
}

// Poisoning: every critical section either completes its in-memory update or does not start
// it (disk I/O happens before the state is touched), so the data behind a poisoned lock is
// consistent and we keep serving.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// The value of [`UPSTREAM_BUDGET_LABEL`] for `budgets` (a JSON list).
fn upstream_budget_label(budgets: &[crate::Budget]) -> Result<String, RegistryError> {
    serde_json::to_string(budgets).map_err(|e| RegistryError::invalid("budgets", e.to_string()))
}

/// The labels drover sets on a new agent (its parent, upstream and upstream budgets; for a
/// reused worktree, the worktree as made for it), which `check_new_agent` keeps clients from
/// setting.
fn drover_labels(
    new: &NewAgent,
    reused_worktree: bool,
) -> Result<BTreeMap<String, String>, RegistryError> {
    let mut labels = BTreeMap::new();
    if let Some(parent) = new.parent {
        labels.insert(PARENT_LABEL.to_string(), parent.to_string());
    }
    if let Some(upstream) = new.upstream {
        labels.insert(UPSTREAM_LABEL.to_string(), upstream.to_string());
    }
    if !new.upstream_budgets.is_empty() {
        labels.insert(
            UPSTREAM_BUDGET_LABEL.to_string(),
            upstream_budget_label(&new.upstream_budgets)?,
        );
    }
    if reused_worktree && let Some(id) = new.workspace_id {
        labels.insert(CREATED_WORKSPACE_LABEL.to_string(), id.to_string());
    }
    Ok(labels)
}
