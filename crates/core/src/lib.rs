//! drover's core: the registry of agents and workspaces, their lifecycle, relationships,
//! archive admission, workspace activity, and the file store under `$DROVER_HOME`.
//!
//! Nothing here knows about HTTP, WebSocket framing, ACP or agent processes: runtimes are
//! reached through [`runtime::RuntimeControl`], clients through [`registry::RegistryEvent`]s.
//! The only processes started here are `git` and a project's worktree setup and teardown
//! commands ([`worktree`]); [`child`] is how they start, and how drover-acp starts agents.

pub mod activity;
pub mod admission;
pub mod agent;
pub mod child;
pub mod error;
pub mod file_error;
pub mod guard;
pub mod ids;
pub mod inbox;
mod jsonl;
pub mod lifecycle;
pub mod outbox;
pub mod private;
pub mod procfs;
pub mod pty;
pub mod registry;
pub mod runtime;
pub mod store;
pub mod timeline;
pub mod view;
pub mod workspace;
pub mod worktree;

pub use activity::{ActivityBucket, ActivityChange, ActivityIndex};
pub use admission::{ActivityFamily, ActivityItem, ActivityReport};
pub use agent::{
    Agent, AuthMethod, Budget, Limited, OnInterrupt, OnLimit, PARENT_LABEL, PermissionPolicy,
    ProviderConfig, ResumeHandle, Spend, SpentBudget, StartFailure, TreeSpend,
    UPSTREAM_ARCHIVED_LABEL, UPSTREAM_BUDGET_LABEL, UPSTREAM_LABEL, budget_reached,
    upstream_allowance,
};
pub use error::RegistryError;
pub use ids::{AgentId, InvalidId, WorkspaceId};
pub use lifecycle::{AgentStatus, Attention, AttentionReason, TurnOutcome};
pub use registry::{
    ArchiveOptions, ArchiveOutcome, BootReport, BulkArchiveOutcome, CREATED_WORKSPACE_LABEL,
    Change, CreatedWorktree, ImportWorkspace, ImportedAgent, NewAgent, Registry, RegistryEvent,
    RemoteSpend, SkippedChild, WorkspaceArchiveOutcome, WorktreeCheck,
};
pub use runtime::{BoxFuture, CancelCause, NoRuntimes, RuntimeControl, RuntimeError};
pub use workspace::{Workspace, WorkspaceKind};
pub use worktree::{
    CommandRun, WorktreeError, WorktreeInfo, WorktreeOptions, WorktreeRemoval, WorktreeStatusInfo,
};
