//! Child processes, started one way by everyone who starts them (agents in drover-acp, a
//! worktree's setup and teardown here): a process group of their own, a bounded tail of what
//! they wrote, one description of how they ended, and signals to the whole group.
//!
//! Nothing drover starts outlives it: [`die_with_daemon`] asks the kernel to SIGKILL a child
//! when the daemon dies (by any signal, SIGKILL included), and [`spawn_tied`] / [`on_spawner`]
//! start it from the one thread for which that promise holds (see [`on_spawner`]); what the
//! child starts in turn is the guard's (`crate::guard`): [`die_with_daemon`] marks the child
//! and puts it in a cgroup of its own for it.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// `program` in `cwd`, in a new process group of its own (so the group can be ended whole),
/// stdin closed, stdout and stderr piped. Async callers turn it into a
/// `tokio::process::Command`.
pub fn command(program: impl AsRef<OsStr>, cwd: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    command
}

/// Makes the process `command` starts get SIGKILL as soon as the daemon dies, by any signal
/// (Linux's `PR_SET_PDEATHSIG`). A child that finds the daemon already gone when it starts
/// does not start. Start it with [`spawn_tied`] or from [`on_spawner`]: the kernel sends the
/// signal when the *thread* that forked the child ends, not only the process.
///
/// That signal reaches only the direct child; what it starts, at any depth, is ended by the
/// daemon's guard (see [`crate::guard`]): so the child also gets the daemon's marker in its
/// environment and, where cgroups can be used, writes itself into a cgroup of its own before
/// it execs. Call it after the command's environment is set (`env_clear` would drop the
/// marker).
#[expect(unsafe_code)] // `pre_exec` is unsafe: the closure runs between fork and exec.
pub fn die_with_daemon(command: &mut Command) {
    let daemon = std::process::id();
    command.env(crate::guard::RUN_VAR, crate::guard::token());
    let leaf = crate::guard::new_leaf().map(|(_, procs)| procs);
    // SAFETY: the closure makes only async-signal-safe system calls (prctl, getppid, open,
    // write, close) on memory allocated before the fork, and builds its errors from raw codes,
    // without allocating or taking a lock.
    unsafe {
        command.pre_exec(move || {
            if let Some(procs) = &leaf {
                // "0" moves the writer itself. A failure leaves the child in the daemon's
                // cgroup, where the marker still finds it.
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    let _ = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The daemon died between fork and prctl: the child has a new parent already.
            if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(daemon) {
                return Err(io::Error::from(nix::errno::Errno::ESRCH));
            }
            Ok(())
        });
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the spawner: one thread, started on first use and never ended, from which
/// drover forks every child. `PR_SET_PDEATHSIG` fires when the forking thread exits, and a
/// pool thread (tokio's blocking threads end after 10 s idle; a worker can be handed off by
/// `block_in_place`) would kill a healthy agent with it; the spawner ends only with the
/// process. A tokio caller enters its runtime in `job` (`Handle::enter`) to spawn a
/// `tokio::process::Command`.
pub async fn on_spawner<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    submit(Box::new(move || {
        let _ = tx.send(job());
    }))?;
    rx.await
        .map_err(|_| io::Error::other("the spawner thread dropped a job"))
}

/// Runs what `command` starts as a shell runs a job. When this process is the foreground of
/// the terminal on its stdin, in a process group of its own that becomes the terminal's
/// foreground while it runs (it reads the terminal and gets its Ctrl-C): wait for it with
/// [`wait_in_the_foreground`], which passes a Ctrl-Z on as a shell does, and give the terminal
/// back with [`take_terminal_back`] once it exited or failed to start. Without a terminal, in
/// a group of its own as well. In the background of a shell, in this process's group: the
/// shell's `fg`, `bg` and Ctrl-Z then reach it with this process. Its group can be ended
/// whole after it (see [`JobGroup`]).
#[expect(unsafe_code)] // `pre_exec` is unsafe: the closure runs between fork and exec.
pub fn in_a_job_of_its_own(command: &mut Command) -> JobGroup {
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) && !owns_the_terminal() {
        return JobGroup::Shared;
    }
    command.process_group(0);
    if !owns_the_terminal() {
        return JobGroup::Own;
    }
    // SAFETY: the closure makes only async-signal-safe system calls (signal, setpgid,
    // getpid, tcsetpgrp) and allocates nothing. SIGTTOU is ignored while the child, not yet
    // the foreground, takes the terminal (which would stop it otherwise), then set back to its
    // default, since an ignored signal stays ignored across `exec`.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::setpgid(0, 0);
            libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid());
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            Ok(())
        });
    }
    JobGroup::Foreground
}

