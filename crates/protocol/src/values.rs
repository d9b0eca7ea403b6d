//! Every field of the protocol whose values form a fixed set, as an enum: statuses, attention,
//! timeline item kinds, turn ends and their causes, job and schedule states, error codes,
//! activity. Each is defined once by [`wire_enum!`], so its variants, [`WireEnum::ALL`], the
//! wire strings and the JSON Schema (which lists them) cannot disagree; the web UI's constants
//! are generated from the same lists (`crate::js`).

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A fixed-value field of the protocol: every value, and each one's wire string.
pub trait WireEnum: Copy + 'static {
    /// The name the generated JavaScript and the JSON Schema know it by.
    const NAME: &'static str;
    /// Every value, in declaration order.
    const ALL: &'static [Self];
    /// Each value's Rust name, in the same order (the generated JavaScript's keys).
    const NAMES: &'static [&'static str];
    /// The value as it goes on the wire.
    fn as_str(self) -> &'static str;
}

/// Defines a fixed-value enum from one list of `Variant => "wire"` pairs: serde renames, the
/// schema, `ALL`, `as_str`, `parse` and `Display` all come from that list.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident => $wire:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            JsonSchema,
        )]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $wire)] $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The value as it goes on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                }
            }

            /// The value named `wire`; `None` for one this drover does not know.
            pub fn parse(wire: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.as_str() == wire)
            }
        }

        impl WireEnum for $name {
            const NAME: &'static str = stringify!($name);
            const ALL: &'static [$name] = $name::ALL;
            const NAMES: &'static [&'static str] = &[$(stringify!($variant),)*];
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

wire_enum! {
    /// Why a request failed: the stable `code` of a `request_error` (and of an MCP tool
    /// error). Clients match on it; the message beside it is for people.
    /// `docs/protocol.md` explains each one (a test keeps the two in step).
    pub enum ErrorCode {
        InvalidMessage => "invalid_message",
        UnknownType => "unknown_type",
        HelloRequired => "hello_required",
        UnsupportedVersion => "unsupported_version",
        Unauthorized => "unauthorized",
        UnknownAgent => "unknown_agent",
        UnknownWorkspace => "unknown_workspace",
        UnknownProvider => "unknown_provider",
        InvalidConfig => "invalid_config",
        ProviderUnavailable => "provider_unavailable",
        InvalidInput => "invalid_input",
        InvalidId => "invalid_id",
        NotPermitted => "not_permitted",
        AgentActive => "agent_active",
        AgentArchived => "agent_archived",
        TurnBlocked => "turn_blocked",
        IllegalTransition => "illegal_transition",
        NoSuchPermission => "no_such_permission",
        AgentStartFailed => "agent_start_failed",
        AgentError => "agent_error",
        RuntimeStopped => "runtime_stopped",
        StoreFailed => "store_failed",
        ShuttingDown => "shutting_down",
        NotAWorktree => "not_a_worktree",
        NotAGitRepository => "not_a_git_repository",
        GitFailed => "git_failed",
        InvalidProjectFile => "invalid_project_file",
        WorktreeSetupFailed => "worktree_setup_failed",
        WorktreeTeardownFailed => "worktree_teardown_failed",
        WorktreeDirty => "worktree_dirty",
        WorktreeBusy => "worktree_busy",
        WorktreeIoFailed => "worktree_io_failed",
        TooManyRequests => "too_many_requests",
        UnknownSchedule => "unknown_schedule",
        UnknownJob => "unknown_job",
        JobStartFailed => "job_start_failed",
        BudgetExhausted => "budget_exhausted",
        UnknownHost => "unknown_host",
        HostUnreachable => "host_unreachable",
        UnknownTerminal => "unknown_terminal",
        TerminalStartFailed => "terminal_start_failed",
        WorkspaceArchived => "workspace_archived",
    }
}

wire_enum! {
    /// An agent's lifecycle status (`AgentInfo.status`); the daemon's state machine over these
    /// values lives in `drover-core`'s `lifecycle`.
    pub enum AgentStatus {
        /// The runtime is starting (process spawn, ACP handshake, session load).
        Initializing => "initializing",
        /// Ready for a prompt, with or without a live runtime.
        Idle => "idle",
        /// A turn is in progress (including one waiting on a permission).
        Running => "running",
        /// The runtime or the last turn failed; `error` says why.
        Error => "error",
        /// The runtime was shut down for good; it is started again only on request.
        Closed => "closed",
    }
}

