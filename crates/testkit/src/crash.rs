//! The line protocol between `drover-crashdriver` and the crash test, and the small
//! deterministic randomness both use.
//!
//! The driver prints, one JSON document a line:
//!
//! ```text
//! boot {"agents":12, ...}                         after Registry::open
//! begin {"seq":7,"op":{...},"ok":true,"expect":[...]}   before a mutation is called
//! ack {"seq":7,"agents":[...]}                    after it returned Ok
//! err {"seq":7,"error":"..."}                     after it returned an error (nothing changed)
//! ```
//!
//! `expect` is what the driver's own model says every agent the operation changes will look
//! like; `ack` carries what the registry returned, which the driver has checked against
//! `expect` (a mismatch is printed as `diverge` and the driver exits with status 3).

use std::collections::BTreeMap;
use std::path::PathBuf;

use drover_core::{Agent, AgentId, AgentStatus, Budget, PARENT_LABEL};
use serde::{Deserialize, Serialize};

/// The part of an agent the crash test follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// `None` only in the `expect` of a `create`: the registry picks the id.
    pub id: Option<AgentId>,
    pub title: Option<String>,
    pub archived: bool,
    pub status: AgentStatus,
    pub parent: Option<AgentId>,
    /// Every label but the parent's (that is `parent`): the user's, and the hub's
    /// (`drover.upstream-budget`, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The budget set on the agent's tree (`drover budget`).
    #[serde(default)]
    pub budget: Option<Budget>,
    /// What the agent spent: tokens and cost.
    #[serde(default)]
    pub spend_tokens: Option<u64>,
    #[serde(default)]
    pub spend_cost: Option<f64>,
    /// Whether the agent waits for its provider's usage limit (`limited`).
    #[serde(default)]
    pub limited: bool,
    /// Its last start failed: `"error"`, or `"sign-in:<method ids>"` when it waits for a
    /// sign-in.
    #[serde(default)]
    pub start_failure: Option<String>,
}

impl AgentState {
    pub fn of(agent: &Agent) -> AgentState {
        let mut labels = agent.labels.clone();
        labels.remove(PARENT_LABEL);
        AgentState {
            id: Some(agent.id),
            title: agent.title.clone(),
            archived: agent.is_archived(),
            status: agent.status,
            parent: agent.parent_id(),
            labels,
            budget: agent.budget.clone(),
            spend_tokens: agent.spend.tokens,
            spend_cost: agent.spend.cost,
            limited: agent.limited.is_some(),
            start_failure: agent.start_failure.as_ref().map(|f| match &f.sign_in {
                Some(methods) => format!(
                    "sign-in:{}",
                    methods
                        .iter()
                        .map(|m| m.id.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                None => "error".to_string(),
            }),
        }
    }

    /// What boot makes of this state: nothing is `running` or `initializing` after a restart.
    #[must_use]
    pub fn after_restart(&self) -> AgentState {
        let mut s = self.clone();
        if s.status.is_busy() {
            s.status = AgentStatus::Idle;
        }
        s
    }
}

/// One mutation the driver makes through the registry's public API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    Create {
        title: String,
        parent: Option<AgentId>,
        cwd: PathBuf,
    },
    SetStatus {
        id: AgentId,
        to: AgentStatus,
    },
    TurnEnd {
        id: AgentId,
        /// `completed`, `failed` or `canceled`.
        outcome: String,
    },
    SetTitle {
        id: AgentId,
        title: Option<String>,
    },
    Detach {
        id: AgentId,
    },
    /// With `stop_activity`: cascades over the unarchived agents of the subtree.
    Archive {
        id: AgentId,
    },
    Unarchive {
        id: AgentId,
    },
    /// `set_budget`: sets (`Some`) or clears the budget of the agent's tree.
    SetBudget {
        id: AgentId,
        budget: Option<Budget>,
    },
    /// `add_spend`: what the agent's runtime reports it spent.
    AddSpend {
        id: AgentId,
        tokens: Option<u64>,
        cost: Option<f64>,
    },
    /// `update_labels`; a reserved label is refused.
    Labels {
        id: AgentId,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
    /// `set_upstream_budgets`: what the hub that made the agent here lets its tree spend.
    UpstreamBudgets {
        id: AgentId,
        budgets: Vec<Budget>,
    },
    /// `record_turn_limited`: the running turn hit the provider's usage limit.
    Limited {
        id: AgentId,
    },
    /// `clear_limited`: the wait for the usage limit ends without a turn.
    ClearLimited {
        id: AgentId,
    },
    /// `record_start_failure`: the runtime did not start; with `sign_in`, it waits for one.
    StartFailure {
        id: AgentId,
        sign_in: bool,
    },
    /// A sign-in kept in `config.toml` (`store_sign_in`): `var = value` in the `env` of
    /// [`SIGN_IN_PROVIDER`]. Changes no agent.
    SignIn {
        var: String,
        value: String,
    },
}

/// The provider the crash driver's sign-ins are kept for.
pub const SIGN_IN_PROVIDER: &str = "codex";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Begin {
    pub seq: u64,
    pub op: Op,
    /// Whether the driver's model expects the registry to accept the operation.
    pub ok: bool,
    /// The state of every agent the operation changes, as it will be if it is applied.
    pub expect: Vec<AgentState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ack {
    pub seq: u64,
    pub agents: Vec<AgentState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failed {
    pub seq: u64,
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Boot {
    pub agents: usize,
    pub interrupted: usize,
    pub cascades_completed: usize,
    pub quarantined: usize,
}

/// xorshift64*: small, deterministic, and good enough to pick operations and delays.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // splitmix64 of the seed, so nearby seeds start far apart and 0 is not a fixed point.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        XorShift(if z == 0 { 1 } else { z })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        let i = usize::try_from(self.range(0, items.len() as u64)).ok()?;
        items.get(i)
    }
}
