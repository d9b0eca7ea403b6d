//! The guard: what ends every process drover started, at any depth, when the daemon dies by
//! any signal, without waiting for the next boot.
//!
//! `PR_SET_PDEATHSIG` (`child::die_with_daemon`) kills only the direct child. The agents users
//! install are wrappers (a Node launcher that starts the native agent, a Node agent that
//! starts `claude`), tools run in process groups and sessions of their own, and a job's shell
//! starts grandchildren: none of those get the signal. So every process drover starts is also
//!
//! - marked: its environment carries `DROVER_DAEMON_RUN=<token>`, a token new at each daemon
//!   start, which everything it starts inherits;
//! - and, where the machine allows it and a guard runs, placed in a cgroup v2 of its own below
//!   `<the daemon's cgroup>/drover-<daemon pid>` (by the child itself, between fork and exec,
//!   so nothing it starts escapes in a gap). A cgroup holds every descendant whatever its
//!   process group, session or parent, and `cgroup.kill` ends them all at once.
//!
//! The guard is a second process per daemon: the daemon's own binary run again with
//! [`GUARD_ARG`] (the binary opts in by calling [`serve_if_asked`] first thing in `main`). Its
//! stdin is a pipe whose only writer is the daemon; the kernel closes it when the daemon dies,
//! however it dies, and at that end of file the guard kills the daemon's cgroup tree and every
//! process carrying the token, until none is left, removes the cgroups, and exits. A daemon
//! that stops cleanly closes the pipe too, after it stopped its agents: the guard then finds
//! nothing, or the stragglers. A process that ended what it started itself and means the rest
//! to live on (`drover login`, whose agent's sign-in may have opened the user's browser)
//! disarms its guard first ([`Guard::disarm`]): the guard exits without sweeping.
//!
//! Where cgroups are not writable (or `DROVER_NO_CGROUPS=1`), the marker alone is used: a
//! process that replaces its whole environment escapes it, which is why the cgroup comes
//! first where it can.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigHandler, Signal, kill, killpg, signal};
use nix::unistd::Pid;

/// The variable that marks every process a daemon started (and what they start).
pub const RUN_VAR: &str = "DROVER_DAEMON_RUN";
/// Set to `1` to leave cgroups alone and rely on the marker only.
pub const NO_CGROUPS_VAR: &str = "DROVER_NO_CGROUPS";
/// The first argument that makes a drover binary the guard.
pub const GUARD_ARG: &str = "__drover-guard";

/// How long the guard keeps sweeping for processes that are still being started.
const SWEEP_FOR: Duration = Duration::from_secs(2);

/// Longer than any fork and exec: a leaf this young may still be waiting for its child.
const LEAF_IN_FLIGHT: Duration = Duration::from_secs(30);

/// Whether this binary can be re-run as the guard ([`serve_if_asked`] was called).
static GUARDABLE: AtomicBool = AtomicBool::new(false);

/// This daemon process's marker and cgroup, made on first use.
struct Tree {
    token: String,
    /// `<daemon's cgroup>/drover-<pid>`, when cgroups can be used.
    cgroup: Option<PathBuf>,
}

fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| Tree {
        token: format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()),
        cgroup: make_cgroup_base(),
    })
}

/// The token of this daemon's processes (the value of [`RUN_VAR`]).
pub fn token() -> &'static str {
    &tree().token
}

/// The cgroup that holds every process this daemon started, if cgroups are in use.
pub fn cgroup_base() -> Option<&'static Path> {
    tree().cgroup.as_deref()
}

/// Where this process's cgroup v2 is on disk: the `cgroup2` mount joined with the path in
/// `/proc/self/cgroup`'s `0::` line.
fn own_cgroup() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Fields: id parent major:minor root mount-point options... - fstype source options.
    let mount = mounts.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

fn make_cgroup_base() -> Option<PathBuf> {
    // The guard removes the cgroups when the daemon ends; without one (a daemon inside a test
    // binary) they would be left behind.
    if !GUARDABLE.load(Ordering::Relaxed) {
        return None;
    }
    if std::env::var_os(NO_CGROUPS_VAR).is_some_and(|v| v == "1") {
        tracing::debug!("cgroups not used ({NO_CGROUPS_VAR}=1): the marker alone ends trees");
        return None;
    }
    let Some(own) = own_cgroup() else {
        tracing::debug!("no cgroup v2 here: the marker alone ends trees");
        return None;
    };
    sweep_stale(&own);
    let base = own.join(format!("drover-{}", std::process::id()));
    match std::fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            tracing::debug!(cgroup = %base.display(), error = %e,
                "cannot make a cgroup: the marker alone ends trees");
            return None;
        }
    }
    // `cgroup.kill` is Linux 5.14; without it a cgroup cannot end its tree at once.
    if !base.join("cgroup.kill").exists() {
        tracing::debug!(cgroup = %base.display(), "no cgroup.kill: the marker alone ends trees");
        let _ = std::fs::remove_dir(&base);
        return None;
    }
    tracing::debug!(cgroup = %base.display(), "agents and jobs run in cgroups below this one");
    Some(base)
}

