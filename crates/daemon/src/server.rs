//! The HTTP surface: `/health` and the client protocol at `/ws` (MCP joins it later).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use drover_core::Registry;
use serde_json::json;

use crate::DaemonInfo;
use crate::ws;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) registry: Registry,
    pub(crate) runtimes: drover_acp::RuntimeManager,
    pub(crate) info: Arc<DaemonInfo>,
    pub(crate) home: PathBuf,
    pub(crate) addr: SocketAddr,
    pub(crate) ws: ws::Context,
    pub(crate) stop: tokio::sync::watch::Receiver<bool>,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ws", get(upgrade))
        .fallback(not_found)
        .with_state(state)
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "version": state.info.daemon_version,
        "protocolVersion": drover_protocol::PROTOCOL_VERSION,
        "pid": state.info.pid,
        "home": state.home,
        "startedAt": state.info.started_at,
        "agents": state.registry.agent_count(),
        "activeRuntimes": state.runtimes.active_count(),
        "liveRuntimes": state.runtimes.live_count(),
        "workspaces": state.registry.workspaces().len(),
    }))
}

/// The upgrade refuses pages from other origins: a web page the user happens to visit must not
/// drive their agents. Clients that send no `Origin` (the CLI, scripts) are let through; a page
/// served by this daemon itself is same-origin.
async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !same_origin(origin, state.addr) {
            tracing::warn!(%origin, "refused a WebSocket from another origin");
            return (
                StatusCode::FORBIDDEN,
                Json(json!({"error": {"code": "forbidden_origin", "message": format!("WebSocket connections from `{origin}` are refused")}})),
            )
                .into_response();
        }
    }
    let context = state.ws.clone();
    let stop = state.stop.clone();
    upgrade
        .max_message_size(drover_protocol::MAX_CLIENT_FRAME)
        .max_frame_size(drover_protocol::MAX_CLIENT_FRAME)
        .on_upgrade(move |socket| ws::session(socket, context, stop))
}

fn same_origin(origin: &str, addr: SocketAddr) -> bool {
    let port = addr.port();
    let allowed = [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        format!("http://[::1]:{port}"),
        format!("http://{addr}"),
    ];
    allowed.iter().any(|a| a == origin)
}

async fn not_found(request: Request) -> Response {
    let message = format!("no route for {} {}", request.method(), request.uri().path());
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": { "code": "not_found", "message": message } })),
    )
        .into_response()
}
