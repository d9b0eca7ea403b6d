//! Workspace activity: one aggregate bucket per workspace id, kept up to date incrementally.
//!
//! The rule is seed 000's. A workspace's activity reflects only agents whose `workspaceId` is
//! that workspace (never by cwd). A root agent contributes the bucket of its own state to its
//! own workspace. A running subagent contributes `running` to the workspace of its root parent
//! (the top of its parent chain), not to its own cwd or workspace. A subagent's attention,
//! permission or error does not escalate any workspace. Archived agents contribute nothing.
//! A subagent another daemon (a hub) made here for one of its agents contributes to no
//! workspace here: its root parent's workspace is the hub's, which counts it.
//!
//! Buckets, most urgent first (the aggregate is the most urgent bucket present):
//! `permission` > `error` > `running` > `attention` > `idle`. A workspace with no contributing
//! agent has no activity (`None`).
//!
//! Each agent's contribution is cached, so a change re-evaluates only the agents it touches
//! (the agent itself, and its subtree when its parent link or workspace changed) and the
//! workspaces those contributions move between; the rest of the fleet is not looked at.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::agent::Agent;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, AttentionReason};
use crate::view::{AgentsView, ancestors};

/// What a workspace shows. Ordered from least to most urgent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivityBucket {
    /// Agents are there, none working or asking for anything.
    Idle,
    /// A root agent finished (or was interrupted) and nobody has looked yet.
    Attention,
    /// A root agent is starting or running a turn, or a subagent of one is.
    Running,
    /// A root agent failed.
    Error,
    /// A root agent waits on a permission answer.
    Permission,
}

const BUCKETS: usize = 5;

/// A workspace's activity as the protocol names it.
impl From<ActivityBucket> for drover_protocol::WorkspaceActivity {
    fn from(bucket: ActivityBucket) -> Self {
        use drover_protocol::WorkspaceActivity as W;
        match bucket {
            ActivityBucket::Idle => W::Idle,
            ActivityBucket::Attention => W::Attention,
            ActivityBucket::Running => W::Running,
            ActivityBucket::Error => W::Error,
            ActivityBucket::Permission => W::Permission,
        }
    }
}

impl ActivityBucket {
    fn index(self) -> usize {
        self as usize
    }

    const ALL: [ActivityBucket; BUCKETS] = [
        ActivityBucket::Idle,
        ActivityBucket::Attention,
        ActivityBucket::Running,
        ActivityBucket::Error,
        ActivityBucket::Permission,
    ];

    /// The bucket of a root agent's own state.
    pub fn of_root(agent: &Agent) -> ActivityBucket {
        let reason = agent.attention.map(|a| a.reason);
        if reason == Some(AttentionReason::Permission) {
            ActivityBucket::Permission
        } else if agent.status == AgentStatus::Error || reason == Some(AttentionReason::Error) {
            ActivityBucket::Error
        } else if agent.status.is_busy() {
            ActivityBucket::Running
        } else if reason.is_some() {
            ActivityBucket::Attention
        } else {
            ActivityBucket::Idle
        }
    }
}

/// What one agent adds to one workspace, if anything.
pub fn contribution(view: &dyn AgentsView, agent: &Agent) -> Option<(WorkspaceId, ActivityBucket)> {
    if agent.is_archived() {
        return None;
    }
    let root = ancestors(view, agent.id).last().copied();
    let top = root.and_then(|r| view.agent(r)).unwrap_or(agent);
    // A subagent a hub made here for one of its agents, and the subagents below it: their
    // activity is their root parent's workspace's, on the hub (which counts it), not this
    // daemon's.
    if top.parent_id().is_some() && top.parent_id() == top.upstream_id() {
        return None;
    }
    match root.and_then(|r| view.agent(r)) {
        // No parent that exists: a root (a dangling parent label makes a root too).
        None => Some((agent.workspace_id, ActivityBucket::of_root(agent))),
        Some(root) if agent.status.is_busy() => Some((root.workspace_id, ActivityBucket::Running)),
        Some(_) => None,
    }
}

/// A workspace whose aggregate changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityChange {
    pub workspace_id: WorkspaceId,
    pub activity: Option<ActivityBucket>,
}

/// Cached contributions and per-workspace bucket counts.
#[derive(Debug, Default)]
pub struct ActivityIndex {
    contributions: HashMap<AgentId, (WorkspaceId, ActivityBucket)>,
    counts: HashMap<WorkspaceId, [u32; BUCKETS]>,
    evaluated: u64,
}

impl ActivityIndex {
    /// Builds the index over every agent of `view`.
    pub fn build<'a>(view: &dyn AgentsView, agents: impl IntoIterator<Item = &'a Agent>) -> Self {
        let mut index = ActivityIndex::default();
        let ids: Vec<AgentId> = agents.into_iter().map(|a| a.id).collect();
        index.update(view, ids);
        index
    }

    /// The aggregate of one workspace.
    pub fn workspace(&self, id: WorkspaceId) -> Option<ActivityBucket> {
        let counts = self.counts.get(&id)?;
        ActivityBucket::ALL
            .iter()
            .rev()
            .find(|b| counts[b.index()] > 0)
            .copied()
    }

    /// Every workspace with some activity.
    pub fn all(&self) -> impl Iterator<Item = (WorkspaceId, ActivityBucket)> + '_ {
        self.counts
            .keys()
            .filter_map(|ws| self.workspace(*ws).map(|b| (*ws, b)))
    }

    /// How many agent evaluations the index has done since it was made: what a change costs.
    pub fn evaluated(&self) -> u64 {
        self.evaluated
    }

    /// Re-evaluates the given agents (as they are now in `view`; an id no longer there is
    /// removed) and returns the workspaces whose aggregate changed.
    pub fn update(
        &mut self,
        view: &dyn AgentsView,
        agents: impl IntoIterator<Item = AgentId>,
    ) -> Vec<ActivityChange> {
        let mut before: Vec<(WorkspaceId, Option<ActivityBucket>)> = Vec::new();
        for id in agents {
            self.evaluated += 1;
            let new = view.agent(id).and_then(|a| contribution(view, a));
            let old = self.contributions.get(&id).copied();
            if old == new {
                continue;
            }
            for (ws, _) in old.iter().chain(new.iter()) {
                if !before.iter().any(|(w, _)| w == ws) {
                    before.push((*ws, self.workspace(*ws)));
                }
            }
            if let Some((ws, bucket)) = old {
                if let Some(counts) = self.counts.get_mut(&ws) {
                    counts[bucket.index()] -= 1;
                    if counts.iter().all(|c| *c == 0) {
                        self.counts.remove(&ws);
                    }
                }
                self.contributions.remove(&id);
            }
            if let Some((ws, bucket)) = new {
                self.counts.entry(ws).or_default()[bucket.index()] += 1;
                self.contributions.insert(id, (ws, bucket));
            }
        }
        before
            .into_iter()
            .filter_map(|(ws, old)| {
                let now = self.workspace(ws);
                (now != old).then_some(ActivityChange {
                    workspace_id: ws,
                    activity: now,
                })
            })
            .collect()
    }
}