/// Where [`in_a_job_of_its_own`] runs a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobGroup {
    /// A group of its own, the terminal's foreground while it runs.
    Foreground,
    /// A group of its own (no terminal).
    Own,
    /// This process's group (in the background of a shell).
    Shared,
}

impl JobGroup {
    /// Whether the command's group is its own (ended whole after it).
    pub fn is_its_own(self) -> bool {
        self != JobGroup::Shared
    }
}

/// Makes this process's group the foreground of the terminal on its stdin again, after a job
/// [`in_a_job_of_its_own`] gave it to exited (or failed to start). Does nothing without a
/// terminal.
pub fn take_terminal_back() {
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return;
    }
    give_terminal(nix::unistd::getpgrp().as_raw());
}

/// Makes `pgid` the foreground of the terminal on stdin, from the foreground or the
/// background alike.
#[expect(unsafe_code)] // `signal` is unsafe: it may install a handler; here it only ignores.
fn give_terminal(pgid: i32) {
    // SAFETY: SIG_IGN installs no handler; the previous disposition is put back as it was.
    // Setting the foreground from the background would stop this process on SIGTTOU otherwise.
    unsafe {
        let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(libc::STDIN_FILENO, pgid);
        libc::signal(libc::SIGTTOU, previous);
    }
}

/// Waits until `child`, run in the terminal's foreground by [`in_a_job_of_its_own`], exited,
/// leaving it to be reaped. Stopped (Ctrl-Z), it is passed on as a shell does: this process
/// takes the terminal back and stops too, so that its shell has the terminal and says the job
/// stopped; continued in the foreground (`fg`), it gives the terminal to the command again and
/// continues it; continued in the background (`bg`), it continues it without the terminal
/// (reading the terminal stops it again, and this process with it).
#[expect(unsafe_code)] // `tcgetpgrp` is a plain system call on an fd and no memory.
pub fn wait_in_the_foreground(child: &std::process::Child) {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WSTOPPED | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(Pid::from_raw(pid)), flags) {
            Err(nix::errno::Errno::EINTR) => {}
            Ok(WaitStatus::Stopped(..)) => {
                // SAFETY: no memory is passed; it only reads the terminal's state.
                if unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) } == pid {
                    take_terminal_back();
                }
                let _ = nix::sys::signal::raise(Signal::SIGTSTP);
                // Continued: the command goes on, with the terminal when this has it.
                if owns_the_terminal() {
                    give_terminal(pid);
                }
                let _ = killpg(Pid::from_raw(pid), Signal::SIGCONT);
            }
            _ => return,
        }
    }
}

/// Whether stdin is a terminal whose foreground is this process's group (not a job in the
/// background of a shell, whose terminal is not its to give).
#[expect(unsafe_code)] // `tcgetpgrp` and `getpgrp` are plain system calls on an fd and no memory.
fn owns_the_terminal() -> bool {
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return false;
    }
    // SAFETY: no memory is passed; both only read this process's state.
    unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp() }
}

/// [`die_with_daemon`], then spawns `command` from the spawner thread. Blocking (for the
/// length of a fork and exec).
pub fn spawn_tied(mut command: Command) -> io::Result<std::process::Child> {
    die_with_daemon(&mut command);
    let (tx, rx) = mpsc::channel();
    submit(Box::new(move || {
        let _ = tx.send(command.spawn());
    }))?;
    rx.recv()
        .map_err(|_| io::Error::other("the spawner thread dropped a job"))?
}

fn submit(job: Job) -> io::Result<()> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("drover-spawner".to_string())
            .spawn(move || {
                for job in rx {
                    // A panicking job must not end the thread (and with it every child).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the spawner thread");
        }
        Mutex::new(tx)
    });
    spawner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(job)
        .map_err(|_| io::Error::other("the spawner thread is not running"))
}

/// Sends `signal` to the process group `pgid` (`None` only checks that it exists). Never to
/// group 0 or 1 (ours, init's). Whether the group exists.
pub fn signal_group(pgid: u32, signal: Option<Signal>) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), signal).is_ok(),
        _ => false,
    }
}