wire_enum! {
    /// Why an agent asks for its user (`AgentInfo.attentionReason`).
    pub enum AttentionReason {
        /// A turn ended and nobody has looked yet.
        Finished => "finished",
        /// The runtime or a turn failed.
        Error => "error",
        /// The agent waits on a permission answer.
        Permission => "permission",
        /// The daemon stopped (crash or restart) while the agent was working.
        Interrupted => "interrupted",
        /// The agent cannot start until someone signs its provider in (`startFailure`).
        AuthRequired => "auth_required",
        /// The agent waits for its provider's usage limit to reset (`limited`).
        Limited => "limited",
        /// The tree under the agent's budget spent 80 % of it.
        BudgetWarning => "budget_warning",
    }
}

wire_enum! {
    /// Where an agent's runtime is (`RuntimeInfo.state`).
    pub enum RuntimeState {
        /// No process: never started, hibernated, stopped, or failed.
        Cold => "cold",
        /// A start waits for a slot under `[runtimes] max_live`.
        Queued => "queued",
        /// Its process is starting (spawn and ACP handshake).
        Starting => "starting",
        /// Its process runs with an open session.
        Live => "live",
    }
}

wire_enum! {
    /// A host's link as the hub sees it (`HostInfo.state`).
    pub enum HostState {
        /// The link is being made (the hub started, the host was added, or a link broke).
        Connecting => "connecting",
        /// The link carries messages.
        Reachable => "reachable",
        /// The link is down; `HostInfo.error` says why.
        Unreachable => "unreachable",
        /// The host's daemon speaks another protocol version; `HostInfo.error` names both.
        Incompatible => "incompatible",
    }
}

wire_enum! {
    /// What kind of directory a workspace is (`WorkspaceInfo.kind`).
    pub enum WorkspaceKind {
        /// A plain directory.
        Directory => "directory",
        /// The main checkout of a git repository.
        LocalCheckout => "local_checkout",
        /// A linked git worktree.
        Worktree => "worktree",
    }
}

wire_enum! {
    /// What a workspace shows (`WorkspaceInfo.activity`), from least to most urgent.
    pub enum WorkspaceActivity {
        /// Agents are there, none working or asking for anything.
        Idle => "idle",
        /// A root agent finished (or was interrupted) and nobody has looked yet.
        Attention => "attention",
        /// A root agent is starting or running a turn, or a subagent of one is.
        Running => "running",
        /// A root agent failed.
        Error => "error",
        /// A root agent waits on a permission answer.
        Permission => "permission",
    }
}

wire_enum! {
    /// How a job is doing (`JobInfo.status`).
    pub enum JobStatus {
        Running => "running",
        /// Ended on its own (any exit status, or a signal drover did not send).
        Exited => "exited",
        /// Ended by drover: `killedBy` says why.
        Killed => "killed",
        /// The daemon died while it ran; the next boot ended what was left of it.
        Lost => "lost",
    }
}

wire_enum! {
    /// Why drover killed a job (`JobInfo.killedBy`).
    pub enum KillCause {
        /// `kill_job`, `drover job kill`, ACP `terminal/kill` or `terminal/release`.
        Request => "request",
        /// Its `timeoutS` passed.
        Timeout => "timeout",
        /// The archive of its owner with `stopActivity`.
        Archive => "archive",
        /// The daemon stopped.
        Shutdown => "shutdown",
        /// The agent runtime that opened it as an ACP terminal ended.
        RuntimeEnded => "runtime_ended",
    }
}

wire_enum! {
    /// Where a schedule is (`ScheduleInfo.state`).
    pub enum ScheduleState {
        Active => "active",
        Paused => "paused",
        /// A `once` schedule that ran.
        Finished => "finished",
    }
}

wire_enum! {
    /// A provider's sign-in as the daemon last saw it (`ProviderSignIn.state`).
    #[derive(Default)]
    pub enum SignInState {
        /// Its last session opened.
        SignedIn => "signed_in",
        /// It refused a session and no method could be used without the user.
        NeedsSignIn => "needs_sign_in",
        /// No agent of it started yet.
        #[default]
        Unknown => "unknown",
    }
}

wire_enum! {
    /// How a file changed (`ChangedFileInfo.status`).
    pub enum ChangeStatus {
        Added => "added",
        Modified => "modified",
        Deleted => "deleted",
        Renamed => "renamed",
        Copied => "copied",
        TypeChanged => "type_changed",
        Untracked => "untracked",
    }
}

