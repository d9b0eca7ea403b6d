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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::activity::{ActivityBucket, ActivityChange, ActivityIndex};
use crate::admission::{ActivityFamily, ActivityItem, ActivityReport, SubagentFamily, TurnFamily};
use crate::agent::{Agent, PARENT_LABEL, ProviderConfig, ResumeHandle};
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention, AttentionReason, TurnOutcome};
use crate::runtime::RuntimeControl;
use crate::store::{Quarantined, Store};
use crate::view::{AgentTable, AgentsView, ancestors, descendants};
use crate::workspace::{Workspace, WorkspaceKind};
use crate::worktree::{
    self, CommandRun, WorktreeError, WorktreeOptions, WorktreeRemoval, WorktreeStatus,
};

/// How many events a subscriber may fall behind before it is told it lagged
/// (`broadcast::error::RecvError::Lagged`) and must re-read the state.
const EVENT_CAPACITY: usize = 4096;

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
    pub auto_archive: bool,
    pub config: ProviderConfig,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ArchiveOptions {
    /// Stop what still runs instead of refusing.
    pub stop_activity: bool,
}

/// What an archive did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveOutcome {
    /// Every agent newly archived: the target first, then its cascade. Empty if the agent was
    /// archived already.
    pub archived: Vec<AgentId>,
    /// The activity whose stops were issued (with `stopActivity`).
    pub stopped: ActivityReport,
}

/// What "archive all idle children" did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BulkArchiveOutcome {
    /// Every agent newly archived, cascades included.
    pub archived: Vec<AgentId>,
    /// Children left alone because they are busy or still have running work.
    pub skipped: Vec<SkippedChild>,
}

/// A child that "archive idle children" left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedChild {
    pub agent_id: AgentId,
    pub status: AgentStatus,
    /// What still runs for it (empty when it is only starting up).
    pub activity: ActivityReport,
}

/// What boot found and did.
#[derive(Debug, Default)]
pub struct BootReport {
    pub agents: usize,
    pub workspaces: usize,
    pub quarantined: Vec<Quarantined>,
    pub skipped_newer: Vec<PathBuf>,
    /// Agents that were `running`/`initializing` when the daemon stopped.
    pub interrupted: Vec<AgentId>,
    /// Archive cascades that a crash interrupted and boot finished.
    pub cascades_completed: usize,
    /// Workspace records that were missing and were registered again for their agents.
    pub workspaces_restored: usize,
    /// Unarchived worktree workspaces whose folder vanished outside drover (reported, not
    /// retried: archive them to prune them from git).
    pub missing_worktrees: Vec<WorkspaceId>,
}

/// A worktree made by [`Registry::create_worktree_workspace`].
#[derive(Debug, Clone)]
pub struct CreatedWorktree {
    /// The new `worktree` workspace; its `worktree` field says where it comes from.
    pub workspace: Workspace,
    /// The project file's setup commands as they ran, with their output.
    pub setup: Vec<CommandRun>,
}

/// What [`Registry::archive_workspace`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceArchiveOutcome {
    pub workspace_id: WorkspaceId,
    pub archived_at: Option<Timestamp>,
    /// The workspace was archived before this call, which therefore did nothing.
    pub already_archived: bool,
    /// Every agent newly archived: the workspace's agents and their cascades.
    pub agents: Vec<AgentId>,
    /// For a worktree drover made: what removing it did.
    pub worktree: Option<WorktreeRemoval>,
}

/// One unarchived worktree workspace as [`Registry::check_worktrees`] found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeCheck {
    pub workspace_id: WorkspaceId,
    pub path: PathBuf,
    /// The folder vanished outside drover.
    pub missing: bool,
}

/// Where drover makes worktrees, under the home: `worktrees/<project>/<name>`.
pub const WORKTREES_DIR: &str = "worktrees";

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
}

/// An activity family and the agents an archive asks it about.
struct Family {
    family: Arc<dyn ActivityFamily>,
    /// The registry's own `turn` and `subagent` families answer for the target's whole subtree
    /// (a descendant's turn is the target's `subagent` item). Any other family is asked about
    /// every agent the archive would archive: the cascade hides their work as much as the
    /// target's.
    whole_subtree: bool,
}

#[derive(Default)]
struct State {
    agents: AgentTable,
    workspaces: HashMap<WorkspaceId, Workspace>,
    activity: ActivityIndex,
    next_seq: u64,
}

