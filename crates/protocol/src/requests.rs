//! The client's requests: each its own struct, named after its `type`, inside the
//! [`ClientRequest`] envelope that carries the `requestId` (once, for every request). On the
//! wire the envelope's `requestId`, the `type` and the request's fields are one flat object.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    Budget, Delivery, HostConfig, NewWorktree, OnInterrupt, OnLimit, PermissionPolicy,
    ScheduleNewAgent, ScheduleWhen,
};

/// One client frame: a request and the correlation id its answer echoes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientRequest {
    /// Echoed in the answer (and in a `request_error`); absent on `hello`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(flatten)]
    pub message: ClientMessage,
}

impl ClientRequest {
    /// `message` without a correlation id.
    pub fn new(message: impl Into<ClientMessage>) -> ClientRequest {
        ClientRequest {
            request_id: None,
            message: message.into(),
        }
    }

    /// `message` with the correlation id `request_id`.
    pub fn with_id(
        request_id: impl Into<String>,
        message: impl Into<ClientMessage>,
    ) -> ClientRequest {
        ClientRequest {
            request_id: Some(request_id.into()),
            message: message.into(),
        }
    }

    /// The correlation id, if the request has one.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
}

/// What a client sends: one variant per request, tagged by `type`, each its own struct.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    Hello(Hello),
    InitializeAgentRequest(InitializeAgentRequest),
    FetchTimeline(FetchTimeline),
    CreateAgent(CreateAgent),
    SendMessage(SendMessage),
    Cancel(Cancel),
    Archive(Archive),
    Unarchive(Unarchive),
    Detach(Detach),
    ArchiveIdleChildren(ArchiveIdleChildren),
    AnswerPermission(AnswerPermission),
    SetMode(SetMode),
    SetModel(SetModel),
    SetConfigOption(SetConfigOption),
    SetTitle(SetTitle),
    SetBudget(SetBudget),
    ClearAttention(ClearAttention),
    WorkspaceChanges(WorkspaceChanges),
    ListProviders(ListProviders),
    GetAgent(GetAgent),
    ListHosts(ListHosts),
    AddHost(AddHost),
    RemoveHost(RemoveHost),
    Ping(Ping),
    ListAgents(ListAgents),
    WaitIdle(WaitIdle),
    ListWorkspaces(ListWorkspaces),
    CreateWorktree(CreateWorktree),
    GetWorktreeStatus(GetWorktreeStatus),
    ArchiveWorkspace(ArchiveWorkspace),
    CreateSchedule(CreateSchedule),
    ListSchedules(ListSchedules),
    PauseSchedule(PauseSchedule),
    ResumeSchedule(ResumeSchedule),
    DeleteSchedule(DeleteSchedule),
    StartJob(StartJob),
    ListJobs(ListJobs),
    JobOutput(JobOutput),
    FollowJob(FollowJob),
    UnfollowJob(UnfollowJob),
    KillJob(KillJob),
    WaitJob(WaitJob),
    RestartAgent(RestartAgent),
    SignIn(SignIn),
    ImportPaseo(ImportPaseo),
    ImportSessions(ImportSessions),
    Watching(Watching),
    NotifyStatus(NotifyStatus),
    NotifyTest(NotifyTest),
    TakeNotices(TakeNotices),
    AckNotices(AckNotices),
    SetUpstreamGate(SetUpstreamGate),
    SetUpstreamBudget(SetUpstreamBudget),
    CreateTerminal(CreateTerminal),
    ListTerminals(ListTerminals),
    AttachTerminal(AttachTerminal),
    DetachTerminal(DetachTerminal),
    TerminalInput(TerminalInput),
    ResizeTerminal(ResizeTerminal),
    CloseTerminal(CloseTerminal),
}

macro_rules! into_message {
    ($($name:ident,)*) => {
        $(impl From<$name> for ClientMessage {
            fn from(request: $name) -> ClientMessage {
                ClientMessage::$name(request)
            }
        })*
    };
}

