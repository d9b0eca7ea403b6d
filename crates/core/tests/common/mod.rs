//! Helpers shared by the registry's integration tests: a fixture with its own home and cwds, a
//! few lifecycle shortcuts, file access to agent records, and an independent model of the
//! seed's workspace-activity rule to check the registry against.

#![expect(dead_code)] // each test crate uses its own subset

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drover_core::store::cwd_dir_name;
use drover_core::view::AgentsView;
use drover_core::{
    ActivityBucket, ActivityIndex, Agent, AgentId, AgentStatus, AttentionReason, BootReport,
    NewAgent, Registry, RegistryEvent, RuntimeControl, WorkspaceId,
};
use drover_testkit::TestRuntime;
use tempfile::TempDir;
use tokio::sync::broadcast;

/// How long a test waits for something issued in the background (stops, closes).
pub const WAIT: Duration = Duration::from_secs(5);

/// A registry on its own temp home, with its own temp cwds for agents.
pub struct Fixture {
    pub home: TempDir,
    pub dirs: Vec<TempDir>,
    pub runtime: Arc<TestRuntime>,
    pub registry: Registry,
}

impl Fixture {
    /// A registry with one agent cwd.
    pub fn new() -> Fixture {
        Fixture::with_dirs(1)
    }

    /// A registry with `n` distinct agent cwds.
    pub fn with_dirs(n: usize) -> Fixture {
        let home = tempfile::tempdir().expect("temp home");
        let dirs = (0..n)
            .map(|_| tempfile::tempdir().expect("temp cwd"))
            .collect();
        let runtime = TestRuntime::new();
        let (registry, report) = open(home.path(), &runtime);
        assert!(report.interrupted.is_empty() && report.agents == 0);
        Fixture {
            home,
            dirs,
            runtime,
            registry,
        }
    }

    /// Agent cwd number `i`, canonical (as the registry stores it).
    pub fn cwd(&self, i: usize) -> PathBuf {
        std::fs::canonicalize(self.dirs[i].path()).expect("canonical cwd")
    }

    /// A fresh registry over the same home, with a fresh runtime double (the current registry
    /// is left alone; drop it first to simulate a restart).
    /// A new workspace on directory `i`; its id.
    pub async fn workspace(&self, i: usize) -> WorkspaceId {
        self.registry
            .register_workspace(self.cwd(i), None)
            .await
            .expect("register")
            .id
    }

    pub fn reopen(&self) -> (Registry, BootReport, Arc<TestRuntime>) {
        let runtime = TestRuntime::new();
        let (registry, report) = open(self.home.path(), &runtime);
        (registry, report, runtime)
    }

    /// A daemon restart: the registry is replaced by one freshly opened on the same home (with
    /// a fresh runtime double). The old one has no background work and no lock on the home,
    /// so dropping it last is the same as dropping it first.
    pub fn restart(&mut self) -> BootReport {
        let (registry, report, runtime) = self.reopen();
        self.registry = registry;
        self.runtime = runtime;
        report
    }

    pub async fn create(&self, dir: usize, parent: Option<AgentId>) -> Agent {
        create(&self.registry, &self.cwd(dir), parent).await
    }

    /// The agent's record file under this fixture's home.
    /// `create_agent` in the first cwd of the agent [`new_agent`] makes, as `edit` changes it.
    pub async fn try_create(
        &self,
        edit: impl FnOnce(&mut NewAgent),
    ) -> Result<Agent, drover_core::RegistryError> {
        let mut new = new_agent(&self.cwd(0));
        edit(&mut new);
        self.registry.create_agent(new).await
    }

    /// A root agent and its subagent, in the first cwd.
    pub async fn pair(&self) -> (Agent, Agent) {
        let parent = self.create(0, None).await;
        let child = self.create(0, Some(parent.id)).await;
        (parent, child)
    }

    /// A root agent, its subagent and its subagent's, in the first cwd, all idle.
    pub async fn idle_lineage(&self) -> (Agent, Agent, Agent) {
        let (parent, child) = self.pair().await;
        let grandchild = self.create(0, Some(child.id)).await;
        for a in [&parent, &child, &grandchild] {
            idle(&self.registry, a.id).await;
        }
        (parent, child, grandchild)
    }

    pub fn file(&self, agent: &Agent) -> PathBuf {
        agent_file(self.home.path(), agent)
    }

    /// The record of `id` as a fresh read of the files says (no boot reconciliation).
    pub fn on_disk(&self, id: AgentId) -> Option<Agent> {
        on_disk(self.home.path(), id)
    }
}

pub fn open(home: &Path, runtime: &Arc<TestRuntime>) -> (Registry, BootReport) {
    let runtime: Arc<dyn RuntimeControl> = runtime.clone();
    Registry::open(home, runtime).expect("open the registry")
}

pub fn new_agent(cwd: &Path) -> NewAgent {
    NewAgent {
        provider: "test".to_string(),
        cwd: cwd.to_path_buf(),
        ..NewAgent::default()
    }
}

pub async fn create(registry: &Registry, cwd: &Path, parent: Option<AgentId>) -> Agent {
    let agent = registry
        .create_agent(NewAgent {
            parent,
            ..new_agent(cwd)
        })
        .await
        .expect("create an agent");
    assert_eq!(agent.status, AgentStatus::Initializing);
    agent
}

pub async fn set(registry: &Registry, id: AgentId, to: AgentStatus) -> Agent {
    let agent = registry
        .set_status(id, to, None)
        .await
        .unwrap_or_else(|e| panic!("set {id} to {to}: {e}"));
    assert_eq!(agent.status, to);
    agent
}

/// From `initializing` to `idle`.
pub async fn idle(registry: &Registry, id: AgentId) -> Agent {
    set(registry, id, AgentStatus::Idle).await
}

