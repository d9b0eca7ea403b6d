//! Archive: the soft delete, its cascade through parent labels, and the stops it issues.

use jiff::Timestamp;
use serde::Serialize;

use super::{Inner, Registry, lock, read};
use crate::admission::{self, ActivityReport, Stops};
use crate::agent::Agent;
use crate::error::RegistryError;
use crate::ids::AgentId;
use crate::lifecycle::{AgentStatus, AttentionReason};
use crate::runtime::CancelCause;
use crate::store::Store;
use crate::view::{AgentTable, AgentsView, descendants};

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

/// What an archive under the writer lock leaves for the async part to do.
pub(super) struct ArchivePlan {
    pub(super) archived: Vec<AgentId>,
    stops: Stops,
    report: ActivityReport,
}

impl Registry {
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
        if self.get(id).is_some_and(|a| a.is_archived()) {
            // Archive wins: what it discards (the runtime's queued messages) must be gone before
            // the agent can take a turn again, even if the close the archive issued has not
            // run yet. Closing an archived agent's runtime twice is harmless.
            if let Err(error) = self.inner.runtimes.close(id, CancelCause::Archive).await {
                tracing::warn!(agent = %id, %error, "closing the runtime of an archived agent failed");
            }
        }
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
                            outcome.skipped.push(skip(*report));
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

    /// Issues the stops and runtime closes an archive planned, each in its own task: none is
    /// awaited, a failure is logged, and one failing never keeps the others from running.
    pub(super) fn dispatch(&self, plan: ArchivePlan) {
        for (family, owner, item) in plan.stops {
            tokio::spawn(async move {
                let name = family.name();
                if let Err(error) = family.stop(owner, item.clone()).await {
                    tracing::warn!(agent = %owner, family = name, item = %item.id, %error,
                        "stopping activity of an archived agent failed; the archive stands");
                }
            });
        }
        // The target's own turn is cut off by its archive, its descendants' by their parent's.
        for (i, id) in plan.archived.into_iter().enumerate() {
            let cause = if i == 0 {
                CancelCause::Archive
            } else {
                CancelCause::Parent
            };
            let close = self.inner.runtimes.close(id, cause);
            tokio::spawn(async move {
                if let Err(error) = close.await {
                    tracing::warn!(agent = %id, %error, "closing the runtime of an archived agent failed");
                }
            });
        }
    }
}

impl Inner {
    /// What still runs for `agent` and the descendants its archive would archive (see
    /// [`admission::admission`]).
    pub(super) fn admission(&self, view: &AgentTable, agent: &Agent) -> (Stops, ActivityReport) {
        admission::admission(&read(&self.families), view, agent)
    }

    /// The archive itself. The caller holds the writer.
    pub(super) fn archive(
        &self,
        id: AgentId,
        stop_activity: bool,
    ) -> Result<ArchivePlan, RegistryError> {
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

/// A copy of `agent` archived at `at`: `closed`, since the archive closes its runtime for
/// good (it stays `closed` after an unarchive until a start initializes it again), and a
/// pending permission dropped (nobody can answer it now).
pub(super) fn archived_copy(agent: &Agent, at: Timestamp) -> Agent {
    let mut a = agent.clone();
    a.archived_at = Some(at);
    a.updated_at = at;
    a.status = AgentStatus::Closed;
    if matches!(
        a.attention.map(|x| x.reason),
        Some(AttentionReason::Permission | AttentionReason::Limited)
    ) {
        a.attention = None;
    }
    // Its inbox, the prompt it waited to send again included, is discarded.
    a.limited = None;
    a
}
