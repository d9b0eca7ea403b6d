// Generated from the Rust types of crates/protocol (drover_protocol::js): do not edit.
// Regenerate with: DROVER_BLESS=1 cargo test -p drover-protocol --test js
// @ts-check

/** The protocol version `hello` names. */
export const PROTOCOL_VERSION = 2;

/** Every `ErrorCode` value, by its Rust name. */
export const ErrorCode = Object.freeze({
  InvalidMessage: /** @type {'invalid_message'} */ ('invalid_message'),
  UnknownType: /** @type {'unknown_type'} */ ('unknown_type'),
  HelloRequired: /** @type {'hello_required'} */ ('hello_required'),
  UnsupportedVersion: /** @type {'unsupported_version'} */ ('unsupported_version'),
  Unauthorized: /** @type {'unauthorized'} */ ('unauthorized'),
  UnknownAgent: /** @type {'unknown_agent'} */ ('unknown_agent'),
  UnknownWorkspace: /** @type {'unknown_workspace'} */ ('unknown_workspace'),
  UnknownProvider: /** @type {'unknown_provider'} */ ('unknown_provider'),
  InvalidConfig: /** @type {'invalid_config'} */ ('invalid_config'),
  ProviderUnavailable: /** @type {'provider_unavailable'} */ ('provider_unavailable'),
  InvalidInput: /** @type {'invalid_input'} */ ('invalid_input'),
  InvalidId: /** @type {'invalid_id'} */ ('invalid_id'),
  NotPermitted: /** @type {'not_permitted'} */ ('not_permitted'),
  AgentActive: /** @type {'agent_active'} */ ('agent_active'),
  AgentArchived: /** @type {'agent_archived'} */ ('agent_archived'),
  TurnBlocked: /** @type {'turn_blocked'} */ ('turn_blocked'),
  IllegalTransition: /** @type {'illegal_transition'} */ ('illegal_transition'),
  NoSuchPermission: /** @type {'no_such_permission'} */ ('no_such_permission'),
  AgentStartFailed: /** @type {'agent_start_failed'} */ ('agent_start_failed'),
  AgentError: /** @type {'agent_error'} */ ('agent_error'),
  RuntimeStopped: /** @type {'runtime_stopped'} */ ('runtime_stopped'),
  StoreFailed: /** @type {'store_failed'} */ ('store_failed'),
  ShuttingDown: /** @type {'shutting_down'} */ ('shutting_down'),
  NotAWorktree: /** @type {'not_a_worktree'} */ ('not_a_worktree'),
  NotAGitRepository: /** @type {'not_a_git_repository'} */ ('not_a_git_repository'),
  GitFailed: /** @type {'git_failed'} */ ('git_failed'),
  InvalidProjectFile: /** @type {'invalid_project_file'} */ ('invalid_project_file'),
  WorktreeSetupFailed: /** @type {'worktree_setup_failed'} */ ('worktree_setup_failed'),
  WorktreeTeardownFailed: /** @type {'worktree_teardown_failed'} */ ('worktree_teardown_failed'),
  WorktreeDirty: /** @type {'worktree_dirty'} */ ('worktree_dirty'),
  WorktreeBusy: /** @type {'worktree_busy'} */ ('worktree_busy'),
  WorktreeIoFailed: /** @type {'worktree_io_failed'} */ ('worktree_io_failed'),
  TooManyRequests: /** @type {'too_many_requests'} */ ('too_many_requests'),
  UnknownSchedule: /** @type {'unknown_schedule'} */ ('unknown_schedule'),
  UnknownJob: /** @type {'unknown_job'} */ ('unknown_job'),
  JobStartFailed: /** @type {'job_start_failed'} */ ('job_start_failed'),
  BudgetExhausted: /** @type {'budget_exhausted'} */ ('budget_exhausted'),
  UnknownHost: /** @type {'unknown_host'} */ ('unknown_host'),
  HostUnreachable: /** @type {'host_unreachable'} */ ('host_unreachable'),
  UnknownTerminal: /** @type {'unknown_terminal'} */ ('unknown_terminal'),
  TerminalStartFailed: /** @type {'terminal_start_failed'} */ ('terminal_start_failed'),
  WorkspaceArchived: /** @type {'workspace_archived'} */ ('workspace_archived'),
});

/** Every `AgentStatus` value, by its Rust name. */
export const AgentStatus = Object.freeze({
  Initializing: /** @type {'initializing'} */ ('initializing'),
  Idle: /** @type {'idle'} */ ('idle'),
  Running: /** @type {'running'} */ ('running'),
  Error: /** @type {'error'} */ ('error'),
  Closed: /** @type {'closed'} */ ('closed'),
});

/** Every `AttentionReason` value, by its Rust name. */
export const AttentionReason = Object.freeze({
  Finished: /** @type {'finished'} */ ('finished'),
  Error: /** @type {'error'} */ ('error'),
  Permission: /** @type {'permission'} */ ('permission'),
  Interrupted: /** @type {'interrupted'} */ ('interrupted'),
  AuthRequired: /** @type {'auth_required'} */ ('auth_required'),
  Limited: /** @type {'limited'} */ ('limited'),
  BudgetWarning: /** @type {'budget_warning'} */ ('budget_warning'),
});

/** Every `RuntimeState` value, by its Rust name. */
export const RuntimeState = Object.freeze({
  Cold: /** @type {'cold'} */ ('cold'),
  Queued: /** @type {'queued'} */ ('queued'),
  Starting: /** @type {'starting'} */ ('starting'),
  Live: /** @type {'live'} */ ('live'),
});

/** Every `HostState` value, by its Rust name. */
export const HostState = Object.freeze({
  Connecting: /** @type {'connecting'} */ ('connecting'),
  Reachable: /** @type {'reachable'} */ ('reachable'),
  Unreachable: /** @type {'unreachable'} */ ('unreachable'),
  Incompatible: /** @type {'incompatible'} */ ('incompatible'),
});

/** Every `WorkspaceKind` value, by its Rust name. */
export const WorkspaceKind = Object.freeze({
  Directory: /** @type {'directory'} */ ('directory'),
  LocalCheckout: /** @type {'local_checkout'} */ ('local_checkout'),
  Worktree: /** @type {'worktree'} */ ('worktree'),
});

/** Every `WorkspaceActivity` value, by its Rust name. */
export const WorkspaceActivity = Object.freeze({
  Idle: /** @type {'idle'} */ ('idle'),
  Attention: /** @type {'attention'} */ ('attention'),
  Running: /** @type {'running'} */ ('running'),
  Error: /** @type {'error'} */ ('error'),
  Permission: /** @type {'permission'} */ ('permission'),
});

/** Every `JobStatus` value, by its Rust name. */
export const JobStatus = Object.freeze({
  Running: /** @type {'running'} */ ('running'),
  Exited: /** @type {'exited'} */ ('exited'),
  Killed: /** @type {'killed'} */ ('killed'),
  Lost: /** @type {'lost'} */ ('lost'),
});

/** Every `KillCause` value, by its Rust name. */
export const KillCause = Object.freeze({
  Request: /** @type {'request'} */ ('request'),
  Timeout: /** @type {'timeout'} */ ('timeout'),
  Archive: /** @type {'archive'} */ ('archive'),
  Shutdown: /** @type {'shutdown'} */ ('shutdown'),
  RuntimeEnded: /** @type {'runtime_ended'} */ ('runtime_ended'),
});

/** Every `ScheduleState` value, by its Rust name. */
export const ScheduleState = Object.freeze({
  Active: /** @type {'active'} */ ('active'),
  Paused: /** @type {'paused'} */ ('paused'),
  Finished: /** @type {'finished'} */ ('finished'),
});

/** Every `SignInState` value, by its Rust name. */
export const SignInState = Object.freeze({
  SignedIn: /** @type {'signed_in'} */ ('signed_in'),
  NeedsSignIn: /** @type {'needs_sign_in'} */ ('needs_sign_in'),
  Unknown: /** @type {'unknown'} */ ('unknown'),
});

/** Every `ChangeStatus` value, by its Rust name. */
export const ChangeStatus = Object.freeze({
  Added: /** @type {'added'} */ ('added'),
  Modified: /** @type {'modified'} */ ('modified'),
  Deleted: /** @type {'deleted'} */ ('deleted'),
  Renamed: /** @type {'renamed'} */ ('renamed'),
  Copied: /** @type {'copied'} */ ('copied'),
  TypeChanged: /** @type {'type_changed'} */ ('type_changed'),
  Untracked: /** @type {'untracked'} */ ('untracked'),
});

/** Every `SinkKind` value, by its Rust name. */
export const SinkKind = Object.freeze({
  Webhook: /** @type {'webhook'} */ ('webhook'),
  Ntfy: /** @type {'ntfy'} */ ('ntfy'),
  Command: /** @type {'command'} */ ('command'),
});

/** Every `NotifyEvent` value, by its Rust name. */
export const NotifyEvent = Object.freeze({
  Finished: /** @type {'finished'} */ ('finished'),
  Failed: /** @type {'failed'} */ ('failed'),
  Permission: /** @type {'permission'} */ ('permission'),
  AuthRequired: /** @type {'auth_required'} */ ('auth_required'),
  Interrupted: /** @type {'interrupted'} */ ('interrupted'),
  Limited: /** @type {'limited'} */ ('limited'),
  Summary: /** @type {'summary'} */ ('summary'),
  Test: /** @type {'test'} */ ('test'),
});

