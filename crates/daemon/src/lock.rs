//! The data-directory lock: one daemon per `$DROVER_HOME`.
//!
//! An advisory lock on `daemon.lock`, held for the life of the process (the kernel drops it if
//! the process dies, so a crashed daemon never blocks the next one). Beside it `daemon.json`
//! says who holds it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::{DAEMON_INFO_FILE, DaemonError, DaemonInfo};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another drover daemon ({holder}) is already using `{}`", home.display())]
    Held { home: PathBuf, holder: String },
    #[error("cannot lock `{}`: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held while the daemon runs.
#[derive(Debug)]
pub struct DataDirLock {
    home: PathBuf,
    file: File,
}

impl DataDirLock {
    /// Locks `home` or says who holds it.
    pub fn acquire(home: &Path) -> Result<DataDirLock, LockError> {
        let path = home.join("daemon.lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(home).map_err(io)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(DataDirLock {
                home: home.to_path_buf(),
                file,
            }),
            Err(TryLockError::WouldBlock) => Err(LockError::Held {
                home: home.to_path_buf(),
                holder: describe_holder(home),
            }),
            Err(TryLockError::Error(source)) => Err(io(source)),
        }
    }

    /// Writes `daemon.json` for clients and for a second daemon's message.
    pub fn publish(&self, info: &DaemonInfo) -> Result<(), DaemonError> {
        let path = self.home.join(DAEMON_INFO_FILE);
        let mut bytes = serde_json::to_vec_pretty(info).map_err(|e| DaemonError::Io {
            op: format!("encode `{}`", path.display()),
            source: std::io::Error::other(e),
        })?;
        bytes.push(b'\n');
        drover_core::store::write_atomic(&path, &bytes).map_err(|e| DaemonError::Io {
            op: "publish the daemon's address".to_string(),
            source: std::io::Error::other(e),
        })
    }

    /// Removes `daemon.json` and lets the lock go.
    pub fn release(self) {
        let path = self.home.join(DAEMON_INFO_FILE);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the daemon info file");
        }
        let _ = self.file.unlock();
    }
}

fn describe_holder(home: &Path) -> String {
    match std::fs::read(home.join(DAEMON_INFO_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<DaemonInfo>(&b).ok())
    {
        Some(info) => format!("pid {}, {}", info.pid, info.url),
        None => "still starting".to_string(),
    }
}

/// A new secret (the client token, an agent's MCP token): two v4 uuids from the operating
/// system's CSPRNG, 244 random bits, as 64 hex digits.
pub(crate) fn new_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The token clients present when the daemon listens beyond loopback: `$DROVER_HOME/token`,
/// created at first need with mode 0600.
pub fn load_or_create_token(home: &Path) -> Result<std::sync::Arc<str>, DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join("token");
    let io = |op: &str, source| DaemonError::Io {
        op: format!("{op} `{}`", path.display()),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => return Ok(token.trim().into()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("read", e)),
    }
    let token = new_secret();
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io("create", e))?;
    file.write_all(token.as_bytes())
        .map_err(|e| io("write", e))?;
    file.sync_all().map_err(|e| io("sync", e))?;
    tracing::info!(path = %path.display(), "created the client token");
    Ok(token.into())
}
