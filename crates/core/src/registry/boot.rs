//! Boot: load every record, finish what a crash interrupted, and hand out the registry.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use jiff::Timestamp;
use tokio::sync::broadcast;

use super::archive::archived_copy;
use super::workspaces::{is_live_worktree, new_workspace};
use super::{EVENT_CAPACITY, Inner, Registry, State, write};
use crate::OnInterrupt;
use crate::activity::ActivityIndex;
use crate::admission::{ActivityFamily, Family, SubagentFamily, TurnFamily};
use crate::agent::Agent;
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::inbox::{Delivery, Inbox, InboxMessage};
use crate::lifecycle::{AgentStatus, Attention, AttentionReason};
use crate::runtime::RuntimeControl;
use crate::store::{Quarantined, Store, StoreError};
use crate::timeline::Timeline;
use crate::view::AgentTable;
use crate::workspace::Workspace;
use crate::worktree;
use drover_protocol::{InterruptCause, ItemKind, TurnEnd};

/// What boot found and did.
#[derive(Debug, Default)]
pub struct BootReport {
    pub agents: usize,
    pub workspaces: usize,
    pub quarantined: Vec<Quarantined>,
    pub skipped_newer: Vec<PathBuf>,
    /// Agents that were `running`/`initializing` when the daemon stopped.
    pub interrupted: Vec<AgentId>,
    /// Interrupted agents whose policy is `continue` and that have a followup queued saying
    /// so (see `continue_cut_turn`).
    pub continued: Vec<AgentId>,
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
    /// it before serving, or from a blocking thread. Every cut turn is left to its agent's
    /// user (`notify`): see [`Registry::open_with`].
    pub fn open(
        home: &Path,
        runtimes: Arc<dyn RuntimeControl>,
    ) -> Result<(Registry, BootReport), RegistryError> {
        Self::open_with(home, runtimes, &|_| OnInterrupt::Notify)
    }

