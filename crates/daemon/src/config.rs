//! Where the daemon keeps its state and where it listens.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::DaemonError;

/// The port `drover daemon` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7433;

/// How long an agent's streamed text is joined into one `append` for clients, unless
/// `DROVER_STREAM_WINDOW_MS` says otherwise (`0`: every chunk on its own).
pub const DEFAULT_STREAM_WINDOW: Duration = Duration::from_millis(30);

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// `$DROVER_HOME`, default `~/.drover`.
    pub home: PathBuf,
    /// Default `127.0.0.1:7433`.
    pub listen: SocketAddr,
    /// Serve without the token (`--no-token`): anyone who can reach the port drives the
    /// daemon. Refused beyond loopback.
    pub no_token: bool,
    /// Host names (beside `localhost` and IP addresses) that requests may name in `Host`, for
    /// a daemon reached through a name of its own.
    pub allowed_hosts: Vec<String>,
    /// The home could be opened by other users and was made private (said once logging is up).
    pub(crate) home_narrowed: bool,
    /// Streamed text appended to one item within this window goes to clients as one `append`
    /// (the first chunk never waits). Zero: no joining.
    pub stream_window: Duration,
    /// A session that is behind (events waiting for its socket) joins what waits for it:
    /// consecutive `append`s to one item into one, an agent's `agent_status`es into the last.
    /// `DROVER_STREAM_JOIN=0` turns it off (every event its own message, for comparison).
    pub stream_join: bool,
}

impl DaemonConfig {
    /// Checks the settings and makes the data directory, private to this user (0700).
    pub fn new(home: &Path, listen: SocketAddr) -> Result<DaemonConfig, DaemonError> {
        let home_narrowed = drover_core::private::claim_home(home).map_err(DaemonError::Config)?;
        let home = std::fs::canonicalize(home).map_err(|source| DaemonError::Io {
            op: format!("resolve the data directory `{}`", home.display()),
            source,
        })?;
        Ok(DaemonConfig {
            home,
            listen,
            no_token: false,
            allowed_hosts: Vec::new(),
            home_narrowed,
            stream_window: stream_window_from_env()?,
            stream_join: stream_join_from_env()?,
        })
    }

    pub fn default_listen() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT)
    }

    /// `$DROVER_HOME`, else `~/.drover`.
    pub fn default_home() -> Result<PathBuf, DaemonError> {
        if let Some(home) = std::env::var_os("DROVER_HOME").filter(|h| !h.is_empty()) {
            return Ok(PathBuf::from(home));
        }
        match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(user) => Ok(Path::new(&user).join(".drover")),
            None => Err(DaemonError::Config(
                "neither DROVER_HOME nor HOME is set: pass --home".to_string(),
            )),
        }
    }
}

/// `DROVER_STREAM_JOIN`: `1` (the default) or `0`.
fn stream_join_from_env() -> Result<bool, DaemonError> {
    let Some(raw) = std::env::var_os("DROVER_STREAM_JOIN").filter(|v| !v.is_empty()) else {
        return Ok(true);
    };
    match raw.to_string_lossy().trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        other => Err(DaemonError::Config(format!(
            "DROVER_STREAM_JOIN must be 1 (join what waits for a slow client) or 0, not `{other}`"
        ))),
    }
}

/// `DROVER_STREAM_WINDOW_MS`, else [`DEFAULT_STREAM_WINDOW`]; at most a second, which is
/// already far too slow to read as streaming.
fn stream_window_from_env() -> Result<Duration, DaemonError> {
    let Some(raw) = std::env::var_os("DROVER_STREAM_WINDOW_MS").filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_STREAM_WINDOW);
    };
    let raw = raw.to_string_lossy();
    match raw.trim().parse::<u64>() {
        Ok(ms) if ms <= 1000 => Ok(Duration::from_millis(ms)),
        _ => Err(DaemonError::Config(format!(
            "DROVER_STREAM_WINDOW_MS must be a number of milliseconds from 0 to 1000, not `{raw}`"
        ))),
    }
}
