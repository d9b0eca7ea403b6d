//! The MCP server through which agents drive drover: create agents (subagents or detached, in
//! the caller's workspace or a new one), prompt them, wait for them, look at them, stop,
//! archive and detach them, answer their permissions, make and archive worktrees.
//!
//! Each agent gets its own URL, `/mcp/<token>`, with a token nobody else knows; the token says
//! which agent calls. Served with rmcp's streamable HTTP transport on the daemon's port. The
//! tools (`tools`) call the operations layer as `Caller::Agent`, which is where the rule "an
//! agent may control itself and its descendants" lives.

mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::request::Parts;
use drover_core::AgentId;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::ops::Ops;

/// Which agent a token stands for. Tokens live as long as the daemon: an agent's runtime gets
/// its URL when it starts.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    by_token: Mutex<HashMap<String, AgentId>>,
    by_agent: Mutex<HashMap<AgentId, String>>,
}

impl Tokens {
    pub(crate) fn token_for(&self, agent: AgentId) -> String {
        let mut by_agent = self.by_agent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = by_agent.get(&agent) {
            return token.clone();
        }
        let token = crate::lock::new_secret();
        by_agent.insert(agent, token.clone());
        self.by_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), agent);
        token
    }

    fn agent(&self, token: &str) -> Option<AgentId> {
        self.by_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
            .map_or_else(|_| "drover".to_string(), |p| p.display().to_string());
        json!([{"name": "drover", "command": exe, "args": ["mcp-proxy", url], "env": []}])
    }
}

#[derive(Clone)]
pub(crate) struct DroverMcp {
    pub(crate) ops: Ops,
    pub(crate) tokens: Arc<Tokens>,
}

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
            tools: tools::list().to_vec(),
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
        match tools::call(&self.ops, caller, &request.name, arguments).await {
            Some(result) => Ok(result.into()),
            None => Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            )),
        }
    }
}

impl DroverMcp {
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
        match self.ops.agent(agent) {
            Ok(a) if !a.is_archived() => Ok(agent),
            Ok(_) => Err(ErrorData::invalid_request(
                "the calling agent is archived",
                None,
            )),
            Err(_) => Err(ErrorData::invalid_request(
                "the calling agent no longer exists",
                None,
            )),
        }
    }
}