into_message! {
    Hello,
    InitializeAgentRequest,
    FetchTimeline,
    CreateAgent,
    SendMessage,
    Cancel,
    Archive,
    Unarchive,
    Detach,
    ArchiveIdleChildren,
    AnswerPermission,
    SetMode,
    SetModel,
    SetConfigOption,
    SetTitle,
    SetBudget,
    ClearAttention,
    WorkspaceChanges,
    ListProviders,
    GetAgent,
    ListHosts,
    AddHost,
    RemoveHost,
    Ping,
    ListAgents,
    WaitIdle,
    ListWorkspaces,
    CreateWorktree,
    GetWorktreeStatus,
    ArchiveWorkspace,
    CreateSchedule,
    ListSchedules,
    PauseSchedule,
    ResumeSchedule,
    DeleteSchedule,
    StartJob,
    ListJobs,
    JobOutput,
    FollowJob,
    UnfollowJob,
    KillJob,
    WaitJob,
    RestartAgent,
    SignIn,
    ImportPaseo,
    ImportSessions,
    Watching,
    NotifyStatus,
    NotifyTest,
    TakeNotices,
    AckNotices,
    SetUpstreamGate,
    SetUpstreamBudget,
    CreateTerminal,
    ListTerminals,
    AttachTerminal,
    DetachTerminal,
    TerminalInput,
    ResizeTerminal,
    CloseTerminal,
}

/// First message of a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hello {
    pub client: String,
    #[serde(default)]
    pub version: Option<String>,
    pub protocol_version: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Required when the daemon listens beyond loopback.
    #[serde(default)]
    pub token: Option<String>,
    /// Also list archived agents in `session_state`.
    #[serde(default)]
    pub include_archived: bool,
}

/// Subscribes this session to the agent's updates, starting its runtime if needed, and
/// answers `agent_initialized` with its recent history. Idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InitializeAgentRequest {
    pub agent_id: String,
    /// How many recent timeline items to include (default 200).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// A page of an agent's timeline: items before `before`, after `after`, or the tail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchTimeline {
    pub agent_id: String,
    #[serde(default)]
    pub before: Option<u64>,
    #[serde(default)]
    pub after: Option<u64>,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The `create_agent` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAgent {
    pub provider: String,
    /// The working directory (absolute). Default: the workspace's directory.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub workspace_id: Option<String>,
    /// The first message (a followup).
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
    /// Reasoning effort (the agent's config option of category `thought_level`), such as
    /// `high`. Default: the provider's `effort`, else the agent's own.
    #[serde(default)]
    pub effort: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Makes the new agent a subagent of this one.
    #[serde(default)]
    pub parent_agent_id: Option<String>,
    #[serde(default)]
    pub auto_archive: bool,
    #[serde(default)]
    pub permission_policy: PermissionPolicy,
    /// What happens to a turn a daemon restart cuts off. Default: the provider's
    /// `on_interrupt`, else `notify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_interrupt: Option<OnInterrupt>,
    /// What happens when a turn hits the provider's usage limit. Default: the provider's
    /// `on_limit`, else `wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_limit: Option<OnLimit>,
    /// A budget for the agent and its whole subtree: at 100 % no new turn starts in the
    /// tree (`budget_exhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Run the agent in a new git worktree of the checkout at `cwd` (made first; archived
    /// with the agent when `autoArchive` archives it). Needs `cwd`, not `workspaceId`.
    #[serde(default)]
    pub worktree: Option<NewWorktree>,
    /// Create it on this host (`drover host add`; `cwd` and the checkout are that host's),
    /// or `auto`: the reachable host with the most free `max_live` slots. Default: this
    /// daemon's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Set by a hub creating the agent here for one of its own agents (MCP `create_agent`
    /// with `host`): what the new agent tells that agent waits in this daemon's outbox until
    /// the hub takes it (`take_notices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
}

/// The hub's agent a new agent is created for (see [`CreateAgent::upstream`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    /// An agent of the hub, not of this daemon.
    pub agent_id: String,
    /// The new agent is its subagent (its `parentAgentId`).
    #[serde(default)]
    pub subagent: bool,
    /// It is told how the new agent's first turn goes.
    #[serde(default)]
    pub notify_on_finish: bool,
    /// For a subagent: what its subtree here may spend under each budget of its parent's
    /// lineage on the hub, from its first turn on (see [`SetUpstreamBudget`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<Budget>,
}

/// What this daemon's agents told the hub's agents and the hub has not acknowledged
/// (answered by `notices`). A hub asks when its link is made; new ones come as
/// `notice_queued`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TakeNotices {}

