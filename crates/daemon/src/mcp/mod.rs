//! The MCP server through which agents drive drover: create agents (subagents or detached, in
//! the caller's workspace or a new one), prompt them, wait for them, look at them, stop,
//! archive and detach them, answer their permissions, make and archive worktrees.
//!
//! Each agent gets its own URL, `/mcp/<token>`, with a token nobody else knows; the token says
//! which agent calls. Served with rmcp's streamable HTTP transport on the daemon's port. The
//! tools (`tools`) call the operations layer as `Caller::Agent`, which is where the rule "an
//! agent may control itself and its descendants" lives.

mod tools;

use axum::http::request::Parts;
use drover_core::AgentId;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::agent_tokens::AgentTokens;
use crate::ops::Ops;

/// The `mcpServers` entry for an agent: HTTP when it can, else our stdio proxy.
pub(crate) fn servers_for(
    base_url: &str,
    tokens: &AgentTokens,
    agent: AgentId,
    http: bool,
) -> Value {
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
        // What the operation logs names the calling agent's MCP request.
        let span = tracing::info_span!("mcp", request_id = %context.id, tool = %request.name, caller = %caller);
        let called = tracing::Instrument::instrument(
            tools::call(&self.ops, caller, &request.name, arguments),
            span,
        );
        match called.await {
            Some(result) => Ok(result.into()),
            None => Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            )),
        }
    }
}

impl DroverMcp {
    /// The calling agent, from the token in the URL: the path must be exactly
    /// `/mcp/<token>`.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<AgentId, ErrorData> {
        let token = context
            .extensions
            .get::<Parts>()
            .and_then(|parts| {
                // Nested under `/mcp`, the service sees the path without it; the original is
                // kept beside it.
                let path = parts
                    .extensions
                    .get::<axum::extract::OriginalUri>()
                    .map_or(parts.uri.path(), |original| original.path());
                path.strip_prefix("/mcp/")
                    .filter(|token| !token.is_empty() && !token.contains('/'))
                    .map(str::to_string)
            })
            .unwrap_or_default();
        self.ops
            .mcp_caller(&token)
            .map_err(|message| ErrorData::invalid_request(message, None))
    }
}
