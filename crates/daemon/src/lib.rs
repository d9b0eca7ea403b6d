//! drover's daemon: takes the data directory, loads the registry, serves HTTP on loopback,
//! and shuts down in order.
//!
//! [`run`] is the whole daemon for a listener the caller bound; the `drover daemon` command and
//! the tests both call it. Nothing here decides lifecycle: that is `drover-core`'s registry.

mod agent_tokens;
pub mod config;
mod hosts;
pub mod http_client;
pub mod lock;
pub mod logging;
mod mcp;
mod metrics;
mod notify;
mod ops;
mod ptys;
mod refusals;
mod schedules;
mod server;
mod ui;
mod wire;
mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use drover_core::RegistryError;
use jiff::Timestamp;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use config::DaemonConfig;
pub use hosts::ssh_command;
pub use lock::{DataDirLock, LockError};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("cannot load the store: {0}")]
    Registry(#[from] RegistryError),
    #[error("cannot {op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
}

/// `$DROVER_HOME/daemon.json`: who holds the data directory, for clients and for a second
/// daemon's error message. Written once serving, removed at a clean stop.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DaemonInfo {
    pub version: u32,
    pub pid: u32,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub daemon_version: String,
    pub started_at: Timestamp,
}

pub const DAEMON_INFO_FILE: &str = "daemon.json";

/// Takes the data-directory lock, then runs the daemon on `listener` until `shutdown`
/// resolves.
pub async fn run(
    listener: TcpListener,
    config: DaemonConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let lock = DataDirLock::acquire(&config.home)?;
    run_locked(lock, listener, config, shutdown).await
}

/// Runs the daemon with the lock already held (the binary takes it before binding, so a second
/// daemon fails on the lock, naming the first, rather than on the port).
pub async fn run_locked(
    lock: DataDirLock,
    listener: TcpListener,
    config: DaemonConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    run_locked_then(lock, listener, config, shutdown, |_| {}).await
}

/// [`run_locked`], calling `serving` once the token, the config and the store are loaded and
/// `daemon.json` is published: what a caller says about the daemon (its web UI's address) is
/// said only when it serves, never before a start that then fails.
pub async fn run_locked_then(
    lock: DataDirLock,
    listener: TcpListener,
    config: DaemonConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serving: impl FnOnce(&DaemonInfo),
) -> Result<(), DaemonError> {
    return_big_blocks();
    let addr = listener.local_addr().map_err(|source| DaemonError::Io {
        op: "read the listening address".to_string(),
        source,
    })?;
    if config.home_narrowed {
        tracing::warn!(home = %config.home.display(),
            "the data directory could be opened by other users; it is now private (0700)");
    }
    let token = client_token(&config, addr)?;
    // Before any agent, job or worktree command starts: it ends their trees if we die. Stopped
    // by `wind_down`, after the runtimes stopped.
    let guard = drover_core::guard::start();
    let tokens = Arc::new(agent_tokens::AgentTokens::default());
    // Read before anything starts: a mistake in `[notify]` stops the daemon, naming it.
    let notify_config = notify::NotifyConfig::load(&config.home).map_err(DaemonError::Config)?;
    let (runtimes, registry, interrupted) = open_runtimes(&config.home, addr, &tokens).await?;
    // A link's child dies with the daemon, as every child does (`drover_core::child`).
    let hosts = hosts::Hosts::open(&config.home, &runtimes).map_err(DaemonError::Config)?;

    let info = DaemonInfo {
        version: 1,
        pid: std::process::id(),
        url: format!("http://{addr}"),
        daemon_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: Timestamp::now(),
    };
    lock.publish(&info)?;
    tracing::info!(url = %info.url, home = %config.home.display(), "drover daemon listening");
    serving(&info);

    // Schedules: loaded now, a family of archive admission from here on, firing once the
    // operations they fire through exist.
    let schedules = schedules::Schedules::open(&config.home, schedules::Clock::System);
    registry.register_family(Arc::new(schedules::ScheduleFamily(schedules.clone())));
    let notifier = notify::Notifier::start(
        notify_config,
        &info.url,
        &config.home,
        &registry,
        interrupted,
    );
    let ops = ops::Ops {
        registry: registry.clone(),
        runtimes: runtimes.clone(),
        agent_tokens: tokens,
        schedules: schedules.clone(),
        imports: Arc::default(),
        notifier: notifier.clone(),
        hosts,
        ptys: ptys::Ptys::default(),
    };
    let terminals = ops.end_terminals_with_their_workspace();
    let timer = schedules.start(ops.schedule_sink());
    let mcp_service = mcp_service(mcp::DroverMcp { ops: ops.clone() });
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let clients = metrics::ClientMetrics::default();
    let metrics = Arc::new(metrics::Metrics::new(
        metrics::Fleet {
            registry: registry.clone(),
            runtimes: runtimes.clone(),
            schedules: schedules.clone(),
            started_at: info.started_at,
        },
        &clients,
    ));
    let ws = ws::Context {
        hub: ws::Hub::start(&ops, config.stream_window, config.stream_join, clients),
        ops,
        token: token.clone(),
    };
    let app = server::router(
        server::AppState {
            registry: registry.clone(),
            runtimes: runtimes.clone(),
            info: Arc::new(info),
            home: config.home.clone(),
            addr,
            ws,
            stop,
            token,
            allowed_hosts: Arc::new(config.allowed_hosts.clone()),
            refusals: Arc::default(),
            metrics,
        },
        mcp_service,
    );
    let served = axum::serve(nodelay(listener), app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: no longer accepting connections");
            // Open sessions close; they would otherwise hold the server open.
            let _ = stop_tx.send(true);
        })
        .await;

    wind_down(
        &schedules, timer, &notifier, &terminals, &runtimes, &registry, guard,
    )
    .await;
    lock.release();
    tracing::info!("drover daemon stopped");
    served.map_err(|source| DaemonError::Io {
        op: "serve HTTP".to_string(),
        source,
    })
}

