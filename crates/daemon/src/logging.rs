//! Daemon logs: `tracing` to stderr (warnings and errors only when stderr is not a terminal)
//! and to `$DROVER_HOME/daemon.log`, as text or, with `--log-format json`, as one JSON object
//! per line (the event's fields at the top level beside `timestamp`, `level`, `target` and
//! `message`; the fields of the spans it happened in, `agent` for an agent's task and
//! `request_id` for a client's request, in `spans`), rotated by size: past
//! [`LOG_LIMIT`] bytes the file becomes `daemon.log.1` (replacing the one before) and a new
//! `daemon.log` starts, so the log never takes more than twice the limit on disk.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt;
use tracing_subscriber::prelude::*;

/// The size past which `daemon.log` is rotated.
pub const LOG_LIMIT: u64 = 10 * 1024 * 1024;

/// How `daemon.log` is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber. The level comes from `DROVER_LOG` (e.g. `debug`,
/// `drover_core=trace`), default `info`. Call once per process.
pub fn init(home: &Path, format: LogFormat) -> std::io::Result<()> {
    drover_core::private::create_dir_all(home)?;
    let file = RotatingFile::open(home.join("daemon.log"), LOG_LIMIT)?;
    let filter =
        || EnvFilter::try_from_env("DROVER_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::stderr().is_terminal();
    let color = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // Not a terminal (`drover daemon start` sends it to `daemon.out`, which is not rotated):
    // only warnings and errors; `daemon.log` has everything.
    let stderr_filter = if terminal {
        filter()
    } else {
        EnvFilter::new("warn")
    };
    let (text, json) = match format {
        LogFormat::Text => (
            Some(
                fmt::layer()
                    .with_writer(Mutex::new(file))
                    .with_ansi(false)
                    .with_filter(filter()),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_writer(Mutex::new(file))
                    .with_filter(filter()),
            ),
        ),
    };
    tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color)
                .with_filter(stderr_filter),
        )
        .with(text)
        .with(json)
        .try_init()
        .map_err(std::io::Error::other)
}

/// An append-only file that moves itself to `NAME.1` once it holds `limit` bytes and starts
/// afresh. Each write is one formatted event, so lines are never split across the two files.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    file: File,
    len: u64,
    limit: u64,
}

impl RotatingFile {
    /// Opens (or creates, 0600) `path` for appending.
    pub fn open(path: PathBuf, limit: u64) -> std::io::Result<RotatingFile> {
        let file = Self::append(&path)?;
        let len = file.metadata()?.len();
        Ok(RotatingFile {
            path,
            file,
            len,
            limit,
        })
    }

    fn append(path: &Path) -> std::io::Result<File> {
        drover_core::private::open_options()
            .create(true)
            .append(true)
            .open(path)
    }

    /// `daemon.log` → `daemon.log.1`, and a new, empty `daemon.log`.
    fn rotate(&mut self) -> std::io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = Self::append(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A log that cannot rotate keeps growing rather than losing lines.
        if self.len >= self.limit && self.len > 0 {
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_moves_to_dot_1_past_its_limit_and_starts_afresh() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("daemon.log");
        std::fs::write(&path, "before\n").expect("an old log");
        let mut log = RotatingFile::open(path.clone(), 100).expect("open");
        // One write per line, as the fmt layer writes one formatted event.
        for n in 0..30 {
            log.write_all(format!("line {n:04}\n").as_bytes())
                .expect("write");
        }
        let current = std::fs::read_to_string(&path).expect("daemon.log");
        let older = std::fs::read_to_string(dir.path().join("daemon.log.1")).expect(".1");
        assert!(
            older.len() <= 100 + 10 && current.len() <= 100 + 10,
            "{older}|{current}"
        );
        assert!(current.ends_with("line 0029\n"), "{current}");
        assert!(!older.contains("before"), "the oldest lines went: {older}");
        // Whole lines only, none lost between the two files.
        let lines: Vec<&str> = older.lines().chain(current.lines()).collect();
        let last: Vec<String> = (30 - lines.len()..30)
            .map(|n| format!("line {n:04}"))
            .collect();
        assert_eq!(lines, last);
        // Nothing else was made.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 2);
    }
}
