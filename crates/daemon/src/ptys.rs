//! Workspace terminals: interactive shells for people, each on a PTY of the daemon's host in
//! a workspace's directory (not ACP client terminals, which are an agent's jobs: see
//! `drover_acp::jobs`).
//!
//! A terminal is its shell (started by `drover_core::pty`: a session of its own whose
//! controlling terminal is the PTY, killed by the kernel when the daemon dies, in a cgroup of
//! its own for the guard), a thread reading the PTY's master into a bounded scrollback
//! ([`SCROLLBACK`] bytes, numbered by their offset in everything the terminal wrote), and a
//! thread waiting for the shell. Clients attach by offset (see `ws::pty`): the scrollback
//! repaints the screen, then they get what comes. Nothing is stored: a daemon restart ends
//! every terminal (a PTY cannot outlive the process that holds its master).
//!
//! A terminal ends when its shell exits, when it is closed (`close_terminal`), when its
//! workspace is archived, and when the daemon stops; its whole tree goes with it
//! (`drover_acp::process::terminate_group`: its process group, the groups of everything
//! under it, its cgroup).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use drover_core::WorkspaceId;
use jiff::Timestamp;
use tokio::sync::{broadcast, watch};

/// Bytes of output each terminal keeps for clients that attach later.
pub(crate) const SCROLLBACK: usize = 256 * 1024;
/// Terminals one daemon runs at once.
pub(crate) const MAX_TERMINALS: usize = 32;
/// The most one `terminal_input` may carry.
pub(crate) const MAX_INPUT: usize = 64 * 1024;
/// Inputs waiting for a terminal's writer (each at most [`MAX_INPUT`] bytes): past it the
/// shell is not reading, and more typing is refused rather than held.
const INPUT_QUEUE: usize = 64;
/// How long a closed terminal's programs have between TERM and KILL.
const CLOSE_GRACE: Duration = Duration::from_millis(500);
/// How long the end of a shell waits for the last of its output (a process that left the
/// tree may hold the PTY open).
const DRAIN: Duration = Duration::from_secs(2);

/// Why a terminal request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PtyError {
    #[error("no workspace terminal `{0}` (it ended, or was never opened on this daemon)")]
    Unknown(String),
    #[error("this daemon runs {MAX_TERMINALS} workspace terminals already; close one first")]
    Limit,
    #[error("cannot start `{shell}` in `{cwd}`: {source}")]
    Start {
        shell: String,
        cwd: String,
        #[source]
        source: io::Error,
    },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("terminal `{0}` is not reading what is typed (its input is full)")]
    InputFull(String),
    #[error("cannot write to or resize terminal `{id}`: {source}")]
    Io {
        id: String,
        #[source]
        source: io::Error,
    },
}

/// How far a terminal is: the offset after its last byte, and how it ended once it did (after
/// its last byte is in the scrollback).
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    pub(crate) end: u64,
    pub(crate) ended: Option<Ended>,
}

/// How a terminal's shell ended.
#[derive(Debug, Clone)]
pub(crate) struct Ended {
    /// For people: `exit status 0`, `signal 9 (SIGKILL)`.
    pub(crate) status: String,
    pub(crate) exit_code: Option<i32>,
}

/// Output read from a terminal: UTF-8 text that splits no character.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) offset: u64,
    pub(crate) data: String,
    pub(crate) next_offset: u64,
}

/// The last bytes a terminal wrote (at most `limit`), and the offset of the first of them.
#[derive(Debug)]
struct Screen {
    bytes: VecDeque<u8>,
    start: u64,
    limit: usize,
}

impl Screen {
    fn new(limit: usize) -> Screen {
        Screen {
            bytes: VecDeque::new(),
            start: 0,
            limit,
        }
    }

