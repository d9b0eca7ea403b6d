//! drover's MCP tools: their parameters (whose JSON Schemas the calling model reads), the one
//! table that lists them with their handlers, and the handlers, each of which calls one
//! operation as the calling agent and shapes its answer for a model to read.
//!
//! A failed call is a tool error (the model reads it), never a protocol error: malformed
//! arguments name the field (serde says which), and an operation's failure carries the same
//! code a client of the protocol gets.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use drover_core::{AgentId, WorktreeOptions};
use drover_protocol::{Delivery, OnInterrupt, OnLimit, ScheduleNewAgent, ScheduleWhen};
use rmcp::model::{CallToolResult, ContentBlock, Tool};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ops::agents::{AgentScope, CreateAgent, Placement, Summary};
use crate::ops::jobs::StartJob;
use crate::ops::schedules::{CreateSchedule, ScheduleFor};
use crate::ops::{Caller, OpError, Ops, parse_agent, parse_workspace};

/// How long `wait_for_agent` waits unless told otherwise (`wait_job`'s default is its
/// operation's).
const DEFAULT_WAIT: Duration = Duration::from_secs(50);
/// What one `job_output` returns unless told otherwise: enough to read, not to flood a context.
const MCP_OUTPUT_BYTES: usize = 16 * 1024;

