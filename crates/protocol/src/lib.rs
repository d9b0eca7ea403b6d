//! The wire types of drover's client protocol: JSON messages over a WebSocket at `/ws`.
//!
//! Every message is one JSON object with a `type`. Client messages ([`requests`]: one struct
//! each, in a [`ClientRequest`] envelope) carry their fields beside `type` (and an optional
//! `requestId`, echoed in the answer); daemon messages carry theirs in `payload` (an answer's
//! `requestId` too: [`answers`], each in an [`Answer`] envelope).
//! `docs/protocol.md` describes each with an example; `schema/protocol.json` is the
//! JSON Schema generated from these types (a test keeps them in step).
//!
//! Nothing here does I/O or knows the daemon's internals: ids and timestamps are strings,
//! timeline items and activity reports are carried as JSON.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bumped on any change a client must know about, and when a hub needs its hosts to know a
/// request to keep what it promises: 2 added `set_upstream_budget` and `upstream.budgets` (a
/// host holds the hub's subagents to their parents' budgets), which a host of version 1
/// refuses.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest `protocolVersion` whose clients a daemon still serves: everything since only
/// added to it.
pub const OLDEST_PROTOCOL_VERSION: u32 = 1;

/// Largest frame a client may send; a larger one closes the connection with 1009.
pub const MAX_CLIENT_FRAME: usize = 1024 * 1024;

pub mod answers;
pub mod js;
pub mod requests;
mod values;

pub use answers::Answer;
pub use requests::{ClientMessage, ClientRequest};

pub use values::{
    AgentStatus, AttentionReason, CancelCause, ChangeStatus, ErrorCode, HostState, InterruptCause,
    ItemKind, JobStatus, KillCause, NotifyEvent, RuntimeState, ScheduleState, SignInState,
    SinkKind, SubagentVia, TurnEnd, WireEnum, WorkspaceActivity, WorkspaceKind,
};

// ---- client → daemon ----------------------------------------------------------------------

/// Where a message goes and whether it wakes the agent. (The daemon's inbox stores the same
/// enum: it is defined once, here.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Queued for the next turn; an idle agent starts it at once, a busy one after its turn.
    Followup,
    /// Cancels the current turn (keeping the inbox) and runs first.
    Steer,
    /// Context prepended to the next prompt; does not wake the agent.
    Inject,
}

impl Delivery {
    /// Whether the message starts a turn (an `inject` waits for the next one).
    pub fn wakes(self) -> bool {
        !matches!(self, Delivery::Inject)
    }
}

/// How an agent's permission requests are answered. (The agent record stores the same enum.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Wait for a client to answer (the agent's attention becomes `permission`).
    #[default]
    Ask,
    /// Allow every request at once (unattended runs).
    Allow,
}

/// What drover does with a turn that a daemon shutdown or crash cut off (`onInterrupt`; per
/// provider as `on_interrupt` in `config.toml`, per agent at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnInterrupt {
    /// The agent waits with attention `interrupted` until someone sends it something.
    #[default]
    Notify,
    /// After the restart the agent gets one followup saying that its turn was interrupted
    /// (when, and by what) and asking it to continue.
    Continue,
}

/// What drover does when a turn fails on the provider's usage or rate limit (`onLimit`; per
/// provider as `on_limit` in `config.toml`, per agent at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    /// The agent waits (attention `limited`) until the limit resets, then its prompt is sent
    /// again, once.
    #[default]
    Wait,
    /// The turn fails, as any other error.
    Fail,
}

/// One way to sign in to an agent, as its ACP `initialize` answer offers it (`authMethods`).
/// The agent record keeps the same shape while the agent waits for a sign-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthMethod {
    /// What `authenticate` (and `sign_in`) names.
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: AuthKind,
    /// `env_var`: the variables to set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<AuthVar>,
    /// `terminal`: the arguments added to the provider's command for the login.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `terminal`: variables set for the login.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Where to get a key, when the agent says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// How a sign-in method works (ACP auth method types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// The agent signs in by itself when asked (`authenticate`); the default in ACP.
    #[default]
    Agent,
    /// Variables the user provides (a key), passed in the agent's environment.
    EnvVar,
    /// An interactive login: the agent's own command with `args`, in the user's terminal.
    Terminal,
}

impl AuthKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::Agent => "agent",
            AuthKind::EnvVar => "env_var",
            AuthKind::Terminal => "terminal",
        }
    }
}

/// A variable of an `env_var` sign-in method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthVar {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The method works without it.
    #[serde(default)]
    pub optional: bool,
    /// A secret (a key): never shown again once given. Default true.
    #[serde(default = "yes")]
    pub secret: bool,
}

fn yes() -> bool {
    true
}

/// When a schedule fires: exactly one of `at`, `inSeconds`, `everySeconds`, `cron`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleWhen {
    /// Once, at this time (RFC 3339 with an offset, e.g. `2026-12-24T09:00:00+01:00`).
    #[serde(default)]
    pub at: Option<String>,
    /// Once, this many seconds from now.
    #[serde(default)]
    pub in_seconds: Option<u64>,
    /// Every this many seconds, the first time at `startAt` (default: one period from now).
    #[serde(default)]
    pub every_seconds: Option<u64>,
    #[serde(default)]
    pub start_at: Option<String>,
    /// A cron expression: 5 fields (`minute hour day-of-month month day-of-week`), or 6 with
    /// seconds first; `@daily` and the like too.
    #[serde(default)]
    pub cron: Option<String>,
    /// The time zone the cron expression is read in (IANA name; default `UTC`).
    #[serde(default)]
    pub time_zone: Option<String>,
}