/// The hub queued these notices in its agents' inboxes: they are dropped from the outbox
/// (answered by `ok`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AckNotices {
    pub ids: Vec<String>,
}

/// Sent by a hub for a subagent it made here (`upstream` of `create_agent`): whether its parent
/// on the hub is archived or has an archived ancestor (`archived`, that agent's id). While it
/// is, no turn starts for the subagent or below it here (`turn_blocked`). Answered by `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetUpstreamGate {
    pub agent_id: String,
    #[serde(default)]
    pub archived: Option<String>,
}

/// Sent by a hub for a subagent it made here (`upstream` of `create_agent`) whose parent's
/// lineage there has budgets: for each, what the subagent's subtree here may spend in all (what
/// it spent plus what the budgeted tree there has left). Each holds its tree here as a budget
/// set on it does, beside its own: the tightest holds, also while the hub is out of reach.
/// `budgets` empty: none applies any more. What a spent one held is woken when it is lifted.
/// Answered by `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetUpstreamBudget {
    pub agent_id: String,
    #[serde(default)]
    pub budgets: Vec<Budget>,
}

/// The `send_message` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendMessage {
    pub agent_id: String,
    pub text: String,
    #[serde(default = "default_delivery")]
    pub delivery: Delivery,
    /// Sent by a hub for its agent that created this one (`upstream` of `create_agent`): the
    /// message is that agent's, and it is told how the turn goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_upstream: bool,
}

/// Cancels the running turn; without `keepInbox` queued messages are dropped too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cancel {
    pub agent_id: String,
    #[serde(default)]
    pub keep_inbox: bool,
}

/// The `archive` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Archive {
    pub agent_id: String,
    /// Stop what still runs instead of refusing with `agent_active`.
    #[serde(default)]
    pub stop_activity: bool,
    /// Only say whether it would be refused: `agent_active` with the running work, or
    /// `archived` with nothing archived. Nothing changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// The `unarchive` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Unarchive {
    pub agent_id: String,
}

/// The `detach` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Detach {
    pub agent_id: String,
}

/// The `archive_idle_children` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArchiveIdleChildren {
    pub agent_id: String,
}

/// Answers a pending permission request: by option `kind` (`allow_once`, `allow_always`,
/// `reject_once`, `reject_always`) or `optionId`, or `cancel`. `seq` names the request
/// (its timeline item); without it the oldest pending one is answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnswerPermission {
    pub agent_id: String,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub option_id: Option<String>,
    #[serde(default)]
    pub cancel: bool,
}

/// The `set_mode` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetMode {
    pub agent_id: String,
    pub mode_id: String,
}

/// The `set_model` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetModel {
    pub agent_id: String,
    pub model_id: String,
}

/// Sets one of the agent's config options (`AgentInfo.configOptions`): recorded, and sent
/// to the live agent with ACP `session/set_config_option`. `configId` is the option's id,
/// or its category (`mode`, `model`, `thought_level`, or `effort` for `thought_level`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetConfigOption {
    pub agent_id: String,
    pub config_id: String,
    pub value: String,
}

/// Sets the agent's title; `null` or blank clears it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetTitle {
    pub agent_id: String,
    #[serde(default)]
    pub title: Option<String>,
}

/// Sets the budget of the agent and its subtree (`null` clears it). Raising it past the
/// tree's spend lets sends and subagent creations in the tree be accepted again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetBudget {
    pub agent_id: String,
    #[serde(default)]
    pub budget: Option<Budget>,
}

/// Marks what the agent asked attention for as seen (`finished`, `error`,
/// `interrupted`); a pending permission keeps its attention until it is answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClearAttention {
    pub agent_id: String,
}

/// The files a workspace (a git checkout or worktree) changed against its base, with a
/// unified diff each; read by the daemon, bounded in size and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceChanges {
    pub workspace_id: String,
}

/// The `list_providers` request. With `askSignIn`, a provider whose sign-in methods the
/// daemon does not know yet (none of its agents started since the daemon did) has its agent
/// started once to ask them first (as `sign_in` would): the answer lists them, and they are
/// known from then on. Answered `providers`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListProviders {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_sign_in: Option<String>,
}

/// One agent, with what its runtime's process tree holds now (processes, RSS).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetAgent {
    pub agent_id: String,
}