/// Describes an exit status for people: `exit status 3`, `signal 9 (SIGKILL)`.
pub fn describe_exit(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(sig) = status.signal() {
        match Signal::try_from(sig) {
            Ok(s) => format!("signal {sig} ({})", s.as_str()),
            Err(_) => format!("signal {sig}"),
        }
    } else {
        status.to_string()
    }
}

/// The end of what a child wrote: its last `limit` bytes, shared by the threads or tasks that
/// read its pipes and whoever reports on it.
#[derive(Debug, Clone)]
pub struct OutputTail(Arc<Mutex<TailBuf>>);

#[derive(Debug)]
struct TailBuf {
    bytes: VecDeque<u8>,
    limit: usize,
    /// Earlier output was dropped.
    cut: bool,
    /// The kept bytes start inside a line (what came before them did not end with a newline).
    mid_line: bool,
}

impl OutputTail {
    pub fn new(limit: usize) -> OutputTail {
        OutputTail(Arc::new(Mutex::new(TailBuf {
            bytes: VecDeque::new(),
            limit,
            cut: false,
            mid_line: false,
        })))
    }

    /// Adds output as it came.
    pub fn push(&self, chunk: &[u8]) {
        let mut tail = self.buf();
        tail.bytes.extend(chunk);
        if tail.bytes.len() > tail.limit {
            let excess = tail.bytes.len() - tail.limit;
            tail.mid_line = tail.bytes.get(excess - 1) != Some(&b'\n');
            tail.bytes.drain(..excess);
            tail.cut = true;
        }
    }

    /// Adds one line (without its newline), cut to `max` bytes at a character boundary and
    /// marked `…` when longer.
    pub fn push_line(&self, line: &str, max: usize) {
        let mut kept = line;
        if kept.len() > max {
            let mut cut = max;
            while !kept.is_char_boundary(cut) {
                cut -= 1;
            }
            kept = &kept[..cut];
        }
        let mut bytes = Vec::with_capacity(kept.len() + 4);
        bytes.extend_from_slice(kept.as_bytes());
        if kept.len() < line.len() {
            bytes.extend_from_slice("…".as_bytes());
        }
        bytes.push(b'\n');
        self.push(&bytes);
    }

    /// Everything kept, preceded by a note when earlier output was cut.
    pub fn text(&self) -> String {
        let tail = self.buf();
        let (a, b) = tail.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if tail.cut {
            format!("[… earlier output cut …]\n{text}")
        } else {
            text
        }
    }

    /// The last `n` whole lines, oldest first, without their newlines (a line whose start was
    /// cut is left out).
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let tail = self.buf();
        let (a, b) = tail.bytes.as_slices();
        let bytes = [a, b].concat();
        let text = String::from_utf8_lossy(&bytes);
        let mut lines: Vec<&str> = text.split_terminator('\n').collect();
        if tail.mid_line && !lines.is_empty() {
            lines.remove(0);
        }
        let skip = lines.len().saturating_sub(n);
        lines[skip..].iter().map(|l| (*l).to_string()).collect()
    }

    fn buf(&self) -> std::sync::MutexGuard<'_, TailBuf> {
        // Poisoning: a push either finished or did not start changing the buffer.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How a command [`run`] to its end went.
#[derive(Debug)]
pub struct Finished {
    /// `None` when it was killed at the deadline or could not be waited for.
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    /// stdout and stderr as they came, the last `limit` bytes.
    pub output: String,
}