    /// Keeps `bytes`, dropping the oldest past the limit; the offset after the last byte.
    fn push(&mut self, bytes: &[u8]) -> u64 {
        self.bytes.extend(bytes);
        let excess = self.bytes.len().saturating_sub(self.limit);
        if excess > 0 {
            self.bytes.drain(..excess);
            self.start += excess as u64;
        }
        self.start + self.bytes.len() as u64
    }

    /// See [`Pty::read`].
    fn read(&self, from: u64, max: usize, last: bool) -> Option<Chunk> {
        let end = self.start + self.bytes.len() as u64;
        let from = from.max(self.start);
        if from >= end {
            return None;
        }
        let skip = usize::try_from(from - self.start).unwrap_or(usize::MAX);
        let bytes: Vec<u8> = self.bytes.iter().skip(skip).take(max).copied().collect();
        // Continuation bytes: the read starts inside a character (the scrollback was cut
        // there, or a client asked for that offset).
        let lead = bytes
            .iter()
            .take(3)
            .take_while(|b| (0x80..0xc0).contains(*b))
            .count();
        let (data, used) = decode(&bytes[lead..], last);
        let used = lead + used;
        if used == 0 {
            return None;
        }
        Some(Chunk {
            offset: from,
            data,
            next_offset: from + used as u64,
        })
    }
}

/// One workspace terminal.
#[derive(Debug)]
pub(crate) struct Pty {
    /// `term-<n>`.
    pub(crate) id: String,
    pub(crate) workspace: WorkspaceId,
    pub(crate) cwd: PathBuf,
    pub(crate) shell: String,
    pub(crate) pid: u32,
    pub(crate) created_at: Timestamp,
    size: Mutex<(u16, u16)>,
    master: File,
    /// To the writer thread, which types into the PTY in the order inputs came.
    input: std::sync::mpsc::SyncSender<Vec<u8>>,
    screen: Mutex<Screen>,
    progress: watch::Sender<Progress>,
    /// The shell's exit status, as soon as it is known (before the output is drained).
    exited: watch::Receiver<Option<ExitStatus>>,
    cgroup: Option<PathBuf>,
}

impl Pty {
    /// (cols, rows).
    pub(crate) fn size(&self) -> (u16, u16) {
        *self.size.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Bytes written so far.
    pub(crate) fn end(&self) -> u64 {
        self.progress.borrow().end
    }

    /// The offset of the first byte kept.
    pub(crate) fn kept_from(&self) -> u64 {
        self.screen().start
    }

    fn screen(&self) -> std::sync::MutexGuard<'_, Screen> {
        self.screen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `max` bytes from `from` (or the first byte kept, when `from` is no longer), as
    /// text: a character cut at the end is left for the next read, unless `last` (nothing more
    /// will come); bytes that are not UTF-8 read as U+FFFD, and a read that starts inside a
    /// character skips its rest. `None` when there is nothing to read yet.
    pub(crate) fn read(&self, from: u64, max: usize, last: bool) -> Option<Chunk> {
        self.screen().read(from, max, last)
    }

    /// Types `data` into the terminal: queued for its writer thread, in order, without
    /// waiting (a shell that does not read may block the write).
    pub(crate) fn write(&self, data: Vec<u8>) -> Result<(), PtyError> {
        self.input.try_send(data).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => PtyError::InputFull(self.id.clone()),
            std::sync::mpsc::TrySendError::Disconnected(_) => PtyError::Unknown(self.id.clone()),
        })
    }

    pub(crate) fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        drover_core::pty::resize(&self.master, cols, rows)?;
        *self.size.lock().unwrap_or_else(PoisonError::into_inner) = (cols, rows);
        Ok(())
    }

    /// Ends the shell and everything it started (TERM, then KILL after [`CLOSE_GRACE`]), and
    /// waits until the terminal has ended (its last output read).
    async fn terminate(&self) {
        let mut exited = self.exited.clone();
        drover_acp::process::terminate_group(
            self.pid,
            None,
            self.cgroup.as_deref(),
            &mut exited,
            CLOSE_GRACE,
        )
        .await;
        let mut progress = self.progress();
        let _ = tokio::time::timeout(
            DRAIN + Duration::from_secs(1),
            progress.wait_for(|p| p.ended.is_some()),
        )
        .await;
    }
}

