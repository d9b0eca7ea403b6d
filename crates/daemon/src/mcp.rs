//! The MCP server through which agents drive drover: create agents (subagents or detached, in
//! the caller's workspace or a new one), prompt them, wait for them, look at them, stop,
//! archive and detach them, answer their permissions.
//!
//! Each agent gets its own URL, `/mcp/<token>`, with a token nobody else knows; the token says
//! which agent calls. An agent may control itself and its own descendants; everything else is
//! read-only to it. Served with rmcp's streamable HTTP transport on the daemon's port.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::request::Parts;
use drover_acp::{PermissionAnswer, PermissionChoice, RuntimeManager};
use drover_core::inbox::{Delivery, InboxMessage};
use drover_core::timeline::Page;
use drover_core::view::AgentsView;
use drover_core::{
    Agent, AgentId, AgentStatus, ArchiveOptions, AttentionReason, CancelCause, NewAgent,
    ProviderConfig, Registry,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// The longest `wait_for_agent` waits before answering "still running": under the usual MCP
/// client tool timeout, so the caller gets an answer and can call again.
const MAX_WAIT: Duration = Duration::from_secs(100);
const DEFAULT_WAIT: Duration = Duration::from_secs(50);

/// Which agent a token stands for. Tokens live as long as the daemon: an agent's runtime gets
/// its URL when it starts.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    by_token: Mutex<HashMap<String, AgentId>>,
    by_agent: Mutex<HashMap<AgentId, String>>,
}

impl Tokens {
    pub(crate) fn token_for(&self, agent: AgentId) -> String {
        let mut by_agent = self
            .by_agent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(token) = by_agent.get(&agent) {
            return token.clone();
        }
        // Two v7 uuids: 148 random bits.
        let token = format!(
            "{}{}",
            AgentId::new().as_uuid().simple(),
            AgentId::new().as_uuid().simple()
        );
        by_agent.insert(agent, token.clone());
        self.by_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(token.clone(), agent);
        token
    }

    fn agent(&self, token: &str) -> Option<AgentId> {
        self.by_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(token)
            .copied()
    }
}

/// The `mcpServers` entry for an agent: HTTP when it can, else our stdio proxy.
pub(crate) fn servers_for(base_url: &str, tokens: &Tokens, agent: AgentId, http: bool) -> Value {
    let url = format!("{base_url}/mcp/{}", tokens.token_for(agent));
    if http {
        json!([{"type": "http", "name": "drover", "url": url, "headers": []}])
    } else {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "drover".to_string());
        json!([{"name": "drover", "command": exe, "args": ["mcp-proxy", url], "env": []}])
    }
}

#[derive(Clone)]
pub(crate) struct DroverMcp {
    pub(crate) registry: Registry,
    pub(crate) runtimes: RuntimeManager,
    pub(crate) tokens: Arc<Tokens>,
}

