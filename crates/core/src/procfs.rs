//! The one reader of `/proc` for the processes drover looks after: a process's `stat` (parent,
//! group, start time, zombie), its environment, its standard stream links, its resident
//! memory, and the table of every live process. The guard's sweep, the agents' process trees
//! and the boot reconcile all read through here. Linux only; a process that is gone or that
//! we may not read gives `None`.

use std::path::PathBuf;

/// What one process's `/proc/<pid>/stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub pgid: u32,
    /// Field 22 (clock ticks after boot): with the pid, names this process and no later one
    /// that reuses the pid.
    pub start_time: u64,
    pub zombie: bool,
}

impl Stat {
    pub fn read(pid: u32) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses: the fields start after the last `)`.
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // rest[0] is field 3 (state); field n is rest[n - 3].
        Some(Stat {
            zombie: *fields.first()? == "Z",
            ppid: fields.get(1)?.parse().ok()?,
            pgid: fields.get(2)?.parse().ok()?,
            start_time: fields.get(19)?.parse().ok()?,
        })
    }
}

/// The process's environment (`NAME=value` entries), if we can read it.
pub fn environ(pid: u32) -> Option<Vec<Vec<u8>>> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        env.split(|b| *b == 0)
            .filter(|var| !var.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// The value of the variable `name` in the process's environment, if we can read it.
pub fn environ_var(pid: u32, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    environ(pid)?.into_iter().find_map(|var| {
        var.strip_prefix(prefix.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// Every live process but this one (and init): (pid, stat), zombies left out.
pub fn processes() -> Vec<(u32, Stat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id();
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own && *pid > 1)
        .filter_map(|pid| Some((pid, Stat::read(pid)?)))
        .filter(|(_, stat)| !stat.zombie)
        .collect()
}

/// Where the process's file descriptor `fd` points (`pipe:[…]`, a path), if we can read it.
pub fn fd_link(pid: u32, fd: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// The process's resident memory (`VmRSS` of `/proc/<pid>/status`) in bytes.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