/// Decodes `bytes` as UTF-8, U+FFFD for bytes that are not; a character cut at the end is
/// left out unless `last`. The text and how many bytes it took.
fn decode(bytes: &[u8], last: bool) -> (String, usize) {
    let mut text = String::with_capacity(bytes.len());
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                text.push_str(valid);
                return (text, bytes.len());
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                // Checked by `from_utf8`.
                text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    Some(bad) => {
                        text.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[bad..];
                    }
                    None if last => {
                        text.push(char::REPLACEMENT_CHARACTER);
                        return (text, bytes.len());
                    }
                    None => return (text, bytes.len() - after.len()),
                }
            }
        }
    }
}

/// A terminal opened or changed (`terminal`), or ended (`None`).
#[derive(Debug, Clone)]
pub(crate) struct PtyEvent {
    pub(crate) id: String,
    pub(crate) terminal: Option<Arc<Pty>>,
}

/// The daemon's workspace terminals.
#[derive(Debug, Clone)]
pub(crate) struct Ptys(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    terminals: Mutex<BTreeMap<u64, Arc<Pty>>>,
    next: AtomicU64,
    stopping: AtomicBool,
    events: broadcast::Sender<PtyEvent>,
}

impl Default for Ptys {
    fn default() -> Ptys {
        Ptys(Arc::new(Inner {
            terminals: Mutex::default(),
            next: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            events: broadcast::channel(256).0,
        }))
    }
}

/// What a new terminal runs: the shell, where, with which variables.
pub(crate) struct Launch {
    pub(crate) workspace: WorkspaceId,
    pub(crate) cwd: PathBuf,
    pub(crate) shell: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cols: u16,
    pub(crate) rows: u16,
}