/// Stops what runs once the server stopped serving, in order: schedules, notifications,
/// workspace terminals, runtimes, the store, then the guard.
async fn wind_down(
    schedules: &schedules::Schedules,
    timer: tokio::task::JoinHandle<()>,
    notifier: &notify::Notifier,
    terminals: &ptys::Ptys,
    runtimes: &drover_acp::RuntimeManager,
    registry: &drover_core::Registry,
    guard: Option<drover_core::guard::Guard>,
) {
    schedules.shutdown();
    let _ = timer.await;
    // What the shutdown does to agents is no news to send.
    notifier.shutdown();
    tracing::info!("shutting down: ending workspace terminals");
    terminals.shutdown().await;
    tracing::info!("shutting down: closing runtimes");
    runtimes.shutdown().await;
    registry.shutdown().await;
    tracing::info!("shutting down: store flushed");
    // The guard ends whatever did not stop with its runtime, then exits; waited for on a
    // blocking thread, not on this worker.
    if let Some(guard) = guard {
        guard.stop().await;
    }
}

/// The token clients must present: made (or checked) before anyone can read `daemon.json`
/// and come looking for it. `None` only with `--no-token`, on loopback.
fn client_token(config: &DaemonConfig, addr: SocketAddr) -> Result<Option<Arc<str>>, DaemonError> {
    if !config.no_token {
        return lock::load_or_create_token(&config.home).map(Some);
    }
    if !addr.ip().is_loopback() {
        return Err(DaemonError::Config(format!(
            "--no-token is for loopback only; {addr} can be reached from other machines"
        )));
    }
    tracing::warn!(
        "serving WITHOUT a token (--no-token): every program and every user of this machine can drive these agents"
    );
    Ok(None)
}