/** Every `SubagentVia` value, by its Rust name. */
export const SubagentVia = Object.freeze({
  ToolCall: /** @type {'tool_call'} */ ('tool_call'),
  SubagentUpdate: /** @type {'subagent_update'} */ ('subagent_update'),
});

/** Every `ItemKind` value, by its Rust name. */
export const ItemKind = Object.freeze({
  UserMessage: /** @type {'user_message'} */ ('user_message'),
  AgentMessage: /** @type {'agent_message'} */ ('agent_message'),
  AgentThought: /** @type {'agent_thought'} */ ('agent_thought'),
  ToolCall: /** @type {'tool_call'} */ ('tool_call'),
  Permission: /** @type {'permission'} */ ('permission'),
  Plan: /** @type {'plan'} */ ('plan'),
  Mode: /** @type {'mode'} */ ('mode'),
  Config: /** @type {'config'} */ ('config'),
  Usage: /** @type {'usage'} */ ('usage'),
  AvailableCommands: /** @type {'available_commands'} */ ('available_commands'),
  SessionInfo: /** @type {'session_info'} */ ('session_info'),
  TurnStarted: /** @type {'turn_started'} */ ('turn_started'),
  TurnEnded: /** @type {'turn_ended'} */ ('turn_ended'),
  Notice: /** @type {'notice'} */ ('notice'),
  Raw: /** @type {'raw'} */ ('raw'),
});

/** Every `TurnEnd` value, by its Rust name. */
export const TurnEnd = Object.freeze({
  Completed: /** @type {'turn_completed'} */ ('turn_completed'),
  Failed: /** @type {'turn_failed'} */ ('turn_failed'),
  Canceled: /** @type {'turn_canceled'} */ ('turn_canceled'),
  Interrupted: /** @type {'turn_interrupted'} */ ('turn_interrupted'),
  Blocked: /** @type {'turn_blocked'} */ ('turn_blocked'),
  Limited: /** @type {'turn_limited'} */ ('turn_limited'),
});

/** Every `CancelCause` value, by its Rust name. */
export const CancelCause = Object.freeze({
  User: /** @type {'user'} */ ('user'),
  Parent: /** @type {'parent'} */ ('parent'),
  Archive: /** @type {'archive'} */ ('archive'),
  Shutdown: /** @type {'shutdown'} */ ('shutdown'),
  Budget: /** @type {'budget'} */ ('budget'),
});

/** Every `InterruptCause` value, by its Rust name. */
export const InterruptCause = Object.freeze({
  Shutdown: /** @type {'shutdown'} */ ('shutdown'),
  Crash: /** @type {'crash'} */ ('crash'),
});

/** Every `Delivery` value, by its Rust name. */
export const Delivery = Object.freeze({
  Followup: /** @type {'followup'} */ ('followup'),
  Steer: /** @type {'steer'} */ ('steer'),
  Inject: /** @type {'inject'} */ ('inject'),
});

/** Every `PermissionPolicy` value, by its Rust name. */
export const PermissionPolicy = Object.freeze({
  Ask: /** @type {'ask'} */ ('ask'),
  Allow: /** @type {'allow'} */ ('allow'),
});

/** Every `ClientType` value, by its Rust name. */
export const ClientType = Object.freeze({
  Hello: /** @type {'hello'} */ ('hello'),
  InitializeAgentRequest: /** @type {'initialize_agent_request'} */ ('initialize_agent_request'),
  FetchTimeline: /** @type {'fetch_timeline'} */ ('fetch_timeline'),
  CreateAgent: /** @type {'create_agent'} */ ('create_agent'),
  SendMessage: /** @type {'send_message'} */ ('send_message'),
  Cancel: /** @type {'cancel'} */ ('cancel'),
  Archive: /** @type {'archive'} */ ('archive'),
  Unarchive: /** @type {'unarchive'} */ ('unarchive'),
  Detach: /** @type {'detach'} */ ('detach'),
  ArchiveIdleChildren: /** @type {'archive_idle_children'} */ ('archive_idle_children'),
  AnswerPermission: /** @type {'answer_permission'} */ ('answer_permission'),
  SetMode: /** @type {'set_mode'} */ ('set_mode'),
  SetModel: /** @type {'set_model'} */ ('set_model'),
  SetConfigOption: /** @type {'set_config_option'} */ ('set_config_option'),
  SetTitle: /** @type {'set_title'} */ ('set_title'),
  SetBudget: /** @type {'set_budget'} */ ('set_budget'),
  ClearAttention: /** @type {'clear_attention'} */ ('clear_attention'),
  WorkspaceChanges: /** @type {'workspace_changes'} */ ('workspace_changes'),
  ListProviders: /** @type {'list_providers'} */ ('list_providers'),
  GetAgent: /** @type {'get_agent'} */ ('get_agent'),
  ListHosts: /** @type {'list_hosts'} */ ('list_hosts'),
  AddHost: /** @type {'add_host'} */ ('add_host'),
  RemoveHost: /** @type {'remove_host'} */ ('remove_host'),
  Ping: /** @type {'ping'} */ ('ping'),
  ListAgents: /** @type {'list_agents'} */ ('list_agents'),
  WaitIdle: /** @type {'wait_idle'} */ ('wait_idle'),
  ListWorkspaces: /** @type {'list_workspaces'} */ ('list_workspaces'),
  CreateWorktree: /** @type {'create_worktree'} */ ('create_worktree'),
  GetWorktreeStatus: /** @type {'get_worktree_status'} */ ('get_worktree_status'),
  ArchiveWorkspace: /** @type {'archive_workspace'} */ ('archive_workspace'),
  CreateSchedule: /** @type {'create_schedule'} */ ('create_schedule'),
  ListSchedules: /** @type {'list_schedules'} */ ('list_schedules'),
  PauseSchedule: /** @type {'pause_schedule'} */ ('pause_schedule'),
  ResumeSchedule: /** @type {'resume_schedule'} */ ('resume_schedule'),
  DeleteSchedule: /** @type {'delete_schedule'} */ ('delete_schedule'),
  StartJob: /** @type {'start_job'} */ ('start_job'),
  ListJobs: /** @type {'list_jobs'} */ ('list_jobs'),
  JobOutput: /** @type {'job_output'} */ ('job_output'),
  FollowJob: /** @type {'follow_job'} */ ('follow_job'),
  UnfollowJob: /** @type {'unfollow_job'} */ ('unfollow_job'),
  KillJob: /** @type {'kill_job'} */ ('kill_job'),
  WaitJob: /** @type {'wait_job'} */ ('wait_job'),
  RestartAgent: /** @type {'restart_agent'} */ ('restart_agent'),
  SignIn: /** @type {'sign_in'} */ ('sign_in'),
  ImportPaseo: /** @type {'import_paseo'} */ ('import_paseo'),
  ImportSessions: /** @type {'import_sessions'} */ ('import_sessions'),
  Watching: /** @type {'watching'} */ ('watching'),
  NotifyStatus: /** @type {'notify_status'} */ ('notify_status'),
  NotifyTest: /** @type {'notify_test'} */ ('notify_test'),
  TakeNotices: /** @type {'take_notices'} */ ('take_notices'),
  AckNotices: /** @type {'ack_notices'} */ ('ack_notices'),
  SetUpstreamGate: /** @type {'set_upstream_gate'} */ ('set_upstream_gate'),
  SetUpstreamBudget: /** @type {'set_upstream_budget'} */ ('set_upstream_budget'),
  CreateTerminal: /** @type {'create_terminal'} */ ('create_terminal'),
  ListTerminals: /** @type {'list_terminals'} */ ('list_terminals'),
  AttachTerminal: /** @type {'attach_terminal'} */ ('attach_terminal'),
  DetachTerminal: /** @type {'detach_terminal'} */ ('detach_terminal'),
  TerminalInput: /** @type {'terminal_input'} */ ('terminal_input'),
  ResizeTerminal: /** @type {'resize_terminal'} */ ('resize_terminal'),
  CloseTerminal: /** @type {'close_terminal'} */ ('close_terminal'),
});

