//! Where the daemon keeps its state and where it listens.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::DaemonError;

/// The port `drover daemon` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7433;

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
