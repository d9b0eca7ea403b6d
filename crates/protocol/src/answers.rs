//! The daemon's answers to requests: each its own struct, named after its `type`, inside the
//! [`Answer`] envelope that carries the request's `requestId` (once, for every answer). On
//! the wire the envelope's `requestId` and the answer's fields are one `payload` object.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    AgentInfo, AgentUpdate, CommandRunInfo, DaemonMessage, ErrorCode, HostInfo, ImportSkip,
    ImportedAgentInfo, JobInfo, NoticeInfo, NotifySinkInfo, NotifyTestResult, ProviderInfo,
    ScheduleInfo, TerminalInfo, WorkspaceChangesInfo, WorkspaceInfo, WorktreeRemovalInfo,
    WorktreeStatusInfo,
};

/// One answer: the request's correlation id and the answer's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct Answer<T> {
    /// The request's `requestId` (`null` when it had none).
    pub request_id: Option<String>,
    #[serde(flatten)]
    pub body: T,
}

impl DaemonMessage {
    /// The answer `body` to the request `request_id` came with.
    pub fn answer<T>(request_id: Option<String>, body: T) -> DaemonMessage
    where
        Answer<T>: Into<DaemonMessage>,
    {
        Answer { request_id, body }.into()
    }

    /// The body of the answer this message is when it is a `T`; the message itself (boxed:
    /// it is large) when not.
    pub fn into_answer<T: Body>(self) -> Result<T, Box<DaemonMessage>> {
        T::of(self)
    }
}

/// The body of one kind of answer.
pub trait Body: Sized {
    /// `message`'s body when it is this kind of answer; the message itself when not.
    fn of(message: DaemonMessage) -> Result<Self, Box<DaemonMessage>>;
}

macro_rules! answers {
    ($($name:ident,)*) => {
        $(impl From<Answer<$name>> for DaemonMessage {
            fn from(answer: Answer<$name>) -> DaemonMessage {
                DaemonMessage::$name(answer)
            }
        }

        impl Body for $name {
            fn of(message: DaemonMessage) -> Result<$name, Box<DaemonMessage>> {
                match message {
                    DaemonMessage::$name(answer) => Result::Ok(answer.body),
                    other => Result::Err(Box::new(other)),
                }
            }
        })*
    };
}

answers! {
    AgentInitialized,
    TimelinePage,
    AgentCreated,
    MessageQueued,
    Notices,
    Ok,
    Archived,
    ChildrenArchived,
    Providers,
    NotifyStatus,
    NotifyTested,
    SignedIn,
    Imported,
    Agents,
    Hosts,
    Agent,
    Idle,
    Workspaces,
    WorktreeCreated,
    WorktreeStatus,
    WorkspaceChanges,
    WorkspaceArchived,
    Job,
    Jobs,
    JobOutput,
    JobWaited,
    JobFollowed,
    JobUnfollowed,
    Terminal,
    Terminals,
    TerminalAttached,
    TerminalDetached,
    RequestError,
    Schedule,
    Schedules,
    ScheduleDeleted,
}

/// `agent_initialized`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInitialized {
    pub agent_id: String,
    pub info: AgentInfo,
    /// The recent history, oldest first: each an `item` notification.
    pub updates: Vec<AgentUpdate>,
    /// Earlier items exist: fetch them with `fetch_timeline` and `before: cursor`.
    pub has_older: bool,
    pub cursor: Option<u64>,
    /// Permission requests waiting for an answer.
    pub pending_permissions: Vec<Value>,
    /// The timeline's revision this snapshot holds: `agent_update`s after it follow.
    #[serde(default)]
    pub revision: u64,
}

/// `timeline_page`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimelinePage {
    pub agent_id: String,
    pub items: Vec<Value>,
    pub has_older: bool,
    pub has_newer: bool,
}

/// `agent_created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCreated {
    pub agent: AgentInfo,
    /// The `worktree: {name}` asked for was the worktree of that name drover made earlier for
    /// the project, free (no live agent in it): the agent works in it as it is (its branch,
    /// its uncommitted work), nothing was made. Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused_worktree: bool,
}

/// `message_queued`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageQueued {
    pub agent_id: String,
    pub message_id: String,
}

/// The answer to `take_notices`: every notice not acknowledged yet, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notices {
    pub notices: Vec<NoticeInfo>,
}

/// A request that has no other answer succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ok {
    pub agent_id: Option<String>,
}

/// `archived`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Archived {
    pub agent_id: String,
    /// Every agent newly archived (the target, then its cascade).
    pub archived: Vec<String>,
    /// The activity whose stops were issued.
    pub stopped: Value,
}

/// `children_archived`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildrenArchived {
    pub agent_id: String,
    pub archived: Vec<String>,
    pub skipped: Value,
}

/// `providers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Providers {
    pub providers: Vec<ProviderInfo>,
}

/// The answer to `notify_status`: every sink of `[notify]`, in the file's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyStatus {
    pub sinks: Vec<NotifySinkInfo>,
}

/// The answer to `notify_test`: how the sample went, sink by sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyTested {
    pub results: Vec<NotifyTestResult>,
}

/// The answer to `sign_in`: the agents started again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignedIn {
    pub provider: String,
    pub method_id: String,
    pub retried: Vec<String>,
}

/// The answer to `import_paseo` and `import_sessions`: what came in (or, in a dry run,
/// would), and what not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Imported {
    pub dry_run: bool,
    pub imported: Vec<ImportedAgentInfo>,
    pub skipped: Vec<ImportSkip>,
}

/// `agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agents {
    pub agents: Vec<AgentInfo>,
}