wire_enum! {
    /// What a notification sink delivers to (`NotifySinkInfo.kind`).
    pub enum SinkKind {
        Webhook => "webhook",
        Ntfy => "ntfy",
        Command => "command",
    }
}

wire_enum! {
    /// What a notification is about (`NotifySinkInfo.events`: the ones a sink may ask for).
    pub enum NotifyEvent {
        /// A turn ended (attention `finished`).
        Finished => "finished",
        /// A turn or the runtime failed, or the agent could not start (attention `error`).
        Failed => "failed",
        /// The agent waits on a permission answer.
        Permission => "permission",
        /// The agent cannot start until its provider is signed in.
        AuthRequired => "auth_required",
        /// The daemon stopped while the agent worked (found at boot).
        Interrupted => "interrupted",
        /// The agent waits for its provider's usage limit to reset.
        Limited => "limited",
        /// What a sink's limit held back, counted (sent after the window).
        Summary => "summary",
        /// A sample (`notify_test`).
        Test => "test",
    }
}

wire_enum! {
    /// How an agent reported a subagent it runs itself (`OwnSubagentInfo.via`).
    pub enum SubagentVia {
        /// A tool call of claude's Task tool.
        ToolCall => "tool_call",
        /// An ACP `subagent_update`.
        SubagentUpdate => "subagent_update",
    }
}

wire_enum! {
    /// The kinds of timeline item drover writes (an item's `kind`), stored and sent as these
    /// names.
    pub enum ItemKind {
        /// A message delivered to the agent (`text`, `context`, `messageId`, `delivery`,
        /// `source`, and `notify`: the agent told how the turn goes, if any).
        UserMessage => "user_message",
        /// The agent's reply; streamed chunks append to `text`.
        AgentMessage => "agent_message",
        /// The agent's reasoning; streamed chunks append to `text`.
        AgentThought => "agent_thought",
        /// One tool call, its updates patched in (`toolCallId`, `title`, `status`, ...).
        ToolCall => "tool_call",
        /// A permission request (`status` `pending`, then `answered` with the `outcome`).
        Permission => "permission",
        Plan => "plan",
        Mode => "mode",
        Config => "config",
        Usage => "usage",
        AvailableCommands => "available_commands",
        SessionInfo => "session_info",
        TurnStarted => "turn_started",
        /// How a turn ended: its `event` is a [`TurnEnd`].
        TurnEnded => "turn_ended",
        /// Something drover says about the agent (`text`).
        Notice => "notice",
        /// An update drover does not map, kept whole (`update`).
        Raw => "raw",
    }
}

wire_enum! {
    /// How a turn ended: the `event` of a `turn_ended` timeline item, with its detail beside
    /// it (`stopReason`, `error`, `cause`, `reason`).
    pub enum TurnEnd {
        /// The agent ended its turn (`stopReason`).
        Completed => "turn_completed",
        /// The turn ended in an error (`error`).
        Failed => "turn_failed",
        /// Someone cancelled the turn (`cause`: a [`CancelCause`]).
        Canceled => "turn_canceled",
        /// The daemon stopped under the turn (`cause`: an [`InterruptCause`]).
        Interrupted => "turn_interrupted",
        /// The turn could not start (`reason`).
        Blocked => "turn_blocked",
        /// The provider's usage limit stopped it: its prompt waits to be sent again
        /// (`error`, `retryAt`, `resetAt`).
        Limited => "turn_limited",
    }
}

impl TurnEnd {
    /// Whether the turn did what it was asked.
    pub fn succeeded(self) -> bool {
        self == TurnEnd::Completed
    }
}

wire_enum! {
    /// Why a turn was cancelled (the `cause` of a `turn_canceled`).
    pub enum CancelCause {
        /// The user pressed stop.
        User => "user",
        /// The agent's parent stopped it (including through the parent's archive).
        Parent => "parent",
        /// The agent itself was archived.
        Archive => "archive",
        /// The daemon is shutting down.
        Shutdown => "shutdown",
        /// The agent's tree spent a budget set with `hard = true`.
        Budget => "budget",
    }
}

wire_enum! {
    /// Why the daemon stopped under a turn (the `cause` of a `turn_interrupted`).
    pub enum InterruptCause {
        /// The daemon shut down (the turn's end was written then).
        Shutdown => "shutdown",
        /// The daemon died (the next boot wrote the turn's end).
        Crash => "crash",
    }
}