/// The agent a schedule creates each time it fires.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleNewAgent {
    /// Default: the creating agent's provider (required from a client).
    #[serde(default)]
    pub provider: Option<String>,
    /// The working directory (absolute). Default: the workspace's directory.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub workspace_id: Option<String>,
    /// Each new agent is a subagent of this one.
    #[serde(default)]
    pub parent_agent_id: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub permission_policy: Option<PermissionPolicy>,
    #[serde(default)]
    pub auto_archive: bool,
}

/// A worktree to make: every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewWorktree {
    /// The worktree's folder name under `$DROVER_HOME/worktrees/<project>/` (sanitized;
    /// suffixed when taken; generated when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// The new branch (default `drover/<name>`); it must not exist yet.
    #[serde(default)]
    pub branch: Option<String>,
    /// What to branch from: a branch, tag or commit (default: the checkout's HEAD).
    #[serde(default)]
    pub base: Option<String>,
}

// ---- daemon → client ----------------------------------------------------------------------

/// An agent as clients see it (`session_state`, `agent_status`, answers). The lifecycle's own
/// optional fields (`sessionId`, `error`, `currentModeId`, `availableModes`, `title`,
/// `parentAgentId`, `archivedAt`, `attentionReason`) are there even when `null`; any other
/// field that is `None` is left out of the JSON, here and in [`RuntimeInfo`] and
/// [`SpendInfo`]: most are for most agents, and a `session_state` carries thousands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    pub id: String,
    pub status: AgentStatus,
    pub created_at: String,
    pub updated_at: String,
    pub last_activity_at: String,
    /// The provider (`codex`, `claude`, ...).
    #[serde(rename = "type")]
    pub provider: String,
    /// The provider's own session id (ACP), for resume.
    pub session_id: Option<String>,
    /// The last error.
    pub error: Option<String>,
    pub current_mode_id: Option<String>,
    /// Modes the live runtime offers (`null` while it is cold).
    pub available_modes: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The recorded reasoning effort (`thought_level` config option).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    /// The settings the live session offers (ACP config options: mode, model, reasoning
    /// effort, the agent's own), with their current values; `null` while it is cold or when
    /// the agent offers none. Set one with `set_config_option`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_options: Option<Vec<ConfigOptionInfo>>,
    /// The subagents the agent runs itself (claude's Task tool, ACP `subagent_update`), while
    /// its process lives: read-only (they end with it), and `subagent` activity in archive
    /// admission while they run. Not drover agents: see `parentAgentId` for those.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_subagents: Vec<OwnSubagentInfo>,
    pub title: Option<String>,
    pub cwd: String,
    pub parent_agent_id: Option<String>,
    pub workspace_id: String,
    pub labels: BTreeMap<String, String>,
    pub archived_at: Option<String>,
    pub requires_attention: bool,
    pub attention_reason: Option<AttentionReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_timestamp: Option<String>,
    /// Set while the agent waits for its provider's usage limit to reset (attention
    /// `limited`): its failed prompt is sent again at `retryAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited: Option<LimitedInfo>,
    pub auto_archive: bool,
    pub permission_policy: PermissionPolicy,
    /// What happens to a turn a daemon restart cuts off, as the agent was created with
    /// (`null`: its provider's `on_interrupt`, else `notify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_interrupt: Option<OnInterrupt>,
    /// What happens when a turn hits the provider's usage limit, as the agent was created with
    /// (`null`: its provider's `on_limit`, else `wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_limit: Option<OnLimit>,
    /// What the agent spent, as its agent reported it (`null` fields: it reported none,
    /// unknown rather than zero).
    #[serde(default)]
    pub spend: SpendInfo,
    /// The budget set on this agent, for it and its subtree (`null`: none here; an
    /// ancestor's may apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// What the agent and every agent below it spent: only in the `agent` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_spend: Option<TreeSpendInfo>,
    /// The agent's runtime: whether a process runs for it.
    #[serde(default)]
    pub runtime: RuntimeInfo,
    /// Set while the agent's last start failed: it does not start again on its own (but for
    /// the retries `runtime.retryAt` announces) until `restart_agent` or a `sign_in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<StartFailureInfo>,
    /// The messages queued for it and not delivered yet, oldest first: only in the `agent`
    /// answer (read then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<Vec<QueuedMessageInfo>>,
    /// The host it runs on (`drover host ls`); absent for this daemon's own machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// A subagent an agent runs itself, as its provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnSubagentInfo {
    /// The tool call's id (`via` `tool_call`) or the child session's (`subagent_update`).
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    /// `running`, `completed`, `failed`, `interrupted` (its turn ended first), or the state
    /// an ACP child session reports (`idle`, ...).
    pub state: String,
    /// How the agent reported it.
    pub via: SubagentVia,
    pub started_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Tool calls the child session made (reported through `subagent_update` only).
    #[serde(default)]
    pub tool_calls: u64,
}

/// A setting the agent's session offers, with its current value (ACP `configOptions`, a
/// `select`; option groups are flattened).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigOptionInfo {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// `mode`, `model`, `thought_level`, or the agent's own (or none).
    #[serde(default)]
    pub category: Option<String>,
    pub current_value: String,
    pub values: Vec<ConfigValueInfo>,
}

/// One value a config option can take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigValueInfo {
    pub value: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
}

