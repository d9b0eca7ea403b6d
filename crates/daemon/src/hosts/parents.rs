//! This daemon's agents that created agents on other hosts which report to them (subagents,
//! or agents that tell them how their first turn went), by host
//! (`$DROVER_HOME/host-parents.json`). Archiving one of them asks those hosts; while one of
//! them cannot be asked the archive is refused, also by a hub that restarted before it could
//! see that host's agents again. A host's notices are taken only for the agents it was given
//! (a host cannot queue messages for the hub's other agents). A host that refuses an agent
//! made nothing: its parent is forgotten again there, unless it has others.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use drover_core::AgentId;

const FILE: &str = "host-parents.json";

pub(super) struct Parents {
    path: PathBuf,
    by_host: Mutex<BTreeMap<String, BTreeSet<AgentId>>>,
    /// The creations on a host not answered yet, by host and parent.
    asking: Mutex<HashMap<(String, AgentId), Asking>>,
}

struct Asking {
    count: usize,
    /// The parent had no agent on the host before, and no creation has made one yet.
    first: bool,
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
            asking: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<AgentId>>> {
        self.by_host.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, by_host: &BTreeMap<String, BTreeSet<AgentId>>) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(by_host).unwrap_or_default();
        drover_core::store::write_atomic(&self.path, &json).map_err(|e| e.to_string())
    }

    /// `agent` creates a subagent on `host`: written before the host is asked. Each call is
    /// followed by one [`Parents::answered`].
    pub(super) fn add(&self, host: &str, agent: AgentId) -> Result<(), String> {
        let mut by_host = self.lock();
        let mut asking = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
        let known = by_host
            .get(host)
            .is_some_and(|agents| agents.contains(&agent));
        if !known {
            by_host.entry(host.to_string()).or_default().insert(agent);
            if let Err(e) = self.save(&by_host) {
                // Not on disk, so not in memory either: the creation is refused.
                if let Some(agents) = by_host.get_mut(host) {
                    agents.remove(&agent);
                    if agents.is_empty() {
                        by_host.remove(host);
                    }
                }
                return Err(e);
            }
        }
        asking
            .entry((host.to_string(), agent))
            .or_insert(Asking {
                count: 0,
                first: !known,
            })
            .count += 1;
        Ok(())
    }

    /// `host` answered a creation [`Parents::add`] announced: `made` unless it refused (a
    /// link that broke before the answer may have made it). When the last creation asked of
    /// it is refused and `agent` had no agent there before, `agent` has none there.
    pub(super) fn answered(&self, host: &str, agent: AgentId, made: bool) {
        let mut by_host = self.lock();
        let mut asking = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (host.to_string(), agent);
        let Some(entry) = asking.get_mut(&key) else {
            return;
        };
        entry.count -= 1;
        entry.first &= !made;
        if entry.count > 0 {
            return;
        }
        let first = entry.first;
        asking.remove(&key);
        if !first {
            return;
        }
        if let Some(agents) = by_host.get_mut(host) {
            agents.remove(&agent);
            if agents.is_empty() {
                by_host.remove(host);
            }
        }
        if let Err(error) = self.save(&by_host) {
            tracing::warn!(%error, "cannot save which agents have subagents on other hosts");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the file says after reopening it, for `agent` on host `b`.
    fn kept(home: &Path, agent: AgentId) -> bool {
        Parents::open(home).expect("open").has("b", agent)
    }

    /// A parent that cannot be written (here: its home is gone; a full disk alike) is refused
    /// and not remembered in memory either: memory never holds what the file does not.
    #[test]
    fn a_parent_that_cannot_be_written_is_not_remembered() {
        let home = tempfile::tempdir().expect("tempdir");
        let gone = home.path().join("gone");
        let parents = Parents::open(&gone).expect("open");
        let agent = AgentId::new();
        let e = parents
            .add("b", agent)
            .expect_err("a file that cannot be written");
        assert!(e.contains("host-parents.json"), "{e}");
        assert!(!parents.has("b", agent) && !parents.knows(agent));
        assert!(parents.hosts_of(&HashSet::from([agent])).is_empty());
    }

    #[test]
    fn a_refused_creation_forgets_a_parent_that_had_nothing_there() {
        let home = tempfile::tempdir().expect("tempdir");
        let parents = Parents::open(home.path()).expect("open");
        let (lone, busy, racing) = (AgentId::new(), AgentId::new(), AgentId::new());

        // Written before the host is asked; a refusal takes it back.
        parents.add("b", lone).expect("add");
        assert!(kept(home.path(), lone));
        parents.answered("b", lone, false);
        assert!(!parents.has("b", lone) && !kept(home.path(), lone));

        // A parent that already has an agent there keeps it through a refusal.
        parents.add("b", busy).expect("add");
        parents.answered("b", busy, true);
        parents.add("b", busy).expect("add");
        parents.answered("b", busy, false);
        assert!(parents.has("b", busy) && kept(home.path(), busy));

        // Two creations at once: one made is enough, in either order.
        parents.add("b", racing).expect("add");
        parents.add("b", racing).expect("add");
        parents.answered("b", racing, false);
        assert!(parents.has("b", racing));
        parents.answered("b", racing, true);
        assert!(parents.has("b", racing) && kept(home.path(), racing));
        parents.forget(&HashSet::from([racing]));
        parents.add("b", racing).expect("add");
        parents.add("b", racing).expect("add");
        parents.answered("b", racing, false);
        parents.answered("b", racing, false);
        assert!(!kept(home.path(), racing));
        assert!(parents.has("b", busy), "another parent's entry went too");
    }
}
