//! The registry's errors, each with a stable code for clients.

use crate::admission::ActivityReport;
use crate::ids::{AgentId, InvalidId};
use crate::lifecycle::AgentStatus;
use crate::store::StoreError;
use crate::worktree::WorktreeError;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("agent `{0}` not found")]
    UnknownAgent(String),
    #[error("workspace `{0}` not found")]
    UnknownWorkspace(String),
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    #[error("agent `{agent}` cannot go from `{from}` to `{to}`")]
    IllegalTransition {
        agent: AgentId,
        from: AgentStatus,
        to: AgentStatus,
    },
    #[error("agent `{agent}` is archived; unarchive it first")]
    Archived { agent: AgentId },
    #[error("agent `{agent}` cannot start a turn: its lineage reaches archived agent `{archived}`")]
    TurnBlocked { agent: AgentId, archived: AgentId },
    #[error(
        "agent `{}` still has running work ({}); stop it first or archive with stopActivity",
        .0.agent_id.map(|a| a.to_string()).unwrap_or_default(),
        .0.summary()
    )]
    AgentActive(Box<ActivityReport>),
    #[error("invalid `{field}`: {message}")]
    InvalidInput {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A git worktree could not be made, was refused removal (`worktree_dirty`), or its setup
    /// or teardown failed: the code is the worktree error's own.
    #[error(transparent)]
    Worktree(#[from] WorktreeError),
    #[error("the registry is shutting down")]
    ShuttingDown,
}

impl RegistryError {
    /// The stable code clients match on (documented in `docs/protocol.md` once it exists).
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::UnknownAgent(_) => "unknown_agent",
            RegistryError::UnknownWorkspace(_) => "unknown_workspace",
            RegistryError::InvalidId(_) => "invalid_id",
            RegistryError::IllegalTransition { .. } => "illegal_transition",
            RegistryError::Archived { .. } => "agent_archived",
            RegistryError::TurnBlocked { .. } => "turn_blocked",
            RegistryError::AgentActive(_) => "agent_active",
            RegistryError::InvalidInput { .. } => "invalid_input",
            RegistryError::Store(_) => "store_failed",
            RegistryError::Worktree(e) => e.code(),
            RegistryError::ShuttingDown => "shutting_down",
        }
    }

    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        RegistryError::InvalidInput {
            field,
            message: message.into(),
        }
    }
}