/// What an agent spent (`AgentInfo.spend`): tokens from the usage its agent's prompt answers
/// carry, cost from its `usage_update`s; `null` where it reported none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpendInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// A budget for an agent and its whole subtree: limits in tokens and/or cost (in the
/// currency the agents report). At 100 % of either, no new turn starts in the tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Cancel the turns running in the tree at 100 % too (cause `budget`), not only refuse new
    /// ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard: bool,
}

/// The `details` of an `unsupported_version` refusal: the protocols the daemon serves, so a
/// client can tell an older daemon from a newer one without reading the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnsupportedVersionInfo {
    /// The protocol the daemon speaks (its newest).
    pub protocol_version: u32,
    /// The oldest protocol of a client it serves.
    pub oldest_protocol_version: u32,
}

/// The `details` of a `budget_exhausted` refusal: the budgeted agent, its budget, and what
/// each agent of its tree spent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetExhaustedInfo {
    /// The agent whose budget is spent (the nearest ancestor-or-self with a budget).
    pub agent_id: String,
    pub budget: Budget,
    pub spend: BudgetSpendInfo,
    /// Set when the budget is one the hub that made `agentId` here holds it to (not one set
    /// here): the hub's agent it is a subagent of, in whose tree there the budget is spent.
    /// It is raised on the hub (`set_budget` here would not lift it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
}

/// What a budgeted tree spent, in total and by agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpendInfo {
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    pub currency: Option<String>,
    /// Each agent of the tree and what it spent.
    pub agents: Vec<AgentSpendInfo>,
}

/// One agent's spend in a `budget_exhausted` refusal.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpendInfo {
    pub agent_id: String,
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    pub currency: Option<String>,
}

/// What an agent and its whole subtree spent (`AgentInfo.treeSpend`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TreeSpendInfo {
    /// The sum of what was reported (`null`: no agent of the tree reported any).
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    pub currency: Option<String>,
    /// How many agents the tree holds (itself, its subagents at any depth, archived too).
    pub agents: u64,
    /// The agents of the tree that reported nothing (their spend is unknown).
    pub unknown: Vec<String>,
}

/// An agent waiting for its provider's usage limit to reset (`AgentInfo.limited`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitedInfo {
    /// When the turn hit the limit.
    pub at: String,
    /// When the provider said the limit resets (`null`: it did not say; drover backs off).
    pub reset_at: Option<String>,
    /// When the prompt is sent again.
    pub retry_at: String,
    /// What the agent said.
    pub error: String,
}

/// Why an agent's last start failed (the words are in `AgentInfo.error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartFailureInfo {
    pub at: String,
    /// Set when what the agent needs is a sign-in: the ways its provider offers (attention
    /// `auth_required`). Sign in with `sign_in` (`drover login PROVIDER`).
    pub sign_in: Option<Vec<AuthMethod>>,
}

/// A message in an agent's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedMessageInfo {
    pub id: String,
    pub text: String,
    pub delivery: Delivery,
    pub queued_at: String,
}

/// An agent's runtime, as `AgentInfo.runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    pub state: RuntimeState,
    /// The agent process (its process group leader), while there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the idle runtime hibernates; `null` while busy or cold, or when it never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernate_at: Option<String>,
    /// How many processes its tree holds: only in the `agent` answer (measured then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// The resident memory of its tree, in bytes: only in the `agent` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// When the runtime tries to start again by itself after a failed start (1 s, 5 s, then
    /// 30 s after the first, second and third failures; then only on request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// How many background processes keep the otherwise idle runtime live: work the agent
    /// started itself and left running (a background shell, a dev server, a build), which
    /// hibernation would end. While above 0 the runtime does not hibernate and is not
    /// chosen to make room under `max_live`.
    #[serde(default)]
    pub background_processes: u64,
    /// What the agent's process said of itself at its last start (`initialize`): only in the
    /// `agent` answer, `null` before any start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentAdvertised>,
}

/// What an agent's process said of itself in its ACP `initialize` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentAdvertised {
    /// `agentInfo.name`, `title` and `version`, where it gave them.
    pub name: Option<String>,
    pub title: Option<String>,
    pub version: Option<String>,
    /// The ACP version it answered with (drover speaks 1; another one fails the start).
    pub protocol_version: u64,
    /// What it can do beyond prompts: `load`, `resume`, `close`, `list`, `fork` (sessions),
    /// `image`, `audio`, `embedded-context` (prompts), `mcp-http`, `mcp-sse`.
    pub capabilities: Vec<String>,
}