/// The hosts this daemon links to (`drover host ls`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListHosts {}

/// Adds a host (kept in `$DROVER_HOME/hosts.json`) and links to it at once. Answers
/// `hosts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddHost {
    pub host: HostConfig,
}

/// Forgets a host and closes its link (its agents keep running on their own daemon).
/// Answers `hosts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveHost {
    pub name: String,
}

/// Answers `ok`: the connection (a host link's keep-alive) works.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ping {}

/// Every agent, archived ones too if asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListAgents {
    #[serde(default)]
    pub include_archived: bool,
}

/// Answers `idle` when the agent is idle with nothing queued, or at the timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitIdle {
    pub agent_id: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Every workspace with its activity (archived ones too if asked).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListWorkspaces {
    #[serde(default)]
    pub include_archived: bool,
}

/// Makes a git worktree of the checkout at `repository` on a new branch, runs the
/// project's setup, and registers it as a `worktree` workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateWorktree {
    /// An existing git checkout (absolute path).
    pub repository: String,
    /// The worktree's own fields sit beside `repository` (one flat object).
    #[serde(flatten)]
    pub worktree: NewWorktree,
}

/// What a worktree workspace holds that exists nowhere else (uncommitted changes,
/// unpushed commits), and whether its folder vanished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetWorktreeStatus {
    pub workspace_id: String,
}

/// Archives a workspace and every agent in it. A worktree drover made is removed (after
/// its teardown); with uncommitted or unpushed work that is refused (`worktree_dirty`)
/// unless `force`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArchiveWorkspace {
    pub workspace_id: String,
    #[serde(default)]
    pub force: bool,
}

/// Schedules `prompt`: to the agent `agentId` (a followup each time), or to a new agent
/// made from `newAgent` each time; `when` says when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSchedule {
    pub prompt: String,
    pub when: ScheduleWhen,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub new_agent: Option<ScheduleNewAgent>,
    #[serde(default)]
    pub title: Option<String>,
}

/// Every schedule, or those of one agent (the ones targeting it or creating its
/// subagents).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListSchedules {
    #[serde(default)]
    pub agent_id: Option<String>,
}

/// Stops a schedule from firing until it is resumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PauseSchedule {
    pub schedule_id: String,
}

/// Arms a paused schedule again from now (what it missed while paused is skipped; a
/// `once` schedule whose time passed runs at once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeSchedule {
    pub schedule_id: String,
}

/// The `delete_schedule` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteSchedule {
    pub schedule_id: String,
}

/// Starts a job: `command` run by `sh -c` on behalf of the agent, in its cwd unless told,
/// in a process group of its own. Answered `job` once its record is durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartJob {
    pub agent_id: String,
    pub command: String,
    /// Absolute, or relative to the agent's cwd.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to the agents' environment allowlist.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill it after this many seconds (at most a week).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Tell the agent (a queued followup) when it ends. Default true.
    #[serde(default)]
    pub notify_on_exit: Option<bool>,
}

/// Every job, or the jobs of one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListJobs {
    #[serde(default)]
    pub agent_id: Option<String>,
}

/// A job's output as text: from `offset` (with `waitMs`, waiting for bytes past it while
/// the job runs: how a client follows a job), or the last `tail` bytes, or from the first
/// byte kept. At most `maxBytes` (default 64 KiB, at most 1 MiB).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobOutput {
    pub job_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub tail: Option<usize>,
    #[serde(default)]
    pub max_bytes: Option<usize>,
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// Follows a job's output: answered `job_followed`, then `job_output_update` events push
/// the output from `offset` (default: the first byte kept) as it is written, in order and
/// each byte once, until one with `eof` (the job ended and everything was sent). A slow
/// client lags; bytes it lags past what the daemon keeps are counted in `skipped`.
/// Following a job again starts over from the new `offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FollowJob {
    pub job_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
}

/// Stops a `follow_job`: no `job_output_update` of that job follows the answer
/// (`job_unfollowed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnfollowJob {
    pub job_id: String,
}

/// Kills a job (TERM to its process group, 3 s, KILL); answered `job` once it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KillJob {
    pub job_id: String,
}