/// Ends and removes the cgroups of daemons that are gone and whose guard could not (it was
/// killed too): `drover-<pid>` next to ours, for a pid no process has.
fn sweep_stale(parent: &Path) {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("drover-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let stale = entry.path();
        // Said as a warning only when something was left running; an empty one is tidied.
        if populated(&stale) {
            tracing::warn!(cgroup = %stale.display(), "ending what a dead daemon left in its cgroup");
        } else {
            tracing::debug!(cgroup = %stale.display(), "removing a dead daemon's empty cgroup");
        }
        kill_cgroup(&stale);
        let deadline = Instant::now() + SWEEP_FOR;
        while populated(&stale) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        remove_empty_leaves(&stale);
        let _ = std::fs::remove_dir(&stale);
    }
}

/// A new leaf cgroup for one child, and the path of its `cgroup.procs` for the child to write
/// itself into. The empty leaves of children that ended are removed first.
pub(crate) fn new_leaf() -> Option<(PathBuf, CString)> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // The leaves made, and when: a leaf is empty until its child writes itself in, so only one
    // older than any fork and exec is removed when empty.
    static LEAVES: Mutex<Vec<(PathBuf, Instant)>> = Mutex::new(Vec::new());
    let base = cgroup_base()?;
    let leaf = base.join(format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let mut leaves = LEAVES.lock().unwrap_or_else(PoisonError::into_inner);
    leaves
        .retain(|(old, made)| made.elapsed() < LEAF_IN_FLIGHT || std::fs::remove_dir(old).is_err());
    if let Err(e) = std::fs::create_dir(&leaf) {
        tracing::debug!(cgroup = %leaf.display(), error = %e, "cannot make a child's cgroup");
        return None;
    }
    leaves.push((leaf.clone(), Instant::now()));
    drop(leaves);
    let procs = CString::new(leaf.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
    Some((leaf, procs))
}

/// Removes the cgroups below `base` that hold no process, deepest first (`rmdir` refuses the
/// others, and a cgroup with cgroups below it): a leaf can hold the cgroup of a daemon started
/// inside it (a test's daemon run by an agent or a job), with leaves of its own.
fn remove_empty_leaves(base: &Path) {
    remove_empty_below(base, 0);
}

fn remove_empty_below(base: &Path, depth: usize) {
    // Deeper than any nesting of daemons: a bound, not a limit anyone meets.
    if depth > 32 {
        return;
    }
    if let Ok(dir) = std::fs::read_dir(base) {
        for entry in dir.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_below(&entry.path(), depth + 1);
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

/// The leaf cgroup of this daemon that holds `pid`, if any.
pub fn cgroup_of(pid: u32) -> Option<PathBuf> {
    let base = cgroup_base()?;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let name = Path::new(path).file_name()?;
    let leaf = base.join(name);
    (Path::new(path).parent()?.file_name() == base.file_name()).then_some(leaf)
}

/// Kills every process in `cgroup` and below (`cgroup.kill`). Whether it was written.
pub fn kill_cgroup(cgroup: &Path) -> bool {
    use std::io::Write as _;
    // Written, never created: a folder that is no cgroup (gone, or not cgroupfs) gets no file.
    std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.kill"))
        .and_then(|mut f| f.write_all(b"1"))
        .is_ok()
}

/// The running guard of this daemon; dropping it tells the guard the daemon stopped.
#[derive(Debug)]
pub struct Guard {
    child: Option<std::process::Child>,
}

/// Starts the guard of this daemon process, when the binary can be one ([`serve_if_asked`]);
/// `None` otherwise (a daemon inside a test binary), or when it cannot start (logged).
pub fn start() -> Option<Guard> {
    if !GUARDABLE.load(Ordering::Relaxed) {
        tracing::debug!(
            "this binary cannot run a guard: trees end with the daemon only at the next boot"
        );
        return None;
    }
    let tree = tree();
    let mut command = Command::new("/proc/self/exe");
    command
        // Named as the daemon's binary in `ps`, not `/proc/self/exe`.
        .arg0(
            std::env::args_os()
                .next()
                .unwrap_or_else(|| "drover".into()),
        )
        .arg(GUARD_ARG)
        .arg(&tree.token)
        .arg(tree.cgroup.as_deref().unwrap_or(Path::new("")))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_remove(RUN_VAR)
        // Out of the daemon's group: a ^C to the terminal's group reaches the daemon only.
        .process_group(0);
    match command.spawn() {
        Ok(child) => {
            tracing::debug!(pid = child.id(), "guard started");
            Some(Guard { child: Some(child) })
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the guard: processes agents start may outlive a killed daemon");
            None
        }
    }
}

impl Guard {
    /// Tells the guard the daemon stopped and waits (on a blocking thread, up to 3 s) until it
    /// swept and exited: what an async caller does instead of dropping it, which would hold
    /// one of its runtime's workers for that long.
    pub async fn stop(self) {
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// Tells the guard to exit without sweeping, for a process that ended what it started
    /// itself and means the rest to live on (`drover login`: the browser an agent's sign-in
    /// opened is the user's). What is left in this process's cgroups moves to its own cgroup
    /// (else a later daemon's sweep of cgroups left behind would end it), and they are removed.
    /// Waits on a blocking thread.
    pub async fn disarm(mut self) {
        let child = self.child.take();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(mut child) = child {
                if let Some(mut pipe) = child.stdin.take() {
                    let _ = io::Write::write_all(&mut pipe, &[DISARM]);
                }
                wait_for_guard(&mut child);
            }
            if let Some(base) = cgroup_base() {
                release_cgroups(base);
            }
        })
        .await;
    }
}

/// What the guard reads on its pipe before the end of file to exit without sweeping.
const DISARM: u8 = b'd';

/// Waits (up to 3 s) for the guard to exit, then kills it.
fn wait_for_guard(child: &mut std::process::Child) {
    let deadline = Instant::now() + SWEEP_FOR + Duration::from_secs(1);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Moves every process in the leaves below `base` to `base`'s parent (this process's own
/// cgroup), then removes the leaves and `base`.
fn release_cgroups(base: &Path) {
    let Some(own) = base.parent() else {
        return;
    };
    if let Ok(dir) = std::fs::read_dir(base) {
        for leaf in dir
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        {
            let procs = std::fs::read_to_string(leaf.path().join("cgroup.procs"));
            for pid in procs.iter().flat_map(|p| p.lines()) {
                // One pid a write; a process that ended meanwhile is refused, and gone.
                if let Err(e) = std::fs::write(own.join("cgroup.procs"), pid) {
                    tracing::debug!(pid, error = %e, "cannot move a process out of its cgroup");
                }
            }
        }
    }
    remove_empty_leaves(base);
    let _ = std::fs::remove_dir(base);
}

impl Drop for Guard {
    /// Blocking: see [`Guard::stop`] for async callers.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The pipe's end: the guard sweeps (what is left is stragglers) and exits.
        drop(child.stdin.take());
        wait_for_guard(&mut child);
    }
}

/// Call first thing in `main` of a binary that runs the daemon: when the binary was started
/// as the guard it does the guard's work and exits; otherwise it notes that the daemon may
/// start its guard from this binary.
pub fn serve_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == GUARD_ARG) {
        let token = args.next().map(|t| t.to_string_lossy().into_owned());
        let cgroup = args.next().filter(|c| !c.is_empty()).map(PathBuf::from);
        let code = match token {
            Some(token) if !token.is_empty() => {
                watch(&token, cgroup.as_deref());
                0
            }
            _ => 2,
        };
        std::process::exit(code);
    }
    GUARDABLE.store(true, Ordering::Relaxed);
}

