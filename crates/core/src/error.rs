//! The registry's errors, each with a stable code for clients.

pub use drover_protocol::ErrorCode;

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
    /// The stable code clients match on (documented in `docs/protocol.md`).
    pub fn code(&self) -> ErrorCode {
        match self {
            RegistryError::UnknownAgent(_) => ErrorCode::UnknownAgent,
            RegistryError::UnknownWorkspace(_) => ErrorCode::UnknownWorkspace,
            RegistryError::InvalidId(_) => ErrorCode::InvalidId,
            RegistryError::IllegalTransition { .. } => ErrorCode::IllegalTransition,
            RegistryError::Archived { .. } => ErrorCode::AgentArchived,
            RegistryError::TurnBlocked { .. } => ErrorCode::TurnBlocked,
            RegistryError::AgentActive(_) => ErrorCode::AgentActive,
            RegistryError::InvalidInput { .. } => ErrorCode::InvalidInput,
            RegistryError::Store(_) => ErrorCode::StoreFailed,
            RegistryError::Worktree(e) => e.code(),
            RegistryError::ShuttingDown => ErrorCode::ShuttingDown,
        }
    }

    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        RegistryError::InvalidInput {
            field,
            message: message.into(),
        }
    }
}
