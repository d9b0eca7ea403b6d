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
        drover_core::private::create_dir_all(home).map_err(io)?;
        let file = drover_core::private::open_options()
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

/// The token clients present: `$DROVER_HOME/token`, made at first start (mode 0600, never
/// through a link). An existing token must be a plain file of this user that no one else can
/// read; anything else is refused with what to do, since a secret others could read is no
/// secret.
pub fn load_or_create_token(home: &Path) -> Result<std::sync::Arc<str>, DaemonError> {
    let path = home.join("token");
    // Two tries: a token made by someone else between our open and our create is read.
    for _ in 0..2 {
        match read_token(&path)? {
            Some(token) => return Ok(token.into()),
            None => {
                if let Some(token) = create_token(&path)? {
                    tracing::info!(path = %path.display(), "created the client token");
                    return Ok(token.into());
                }
            }
        }
    }
    Err(DaemonError::Config(format!(
        "`{}` keeps appearing and vanishing; is another program writing it?",
        path.display()
    )))
}

/// The token in `path`, `None` if there is no file (or an empty one, which is removed).
fn read_token(path: &Path) -> Result<Option<String>, DaemonError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    let remove = format!("remove it (`rm {shown}`) and start again: drover makes a new one");
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(DaemonError::Config(format!(
                "`{shown}` is a symbolic link; the token must be a file of its own: {remove}"
            )));
        }
        Err(source) => {
            return Err(DaemonError::Io {
                op: format!("read `{shown}`"),
                source,
            });
        }
    };
    let meta = file.metadata().map_err(|source| DaemonError::Io {
        op: format!("read `{shown}`"),
        source,
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_file() {
        return Err(DaemonError::Config(format!(
            "`{shown}` is not a plain file: {remove}"
        )));
    }
    if meta.uid() != me {
        return Err(DaemonError::Config(format!(
            "`{shown}` belongs to uid {}, not to this user (uid {me}): {remove}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(DaemonError::Config(format!(
            "`{shown}` can be read by other users (mode {:o}), so it may be known: {remove}; or, if no one else could have read it, `chmod 600 {shown}`",
            meta.mode() & 0o777
        )));
    }
    if meta.len() == 0 {
        // What a start killed between the file's creation and its write leaves (see
        // `create_token`): no token anyone could know. Made again, as if there were none.
        std::fs::remove_file(path).map_err(|source| DaemonError::Io {
            op: format!("remove the empty `{shown}`"),
            source,
        })?;
        tracing::warn!(path = %shown, "the client token file was empty (a start was cut short); making a new one");
        return Ok(None);
    }
    let mut token = String::new();
    file.take(4096)
        .read_to_string(&mut token)
        .map_err(|source| DaemonError::Io {
            op: format!("read `{shown}`"),
            source,
        })?;
    let token = token.trim();
    if token.len() < 32 || token.chars().any(char::is_whitespace) {
        return Err(DaemonError::Config(format!(
            "`{shown}` holds no usable token (one word of at least 32 characters): {remove}"
        )));
    }
    Ok(Some(token.to_string()))
}

/// Makes a new token file; `None` if one appeared meanwhile.
fn create_token(path: &Path) -> Result<Option<String>, DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |op: &str, source| DaemonError::Io {
        op: format!("{op} `{}`", path.display()),
        source,
    };
    let created = drover_core::private::open_options()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match created {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(io("create", e)),
    };
    let token = new_secret();
    let written = file
        .write_all(token.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        // A half-written token would be refused at the next start: leave none.
        let _ = std::fs::remove_file(path);
        return Err(io("write", e));
    }
    Ok(Some(token))
}

/// Compares a presented secret with the expected one in time that does not depend on where
/// they differ.
pub(crate) fn secret_matches(presented: &str, expected: &str) -> bool {
    let (a, b) = (presented.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