/// Running items, each with the family that stops it and the agent whose work it is.
type Stops = Vec<(Arc<dyn ActivityFamily>, AgentId, ActivityItem)>;

/// What an archive under the writer lock leaves for the async part to do.
struct ArchivePlan {
    archived: Vec<AgentId>,
    stops: Stops,
    report: ActivityReport,
}

impl Registry {
    /// Loads every record under `home` (starting no runtime), finishes interrupted archive
    /// cascades, and brings busy agents back `idle` with attention `interrupted`. Blocking: call
    /// it before serving, or from a blocking thread.
    pub fn open(
        home: &Path,
        runtimes: Arc<dyn RuntimeControl>,
    ) -> Result<(Registry, BootReport), RegistryError> {
        let store = Store::open(home)?;
        let mut report = BootReport::default();

        let workspaces = store.load_workspaces()?;
        report.quarantined.extend(workspaces.quarantined);
        report.skipped_newer.extend(workspaces.skipped_newer);
        let mut ws_map: HashMap<WorkspaceId, Workspace> =
            workspaces.records.into_iter().map(|w| (w.id, w)).collect();

        let agents = store.load_agents()?;
        report.quarantined.extend(agents.quarantined);
        report.skipped_newer.extend(agents.skipped_newer);
        let mut table = AgentTable::default();
        for agent in agents.records {
            table.insert(agent);
        }

        // An agent whose workspace file was lost gets its workspace back under the same id, so
        // its activity still has a home.
        let mut missing: Vec<(WorkspaceId, PathBuf)> = table
            .values()
            .filter(|a| !ws_map.contains_key(&a.workspace_id))
            .map(|a| (a.workspace_id, a.cwd.clone()))
            .collect();
        missing.sort();
        missing.dedup_by_key(|(id, _)| *id);
        for (id, cwd) in missing {
            let ws = new_workspace(id, &cwd, None);
            store.write_workspace(&ws)?;
            tracing::warn!(workspace = %id, path = %cwd.display(), "workspace record was missing; registered it again");
            ws_map.insert(id, ws);
            report.workspaces_restored += 1;
        }

        // Cascades a crash interrupted: the journal is written before the records, so every
        // listed agent was meant to be archived.
        let journals = store.load_archive_journals()?;
        report.quarantined.extend(journals.quarantined);
        report.skipped_newer.extend(journals.skipped_newer);
        for journal in journals.records {
            let changes: Vec<(Agent, Agent)> = journal
                .agents
                .iter()
                .filter_map(|id| table.get(*id))
                .filter(|a| !a.is_archived())
                .map(|a| (a.clone(), archived_copy(a, journal.archived_at)))
                .collect();
            store.write_agents(&pairs(&changes))?;
            for (_, new) in changes {
                table.insert(new);
            }
            store.remove_archive_journal(journal.root)?;
            report.cascades_completed += 1;
        }

        // A crash never leaves an agent running.
        let now = Timestamp::now();
        let mut changes: Vec<(Agent, Agent)> = table
            .values()
            .filter(|a| a.status.is_busy())
            .map(|a| {
                let mut b = a.clone();
                b.status = AgentStatus::Idle;
                b.attention = Some(Attention {
                    reason: AttentionReason::Interrupted,
                    at: now,
                });
                b.updated_at = now;
                (a.clone(), b)
            })
            .collect();
        changes.sort_by_key(|(a, _)| a.id);
        store.write_agents(&pairs(&changes))?;
        for (_, new) in changes {
            report.interrupted.push(new.id);
            table.insert(new);
        }

        // A worktree removed outside drover is reported once, not retried.
        let mut missing_worktrees: Vec<WorkspaceId> = ws_map
            .values()
            .filter(|w| is_live_worktree(w) && worktree::is_missing(&w.path))
            .map(|w| w.id)
            .collect();
        missing_worktrees.sort();
        for id in &missing_worktrees {
            let path = ws_map.get(id).map(|w| w.path.display().to_string());
            tracing::warn!(workspace = %id, path = path.unwrap_or_default(),
                "the worktree's folder vanished outside drover; archive the workspace to prune it");
        }
        report.missing_worktrees = missing_worktrees.clone();

        report.agents = table.len();
        report.workspaces = ws_map.len();
        let activity = ActivityIndex::build(&table, table.values());
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let inner = Arc::new(Inner {
            store,
            writer: Mutex::new(()),
            state: RwLock::new(State {
                agents: table,
                workspaces: ws_map,
                activity,
                next_seq: 1,
            }),
            events,
            families: RwLock::new(Vec::new()),
            runtimes: runtimes.clone(),
            archiving: Mutex::new(HashSet::new()),
            missing_reported: Mutex::new(missing_worktrees.into_iter().collect()),
        });
        let registry = Registry { inner };
        let builtin: [Arc<dyn ActivityFamily>; 2] = [
            Arc::new(TurnFamily {
                runtimes: runtimes.clone(),
            }),
            Arc::new(SubagentFamily { runtimes }),
        ];
        write(&registry.inner.families).extend(builtin.map(|family| Family {
            family,
            whole_subtree: true,
        }));
        Ok((registry, report))
    }

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