/// The guard: waits for its stdin's end, then ends the tree.
#[expect(unsafe_code)] // `signal` is unsafe: it may install a handler; here it only ignores.
fn watch(token: &str, cgroup: Option<&Path>) {
    // Signals meant for the daemon (a terminal's ^C or hang-up, a `kill` of every drover
    // process) must not end the guard before it did its work; its stdin's end is its signal.
    for sig in [
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGTERM,
        Signal::SIGPIPE,
    ] {
        // SAFETY: setting a signal to be ignored runs no handler code.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    // The daemon's group is never killed whole (it may hold whoever started the daemon); read
    // now, while the daemon is our parent.
    let daemon_group = nix::unistd::getpgid(Some(nix::unistd::getppid()))
        .map(Pid::as_raw)
        .unwrap_or_default();
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 256];
    let mut disarmed = false;
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => disarmed |= buf[..n].contains(&DISARM),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // Disarmed (`Guard::disarm`): what is left is meant to live on.
    if !disarmed {
        end_tree(token, cgroup, daemon_group);
    }
}

/// Kills the cgroup tree and every process carrying `token` with its process group (but never
/// group `spared`, nor the guard's own), again until a sweep finds nothing (a process may be
/// forking as it is killed), then removes the cgroups.
pub fn end_tree(token: &str, cgroup: Option<&Path>, spared: i32) {
    let needle = format!("{RUN_VAR}={token}").into_bytes();
    let deadline = Instant::now() + SWEEP_FOR;
    loop {
        if let Some(cgroup) = cgroup {
            kill_cgroup(cgroup);
        }
        let marked = marked_processes(&needle);
        for (pid, pgid) in &marked {
            // Its group too: a member may have dropped the marker (`env -i`).
            if *pgid > 1 && *pgid != spared && *pgid != nix::unistd::getpgrp().as_raw() {
                let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
            }
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let populated = cgroup.is_some_and(populated);
        if (marked.is_empty() && !populated) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(cgroup) = cgroup {
        remove_empty_leaves(cgroup);
        let _ = std::fs::remove_dir(cgroup);
    }
}

/// Whether any process is still in `cgroup` or below.
fn populated(cgroup: &Path) -> bool {
    std::fs::read_to_string(cgroup.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|l| l == "populated 1"))
}

/// (pid, pgid) of every live process but this one whose environment holds `needle`.
fn marked_processes(needle: &[u8]) -> Vec<(i32, i32)> {
    crate::procfs::processes()
        .into_iter()
        .filter(|(pid, _)| {
            crate::procfs::environ(*pid).is_some_and(|env| env.iter().any(|var| var == needle))
        })
        .filter_map(|(pid, stat)| Some((i32::try_from(pid).ok()?, i32::try_from(stat.pgid).ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stopping the guard from async code leaves the runtime's only worker free while the
    /// guard sweeps (here a stand-in that takes a second to exit).
    #[test]
    fn stopping_the_guard_holds_no_async_worker() {
        let child = Command::new("sleep")
            .arg("1")
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn");
        let guard = Guard { child: Some(child) };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let ticks = std::sync::Arc::new(AtomicU64::new(0));
        runtime.block_on(async {
            let counted = ticks.clone();
            let ticker = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            });
            let started = Instant::now();
            guard.stop().await;
            assert!(
                started.elapsed() >= Duration::from_millis(900),
                "it waited for the guard"
            );
            ticker.abort();
        });
        let ticks = ticks.load(Ordering::Relaxed);
        assert!(
            ticks >= 40,
            "the worker was held while the guard swept: {ticks} ticks"
        );
    }

    /// A dead daemon's cgroup with cgroups nested below its leaves (a daemon started inside
    /// one, with its own leaves) is removed whole; only its first level went, so the rest
    /// stayed, and every later start of any daemon warned about it again.
    #[test]
    fn a_dead_daemons_nested_cgroups_are_removed_whole() {
        let parent = tempfile::TempDir::new().expect("parent");
        // No process has this pid: above the kernel's highest pid_max.
        let stale = parent.path().join("drover-4194999");
        let nested = stale.join("c1/drover-578/c1");
        std::fs::create_dir_all(&nested).expect("nested");
        std::fs::create_dir_all(stale.join("c2")).expect("leaf");
        let live = parent.path().join(format!("drover-{}", std::process::id()));
        std::fs::create_dir_all(live.join("c1")).expect("live");
        sweep_stale(parent.path());
        assert!(!stale.exists(), "left: {}", stale.display());
        assert!(live.join("c1").exists(), "a live daemon's cgroup is kept");
    }

    #[test]
    fn the_sweep_ends_every_marked_process_whatever_its_group_or_session() {
        let token = format!("test-{}", uuid::Uuid::new_v4().simple());
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 1000 & setsid sleep 1000 & echo $!; wait"])
            .env(RUN_VAR, &token)
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn");
        let mut line = String::new();
        let mut out = shell.stdout.take().expect("stdout");
        let mut byte = [0u8; 1];
        while out.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {
            line.push(char::from(byte[0]));
        }
        let in_session: i32 = line.trim().parse().expect("the setsid pid");
        let needle = format!("{RUN_VAR}={token}").into_bytes();
        // A child in the middle of its exec may not show its environment for a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut marked = marked_processes(&needle);
        while marked.len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            marked = marked_processes(&needle);
        }
        assert!(marked.len() >= 3, "{marked:?}");
        assert!(marked.iter().any(|(pid, _)| *pid == in_session));

        end_tree(&token, None, 0);
        let status = shell.wait().expect("wait");
        assert!(status.code().is_none(), "the shell was killed: {status:?}");
        // What is left are zombies whose parent (the shell) is gone: reaped by init.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !marked_processes(&needle).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(marked_processes(&needle), Vec::new());
    }
}
