//! A read-only view of the agents and their parent links, shared by the activity index and
//! the activity families.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::agent::Agent;
use crate::ids::AgentId;

/// Read access to the registry's agents while a family or the activity index looks at them.
pub trait AgentsView {
    fn agent(&self, id: AgentId) -> Option<&Agent>;
    /// Agents whose parent label names `id`, archived or not, in id (creation) order.
    fn children(&self, id: AgentId) -> Vec<AgentId>;
}

/// Every agent below `id` through parent labels, nearest first, `id` itself excluded. Damaged
/// data can hold cycles; each agent is visited once, so the walk always ends.
pub fn descendants(view: &dyn AgentsView, id: AgentId) -> Vec<AgentId> {
    let mut seen = HashSet::from([id]);
    let mut out = Vec::new();
    let mut next = 0;
    let mut frontier = view.children(id);
    loop {
        for child in frontier {
            if seen.insert(child) {
                out.push(child);
            }
        }
        let Some(&current) = out.get(next) else {
            return out;
        };
        next += 1;
        frontier = view.children(current);
    }
}

/// The agents above `id`, nearest first, stopping at a missing parent or a cycle.
pub fn ancestors(view: &dyn AgentsView, id: AgentId) -> Vec<AgentId> {
    let mut seen = HashSet::from([id]);
    let mut out = Vec::new();
    let mut current = view.agent(id).and_then(Agent::parent_id);
    while let Some(parent) = current {
        if !seen.insert(parent) || view.agent(parent).is_none() {
            break;
        }
        out.push(parent);
        current = view.agent(parent).and_then(Agent::parent_id);
    }
    out
}

/// The agents in memory with a children index kept in step with their parent labels.
#[derive(Debug, Default)]
pub(crate) struct AgentTable {
    map: HashMap<AgentId, Agent>,
    children: HashMap<AgentId, BTreeSet<AgentId>>,
}

impl AgentTable {
    pub(crate) fn insert(&mut self, agent: Agent) -> Option<Agent> {
        let id = agent.id;
        let new_parent = agent.parent_id();
        let old = self.map.insert(id, agent);
        let old_parent = old.as_ref().and_then(Agent::parent_id);
        if old_parent != new_parent {
            if let Some(p) = old_parent
                && let Some(set) = self.children.get_mut(&p)
            {
                set.remove(&id);
                if set.is_empty() {
                    self.children.remove(&p);
                }
            }
            if let Some(p) = new_parent {
                self.children.entry(p).or_default().insert(id);
            }
        }
        old
    }

    pub(crate) fn get(&self, id: AgentId) -> Option<&Agent> {
        self.map.get(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Agent> {
        self.map.values()
    }
}

impl AgentsView for AgentTable {
    fn agent(&self, id: AgentId) -> Option<&Agent> {
        self.map.get(&id)
    }

    fn children(&self, id: AgentId) -> Vec<AgentId> {
        self.children
            .get(&id)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }
}
