//! drover's agent runtimes: each agent's provider process speaking the Agent Client Protocol
//! (v1, JSON-RPC over stdio), its turns, its durable inbox and timeline.
//!
//! [`RuntimeManager`] is the entry point for clients: create an agent and start it, deliver
//! messages (followup, steer, inject), cancel, answer permissions, wait until idle, read
//! timelines. One task per agent owns that agent's process, connection, inbox and timeline;
//! everything else talks to it through a bounded channel.
//!
//! [`RuntimeManager::open`] wires everything once, in order, before any agent starts: the
//! registry opens with a weak [`RuntimeControl`](drover_core::RuntimeControl) onto the
//! agents' tasks (ownership runs from the manager to the registry, never back), and the MCP
//! servers agents get are an argument, so an agent woken at boot has them too.
//!
//! The manager's parts: `manager` (opening, the runtimes' state, finding an agent's task),
//! `requests` (what the operations ask of one agent), `sign_in`, `actors` (the agents' tasks
//! and the registry's handle onto them), `shared` (what the tasks share).
//!
//! Nothing here decides lifecycle rules: the registry does. Nothing here knows about
//! WebSocket or HTTP.

mod actor;
mod actors;
pub mod auth;
pub mod handshake;
pub mod jobs;
mod limits;
mod listing;
mod manager;
pub mod metrics;
pub mod process;
pub mod providers;
pub mod records;
mod refused_key;
mod requests;
pub mod rpc;
mod shared;
mod sign_in;
mod slots;
pub mod warm;

use std::sync::Arc;
use std::time::Duration;

use drover_core::error::ErrorCode;
use drover_core::{AgentId, RegistryError, store::StoreError};
use drover_protocol::{ConfigOptionInfo, OwnSubagentInfo};
use serde::Serialize;
use serde_json::Value;

pub use actor::{LastStderr, LaunchError};
/// A change to one agent's timeline: the timeline log's own entry, as live clients get it.
pub use drover_core::timeline::Entry as TimelineUpdate;
/// The kinds of timeline item the runtimes write, for readers of timelines.
pub use listing::ProviderSession;
pub use providers::{
    Availability, ConfigError, DEFAULT_IDLE_TIMEOUT, LiveProviders, Provider, Providers,
    RuntimeSettings,
};
pub use refused_key::placed_on_host;

/// How long a closing agent gets between TERM and KILL.
pub const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// Where an agent's runtime is: the protocol's `RuntimeInfo.state`.
pub use drover_protocol::RuntimeState;

/// An agent's runtime as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeView {
    pub state: RuntimeState,
    /// The agent process (its process group leader) while there is one.
    pub pid: Option<u32>,
    /// When an idle runtime will hibernate (`None`: it is busy, cold, or never hibernates).
    pub hibernate_at: Option<jiff::Timestamp>,
    /// When it tries to start again by itself after a failed start.
    pub retry_at: Option<jiff::Timestamp>,
    /// The background processes that keep an otherwise idle runtime live (work the agent
    /// started itself that hibernation would kill; see [`process::background_processes`]):
    /// while it is above 0 the runtime neither hibernates nor makes room under `max_live`.
    pub background: usize,
}

impl RuntimeView {
    pub const COLD: RuntimeView = RuntimeView {
        state: RuntimeState::Cold,
        pid: None,
        hibernate_at: None,
        retry_at: None,
        background: 0,
    };
}

/// What an agent's process said of itself in its `initialize` answer: who it is, the ACP
/// version it speaks, and what it can do beyond prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// `agentInfo.name` (with `title`, `version` where given).
    pub name: Option<String>,
    pub title: Option<String>,
    pub version: Option<String>,
    pub protocol_version: u64,
    /// Its capabilities by name: `load` (`session/load`), `resume`, `close`, `list`, `fork`
    /// (`sessionCapabilities`), `image`, `audio`, `embedded-context` (prompts), `mcp-http`,
    /// `mcp-sse`.
    pub capabilities: Vec<String>,
}

/// The runtimes at one moment ([`RuntimeManager::census`]); an agent not counted is cold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCensus {
    /// Starts waiting for a slot under `max_live`.
    pub queued: usize,
    /// Processes being spawned or in their ACP handshake.
    pub starting: usize,
    /// Processes with an open session.
    pub live: usize,
    /// The agent processes (group leaders) there are now.
    pub pids: Vec<u32>,
    /// Messages queued in the inboxes, not yet delivered.
    pub inbox_messages: usize,
}

/// What an agent's process tree holds (see [`process::tree_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeMemory {
    pub processes: usize,
    pub rss_bytes: u64,
}

/// A change to one agent's timeline, for live clients.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    pub agent_id: AgentId,
    /// The timeline's revision after this change (see `TimelinePage::revision`).
    pub revision: u64,
    pub update: TimelineUpdate,
}