// ---- tool parameters ------------------------------------------------------------------------

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
    Worktree {
        #[serde(default)]
        repository: Option<String>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        branch: Option<String>,
        #[serde(default)]
        base: Option<String>,
    },
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
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    auto_archive: bool,
    /// Tell the caller (a queued message) when the new agent's turn ends, fails, or needs a
    /// permission. Default true.
    #[serde(default)]
    notify_on_finish: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum DeliveryParam {
    Followup,
    Steer,
    Inject,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SendPromptParams {
    agent_id: String,
    prompt: String,
    /// `followup` (default: after the current turn), `steer` (now), `inject` (context for the
    /// next prompt).
    #[serde(default)]
    delivery: Option<DeliveryParam>,
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
struct CreateWorktreeParams {
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

fn tool<T: JsonSchema>(name: &'static str, description: &'static str) -> Tool {
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    let object = schema.as_object().cloned().unwrap_or_default();
    Tool::new(name, description, Arc::new(object))
}

fn tools() -> Vec<Tool> {
    vec![
        tool::<CreateAgentParams>(
            "create_agent",
            "Create an agent; returns its id at once (it runs in the background). `relationship` and `workspace` are required decisions: a subagent belongs to you (listed under you, archived with you); a detached agent stands alone. With notifyOnFinish (default) you get a message when its turn ends, fails or needs a permission.",
        ),
        tool::<SendPromptParams>(
            "send_prompt",
            "Send a prompt to an agent you control (yourself or a descendant): followup (after its current turn), steer (now) or inject (context for its next prompt). Returns at once; with notifyOnFinish (default) you get a message when the turn ends.",
        ),
        tool::<WaitParams>(
            "wait_for_agent",
            "Wait until an agent is idle, needs a permission, or failed, or until the timeout (at most 100 s); call again to keep waiting.",
        ),
        tool::<AgentParams>(
            "get_agent",
            "An agent's status, attention, last message and pending permission.",
        ),
        tool::<ListParams>(
            "list_agents",
            "List agents: your subagents (default), your workspace's agents, or all.",
        ),
        tool::<CancelParams>(
            "cancel_agent",
            "Cancel the running turn of an agent you control.",
        ),
        tool::<ArchiveParams>(
            "archive_agent",
            "Archive an agent you control (and its subagents). Refused while it still runs work unless stopActivity.",
        ),
        tool::<AgentParams>(
            "detach_agent",
            "Detach one of your subagents: it keeps running on its own.",
        ),
        tool::<PermissionParams>(
            "answer_permission",
            "Answer the oldest pending permission request of an agent you control, by option kind or id.",
        ),
        tool::<NoParams>(
            "list_providers",
            "The providers agents can be created with, and whether each is available.",
        ),
        tool::<CreateWorktreeParams>(
            "create_worktree",
            "Create a git worktree (a new branch) as a workspace, running the repository's drover.toml setup; create agents in it with create_agent and workspace {kind: current, cwd: <its path>}.",
        ),
        tool::<NoParams>(
            "list_worktrees",
            "The worktree workspaces drover made and that are not archived.",
        ),
        tool::<ArchiveWorktreeParams>(
            "archive_worktree",
            "Archive a worktree workspace: refused with uncommitted changes or unpushed commits unless force; runs teardown, removes the worktree, archives its agents (the branch with unmerged commits is kept).",
        ),
    ]
}

// ---- the handler ----------------------------------------------------------------------------

impl ServerHandler for DroverMcp {
    fn get_info(&self) -> InitializeResult {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = rmcp::model::Implementation::new("drover", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "drover runs coding agents. Use create_agent to delegate work to a subagent (it runs in the background and you are told when it finishes); wait_for_agent or get_agent to look at it.".to_string(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.caller(&context)?;
        Ok(ListToolsResult {
            tools: tools(),
            ..ListToolsResult::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let name = request.name.to_string();
        if !tools().iter().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{name}`"),
                None,
            ));
        }
        let result = self.run_tool(caller, &name, arguments).await;
        Ok(match result {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&value).unwrap_or_default(),
            )]),
            Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
        }
        .into())
    }
}

/// A malformed call is a tool error (the calling model reads it) naming the field: serde says
/// which.
fn parse<T: for<'de> Deserialize<'de>>(arguments: Value) -> Result<T, String> {
    serde_json::from_value(arguments).map_err(|e| format!("invalid arguments: {e}"))
}

type ToolResult = Result<Value, String>;

impl DroverMcp {
    async fn run_tool(&self, caller: AgentId, name: &str, arguments: Value) -> ToolResult {
        match name {
            "create_agent" => self.create_agent(caller, parse(arguments)?).await,
            "send_prompt" => self.send_prompt(caller, parse(arguments)?).await,
            "wait_for_agent" => self.wait_for_agent(parse(arguments)?).await,
            "get_agent" => {
                self.get_agent(parse::<AgentParams>(arguments)?.agent_id)
                    .await
            }
            "list_agents" => self.list_agents(caller, parse(arguments)?),
            "cancel_agent" => self.cancel_agent(caller, parse(arguments)?).await,
            "archive_agent" => self.archive_agent(caller, parse(arguments)?).await,
            "detach_agent" => {
                self.detach_agent(caller, parse::<AgentParams>(arguments)?.agent_id)
                    .await
            }
            "answer_permission" => self.answer_permission(caller, parse(arguments)?).await,
            "list_providers" => Ok(self.list_providers()),
            "create_worktree" => self.create_worktree(caller, parse(arguments)?).await,
            "list_worktrees" => Ok(self.list_worktrees()),
            "archive_worktree" => self.archive_worktree(caller, parse(arguments)?).await,
            other => Err(format!("unknown tool `{other}`")),
        }
    }

    /// The calling agent, from the token in the URL.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<AgentId, ErrorData> {
        let token = context
            .extensions
            .get::<Parts>()
            .and_then(|parts| {
                parts
                    .uri
                    .path()
                    .trim_matches('/')
                    .rsplit('/')
                    .next()
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let agent = self.tokens.agent(&token).ok_or_else(|| {
            ErrorData::invalid_request("unknown or missing agent token in the MCP URL", None)
        })?;
        match self.registry.get(agent) {
            Some(a) if !a.is_archived() => Ok(agent),
            Some(_) => Err(ErrorData::invalid_request(
                "the calling agent is archived",
                None,
            )),
            None => Err(ErrorData::invalid_request(
                "the calling agent no longer exists",
                None,
            )),
        }
    }

    fn agent(&self, raw: &str) -> Result<Agent, String> {
        raw.parse::<AgentId>()
            .ok()
            .and_then(|id| self.registry.get(id))
            .ok_or_else(|| {
                format!(
                    "agent `{}` not found",
                    raw.chars().take(80).collect::<String>()
                )
            })
    }

    /// An agent may control itself and its descendants.
    fn controlled(&self, caller: AgentId, raw: &str) -> Result<Agent, String> {
        let target = self.agent(raw)?;
        if target.id == caller {
            return Ok(target);
        }
        let agents: Vec<Agent> = self.registry.agents();
        let view = Snapshot(agents.iter().map(|a| (a.id, a)).collect());
        if drover_core::view::ancestors(&view, target.id).contains(&caller) {
            Ok(target)
        } else {
            Err(format!(
                "agent `{}` is not yours: you may control yourself and your own subagents (read-only tools work on any agent)",
                target.id
            ))
        }
    }

    async fn create_agent(&self, caller: AgentId, params: CreateAgentParams) -> ToolResult {
        let parent = self.agent(&caller.to_string())?;
        let mut created_workspace = None;
        let (cwd, workspace_id) = match params.workspace {
            WorkspaceChoice::Current { cwd } => (
                cwd.map(PathBuf::from).unwrap_or_else(|| parent.cwd.clone()),
                Some(parent.workspace_id),
            ),
            WorkspaceChoice::Create {
                source: WorkspaceSource::Directory { path },
            } => {
                let ws = self
                    .registry
                    .register_workspace(PathBuf::from(&path), None)
                    .await
                    .map_err(|e| e.to_string())?;
                (ws.path.clone(), Some(ws.id))
            }
            WorkspaceChoice::Create {
                source:
                    WorkspaceSource::Worktree {
                        repository,
                        name,
                        branch,
                        base,
                    },
            } => {
                let source = repository
                    .map(PathBuf::from)
                    .unwrap_or_else(|| parent.cwd.clone());
                let created = self
                    .registry
                    .create_worktree_workspace(
                        source,
                        drover_core::WorktreeOptions {
                            name,
                            branch,
                            base,
                            setup_timeout: None,
                        },
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                created_workspace = Some(created.workspace.id);
                (created.workspace.path.clone(), Some(created.workspace.id))
            }
        };
        let new = NewAgent {
            provider: params.provider.unwrap_or_else(|| parent.provider.clone()),
            cwd,
            workspace_id,
            title: params.title,
            labels: created_workspace
                .map(|ws| {
                    [(
                        drover_core::CREATED_WORKSPACE_LABEL.to_string(),
                        ws.to_string(),
                    )]
                    .into_iter()
                    .collect()
                })
                .unwrap_or_default(),
            parent: matches!(params.relationship, Relationship::Subagent).then_some(caller),
            auto_archive: params.auto_archive,
            config: ProviderConfig {
                model: params.model.or_else(|| parent.config.model.clone()),
                mode: params.mode,
                permission_policy: parent.config.permission_policy,
            },
        };
        let notify = params.notify_on_finish.unwrap_or(true).then_some(caller);
        let agent = self
            .runtimes
            .create_agent_notifying(new, params.prompt, notify)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({
            "agentId": agent.id.to_string(),
            "title": agent.title,
            "provider": agent.provider,
            "cwd": agent.cwd,
            "workspaceId": agent.workspace_id.to_string(),
            "relationship": if agent.parent_id().is_some() { "subagent" } else { "detached" },
            "notifyOnFinish": notify.is_some(),
        }))
    }

    async fn send_prompt(&self, caller: AgentId, params: SendPromptParams) -> ToolResult {
        let target = self.controlled(caller, &params.agent_id)?;
        let delivery = match params.delivery {
            None | Some(DeliveryParam::Followup) => Delivery::Followup,
            Some(DeliveryParam::Steer) => Delivery::Steer,
            Some(DeliveryParam::Inject) => Delivery::Inject,
        };
        let notify =
            (params.notify_on_finish.unwrap_or(true) && target.id != caller && delivery.wakes())
                .then_some(caller);
        let message =
            InboxMessage::new(delivery, params.prompt, format!("agent:{caller}")).notifying(notify);
        let id = self
            .runtimes
            .deliver_message(target.id, message)
            .await
            .map_err(|e| e.to_string())?;
        Ok(
            json!({"agentId": target.id.to_string(), "messageId": id, "notifyOnFinish": notify.is_some()}),
        )
    }

    async fn wait_for_agent(&self, params: WaitParams) -> ToolResult {
        let agent = self.agent(&params.agent_id)?;
        let timeout = params
            .timeout_seconds
            .map_or(DEFAULT_WAIT, Duration::from_secs)
            .min(MAX_WAIT);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let now = self.registry.get(agent.id).ok_or("the agent is gone")?;
            let permission = now.attention.map(|a| a.reason) == Some(AttentionReason::Permission);
            let failed = now.status == AgentStatus::Error;
            let idle = self
                .runtimes
                .wait_idle(agent.id, Duration::from_millis(200))
                .await
                .map_err(|e| e.to_string())?;
            if permission || failed || idle || tokio::time::Instant::now() >= deadline {
                let mut report = self.describe(&now).await;
                report["timedOut"] = json!(!(permission || failed || idle));
                return Ok(report);
            }
        }
    }

    async fn get_agent(&self, raw: String) -> ToolResult {
        let agent = self.agent(&raw)?;
        Ok(self.describe(&agent).await)
    }

    async fn describe(&self, agent: &Agent) -> Value {
        let last_message = self
            .runtimes
            .timeline(agent.id, Page::Tail { limit: 50 })
            .await
            .ok()
            .and_then(|page| {
                page.items
                    .iter()
                    .rev()
                    .find(|i| i.kind == "agent_message")
                    .and_then(|i| {
                        i.data
                            .get("text")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
            });
        let pending = self
            .runtimes
            .pending_permissions(agent.id)
            .await
            .unwrap_or_default();
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
            "lastMessage": last_message,
            "pendingPermission": pending.first(),
        })
    }

    fn list_agents(&self, caller: AgentId, params: ListParams) -> ToolResult {
        let me = self.agent(&caller.to_string())?;
        let list: Vec<Value> = self
            .registry
            .agents()
            .iter()
            .filter(|a| !a.is_archived())
            .filter(
                |a| match params.scope.as_ref().unwrap_or(&Scope::Subagents) {
                    Scope::Subagents => a.parent_id() == Some(caller),
                    Scope::Workspace => a.workspace_id == me.workspace_id,
                    Scope::All => true,
                },
            )
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
        Ok(json!({"agents": list}))
    }

    async fn cancel_agent(&self, caller: AgentId, params: CancelParams) -> ToolResult {
        let target = self.controlled(caller, &params.agent_id)?;
        let cause = if target.id == caller {
            CancelCause::User
        } else {
            CancelCause::Parent
        };
        self.runtimes
            .cancel_turn(target.id, cause, params.keep_inbox)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({"agentId": target.id.to_string(), "cancelled": true}))
    }

    async fn archive_agent(&self, caller: AgentId, params: ArchiveParams) -> ToolResult {
        let target = self.controlled(caller, &params.agent_id)?;
        match self
            .registry
            .archive(
                target.id,
                ArchiveOptions {
                    stop_activity: params.stop_activity,
                },
            )
            .await
        {
            Ok(outcome) => Ok(json!({
                "archived": outcome.archived.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "stopped": outcome.stopped,
            })),
            Err(drover_core::RegistryError::AgentActive(report)) => Err(format!(
                "refused: agent `{}` still runs work ({}); call again with stopActivity: true to stop it. Details: {}",
                target.id,
                report.summary(),
                serde_json::to_string(&report).unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn detach_agent(&self, caller: AgentId, raw: String) -> ToolResult {
        let target = self.controlled(caller, &raw)?;
        if target.id == caller {
            return Err("an agent cannot detach itself".to_string());
        }
        self.registry
            .detach(target.id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({"agentId": target.id.to_string(), "detached": true}))
    }

    async fn answer_permission(&self, caller: AgentId, params: PermissionParams) -> ToolResult {
        let target = self.controlled(caller, &params.agent_id)?;
        let choice = match (params.kind, params.option_id) {
            (Some(kind), None) => PermissionChoice::Kind(kind),
            (None, Some(id)) => PermissionChoice::OptionId(id),
            _ => return Err("give exactly one of `kind` or `optionId`".to_string()),
        };
        self.runtimes
            .answer_permission(
                target.id,
                PermissionAnswer {
                    request: None,
                    choice,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({"agentId": target.id.to_string(), "answered": true}))
    }

    async fn create_worktree(&self, caller: AgentId, params: CreateWorktreeParams) -> ToolResult {
        let me = self.agent(&caller.to_string())?;
        let source = params.repository.map(PathBuf::from).unwrap_or(me.cwd);
        let created = self
            .registry
            .create_worktree_workspace(
                source,
                drover_core::WorktreeOptions {
                    name: params.name,
                    branch: params.branch,
                    base: params.base,
                    setup_timeout: None,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({
            "workspaceId": created.workspace.id.to_string(),
            "path": created.workspace.path,
            "branch": created.workspace.worktree.as_ref().map(|w| w.branch.clone()),
            "setup": created.setup,
        }))
    }

    fn list_worktrees(&self) -> Value {
        let list: Vec<Value> = self
            .registry
            .workspaces()
            .iter()
            .filter(|w| w.archived_at.is_none())
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
        json!({"worktrees": list})
    }

    async fn archive_worktree(&self, caller: AgentId, params: ArchiveWorktreeParams) -> ToolResult {
        let id: drover_core::WorkspaceId = params
            .workspace_id
            .parse()
            .map_err(|_| format!("workspace `{}` not found", params.workspace_id))?;
        let ws = self
            .registry
            .workspace(id)
            .ok_or_else(|| format!("workspace `{id}` not found"))?;
        // Archiving it archives its agents: each must be the caller or one of its descendants.
        for agent in self
            .registry
            .agents()
            .iter()
            .filter(|a| a.workspace_id == ws.id && !a.is_archived())
        {
            self.controlled(caller, &agent.id.to_string())?;
        }
        let outcome = self
            .registry
            .archive_workspace(id, params.force)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_value(outcome).map_err(|e| e.to_string())
    }

    fn list_providers(&self) -> Value {
        let providers = self.runtimes.providers();
        let list: Vec<Value> = providers
            .all()
            .map(|p| {
                let available = matches!(
                    providers.availability(p),
                    drover_acp::Availability::Available { .. }
                );
                json!({"name": p.name, "label": p.label, "available": available})
            })
            .collect();
        json!({"providers": list})
    }
}

/// The registry's agents as a view, for lineage checks.
struct Snapshot<'a>(HashMap<AgentId, &'a Agent>);

impl AgentsView for Snapshot<'_> {
    fn agent(&self, id: AgentId) -> Option<&Agent> {
        self.0.get(&id).copied()
    }

    fn children(&self, id: AgentId) -> Vec<AgentId> {
        self.0
            .values()
            .filter(|a| a.parent_id() == Some(id))
            .map(|a| a.id)
            .collect()
    }
}