/** Every `DaemonType` value, by its Rust name. */
export const DaemonType = Object.freeze({
  Welcome: /** @type {'welcome'} */ ('welcome'),
  SessionState: /** @type {'session_state'} */ ('session_state'),
  AgentInitialized: /** @type {'agent_initialized'} */ ('agent_initialized'),
  AgentStatus: /** @type {'agent_status'} */ ('agent_status'),
  AgentUpdate: /** @type {'agent_update'} */ ('agent_update'),
  WorkspaceUpdate: /** @type {'workspace_update'} */ ('workspace_update'),
  TimelinePage: /** @type {'timeline_page'} */ ('timeline_page'),
  AgentCreated: /** @type {'agent_created'} */ ('agent_created'),
  MessageQueued: /** @type {'message_queued'} */ ('message_queued'),
  Notices: /** @type {'notices'} */ ('notices'),
  NoticeQueued: /** @type {'notice_queued'} */ ('notice_queued'),
  Ok: /** @type {'ok'} */ ('ok'),
  Archived: /** @type {'archived'} */ ('archived'),
  ChildrenArchived: /** @type {'children_archived'} */ ('children_archived'),
  Providers: /** @type {'providers'} */ ('providers'),
  NotifyStatus: /** @type {'notify_status'} */ ('notify_status'),
  NotifyTested: /** @type {'notify_tested'} */ ('notify_tested'),
  SignedIn: /** @type {'signed_in'} */ ('signed_in'),
  Imported: /** @type {'imported'} */ ('imported'),
  Agents: /** @type {'agents'} */ ('agents'),
  Hosts: /** @type {'hosts'} */ ('hosts'),
  HostUpdate: /** @type {'host_update'} */ ('host_update'),
  Agent: /** @type {'agent'} */ ('agent'),
  Idle: /** @type {'idle'} */ ('idle'),
  Workspaces: /** @type {'workspaces'} */ ('workspaces'),
  WorktreeCreated: /** @type {'worktree_created'} */ ('worktree_created'),
  WorktreeStatus: /** @type {'worktree_status'} */ ('worktree_status'),
  WorkspaceChanges: /** @type {'workspace_changes'} */ ('workspace_changes'),
  WorkspaceArchived: /** @type {'workspace_archived'} */ ('workspace_archived'),
  Job: /** @type {'job'} */ ('job'),
  Jobs: /** @type {'jobs'} */ ('jobs'),
  JobOutput: /** @type {'job_output'} */ ('job_output'),
  JobWaited: /** @type {'job_waited'} */ ('job_waited'),
  JobUpdate: /** @type {'job_update'} */ ('job_update'),
  JobFollowed: /** @type {'job_followed'} */ ('job_followed'),
  JobUnfollowed: /** @type {'job_unfollowed'} */ ('job_unfollowed'),
  JobOutputUpdate: /** @type {'job_output_update'} */ ('job_output_update'),
  Terminal: /** @type {'terminal'} */ ('terminal'),
  Terminals: /** @type {'terminals'} */ ('terminals'),
  TerminalAttached: /** @type {'terminal_attached'} */ ('terminal_attached'),
  TerminalDetached: /** @type {'terminal_detached'} */ ('terminal_detached'),
  TerminalOutput: /** @type {'terminal_output'} */ ('terminal_output'),
  TerminalExit: /** @type {'terminal_exit'} */ ('terminal_exit'),
  TerminalUpdate: /** @type {'terminal_update'} */ ('terminal_update'),
  RequestError: /** @type {'request_error'} */ ('request_error'),
  ResyncRequired: /** @type {'resync_required'} */ ('resync_required'),
  Schedule: /** @type {'schedule'} */ ('schedule'),
  Schedules: /** @type {'schedules'} */ ('schedules'),
  ScheduleDeleted: /** @type {'schedule_deleted'} */ ('schedule_deleted'),
  ScheduleUpdate: /** @type {'schedule_update'} */ ('schedule_update'),
});

/**
 * What an agent's process said of itself in its ACP `initialize` answer.
 * @typedef {Object} AgentAdvertised
 * @property {string | null} [name] - `agentInfo.name`, `title` and `version`, where it gave them.
 * @property {string | null} [title]
 * @property {string | null} [version]
 * @property {number} protocolVersion - The ACP version it answered with (drover speaks 1; another one fails the start).
 * @property {Array<string>} capabilities - What it can do beyond prompts: `load`, `resume`, `close`, `list`, `fork` (sessions), `image`, `audio`, `embedded-context` (prompts), `mcp-http`, `mcp-sse`.
 */

/**
 * An agent as clients see it (`session_state`, `agent_status`, answers). The lifecycle's own
 * optional fields (`sessionId`, `error`, `currentModeId`, `availableModes`, `title`,
 * `parentAgentId`, `archivedAt`, `attentionReason`) are there even when `null`; any other
 * field that is `None` is left out of the JSON, here and in [`RuntimeInfo`] and
 * [`SpendInfo`]: most are for most agents, and a `session_state` carries thousands.
 * @typedef {Object} AgentInfo
 * @property {string} id
 * @property {AgentStatus} status
 * @property {string} createdAt
 * @property {string} updatedAt
 * @property {string} lastActivityAt
 * @property {string} type - The provider (`codex`, `claude`, ...).
 * @property {string | null} [sessionId] - The provider's own session id (ACP), for resume.
 * @property {string | null} [error] - The last error.
 * @property {string | null} [currentModeId]
 * @property {any} [availableModes] - Modes the live runtime offers (`null` while it is cold).
 * @property {string | null} [model]
 * @property {string | null} [effort] - The recorded reasoning effort (`thought_level` config option).
 * @property {Array<ConfigOptionInfo> | null} [configOptions] - The settings the live session offers (ACP config options: mode, model, reasoning effort, the agent's own), with their current values; `null` while it is cold or when the agent offers none. Set one with `set_config_option`.
 * @property {Array<OwnSubagentInfo>} [ownSubagents] - The subagents the agent runs itself (claude's Task tool, ACP `subagent_update`), while its process lives: read-only (they end with it), and `subagent` activity in archive admission while they run. Not drover agents: see `parentAgentId` for those.
 * @property {string | null} [title]
 * @property {string} cwd
 * @property {string | null} [parentAgentId]
 * @property {string} workspaceId
 * @property {{[key: string]: string}} labels
 * @property {string | null} [archivedAt]
 * @property {boolean} requiresAttention
 * @property {AttentionReason | null} [attentionReason]
 * @property {string | null} [attentionTimestamp]
 * @property {LimitedInfo | null} [limited] - Set while the agent waits for its provider's usage limit to reset (attention `limited`): its failed prompt is sent again at `retryAt`.
 * @property {boolean} autoArchive
 * @property {PermissionPolicy} permissionPolicy
 * @property {OnInterrupt | null} [onInterrupt] - What happens to a turn a daemon restart cuts off, as the agent was created with (`null`: its provider's `on_interrupt`, else `notify`).
 * @property {OnLimit | null} [onLimit] - What happens when a turn hits the provider's usage limit, as the agent was created with (`null`: its provider's `on_limit`, else `wait`).
 * @property {SpendInfo} [spend] - What the agent spent, as its agent reported it (`null` fields: it reported none, unknown rather than zero).
 * @property {Budget | null} [budget] - The budget set on this agent, for it and its subtree (`null`: none here; an ancestor's may apply).
 * @property {TreeSpendInfo | null} [treeSpend] - What the agent and every agent below it spent: only in the `agent` answer.
 * @property {RuntimeInfo} [runtime] - The agent's runtime: whether a process runs for it.
 * @property {StartFailureInfo | null} [startFailure] - Set while the agent's last start failed: it does not start again on its own (but for the retries `runtime.retryAt` announces) until `restart_agent` or a `sign_in`.
 * @property {Array<QueuedMessageInfo> | null} [queued] - The messages queued for it and not delivered yet, oldest first: only in the `agent` answer (read then).
 * @property {string | null} [host] - The host it runs on (`drover host ls`); absent for this daemon's own machine.
 */

/**
 * An agent's lifecycle status (`AgentInfo.status`); the daemon's state machine over these
 * values lives in `drover-core`'s `lifecycle`.
 * @typedef {'initializing' | 'idle' | 'running' | 'error' | 'closed'} AgentStatus
 */

/**
 * One change to an agent's timeline (`op`: `item`, `append`, `patch`; see docs/protocol.md).
 * @typedef {Object} AgentUpdate
 * @property {string} agentId
 * @property {string} timestamp
 * @property {any} notification
 * @property {number | null} [revision] - The agent's timeline revision after this update (absent on the items of an `agent_initialized` snapshot): an update whose revision is not above the snapshot's is already in it.
 */

/**
 * Why an agent asks for its user (`AgentInfo.attentionReason`).
 * @typedef {'finished' | 'error' | 'permission' | 'interrupted' | 'auth_required' | 'limited' | 'budget_warning'} AttentionReason
 */

/**
 * How a sign-in method works (ACP auth method types).
 * @typedef {'agent' | 'env_var' | 'terminal'} AuthKind
 */

/**
 * One way to sign in to an agent, as its ACP `initialize` answer offers it (`authMethods`).
 * The agent record keeps the same shape while the agent waits for a sign-in.
 * @typedef {Object} AuthMethod
 * @property {string} id - What `authenticate` (and `sign_in`) names.
 * @property {string} name
 * @property {string | null} [description]
 * @property {AuthKind} [type]
 * @property {Array<AuthVar>} [vars] - `env_var`: the variables to set.
 * @property {Array<string>} [args] - `terminal`: the arguments added to the provider's command for the login.
 * @property {{[key: string]: string}} [env] - `terminal`: variables set for the login.
 * @property {string | null} [link] - Where to get a key, when the agent says.
 */

/**
 * A variable of an `env_var` sign-in method.
 * @typedef {Object} AuthVar
 * @property {string} name
 * @property {string | null} [label]
 * @property {boolean} [optional] - The method works without it.
 * @property {boolean} [secret] - A secret (a key): never shown again once given. Default true.
 */

