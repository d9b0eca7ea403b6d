//! This daemon's agents that created agents on other hosts which report to them (subagents,
//! or agents that tell them how their first turn went), by host
//! (`$DROVER_HOME/host-parents.json`). Archiving one of them asks those hosts; while one of
//! them cannot be asked the archive is refused, also by a hub that restarted before it could
//! see that host's agents again. A host's notices are taken only for the agents it was given
//! (a host cannot queue messages for the hub's other agents).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use drover_core::AgentId;

const FILE: &str = "host-parents.json";

pub(super) struct Parents {
    path: PathBuf,
    by_host: Mutex<BTreeMap<String, BTreeSet<AgentId>>>,
}

impl Parents {
    /// Reads the file; a damaged one stops the daemon, naming it.
    pub(super) fn open(home: &Path) -> Result<Parents, String> {
        let path = home.join(FILE);
        let by_host = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} is not a map of hosts to agent ids ({e}); fix or remove it",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        Ok(Parents {
            path,
            by_host: Mutex::new(by_host),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<AgentId>>> {
        self.by_host.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, by_host: &BTreeMap<String, BTreeSet<AgentId>>) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(by_host).unwrap_or_default();
        drover_core::store::write_atomic(&self.path, &json).map_err(|e| e.to_string())
    }

    /// `agent` creates a subagent on `host`: written before the host is asked.
    pub(super) fn add(&self, host: &str, agent: AgentId) -> Result<(), String> {
        let mut by_host = self.lock();
        if by_host
            .get(host)
            .is_some_and(|agents| agents.contains(&agent))
        {
            return Ok(());
        }
        by_host.entry(host.to_string()).or_default().insert(agent);
        self.save(&by_host)
    }

    /// Whether `agent` made an agent on `host` that reports to it (so that host may send it
    /// notices).
    pub(super) fn has(&self, host: &str, agent: AgentId) -> bool {
        self.lock()
            .get(host)
            .is_some_and(|agents| agents.contains(&agent))
    }

    /// Whether `agent` made an agent on any host.
    pub(super) fn knows(&self, agent: AgentId) -> bool {
        self.lock().values().any(|agents| agents.contains(&agent))
    }

    /// The hosts on which any of `agents` created subagents.
    pub(super) fn hosts_of(&self, agents: &HashSet<AgentId>) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, parents)| parents.iter().any(|p| agents.contains(p)))
            .map(|(host, _)| host.clone())
            .collect()
    }

    /// These agents were archived with their subagents on every host.
    pub(super) fn forget(&self, agents: &HashSet<AgentId>) {
        let mut by_host = self.lock();
        let before: usize = by_host.values().map(BTreeSet::len).sum();
        for parents in by_host.values_mut() {
            parents.retain(|p| !agents.contains(p));
        }
        by_host.retain(|_, parents| !parents.is_empty());
        let after: usize = by_host.values().map(BTreeSet::len).sum();
        if before != after
            && let Err(error) = self.save(&by_host)
        {
            tracing::warn!(%error, "cannot save which agents have subagents on other hosts");
        }
    }

    /// The host was removed: what it holds is no longer this daemon's to archive.
    pub(super) fn forget_host(&self, host: &str) {
        let mut by_host = self.lock();
        if by_host.remove(host).is_some()
            && let Err(error) = self.save(&by_host)
        {
            tracing::warn!(%error, "cannot save which agents have subagents on other hosts");
        }
    }
}
