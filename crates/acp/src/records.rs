//! `$DROVER_HOME/runtimes/<agent>.json`: one record per live agent process (pid, process
//! group, the kernel's start time of the process), written when it starts and removed once its
//! processes ended, and the boot reconcile that ends whatever a daemon killed by a signal left
//! behind, before any runtime starts, without ever touching a process that reused a pid.
//!
//! The direct child dies with the daemon (`core::child::die_with_daemon`), and the daemon's
//! guard (`core::guard`) ends what it started; this sweep is for what neither reached (a
//! guard killed with its daemon, a daemon without one). At boot a recorded group is ours when its leader is alive with the recorded start
//! time, or when the leader is gone but the group still has members (Linux never gives a new
//! process a pid that is still the id of a live group). Tools in groups of their own are found
//! by the `DROVER_AGENT_ID` marker of an agent of this home.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_core::AgentId;
use drover_core::procfs::{self, Stat};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// The folder of the records under `$DROVER_HOME`.
pub const DIR: &str = "runtimes";

/// How long boot waits for the leftovers it killed to be gone.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// One live agent process, as the next boot needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeRecord {
    pub version: u32,
    pub agent_id: String,
    pub pid: u32,
    pub pgid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks after boot): with the pid, names the
    /// process uniquely.
    pub start_time: u64,
    /// The daemon that started it.
    pub daemon_pid: u32,
    /// The `DROVER_AGENT_ID` its processes carry when it is not `agent_id`: a warm spare's own
    /// (see `crate::warm`), which the agent that took the spare keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
}

impl RuntimeRecord {
    /// The record of the live process `pid` (its own group leader); `None` if it is gone.
    pub fn of(agent: AgentId, pid: u32) -> Option<RuntimeRecord> {
        let stat = Stat::read(pid)?;
        Some(RuntimeRecord {
            version: 1,
            agent_id: agent.to_string(),
            pid,
            pgid: stat.pgid,
            start_time: stat.start_time,
            daemon_pid: std::process::id(),
            marker: None,
        })
    }
}

fn path(home: &Path, agent: &str) -> PathBuf {
    home.join(DIR).join(format!("{agent}.json"))
}

/// Writes the record (temporary file and rename; no fsync: a machine that loses its page cache
/// lost its processes too).
pub fn write(home: &Path, record: &RuntimeRecord) -> io::Result<()> {
    let dir = home.join(DIR);
    drover_core::private::create_dir_all(&dir)?;
    let target = path(home, &record.agent_id);
    let temp = dir.join(format!(".{}.tmp", record.agent_id));
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    drover_core::private::open_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temp)
        .and_then(|mut f| io::Write::write_all(&mut f, &bytes))?;
    std::fs::rename(&temp, &target)
}

/// Removes the agent's record (its processes have ended).
pub fn remove(home: &Path, agent: AgentId) {
    remove_named(home, &agent.to_string());
}

/// Removes the record named `name` (an agent's id, or a warm spare's).
pub(crate) fn remove_named(home: &Path, agent: &str) {
    match std::fs::remove_file(path(home, agent)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(%agent, error = %e, "cannot remove the runtime record"),
    }
}

/// The value of `DROVER_AGENT_ID` in the process's environment, if it has one we can read.
fn marker(pid: u32) -> Option<String> {
    procfs::environ_var(pid, "DROVER_AGENT_ID")
}

/// What the boot reconcile found and ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Records left by a daemon that did not stop its runtimes.
    pub records: usize,
    /// Processes ended: (pid, the agent whose marker or group it had).
    pub killed: Vec<(u32, String)>,
    /// Recorded pids now held by an unrelated process, left alone.
    pub reused: Vec<u32>,
}

/// Ends every process a previous daemon of `home` left running: the recorded groups that are
/// still ours, and every process carrying the marker of one of `agents` (or of a record). Then
/// waits (at most 5 s) for them to be gone and removes the records. Blocking; call it before
/// any runtime of `home` can start.
pub fn reconcile(home: &Path, agents: &[String]) -> Reconciled {
    let mut report = Reconciled::default();
    let mut records = Vec::new();
    if let Ok(dir) = std::fs::read_dir(home.join(DIR)) {
        for entry in dir.flatten() {
            let file = entry.path();
            let parsed = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<RuntimeRecord>(&b).ok());
            if let Some(record) = parsed {
                records.push(record);
            } else {
                tracing::warn!(path = %file.display(), "ignoring a damaged runtime record");
            }
            let _ = std::fs::remove_file(&file);
        }
    }
    report.records = records.len();
    let table = procfs::processes();
    let mut groups: Vec<(u32, String)> = Vec::new();
    for record in &records {
        match table.iter().find(|(pid, _)| *pid == record.pid) {
            Some((_, stat)) if stat.start_time == record.start_time => {
                groups.push((record.pgid, record.agent_id.clone()));
            }
            Some(_) => report.reused.push(record.pid),
            // The leader is gone; members left in its group are its own children.
            None => {
                if table.iter().any(|(_, s)| s.pgid == record.pgid) {
                    groups.push((record.pgid, record.agent_id.clone()));
                }
            }
        }
    }
    let own_group = nix::unistd::getpgrp().as_raw().cast_unsigned();
    let markers: HashSet<&str> = agents
        .iter()
        .map(String::as_str)
        .chain(records.iter().map(|r| r.agent_id.as_str()))
        .chain(records.iter().filter_map(|r| r.marker.as_deref()))
        .collect();
    for (pid, stat) in &table {
        let owner = groups
            .iter()
            .find(|(pgid, _)| *pgid == stat.pgid && *pgid != own_group)
            .map(|(_, agent)| agent.clone())
            .or_else(|| marker(*pid).filter(|m| markers.contains(m.as_str())));
        if let Some(agent) = owner {
            report.killed.push((*pid, agent));
        }
    }
    for (pgid, _) in &groups {
        if let Ok(raw) = i32::try_from(*pgid)
            && raw > 1
            && *pgid != own_group
        {
            let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
    for (pid, agent) in &report.killed {
        if let Ok(raw) = i32::try_from(*pid)
            && raw > 1
        {
            tracing::warn!(pid, %agent, "ending a process a previous daemon left running");
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
    // SIGKILL is not instant: wait until they are gone (or zombies of a parent that is not
    // ours), so that nothing of the old runtime overlaps a new one.
    let deadline = Instant::now() + REAP_WAIT;
    while Instant::now() < deadline
        && report
            .killed
            .iter()
            .any(|(pid, _)| Stat::read(*pid).is_some_and(|s| !s.zombie))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    report
}