/**
 * A budget for an agent and its whole subtree: limits in tokens and/or cost (in the
 * currency the agents report). At 100 % of either, no new turn starts in the tree.
 * @typedef {Object} Budget
 * @property {number | null} [tokens]
 * @property {number | null} [cost]
 * @property {boolean} [hard] - Cancel the turns running in the tree at 100 % too (cause `budget`), not only refuse new ones.
 */

/**
 * How a file changed (`ChangedFileInfo.status`).
 * @typedef {'added' | 'modified' | 'deleted' | 'renamed' | 'copied' | 'type_changed' | 'untracked'} ChangeStatus
 */

/**
 * One changed file of [`WorkspaceChangesInfo`].
 * @typedef {Object} ChangedFileInfo
 * @property {string} path
 * @property {ChangeStatus} status
 * @property {number | null} [added] - Lines added and removed; `null` for binary and untracked files.
 * @property {number | null} [removed]
 * @property {string} diff - The file's unified diff (empty for untracked files).
 */

/**
 * One setup or teardown command of a worktree, as it ran.
 * @typedef {Object} CommandRunInfo
 * @property {string} command
 * @property {number | null} [exitCode] - `null` when it was killed (by a signal, or for running out of time).
 * @property {boolean} timedOut
 * @property {string} output - stdout and stderr as they came, the last 64 KiB.
 * @property {number} durationMs
 */

/**
 * A setting the agent's session offers, with its current value (ACP `configOptions`, a
 * `select`; option groups are flattened).
 * @typedef {Object} ConfigOptionInfo
 * @property {string} id
 * @property {string} name
 * @property {string | null} [description]
 * @property {string | null} [category] - `mode`, `model`, `thought_level`, or the agent's own (or none).
 * @property {string} currentValue
 * @property {Array<ConfigValueInfo>} values
 */

/**
 * One value a config option can take.
 * @typedef {Object} ConfigValueInfo
 * @property {string} value
 * @property {string} name
 * @property {string | null} [description]
 */

/**
 * Where a message goes and whether it wakes the agent. (The daemon's inbox stores the same
 * enum: it is defined once, here.)
 * @typedef {'followup' | 'steer' | 'inject'} Delivery
 */

/**
 * Why a request failed: the stable `code` of a `request_error` (and of an MCP tool
 * error). Clients match on it; the message beside it is for people.
 * `docs/protocol.md` explains each one (a test keeps the two in step).
 * @typedef {'invalid_message' | 'unknown_type' | 'hello_required' | 'unsupported_version' | 'unauthorized' | 'unknown_agent' | 'unknown_workspace' | 'unknown_provider' | 'invalid_config' | 'provider_unavailable' | 'invalid_input' | 'invalid_id' | 'not_permitted' | 'agent_active' | 'agent_archived' | 'turn_blocked' | 'illegal_transition' | 'no_such_permission' | 'agent_start_failed' | 'agent_error' | 'runtime_stopped' | 'store_failed' | 'shutting_down' | 'not_a_worktree' | 'not_a_git_repository' | 'git_failed' | 'invalid_project_file' | 'worktree_setup_failed' | 'worktree_teardown_failed' | 'worktree_dirty' | 'worktree_busy' | 'worktree_io_failed' | 'too_many_requests' | 'unknown_schedule' | 'unknown_job' | 'job_start_failed' | 'budget_exhausted' | 'unknown_host' | 'host_unreachable' | 'unknown_terminal' | 'terminal_start_failed' | 'workspace_archived'} ErrorCode
 */

/**
 * How to reach a host: an `ssh://[user@]host[:port]` target, or a command of its own that
 * ends in `drover connect --stdio` (`kubectl exec -i POD -- drover connect --stdio`).
 * @typedef {Object} HostConfig
 * @property {string} name - Its name in this fleet: lower-case letters, digits and `-`.
 * @property {string | null} [ssh] - `ssh://[user@]host[:port]`.
 * @property {string | null} [identity] - The private key `ssh -i` uses.
 * @property {Array<string>} [sshOptions] - More `ssh -o` options, as `Key=value`.
 * @property {Array<string> | null} [command] - Instead of `ssh`: the command (program and arguments) whose stdin and stdout are the link.
 */

/**
 * A host of the fleet as the hub sees it now.
 * @typedef {Object} HostInfo
 * @property {string} name
 * @property {string} target - `ssh://...` or the link command, for people.
 * @property {HostState} state - `connecting`, `reachable`, `unreachable`, or `incompatible` (another protocol version: see `error`).
 * @property {string} since - Since when it is in that state.
 * @property {string | null} [error] - Why it is not reachable.
 * @property {string | null} [version] - The remote daemon's version, once reached.
 * @property {number} agents - Its agents (archived ones not counted) and how many run a process now.
 * @property {number} live
 * @property {number | null} [maxLive] - Its daemon's `[runtimes] max_live` (`null`: no ceiling, or not reached yet).
 */

/**
 * A host's link as the hub sees it (`HostInfo.state`).
 * @typedef {'connecting' | 'reachable' | 'unreachable' | 'incompatible'} HostState
 */

/**
 * A record an import left alone, and why.
 * @typedef {Object} ImportSkip
 * @property {string} source
 * @property {string | null} [sourceId] - Its id in the source, when it could be read.
 * @property {string} reason
 */

/**
 * A record an import brought in (or, in a dry run, would).
 * @typedef {Object} ImportedAgentInfo
 * @property {string} source - Where it came from: the record's file (`import_paseo`), the session's id (`import_sessions`).
 * @property {string} sourceId - Its id in the source (kept in the label `paseo.agent-id`, or `acp.session-id`).
 * @property {string | null} [agentId] - The new agent's id; `null` in a dry run.
 * @property {string} provider
 * @property {string} cwd
 * @property {string | null} [title]
 * @property {AgentStatus} status
 * @property {boolean} archived
 * @property {string | null} [parentSourceId] - The source id of its parent, when it comes in as a subagent.
 * @property {boolean} resumes - Whether its next message continues the provider's session (`session/load`).
 * @property {string | null} [note] - How it came in, when the user should know (e.g. as a root, its parent skipped).
 */

/**
 * A job as clients see it.
 * @typedef {Object} JobInfo
 * @property {string} id - `job-<n>`, unique in the daemon's home.
 * @property {string} agentId - The agent that owns it.
 * @property {string} command
 * @property {string} cwd
 * @property {JobStatus} status
 * @property {string} startedBy - `user`, `agent:<id>`, `terminal`.
 * @property {string} startedAt
 * @property {string | null} [endedAt]
 * @property {number | null} [exitCode]
 * @property {number | null} [signal]
 * @property {string | null} [exit] - How it ended, for people (`exit status 1`, `signal 15 (SIGTERM)`).
 * @property {KillCause | null} [killedBy] - Why drover killed it.
 * @property {number | null} [durationMs]
 * @property {number} outputBytes - Bytes of output so far.
 * @property {number} pid
 * @property {number | null} [timeoutS]
 * @property {boolean} notifyOnExit
 * @property {boolean} terminal - Opened by the agent as an ACP client terminal.
 */

/**
 * How a job is doing (`JobInfo.status`).
 * @typedef {'running' | 'exited' | 'killed' | 'lost'} JobStatus
 */

/**
 * Why drover killed a job (`JobInfo.killedBy`).
 * @typedef {'request' | 'timeout' | 'archive' | 'shutdown' | 'runtime_ended'} KillCause
 */

/**
 * An agent waiting for its provider's usage limit to reset (`AgentInfo.limited`).
 * @typedef {Object} LimitedInfo
 * @property {string} at - When the turn hit the limit.
 * @property {string | null} [resetAt] - When the provider said the limit resets (`null`: it did not say; drover backs off).
 * @property {string} retryAt - When the prompt is sent again.
 * @property {string} error - What the agent said.
 */

/**
 * A worktree to make: every field optional.
 * @typedef {Object} NewWorktree
 * @property {string | null} [name] - The worktree's folder name under `$DROVER_HOME/worktrees/<project>/` (sanitized; suffixed when taken; generated when absent).
 * @property {string | null} [branch] - The new branch (default `drover/<name>`); it must not exist yet.
 * @property {string | null} [base] - What to branch from: a branch, tag or commit (default: the checkout's HEAD).
 */

/**
 * What an agent of this daemon told an agent of the hub that links to it, kept in the
 * outbox until the hub acknowledges it (`ack_notices`).
 * @typedef {Object} NoticeInfo
 * @property {string} id - The id of the message it becomes in the hub agent's inbox (queued once, however often it is offered).
 * @property {string} at
 * @property {string} from - This daemon's agent.
 * @property {string} to - The hub's agent.
 * @property {Delivery} delivery
 * @property {string} text
 */

/**
 * What a notification is about (`NotifySinkInfo.events`: the ones a sink may ask for).
 * @typedef {'finished' | 'failed' | 'permission' | 'auth_required' | 'interrupted' | 'limited' | 'summary' | 'test'} NotifyEvent
 */