    // ---- mutations -----------------------------------------------------------------------

    pub async fn create_agent(&self, new: NewAgent) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| inner.create_agent(new, None))
            .await
    }

    /// Creates an agent in a new git worktree of the checkout at `source` (see
    /// [`Registry::create_worktree_workspace`]), labelled [`CREATED_WORKSPACE_LABEL`] so that
    /// its `autoArchive` takes the worktree with it. `new.cwd` and `new.workspace_id` are
    /// ignored. Everything about the agent is checked before the worktree is made, and a
    /// worktree whose agent could not be recorded is removed again (folder, branch and
    /// workspace record): a failure leaves nothing behind.
    pub async fn create_agent_in_worktree(
        &self,
        new: NewAgent,
        source: PathBuf,
        options: WorktreeOptions,
    ) -> Result<(Agent, CreatedWorktree), RegistryError> {
        self.blocking(move |inner| {
            // Checked again with the record's write; checked here so that a bad request makes
            // no worktree at all.
            inner.check_new_agent(&new)?;
            let made = inner.make_worktree(&source, &options)?;
            let setup = made.setup.clone();
            let agent = inner.create_agent(new, Some(&made))?;
            let workspace = inner.workspace(agent.workspace_id)?;
            Ok((agent, CreatedWorktree { workspace, setup }))
        })
        .await
    }

    /// Registers a workspace for a directory (another one, if the directory has some already).
    pub async fn register_workspace(
        &self,
        path: PathBuf,
        kind: Option<WorkspaceKind>,
    ) -> Result<Workspace, RegistryError> {
        self.blocking(move |inner| {
            let path = existing_dir(&path)?;
            let _w = lock(&inner.writer);
            let ws = new_workspace(WorkspaceId::new(), &path, kind);
            inner.store.write_workspace(&ws)?;
            let mut state = write(&inner.state);
            state.workspaces.insert(ws.id, ws.clone());
            inner.emit(
                &mut state,
                Change::WorkspaceRegistered(Box::new(ws.clone())),
            );
            Ok(ws)
        })
        .await
    }

    /// Makes a git worktree of the checkout at `source` under
    /// `$DROVER_HOME/worktrees/<project>/<name>` on a new branch (see [`WorktreeOptions`]),
    /// copies the project file's untracked files into it, runs its setup, and registers it as
    /// a `worktree` workspace. A failing setup fails the creation with its output and leaves
    /// nothing behind: no folder, no branch, no record. Git and setup run outside the writer
    /// lock; only the record's write is serialized.
    pub async fn create_worktree_workspace(
        &self,
        source: PathBuf,
        options: WorktreeOptions,
    ) -> Result<CreatedWorktree, RegistryError> {
        self.blocking(move |inner| {
            let made = inner.make_worktree(&source, &options)?;
            let ws = worktree_workspace(&made);
            let written = {
                let _w = lock(&inner.writer);
                let written = inner.store.write_workspace(&ws);
                if written.is_ok() {
                    let mut state = write(&inner.state);
                    state.workspaces.insert(ws.id, ws.clone());
                    inner.emit(
                        &mut state,
                        Change::WorkspaceRegistered(Box::new(ws.clone())),
                    );
                }
                written
            };
            if let Err(e) = written {
                // No record, so no worktree either.
                worktree::discard(&made);
                return Err(e.into());
            }
            tracing::info!(workspace = %ws.id, path = %ws.path.display(), branch = %made.info.branch,
                "worktree created");
            Ok(CreatedWorktree {
                workspace: ws,
                setup: made.setup,
            })
        })
        .await
    }

    /// What the worktree of a workspace drover made holds that exists nowhere else:
    /// uncommitted changes, unpushed commits, or whether its folder vanished.
    pub async fn worktree_status(&self, id: WorkspaceId) -> Result<WorktreeStatus, RegistryError> {
        self.blocking(move |inner| {
            let ws = inner.workspace(id)?;
            let info = made_worktree(&ws)?;
            Ok(worktree::status(&ws.path, info)?)
        })
        .await
    }

    /// Archives a workspace: for a worktree drover made, refuses (`worktree_dirty`, naming what
    /// is uncommitted or unpushed) unless `force`, runs the project's teardown, removes the
    /// worktree (pruning it when its folder vanished) and deletes its branch only if merged.
    /// Then every unarchived agent of the workspace is archived with `stopActivity` (cascades
    /// included) and the workspace gets `archivedAt`. Records are kept, never deleted. A
    /// refusal or a failed git command changes no record.
    pub async fn archive_workspace(
        &self,
        id: WorkspaceId,
        force: bool,
    ) -> Result<WorkspaceArchiveOutcome, RegistryError> {
        let (result, plans) = self
            .blocking(move |inner| {
                let ws = inner.workspace(id)?;
                if ws.archived_at.is_some() {
                    let outcome = WorkspaceArchiveOutcome {
                        workspace_id: id,
                        archived_at: ws.archived_at,
                        already_archived: true,
                        agents: Vec::new(),
                        worktree: None,
                    };
                    return Ok((Ok(outcome), Vec::new()));
                }
                let _claim = Claim::take(&inner.archiving, id)?;
                let removal = match &ws.worktree {
                    Some(info) => Some(worktree::remove(&ws.path, info, force)?),
                    None => None,
                };
                lock(&inner.missing_reported).remove(&id);
                let _w = lock(&inner.writer);
                let mut plans = Vec::new();
                let result = inner
                    .archive_workspace_records(id, &mut plans)
                    .map(|(ws, agents)| WorkspaceArchiveOutcome {
                        workspace_id: id,
                        archived_at: ws.archived_at,
                        already_archived: false,
                        agents,
                        worktree: removal,
                    });
                Ok((result, plans))
            })
            .await?;
        // Whatever was archived before a failure still gets its stops and closes.
        for plan in plans {
            self.dispatch(plan);
        }
        result
    }

    /// Every unarchived `worktree` workspace, with whether its folder vanished outside drover.
    /// A newly vanished one is logged once; nothing is retried (archive it to prune it).
    pub async fn check_worktrees(&self) -> Result<Vec<WorktreeCheck>, RegistryError> {
        self.blocking(|inner| {
            let candidates: Vec<(WorkspaceId, PathBuf)> = {
                let state = read(&inner.state);
                let mut all: Vec<(WorkspaceId, PathBuf)> = state
                    .workspaces
                    .values()
                    .filter(|w| is_live_worktree(w))
                    .map(|w| (w.id, w.path.clone()))
                    .collect();
                all.sort();
                all
            };
            let mut reported = lock(&inner.missing_reported);
            Ok(candidates
                .into_iter()
                .map(|(id, path)| {
                    let missing = worktree::is_missing(&path);
                    if !missing {
                        reported.remove(&id);
                    } else if reported.insert(id) {
                        tracing::warn!(workspace = %id, path = %path.display(),
                            "the worktree's folder vanished outside drover; archive the workspace to prune it");
                    }
                    WorktreeCheck {
                        workspace_id: id,
                        path,
                        missing,
                    }
                })
                .collect())
        })
        .await
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
                        tracing::info!(agent = %id, workspace = %ws, "autoArchive archived the agent's worktree")
                    }
                    Err(e) => {
                        tracing::warn!(agent = %id, workspace = %ws, error = %e, "autoArchive kept the agent's worktree")
                    }
                }
            }
        }
        Ok(agent)
    }

    pub async fn set_attention(
        &self,
        id: AgentId,
        reason: AttentionReason,
    ) -> Result<Agent, RegistryError> {
        self.mutate(id, move |a| {
            a.attention = Some(Attention {
                reason,
                at: Timestamp::now(),
            });
            Ok(())
        })
        .await
    }

    pub async fn clear_attention(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.mutate(id, |a| {
            a.attention = None;
            Ok(())
        })
        .await
    }

    pub async fn set_title(
        &self,
        id: AgentId,
        title: Option<String>,
    ) -> Result<Agent, RegistryError> {
        self.mutate(id, move |a| {
            a.title = title
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty());
            Ok(())
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
        self.mutate(id, move |a| {
            a.config = config;
            Ok(())
        })
        .await
    }

    pub async fn set_resume_handle(
        &self,
        id: AgentId,
        resume: Option<ResumeHandle>,
    ) -> Result<Agent, RegistryError> {
        self.mutate(id, move |a| {
            a.resume = resume;
            Ok(())
        })
        .await
    }

    /// Removes the parent label, nothing else: the agent keeps running (or not), keeps its cwd
    /// and workspace, and from now on is a root for cascade and activity.
    pub async fn detach(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.mutate(id, |a| {
            a.labels.remove(PARENT_LABEL);
            Ok(())
        })
        .await
    }

    /// Archives an agent and, recursively, every unarchived agent whose parent label points
    /// into its subtree. Refused with the running activity unless `stop_activity`; with it the
    /// archive is written first and the stops are issued after, without waiting for them.
    pub async fn archive(
        &self,
        id: AgentId,
        options: ArchiveOptions,
    ) -> Result<ArchiveOutcome, RegistryError> {
        let plan = self
            .blocking(move |inner| {
                let _w = lock(&inner.writer);
                inner.archive(id, options.stop_activity)
            })
            .await?;
        let outcome = ArchiveOutcome {
            archived: plan.archived.clone(),
            stopped: plan.report.clone(),
        };
        self.dispatch(plan);
        Ok(outcome)
    }

    /// Brings an archived agent back to the lists. Nothing that archive stopped is restarted,
    /// and its children stay archived.
    pub async fn unarchive(&self, id: AgentId) -> Result<Agent, RegistryError> {
        self.blocking(move |inner| {
            let _w = lock(&inner.writer);
            if !inner.agent(id)?.is_archived() {
                return inner.agent(id);
            }
            // A journal left behind by a failed removal would archive the agent again at boot.
            inner.store.drop_from_archive_journals(id)?;
            inner.mutate(id, |a| {
                a.archived_at = None;
                Ok(())
            })
        })
        .await
    }

    /// Archives every unarchived direct child of `parent` that is not busy and has nothing
    /// running (each with its own cascade). Children with running work are skipped and listed.
    pub async fn archive_idle_children(
        &self,
        parent: AgentId,
    ) -> Result<BulkArchiveOutcome, RegistryError> {
        let (outcome, plans) = self
            .blocking(move |inner| {
                let _w = lock(&inner.writer);
                inner.agent(parent)?;
                let children = read(&inner.state).agents.children(parent);
                let mut outcome = BulkArchiveOutcome::default();
                let mut plans = Vec::new();
                for child in children {
                    let agent = inner.agent(child)?;
                    if agent.is_archived() {
                        continue;
                    }
                    let skip = |activity| SkippedChild {
                        agent_id: child,
                        status: agent.status,
                        activity,
                    };
                    if agent.status.is_busy() {
                        let (_, activity) = inner.admission(&read(&inner.state).agents, &agent);
                        outcome.skipped.push(skip(activity));
                        continue;
                    }
                    match inner.archive(child, false) {
                        Ok(plan) => {
                            outcome.archived.extend(&plan.archived);
                            plans.push(plan);
                        }
                        Err(RegistryError::AgentActive(report)) => {
                            outcome.skipped.push(skip(*report))
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok((outcome, plans))
            })
            .await?;
        for plan in plans {
            self.dispatch(plan);
        }
        Ok(outcome)
    }

    /// Waits for the mutation in flight, if any, then closes every runtime. Every acknowledged
    /// mutation is already on disk; after this returns nothing more is written.
    pub async fn shutdown(&self) {
        self.inner.runtimes.shutdown().await;
        let inner = self.inner.clone();
        let _ = tokio::task::spawn_blocking(move || drop(lock(&inner.writer))).await;
    }

    // ---- helpers -------------------------------------------------------------------------

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

    /// Issues the stops and runtime closes an archive planned, each in its own task: none is
    /// awaited, a failure is logged, and one failing never keeps the others from running.
    fn dispatch(&self, plan: ArchivePlan) {
        for (family, owner, item) in plan.stops {
            tokio::spawn(async move {
                let name = family.name();
                if let Err(error) = family.stop(owner, item.clone()).await {
                    tracing::warn!(agent = %owner, family = name, item = %item.id, %error,
                        "stopping activity of an archived agent failed; the archive stands");
                }
            });
        }
        for id in plan.archived {
            let close = self.inner.runtimes.close(id);
            tokio::spawn(async move {
                if let Err(error) = close.await {
                    tracing::warn!(agent = %id, %error, "closing the runtime of an archived agent failed");
                }
            });
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

    fn workspace(&self, id: WorkspaceId) -> Result<Workspace, RegistryError> {
        read(&self.state)
            .workspaces
            .get(&id)
            .cloned()
            .ok_or_else(|| RegistryError::UnknownWorkspace(id.to_string()))
    }

    /// Archives every unarchived agent of workspace `id` (with `stopActivity`, each with its
    /// cascade; the plans go to `plans` for the caller to dispatch), then the workspace
    /// itself: agents first, so a crash in between leaves a workspace that archives again
    /// cleanly. The caller holds the writer.
    fn archive_workspace_records(
        &self,
        id: WorkspaceId,
        plans: &mut Vec<ArchivePlan>,
    ) -> Result<(Workspace, Vec<AgentId>), RegistryError> {
        let mut members: Vec<AgentId> = read(&self.state)
            .agents
            .values()
            .filter(|a| a.workspace_id == id && !a.is_archived())
            .map(|a| a.id)
            .collect();
        // Oldest first: parents before the subagents they made, so one cascade covers both.
        members.sort();
        let mut archived = Vec::new();
        for agent in members {
            let plan = self.archive(agent, true)?;
            archived.extend(plan.archived.iter().copied());
            plans.push(plan);
        }
        let mut ws = self.workspace(id)?;
        let now = Timestamp::now();
        ws.archived_at = Some(now);
        ws.updated_at = now;
        self.store.write_workspace(&ws)?;
        let mut state = write(&self.state);
        state.workspaces.insert(id, ws.clone());
        self.emit(
            &mut state,
            Change::WorkspaceRegistered(Box::new(ws.clone())),
        );
        Ok((ws, archived))
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

    /// Makes a git worktree of `source` under `$DROVER_HOME/worktrees`, with its setup run.
    /// Git and setup run outside the writer lock.
    fn make_worktree(
        &self,
        source: &Path,
        options: &WorktreeOptions,
    ) -> Result<worktree::Created, RegistryError> {
        let source = existing_dir(source).map_err(|e| match e {
            RegistryError::InvalidInput { message, .. } => {
                RegistryError::invalid("source", message)
            }
            e => e,
        })?;
        let root = self.store.home().join(WORKTREES_DIR);
        // A vanished worktree's folder stays its workspace's until that is archived.
        let reserved: HashSet<PathBuf> = read(&self.state)
            .workspaces
            .values()
            .filter(|w| w.archived_at.is_none())
            .map(|w| w.path.clone())
            .collect();
        Ok(worktree::create(&root, &source, options, &reserved)?)
    }

    /// What [`Inner::create_agent`] refuses whatever the workspace: checked again under the
    /// writer lock, and before a worktree is made for the agent.
    fn check_new_agent(&self, new: &NewAgent) -> Result<(), RegistryError> {
        if new.provider.trim().is_empty() {
            return Err(RegistryError::invalid("provider", "must not be empty"));
        }
        for reserved in [PARENT_LABEL, CREATED_WORKSPACE_LABEL] {
            if new.labels.contains_key(reserved) {
                return Err(RegistryError::invalid(
                    "labels",
                    format!("`{reserved}` is set by drover, not as a label"),
                ));
            }
        }
        if let Some(parent) = new.parent
            && self.agent(parent)?.is_archived()
        {
            return Err(RegistryError::Archived { agent: parent });
        }
        Ok(())
    }

    /// Creates the agent; in the worktree `made` for it (a new workspace, removed again if the
    /// agent cannot be recorded), or else in `new.workspace_id` or its cwd's workspace.
    fn create_agent(
        &self,
        new: NewAgent,
        made: Option<&worktree::Created>,
    ) -> Result<Agent, RegistryError> {
        let cwd = match made {
            Some(made) => Ok(made.path.clone()),
            None => existing_dir(&new.cwd),
        };
        let _w = lock(&self.writer);
        let cwd = match cwd.and_then(|cwd| self.check_new_agent(&new).map(|()| cwd)) {
            Ok(cwd) => cwd,
            Err(e) => {
                if let Some(made) = made {
                    worktree::discard(made);
                }
                return Err(e);
            }
        };
        let mut labels = new.labels;
        if let Some(parent) = new.parent {
            labels.insert(PARENT_LABEL.to_string(), parent.to_string());
        }
        let (workspace, registered) = {
            let state = read(&self.state);
            match (made, new.workspace_id) {
                (Some(made), _) => {
                    let ws = worktree_workspace(made);
                    labels.insert(CREATED_WORKSPACE_LABEL.to_string(), ws.id.to_string());
                    (ws, true)
                }
                (None, Some(id)) => match state.workspaces.get(&id) {
                    Some(ws) if ws.archived_at.is_none() => (ws.clone(), false),
                    Some(_) => {
                        return Err(RegistryError::invalid(
                            "workspaceId",
                            format!("workspace `{id}` is archived"),
                        ));
                    }
                    None => return Err(RegistryError::UnknownWorkspace(id.to_string())),
                },
                (None, None) => match state
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
            unknown: serde_json::Map::new(),
        };
        let registered = registered.then_some(workspace);
        let written = match &registered {
            Some(ws) => self.store.write_workspace(ws).map_err(RegistryError::from),
            None => Ok(()),
        }
        .and_then(|()| self.commit_with(registered.clone(), vec![(None, agent.clone())]));
        if let Err(e) = written {
            if let Some(ws) = registered {
                // Keep the disk as it was: the workspace existed only for this agent.
                let _ = std::fs::remove_file(self.store.workspace_path(ws.id));
            }
            if let Some(made) = made {
                worktree::discard(made);
            }
            return Err(e);
        }
        Ok(agent)
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
            match to {
                AgentStatus::Running => {
                    // The user engaged with the agent: what it asked attention for is seen.
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
            if a.status != AgentStatus::Running {
                return Err(RegistryError::IllegalTransition {
                    agent: id,
                    from: a.status,
                    to,
                });
            }
            let now = Timestamp::now();
            a.status = to;
            a.last_activity_at = now;
            match outcome {
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

    /// Asks every family what still runs for `agent`, and the families other than the
    /// registry's own also for every unarchived descendant (the ones its archive cascades to).
    fn admission(&self, view: &AgentTable, agent: &Agent) -> (Stops, ActivityReport) {
        let families = read(&self.families);
        let cascade: Vec<&Agent> = std::iter::once(agent)
            .chain(
                descendants(view, agent.id)
                    .into_iter()
                    .filter_map(|d| view.get(d))
                    .filter(|d| !d.is_archived()),
            )
            .collect();
        let mut items = Vec::new();
        let mut report = ActivityReport {
            agent_id: Some(agent.id),
            families: BTreeMap::new(),
        };
        for Family {
            family,
            whole_subtree,
        } in families.iter()
        {
            let owners = if *whole_subtree {
                &cascade[..1]
            } else {
                &cascade[..]
            };
            for owner in owners {
                let running: Vec<ActivityItem> = family
                    .running(view, owner)
                    .into_iter()
                    .map(|mut item| {
                        // Say whose work it is when it is not the target's own.
                        if owner.id != agent.id && item.agent_id.is_none() {
                            item.agent_id = Some(owner.id);
                        }
                        item
                    })
                    .collect();
                if running.is_empty() {
                    continue;
                }
                report
                    .families
                    .entry(family.name().to_string())
                    .or_default()
                    .extend(running.iter().cloned());
                items.extend(
                    running
                        .into_iter()
                        .map(|item| (family.clone(), owner.id, item)),
                );
            }
        }
        (items, report)
    }

    /// The archive itself. The caller holds the writer.
    fn archive(&self, id: AgentId, stop_activity: bool) -> Result<ArchivePlan, RegistryError> {
        let (changes, stops, report) = {
            let state = read(&self.state);
            let agent = state
                .agents
                .get(id)
                .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()))?;
            if agent.is_archived() {
                return Ok(ArchivePlan {
                    archived: Vec::new(),
                    stops: Vec::new(),
                    report: ActivityReport::default(),
                });
            }
            let (stops, report) = self.admission(&state.agents, agent);
            if !report.is_empty() && !stop_activity {
                return Err(RegistryError::AgentActive(Box::new(report)));
            }
            let now = Timestamp::now();
            let changes: Vec<(Option<Agent>, Agent)> = std::iter::once(id)
                .chain(descendants(&state.agents, id))
                .filter_map(|a| state.agents.get(a))
                .filter(|a| !a.is_archived())
                .map(|a| (Some(a.clone()), archived_copy(a, now)))
                .collect();
            (changes, stops, report)
        };
        let archived: Vec<AgentId> = changes.iter().map(|(_, a)| a.id).collect();
        // A cascade spans files; the journal lets boot finish one a crash cut short.
        let journal = (archived.len() > 1).then(|| {
            Store::new_archive_journal(
                id,
                changes[0].1.archived_at.unwrap_or_else(Timestamp::now),
                archived.clone(),
            )
        });
        if let Some(journal) = &journal {
            self.store.write_archive_journal(journal)?;
        }
        let committed = self.commit(changes);
        if let Some(journal) = &journal
            && let Err(e) = self.store.remove_archive_journal(journal.root)
        {
            tracing::error!(error = %e, "cannot remove the archive journal; boot will replay it");
        }
        committed?;
        Ok(ArchivePlan {
            archived,
            stops: if stop_activity { stops } else { Vec::new() },
            report,
        })
    }
}

/// A copy of `agent` archived at `at`, its status normalized away from `running` and
/// `initializing`, a pending permission dropped (nobody can answer it now).
fn archived_copy(agent: &Agent, at: Timestamp) -> Agent {
    let mut a = agent.clone();
    a.archived_at = Some(at);
    a.updated_at = at;
    if a.status.is_busy() {
        a.status = AgentStatus::Idle;
    }
    if a.attention.map(|x| x.reason) == Some(AttentionReason::Permission) {
        a.attention = None;
    }
    a
}

fn turn_gate(view: &AgentTable, id: AgentId) -> Result<(), RegistryError> {
    let agent = view
        .get(id)
        .ok_or_else(|| RegistryError::UnknownAgent(id.to_string()))?;
    if agent.is_archived() {
        return Err(RegistryError::Archived { agent: id });
    }
    match ancestors(view, id)
        .into_iter()
        .find(|a| view.get(*a).is_some_and(Agent::is_archived))
    {
        Some(archived) => Err(RegistryError::TurnBlocked {
            agent: id,
            archived,
        }),
        None => Ok(()),
    }
}

/// The record of a worktree drover just made.
fn worktree_workspace(made: &worktree::Created) -> Workspace {
    let now = Timestamp::now();
    Workspace {
        id: WorkspaceId::new(),
        kind: WorkspaceKind::Worktree,
        path: made.path.clone(),
        name: made.name.clone(),
        created_at: now,
        updated_at: now,
        archived_at: None,
        worktree: Some(made.info.clone()),
        unknown: serde_json::Map::new(),
    }
}

fn new_workspace(id: WorkspaceId, path: &Path, kind: Option<WorkspaceKind>) -> Workspace {
    let now = Timestamp::now();
    Workspace {
        id,
        kind: kind.unwrap_or_else(|| WorkspaceKind::detect(path)),
        path: path.to_path_buf(),
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
        created_at: now,
        updated_at: now,
        archived_at: None,
        worktree: None,
        unknown: serde_json::Map::new(),
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

/// An unarchived workspace that is a linked git worktree.
fn is_live_worktree(ws: &Workspace) -> bool {
    ws.kind == WorkspaceKind::Worktree && ws.archived_at.is_none()
}

/// The worktree drover made for `ws`.
fn made_worktree(ws: &Workspace) -> Result<&worktree::WorktreeInfo, RegistryError> {
    ws.worktree.as_ref().ok_or_else(|| {
        RegistryError::invalid(
            "workspaceId",
            format!("workspace `{}` is not a worktree drover made", ws.id),
        )
    })
}

/// A workspace marked as being archived, unmarked when dropped.
struct Claim<'a> {
    set: &'a Mutex<HashSet<WorkspaceId>>,
    id: WorkspaceId,
}

impl<'a> Claim<'a> {
    fn take(set: &'a Mutex<HashSet<WorkspaceId>>, id: WorkspaceId) -> Result<Self, RegistryError> {
        if !lock(set).insert(id) {
            return Err(WorktreeError::Busy(id.to_string()).into());
        }
        Ok(Claim { set, id })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.id);
    }
}

fn pairs(changes: &[(Agent, Agent)]) -> Vec<(Option<&Agent>, &Agent)> {
    changes.iter().map(|(o, n)| (Some(o), n)).collect()
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