impl Default for RuntimeInfo {
    fn default() -> RuntimeInfo {
        RuntimeInfo {
            state: RuntimeState::Cold,
            pid: None,
            hibernate_at: None,
            processes: None,
            rss_bytes: None,
            retry_at: None,
            background_processes: 0,
            agent: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceInfo {
    pub id: String,
    pub kind: WorkspaceKind,
    pub path: String,
    pub name: String,
    pub created_at: String,
    pub archived_at: Option<String>,
    /// `null`: no agents.
    pub activity: Option<WorkspaceActivity>,
    /// For a worktree drover made: where it comes from.
    pub worktree: Option<WorktreeInfo>,
    /// The host it is on; absent for this daemon's own machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Where a worktree workspace comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeInfo {
    /// The source checkout it was made from.
    pub source: String,
    pub branch: String,
    /// What the branch was made from, as named.
    pub base: String,
    pub base_commit: String,
    /// The agent that made it over MCP; absent when a user did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// One setup or teardown command of a worktree, as it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandRunInfo {
    pub command: String,
    /// `null` when it was killed (by a signal, or for running out of time).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// stdout and stderr as they came, the last 64 KiB.
    pub output: String,
    pub duration_ms: u64,
}

/// What a worktree holds that exists nowhere else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeStatusInfo {
    pub path: String,
    pub branch: String,
    /// The folder vanished outside drover.
    pub missing: bool,
    /// `git status --porcelain` entries (`XY path`), at most 200.
    pub uncommitted: Vec<String>,
    pub uncommitted_count: usize,
    /// Commits reachable from no other branch, remote or the base (`abc1234 subject`), at
    /// most 200.
    pub unpushed: Vec<String>,
    pub unpushed_count: usize,
}

impl WorktreeStatusInfo {
    /// Nothing would be lost by removing the worktree.
    pub fn is_clean(&self) -> bool {
        self.uncommitted_count == 0 && self.unpushed_count == 0
    }

    /// "2 uncommitted changes (M a.txt, ?? b.txt) and 1 unpushed commit on `drover/x` (…)".
    pub fn summary(&self) -> String {
        fn some(items: &[String]) -> String {
            let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
            let more = if items.len() > shown.len() {
                ", …"
            } else {
                ""
            };
            format!("{}{more}", shown.join(", "))
        }
        let plural = |n: usize, one: &str, many: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {many}")
            }
        };
        let mut parts = Vec::new();
        if self.uncommitted_count > 0 {
            parts.push(format!(
                "{} ({})",
                plural(
                    self.uncommitted_count,
                    "uncommitted change",
                    "uncommitted changes"
                ),
                some(&self.uncommitted)
            ));
        }
        if self.unpushed_count > 0 {
            parts.push(format!(
                "{} on `{}` ({})",
                plural(self.unpushed_count, "unpushed commit", "unpushed commits"),
                self.branch,
                some(&self.unpushed)
            ));
        }
        if parts.is_empty() {
            "nothing uncommitted or unpushed".to_string()
        } else {
            parts.join(" and ")
        }
    }
}

/// What removing a worktree did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeRemovalInfo {
    /// What it held just before (what `force` discarded, if anything).
    pub status: WorktreeStatusInfo,
    pub teardown: Vec<CommandRunInfo>,
    /// The folder was removed (`false` when it had vanished already).
    pub removed: bool,
    /// The branch was deleted (only when every commit on it is reachable elsewhere).
    pub branch_deleted: bool,
}

/// A job as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// `job-<n>`, unique in the daemon's home.
    pub id: String,
    /// The agent that owns it.
    pub agent_id: String,
    pub command: String,
    pub cwd: String,
    pub status: JobStatus,
    /// `user`, `agent:<id>`, `terminal`.
    pub started_by: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// How it ended, for people (`exit status 1`, `signal 15 (SIGTERM)`).
    pub exit: Option<String>,
    /// Why drover killed it.
    pub killed_by: Option<KillCause>,
    pub duration_ms: Option<u64>,
    /// Bytes of output so far.
    pub output_bytes: u64,
    pub pid: u32,
    pub timeout_s: Option<u64>,
    pub notify_on_exit: bool,
    /// Opened by the agent as an ACP client terminal.
    pub terminal: bool,
}

/// A workspace terminal as clients see it: a shell on a PTY of the daemon's host (not an ACP
/// client terminal, which is an agent's job: see `JobInfo.terminal`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminalInfo {
    /// `term-<n>`, unique while the daemon runs.
    pub id: String,
    pub workspace_id: String,
    /// The workspace's directory, where the shell started.
    pub cwd: String,
    /// The shell's program.
    pub shell: String,
    pub pid: u32,
    pub cols: u16,
    pub rows: u16,
    pub created_at: String,
    /// Bytes it wrote so far (the next output's offset).
    pub output_bytes: u64,
}

/// One change to an agent's timeline (`op`: `item`, `append`, `patch`; see docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentUpdate {
    pub agent_id: String,
    pub timestamp: String,
    pub notification: Value,
    /// The agent's timeline revision after this update (absent on the items of an
    /// `agent_initialized` snapshot): an update whose revision is not above the snapshot's is
    /// already in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// A record an import brought in (or, in a dry run, would).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportedAgentInfo {
    /// Where it came from: the record's file (`import_paseo`), the session's id
    /// (`import_sessions`).
    pub source: String,
    /// Its id in the source (kept in the label `paseo.agent-id`, or `acp.session-id`).
    pub source_id: String,
    /// The new agent's id; `null` in a dry run.
    pub agent_id: Option<String>,
    pub provider: String,
    pub cwd: String,
    pub title: Option<String>,
    pub status: AgentStatus,
    pub archived: bool,
    /// The source id of its parent, when it comes in as a subagent.
    pub parent_source_id: Option<String>,
    /// Whether its next message continues the provider's session (`session/load`).
    pub resumes: bool,
    /// How it came in, when the user should know (e.g. as a root, its parent skipped).
    pub note: Option<String>,
}

/// A record an import left alone, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportSkip {
    pub source: String,
    /// Its id in the source, when it could be read.
    pub source_id: Option<String>,
    pub reason: String,
}

/// A notification sink (`[[notify.sink]]` in `config.toml`) and how its deliveries went since
/// the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifySinkInfo {
    pub name: String,
    pub kind: SinkKind,
    /// Where it goes, without what could be a secret: a URL's scheme and host, a command's
    /// program.
    pub target: String,
    /// The events it wants.
    pub events: Vec<NotifyEvent>,
    /// Also watched agents and every subagent's own events.
    pub all: bool,
    /// Notifications delivered (summaries and samples included).
    pub sent: u64,
    pub last_sent_at: Option<String>,
    /// Deliveries that failed after every retry.
    pub failed: u64,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    /// Notifications dropped because its queue was full.
    pub dropped: u64,
    /// Notifications held back by its limit and counted in a summary instead.
    pub summarized: u64,
}