/// Answers `job_waited` when the job ended, or at the timeout (its default and its
/// bound: `docs/protocol.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitJob {
    pub job_id: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Starts an agent whose last start failed (`startFailure`), now: the user's retry. Its
/// queued messages then run. Answered `ok` once the start is asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartAgent {
    pub agent_id: String,
}

/// Signs a provider in with one of its methods (`methodId`, from the provider's or an
/// agent's `signIn` methods), then starts again every agent of that provider that waits
/// for a sign-in. `env_var`: `vars` holds the variables, stored in the provider's `env`
/// in `config.toml` (never shown again); `agent`: the method is stored as the provider's
/// `auth`, and the agent is asked to `authenticate` with it; `terminal`: only the retry
/// (the login ran in the user's terminal: `drover login`). Answered `signed_in`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignIn {
    pub provider: String,
    pub method_id: String,
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
}

/// Brings in the agents of a Paseo home (`path`, absolute: `~/.paseo` by default in the
/// CLI): each record becomes an agent with a new id, its status, title, labels, parent,
/// archive, workspace and resume handle kept. Only with `apply` is anything written;
/// otherwise the answer says what would be imported. Records imported before are skipped.
/// The source is only read. Answered `imported`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportPaseo {
    pub path: String,
    #[serde(default)]
    pub apply: bool,
}

/// Brings in a provider's own past sessions, as its agent lists them through ACP
/// `session/list` (those in `cwd`, absolute, when given): each listed session (or only
/// those in `sessions`, by id) becomes an idle agent in the session's directory, titled as
/// listed, whose next message continues that session (`session/resume` or
/// `session/load`). Sessions imported before, or already some agent's session, are
/// skipped. Only with `apply` is anything written. Answered `imported`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportSessions {
    pub provider: String,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub sessions: Vec<String>,
    #[serde(default)]
    pub apply: bool,
}

/// What this client shows its user now: the agent in front (`agentId`), or nothing
/// (`null`: the page is hidden, or no agent is open). The daemon sends no notification
/// for an agent a connected client shows (`[notify]` in `config.toml`); a connection
/// that closes shows nothing. Answered `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Watching {
    #[serde(default)]
    pub agent_id: Option<String>,
}

/// The notification sinks of `[notify]` and how their deliveries went. Answered
/// `notify_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotifyStatus {}

/// Sends a sample notification to the sink named `sink`, or to every sink, and answers
/// `notify_tested` once each delivery succeeded or failed (retries included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotifyTest {
    #[serde(default)]
    pub sink: Option<String>,
}

fn default_delivery() -> Delivery {
    Delivery::Followup
}

/// Opens a workspace terminal: the user's shell (`$SHELL`, else `/bin/sh`) on a new PTY of
/// `cols` × `rows` in the workspace's directory (not an ACP client terminal: those are an
/// agent's jobs). Answered `terminal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTerminal {
    pub workspace_id: String,
    /// Default 80.
    #[serde(default)]
    pub cols: Option<u16>,
    /// Default 24.
    #[serde(default)]
    pub rows: Option<u16>,
}

/// The workspace terminals running now, of one workspace or of all. Answered `terminals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListTerminals {
    #[serde(default)]
    pub workspace_id: Option<String>,
}

/// Attaches this session to a workspace terminal: answered `terminal_attached`, then
/// `terminal_output` events carry what the terminal wrote from `offset` (default: the first
/// byte of its kept scrollback, which repaints the screen) and everything it writes next,
/// until its `terminal_exit`. Attaching again starts over from the new `offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachTerminal {
    pub terminal_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
}

/// Stops an `attach_terminal` (the terminal goes on): no `terminal_output` of it follows the
/// answer (`terminal_detached`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DetachTerminal {
    pub terminal_id: String,
}

/// Types `data` (UTF-8 text, as a terminal emulator sends it: keys, escape sequences, pasted
/// text; at most 64 KiB) into a workspace terminal. Answered `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TerminalInput {
    pub terminal_id: String,
    pub data: String,
}

/// Sets a workspace terminal's size (its programs get `SIGWINCH`). Answered `terminal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResizeTerminal {
    pub terminal_id: String,
    pub cols: u16,
    pub rows: u16,
}

/// Ends a workspace terminal: its shell and everything it started. Answered `terminal` once
/// they are gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloseTerminal {
    pub terminal_id: String,
}
