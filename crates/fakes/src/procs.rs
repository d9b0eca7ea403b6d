//! The process table as Linux's `/proc` shows it: the one reader the tests, the harnesses and
//! the ACP client use to find an agent's processes (by the `DROVER_AGENT_ID` drover puts in
//! every agent's environment, by command line, by process group or parentage) and to tell
//! whether they are gone.

use std::path::PathBuf;

/// One process, as `/proc/PID/stat` shows it; the other files are read on demand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    /// The state letter: `R`, `S`, `D`, `Z` (zombie), `X` (dead) …
    pub state: String,
}

impl Process {
    /// This process as `/proc` shows it now, if it exists.
    pub fn read(pid: i32) -> Option<Process> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.to_string();
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        Some(Process {
            pid,
            ppid,
            pgrp,
            state,
        })
    }

    /// A zombie (exited, waiting for its reaper) or dead process runs nothing.
    pub fn zombie(&self) -> bool {
        self.state == "Z" || self.state == "X"
    }

    /// The arguments, `argv[0]` first (empty for a zombie or a kernel thread).
    pub fn argv(&self) -> Vec<String> {
        let raw = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        String::from_utf8_lossy(&raw)
            .split('\0')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The command line, its NUL separators turned into spaces.
    pub fn command_line(&self) -> String {
        let raw = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        String::from_utf8_lossy(&raw).replace('\0', " ")
    }

    /// The working directory, when this user may read it.
    pub fn cwd(&self) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/{}/cwd", self.pid)).ok()
    }

    /// The value of `name` in the environment (the process's initial one), if readable.
    pub fn env(&self, name: &str) -> Option<String> {
        let env = std::fs::read(format!("/proc/{}/environ", self.pid)).ok()?;
        let prefix = format!("{name}=");
        env.split(|b| *b == 0).find_map(|var| {
            var.strip_prefix(prefix.as_bytes())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
    }

    /// Whether the environment holds exactly `NAME=value` (the process's initial environment,
    /// which is what `/proc` keeps).
    pub fn has_env(&self, name: &str, value: &str) -> bool {
        let needle = format!("{name}={value}\0").into_bytes();
        let Ok(env) = std::fs::read(format!("/proc/{}/environ", self.pid)) else {
            return false;
        };
        // The first entry has no NUL before it; the others do.
        env.starts_with(&needle)
            || env
                .windows(needle.len() + 1)
                .any(|w| w[0] == 0 && w[1..] == needle[..])
    }
}

/// Every process on the machine, zombies included.
pub fn all() -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(Process::read)
        .collect()
}

/// Every live (not zombie) process.
pub fn live() -> Vec<Process> {
    all().into_iter().filter(|p| !p.zombie()).collect()
}

/// Live processes started for agent `agent`: drover puts `DROVER_AGENT_ID` in every agent's
/// environment, and the agent's tools inherit it.
pub fn of_agent(agent: &str) -> Vec<Process> {
    live()
        .into_iter()
        .filter(|p| p.has_env("DROVER_AGENT_ID", agent))
        .collect()
}

/// Live processes started by the daemon whose pid is `daemon`, at any depth: drover marks
/// everything it starts with `DROVER_DAEMON_RUN=<daemon pid>-<token>`, and what they start
/// inherits it.
pub fn of_daemon(daemon: u32) -> Vec<Process> {
    let prefix = format!("{daemon}-");
    live()
        .into_iter()
        .filter(|p| {
            p.env("DROVER_DAEMON_RUN")
                .is_some_and(|v| v.starts_with(&prefix))
        })
        .collect()
}

/// Whether no live process is left in process group `pgid`.
pub fn group_gone(pgid: i32) -> bool {
    !live().iter().any(|p| p.pgrp == pgid)
}

/// The live processes of the tree that `leader` started: its process group, and every
/// descendant of the leader whatever its group (agents start tool commands in groups of their
/// own).
pub fn tree(leader: i32) -> Vec<Process> {
    let all = all();
    let mut tree: Vec<Process> = Vec::new();
    loop {
        let before = tree.len();
        for p in &all {
            let inside =
                p.pid == leader || p.pgrp == leader || tree.iter().any(|t| t.pid == p.ppid);
            if inside && !tree.iter().any(|t| t.pid == p.pid) {
                tree.push(p.clone());
            }
        }
        if tree.len() == before {
            return tree.into_iter().filter(|p| !p.zombie()).collect();
        }
    }
}

/// This process's group.
pub fn own_group() -> Option<i32> {
    Process::read(i32::try_from(std::process::id()).ok()?).map(|p| p.pgrp)
}