/**
 * A notification sink (`[[notify.sink]]` in `config.toml`) and how its deliveries went since
 * the daemon started.
 * @typedef {Object} NotifySinkInfo
 * @property {string} name
 * @property {SinkKind} kind
 * @property {string} target - Where it goes, without what could be a secret: a URL's scheme and host, a command's program.
 * @property {Array<NotifyEvent>} events - The events it wants.
 * @property {boolean} all - Also watched agents and every subagent's own events.
 * @property {number} sent - Notifications delivered (summaries and samples included).
 * @property {string | null} [lastSentAt]
 * @property {number} failed - Deliveries that failed after every retry.
 * @property {string | null} [lastError]
 * @property {string | null} [lastErrorAt]
 * @property {number} dropped - Notifications dropped because its queue was full.
 * @property {number} summarized - Notifications held back by its limit and counted in a summary instead.
 */

/**
 * How one sink took a `notify_test` sample.
 * @typedef {Object} NotifyTestResult
 * @property {string} sink
 * @property {boolean} delivered
 * @property {string | null} [error]
 */

/**
 * What drover does with a turn that a daemon shutdown or crash cut off (`onInterrupt`; per
 * provider as `on_interrupt` in `config.toml`, per agent at creation).
 * @typedef {'notify' | 'continue'} OnInterrupt
 */

/**
 * What drover does when a turn fails on the provider's usage or rate limit (`onLimit`; per
 * provider as `on_limit` in `config.toml`, per agent at creation).
 * @typedef {'wait' | 'fail'} OnLimit
 */

/**
 * A subagent an agent runs itself, as its provider reports it.
 * @typedef {Object} OwnSubagentInfo
 * @property {string} id - The tool call's id (`via` `tool_call`) or the child session's (`subagent_update`).
 * @property {string} title
 * @property {string | null} [description]
 * @property {string} state - `running`, `completed`, `failed`, `interrupted` (its turn ended first), or the state an ACP child session reports (`idle`, ...).
 * @property {SubagentVia} via - How the agent reported it.
 * @property {string} startedAt
 * @property {string | null} [endedAt]
 * @property {number} [toolCalls] - Tool calls the child session made (reported through `subagent_update` only).
 */

/**
 * How an agent's permission requests are answered. (The agent record stores the same enum.)
 * @typedef {'ask' | 'allow'} PermissionPolicy
 */

/**
 * @typedef {Object} ProviderInfo
 * @property {string} name
 * @property {string} label
 * @property {Array<string>} command
 * @property {boolean} available
 * @property {string} detail - Where the command was found, or why it is unavailable.
 * @property {ProviderSignIn} [signIn] - Whether its agents can sign in, as far as the daemon knows.
 * @property {ProviderWarm} [warm] - Its warm spares (`warm` in `config.toml`): processes started and initialized, waiting for the next start of one of its agents.
 */

/**
 * A provider's sign-in, as the daemon last saw it.
 * @typedef {Object} ProviderSignIn
 * @property {SignInState} state
 * @property {Array<AuthMethod>} [methods] - The ways it offers (from its last `initialize`).
 * @property {string | null} [how] - What to do, for people (e.g. `drover login codex`, or the variable to set).
 */

/**
 * A provider's warm spares.
 * @typedef {Object} ProviderWarm
 * @property {number} ready - Spares ready now.
 * @property {number} wanted - Spares it keeps (`warm`; 0: none).
 */

/**
 * A message in an agent's inbox.
 * @typedef {Object} QueuedMessageInfo
 * @property {string} id
 * @property {string} text
 * @property {Delivery} delivery
 * @property {string} queuedAt
 */

/**
 * An agent's runtime, as `AgentInfo.runtime`.
 * @typedef {Object} RuntimeInfo
 * @property {RuntimeState} state
 * @property {number | null} [pid] - The agent process (its process group leader), while there is one.
 * @property {string | null} [hibernateAt] - When the idle runtime hibernates; `null` while busy or cold, or when it never does.
 * @property {number | null} [processes] - How many processes its tree holds: only in the `agent` answer (measured then).
 * @property {number | null} [rssBytes] - The resident memory of its tree, in bytes: only in the `agent` answer.
 * @property {string | null} [retryAt] - When the runtime tries to start again by itself after a failed start (1 s, 5 s, then 30 s after the first, second and third failures; then only on request).
 * @property {number} [backgroundProcesses] - How many background processes keep the otherwise idle runtime live: work the agent started itself and left running (a background shell, a dev server, a build), which hibernation would end. While above 0 the runtime does not hibernate and is not chosen to make room under `max_live`.
 * @property {AgentAdvertised | null} [agent] - What the agent's process said of itself at its last start (`initialize`): only in the `agent` answer, `null` before any start.
 */

/**
 * Where an agent's runtime is (`RuntimeInfo.state`).
 * @typedef {'cold' | 'queued' | 'starting' | 'live'} RuntimeState
 */

/**
 * A schedule as clients see it.
 * @typedef {Object} ScheduleInfo
 * @property {string} id - `sched-<n>`.
 * @property {string | null} [title]
 * @property {string} createdAt
 * @property {string} updatedAt
 * @property {string | null} [createdBy] - The agent that made it over MCP; `null` when a user did.
 * @property {string | null} [agentId] - The agent it sends its prompt to (a followup), for a schedule that does not create one.
 * @property {any} [newAgent] - The agent it creates each time (`provider`, `cwd`, `workspaceId`, `parentAgentId`, ...).
 * @property {string} prompt
 * @property {any} cadence - As stored: `{kind: once, at}`, `{kind: every, everySecs, from}`, `{kind: cron, expr, timeZone}`.
 * @property {string} description - One line for people: `every 30m`, `cron 0 9 * * 1-5 (Europe/Paris)`.
 * @property {ScheduleState} state
 * @property {string | null} [nextRunAt]
 * @property {Array<ScheduleRunInfo>} runs - The last runs, oldest first (at most 20).
 */

/**
 * The agent a schedule creates each time it fires.
 * @typedef {Object} ScheduleNewAgent
 * @property {string | null} [provider] - Default: the creating agent's provider (required from a client).
 * @property {string | null} [cwd] - The working directory (absolute). Default: the workspace's directory.
 * @property {string | null} [workspaceId]
 * @property {string | null} [parentAgentId] - Each new agent is a subagent of this one.
 * @property {string | null} [title]
 * @property {string | null} [model]
 * @property {PermissionPolicy | null} [permissionPolicy]
 * @property {boolean} [autoArchive]
 */

/**
 * One time a schedule fired.
 * @typedef {Object} ScheduleRunInfo
 * @property {string} dueAt - The occurrence it ran for.
 * @property {string} firedAt - When its prompt was durably queued (or the attempt failed).
 * @property {string | null} [messageId] - The queued message.
 * @property {string | null} [agentId] - The agent it went to, or the one it created.
 * @property {string | null} [error]
 * @property {boolean} recovered - Settled at boot from a delivery a crash interrupted.
 */

/**
 * Where a schedule is (`ScheduleInfo.state`).
 * @typedef {'active' | 'paused' | 'finished'} ScheduleState
 */

/**
 * When a schedule fires: exactly one of `at`, `inSeconds`, `everySeconds`, `cron`.
 * @typedef {Object} ScheduleWhen
 * @property {string | null} [at] - Once, at this time (RFC 3339 with an offset, e.g. `2026-12-24T09:00:00+01:00`).
 * @property {number | null} [inSeconds] - Once, this many seconds from now.
 * @property {number | null} [everySeconds] - Every this many seconds, the first time at `startAt` (default: one period from now).
 * @property {string | null} [startAt]
 * @property {string | null} [cron] - A cron expression: 5 fields (`minute hour day-of-month month day-of-week`), or 6 with seconds first; `@daily` and the like too.
 * @property {string | null} [timeZone] - The time zone the cron expression is read in (IANA name; default `UTC`).
 */

/**
 * A provider's sign-in as the daemon last saw it (`ProviderSignIn.state`).
 * @typedef {'signed_in' | 'needs_sign_in' | 'unknown'} SignInState
 */

/**
 * What a notification sink delivers to (`NotifySinkInfo.kind`).
 * @typedef {'webhook' | 'ntfy' | 'command'} SinkKind
 */

/**
 * What an agent spent (`AgentInfo.spend`): tokens from the usage its agent's prompt answers
 * carry, cost from its `usage_update`s; `null` where it reported none.
 * @typedef {Object} SpendInfo
 * @property {number | null} [tokens]
 * @property {number | null} [cost]
 * @property {string | null} [currency]
 */

/**
 * Why an agent's last start failed (the words are in `AgentInfo.error`).
 * @typedef {Object} StartFailureInfo
 * @property {string} at
 * @property {Array<AuthMethod> | null} [signIn] - Set when what the agent needs is a sign-in: the ways its provider offers (attention `auth_required`). Sign in with `sign_in` (`drover login PROVIDER`).
 */

/**
 * How an agent reported a subagent it runs itself (`OwnSubagentInfo.via`).
 * @typedef {'tool_call' | 'subagent_update'} SubagentVia
 */