impl Ptys {
    fn terminals(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Pty>>> {
        self.0
            .terminals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Terminals opened, resized, ended.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<PtyEvent> {
        self.0.events.subscribe()
    }

    /// Every running terminal, of `workspace` or of all, oldest first.
    pub(crate) fn list(&self, workspace: Option<WorkspaceId>) -> Vec<Arc<Pty>> {
        self.terminals()
            .values()
            .filter(|t| workspace.is_none_or(|w| t.workspace == w))
            .cloned()
            .collect()
    }

    pub(crate) fn get(&self, id: &str) -> Result<Arc<Pty>, PtyError> {
        id.strip_prefix("term-")
            .and_then(|n| n.parse::<u64>().ok())
            .and_then(|n| self.terminals().get(&n).cloned())
            .ok_or_else(|| PtyError::Unknown(id.chars().take(80).collect()))
    }

    /// Starts a terminal.
    pub(crate) async fn open(&self, launch: Launch) -> Result<Arc<Pty>, PtyError> {
        if self.0.stopping.load(Ordering::SeqCst) {
            return Err(PtyError::ShuttingDown);
        }
        if self.terminals().len() >= MAX_TERMINALS {
            return Err(PtyError::Limit);
        }
        let mut command = Command::new(&launch.shell);
        command
            .current_dir(&launch.cwd)
            .env_clear()
            .envs(&launch.env);
        let (shell, cwd) = (launch.shell.clone(), launch.cwd.display().to_string());
        let start_failed = move |source| PtyError::Start {
            shell: shell.clone(),
            cwd: cwd.clone(),
            source,
        };
        let started = drover_core::pty::spawn(command, launch.cols, launch.rows)
            .await
            .map_err(&start_failed)?;
        let clones = started
            .master
            .try_clone()
            .and_then(|reader| Ok((reader, started.master.try_clone()?)));
        let (reader, mut writer) = match clones {
            Ok(clones) => clones,
            Err(e) => {
                abandon(started.child);
                return Err(start_failed(e));
            }
        };
        let (input, typed) = std::sync::mpsc::sync_channel::<Vec<u8>>(INPUT_QUEUE);
        let pid = started.child.id();
        let number = self.0.next.fetch_add(1, Ordering::SeqCst);
        let (exit_tx, exited) = watch::channel(None);
        let pty = Arc::new(Pty {
            id: format!("term-{number}"),
            workspace: launch.workspace,
            cwd: launch.cwd,
            shell: launch.shell,
            pid,
            created_at: Timestamp::now(),
            size: Mutex::new((launch.cols, launch.rows)),
            master: started.master,
            input,
            screen: Mutex::new(Screen::new(SCROLLBACK)),
            progress: watch::channel(Progress::default()).0,
            exited,
            cgroup: drover_core::guard::cgroup_of(pid),
        });
        {
            let mut terminals = self.terminals();
            // Opened side by side, the last ones over the limit go.
            if terminals.len() >= MAX_TERMINALS {
                drop(terminals);
                abandon(started.child);
                return Err(PtyError::Limit);
            }
            terminals.insert(number, pty.clone());
        }
        let (read_done, drained) = std::sync::mpsc::channel();
        let read = pty.clone();
        std::thread::Builder::new()
            .name(format!("drover-{}", pty.id))
            .spawn(move || {
                read_output(&read, reader);
                let _ = read_done.send(());
            })
            .map_err(&start_failed)?;
        std::thread::Builder::new()
            .name(format!("drover-{}-input", pty.id))
            .spawn(move || {
                // Ends when the terminal is dropped (its sender with it), or the PTY is gone.
                for data in typed {
                    if writer.write_all(&data).is_err() {
                        break;
                    }
                }
            })
            .map_err(&start_failed)?;
        let waited = pty.clone();
        let ptys = Arc::downgrade(&self.0);
        let mut child = started.child;
        std::thread::Builder::new()
            .name(format!("drover-{}-wait", pty.id))
            .spawn(move || {
                let status = child.wait();
                let _ = exit_tx.send(status.as_ref().ok().copied());
                wound_up(&waited, number, &ptys, &status, &drained);
            })
            .map_err(&start_failed)?;
        tracing::info!(terminal = %pty.id, pid, workspace = %pty.workspace, "workspace terminal opened");
        let _ = self.0.events.send(PtyEvent {
            id: pty.id.clone(),
            terminal: Some(pty.clone()),
        });
        Ok(pty)
    }

    /// Tells every session a terminal changed (its size).
    pub(crate) fn changed(&self, pty: &Arc<Pty>) {
        let _ = self.0.events.send(PtyEvent {
            id: pty.id.clone(),
            terminal: Some(pty.clone()),
        });
    }

    /// Ends `pty` and waits until it ended.
    pub(crate) async fn close(&self, pty: &Pty) {
        pty.terminate().await;
    }

    /// Ends every terminal of `workspace` (it was archived).
    pub(crate) async fn close_workspace(&self, workspace: WorkspaceId) {
        let all = self.list(Some(workspace));
        futures_util::future::join_all(all.iter().map(|t| t.terminate())).await;
    }

    /// Ends every terminal, and opens no more (the daemon stops).
    pub(crate) async fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        let all = self.list(None);
        futures_util::future::join_all(all.iter().map(|t| t.terminate())).await;
    }
}

/// Kills a shell that will not be a terminal (nothing runs in it yet) and reaps it.
fn abandon(mut child: std::process::Child) {
    let _ = child.kill();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
}

/// Reads the PTY's master into the scrollback until the shell's session closed the slave.
fn read_output(pty: &Pty, mut master: File) {
    let mut buf = vec![0u8; 16 * 1024];
    // Linux reads EIO from a master whose slave is closed everywhere.
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        let end = pty.screen().push(&buf[..n]);
        pty.progress.send_modify(|p| p.end = end);
    }
}

