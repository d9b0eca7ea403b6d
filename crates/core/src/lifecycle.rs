//! The agent state machine of the seeds, turn outcomes, and attention.

use std::fmt;

use drover_protocol::TurnEnd;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// An agent's literal lifecycle status (`lastStatus` on disk). A parent is `idle` when its own
/// turn is idle, whatever its subagents do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// The runtime is starting (process spawn, ACP handshake, session load).
    Initializing,
    /// Ready for a prompt, with or without a live runtime.
    Idle,
    /// A turn is in progress (including one waiting on a permission).
    Running,
    /// The runtime or the last turn failed; `lastError` says why.
    Error,
    /// The runtime was shut down for good; it is started again only on request.
    Closed,
}

impl AgentStatus {
    pub const ALL: [AgentStatus; 5] = [
        AgentStatus::Initializing,
        AgentStatus::Idle,
        AgentStatus::Running,
        AgentStatus::Error,
        AgentStatus::Closed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Initializing => "initializing",
            AgentStatus::Idle => "idle",
            AgentStatus::Running => "running",
            AgentStatus::Error => "error",
            AgentStatus::Closed => "closed",
        }
    }

    /// Whether work is under way: a crash must never leave an agent recorded like this.
    pub fn is_busy(self) -> bool {
        matches!(self, AgentStatus::Initializing | AgentStatus::Running)
    }

    /// The transitions of the seed's machine:
    ///
    /// ```text
    /// initializing → idle → running → idle      (a turn ends, the agent awaits the next prompt)
    ///       │          │        │
    ///       └──────────┴────────┴──→ error → closed
    /// ```
    ///
    /// plus the edges that resume a cold agent (`idle`/`error`/`closed` → `initializing`), close
    /// a healthy one (`initializing`/`idle`/`running` → `closed`), and start a turn on a live
    /// runtime that reported an error for its previous turn (`error` → `running`, `error` →
    /// `idle`). A transition to the same status is not a transition.
    pub fn can_become(self, to: AgentStatus) -> bool {
        use AgentStatus::{Closed, Error, Idle, Initializing, Running};
        matches!(
            (self, to),
            (Initializing | Running, Idle | Error | Closed)
                | (Idle, Running | Initializing | Error | Closed)
                | (Error, Initializing | Idle | Running | Closed)
                | (Closed, Initializing)
        )
    }
}

impl fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a turn ended: the terminal turn events the registry acts on (attention, autoArchive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TurnOutcome {
    /// `turn_completed`: the agent ended its turn.
    Completed,
    /// `turn_failed`: the turn ended in an error.
    Failed { error: String },
    /// `turn_canceled`: someone cancelled the turn.
    Canceled,
}

impl TurnOutcome {
    /// The `event` of its `turn_ended` item.
    pub fn event_name(&self) -> TurnEnd {
        match self {
            TurnOutcome::Completed => TurnEnd::Completed,
            TurnOutcome::Failed { .. } => TurnEnd::Failed,
            TurnOutcome::Canceled => TurnEnd::Canceled,
        }
    }
}

/// Why an agent asks for its user: the protocol's `attentionReason`.
pub use drover_protocol::AttentionReason;

/// An agent that requires attention, why, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    pub reason: AttentionReason,
    pub at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::AgentStatus::*;
    use super::*;

    #[test]
    fn seed_path_is_legal() {
        for (from, to) in [
            (Initializing, Idle),
            (Idle, Running),
            (Running, Idle),
            (Running, Error),
            (Error, Closed),
        ] {
            assert!(from.can_become(to), "{from} -> {to}");
        }
    }

    #[test]
    fn no_self_loops_and_no_shortcuts_into_a_turn() {
        for s in AgentStatus::ALL {
            assert!(!s.can_become(s), "{s} -> {s}");
        }
        // A turn needs a ready runtime first.
        assert!(!Initializing.can_become(Running));
        assert!(!Closed.can_become(Running));
        assert!(!Closed.can_become(Idle));
    }
}