/// From `initializing` to `running` (through `idle`).
pub async fn running(registry: &Registry, id: AgentId) -> Agent {
    idle(registry, id).await;
    set(registry, id, AgentStatus::Running).await
}

/// `agents/{cwd-with-dashes}/{id}.json` under `home`.
pub fn agent_file(home: &Path, agent: &Agent) -> PathBuf {
    home.join("agents")
        .join(cwd_dir_name(&agent.cwd))
        .join(format!("{}.json", agent.id))
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

pub fn write_json(path: &Path, doc: &serde_json::Value) {
    let bytes = serde_json::to_vec_pretty(doc).expect("encode");
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Reads every agent file under `home` without booting a registry.
pub fn on_disk(home: &Path, id: AgentId) -> Option<Agent> {
    let store = drover_core::store::Store::open(home).expect("open the store");
    let loaded = store.load_agents().expect("load agents");
    assert!(loaded.quarantined.is_empty(), "{:?}", loaded.quarantined);
    loaded.records.into_iter().find(|a| a.id == id)
}

/// Every event already sent to `rx`.
pub fn drain(rx: &mut broadcast::Receiver<RegistryEvent>) -> Vec<RegistryEvent> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(event) => out.push(event),
            Err(broadcast::error::TryRecvError::Empty) => return out,
            Err(e) => panic!("event stream broke: {e}"),
        }
    }
}

/// Polls `done` until it holds or `WAIT` passes; returns whether it held.
pub async fn eventually(done: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn ids(agents: &[Agent]) -> Vec<AgentId> {
    agents.iter().map(|a| a.id).collect()
}

// ---- workspace activity, recomputed -----------------------------------------------------------

/// A plain snapshot of agents that the core's activity code can read.
pub struct Snapshot {
    agents: HashMap<AgentId, Agent>,
    children: HashMap<AgentId, Vec<AgentId>>,
}

impl Snapshot {
    pub fn new(agents: &[Agent]) -> Snapshot {
        let mut children: HashMap<AgentId, Vec<AgentId>> = HashMap::new();
        for a in agents {
            if let Some(p) = a.parent_id() {
                children.entry(p).or_default().push(a.id);
            }
        }
        for list in children.values_mut() {
            list.sort();
        }
        Snapshot {
            agents: agents.iter().map(|a| (a.id, a.clone())).collect(),
            children,
        }
    }
}

impl AgentsView for Snapshot {
    fn agent(&self, id: AgentId) -> Option<&Agent> {
        self.agents.get(&id)
    }

    fn children(&self, id: AgentId) -> Vec<AgentId> {
        self.children.get(&id).cloned().unwrap_or_default()
    }
}

/// The core's own index, built from scratch over `agents`.
pub fn rebuilt_index(agents: &[Agent]) -> ActivityIndex {
    let snapshot = Snapshot::new(agents);
    ActivityIndex::build(&snapshot, agents.iter())
}

/// The seed's rule written out independently of the core: what every workspace shows.
///
/// A root (no existing parent) contributes the bucket of its own state to its own workspace; a
/// busy subagent contributes `running` to its root parent's workspace; nothing else
/// contributes; archived agents never do.
pub fn expected_activity(agents: &[Agent]) -> BTreeMap<WorkspaceId, ActivityBucket> {
    let by_id: HashMap<AgentId, &Agent> = agents.iter().map(|a| (a.id, a)).collect();
    let mut out: BTreeMap<WorkspaceId, ActivityBucket> = BTreeMap::new();
    for agent in agents.iter().filter(|a| a.archived_at.is_none()) {
        let mut root: Option<&Agent> = None;
        let mut seen = HashSet::from([agent.id]);
        let mut current = agent;
        while let Some(parent) = current.parent_id().and_then(|p| by_id.get(&p).copied()) {
            if !seen.insert(parent.id) {
                break;
            }
            root = Some(parent);
            current = parent;
        }
        let contribution = match root {
            None => Some((agent.workspace_id, own_bucket(agent))),
            Some(root) if agent.status.is_busy() => {
                Some((root.workspace_id, ActivityBucket::Running))
            }
            Some(_) => None,
        };
        if let Some((ws, bucket)) = contribution {
            let slot = out.entry(ws).or_insert(bucket);
            *slot = urgent(*slot, bucket);
        }
    }
    out
}

fn own_bucket(agent: &Agent) -> ActivityBucket {
    let reason = agent.attention.map(|a| a.reason);
    if reason == Some(AttentionReason::Permission) {
        ActivityBucket::Permission
    } else if agent.status == AgentStatus::Error || reason == Some(AttentionReason::Error) {
        ActivityBucket::Error
    } else if agent.status.is_busy() {
        ActivityBucket::Running
    } else if reason.is_some() {
        ActivityBucket::Attention
    } else {
        ActivityBucket::Idle
    }
}

/// The more urgent of two buckets, by the seed's order (spelled out, not taken from `Ord`).
fn urgent(a: ActivityBucket, b: ActivityBucket) -> ActivityBucket {
    let rank = |x: ActivityBucket| match x {
        ActivityBucket::Permission => 4,
        ActivityBucket::Error => 3,
        ActivityBucket::Running => 2,
        ActivityBucket::Attention => 1,
        ActivityBucket::Idle => 0,
    };
    if rank(a) >= rank(b) { a } else { b }
}

/// What `registry` reports for each of its workspaces (`None` left out).
pub fn reported_activity(registry: &Registry) -> BTreeMap<WorkspaceId, ActivityBucket> {
    registry
        .workspaces()
        .into_iter()
        .filter_map(|w| registry.workspace_activity(w.id).map(|b| (w.id, b)))
        .collect()
}