/// The shell exited: whatever it left is ended, its last output read, then the terminal ends
/// and leaves the list.
fn wound_up(
    pty: &Pty,
    number: u64,
    ptys: &Weak<Inner>,
    status: &io::Result<ExitStatus>,
    drained: &std::sync::mpsc::Receiver<()>,
) {
    drover_acp::process::kill_group_now(pty.pid, None, pty.cgroup.as_deref());
    let _ = drained.recv_timeout(DRAIN);
    let ended = match status {
        Ok(status) => Ended {
            status: drover_core::child::describe_exit(status),
            exit_code: status.code(),
        },
        Err(e) => Ended {
            status: format!("cannot wait for the shell: {e}"),
            exit_code: None,
        },
    };
    tracing::info!(terminal = %pty.id, status = %ended.status, "workspace terminal ended");
    // Out of the list before anyone hears that it ended (`terminal_exit`, a close's answer):
    // a client that lists terminals after either never sees it.
    let inner = ptys.upgrade();
    if let Some(inner) = &inner {
        inner
            .terminals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&number);
    }
    pty.progress.send_modify(|p| p.ended = Some(ended));
    if let Some(inner) = inner {
        let _ = inner.events.send(PtyEvent {
            id: pty.id.clone(),
            terminal: None,
        });
    }
}

/// The shell a terminal runs: the user's (`SHELL` in what agents inherit), else `/bin/sh`.
pub(crate) fn shell_of(env: &BTreeMap<String, String>) -> String {
    env.get("SHELL")
        .filter(|s| Path::new(s).is_absolute())
        .cloned()
        .unwrap_or_else(|| "/bin/sh".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrollback_keeps_the_last_bytes_by_offset_and_reads_whole_characters() {
        let mut screen = Screen::new(8);
        assert_eq!(screen.push(b"abc"), 3);
        let all = screen.read(0, 100, false).expect("text");
        assert_eq!(
            (all.offset, all.data.as_str(), all.next_offset),
            (0, "abc", 3)
        );
        assert!(screen.read(3, 100, false).is_none());
        // Past the limit the oldest bytes go; `é` (two bytes at 4 and 5) is cut in half.
        assert_eq!(screen.push("déf€".as_bytes()), 10);
        let kept = screen.read(0, 100, false).expect("text");
        assert_eq!(
            (kept.offset, kept.data.as_str(), kept.next_offset),
            (2, "cdéf€", 10)
        );
        assert_eq!(screen.push(b"xyz"), 13);
        let half = screen.read(0, 100, false).expect("text");
        assert_eq!(
            (half.offset, half.data.as_str(), half.next_offset),
            (5, "f€xyz", 13)
        );
        let mut cut = Screen::new(8);
        cut.push("abcdefgé".as_bytes());
        assert_eq!(cut.start, 1);
        cut.push(b"z");
        // Offset 8 is `é`'s second byte.
        let rest = cut.read(8, 100, false).expect("text");
        assert_eq!((rest.data.as_str(), rest.next_offset), ("z", 10));
        // A character cut by `max` waits for the next read.
        let part = cut.read(6, 2, false).expect("text");
        assert_eq!((part.data.as_str(), part.next_offset), ("g", 7));
    }

    #[test]
    fn decoding_never_splits_a_character_and_marks_what_is_not_text() {
        let e = "é".as_bytes();
        assert_eq!(decode(b"abc", false), ("abc".to_string(), 3));
        assert_eq!(decode(&[b'a', e[0]], false), ("a".to_string(), 1));
        assert_eq!(decode(&[b'a', e[0]], true), ("a\u{fffd}".to_string(), 2));
        assert_eq!(
            decode(&[b'a', 0xff, b'b'], false),
            ("a\u{fffd}b".to_string(), 3)
        );
    }
}