/// The answer to `list_hosts`, `add_host` and `remove_host`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hosts {
    pub hosts: Vec<HostInfo>,
}

/// The answer to `get_agent`: its `runtime` says what its process tree holds now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    pub agent: AgentInfo,
}

/// `idle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Idle {
    pub agent_id: String,
    /// `false`: the timeout came first.
    pub idle: bool,
}

/// `workspaces`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workspaces {
    pub workspaces: Vec<WorkspaceInfo>,
}

/// `worktree_created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeCreated {
    pub workspace: WorkspaceInfo,
    /// The project's setup commands as they ran.
    pub setup: Vec<CommandRunInfo>,
}

/// `worktree_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeStatus {
    pub workspace_id: String,
    pub status: WorktreeStatusInfo,
}

/// The answer to `workspace_changes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceChanges {
    pub workspace_id: String,
    pub changes: WorkspaceChangesInfo,
}

/// `workspace_archived`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceArchived {
    pub workspace_id: String,
    pub archived_at: Option<String>,
    /// It was archived before: nothing was done.
    pub already_archived: bool,
    /// Every agent newly archived (the workspace's agents and their cascades).
    pub agents: Vec<String>,
    /// For a worktree drover made: what removing it did.
    pub worktree: Option<WorktreeRemovalInfo>,
}

/// The answer to `start_job` and `kill_job`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub job: JobInfo,
}

/// `jobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Jobs {
    pub jobs: Vec<JobInfo>,
}

/// The answer to `job_output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobOutput {
    pub job_id: String,
    /// The offset of `text`'s first byte.
    pub offset: u64,
    pub text: String,
    /// Where the next read starts (it never splits a UTF-8 character).
    pub next_offset: u64,
    /// Bytes the job has written so far.
    pub end: u64,
    /// Bytes before `offset` that were asked for but are no longer kept.
    pub skipped: u64,
    /// The job ended and everything it wrote has been read.
    pub eof: bool,
}

/// `job_waited`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobWaited {
    pub job: JobInfo,
    /// `false`: the timeout came first.
    pub ended: bool,
}

/// The answer to `follow_job`: the job now, and the offset its pushed output starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobFollowed {
    pub job: JobInfo,
    /// The `offset` asked for, or the first byte kept.
    pub offset: u64,
}

/// The answer to `unfollow_job`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobUnfollowed {
    pub job_id: String,
    /// This session was following the job (until now).
    pub followed: bool,
}

/// A request failed. The connection stays open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestError {
    /// Stable: one of [`ErrorCode`] (`invalid_message`, `unknown_agent`, `agent_active`,
    /// ...). Decoded as a string, so that an older client reads a newer daemon's codes;
    /// the schema lists the codes this version sends.
    #[schemars(with = "ErrorCode")]
    pub code: String,
    pub message: String,
    pub details: Option<Value>,
}

/// The answer to `create_schedule`, `pause_schedule`, `resume_schedule`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    pub schedule: ScheduleInfo,
}

/// The answer to `list_schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Schedules {
    pub schedules: Vec<ScheduleInfo>,
}

/// `schedule_deleted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleDeleted {
    pub schedule_id: String,
}

/// The answer to `create_terminal`, `resize_terminal` and `close_terminal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Terminal {
    pub terminal: TerminalInfo,
}

/// The answer to `list_terminals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Terminals {
    pub terminals: Vec<TerminalInfo>,
}

/// The answer to `attach_terminal`: the terminal now, and the offset its pushed output
/// starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminalAttached {
    pub terminal: TerminalInfo,
    /// The `offset` asked for, or the first byte of the kept scrollback.
    pub offset: u64,
}

/// The answer to `detach_terminal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminalDetached {
    pub terminal_id: String,
    /// This session was attached (until now).
    pub attached: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope is one `payload` object on the wire: `requestId` first (`null` without
    /// one), then the answer's fields, as when every answer declared its own `requestId`.
    #[test]
    fn an_answer_is_one_payload_with_its_request_id_first() {
        let cases = [
            (
                DaemonMessage::answer(
                    None,
                    Ok {
                        agent_id: Some("a".into()),
                    },
                ),
                r#"{"type":"ok","payload":{"requestId":null,"agentId":"a"}}"#,
            ),
            (
                DaemonMessage::answer(
                    Some("r1".into()),
                    RequestError {
                        code: "unknown_agent".into(),
                        message: "no agent `a`".into(),
                        details: None,
                    },
                ),
                r#"{"type":"request_error","payload":{"requestId":"r1","code":"unknown_agent","message":"no agent `a`","details":null}}"#,
            ),
            (
                DaemonMessage::answer(
                    Some("r2".into()),
                    JobOutput {
                        job_id: "job-1".into(),
                        offset: 0,
                        text: "hi\n".into(),
                        next_offset: 3,
                        end: 3,
                        skipped: 0,
                        eof: true,
                    },
                ),
                r#"{"type":"job_output","payload":{"requestId":"r2","jobId":"job-1","offset":0,"text":"hi\n","nextOffset":3,"end":3,"skipped":0,"eof":true}}"#,
            ),
        ];
        for (message, wire) in cases {
            assert_eq!(serde_json::to_string(&message).expect("encodes"), wire);
            let decoded: DaemonMessage = serde_json::from_str(wire).expect("decodes");
            assert_eq!(decoded, message);
        }
        // A `requestId` left out decodes as none.
        let decoded: DaemonMessage =
            serde_json::from_str(r#"{"type":"idle","payload":{"agentId":"a","idle":true}}"#)
                .expect("decodes");
        assert_eq!(decoded.request_id(), None);
        let idle: Idle = decoded.into_answer().expect("an idle answer");
        assert!(idle.idle);
    }
}
