//! The HTTP surface: `/health`, `/metrics`, the client protocol at `/ws` and the MCP server at
//! `/mcp/<token>`, behind one check of the `Host` header.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
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
    /// The client token; `None` with `--no-token`.
    pub(crate) token: Option<Arc<str>>,
    /// Names beside `localhost` and IP addresses that `Host` may carry.
    pub(crate) allowed_hosts: Arc<Vec<String>>,
    /// Refused hosts and origins, for a warning that any web page cannot make grow the log.
    pub(crate) refusals: Arc<crate::refusals::Refusals>,
    /// What `/metrics` encodes.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
}

pub(crate) fn router(state: AppState, mcp: crate::McpService) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/ws", get(upgrade))
        .route("/", get(crate::ui::index))
        .route("/ui/{file}", get(crate::ui::asset))
        .nest_service("/mcp", mcp)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .with_state(state)
}

/// Refuses a request whose `Host` is not this daemon (DNS rebinding: a page on a name the
/// attacker controls, resolved to 127.0.0.1, would otherwise be same-origin with its own
/// address and reach the daemon). IP addresses are safe to accept (no name can be rebound),
/// `localhost` too; other names only when configured (`--allow-host`).
async fn check_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if host_allowed(host, state.addr, &state.allowed_hosts) {
        return next.run(request).await;
    }
    if let Some(count) = state.refusals.refused(std::time::Instant::now()) {
        tracing::warn!(%host, path = request.uri().path(), count,
            "refused requests for another host or origin: `count` since the last such line (one a minute at most)");
    }
    let message = if host.is_empty() {
        "a `Host` header is required".to_string()
    } else {
        format!(
            "`Host: {host}` does not name this daemon; reach it at http://127.0.0.1:{port} or http://localhost:{port} (or allow the name with `drover daemon --allow-host NAME`)",
            port = state.addr.port()
        )
    };
    (
        StatusCode::MISDIRECTED_REQUEST,
        Json(json!({"error": {"code": "forbidden_host", "message": message}})),
    )
        .into_response()
}

/// `Host` names this daemon: its port, and a name that cannot be rebound or one allowed.
fn host_allowed(host: &str, addr: SocketAddr, allowed: &[String]) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        // `[::1]:7433`, `127.0.0.1:7433`, `localhost:7433`; a bare `[::1]` has no port.
        Some((name, port)) if !port.ends_with(']') => (name, port.parse::<u16>().ok()),
        _ => (host, Some(80)),
    };
    if port != Some(addr.port()) || name.is_empty() {
        return false;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || bare.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(bare))
}

/// Whether the request carries the client token (`Authorization: Bearer <token>`), or the
/// daemon asks for none.
fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(expected) = &state.token else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .is_some_and(|presented| crate::lock::secret_matches(presented.trim(), expected))
}

/// A liveness probe for anyone; the daemon's details (pid, home, counts) only with the token.
async fn health(State(state): State<AppState>, headers: HeaderMap) -> Json<serde_json::Value> {
    if !authorized(&state, &headers) {
        return Json(json!({
            "status": "ok",
            "version": state.info.daemon_version,
            "protocolVersion": drover_protocol::PROTOCOL_VERSION,
        }));
    }
    let settings = state.runtimes.runtime_settings();
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
        "queuedRuntimes": state.runtimes.queued_count(),
        "maxLive": settings.max_live,
        "idleTimeoutSecs": settings.idle_timeout.map_or(0, |t| t.as_secs()),
        "workspaces": state.registry.workspaces().len(),
    }))
}

/// The Prometheus exposition, with the token only (the fleet's shape is the user's business).
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"error": {"code": "unauthorized", "message": "`/metrics` needs the daemon's token: `Authorization: Bearer <token>` (the `token` file in its home)"}})),
        )
            .into_response();
    }
    // It reads /proc (the agents' process trees, the daemon's own).
    let metrics = state.metrics.clone();
    match tokio::task::spawn_blocking(move || metrics.encode()).await {
        Ok(text) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The upgrade (see `ws::socket`) refuses pages from other origins: a web page the user
/// happens to visit must not drive their agents. Clients that send no `Origin` (the CLI,
/// scripts) are let through; a page served by this daemon itself is same-origin.
async fn upgrade(State(state): State<AppState>, mut request: Request) -> Response {
    let (switching, upgraded) = match ws::socket::accept(&mut request) {
        Ok(accepted) => accepted,
        Err(refused) => return refused.into_response(),
    };
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !same_origin(origin, state.addr) {
            if let Some(count) = state.refusals.refused(std::time::Instant::now()) {
                tracing::warn!(%origin, count,
                    "refused requests for another host or origin: `count` since the last such line (one a minute at most)");
            }
            return (
                StatusCode::FORBIDDEN,
                Json(json!({"error": {"code": "forbidden_origin", "message": format!("WebSocket connections from `{origin}` are refused")}})),
            )
                .into_response();
        }
    }
    let context = state.ws.clone();
    let stop = state.stop.clone();
    tokio::spawn(async move {
        if let Some(socket) = ws::socket::open(upgraded).await {
            ws::session(socket, context, stop).await;
        }
    });
    switching
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

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn host_names_this_daemon_only() {
        let addr = "127.0.0.1:7433".parse().expect("addr");
        let allowed = vec!["devbox".to_string()];
        for host in [
            "127.0.0.1:7433",
            "localhost:7433",
            "[::1]:7433",
            "10.1.2.3:7433",
            "devbox:7433",
            "DEVBOX:7433",
        ] {
            assert!(host_allowed(host, addr, &allowed), "{host}");
        }
        for host in [
            "",
            "evil.example:7433",
            "devbox.evil.example:7433",
            "localhost:7434",
            "localhost",
            "[::1]",
            ":7433",
            "127.0.0.1:notaport",
        ] {
            assert!(!host_allowed(host, addr, &allowed), "{host}");
        }
        let on_80 = "127.0.0.1:80".parse().expect("addr");
        assert!(host_allowed("localhost", on_80, &[]));
    }
}
