//! The one way an agent process starts: explicit cwd and environment, its own process group,
//! stderr drained into a bounded buffer, and the whole group ended on close or drop.
//!
//! The process group, the output tail and the exit description are drover-core's `child`
//! helpers, shared with a worktree's setup and teardown; what is an agent's own is here: the
//! environment allowlist, async pipes, and finding every process an agent started.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use drover_core::child::{self, OutputTail, signal_group};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, watch};

use crate::rpc::{self, Incoming, RpcClient};

pub use drover_core::child::describe_exit;

/// How many stderr lines are kept, and how long each may be.
const STDERR_LINES: usize = 50;
const STDERR_LINE_BYTES: usize = 2_000;
/// Bytes that hold the last `STDERR_LINES` lines however long they are: each is cut to
/// `STDERR_LINE_BYTES`, plus `…` and its newline.
const STDERR_TAIL_BYTES: usize = STDERR_LINES * (STDERR_LINE_BYTES + '…'.len_utf8() + 1);

/// Variables an agent inherits from the daemon's environment; everything else comes from the
/// provider's own configuration.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
];

/// Set once by [`set_inherited_env`]: what agents and jobs inherit instead of the daemon's
/// environment.
static INHERITED: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();

/// What every agent and job inherits before its own variables: [`ENV_ALLOWLIST`] from the
/// daemon's environment, or what [`set_inherited_env`] set. Its `PATH` is also where providers'
/// programs are looked for.
pub fn inherited_env() -> BTreeMap<String, String> {
    if let Some(env) = INHERITED.get() {
        return env.clone();
    }
    ENV_ALLOWLIST
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_string(), v)))
        .collect()
}

/// Makes `env` what agents and jobs of this process inherit, in place of the daemon's own
/// environment: for an embedding, and for tests that must not depend on what the machine has
/// installed (`PATH`) or on the user's `HOME`. The first call wins (the process environment is
/// one for the whole process too); `false` when one came before.
pub fn set_inherited_env(env: BTreeMap<String, String>) -> bool {
    INHERITED.set(env).is_ok()
}

#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// The complete environment of the process.
    pub env: BTreeMap<String, String>,
}

/// The last lines an agent wrote to stderr, and whether its reader has taken them all.
#[derive(Debug, Clone)]
pub struct StderrTail {
    lines: OutputTail,
    /// Becomes `true` once stderr is closed and every line is in `lines`.
    closed: watch::Receiver<bool>,
}

impl StderrTail {
    /// An empty tail, and the sender that tells it its reader is done.
    fn new() -> (StderrTail, watch::Sender<bool>) {
        let (done, closed) = watch::channel(false);
        let tail = StderrTail {
            lines: OutputTail::new(STDERR_TAIL_BYTES),
            closed,
        };
        (tail, done)
    }

    fn push(&self, line: &str) {
        self.lines.push_line(line, STDERR_LINE_BYTES);
    }

    /// The last `n` lines (at most 50), oldest first.
    pub fn last(&self, n: usize) -> Vec<String> {
        self.lines.last_lines(n.min(STDERR_LINES))
    }

    /// The last `n` lines of a process that exited, once the reader has taken them all (or
    /// after 1 s): the exit can be seen before its last words are read, and a failure must
    /// read the same whichever comes first.
    pub async fn last_words(&self, n: usize) -> Vec<String> {
        let mut closed = self.closed.clone();
        let _ = tokio::time::timeout(Duration::from_secs(1), closed.wait_for(|c| *c)).await;
        self.last(n)
    }
}

/// A running agent process as the daemon watches it: its pid, its stderr, its exit and its
/// cgroup.
#[derive(Debug)]
pub struct Running {
    pub pid: u32,
    pub stderr: StderrTail,
    /// Becomes `Some(status)` when the process (the group's leader) exits.
    pub exited: watch::Receiver<Option<ExitStatus>>,
    /// Its leaf cgroup where the daemon has them (see `drover_core::guard`), read while it
    /// runs: after it ended the cgroup still holds what it started.
    pub cgroup: Option<std::path::PathBuf>,
}