/// Runs `command` (made by [`command`]) to its end, its stdout and stderr into one tail of
/// `limit` bytes. When `deadline` passes its whole process group is killed. Blocking. An error
/// is a failure to start it.
///
/// A thread waits for the child, and this one waits on that thread with a timeout: no polling,
/// and no process-wide SIGCHLD handler such as `wait-timeout` installs, which a daemon whose
/// tokio runtime reaps its agents by SIGCHLD should not have.
pub fn run(command: Command, deadline: Instant, limit: usize) -> io::Result<Finished> {
    let mut child = spawn_tied(command)?;
    let tail = OutputTail::new(limit);
    let (done_tx, done_rx) = mpsc::channel();
    let mut readers = 0;
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    for mut stream in streams.into_iter().flatten() {
        let tail = tail.clone();
        let done = done_tx.clone();
        readers += 1;
        // Detached: a background process the command started may hold the pipe open; the
        // thread ends when it closes it.
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.push(&buf[..n]);
            }
            let _ = done.send(());
        });
    }
    drop(done_tx);

    let pid = child.id();
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let mut timed_out = false;
    let waited = match exit_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(waited) => waited,
        Err(RecvTimeoutError::Timeout) => {
            if let Ok(waited) = exit_rx.try_recv() {
                // It ended just as time ran out.
                waited
            } else {
                timed_out = true;
                signal_group(pid, Some(Signal::SIGKILL));
                let _ = exit_rx.recv();
                Err(io::Error::new(io::ErrorKind::TimedOut, "ran out of time"))
            }
        }
        Err(RecvTimeoutError::Disconnected) => Err(io::Error::other("the waiting thread died")),
    };
    let status = match waited {
        Ok(status) => Some(status),
        Err(_) if timed_out => None,
        Err(e) => {
            tail.push(format!("cannot wait for the command: {e}\n").as_bytes());
            signal_group(pid, Some(Signal::SIGKILL));
            None
        }
    };
    // The output is complete once both pipes closed; a process left in the background may
    // keep one open, so wait only briefly.
    let grace = Instant::now() + Duration::from_millis(200);
    for _ in 0..readers {
        if done_rx
            .recv_timeout(grace.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }
    Ok(Finished {
        status,
        timed_out,
        output: tail.text(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_end_and_says_it_cut() {
        let tail = OutputTail::new(8);
        tail.push(b"0123");
        assert_eq!(tail.text(), "0123");
        tail.push(b"456789\nab");
        assert_eq!(tail.text(), "[… earlier output cut …]\n56789\nab");
        assert_eq!(tail.last_lines(5), ["ab"]);
    }

    #[test]
    fn lines_are_cut_to_their_limit_and_only_whole_ones_are_listed() {
        let tail = OutputTail::new(3 * 6);
        tail.push_line("héllo wörld", 5);
        assert_eq!(tail.last_lines(9), ["héll…"]);
        for line in ["a", "", "b", "c", "d", "e", "f"] {
            tail.push_line(line, 5);
        }
        assert_eq!(tail.last_lines(3), ["d", "e", "f"]);
        assert_eq!(tail.last_lines(100), ["a", "", "b", "c", "d", "e", "f"]);
    }

    #[test]
    fn exits_are_described_by_code_or_signal() {
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(3 << 8)),
            "exit status 3"
        );
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(9)),
            "signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn a_tied_child_outlives_the_thread_that_asked_for_it() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().to_path_buf();
        // Forked on a thread that then ends: the kernel kills this one (the hazard)...
        let (control, tied) = std::thread::spawn(move || {
            let mut control = command("sleep", &path);
            control.arg("30");
            die_with_daemon(&mut control);
            let control = control.spawn().expect("spawn the control");
            let mut tied = command("sleep", &path);
            tied.arg("30");
            (control, spawn_tied(tied).expect("spawn tied"))
        })
        .join()
        .expect("thread");
        let (mut control, mut tied) = (control, tied);
        let status = control.wait().expect("wait for the control");
        assert_eq!(describe_exit(&status), "signal 9 (SIGKILL)");
        // ...while the one forked by the spawner thread lives on.
        assert!(
            tied.try_wait().expect("poll").is_none(),
            "the tied child died"
        );
        tied.kill().expect("kill");
        let _ = tied.wait();
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_with_its_group() {
        let dir = tempfile::tempdir().expect("dir");
        let mut cmd = command("sh", dir.path());
        cmd.arg("-c").arg("echo started; sleep 30 & sleep 30");
        let started = Instant::now();
        let finished = run(cmd, Instant::now() + Duration::from_millis(300), 1024).expect("run");
        assert!(
            finished.timed_out && finished.status.is_none(),
            "{finished:?}"
        );
        assert!(finished.output.contains("started"), "{finished:?}");
        assert!(started.elapsed() < Duration::from_secs(10));

        let mut cmd = command("sh", dir.path());
        cmd.arg("-c").arg("echo out; echo err >&2; exit 4");
        let finished = run(cmd, Instant::now() + Duration::from_secs(30), 1024).expect("run");
        assert_eq!(finished.status.and_then(|s| s.code()), Some(4));
        assert!(!finished.timed_out);
        assert!(finished.output.contains("out") && finished.output.contains("err"));
    }
}