/// Allocations of at least this size are always their own mapping, given back to the
/// system when freed.
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`]. Left to itself glibc raises the
/// threshold to the size of any mapped block that is freed (up to 32 MiB), so after the first
/// `session_state` of a large fleet (megabytes, built and freed by whichever worker thread ran
/// the session) every later one comes from that thread's heap, and each thread's heap keeps
/// the freed megabytes: the daemon's memory grew with each snapshot served on another thread
/// (49.9 → 68.1 MB over 20 snapshots of 10,000 agents). With the threshold fixed, a snapshot's
/// buffers are mapped and unmapped: 56.2 → 56.1 MB over 60 (`drover-bench-protocol`, section
/// 2, each read once the connection's session has ended; see ARCHITECTURE.md, `snapshot.rs`).
fn return_big_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[expect(unsafe_code)] // `mallopt` only sets an allocator parameter.
    // SAFETY: M_MMAP_THRESHOLD takes any size; glibc applies it under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// What the kernel may hold of a connection's unsent bytes (`SO_SNDBUF`; Linux doubles it).
/// Past it a session's writes wait, so the events for a client that reads slowly wait in the
/// daemon, where they are joined into fewer messages (see `ws::join`), rather than in a
/// kernel buffer that autotuning grows to megabytes, one stale message at a time.
const SEND_BUFFER: usize = 64 * 1024;

/// The most a socket holds that it has not sent yet (`TCP_NOTSENT_LOWAT`) before a write
/// waits. The send buffer holds what is in flight too, so on a slow link it fills with
/// messages that are not on their way yet: a phone on a mobile network was ~2.8 s behind
/// through 128 KiB of them (`drover-bench-protocol`'s slow-link case). With this bound what
/// waits stays in the daemon, where it is joined, and a slow client is told the newest.
const NOT_SENT: u32 = 16 * 1024;

/// The listener with `TCP_NODELAY` on every accepted socket (WebSocket, MCP, health):
/// Nagle's algorithm would hold a small answer written after another small write until the
/// client's delayed ACK (~40 ms); a send buffer of [`SEND_BUFFER`] and at most [`NOT_SENT`]
/// of it not yet sent.
fn nodelay(
    listener: TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        if let Err(e) =
            nix::sys::socket::setsockopt(&*tcp, nix::sys::socket::sockopt::SndBuf, &SEND_BUFFER)
        {
            tracing::debug!(error = %e, "cannot set SO_SNDBUF on a connection");
        }
        if let Err(e) = socket2::SockRef::from(&*tcp).set_tcp_notsent_lowat(NOT_SENT) {
            tracing::debug!(error = %e, "cannot set TCP_NOTSENT_LOWAT on a connection");
        }
    })
}

/// Loads the providers and the store and opens the runtimes (waking the agents left busy),
/// then logs what the boot found. Also hands back the agents boot found busy (now
/// `interrupted`).
async fn open_runtimes(
    home: &Path,
    addr: SocketAddr,
    tokens: &Arc<agent_tokens::AgentTokens>,
) -> Result<
    (
        drover_acp::RuntimeManager,
        drover_core::Registry,
        Vec<drover_core::AgentId>,
    ),
    DaemonError,
> {
    let started = std::time::Instant::now();
    let providers =
        drover_acp::Providers::load(home).map_err(|e| DaemonError::Config(e.to_string()))?;
    // Agents reach drover's MCP server at their own URL on this port, the ones woken at boot
    // too: the runtimes get it as they open.
    let mcp_servers: drover_acp::McpServers = {
        let tokens = tokens.clone();
        let base = format!("http://{addr}");
        Arc::new(move |agent, http| mcp::servers_for(&base, &tokens, agent, http))
    };
    let (runtimes, registry, boot) = drover_acp::RuntimeManager::open(home, providers, mcp_servers)
        .await
        .map_err(|e| match e {
            drover_acp::AcpError::Registry(e) => DaemonError::Registry(e),
            other => DaemonError::Config(other.to_string()),
        })?;
    for q in &boot.quarantined {
        tracing::error!(path = %q.original.display(), moved_to = ?q.moved_to, reason = %q.reason,
            "quarantined a damaged record");
    }
    for path in &boot.skipped_newer {
        tracing::warn!(path = %path.display(), "left alone a record written by a newer drover");
    }
    tracing::info!(
        agents = boot.agents,
        workspaces = boot.workspaces,
        interrupted = boot.interrupted.len(),
        quarantined = boot.quarantined.len(),
        cascades_completed = boot.cascades_completed,
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "store loaded"
    );
    Ok((runtimes, registry, boot.interrupted))
}

pub(crate) type McpService = StreamableHttpService<mcp::DroverMcp, LocalSessionManager>;

/// drover's MCP server over streamable HTTP. Stateless, plain JSON answers: every tool call
/// stands alone, which is also what the stdio proxy (`drover mcp-proxy`) relays. The `Host`
/// header is the daemon's to check (`server::check_host`, one rule for every route, with
/// `--allow-host`): rmcp's own list (`127.0.0.1`, `localhost`, `::1`) would refuse every agent of a
/// daemon listening on any other address or reached through an allowed name.
fn mcp_service(handler: mcp::DroverMcp) -> McpService {
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener as _;

    #[tokio::test]
    async fn accepted_sockets_write_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut listener = super::nodelay(listener);
        let (_client, (accepted, _)) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        assert!(
            accepted.nodelay().expect("TCP_NODELAY"),
            "Nagle is still on"
        );
    }
}