/// How one sink took a `notify_test` sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyTestResult {
    pub sink: String,
    pub delivered: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInfo {
    pub name: String,
    pub label: String,
    pub command: Vec<String>,
    pub available: bool,
    /// Where the command was found, or why it is unavailable.
    pub detail: String,
    /// Whether its agents can sign in, as far as the daemon knows.
    #[serde(default)]
    pub sign_in: ProviderSignIn,
    /// Its warm spares (`warm` in `config.toml`): processes started and initialized, waiting
    /// for the next start of one of its agents.
    #[serde(default)]
    pub warm: ProviderWarm,
}

/// A provider's warm spares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderWarm {
    /// Spares ready now.
    pub ready: u32,
    /// Spares it keeps (`warm`; 0: none).
    pub wanted: u32,
}

/// A provider's sign-in, as the daemon last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSignIn {
    pub state: SignInState,
    /// The ways it offers (from its last `initialize`).
    #[serde(default)]
    pub methods: Vec<AuthMethod>,
    /// What to do, for people (e.g. `drover login codex`, or the variable to set).
    #[serde(default)]
    pub how: Option<String>,
}

/// What the daemon sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "type",
    content = "payload",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum DaemonMessage {
    Welcome {
        daemon_version: String,
        protocol_version: u32,
        session_id: String,
        /// The daemon's `[runtimes] max_live` (absent: no ceiling): a hub places `--host auto`
        /// agents by it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_live: Option<u32>,
    },
    /// Every agent (no history, no runtime started) and every workspace with its activity.
    SessionState {
        agents: Vec<AgentInfo>,
        workspaces: Vec<WorkspaceInfo>,
        /// The hosts this daemon links to (absent when there are none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hosts: Vec<HostInfo>,
    },
    AgentInitialized(Answer<answers::AgentInitialized>),
    /// An agent changed (status, title, labels, archive, detach, attention, config). To every
    /// session.
    AgentStatus {
        agent: AgentInfo,
    },
    /// A timeline change. Only to sessions that initialized the agent.
    AgentUpdate(AgentUpdate),
    /// A workspace was registered or its activity changed.
    WorkspaceUpdate {
        workspace: Option<WorkspaceInfo>,
        workspace_id: String,
        activity: Option<WorkspaceActivity>,
    },
    TimelinePage(Answer<answers::TimelinePage>),
    AgentCreated(Answer<answers::AgentCreated>),
    MessageQueued(Answer<answers::MessageQueued>),
    /// The answer to `take_notices`: every notice not acknowledged yet, oldest first.
    Notices(Answer<answers::Notices>),
    /// One of this daemon's agents told an agent of the hub something (see `take_notices`).
    NoticeQueued {
        notice: NoticeInfo,
    },
    /// A request that has no other answer succeeded.
    Ok(Answer<answers::Ok>),
    Archived(Answer<answers::Archived>),
    ChildrenArchived(Answer<answers::ChildrenArchived>),
    Providers(Answer<answers::Providers>),
    /// The answer to `notify_status`: every sink of `[notify]`, in the file's order.
    NotifyStatus(Answer<answers::NotifyStatus>),
    /// The answer to `notify_test`: how the sample went, sink by sink.
    NotifyTested(Answer<answers::NotifyTested>),
    /// The answer to `sign_in`: the agents started again.
    SignedIn(Answer<answers::SignedIn>),
    /// The answer to `import_paseo` and `import_sessions`: what came in (or, in a dry run,
    /// would), and what not.
    Imported(Answer<answers::Imported>),
    Agents(Answer<answers::Agents>),
    /// The answer to `list_hosts`, `add_host` and `remove_host`.
    Hosts(Answer<answers::Hosts>),
    /// A host's link changed (reachable, unreachable since, version, counts), or it was
    /// removed (`host: null`). To every session.
    HostUpdate {
        name: String,
        host: Option<HostInfo>,
    },
    /// The answer to `get_agent`: its `runtime` says what its process tree holds now.
    Agent(Answer<answers::Agent>),
    Idle(Answer<answers::Idle>),
    Workspaces(Answer<answers::Workspaces>),
    WorktreeCreated(Answer<answers::WorktreeCreated>),
    WorktreeStatus(Answer<answers::WorktreeStatus>),
    /// The answer to `workspace_changes`.
    WorkspaceChanges(Answer<answers::WorkspaceChanges>),
    WorkspaceArchived(Answer<answers::WorkspaceArchived>),
    /// The answer to `start_job` and `kill_job`.
    Job(Answer<answers::Job>),
    Jobs(Answer<answers::Jobs>),
    /// The answer to `job_output`.
    JobOutput(Answer<answers::JobOutput>),
    JobWaited(Answer<answers::JobWaited>),
    /// A job started or ended. To every session.
    JobUpdate {
        job: JobInfo,
    },
    /// The answer to `follow_job`: the job now, and the offset its pushed output starts from.
    JobFollowed(Answer<answers::JobFollowed>),
    /// The answer to `unfollow_job`.
    JobUnfollowed(Answer<answers::JobUnfollowed>),
    /// Output of a job this session follows (`follow_job`), pushed as it is written.
    JobOutputUpdate {
        job_id: String,
        /// The offset of `text`'s first byte: the previous update's `nextOffset`, later by
        /// `skipped` bytes when those were no longer kept.
        offset: u64,
        text: String,
        /// Where the next update starts (it never splits a UTF-8 character).
        next_offset: u64,
        /// Bytes the job has written so far.
        end: u64,
        /// Bytes before `offset` this session had not had and that are no longer kept.
        skipped: u64,
        /// The job ended and this is its last update: the follow is over.
        eof: bool,
    },
    /// The answer to `create_terminal`, `resize_terminal` and `close_terminal`.
    Terminal(Answer<answers::Terminal>),
    /// The answer to `list_terminals`.
    Terminals(Answer<answers::Terminals>),
    /// The answer to `attach_terminal`: the terminal now, and the offset its pushed output
    /// starts from.
    TerminalAttached(Answer<answers::TerminalAttached>),
    /// The answer to `detach_terminal`.
    TerminalDetached(Answer<answers::TerminalDetached>),
    /// Output of a workspace terminal this session is attached to, pushed as it is written.
    TerminalOutput {
        terminal_id: String,
        /// The byte offset of `data`'s first byte in everything the terminal wrote (later
        /// than the previous event's `nextOffset` when this session lagged past what is kept).
        offset: u64,
        /// The bytes as UTF-8 text; a character is never split between two events (bytes
        /// that are not UTF-8 come as U+FFFD).
        data: String,
        /// Where the next event starts.
        next_offset: u64,
    },
    /// A workspace terminal this session is attached to ended (its shell exited, or it was
    /// closed); after its last `terminal_output`.
    TerminalExit {
        terminal_id: String,
        /// How its shell ended, for people (`exit status 0`, `signal 9 (SIGKILL)`).
        status: String,
        exit_code: Option<i32>,
    },
    /// A workspace terminal was opened, resized, or ended (`terminal: null`). To every
    /// session.
    TerminalUpdate {
        terminal_id: String,
        terminal: Option<TerminalInfo>,
    },
    /// A request failed. The connection stays open.
    RequestError(Answer<answers::RequestError>),
    /// This session fell behind and events were dropped: re-read with `list_agents` and
    /// re-initialize the agents it shows.
    ResyncRequired {
        reason: String,
    },
    /// The answer to `create_schedule`, `pause_schedule`, `resume_schedule`.
    Schedule(Answer<answers::Schedule>),
    /// The answer to `list_schedules`.
    Schedules(Answer<answers::Schedules>),
    ScheduleDeleted(Answer<answers::ScheduleDeleted>),
    /// A schedule was made, changed (paused, resumed, fired) or deleted (`schedule: null`).
    /// To every session.
    ScheduleUpdate {
        schedule_id: String,
        schedule: Option<ScheduleInfo>,
    },
}