/**
 * A workspace terminal as clients see it: a shell on a PTY of the daemon's host (not an ACP
 * client terminal, which is an agent's job: see `JobInfo.terminal`).
 * @typedef {Object} TerminalInfo
 * @property {string} id - `term-<n>`, unique while the daemon runs.
 * @property {string} workspaceId
 * @property {string} cwd - The workspace's directory, where the shell started.
 * @property {string} shell - The shell's program.
 * @property {number} pid
 * @property {number} cols
 * @property {number} rows
 * @property {string} createdAt
 * @property {number} outputBytes - Bytes it wrote so far (the next output's offset).
 */

/**
 * What an agent and its whole subtree spent (`AgentInfo.treeSpend`).
 * @typedef {Object} TreeSpendInfo
 * @property {number | null} [tokens] - The sum of what was reported (`null`: no agent of the tree reported any).
 * @property {number | null} [cost]
 * @property {string | null} [currency]
 * @property {number} agents - How many agents the tree holds (itself, its subagents at any depth, archived too).
 * @property {Array<string>} unknown - The agents of the tree that reported nothing (their spend is unknown).
 */

/**
 * The hub's agent a new agent is created for (see [`CreateAgent::upstream`]).
 * @typedef {Object} Upstream
 * @property {string} agentId - An agent of the hub, not of this daemon.
 * @property {boolean} [subagent] - The new agent is its subagent (its `parentAgentId`).
 * @property {boolean} [notifyOnFinish] - It is told how the new agent's first turn goes.
 * @property {Array<Budget>} [budgets] - For a subagent: what its subtree here may spend under each budget of its parent's lineage on the hub, from its first turn on (see [`SetUpstreamBudget`]).
 */

/**
 * What a workspace shows (`WorkspaceInfo.activity`), from least to most urgent.
 * @typedef {'idle' | 'attention' | 'running' | 'error' | 'permission'} WorkspaceActivity
 */

/**
 * What a workspace changed against its base (`workspace_changes`).
 * @typedef {Object} WorkspaceChangesInfo
 * @property {string} base - What was compared against: a worktree's base commit, else `HEAD`.
 * @property {Array<ChangedFileInfo>} files
 * @property {boolean} truncated - Files or diff text were left out to stay within the bounds (1000 files, 512 KiB).
 */

/**
 * @typedef {Object} WorkspaceInfo
 * @property {string} id
 * @property {WorkspaceKind} kind
 * @property {string} path
 * @property {string} name
 * @property {string} createdAt
 * @property {string | null} [archivedAt]
 * @property {WorkspaceActivity | null} [activity] - `null`: no agents.
 * @property {WorktreeInfo | null} [worktree] - For a worktree drover made: where it comes from.
 * @property {string | null} [host] - The host it is on; absent for this daemon's own machine.
 */

/**
 * What kind of directory a workspace is (`WorkspaceInfo.kind`).
 * @typedef {'directory' | 'local_checkout' | 'worktree'} WorkspaceKind
 */

/**
 * Where a worktree workspace comes from.
 * @typedef {Object} WorktreeInfo
 * @property {string} source - The source checkout it was made from.
 * @property {string} branch
 * @property {string} base - What the branch was made from, as named.
 * @property {string} baseCommit
 * @property {string | null} [createdBy] - The agent that made it over MCP; absent when a user did.
 */

/**
 * What removing a worktree did.
 * @typedef {Object} WorktreeRemovalInfo
 * @property {WorktreeStatusInfo} status - What it held just before (what `force` discarded, if anything).
 * @property {Array<CommandRunInfo>} teardown
 * @property {boolean} removed - The folder was removed (`false` when it had vanished already).
 * @property {boolean} branchDeleted - The branch was deleted (only when every commit on it is reachable elsewhere).
 */

/**
 * What a worktree holds that exists nowhere else.
 * @typedef {Object} WorktreeStatusInfo
 * @property {string} path
 * @property {string} branch
 * @property {boolean} missing - The folder vanished outside drover.
 * @property {Array<string>} uncommitted - `git status --porcelain` entries (`XY path`), at most 200.
 * @property {number} uncommittedCount
 * @property {Array<string>} unpushed - Commits reachable from no other branch, remote or the base (`abc1234 subject`), at most 200.
 * @property {number} unpushedCount
 */

/**
 * The kinds of timeline item drover writes (an item's `kind`), stored and sent as these
 * names.
 * @typedef {'plan' | 'mode' | 'config' | 'usage' | 'available_commands' | 'session_info' | 'turn_started' | 'user_message' | 'agent_message' | 'agent_thought' | 'tool_call' | 'permission' | 'turn_ended' | 'notice' | 'raw'} ItemKind
 */

/**
 * How a turn ended: the `event` of a `turn_ended` timeline item, with its detail beside
 * it (`stopReason`, `error`, `cause`, `reason`).
 * @typedef {'turn_completed' | 'turn_failed' | 'turn_canceled' | 'turn_interrupted' | 'turn_blocked' | 'turn_limited'} TurnEnd
 */

/**
 * Why a turn was cancelled (the `cause` of a `turn_canceled`).
 * @typedef {'user' | 'parent' | 'archive' | 'shutdown' | 'budget'} CancelCause
 */

/**
 * Why the daemon stopped under a turn (the `cause` of a `turn_interrupted`).
 * @typedef {'shutdown' | 'crash'} InterruptCause
 */

/**
 * One client frame: a request and the correlation id its answer echoes.
 * @typedef {({
 *  requestId?: string | null,
 *}) & ({
 *  type: 'hello',
 *  client: string,
 *  version?: string | null,
 *  protocolVersion: number,
 *  capabilities?: Array<string>,
 *  token?: string | null,
 *  includeArchived?: boolean,
 *} | {
 *  type: 'initialize_agent_request',
 *  agentId: string,
 *  limit?: number | null,
 *} | {
 *  type: 'fetch_timeline',
 *  agentId: string,
 *  before?: number | null,
 *  after?: number | null,
 *  limit?: number | null,
 *} | {
 *  type: 'create_agent',
 *  provider: string,
 *  cwd?: string | null,
 *  workspaceId?: string | null,
 *  prompt?: string | null,
 *  title?: string | null,
 *  model?: string | null,
 *  mode?: string | null,
 *  effort?: string | null,
 *  labels?: {[key: string]: string},
 *  parentAgentId?: string | null,
 *  autoArchive?: boolean,
 *  permissionPolicy?: PermissionPolicy,
 *  onInterrupt?: OnInterrupt | null,
 *  onLimit?: OnLimit | null,
 *  budget?: Budget | null,
 *  worktree?: NewWorktree | null,
 *  host?: string | null,
 *  upstream?: Upstream | null,
 *} | {
 *  type: 'send_message',
 *  agentId: string,
 *  text: string,
 *  delivery?: Delivery,
 *  notifyUpstream?: boolean,
 *} | {
 *  type: 'cancel',
 *  agentId: string,
 *  keepInbox?: boolean,
 *} | {
 *  type: 'archive',
 *  agentId: string,
 *  stopActivity?: boolean,
 *  dryRun?: boolean,
 *} | {
 *  type: 'unarchive',
 *  agentId: string,
 *} | {
 *  type: 'detach',
 *  agentId: string,
 *} | {
 *  type: 'archive_idle_children',
 *  agentId: string,
 *} | {
 *  type: 'answer_permission',
 *  agentId: string,
 *  seq?: number | null,
 *  kind?: string | null,
 *  optionId?: string | null,
 *  cancel?: boolean,
 *} | {
 *  type: 'set_mode',
 *  agentId: string,
 *  modeId: string,
 *} | {
 *  type: 'set_model',
 *  agentId: string,
 *  modelId: string,
 *} | {
 *  type: 'set_config_option',
 *  agentId: string,
 *  configId: string,
 *  value: string,
 *} | {
 *  type: 'set_title',
 *  agentId: string,
 *  title?: string | null,
 *} | {
 *  type: 'set_budget',
 *  agentId: string,
 *  budget?: Budget | null,
 *} | {
 *  type: 'clear_attention',
 *  agentId: string,
 *} | {
 *  type: 'workspace_changes',
 *  workspaceId: string,
 *} | {
 *  type: 'list_providers',
 *  askSignIn?: string | null,
 *} | {
 *  type: 'get_agent',
 *  agentId: string,
 *} | {
 *  type: 'list_hosts',
 *} | {
 *  type: 'add_host',
 *  host: HostConfig,
 *} | {
 *  type: 'remove_host',
 *  name: string,
 *} | {
 *  type: 'ping',
 *} | {
 *  type: 'list_agents',
 *  includeArchived?: boolean,
 *} | {
 *  type: 'wait_idle',
 *  agentId: string,
 *  timeoutMs?: number | null,
 *} | {
 *  type: 'list_workspaces',
 *  includeArchived?: boolean,
 *} | {
 *  type: 'create_worktree',
 *  repository: string,
 *  name?: string | null,
 *  branch?: string | null,
 *  base?: string | null,
 *} | {
 *  type: 'get_worktree_status',
 *  workspaceId: string,
 *} | {
 *  type: 'archive_workspace',
 *  workspaceId: string,
 *  force?: boolean,
 *} | {
 *  type: 'create_schedule',
 *  prompt: string,
 *  when: ScheduleWhen,
 *  agentId?: string | null,
 *  newAgent?: ScheduleNewAgent | null,
 *  title?: string | null,
 *} | {
 *  type: 'list_schedules',
 *  agentId?: string | null,
 *} | {
 *  type: 'pause_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'resume_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'delete_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'start_job',
 *  agentId: string,
 *  command: string,
 *  cwd?: string | null,
 *  env?: {[key: string]: string},
 *  timeoutS?: number | null,
 *  notifyOnExit?: boolean | null,
 *} | {
 *  type: 'list_jobs',
 *  agentId?: string | null,
 *} | {
 *  type: 'job_output',
 *  jobId: string,
 *  offset?: number | null,
 *  tail?: number | null,
 *  maxBytes?: number | null,
 *  waitMs?: number | null,
 *} | {
 *  type: 'follow_job',
 *  jobId: string,
 *  offset?: number | null,
 *} | {
 *  type: 'unfollow_job',
 *  jobId: string,
 *} | {
 *  type: 'kill_job',
 *  jobId: string,
 *} | {
 *  type: 'wait_job',
 *  jobId: string,
 *  timeoutMs?: number | null,
 *} | {
 *  type: 'restart_agent',
 *  agentId: string,
 *} | {
 *  type: 'sign_in',
 *  provider: string,
 *  methodId: string,
 *  vars?: {[key: string]: string},
 *} | {
 *  type: 'import_paseo',
 *  path: string,
 *  apply?: boolean,
 *} | {
 *  type: 'import_sessions',
 *  provider: string,
 *  cwd?: string | null,
 *  sessions?: Array<string>,
 *  apply?: boolean,
 *} | {
 *  type: 'watching',
 *  agentId?: string | null,
 *} | {
 *  type: 'notify_status',
 *} | {
 *  type: 'notify_test',
 *  sink?: string | null,
 *} | {
 *  type: 'take_notices',
 *} | {
 *  type: 'ack_notices',
 *  ids: Array<string>,
 *} | {
 *  type: 'set_upstream_gate',
 *  agentId: string,
 *  archived?: string | null,
 *} | {
 *  type: 'set_upstream_budget',
 *  agentId: string,
 *  budgets?: Array<Budget>,
 *} | {
 *  type: 'create_terminal',
 *  workspaceId: string,
 *  cols?: number | null,
 *  rows?: number | null,
 *} | {
 *  type: 'list_terminals',
 *  workspaceId?: string | null,
 *} | {
 *  type: 'attach_terminal',
 *  terminalId: string,
 *  offset?: number | null,
 *} | {
 *  type: 'detach_terminal',
 *  terminalId: string,
 *} | {
 *  type: 'terminal_input',
 *  terminalId: string,
 *  data: string,
 *} | {
 *  type: 'resize_terminal',
 *  terminalId: string,
 *  cols: number,
 *  rows: number,
 *} | {
 *  type: 'close_terminal',
 *  terminalId: string,
 *})} ClientRequest
 */

