//! The agent record as the registry holds it (the domain type; its file form is in `store`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::Timestamp;

use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention};

/// The label that makes an agent a subagent of another: its value is the parent's id.
pub const PARENT_LABEL: &str = "drover.parent-agent-id";

/// The label naming the agent of another daemon (the hub that links to this one) that created
/// this agent there: what this agent tells it waits in the outbox until the hub takes it (see
/// [`crate::outbox`]). With the parent label naming the same agent, this is its subagent.
pub const UPSTREAM_LABEL: &str = "drover.upstream-agent-id";

/// The label the hub sets on a subagent whose parent there is archived, or has an archived
/// ancestor (that agent's id): the archived-lineage gate across hosts, holding for it and its
/// subtree on this daemon.
pub const UPSTREAM_ARCHIVED_LABEL: &str = "drover.upstream-archived";

/// The label the hub sets on a subagent it made here when budgets of its parent's lineage
/// there apply: a JSON list of budgets, each what this subagent's subtree here may spend in all
/// under one of them (see [`upstream_allowance`]). Each is a budget of this subagent's tree as
/// one set on it here is, beside it: the tightest holds, and while the hub is out of reach it
/// still does.
pub const UPSTREAM_BUDGET_LABEL: &str = "drover.upstream-budget";

/// What the provider is asked to run with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderConfig {
    pub model: Option<String>,
    pub mode: Option<String>,
    /// Reasoning effort: the value of the agent's config option of category `thought_level`.
    pub effort: Option<String>,
    /// The agent's other config options set by a user, by the agent's own option id.
    pub options: BTreeMap<String, String>,
    pub permission_policy: PermissionPolicy,
    /// What happens to a turn a daemon restart cuts off (`None`: the provider's policy).
    pub on_interrupt: Option<OnInterrupt>,
    /// What happens when a turn hits the provider's usage limit (`None`: the provider's).
    pub on_limit: Option<OnLimit>,
}

/// What drover does on a usage limit: the protocol's enum, stored as is.
pub use drover_protocol::OnLimit;

/// The agent waits for its provider's usage limit to reset: its failed prompt is queued again
/// and is sent at `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// When the turn hit the limit.
    pub at: Timestamp,
    /// When the provider said it resets, if it said.
    pub reset_at: Option<Timestamp>,
    /// When the prompt is sent again.
    pub retry_at: Timestamp,
    /// The limits hit in a row (the backoff grows with it when no reset time is given).
    pub count: u32,
    /// What the agent said.
    pub error: String,
}

/// What drover does with a cut turn: the protocol's enum, stored as is.
pub use drover_protocol::OnInterrupt;

/// How the agent's permission requests are answered: the protocol's enum, stored as is.
pub use drover_protocol::PermissionPolicy;

/// What a provider needs to resume its own session for this agent (ACP `session/load`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeHandle {
    pub acp_session_id: String,
}

/// A budget for an agent and its subtree: the protocol's type, stored as is.
pub use drover_protocol::Budget;

/// A sign-in method as the agent offered it: the protocol's type, stored as is.
pub use drover_protocol::AuthMethod;

/// The agent's last start failed, and when: it is not started again on its own (beyond the
/// runtime's few backed-off retries) until a user asks (a retry, or a sign-in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    pub at: Timestamp,
    /// What the agent needs is a sign-in: the methods it offered.
    pub sign_in: Option<Vec<AuthMethod>>,
}

/// What an agent spent, as its agent reported it: tokens from the usage its prompt answers
/// carry, cost from its `usage_update`s. `None`: the agent reported none (unknown, never zero).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spend {
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    /// The currency of `cost`, as reported (`USD`).
    pub currency: Option<String>,
}

impl Spend {
    /// Nothing reported.
    pub fn is_unknown(&self) -> bool {
        self.tokens.is_none() && self.cost.is_none()
    }

    /// Adds what `other` reported (what it did not report adds nothing; the first currency
    /// named is kept).
    pub fn add(&mut self, other: &Spend) {
        if let Some(tokens) = other.tokens {
            self.tokens = Some(self.tokens.unwrap_or(0).saturating_add(tokens));
        }
        if let Some(cost) = other.cost {
            self.cost = Some(self.cost.unwrap_or(0.0) + cost);
            if self.currency.is_none() {
                self.currency.clone_from(&other.currency);
            }
        }
    }
}