/// A schedule as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleInfo {
    /// `sched-<n>`.
    pub id: String,
    pub title: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// The agent that made it over MCP; `null` when a user did.
    pub created_by: Option<String>,
    /// The agent it sends its prompt to (a followup), for a schedule that does not create one.
    pub agent_id: Option<String>,
    /// The agent it creates each time (`provider`, `cwd`, `workspaceId`, `parentAgentId`, ...).
    pub new_agent: Option<Value>,
    pub prompt: String,
    /// As stored: `{kind: once, at}`, `{kind: every, everySecs, from}`,
    /// `{kind: cron, expr, timeZone}`.
    pub cadence: Value,
    /// One line for people: `every 30m`, `cron 0 9 * * 1-5 (Europe/Paris)`.
    pub description: String,
    pub state: ScheduleState,
    pub next_run_at: Option<String>,
    /// The last runs, oldest first (at most 20).
    pub runs: Vec<ScheduleRunInfo>,
}

/// One time a schedule fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRunInfo {
    /// The occurrence it ran for.
    pub due_at: String,
    /// When its prompt was durably queued (or the attempt failed).
    pub fired_at: String,
    /// The queued message.
    pub message_id: Option<String>,
    /// The agent it went to, or the one it created.
    pub agent_id: Option<String>,
    pub error: Option<String>,
    /// Settled at boot from a delivery a crash interrupted.
    pub recovered: bool,
}