/**
 * What the daemon sends.
 * @typedef {{
 *  type: 'welcome',
 *  payload: {
 *    daemonVersion: string,
 *    protocolVersion: number,
 *    sessionId: string,
 *    maxLive?: number | null,
 *  },
 *} | {
 *  type: 'session_state',
 *  payload: {
 *    agents: Array<AgentInfo>,
 *    workspaces: Array<WorkspaceInfo>,
 *    hosts?: Array<HostInfo>,
 *  },
 *} | {
 *  type: 'agent_initialized',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    info: AgentInfo,
 *    updates: Array<AgentUpdate>,
 *    hasOlder: boolean,
 *    cursor?: number | null,
 *    pendingPermissions: Array<any>,
 *    revision?: number,
 *  },
 *} | {
 *  type: 'agent_status',
 *  payload: {
 *    agent: AgentInfo,
 *  },
 *} | {
 *  type: 'agent_update',
 *  payload: AgentUpdate,
 *} | {
 *  type: 'workspace_update',
 *  payload: {
 *    workspace?: WorkspaceInfo | null,
 *    workspaceId: string,
 *    activity?: WorkspaceActivity | null,
 *  },
 *} | {
 *  type: 'timeline_page',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    items: Array<any>,
 *    hasOlder: boolean,
 *    hasNewer: boolean,
 *  },
 *} | {
 *  type: 'agent_created',
 *  payload: {
 *    requestId?: string | null,
 *    agent: AgentInfo,
 *    reusedWorktree?: boolean,
 *  },
 *} | {
 *  type: 'message_queued',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    messageId: string,
 *  },
 *} | {
 *  type: 'notices',
 *  payload: {
 *    requestId?: string | null,
 *    notices: Array<NoticeInfo>,
 *  },
 *} | {
 *  type: 'notice_queued',
 *  payload: {
 *    notice: NoticeInfo,
 *  },
 *} | {
 *  type: 'ok',
 *  payload: {
 *    requestId?: string | null,
 *    agentId?: string | null,
 *  },
 *} | {
 *  type: 'archived',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    archived: Array<string>,
 *    stopped: any,
 *  },
 *} | {
 *  type: 'children_archived',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    archived: Array<string>,
 *    skipped: any,
 *  },
 *} | {
 *  type: 'providers',
 *  payload: {
 *    requestId?: string | null,
 *    providers: Array<ProviderInfo>,
 *  },
 *} | {
 *  type: 'notify_status',
 *  payload: {
 *    requestId?: string | null,
 *    sinks: Array<NotifySinkInfo>,
 *  },
 *} | {
 *  type: 'notify_tested',
 *  payload: {
 *    requestId?: string | null,
 *    results: Array<NotifyTestResult>,
 *  },
 *} | {
 *  type: 'signed_in',
 *  payload: {
 *    requestId?: string | null,
 *    provider: string,
 *    methodId: string,
 *    retried: Array<string>,
 *  },
 *} | {
 *  type: 'imported',
 *  payload: {
 *    requestId?: string | null,
 *    dryRun: boolean,
 *    imported: Array<ImportedAgentInfo>,
 *    skipped: Array<ImportSkip>,
 *  },
 *} | {
 *  type: 'agents',
 *  payload: {
 *    requestId?: string | null,
 *    agents: Array<AgentInfo>,
 *  },
 *} | {
 *  type: 'hosts',
 *  payload: {
 *    requestId?: string | null,
 *    hosts: Array<HostInfo>,
 *  },
 *} | {
 *  type: 'host_update',
 *  payload: {
 *    name: string,
 *    host?: HostInfo | null,
 *  },
 *} | {
 *  type: 'agent',
 *  payload: {
 *    requestId?: string | null,
 *    agent: AgentInfo,
 *  },
 *} | {
 *  type: 'idle',
 *  payload: {
 *    requestId?: string | null,
 *    agentId: string,
 *    idle: boolean,
 *  },
 *} | {
 *  type: 'workspaces',
 *  payload: {
 *    requestId?: string | null,
 *    workspaces: Array<WorkspaceInfo>,
 *  },
 *} | {
 *  type: 'worktree_created',
 *  payload: {
 *    requestId?: string | null,
 *    workspace: WorkspaceInfo,
 *    setup: Array<CommandRunInfo>,
 *  },
 *} | {
 *  type: 'worktree_status',
 *  payload: {
 *    requestId?: string | null,
 *    workspaceId: string,
 *    status: WorktreeStatusInfo,
 *  },
 *} | {
 *  type: 'workspace_changes',
 *  payload: {
 *    requestId?: string | null,
 *    workspaceId: string,
 *    changes: WorkspaceChangesInfo,
 *  },
 *} | {
 *  type: 'workspace_archived',
 *  payload: {
 *    requestId?: string | null,
 *    workspaceId: string,
 *    archivedAt?: string | null,
 *    alreadyArchived: boolean,
 *    agents: Array<string>,
 *    worktree?: WorktreeRemovalInfo | null,
 *  },
 *} | {
 *  type: 'job',
 *  payload: {
 *    requestId?: string | null,
 *    job: JobInfo,
 *  },
 *} | {
 *  type: 'jobs',
 *  payload: {
 *    requestId?: string | null,
 *    jobs: Array<JobInfo>,
 *  },
 *} | {
 *  type: 'job_output',
 *  payload: {
 *    requestId?: string | null,
 *    jobId: string,
 *    offset: number,
 *    text: string,
 *    nextOffset: number,
 *    end: number,
 *    skipped: number,
 *    eof: boolean,
 *  },
 *} | {
 *  type: 'job_waited',
 *  payload: {
 *    requestId?: string | null,
 *    job: JobInfo,
 *    ended: boolean,
 *  },
 *} | {
 *  type: 'job_update',
 *  payload: {
 *    job: JobInfo,
 *  },
 *} | {
 *  type: 'job_followed',
 *  payload: {
 *    requestId?: string | null,
 *    job: JobInfo,
 *    offset: number,
 *  },
 *} | {
 *  type: 'job_unfollowed',
 *  payload: {
 *    requestId?: string | null,
 *    jobId: string,
 *    followed: boolean,
 *  },
 *} | {
 *  type: 'job_output_update',
 *  payload: {
 *    jobId: string,
 *    offset: number,
 *    text: string,
 *    nextOffset: number,
 *    end: number,
 *    skipped: number,
 *    eof: boolean,
 *  },
 *} | {
 *  type: 'terminal',
 *  payload: {
 *    requestId?: string | null,
 *    terminal: TerminalInfo,
 *  },
 *} | {
 *  type: 'terminals',
 *  payload: {
 *    requestId?: string | null,
 *    terminals: Array<TerminalInfo>,
 *  },
 *} | {
 *  type: 'terminal_attached',
 *  payload: {
 *    requestId?: string | null,
 *    terminal: TerminalInfo,
 *    offset: number,
 *  },
 *} | {
 *  type: 'terminal_detached',
 *  payload: {
 *    requestId?: string | null,
 *    terminalId: string,
 *    attached: boolean,
 *  },
 *} | {
 *  type: 'terminal_output',
 *  payload: {
 *    terminalId: string,
 *    offset: number,
 *    data: string,
 *    nextOffset: number,
 *  },
 *} | {
 *  type: 'terminal_exit',
 *  payload: {
 *    terminalId: string,
 *    status: string,
 *    exitCode?: number | null,
 *  },
 *} | {
 *  type: 'terminal_update',
 *  payload: {
 *    terminalId: string,
 *    terminal?: TerminalInfo | null,
 *  },
 *} | {
 *  type: 'request_error',
 *  payload: {
 *    requestId?: string | null,
 *    code: ErrorCode,
 *    message: string,
 *    details?: any,
 *  },
 *} | {
 *  type: 'resync_required',
 *  payload: {
 *    reason: string,
 *  },
 *} | {
 *  type: 'schedule',
 *  payload: {
 *    requestId?: string | null,
 *    schedule: ScheduleInfo,
 *  },
 *} | {
 *  type: 'schedules',
 *  payload: {
 *    requestId?: string | null,
 *    schedules: Array<ScheduleInfo>,
 *  },
 *} | {
 *  type: 'schedule_deleted',
 *  payload: {
 *    requestId?: string | null,
 *    scheduleId: string,
 *  },
 *} | {
 *  type: 'schedule_update',
 *  payload: {
 *    scheduleId: string,
 *    schedule?: ScheduleInfo | null,
 *  },
 *}} DaemonMessage
 */

