//! Boot: load every record, finish what a crash interrupted, and hand out the registry.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use jiff::Timestamp;
use tokio::sync::broadcast;

use super::archive::archived_copy;
use super::workspaces::{is_live_worktree, new_workspace};
use super::{EVENT_CAPACITY, Inner, Registry, State, write};
use crate::activity::ActivityIndex;
use crate::admission::{ActivityFamily, Family, SubagentFamily, TurnFamily};
use crate::agent::Agent;
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention, AttentionReason};
use crate::runtime::RuntimeControl;
use crate::store::{Quarantined, Store};
use crate::timeline::{ItemKind, Timeline};
use crate::view::AgentTable;
use crate::workspace::Workspace;
use crate::worktree;

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

        restore_workspaces(&store, &table, &mut ws_map, &mut report)?;
        finish_cascades(&store, &mut table, &mut report)?;
        interrupt_busy(&store, &mut table, &mut report)?;
        end_cut_turns(home, &report.interrupted);
        report.missing_worktrees = missing_worktrees(&ws_map);

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
            missing_reported: Mutex::new(report.missing_worktrees.iter().copied().collect()),
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
}

/// An agent whose workspace file was lost gets its workspace back under the same id, so its
/// activity still has a home.
fn restore_workspaces(
    store: &Store,
    table: &AgentTable,
    ws_map: &mut HashMap<WorkspaceId, Workspace>,
    report: &mut BootReport,
) -> Result<(), RegistryError> {
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
    Ok(())
}

/// Cascades a crash interrupted: the journal is written before the records, so every listed
/// agent was meant to be archived.
fn finish_cascades(
    store: &Store,
    table: &mut AgentTable,
    report: &mut BootReport,
) -> Result<(), RegistryError> {
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
    Ok(())
}

/// A crash never leaves an agent running: busy agents become `idle` with attention
/// `interrupted`.
fn interrupt_busy(
    store: &Store,
    table: &mut AgentTable,
    report: &mut BootReport,
) -> Result<(), RegistryError> {
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
    Ok(())
}

/// A turn the daemon's death cut off gets its end in the timeline (`turn_interrupted`, cause
/// `crash`), so its history does not stop at "turn started". A daemon that shut down wrote
/// that end itself (cause `shutdown`). A timeline that cannot be written is logged: the record
/// is what matters for the agent to run again.
fn end_cut_turns(home: &Path, interrupted: &[AgentId]) {
    for &agent in interrupted {
        let ended = Timeline::open(home, agent).and_then(|mut timeline| {
            if !timeline.turn_open() {
                return Ok(false);
            }
            let mut data = serde_json::Map::new();
            data.insert("event".to_string(), "turn_interrupted".into());
            data.insert("cause".to_string(), "crash".into());
            timeline.push_synced(ItemKind::TurnEnded.as_str(), data, Timestamp::now())?;
            Ok(true)
        });
        match ended {
            Ok(true) => {
                tracing::info!(%agent, "a turn the daemon's death cut off ended `interrupted`");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%agent, error = %e, "cannot end the turn a crash cut off in the timeline");
            }
        }
    }
}

/// Unarchived worktrees whose folder vanished outside drover, logged: reported once, not
/// retried.
fn missing_worktrees(ws_map: &HashMap<WorkspaceId, Workspace>) -> Vec<WorkspaceId> {
    let mut missing: Vec<WorkspaceId> = ws_map
        .values()
        .filter(|w| is_live_worktree(w) && worktree::is_missing(&w.path))
        .map(|w| w.id)
        .collect();
    missing.sort();
    for id in &missing {
        let path = ws_map.get(id).map(|w| w.path.display().to_string());
        tracing::warn!(workspace = %id, path = path.unwrap_or_default(),
            "the worktree's folder vanished outside drover; archive the workspace to prune it");
    }
    missing
}

fn pairs(changes: &[(Agent, Agent)]) -> Vec<(Option<&Agent>, &Agent)> {
    changes.iter().map(|(o, n)| (Some(o), n)).collect()
}