impl DaemonMessage {
    /// The `requestId` an answer carries (`None` for events and for answers to requests that
    /// had none).
    pub fn request_id(&self) -> Option<&str> {
        match self {
            DaemonMessage::AgentInitialized(Answer { request_id, .. })
            | DaemonMessage::TimelinePage(Answer { request_id, .. })
            | DaemonMessage::AgentCreated(Answer { request_id, .. })
            | DaemonMessage::MessageQueued(Answer { request_id, .. })
            | DaemonMessage::Notices(Answer { request_id, .. })
            | DaemonMessage::Ok(Answer { request_id, .. })
            | DaemonMessage::Archived(Answer { request_id, .. })
            | DaemonMessage::ChildrenArchived(Answer { request_id, .. })
            | DaemonMessage::Providers(Answer { request_id, .. })
            | DaemonMessage::NotifyStatus(Answer { request_id, .. })
            | DaemonMessage::NotifyTested(Answer { request_id, .. })
            | DaemonMessage::SignedIn(Answer { request_id, .. })
            | DaemonMessage::Imported(Answer { request_id, .. })
            | DaemonMessage::Agents(Answer { request_id, .. })
            | DaemonMessage::Hosts(Answer { request_id, .. })
            | DaemonMessage::Agent(Answer { request_id, .. })
            | DaemonMessage::Idle(Answer { request_id, .. })
            | DaemonMessage::Workspaces(Answer { request_id, .. })
            | DaemonMessage::WorktreeCreated(Answer { request_id, .. })
            | DaemonMessage::WorktreeStatus(Answer { request_id, .. })
            | DaemonMessage::WorkspaceChanges(Answer { request_id, .. })
            | DaemonMessage::WorkspaceArchived(Answer { request_id, .. })
            | DaemonMessage::Job(Answer { request_id, .. })
            | DaemonMessage::Jobs(Answer { request_id, .. })
            | DaemonMessage::JobOutput(Answer { request_id, .. })
            | DaemonMessage::JobWaited(Answer { request_id, .. })
            | DaemonMessage::JobFollowed(Answer { request_id, .. })
            | DaemonMessage::JobUnfollowed(Answer { request_id, .. })
            | DaemonMessage::Terminal(Answer { request_id, .. })
            | DaemonMessage::Terminals(Answer { request_id, .. })
            | DaemonMessage::TerminalAttached(Answer { request_id, .. })
            | DaemonMessage::TerminalDetached(Answer { request_id, .. })
            | DaemonMessage::RequestError(Answer { request_id, .. })
            | DaemonMessage::Schedule(Answer { request_id, .. })
            | DaemonMessage::Schedules(Answer { request_id, .. })
            | DaemonMessage::ScheduleDeleted(Answer { request_id, .. }) => request_id.as_deref(),
            _ => None,
        }
    }
}

/// What a workspace changed against its base (`workspace_changes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceChangesInfo {
    /// What was compared against: a worktree's base commit, else `HEAD`.
    pub base: String,
    pub files: Vec<ChangedFileInfo>,
    /// Files or diff text were left out to stay within the bounds (1000 files, 512 KiB).
    pub truncated: bool,
}

/// One changed file of [`WorkspaceChangesInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedFileInfo {
    pub path: String,
    pub status: ChangeStatus,
    /// Lines added and removed; `null` for binary and untracked files.
    pub added: Option<u64>,
    pub removed: Option<u64>,
    /// The file's unified diff (empty for untracked files).
    pub diff: String,
}

/// The JSON Schema of both directions (and of the timeline's fixed values), as committed in
/// `schema/protocol.json`.
pub fn schema() -> Value {
    let client = schemars::schema_for!(ClientRequest);
    let daemon = schemars::schema_for!(DaemonMessage);
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "drover client protocol",
        "version": PROTOCOL_VERSION,
        "client": client,
        "daemon": daemon,
        // Timeline items travel as JSON (`AgentUpdate.notification`); their vocabulary is
        // still fixed, and listed here.
        "timeline": {
            "itemKind": schemars::schema_for!(ItemKind),
            "turnEnd": schemars::schema_for!(TurnEnd),
            "cancelCause": schemars::schema_for!(CancelCause),
            "interruptCause": schemars::schema_for!(InterruptCause),
        },
    })
}

/// Why a client frame could not be decoded, with the stable code to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// `invalid_message` (not JSON, wrong field types, missing fields) or `unknown_type`.
    pub code: ErrorCode,
    pub message: String,
    /// The `requestId` of the frame, if it had a readable one.
    pub request_id: Option<String>,
}

/// Decodes one client frame, telling an unknown `type` apart from a malformed message.
pub fn decode_client(text: &str) -> Result<ClientRequest, DecodeError> {
    let value: Value = serde_json::from_str(text).map_err(|e| DecodeError {
        code: ErrorCode::InvalidMessage,
        message: format!("not JSON: {e}"),
        request_id: None,
    })?;
    let request_id = value
        .get("requestId")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(kind) = value
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Err(DecodeError {
            code: ErrorCode::InvalidMessage,
            message: "a message needs a string `type`".to_string(),
            request_id,
        });
    };
    if !CLIENT_TYPES.contains(&kind.as_str()) {
        return Err(DecodeError {
            code: ErrorCode::UnknownType,
            message: format!(
                "unknown message type `{}`",
                kind.chars().take(64).collect::<String>()
            ),
            request_id,
        });
    }
    serde_json::from_value(value).map_err(|e| DecodeError {
        code: ErrorCode::InvalidMessage,
        message: format!("invalid `{kind}`: {e}"),
        request_id,
    })
}