    /// [`Registry::open`], where `on_interrupt` says what each agent whose turn was cut off
    /// gets: with `continue`, a followup in its inbox (queued before its record leaves
    /// `running`, so a crash during boot neither loses nor doubles it).
    pub fn open_with(
        home: &Path,
        runtimes: Arc<dyn RuntimeControl>,
        on_interrupt: &dyn Fn(&Agent) -> OnInterrupt,
    ) -> Result<(Registry, BootReport), RegistryError> {
        let store = Store::open(home)?;
        store.remove_home_leftovers();
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
        // The timeline and the inbox first, the records last: a crash in between finds the
        // agents still busy and settles them again, and both steps are idempotent.
        report.continued = settle_cut_turns(home, &table, on_interrupt);
        interrupt_busy(&store, &mut table, &mut report)?;
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
            remote_spend: RwLock::default(),
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

/// Every busy agent's cut turn: its end in the timeline (`turn_interrupted`, cause `crash`,
/// unless a daemon that shut down wrote it with cause `shutdown`), so its history does not
/// stop at "turn started"; then, for an agent whose policy is `continue`, the followup that
/// asks it to continue. Returns the agents that have one. A timeline or inbox that cannot be
/// written is logged: the record is what matters for the agent to run again.
fn settle_cut_turns(
    home: &Path,
    table: &AgentTable,
    on_interrupt: &dyn Fn(&Agent) -> OnInterrupt,
) -> Vec<AgentId> {
    let mut busy: Vec<&Agent> = table.values().filter(|a| a.status.is_busy()).collect();
    busy.sort_by_key(|a| a.id);
    let mut continued = Vec::new();
    for agent in busy {
        let id = agent.id;
        let settled = Timeline::open(home, id).and_then(|mut timeline| {
            if cut_open(&timeline) {
                let mut data = serde_json::Map::new();
                data.insert("event".to_string(), TurnEnd::Interrupted.as_str().into());
                data.insert("cause".to_string(), InterruptCause::Crash.as_str().into());
                timeline.push_synced(ItemKind::TurnEnded.as_str(), data, Timestamp::now())?;
                tracing::info!(agent = %id, "a turn the daemon's death cut off ended `interrupted`");
            }
            if on_interrupt(agent) != OnInterrupt::Continue
                || super::turn_gate(table, id).is_err()
            {
                return Ok(false);
            }
            continue_cut_turn(home, id, &timeline)
        });
        match settled {
            Ok(true) => continued.push(id),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(agent = %id, error = %e, "cannot settle the turn a restart cut off");
            }
        }
    }
    continued
}

/// A turn is recorded by its message (`user_message`, fsynced: the message is delivered),
/// then `turn_started`, ..., `turn_ended`.
fn turn_item(item: &crate::timeline::TimelineItem) -> bool {
    item.is(ItemKind::UserMessage) || item.is(ItemKind::TurnStarted) || item.is(ItemKind::TurnEnded)
}

/// Whether the last turn of a busy agent has no end: it started, or its message was recorded
/// and the daemon died before its `turn_started`.
fn cut_open(timeline: &Timeline) -> bool {
    timeline
        .items()
        .iter()
        .rev()
        .find(|i| turn_item(i))
        .is_some_and(|i| !i.is(ItemKind::TurnEnded))
}

/// The id prefix of the followup that continues a cut turn: its id is this and the id of the
/// message the cut turn started with, so it is queued once whatever the number of boots.
const CONTINUE_PREFIX: &str = "continue-";

/// The turn a restart cut off, as the timeline tells it.
struct CutTurn {
    /// The id of the message it started with.
    message_id: String,
    /// Who asked to hear how it goes.
    notify: Option<AgentId>,
    /// `crash` or `shutdown`.
    cause: String,
    at: Timestamp,
}

impl CutTurn {
    /// The agent's last turn, if it ended `turn_interrupted`.
    fn find(timeline: &Timeline) -> Option<CutTurn> {
        let items = timeline.items();
        let end = items.iter().rposition(turn_item)?;
        let ended = &items[end];
        let text = |item: &crate::timeline::TimelineItem, key: &str| {
            item.data
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        if !ended.is(ItemKind::TurnEnded)
            || text(ended, "event").as_deref() != Some(TurnEnd::Interrupted.as_str())
        {
            return None;
        }
        // Its `turn_started`, or its message when the daemon died before that was written.
        let started = items[..end]
            .iter()
            .rev()
            .find(|i| turn_item(i))
            .filter(|i| !i.is(ItemKind::TurnEnded))?;
        let message_id = text(started, "messageId")?;
        let notify = items[..end]
            .iter()
            .rev()
            .find(|i| {
                i.is(ItemKind::UserMessage)
                    && text(i, "messageId").as_deref() == Some(message_id.as_str())
            })
            .and_then(|i| text(i, "notify"))
            .and_then(|n| n.parse().ok());
        Some(CutTurn {
            message_id,
            notify,
            cause: text(ended, "cause").unwrap_or_else(|| "crash".to_string()),
            at: ended.at,
        })
    }

    /// What the agent reads.
    fn notice(&self) -> String {
        let what = match self.cause.as_str() {
            "shutdown" => "drover (the program that runs you) was shut down and restarted",
            _ => "drover (the program that runs you) stopped unexpectedly and was restarted",
        };
        format!(
            "[drover] Your previous turn was interrupted at {at} before you finished it: {what}. \
             Continue that work where you left off. First check what is already done (files, \
             commands, anything you started), so that nothing is done twice.",
            at = self.at.round(jiff::Unit::Second).unwrap_or(self.at),
        )
    }
}

/// Queues the followup that asks agent `id` to continue its cut turn, once: not when the cut
/// turn was itself such a continuation (a second crash is left to the user, so a turn that
/// brings the daemon down cannot loop), and not when it is already queued or delivered. It
/// carries the cut turn's `notifyOnFinish`: whoever asked hears once, when the continued turn
/// ends. Returns whether the agent has it.
fn continue_cut_turn(home: &Path, id: AgentId, timeline: &Timeline) -> Result<bool, StoreError> {
    let Some(cut) = CutTurn::find(timeline) else {
        return Ok(false);
    };
    if cut.message_id.starts_with(CONTINUE_PREFIX) {
        tracing::info!(agent = %id, "a continued turn was cut off again: left to the user");
        return Ok(false);
    }
    let message_id = format!("{CONTINUE_PREFIX}{}", cut.message_id);
    let delivered = timeline.delivered();
    if delivered.contains(&message_id) {
        return Ok(false);
    }
    if Inbox::read_queued_ids(home, id)?.contains(&message_id) {
        return Ok(true);
    }
    let mut inbox = Inbox::open_with(home, id, || delivered)?;
    let mut message =
        InboxMessage::new(Delivery::Followup, cut.notice(), "system").notifying(cut.notify);
    message.id = message_id;
    inbox.queue(message)?;
    tracing::info!(agent = %id, "the turn a restart cut off continues (on_interrupt = continue)");
    Ok(true)
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
