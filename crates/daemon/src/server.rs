//! The HTTP surface: `/health` for now (the WebSocket protocol and MCP join it later).

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use drover_core::Registry;
use serde_json::json;

use crate::DaemonInfo;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) registry: Registry,
    pub(crate) runtimes: drover_acp::RuntimeManager,
    pub(crate) info: Arc<DaemonInfo>,
    pub(crate) home: PathBuf,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(state)
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "version": state.info.daemon_version,
        "pid": state.info.pid,
        "home": state.home,
        "startedAt": state.info.started_at,
        "agents": state.registry.agent_count(),
        "activeRuntimes": state.runtimes.active_count(),
        "workspaces": state.registry.workspaces().len(),
    }))
}

async fn not_found(request: Request) -> Response {
    let message = format!("no route for {} {}", request.method(), request.uri().path());
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": { "code": "not_found", "message": message } })),
    )
        .into_response()
}