/// A running agent process with its stdin and stdout.
#[derive(Debug)]
pub struct AgentProcess {
    pub running: Running,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// An agent process with its ACP connection open on its stdio.
#[derive(Debug)]
pub struct Connected {
    pub running: Running,
    pub rpc: RpcClient,
    /// What the agent sends that is not an answer (requests, notifications, the close).
    pub incoming: mpsc::Receiver<Incoming>,
}

/// Starts the process ([`spawn`]) and opens the ACP connection on its stdin and stdout.
pub async fn spawn_connected(spec: &SpawnSpec) -> Result<Connected, SpawnError> {
    let AgentProcess {
        running,
        stdin,
        stdout,
    } = spawn(spec).await?;
    let (rpc, incoming) = rpc::connect(stdout, stdin);
    Ok(Connected {
        running,
        rpc,
        incoming,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start `{program}` in `{cwd}`: {source}")]
pub struct SpawnError {
    pub program: String,
    pub cwd: String,
    #[source]
    pub source: std::io::Error,
}

/// Starts the process in a new process group (and, where it can, a cgroup) of its own, killed
/// by the kernel if the daemon dies (forked from `core::child`'s spawner thread, see
/// `child::on_spawner`); what it starts is ended by the daemon's guard (`core::guard`).
pub async fn spawn(spec: &SpawnSpec) -> Result<AgentProcess, SpawnError> {
    let mut std_command = child::command(&spec.program, &spec.cwd);
    std_command
        .args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .stdin(Stdio::piped());
    // After the environment: it adds the daemon's marker.
    child::die_with_daemon(&mut std_command);
    let mut command = Command::from(std_command);
    command.kill_on_drop(true);
    let runtime = tokio::runtime::Handle::current();
    let spawned = child::on_spawner(move || {
        // tokio's reaper belongs to the daemon's runtime, whichever thread forks.
        let _entered = runtime.enter();
        command.spawn()
    })
    .await;
    let mut child = spawned.and_then(|r| r).map_err(|source| SpawnError {
        program: spec.program.display().to_string(),
        cwd: spec.cwd.display().to_string(),
        source,
    })?;
    let pid = child.id().unwrap_or_default();
    let io_missing = || SpawnError {
        program: spec.program.display().to_string(),
        cwd: spec.cwd.display().to_string(),
        source: std::io::Error::other("stdio was not captured"),
    };
    let stdin = child.stdin.take().ok_or_else(io_missing)?;
    let stdout = child.stdout.take().ok_or_else(io_missing)?;
    let stderr_pipe = child.stderr.take().ok_or_else(io_missing)?;

    let (stderr, stderr_done) = StderrTail::new();
    let tail = stderr.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr_pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(pid, %line, "agent stderr");
            tail.push(&line);
        }
        let _ = stderr_done.send(true);
    });

    let cgroup = drover_core::guard::cgroup_of(pid);
    let (exit_tx, exited) = watch::channel(None);
    tokio::spawn(wait_child(child, exit_tx));
    Ok(AgentProcess {
        running: Running {
            pid,
            stderr,
            exited,
            cgroup,
        },
        stdin,
        stdout,
    })
}

async fn wait_child(mut child: Child, exit_tx: watch::Sender<Option<ExitStatus>>) {
    let status = child.wait().await;
    match status {
        Ok(status) => {
            let _ = exit_tx.send(Some(status));
        }
        Err(e) => tracing::warn!(error = %e, "cannot wait for an agent process"),
    }
}

/// Ends everything an agent started: its process group, its cgroup where it has one, and
/// every process that is not in them but descends from it or carries its
/// `DROVER_AGENT_ID=<marker>` (agents run their tools in process groups of their own, and a
/// tool outlives a crashed agent under a new parent).
/// TERM first, then KILL after `grace` (or as soon as the leader is gone).
pub async fn terminate_group(
    pid: u32,
    marker: Option<&str>,
    cgroup: Option<&Path>,
    exited: &mut watch::Receiver<Option<ExitStatus>>,
    grace: Duration,
) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 0 {
        return;
    }
    let mut targets = group_targets(pid, marker);
    signal_all(pid, &targets, Signal::SIGTERM);
    let _ = tokio::time::timeout(grace, exited.wait_for(Option::is_some)).await;
    // Whoever was started meanwhile, or outlived the leader, goes too.
    for found in group_targets(pid, marker) {
        if !targets.contains(&found) {
            targets.push(found);
        }
    }
    // Its cgroup holds everything the agent started, whatever its group, parent or environment.
    if let Some(cgroup) = cgroup {
        drover_core::guard::kill_cgroup(cgroup);
    }
    signal_all(pid, &targets, Signal::SIGKILL);
}

/// Sends KILL at once to everything [`terminate_group`] would end (for paths that cannot wait:
/// the leader already exited).
pub fn kill_group_now(pid: u32, marker: Option<&str>, cgroup: Option<&Path>) {
    let targets = group_targets(pid, marker);
    if let Some(cgroup) = cgroup {
        drover_core::guard::kill_cgroup(cgroup);
    }
    signal_all(pid, &targets, Signal::SIGKILL);
}

/// (pid, pgid) of every process of the agent's tree.
fn group_targets(pid: u32, marker: Option<&str>) -> Vec<(u32, u32)> {
    agent_processes(pid, marker)
        .into_iter()
        .map(|p| (p.pid, p.pgid))
        .collect()
}

fn signal_all(leader: u32, targets: &[(u32, u32)], signal: Signal) {
    let mut groups: Vec<u32> = vec![leader];
    for (_, pgid) in targets {
        // Never the daemon's own group (an agent that did not get a group of its own).
        if !groups.contains(pgid) && *pgid != std::process::id() && is_foreign_group(*pgid) {
            groups.push(*pgid);
        }
    }
    for group in groups {
        signal_group(group, Some(signal));
    }
    for (pid, _) in targets {
        if let Ok(raw) = i32::try_from(*pid)
            && raw > 1
            && *pid != std::process::id()
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(raw), signal);
        }
    }
}