/// Every client message type.
pub const CLIENT_TYPES: &[&str] = &[
    "hello",
    "initialize_agent_request",
    "fetch_timeline",
    "create_agent",
    "send_message",
    "cancel",
    "archive",
    "unarchive",
    "detach",
    "archive_idle_children",
    "answer_permission",
    "set_mode",
    "set_model",
    "set_config_option",
    "set_title",
    "set_budget",
    "clear_attention",
    "workspace_changes",
    "list_providers",
    "get_agent",
    "list_agents",
    "list_hosts",
    "add_host",
    "remove_host",
    "ping",
    "wait_idle",
    "list_workspaces",
    "create_worktree",
    "get_worktree_status",
    "archive_workspace",
    "create_schedule",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "delete_schedule",
    "start_job",
    "list_jobs",
    "job_output",
    "follow_job",
    "unfollow_job",
    "kill_job",
    "wait_job",
    "restart_agent",
    "sign_in",
    "import_paseo",
    "import_sessions",
    "watching",
    "notify_status",
    "notify_test",
    "take_notices",
    "ack_notices",
    "set_upstream_gate",
    "set_upstream_budget",
    "create_terminal",
    "list_terminals",
    "attach_terminal",
    "detach_terminal",
    "terminal_input",
    "resize_terminal",
    "close_terminal",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_tells_errors_apart() {
        let ok = decode_client(
            r#"{"type":"archive","agentId":"a","stopActivity":true,"requestId":"r1"}"#,
        )
        .expect("valid");
        assert_eq!(ok.request_id(), Some("r1"));
        let e = decode_client("{nope").expect_err("not json");
        assert_eq!(e.code, ErrorCode::InvalidMessage);
        let e =
            decode_client(r#"{"type":"launch_missiles","requestId":"r2"}"#).expect_err("unknown");
        assert_eq!(
            (e.code, e.request_id.as_deref()),
            (ErrorCode::UnknownType, Some("r2"))
        );
        let e = decode_client(r#"{"type":"archive","agentId":7,"requestId":"r3"}"#)
            .expect_err("wrong type");
        assert_eq!(
            (e.code, e.request_id.as_deref()),
            (ErrorCode::InvalidMessage, Some("r3"))
        );
        assert!(e.message.contains("archive"), "{}", e.message);
        let e = decode_client(r#"{"type":"send_message","agentId":"a","text":"x","typo":1}"#)
            .expect_err("unknown field");
        assert!(e.message.contains("typo"), "{}", e.message);
    }

    /// A cold agent (most of a fleet) is sent with no `null` but the lifecycle's own fields,
    /// and reads back the same: a new optional field that forgets to be left out when `None`
    /// fails here.
    #[test]
    fn an_agent_leaves_out_what_is_null() {
        let cold = serde_json::json!({
            "id": "a1", "status": "idle", "createdAt": "2026-12-01T10:00:00Z",
            "updatedAt": "2026-12-01T10:00:00Z", "lastActivityAt": "2026-12-01T10:00:00Z",
            "type": "codex", "sessionId": null, "error": null, "currentModeId": null,
            "availableModes": null, "title": null, "cwd": "/r", "parentAgentId": null,
            "workspaceId": "w1", "labels": {}, "archivedAt": null, "requiresAttention": false,
            "attentionReason": null, "autoArchive": false, "permissionPolicy": "ask",
            "spend": {}, "runtime": {"state": "cold", "backgroundProcesses": 0},
        });
        let info: AgentInfo = serde_json::from_value(cold.clone()).expect("a cold agent");
        assert_eq!(info.session_id, None);
        assert_eq!(info.runtime.pid, None);
        let sent = serde_json::to_value(&info).expect("encodes");
        assert_eq!(sent, cold, "{sent}");
    }

    #[test]
    fn a_flattened_request_still_refuses_unknown_fields() {
        let ok = decode_client(
            r#"{"type":"create_worktree","repository":"/r","name":"n","base":"main","requestId":"r1"}"#,
        )
        .expect("valid");
        let ClientMessage::CreateWorktree(r) = ok.message else {
            panic!("not create_worktree: {ok:?}");
        };
        assert_eq!(
            (r.repository.as_str(), r.worktree.name.as_deref()),
            ("/r", Some("n"))
        );
        assert_eq!(
            (r.worktree.branch, r.worktree.base.as_deref()),
            (None, Some("main"))
        );
        let e = decode_client(r#"{"type":"create_worktree","repository":"/r","typo":1}"#)
            .expect_err("unknown field");
        assert_eq!(e.code, ErrorCode::InvalidMessage);
        assert!(e.message.contains("typo"), "{}", e.message);
    }

    #[test]
    fn every_client_type_is_listed() {
        let schema = serde_json::to_string(&schemars::schema_for!(ClientMessage)).expect("schema");
        for t in CLIENT_TYPES {
            assert!(
                schema.contains(&format!("\"{t}\"")),
                "{t} missing from the schema"
            );
        }
    }
}

/// How to reach a host: an `ssh://[user@]host[:port]` target, or a command of its own that
/// ends in `drover connect --stdio` (`kubectl exec -i POD -- drover connect --stdio`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostConfig {
    /// Its name in this fleet: lower-case letters, digits and `-`.
    pub name: String,
    /// `ssh://[user@]host[:port]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// The private key `ssh -i` uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// More `ssh -o` options, as `Key=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_options: Vec<String>,
    /// Instead of `ssh`: the command (program and arguments) whose stdin and stdout are the
    /// link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
}

/// What an agent of this daemon told an agent of the hub that links to it, kept in the
/// outbox until the hub acknowledges it (`ack_notices`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NoticeInfo {
    /// The id of the message it becomes in the hub agent's inbox (queued once, however often
    /// it is offered).
    pub id: String,
    pub at: String,
    /// This daemon's agent.
    pub from: String,
    /// The hub's agent.
    pub to: String,
    pub delivery: Delivery,
    pub text: String,
}

/// A host of the fleet as the hub sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostInfo {
    pub name: String,
    /// `ssh://...` or the link command, for people.
    pub target: String,
    /// `connecting`, `reachable`, `unreachable`, or `incompatible` (another protocol version:
    /// see `error`).
    pub state: HostState,
    /// Since when it is in that state.
    pub since: String,
    /// Why it is not reachable.
    #[serde(default)]
    pub error: Option<String>,
    /// The remote daemon's version, once reached.
    #[serde(default)]
    pub version: Option<String>,
    /// Its agents (archived ones not counted) and how many run a process now.
    pub agents: u32,
    pub live: u32,
    /// Its daemon's `[runtimes] max_live` (`null`: no ceiling, or not reached yet).
    #[serde(default)]
    pub max_live: Option<u32>,
}