/// How a client answers a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionChoice {
    /// By option kind: `allow_once`, `allow_always`, `reject_once`, `reject_always`.
    Kind(String),
    /// By the agent's own option id.
    OptionId(String),
    /// Decline to choose (the agent treats it as cancelled).
    Cancel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionAnswer {
    /// The permission item's timeline seq; `None` answers the oldest pending request.
    pub request: Option<u64>,
    pub choice: PermissionChoice,
}

/// A permission request waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPermission {
    /// The permission item's timeline seq: what an answer names.
    pub seq: u64,
    pub tool_call_id: Option<String>,
    pub title: Option<String>,
    pub options: Vec<Value>,
}

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("unknown provider `{name}`; the providers are {}", .known.join(", "))]
    UnknownProvider { name: String, known: Vec<String> },
    /// `reason` names the provider and says what to install.
    #[error("{reason}")]
    ProviderUnavailable { provider: String, reason: String },
    #[error("agent `{0}` has no pending permission request")]
    NoPendingPermission(AgentId),
    #[error("agent `{agent}`: {message}")]
    Permission { agent: AgentId, message: String },
    #[error("agent `{agent}` could not start: {error}")]
    StartFailed {
        agent: AgentId,
        error: Box<LaunchError>,
    },
    #[error("agent `{agent}`: {message}")]
    Agent { agent: AgentId, message: String },
    #[error("the runtime of agent `{0}` stopped")]
    Stopped(AgentId),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// A sign-in that cannot be done as asked (`message` says what to give instead).
    #[error("{message}")]
    InvalidSignIn { message: String },
    /// A config option the agent does not offer, or a value it does not take.
    #[error("agent `{agent}`: {message}")]
    NoSuchOption { agent: AgentId, message: String },
    /// The provider's agent does not advertise `sessionCapabilities.list`.
    #[error(
        "the agent of provider `{provider}` cannot list its sessions (it advertises no `sessionCapabilities.list`)"
    )]
    CannotList { provider: String },
    /// Listing the provider's sessions failed (see [`RuntimeManager::provider_sessions`]).
    #[error("listing the sessions of provider `{provider}` failed: {message}")]
    Listing { provider: String, message: String },
    /// Asking the provider's agent how it signs in failed (see `RuntimeManager::sign_in`).
    #[error("asking the agent of provider `{provider}` how it signs in failed: {message}")]
    Asking { provider: String, message: String },
}

impl AcpError {
    /// The stable code clients match on.
    pub fn code(&self) -> ErrorCode {
        match self {
            AcpError::Registry(e) => e.code(),
            AcpError::Store(_) | AcpError::Config(providers::ConfigError::Write { .. }) => {
                ErrorCode::StoreFailed
            }
            AcpError::Config(_) => ErrorCode::InvalidConfig,
            AcpError::UnknownProvider { .. } => ErrorCode::UnknownProvider,
            AcpError::ProviderUnavailable { .. } => ErrorCode::ProviderUnavailable,
            AcpError::NoPendingPermission(_) | AcpError::Permission { .. } => {
                ErrorCode::NoSuchPermission
            }
            AcpError::StartFailed { .. } => ErrorCode::AgentStartFailed,
            AcpError::Agent { .. } | AcpError::Listing { .. } | AcpError::Asking { .. } => {
                ErrorCode::AgentError
            }
            AcpError::Stopped(_) => ErrorCode::RuntimeStopped,
            AcpError::ShuttingDown => ErrorCode::ShuttingDown,
            AcpError::InvalidSignIn { .. }
            | AcpError::CannotList { .. }
            | AcpError::NoSuchOption { .. } => ErrorCode::InvalidInput,
        }
    }
}

/// Gives an agent its MCP servers: called with the agent and whether it advertised HTTP MCP
/// support; returns the `mcpServers` array of ACP `session/new`.
pub type McpServers = Arc<dyn Fn(AgentId, bool) -> Value + Send + Sync>;

/// Agents that get no MCP server (`mcpServers: []`): runtimes without a daemon.
pub fn no_mcp_servers() -> McpServers {
    Arc::new(|_, _| Value::Array(Vec::new()))
}

/// What a live session offers to set, as clients see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveSession {
    /// The session's modes (`{currentModeId, availableModes}`), where it offers them.
    pub modes: Option<Value>,
    /// Its config options (ACP `configOptions`), where it offers them.
    pub config_options: Option<Vec<ConfigOptionInfo>>,
    /// The subagents its process runs itself.
    pub own_subagents: Vec<OwnSubagentInfo>,
}

pub use manager::RuntimeManager;
pub(crate) use shared::{LiveCount, Shared};