/// Whether `pgid` is not the daemon's own process group.
fn is_foreign_group(pgid: u32) -> bool {
    let own = nix::unistd::getpgrp().as_raw();
    i32::try_from(pgid).is_ok_and(|g| g != own && g > 1)
}

/// One process of an agent's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TreeProcess {
    pub pid: u32,
    pub pgid: u32,
    /// When it started (clock ticks after boot): with the pid, it names this process and no
    /// later one that reuses the pid.
    pub start_time: u64,
}

/// Every live process that descends from `leader` or carries the agent's marker in its
/// environment, `leader` included. Reads `/proc`.
fn agent_processes(leader: u32, marker: Option<&str>) -> Vec<TreeProcess> {
    let marker_matches = |pid: u32| {
        marker.is_some_and(|m| {
            drover_core::procfs::environ_var(pid, "DROVER_AGENT_ID").as_deref() == Some(m)
        })
    };
    let table = drover_core::procfs::processes();
    let mut found: Vec<u32> = vec![leader];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for (pid, stat) in &table {
            if stat.ppid == parent && !found.contains(pid) {
                found.push(*pid);
            }
        }
        i += 1;
    }
    table
        .iter()
        .filter(|(pid, _)| found.contains(pid) || marker_matches(*pid))
        .map(|(pid, stat)| TreeProcess {
            pid: *pid,
            pgid: stat.pgid,
            start_time: stat.start_time,
        })
        .collect()
}

/// The processes that are the agent itself, taken when its ACP session is ready: the
/// agent's process, and what its tree holds then (a launcher's worker, the MCP servers and
/// the engine it starts with its session), plus what holds its ACP pipes.
#[derive(Debug, Clone, Default)]
pub struct OwnProcesses {
    processes: HashSet<(u32, u64)>,
    /// The targets of the agent process's stdin and stdout links (`pipe:[…]`).
    pipes: Vec<PathBuf>,
}

/// Reads what the agent's tree holds now, as the agent's own processes. Reads `/proc`.
pub fn own_processes(leader: u32, marker: Option<&str>) -> OwnProcesses {
    let processes = agent_processes(leader, marker)
        .into_iter()
        .map(|p| (p.pid, p.start_time))
        .collect();
    OwnProcesses {
        processes,
        pipes: stdio_links(leader),
    }
}

fn stdio_links(pid: u32) -> Vec<PathBuf> {
    (0..2)
        .filter_map(|fd| drover_core::procfs::fd_link(pid, fd))
        .filter(|link| link.to_string_lossy().starts_with("pipe:"))
        .collect()
}

/// The agent's background work: the processes of its tree (descendants, and what carries
/// its marker) that are not its own (see [`OwnProcesses`]): started after its session was
/// ready (a tool's background shell, a dev server, a build) and not holding its ACP pipes.
/// Reads `/proc`.
pub fn background_processes(leader: u32, marker: Option<&str>, own: &OwnProcesses) -> usize {
    agent_processes(leader, marker)
        .into_iter()
        .filter(|p| p.pid != leader && !own.processes.contains(&(p.pid, p.start_time)))
        .filter(|p| {
            !stdio_links(p.pid)
                .iter()
                .any(|link| own.pipes.contains(link))
        })
        .count()
}

/// What an agent's process tree holds now: how many processes (its group, its descendants,
/// and what carries its `DROVER_AGENT_ID=<marker>`) and their resident memory in bytes (the
/// sum of each one's `VmRSS`; pages they share are counted once per process). Reads `/proc`.
pub fn tree_memory(pid: u32, marker: Option<&str>) -> (usize, u64) {
    let processes = agent_processes(pid, marker);
    let rss = processes
        .iter()
        .filter_map(|p| drover_core::procfs::vm_rss(p.pid))
        .sum();
    (processes.len(), rss)
}

/// What the process trees of all the agent processes `leaders` hold now, read in one pass
/// over `/proc` (for `/metrics`): how many processes (each leader's group and descendants)
/// and the sum of their `VmRSS` in bytes. Unlike [`tree_memory`] it does not read every
/// process's environment for the agent's marker: a tool that left both the tree and the group
/// is not counted.
pub fn fleet_memory(leaders: &[u32]) -> (usize, u64) {
    if leaders.is_empty() {
        return (0, 0);
    }
    let table = drover_core::procfs::processes();
    let mut found: std::collections::HashSet<u32> = leaders.iter().copied().collect();
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for (pid, stat) in &table {
        children.entry(stat.ppid).or_default().push(*pid);
        if found.contains(&stat.pgid) {
            found.insert(*pid);
        }
    }
    let mut queue: Vec<u32> = found.iter().copied().collect();
    while let Some(parent) = queue.pop() {
        for child in children.get(&parent).into_iter().flatten() {
            if found.insert(*child) {
                queue.push(*child);
            }
        }
    }
    let rss = found
        .iter()
        .filter_map(|pid| drover_core::procfs::vm_rss(*pid))
        .sum();
    let alive = table.iter().filter(|(pid, _)| found.contains(pid)).count();
    (alive, rss)
}

/// Whether any process of the group led by `pid` is still alive.
pub fn group_alive(pid: u32) -> bool {
    signal_group(pid, None)
}