/// Whether `spend` reached either limit of `budget` (an unknown spend reaches nothing).
pub fn budget_reached(budget: &Budget, spend: &Spend) -> bool {
    let by_tokens = budget
        .tokens
        .zip(spend.tokens)
        .is_some_and(|(limit, spent)| spent >= limit);
    let by_cost = budget
        .cost
        .zip(spend.cost)
        .is_some_and(|(limit, spent)| spent >= limit);
    by_tokens || by_cost
}

/// What a subagent on another daemon may spend with its own subtree there under `budget`, a
/// budget of this daemon's agent whose tree spent `tree` in all (`subtree`, what that subagent's
/// subtree spent, included): what it spent plus what the tree has left (nothing once the tree
/// is past its budget). Its daemon holds it to that even when it cannot hear this one: it can
/// spend the tree's remainder, not more, while this daemon does not know what it spends.
pub fn upstream_allowance(budget: &Budget, tree: &Spend, subtree: &Spend) -> Budget {
    Budget {
        tokens: budget.tokens.map(|limit| {
            let left = limit.saturating_sub(tree.tokens.unwrap_or(0));
            subtree.tokens.unwrap_or(0).saturating_add(left)
        }),
        cost: budget.cost.map(|limit| {
            let left = (limit - tree.cost.unwrap_or(0.0)).max(0.0);
            subtree.cost.unwrap_or(0.0) + left
        }),
        hard: budget.hard,
    }
}

/// A budget on an agent's lineage and what its tree spent (in `spent_budgets`: spent).
#[derive(Debug, Clone, PartialEq)]
pub struct SpentBudget {
    /// The agent the budget is set on.
    pub agent: AgentId,
    pub budget: Budget,
    /// What its tree spent.
    pub tree: TreeSpend,
    /// The budget is one the hub that links to this daemon holds `agent` (its subagent) to
    /// (see [`UPSTREAM_BUDGET_LABEL`]), not one set here.
    pub upstream: bool,
}

/// The spend of an agent and its whole subtree (archived subagents included).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeSpend {
    /// The sum of what was reported (`None`: no agent of the tree reported any).
    pub spend: Spend,
    /// How many agents the tree holds.
    pub agents: usize,
    /// The agents of the tree that reported nothing.
    pub unknown: Vec<AgentId>,
}

/// One agent: one provider, one cwd, one timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub id: AgentId,
    pub provider: String,
    /// Absolute; fixed for the agent's life (it keys the record's folder).
    pub cwd: PathBuf,
    pub workspace_id: WorkspaceId,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// When the agent last did or was asked to do something.
    pub last_activity_at: Timestamp,
    pub title: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub status: AgentStatus,
    pub last_error: Option<String>,
    pub archived_at: Option<Timestamp>,
    pub attention: Option<Attention>,
    pub auto_archive: bool,
    pub config: ProviderConfig,
    pub resume: Option<ResumeHandle>,
    /// Set while its last start failed (cleared by a start that succeeds).
    pub start_failure: Option<StartFailure>,
    /// Set while it waits for its provider's usage limit (cleared when a turn starts).
    pub limited: Option<Limited>,
    /// What it spent, durable.
    pub spend: Spend,
    /// The budget for it and its subtree, if one was set on it.
    pub budget: Option<Budget>,
    /// Fields of the file that this version does not know, kept so a rewrite loses nothing.
    pub(crate) unknown: serde_json::Map<String, serde_json::Value>,
}

impl Agent {
    /// The parent this agent is a subagent of, from the parent label. A label that is not a
    /// valid id (damaged data) makes the agent a root.
    pub fn parent_id(&self) -> Option<AgentId> {
        self.labels.get(PARENT_LABEL)?.parse().ok()
    }

    /// The hub's archived agent on this agent's lineage, from the label the hub sets.
    pub fn upstream_archived(&self) -> Option<AgentId> {
        self.labels.get(UPSTREAM_ARCHIVED_LABEL)?.parse().ok()
    }

