//! Archive admission (seed 001): archiving never hides running work.
//!
//! Each owner of a kind of work (a *family*: `turn`, `subagent`, later `job` and `schedule`)
//! registers an [`ActivityFamily`] that answers "what still runs for this agent?" and "stop
//! it". A plain archive of an agent with running work is refused with the list; with
//! `stopActivity` the archive is written first and then every item's stop is issued, each on
//! its own, without waiting for it to settle. The registry names no family but the two it
//! registers itself. Those two answer for the target's whole subtree; since the archive
//! cascades, any other family is asked about the target and every descendant it archives.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::agent::Agent;
use crate::ids::AgentId;
use crate::lifecycle::{AgentStatus, AttentionReason};
use crate::runtime::{BoxFuture, CancelCause, RuntimeControl};
use crate::view::{AgentTable, AgentsView, descendants};

/// One piece of running work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityItem {
    /// The family's own id for the work (a job id, a schedule id, an agent id, `turn`).
    pub id: String,
    /// The agent doing the work, when it is an agent (the owner, or a descendant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// One line for people: what runs.
    pub detail: String,
}

/// What still runs for one agent, by family name. Empty means nothing runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityReport {
    pub agent_id: Option<AgentId>,
    pub families: BTreeMap<String, Vec<ActivityItem>>,
}

impl ActivityReport {
    pub fn is_empty(&self) -> bool {
        self.families.values().all(Vec::is_empty)
    }

    /// "1 turn, 2 subagents": for error messages.
    pub fn summary(&self) -> String {
        self.families
            .iter()
            .filter(|(_, items)| !items.is_empty())
            .map(|(family, items)| {
                let plural = if items.len() == 1 { "" } else { "s" };
                format!("{} {family}{plural}", items.len())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An owner of one kind of work that can run for an agent.
pub trait ActivityFamily: Send + Sync + 'static {
    /// The family's name in reports: `turn`, `subagent`, `job`, `schedule`, ...
    fn name(&self) -> &'static str;

    /// What of this family still runs for `agent`. Called with the registry's state held for
    /// reading: it must answer from `view` and its own state, never call the registry.
    fn running(&self, view: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem>;

    /// Stops one item, the same way the user's own stop does. Resolves when the stop is issued;
    /// the registry does not wait for it and never undoes the archive if it fails.
    fn stop(&self, owner: AgentId, item: ActivityItem) -> BoxFuture<'static, Result<(), String>>;
}

/// A registered family, and the agents an archive asks it about.
pub(crate) struct Family {
    pub(crate) family: Arc<dyn ActivityFamily>,
    /// The registry's own `turn` and `subagent` families answer for the target's whole subtree
    /// (a descendant's turn is the target's `subagent` item). Any other family is asked about
    /// every agent the archive would archive: the cascade hides their work as much as the
    /// target's.
    pub(crate) whole_subtree: bool,
}

/// Running items, each with the family that stops it and the agent whose work it is.
pub(crate) type Stops = Vec<(Arc<dyn ActivityFamily>, AgentId, ActivityItem)>;

/// Admission: asks every family what still runs for `agent`, and the families other than the
/// registry's own also for every unarchived descendant (the ones its archive cascades to).
/// Returns the items to stop and the report an archive refused without `stopActivity` shows.
pub(crate) fn admission(
    families: &[Family],
    view: &AgentTable,
    agent: &Agent,
) -> (Stops, ActivityReport) {
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
    } in families
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

/// The agent's own turn, including one that waits on a permission.
pub(crate) struct TurnFamily {
    pub(crate) runtimes: Arc<dyn RuntimeControl>,
}

impl ActivityFamily for TurnFamily {
    fn name(&self) -> &'static str {
        "turn"
    }

    fn running(&self, _: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        // A runtime that is still starting has no turn yet; archive closes it like any other.
        if agent.status != AgentStatus::Running {
            return Vec::new();
        }
        let waiting = agent.attention.map(|a| a.reason) == Some(AttentionReason::Permission);
        vec![ActivityItem {
            id: "turn".to_string(),
            agent_id: Some(agent.id),
            title: agent.title.clone(),
            detail: if waiting {
                "a turn is waiting on a permission".to_string()
            } else {
                "a turn is running".to_string()
            },
        }]
    }

    fn stop(&self, owner: AgentId, _: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        // The user's stop, minus keepInbox: queued messages must not wake an archived agent.
        let cancel = self.runtimes.cancel(owner, CancelCause::Archive, false);
        Box::pin(async move { cancel.await.map_err(|e| e.to_string()) })
    }
}

/// Running descendants through parent labels (children of children too).
pub(crate) struct SubagentFamily {
    pub(crate) runtimes: Arc<dyn RuntimeControl>,
}

impl ActivityFamily for SubagentFamily {
    fn name(&self) -> &'static str {
        "subagent"
    }

    fn running(&self, view: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        descendants(view, agent.id)
            .into_iter()
            .filter_map(|id| view.agent(id))
            .filter(|d| !d.is_archived() && d.status == AgentStatus::Running)
            .map(|d| ActivityItem {
                id: d.id.to_string(),
                agent_id: Some(d.id),
                title: d.title.clone(),
                detail: "subagent is running a turn".to_string(),
            })
            .collect()
    }

    fn stop(&self, _: AgentId, item: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        let Some(agent) = item.agent_id else {
            return Box::pin(
                async move { Err(format!("subagent item `{}` names no agent", item.id)) },
            );
        };
        let cancel = self.runtimes.cancel(agent, CancelCause::Parent, false);
        Box::pin(async move { cancel.await.map_err(|e| e.to_string()) })
    }
}