// ---- parameters -------------------------------------------------------------------------------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Relationship {
    /// The new agent belongs to the caller: it shows in the caller's subagents, is archived
    /// with it, and counts as running work of the caller.
    Subagent,
    /// The new agent stands alone (a handoff, fire and forget).
    Detached,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum WorkspaceChoice {
    /// The caller's workspace, optionally in another directory.
    Current {
        #[serde(default)]
        cwd: Option<String>,
    },
    /// A new workspace.
    Create { source: WorkspaceSource },
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum WorkspaceSource {
    /// An existing directory, registered as a workspace of its own.
    Directory { path: String },
    /// A new git worktree of a repository (default: the caller's checkout).
    Worktree(WorktreeParams),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateAgentParams {
    /// Required: `{"kind": "subagent"}` or `{"kind": "detached"}`.
    relationship: Relationship,
    /// Required: `{"kind": "current"}` or `{"kind": "create", "source": {...}}`.
    workspace: WorkspaceChoice,
    /// The first message of the new agent.
    #[serde(default)]
    prompt: Option<String>,
    /// Default: the caller's provider.
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    /// Reasoning effort (such as `low`, `high`), where the agent offers it.
    #[serde(default)]
    effort: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    auto_archive: bool,
    /// Tell the caller (a queued message) when the new agent's turn ends, fails, or needs a
    /// permission. Default true.
    #[serde(default)]
    notify_on_finish: Option<bool>,
    /// A turn a restart of drover cuts off: `continue` (the agent is asked to continue it) or
    /// `notify` (it waits for you). Default: yours.
    #[serde(default)]
    on_interrupt: Option<OnInterrupt>,
    /// A turn that hits the provider's usage limit: `wait` for the reset and send the prompt
    /// again, or `fail`. Default: yours.
    #[serde(default)]
    on_limit: Option<OnLimit>,
    /// A budget for the new agent and its subtree: `{"tokens": N, "cost": X}` (either). Your
    /// own tree's budget applies to a subagent as well.
    #[serde(default)]
    budget: Option<drover_protocol::Budget>,
    /// Create it on another machine (a host of `drover host ls`; `auto`: the one with the most
    /// free room): give `workspace` as a directory or repository there. It is still yours:
    /// listed under you, archived with you, and you are told when its turn ends.
    #[serde(default)]
    host: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SendPromptParams {
    agent_id: String,
    prompt: String,
    /// `followup` (default: after the current turn), `steer` (now), `inject` (context for the
    /// next prompt).
    #[serde(default)]
    delivery: Option<Delivery>,
    /// Default true: tell the caller how the turn goes.
    #[serde(default)]
    notify_on_finish: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AgentParams {
    agent_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitParams {
    agent_id: String,
    /// At most 100; default 50.
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Scope {
    /// The caller's subagents (default).
    Subagents,
    /// Every agent in the caller's workspace.
    Workspace,
    /// Every unarchived agent.
    All,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListParams {
    #[serde(default)]
    scope: Option<Scope>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CancelParams {
    agent_id: String,
    #[serde(default)]
    keep_inbox: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ArchiveParams {
    agent_id: String,
    /// Stop what still runs instead of refusing.
    #[serde(default)]
    stop_activity: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PermissionParams {
    agent_id: String,
    /// `allow_once`, `allow_always`, `reject_once` or `reject_always`.
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    option_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateScheduleParams {
    /// What is sent each time it fires.
    prompt: String,
    /// When: exactly one of `at` (RFC 3339), `inSeconds`, `everySeconds` (with `startAt`), or
    /// `cron` (with `timeZone`, default UTC). E.g. `{"cron": "0 9 * * 1-5", "timeZone":
    /// "Europe/Paris"}` or `{"inSeconds": 7200}`.
    when: ScheduleWhen,
    /// Send to this agent (yourself or a descendant) as a followup. Default: yourself,
    /// unless `newAgent` is given.
    #[serde(default)]
    agent_id: Option<String>,
    /// Instead, create a new agent each time, with the prompt as its first message.
    #[serde(default)]
    new_agent: Option<ScheduleAgentParams>,
    #[serde(default)]
    title: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScheduleAgentParams {
    /// Default `{"kind": "subagent"}`: each new agent is your subagent.
    #[serde(default)]
    relationship: Option<Relationship>,
    /// Default: your provider.
    #[serde(default)]
    provider: Option<String>,
    /// Default: your workspace's directory.
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    auto_archive: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScheduleParams {
    /// `sched-<n>`.
    schedule_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WorktreeParams {
    /// The checkout to branch from (default: yours).
    #[serde(default)]
    repository: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    branch: Option<String>,
    #[serde(default)]
    base: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ArchiveWorktreeParams {
    workspace_id: String,
    /// Archive even with uncommitted changes or unpushed commits (the branch is kept).
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartJobParams {
    /// A shell command (run by `sh -c`), e.g. `cargo test 2>&1`.
    command: String,
    /// Default: your cwd; relative paths are taken from it.
    #[serde(default)]
    cwd: Option<String>,
    /// Variables added to the job's environment.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Kill it after this many seconds.
    #[serde(default)]
    timeout_s: Option<u64>,
    /// Default true: a message tells you when it ends (exit status, last output).
    #[serde(default)]
    notify_on_exit: Option<bool>,
    /// Run it for one of your subagents instead of yourself.
    #[serde(default)]
    agent_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListJobsParams {
    /// Only this agent's jobs (yourself or a subagent); default all you may see.
    #[serde(default)]
    agent_id: Option<String>,
    /// Only the running ones.
    #[serde(default)]
    running: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobOutputParams {
    job_id: String,
    /// Read from this byte offset (use the `nextOffset` of the previous read to miss nothing).
    #[serde(default)]
    offset: Option<u64>,
    /// Or: the last this many bytes.
    #[serde(default)]
    tail: Option<usize>,
    /// At most this many bytes (default 16384).
    #[serde(default)]
    max_bytes: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobParams {
    job_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitJobParams {
    job_id: String,
    /// Default 50; at most 600.
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

// ---- the table ----------------------------------------------------------------------------

/// Lists every tool once: its name, parameters, handler and description. The list a client
/// sees and the dispatch of a call both come from here.
macro_rules! tools {
    ($($name:literal => $handler:ident($params:ty): $description:literal,)*) => {
        static TOOLS: LazyLock<Vec<Tool>> =
            LazyLock::new(|| vec![$(tool::<$params>($name, $description),)*]);

        /// Runs the tool `name`, or `None` if there is no such tool.
        pub(super) async fn call(
            ops: &Ops,
            caller: AgentId,
            name: &str,
            arguments: Value,
        ) -> Option<CallToolResult> {
            let result = match name {
                $($name => match parse::<$params>(arguments) {
                    Ok(params) => $handler(ops, caller, params).await,
                    Err(e) => Err(e),
                },)*
                _ => return None,
            };
            Some(match result {
                Ok(value) => CallToolResult::success(vec![ContentBlock::text(
                    serde_json::to_string_pretty(&value).unwrap_or_default(),
                )]),
                Err(e) => tool_error(&e),
            })
        }
    };
}

tools! {
    "create_agent" => create_agent(CreateAgentParams):
        "Create an agent; returns its id at once (it runs in the background). `relationship` and `workspace` are required decisions: a subagent belongs to you (listed under you, archived with you); a detached agent stands alone. With notifyOnFinish (default) you get a message when its turn ends, fails or needs a permission.",
    "send_prompt" => send_prompt(SendPromptParams):
        "Send a prompt to an agent you control (yourself or a descendant): followup (after its current turn), steer (now) or inject (context for its next prompt). Returns at once; with notifyOnFinish (default) you get a message when the turn ends.",
    "wait_for_agent" => wait_for_agent(WaitParams):
        "Wait until an agent is idle, needs a permission, or failed, or until the timeout (at most 100 s); call again to keep waiting.",
    "get_agent" => get_agent(AgentParams):
        "An agent's status, attention, last message and pending permission.",
    "list_agents" => list_agents(ListParams):
        "List agents: your subagents (default), your workspace's agents, or all.",
    "cancel_agent" => cancel_agent(CancelParams):
        "Cancel the running turn of an agent you control.",
    "archive_agent" => archive_agent(ArchiveParams):
        "Archive an agent you control (and its subagents). Refused while it still runs work unless stopActivity.",
    "detach_agent" => detach_agent(AgentParams):
        "Detach one of your subagents: it keeps running on its own.",
    "answer_permission" => answer_permission(PermissionParams):
        "Answer the oldest pending permission request of an agent you control, by option kind or id.",
    "list_providers" => list_providers(NoParams):
        "The providers agents can be created with, and whether each is available.",
    "create_worktree" => create_worktree(WorktreeParams):
        "Create a git worktree (a new branch) as a workspace, running the repository's drover.toml setup; create agents in it with create_agent and workspace {kind: current, cwd: <its path>}.",
    "list_worktrees" => list_worktrees(NoParams):
        "The worktree workspaces drover made and that are not archived.",
    "create_schedule" => create_schedule(CreateScheduleParams):
        "Schedule a prompt: to yourself or a descendant (a followup each time), or to a new agent created each time. Once (`at`, `inSeconds`), every N seconds, or by cron in a time zone. Returns the schedule with its next run.",
    "list_schedules" => list_schedules(NoParams):
        "Your schedules (those you made, and those of yourself and your subagents), with their next run and last runs.",
    "pause_schedule" => pause_schedule(ScheduleParams):
        "Pause one of your schedules: it does not fire until resumed.",
    "resume_schedule" => resume_schedule(ScheduleParams):
        "Resume a paused schedule from now (missed runs are skipped; a once-schedule whose time passed runs at once).",
    "delete_schedule" => delete_schedule(ScheduleParams):
        "Delete one of your schedules.",
    "start_job" => start_job(StartJobParams):
        "Start a background job: a shell command drover runs for you (a dev server, a long test suite) that outlives your turn. Returns its id at once; with notifyOnExit (default) a queued message tells you when it ends, with its exit status and last output. Read its output with job_output.",
    "list_jobs" => list_jobs(ListJobsParams):
        "Your jobs and your subagents' (running and ended), with status and exit status.",
    "job_output" => job_output(JobOutputParams):
        "A job's output as text: from a byte offset (pass the previous nextOffset to read on without missing or repeating a byte), or its last `tail` bytes.",
    "kill_job" => kill_job(JobParams):
        "Kill one of your jobs (TERM to its whole process group, then KILL after 3 s); returns once it ended.",
    "wait_job" => wait_job(WaitJobParams):
        "Wait until one of your jobs ends, or until the timeout (default 50 s); call again to keep waiting.",
    "archive_worktree" => archive_worktree(ArchiveWorktreeParams):
        "Archive a worktree workspace: refused with uncommitted changes or unpushed commits unless force; runs teardown, removes the worktree, archives its agents (the branch with unmerged commits is kept).",
}

/// Every tool, for `tools/list`.
pub(super) fn list() -> &'static [Tool] {
    &TOOLS
}

fn tool<T: JsonSchema>(name: &'static str, description: &'static str) -> Tool {
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    let object = schema.as_object().cloned().unwrap_or_default();
    Tool::new(name, description, Arc::new(object))
}

/// Malformed arguments, named by serde.
fn parse<T: for<'de> Deserialize<'de>>(arguments: Value) -> Result<T, OpError> {
    serde_json::from_value(arguments).map_err(|e| OpError::Invalid {
        field: "arguments",
        message: e.to_string(),
    })
}

/// An operation's failure as the calling model reads it: the message, then the stable code
/// (and the details, such as the running work of a refused archive), as text and as
/// structured content.
fn tool_error(e: &OpError) -> CallToolResult {
    let message = match e {
        OpError::Invalid {
            field: "arguments",
            message,
        } => format!("invalid arguments: {message}"),
        e => e.to_string(),
    };
    let details = crate::wire::error_details(e);
    let mut text = format!("{message}\ncode: {}", e.code());
    if let Some(details) = &details {
        // Writing to a `String` cannot fail.
        let _ = write!(text, "\ndetails: {details}");
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({
        "code": e.code().as_str(),
        "message": message,
        "details": details,
    }));
    result
}

type ToolResult = Result<Value, OpError>;

// ---- the tools ----------------------------------------------------------------------------

async fn create_agent(ops: &Ops, caller: AgentId, params: CreateAgentParams) -> ToolResult {
    let placement = match params.workspace {
        WorkspaceChoice::Current { cwd } => Placement::Existing {
            cwd: cwd.map(PathBuf::from),
            workspace: None,
        },
        WorkspaceChoice::Create {
            source: WorkspaceSource::Directory { path },
        } => Placement::NewDirectory {
            path: PathBuf::from(path),
        },
        WorkspaceChoice::Create {
            source: WorkspaceSource::Worktree(worktree),
        } => Placement::NewWorktree {
            source: worktree.repository.clone().map(PathBuf::from),
            options: worktree_options(worktree),
        },
    };
    let notify = params.notify_on_finish.unwrap_or(true).then_some(caller);
    let request = CreateAgent {
        provider: params.provider,
        placement,
        prompt: params.prompt,
        title: params.title,
        model: params.model,
        mode: params.mode,
        effort: params.effort,
        labels: BTreeMap::new(),
        parent: matches!(params.relationship, Relationship::Subagent).then_some(caller),
        auto_archive: params.auto_archive,
        permission_policy: None,
        notify,
        on_interrupt: params.on_interrupt,
        on_limit: params.on_limit,
        budget: params.budget,
        upstream: None,
        upstream_budgets: Vec::new(),
    };
    if let Some(host) = params.host.as_deref()
        && let Some(host) = ops.hosts.resolve(host)?
    {
        let agent = ops
            .create_on_host(Caller::Agent(caller), request, &host)
            .await?;
        return Ok(json!({
            "agentId": agent["id"],
            "title": agent["title"],
            "provider": agent["provider"],
            "cwd": agent["cwd"],
            "workspaceId": agent["workspaceId"],
            "host": host,
            "relationship": if agent["parentAgentId"].is_string() { "subagent" } else { "detached" },
            "notifyOnFinish": notify.is_some(),
        }));
    }
    let created = ops.create_agent(Caller::Agent(caller), request).await?;
    let agent = created.agent;
    let mut answer = json!({
        "agentId": agent.id.to_string(),
        "title": agent.title,
        "provider": agent.provider,
        "cwd": agent.cwd,
        "workspaceId": agent.workspace_id.to_string(),
        "relationship": if agent.parent_id().is_some() { "subagent" } else { "detached" },
        "notifyOnFinish": notify.is_some(),
    });
    if let Some(made) = created.worktree {
        answer["worktree"] = json!({
            "path": made.workspace.path,
            "branch": made.workspace.worktree.as_ref().map(|w| w.branch.clone()),
            "setup": made.setup,
            "reused": made.reused,
        });
    }
    Ok(answer)
}

async fn send_prompt(ops: &Ops, caller: AgentId, params: SendPromptParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, true)? {
        let delivery = params.delivery.unwrap_or(Delivery::Followup);
        // Told through the host's outbox, which reaches only the agent it was made for.
        let notify = params.notify_on_finish.unwrap_or(true)
            && delivery.wakes()
            && ops.hosts.upstream_of(id) == Some(caller);
        let asked = json!({"type": "send_message", "agentId": id.to_string(), "text": params.prompt,
            "delivery": delivery, "notifyUpstream": notify});
        let mut answer = on_host(ops, &host, asked).await?;
        answer["notifyOnFinish"] = json!(notify);
        return Ok(answer);
    }
    let sent = ops
        .send_message(
            Caller::Agent(caller),
            id,
            params.prompt,
            params.delivery.unwrap_or(Delivery::Followup),
            params.notify_on_finish.unwrap_or(true),
        )
        .await?;
    Ok(
        json!({"agentId": id.to_string(), "messageId": sent.message_id, "notifyOnFinish": sent.notify}),
    )
}

async fn wait_for_agent(ops: &Ops, caller: AgentId, params: WaitParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    let timeout = params
        .timeout_seconds
        .map_or(DEFAULT_WAIT, Duration::from_secs);
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, false)? {
        let timeout = timeout.min(crate::ops::agents::MAX_AGENT_WAIT);
        let asked = json!({"type": "wait_idle", "agentId": id.to_string(),
            "timeoutMs": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)});
        return on_host(ops, &host, asked).await;
    }
    let (summary, timed_out) = ops.wait_until_settled(id, timeout).await?;
    let mut report = describe(&summary);
    report["timedOut"] = json!(timed_out);
    Ok(report)
}

async fn get_agent(ops: &Ops, caller: AgentId, params: AgentParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, false)? {
        return on_host(
            ops,
            &host,
            json!({"type": "get_agent", "agentId": id.to_string()}),
        )
        .await;
    }
    let mut report = describe(&ops.summary(id).await?);
    // Whether a process runs for it (`cold`: hibernated or never started; the next message
    // starts it).
    report["runtime"] = json!(ops.runtime(id).state.as_str());
    // What waits for it: kept while it cannot start, run once it does.
    let queued: Vec<String> = ops.queued(id).await?.into_iter().map(|m| m.text).collect();
    report["queued"] = json!(queued);
    // What it and its subagents spent (`unknown`: those whose agent reported nothing).
    if let Some(tree) = ops.tree_spend(id) {
        report["treeSpend"] = json!({
            "tokens": tree.spend.tokens,
            "cost": tree.spend.cost,
            "currency": tree.spend.currency,
            "agents": tree.agents,
            "unknown": tree.unknown.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
    }
    Ok(report)
}

/// A tool on an agent another host holds: the request to that host's daemon, whose answer's
/// payload is the result (marked with the host).
async fn on_host(ops: &Ops, host: &str, asked: Value) -> ToolResult {
    let mut payload = ops.ask_host(host, asked).await?;
    if let Some(object) = payload.as_object_mut() {
        object.remove("requestId");
        object.insert("host".into(), json!(host));
    }
    Ok(payload)
}

fn describe(summary: &Summary) -> Value {
    let agent = &summary.agent;
    json!({
        "agentId": agent.id.to_string(),
        "title": agent.title,
        "provider": agent.provider,
        "status": agent.status.as_str(),
        "attention": agent.attention.map(|a| a.reason.as_str()),
        "error": agent.last_error,
        "archived": agent.is_archived(),
        "parentAgentId": agent.parent_id().map(|p| p.to_string()),
        "cwd": agent.cwd,
        "lastMessage": summary.last_message,
        "pendingPermission": summary.pending.first(),
        // Its last start failed; `signIn`: the ways to sign its provider in (`drover login`).
        "startFailed": agent.start_failure.is_some(),
        "signIn": agent.start_failure.as_ref().and_then(|f| f.sign_in.as_ref()),
        // What it spent (`null`: its agent reported none).
        "spend": {"tokens": agent.spend.tokens, "cost": agent.spend.cost, "currency": agent.spend.currency},
        // It waits for its provider's usage limit: its prompt goes again at `retryAt`.
        "limited": agent.limited.as_ref().map(|l| json!({
            "since": l.at.to_string(),
            "resetAt": l.reset_at.map(|t| t.to_string()),
            "retryAt": l.retry_at.to_string(),
        })),
    })
}

// Async like every handler in the `tools!` table, which awaits them all alike.
#[expect(clippy::unused_async)]
async fn list_agents(ops: &Ops, caller: AgentId, params: ListParams) -> ToolResult {
    let scope = match params.scope.unwrap_or(Scope::Subagents) {
        Scope::Subagents => AgentScope::SubagentsOf(caller),
        Scope::Workspace => AgentScope::Workspace(ops.agent(caller)?.workspace_id),
        Scope::All => AgentScope::All,
    };
    let mut list: Vec<Value> = ops
        .list_agents(scope, false)
        .iter()
        .map(|a| {
            json!({
                "agentId": a.id.to_string(),
                "title": a.title,
                "provider": a.provider,
                "status": a.status.as_str(),
                "attention": a.attention.map(|x| x.reason.as_str()),
                "parentAgentId": a.parent_id().map(|p| p.to_string()),
            })
        })
        .collect();
    // Subagents on other hosts, as those hosts last said.
    if let AgentScope::SubagentsOf(parent) = scope {
        list.extend(ops.hosts.subagents(parent).into_iter().map(|a| {
            json!({
                "agentId": a["id"],
                "title": a["title"],
                "provider": a["provider"],
                "status": a["status"],
                "attention": a["attentionReason"],
                "parentAgentId": a["parentAgentId"],
                "host": a["host"],
            })
        }));
    }
    Ok(json!({"agents": list}))
}

async fn cancel_agent(ops: &Ops, caller: AgentId, params: CancelParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, true)? {
        let asked =
            json!({"type": "cancel", "agentId": id.to_string(), "keepInbox": params.keep_inbox});
        return on_host(ops, &host, asked).await;
    }
    ops.cancel(Caller::Agent(caller), id, params.keep_inbox)
        .await?;
    Ok(json!({"agentId": id.to_string(), "cancelled": true}))
}

async fn archive_agent(ops: &Ops, caller: AgentId, params: ArchiveParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, true)? {
        let asked = json!({"type": "archive", "agentId": id.to_string(), "stopActivity": params.stop_activity});
        return on_host(ops, &host, asked).await;
    }
    let outcome = ops
        .archive(Caller::Agent(caller), id, params.stop_activity, false)
        .await?;
    Ok(json!({
        "archived": outcome.archived.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "stopped": outcome.stopped,
    }))
}

async fn detach_agent(ops: &Ops, caller: AgentId, params: AgentParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    if let Some(host) = ops.on_host(Caller::Agent(caller), id, true)? {
        return on_host(
            ops,
            &host,
            json!({"type": "detach", "agentId": id.to_string()}),
        )
        .await;
    }
    ops.detach(Caller::Agent(caller), id).await?;
    Ok(json!({"agentId": id.to_string(), "detached": true}))
}

async fn answer_permission(ops: &Ops, caller: AgentId, params: PermissionParams) -> ToolResult {
    let id = parse_agent(&params.agent_id)?;
    ops.answer_permission(
        Caller::Agent(caller),
        id,
        None,
        params.kind,
        params.option_id,
        false,
    )
    .await?;
    Ok(json!({"agentId": id.to_string(), "answered": true}))
}

// Async like every handler in the `tools!` table, which awaits them all alike.
#[expect(clippy::unused_async)]
async fn list_providers(ops: &Ops, _caller: AgentId, _params: NoParams) -> ToolResult {
    let list: Vec<Value> = ops
        .list_providers()?
        .iter()
        .map(|p| json!({"name": p.name, "label": p.label, "available": p.available}))
        .collect();
    Ok(json!({"providers": list}))
}

async fn create_worktree(ops: &Ops, caller: AgentId, params: WorktreeParams) -> ToolResult {
    let source = params.repository.clone().map(PathBuf::from);
    let created = ops
        .create_worktree(Caller::Agent(caller), source, worktree_options(params))
        .await?;
    Ok(json!({
        "workspaceId": created.workspace.id.to_string(),
        "path": created.workspace.path,
        "branch": created.workspace.worktree.as_ref().map(|w| w.branch.clone()),
        "setup": created.setup,
    }))
}

// Async like every handler in the `tools!` table, which awaits them all alike.
#[expect(clippy::unused_async)]
async fn list_worktrees(ops: &Ops, _caller: AgentId, _params: NoParams) -> ToolResult {
    let list: Vec<Value> = ops
        .list_workspaces(false)
        .iter()
        .filter_map(|w| {
            let info = w.worktree.as_ref()?;
            Some(json!({
                "workspaceId": w.id.to_string(),
                "path": w.path,
                "branch": info.branch,
                "source": info.source,
                "base": info.base,
            }))
        })
        .collect();
    Ok(json!({"worktrees": list}))
}

async fn archive_worktree(ops: &Ops, caller: AgentId, params: ArchiveWorktreeParams) -> ToolResult {
    let id = parse_workspace(&params.workspace_id)?;
    let outcome = ops
        .archive_workspace(Caller::Agent(caller), id, params.force)
        .await?;
    Ok(serde_json::to_value(outcome).unwrap_or(Value::Null))
}

async fn create_schedule(ops: &Ops, caller: AgentId, params: CreateScheduleParams) -> ToolResult {
    let target = match (params.agent_id, params.new_agent) {
        (Some(_), Some(_)) => {
            return Err(OpError::invalid(
                "agentId",
                "give `agentId` or `newAgent`, not both",
            ));
        }
        (Some(agent), None) => ScheduleFor::Agent(agent),
        (None, None) => ScheduleFor::Agent(caller.to_string()),
        (None, Some(spec)) => ScheduleFor::NewAgent(ScheduleNewAgent {
            provider: spec.provider,
            cwd: spec.cwd,
            workspace_id: None,
            parent_agent_id: match spec.relationship {
                Some(Relationship::Detached) => None,
                Some(Relationship::Subagent) | None => Some(caller.to_string()),
            },
            title: spec.title,
            model: spec.model,
            permission_policy: None,
            auto_archive: spec.auto_archive,
        }),
    };
    let schedule = ops
        .create_schedule(
            Caller::Agent(caller),
            CreateSchedule {
                target,
                prompt: params.prompt,
                when: params.when,
                title: params.title,
            },
        )
        .await?;
    Ok(serde_json::to_value(crate::wire::schedule(&schedule)).unwrap_or(Value::Null))
}

// ---- jobs ---------------------------------------------------------------------------------

/// What a model reads about a job.
fn describe_job(job: &drover_acp::jobs::JobRecord) -> Value {
    let info = crate::wire::job_info(job);
    json!({
        "jobId": info.id,
        "agentId": info.agent_id,
        "command": info.command,
        "cwd": info.cwd,
        "status": info.status,
        "exit": info.exit,
        "exitCode": info.exit_code,
        "killedBy": info.killed_by,
        "startedAt": info.started_at,
        "durationMs": info.duration_ms,
        "outputBytes": info.output_bytes,
        "notifyOnExit": info.notify_on_exit,
    })
}

async fn start_job(ops: &Ops, caller: AgentId, params: StartJobParams) -> ToolResult {
    let owner = match params.agent_id {
        Some(id) => parse_agent(&id)?,
        None => caller,
    };
    let job = ops
        .start_job(
            Caller::Agent(caller),
            StartJob {
                owner,
                command: params.command,
                cwd: params.cwd.map(PathBuf::from),
                env: params.env,
                timeout_s: params.timeout_s,
                notify_on_exit: params.notify_on_exit,
            },
        )
        .await?;
    Ok(describe_job(&job))
}

// Async like every handler in the `tools!` table, which awaits them all alike.
#[expect(clippy::unused_async)]
async fn list_schedules(ops: &Ops, caller: AgentId, _params: NoParams) -> ToolResult {
    let list: Vec<Value> = ops
        .list_schedules(Caller::Agent(caller), None)?
        .iter()
        .map(|s| serde_json::to_value(crate::wire::schedule(s)).unwrap_or(Value::Null))
        .collect();
    Ok(json!({"schedules": list}))
}

async fn pause_schedule(ops: &Ops, caller: AgentId, params: ScheduleParams) -> ToolResult {
    let s = ops
        .pause_schedule(Caller::Agent(caller), &params.schedule_id)
        .await?;
    Ok(serde_json::to_value(crate::wire::schedule(&s)).unwrap_or(Value::Null))
}

async fn resume_schedule(ops: &Ops, caller: AgentId, params: ScheduleParams) -> ToolResult {
    let s = ops
        .resume_schedule(Caller::Agent(caller), &params.schedule_id)
        .await?;
    Ok(serde_json::to_value(crate::wire::schedule(&s)).unwrap_or(Value::Null))
}

async fn delete_schedule(ops: &Ops, caller: AgentId, params: ScheduleParams) -> ToolResult {
    let id = ops
        .delete_schedule(Caller::Agent(caller), &params.schedule_id)
        .await?;
    Ok(json!({"scheduleId": id.to_string(), "deleted": true}))
}

// Async like every handler in the `tools!` table, which awaits them all alike.
#[expect(clippy::unused_async)]
async fn list_jobs(ops: &Ops, caller: AgentId, params: ListJobsParams) -> ToolResult {
    let owner = params.agent_id.as_deref().map(parse_agent).transpose()?;
    let jobs: Vec<Value> = ops
        .list_jobs(Caller::Agent(caller), owner)?
        .iter()
        .filter(|j| !params.running || j.is_running())
        .map(describe_job)
        .collect();
    Ok(json!({"jobs": jobs}))
}

async fn job_output(ops: &Ops, caller: AgentId, params: JobOutputParams) -> ToolResult {
    let out = ops
        .job_output(
            Caller::Agent(caller),
            &params.job_id,
            params.offset,
            params.tail,
            Some(params.max_bytes.unwrap_or(MCP_OUTPUT_BYTES)),
            None,
        )
        .await?;
    Ok(json!({
        "jobId": out.job.id,
        "status": out.job.status.as_str(),
        "offset": out.chunk.offset,
        "nextOffset": out.chunk.next_offset,
        "end": out.chunk.end,
        "skipped": out.chunk.skipped,
        "eof": out.chunk.eof,
        "text": out.chunk.text,
    }))
}

async fn kill_job(ops: &Ops, caller: AgentId, params: JobParams) -> ToolResult {
    let job = ops.kill_job(Caller::Agent(caller), &params.job_id).await?;
    Ok(describe_job(&job))
}

async fn wait_job(ops: &Ops, caller: AgentId, params: WaitJobParams) -> ToolResult {
    let timeout = params.timeout_seconds.map(Duration::from_secs);
    let (job, ended) = ops
        .wait_job(Caller::Agent(caller), &params.job_id, timeout)
        .await?;
    let mut report = describe_job(&job);
    report["timedOut"] = json!(!ended);
    Ok(report)
}

fn worktree_options(params: WorktreeParams) -> WorktreeOptions {
    WorktreeOptions {
        name: params.name,
        branch: params.branch,
        base: params.base,
        setup_timeout: None,
        // The operation says who asks.
        created_by: None,
    }
}