/**
 * @typedef {{
 *  type: 'hello',
 *  client: string,
 *  version?: string | null,
 *  protocolVersion: number,
 *  capabilities?: Array<string>,
 *  token?: string | null,
 *  includeArchived?: boolean,
 *} | {
 *  type: 'initialize_agent_request',
 *  agentId: string,
 *  limit?: number | null,
 *} | {
 *  type: 'fetch_timeline',
 *  agentId: string,
 *  before?: number | null,
 *  after?: number | null,
 *  limit?: number | null,
 *} | {
 *  type: 'create_agent',
 *  provider: string,
 *  cwd?: string | null,
 *  workspaceId?: string | null,
 *  prompt?: string | null,
 *  title?: string | null,
 *  model?: string | null,
 *  mode?: string | null,
 *  effort?: string | null,
 *  labels?: {[key: string]: string},
 *  parentAgentId?: string | null,
 *  autoArchive?: boolean,
 *  permissionPolicy?: PermissionPolicy,
 *  onInterrupt?: OnInterrupt | null,
 *  onLimit?: OnLimit | null,
 *  budget?: Budget | null,
 *  worktree?: NewWorktree | null,
 *  host?: string | null,
 *  upstream?: Upstream | null,
 *} | {
 *  type: 'send_message',
 *  agentId: string,
 *  text: string,
 *  delivery?: Delivery,
 *  notifyUpstream?: boolean,
 *} | {
 *  type: 'cancel',
 *  agentId: string,
 *  keepInbox?: boolean,
 *} | {
 *  type: 'archive',
 *  agentId: string,
 *  stopActivity?: boolean,
 *  dryRun?: boolean,
 *} | {
 *  type: 'unarchive',
 *  agentId: string,
 *} | {
 *  type: 'detach',
 *  agentId: string,
 *} | {
 *  type: 'archive_idle_children',
 *  agentId: string,
 *} | {
 *  type: 'answer_permission',
 *  agentId: string,
 *  seq?: number | null,
 *  kind?: string | null,
 *  optionId?: string | null,
 *  cancel?: boolean,
 *} | {
 *  type: 'set_mode',
 *  agentId: string,
 *  modeId: string,
 *} | {
 *  type: 'set_model',
 *  agentId: string,
 *  modelId: string,
 *} | {
 *  type: 'set_config_option',
 *  agentId: string,
 *  configId: string,
 *  value: string,
 *} | {
 *  type: 'set_title',
 *  agentId: string,
 *  title?: string | null,
 *} | {
 *  type: 'set_budget',
 *  agentId: string,
 *  budget?: Budget | null,
 *} | {
 *  type: 'clear_attention',
 *  agentId: string,
 *} | {
 *  type: 'workspace_changes',
 *  workspaceId: string,
 *} | {
 *  type: 'list_providers',
 *  askSignIn?: string | null,
 *} | {
 *  type: 'get_agent',
 *  agentId: string,
 *} | {
 *  type: 'list_hosts',
 *} | {
 *  type: 'add_host',
 *  host: HostConfig,
 *} | {
 *  type: 'remove_host',
 *  name: string,
 *} | {
 *  type: 'ping',
 *} | {
 *  type: 'list_agents',
 *  includeArchived?: boolean,
 *} | {
 *  type: 'wait_idle',
 *  agentId: string,
 *  timeoutMs?: number | null,
 *} | {
 *  type: 'list_workspaces',
 *  includeArchived?: boolean,
 *} | {
 *  type: 'create_worktree',
 *  repository: string,
 *  name?: string | null,
 *  branch?: string | null,
 *  base?: string | null,
 *} | {
 *  type: 'get_worktree_status',
 *  workspaceId: string,
 *} | {
 *  type: 'archive_workspace',
 *  workspaceId: string,
 *  force?: boolean,
 *} | {
 *  type: 'create_schedule',
 *  prompt: string,
 *  when: ScheduleWhen,
 *  agentId?: string | null,
 *  newAgent?: ScheduleNewAgent | null,
 *  title?: string | null,
 *} | {
 *  type: 'list_schedules',
 *  agentId?: string | null,
 *} | {
 *  type: 'pause_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'resume_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'delete_schedule',
 *  scheduleId: string,
 *} | {
 *  type: 'start_job',
 *  agentId: string,
 *  command: string,
 *  cwd?: string | null,
 *  env?: {[key: string]: string},
 *  timeoutS?: number | null,
 *  notifyOnExit?: boolean | null,
 *} | {
 *  type: 'list_jobs',
 *  agentId?: string | null,
 *} | {
 *  type: 'job_output',
 *  jobId: string,
 *  offset?: number | null,
 *  tail?: number | null,
 *  maxBytes?: number | null,
 *  waitMs?: number | null,
 *} | {
 *  type: 'follow_job',
 *  jobId: string,
 *  offset?: number | null,
 *} | {
 *  type: 'unfollow_job',
 *  jobId: string,
 *} | {
 *  type: 'kill_job',
 *  jobId: string,
 *} | {
 *  type: 'wait_job',
 *  jobId: string,
 *  timeoutMs?: number | null,
 *} | {
 *  type: 'restart_agent',
 *  agentId: string,
 *} | {
 *  type: 'sign_in',
 *  provider: string,
 *  methodId: string,
 *  vars?: {[key: string]: string},
 *} | {
 *  type: 'import_paseo',
 *  path: string,
 *  apply?: boolean,
 *} | {
 *  type: 'import_sessions',
 *  provider: string,
 *  cwd?: string | null,
 *  sessions?: Array<string>,
 *  apply?: boolean,
 *} | {
 *  type: 'watching',
 *  agentId?: string | null,
 *} | {
 *  type: 'notify_status',
 *} | {
 *  type: 'notify_test',
 *  sink?: string | null,
 *} | {
 *  type: 'take_notices',
 *} | {
 *  type: 'ack_notices',
 *  ids: Array<string>,
 *} | {
 *  type: 'set_upstream_gate',
 *  agentId: string,
 *  archived?: string | null,
 *} | {
 *  type: 'set_upstream_budget',
 *  agentId: string,
 *  budgets?: Array<Budget>,
 *} | {
 *  type: 'create_terminal',
 *  workspaceId: string,
 *  cols?: number | null,
 *  rows?: number | null,
 *} | {
 *  type: 'list_terminals',
 *  workspaceId?: string | null,
 *} | {
 *  type: 'attach_terminal',
 *  terminalId: string,
 *  offset?: number | null,
 *} | {
 *  type: 'detach_terminal',
 *  terminalId: string,
 *} | {
 *  type: 'terminal_input',
 *  terminalId: string,
 *  data: string,
 *} | {
 *  type: 'resize_terminal',
 *  terminalId: string,
 *  cols: number,
 *  rows: number,
 *} | {
 *  type: 'close_terminal',
 *  terminalId: string,
 *}} ClientMessage
 */