    /// What the hub lets this subagent's subtree spend under its parent's budgets there, from
    /// the label the hub sets (none when unset or unreadable).
    pub fn upstream_budgets(&self) -> Vec<Budget> {
        self.labels
            .get(UPSTREAM_BUDGET_LABEL)
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default()
    }

    /// The hub's agent that created this one over a link, from the upstream label.
    pub fn upstream_id(&self) -> Option<AgentId> {
        self.labels.get(UPSTREAM_LABEL)?.parse().ok()
    }

    pub fn is_archived(&self) -> bool {
        self.archived_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(tokens: Option<u64>, cost: Option<f64>) -> Spend {
        Spend {
            tokens,
            cost,
            currency: cost.map(|_| "USD".to_string()),
        }
    }

    #[test]
    fn an_upstream_allowance_is_what_the_subtree_spent_plus_what_the_tree_has_left() {
        let budget = Budget {
            tokens: Some(2500),
            cost: Some(1.0),
            hard: true,
        };
        // The tree spent 2000 tokens and 0.25, 1500 and 0.1 of it below the remote subagent.
        let allowed = upstream_allowance(
            &budget,
            &spend(Some(2000), Some(0.25)),
            &spend(Some(1500), Some(0.1)),
        );
        assert_eq!(allowed.tokens, Some(2000));
        assert!((allowed.cost.expect("cost") - 0.85).abs() < 1e-9);
        assert!(allowed.hard);
        // Whatever the subtree spends next counts in the tree too: the allowance stays.
        let later = upstream_allowance(
            &budget,
            &spend(Some(2400), Some(0.25)),
            &spend(Some(1900), Some(0.1)),
        );
        assert_eq!(later.tokens, Some(2000));
    }

    #[test]
    fn an_upstream_allowance_of_a_spent_tree_is_what_the_subtree_spent() {
        let budget = Budget {
            tokens: Some(100),
            cost: None,
            hard: false,
        };
        let allowed = upstream_allowance(&budget, &spend(Some(300), None), &spend(Some(50), None));
        assert_eq!(allowed.tokens, Some(50));
        assert_eq!(allowed.cost, None, "no cost limit, none given");
        assert!(budget_reached(&allowed, &spend(Some(50), None)));
        // Nothing reported yet: the whole budget is left, unknown spend counting as none.
        let fresh = upstream_allowance(&budget, &Spend::default(), &Spend::default());
        assert_eq!(fresh.tokens, Some(100));
        assert!(!budget_reached(&fresh, &Spend::default()));
    }

    #[test]
    fn upstream_budgets_are_read_from_their_label() {
        let mut labels = BTreeMap::new();
        assert!(labels_agent(labels.clone()).upstream_budgets().is_empty());
        labels.insert(
            UPSTREAM_BUDGET_LABEL.to_string(),
            r#"[{"tokens": 10}, {"cost": 0.5, "hard": true}]"#.to_string(),
        );
        let budgets = labels_agent(labels.clone()).upstream_budgets();
        assert_eq!(budgets.len(), 2);
        assert_eq!(budgets[0].tokens, Some(10));
        assert!(budgets[1].hard);
        labels.insert(UPSTREAM_BUDGET_LABEL.to_string(), "not json".to_string());
        assert!(labels_agent(labels).upstream_budgets().is_empty());
    }

    fn labels_agent(labels: BTreeMap<String, String>) -> Agent {
        let now = Timestamp::now();
        Agent {
            id: AgentId::new(),
            provider: "demo".to_string(),
            cwd: PathBuf::from("/"),
            workspace_id: WorkspaceId::new(),
            created_at: now,
            updated_at: now,
            last_activity_at: now,
            title: None,
            labels,
            status: crate::lifecycle::AgentStatus::Idle,
            last_error: None,
            archived_at: None,
            attention: None,
            auto_archive: false,
            config: ProviderConfig::default(),
            resume: None,
            start_failure: None,
            limited: None,
            spend: Spend::default(),
            budget: None,
            unknown: serde_json::Map::new(),
        }
    }
}
