//! One host's link: the child process whose stdin and stdout carry the client protocol to the
//! host's daemon (one JSON message per line), kept up with backoff, and the hub's view of
//! what that daemon holds.
//!
//! The child is started like every child of the daemon (its own process group, killed by the
//! kernel if the daemon dies, its tree ended by the guard), so a link never outlives the hub;
//! the remote `drover connect --stdio` ends on the EOF, and the remote daemon goes on.
//! A keep-alive `ping` every [`PING_EVERY`] finds a link that stopped carrying anything (a
//! network cut TCP would wait minutes on) within [`SILENCE`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use drover_core::child::{self, OutputTail};
use drover_core::{
    AgentId, BoxFuture, Budget, RemoteSpend, Spend, UPSTREAM_ARCHIVED_LABEL, UPSTREAM_BUDGET_LABEL,
};
use drover_protocol::{HostConfig, HostInfo, HostState, NoticeInfo, PROTOCOL_VERSION, SpendInfo};
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio::time::Instant;

use super::notices::Delivered;
use super::{HostError, RemoteEvent, config, mark};

/// How often an idle link is asked whether it still carries messages.
const PING_EVERY: Duration = Duration::from_secs(2);
/// A link that carried nothing for this long is down (and its child ended).
const SILENCE: Duration = Duration::from_secs(6);
/// How long the remote side may take to answer `hello` (an ssh login, a daemon start).
const HANDSHAKE: Duration = Duration::from_secs(30);
/// How long a request waits for a link being made before it is refused.
const CONNECTING_WAIT: Duration = Duration::from_secs(15);
/// The first and the longest wait before linking again.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A host that speaks another protocol is tried again this rarely.
const INCOMPATIBLE_RETRY: Duration = Duration::from_secs(60);
/// What the link keeps of its child's stderr, for the reason it gives when it fails.
const STDERR_TAIL: usize = 4096;

pub(super) struct Link {
    pub(super) config: HostConfig,
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
}

struct Shared {
    name: String,
    target: String,
    events: broadcast::Sender<RemoteEvent>,
    state: Mutex<State>,
    /// Woken whenever the host's state changes (a request waits out a link being made).
    changed: Notify,
    /// Whether the hub itself holds an agent: a host reporting one of the hub's ids is not
    /// believed (it must not change what clients see of the hub's own agents).
    is_local: Local,
    /// Queues the host's notices for the hub's agents (see [`Deliver`]).
    deliver: Deliver,
    /// The archived agent on the lineage of one of the hub's agents (itself included), if
    /// any: what gates the host's subagents of it (see [`sync_gates`]).
    gate: Gate,
    /// One notice delivered at a time: the same one offered twice (on a `notice_queued` and
    /// in `take_notices` after a reconnect) is seen queued the second time.
    delivering: tokio::sync::Mutex<()>,
    /// A notice could not be delivered yet: asked for again at the next ping.
    undelivered: AtomicBool,
    /// Called when the running subagents of the hub's agents here may have changed (see
    /// `Hosts::activity_changed`).
    activity: Activity,
    /// Set when an agent's status or parent changed: `activity` is called once the message
    /// (or the whole `session_state`) is taken in.
    activity_may_change: AtomicBool,
    /// Told what the host's agents below the hub's spent when that, their parents, archives
    /// or the budgets the hub set on them may have changed (see `hosts::budgets`).
    spend: SpendChanged,
    /// Set when one of those changed: `spend` is called once the message is taken in.
    spend_may_change: AtomicBool,
}

/// Queues a host's notice in the hub agent's inbox; what the host is told (see
/// `notices::Delivered`).
pub(super) type Deliver = Arc<dyn Fn(NoticeInfo) -> BoxFuture<'static, Delivered> + Send + Sync>;

/// See [`Link::upstream`]: the parent of the last of the host's agents on `id`'s lineage.
fn upstream(state: &State, id: AgentId) -> Option<AgentId> {
    state.agents.get(&root_below(state, id)?)?.parent
}

/// See [`Shared::activity`].
pub(super) type Activity = Arc<dyn Fn() + Send + Sync>;

/// See [`Shared::spend`].
pub(super) type SpendChanged = Arc<dyn Fn(RemoteSpend) + Send + Sync>;

/// See [`Shared::gate`].
pub(super) type Gate = Arc<dyn Fn(AgentId) -> Option<AgentId> + Send + Sync>;

/// See [`Shared::is_local`].
pub(super) type Local = Arc<dyn Fn(AgentId) -> bool + Send + Sync>;

/// The host's agent as the hub last heard of it.
struct Remote {
    /// Its `AgentInfo`, with `host` set.
    json: Box<str>,
    archived: bool,
    live: bool,
    /// Its `parentAgentId`: one of the hub's agents for a subagent created from the hub.
    parent: Option<AgentId>,
    /// The hub's archived agent the host says gates it (see `UPSTREAM_ARCHIVED_LABEL`).
    gate: Option<AgentId>,
    /// It is starting or running a turn.
    busy: bool,
    /// What it spent, as the host says.
    spend: Spend,
    /// The budgets the hub set on it, as the host holds them (see `UPSTREAM_BUDGET_LABEL`).
    budgets: Vec<Budget>,
}

/// One of the host's agents made for one of the hub's (its parent there), unarchived: what its
/// subtree on the host spent, and the budgets the host holds it to for the hub.
pub(super) struct RemoteRoot {
    pub(super) id: AgentId,
    /// The hub's agent it is a subagent of.
    pub(super) parent: AgentId,
    pub(super) subtree: Spend,
    pub(super) budgets: Vec<Budget>,
}

struct State {
    phase: HostState,
    since: Timestamp,
    error: Option<String>,
    version: Option<String>,
    max_live: Option<u32>,
    agents: BTreeMap<AgentId, Remote>,
    /// Workspace id → its `WorkspaceInfo`, with `host` set.
    workspaces: BTreeMap<String, Value>,
    /// Set while the link is up.
    conn: Option<Conn>,
    /// How many times the link was made.
    made: u64,
}

/// The open link's writer and the requests waiting for their answers.
struct Conn {
    lines: mpsc::UnboundedSender<String>,
    pending: HashMap<String, oneshot::Sender<Value>>,
    next: u64,
}

/// How one connection ended.
struct Ended {
    why: String,
    incompatible: bool,
    /// It had been reachable (the backoff starts over).
    was_up: bool,
}

impl Link {
    /// Starts linking to `config`'s host, and again whenever the link ends.
    pub(super) fn start(
        config: HostConfig,
        events: broadcast::Sender<RemoteEvent>,
        is_local: Local,
        deliver: Deliver,
        gate: Gate,
        activity: Activity,
        spend: SpendChanged,
    ) -> Arc<Link> {
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            target: config::target(&config),
            events,
            changed: Notify::new(),
            is_local,
            deliver,
            gate,
            delivering: tokio::sync::Mutex::new(()),
            undelivered: AtomicBool::new(false),
            activity,
            activity_may_change: AtomicBool::new(false),
            spend,
            spend_may_change: AtomicBool::new(false),
            state: Mutex::new(State {
                phase: HostState::Connecting,
                since: Timestamp::now(),
                error: None,
                version: None,
                max_live: None,
                agents: BTreeMap::new(),
                workspaces: BTreeMap::new(),
                conn: None,
                made: 0,
            }),
        });
        let argv = config::link_command(&config);
        let task = tokio::spawn(keep_linked(shared.clone(), argv)).abort_handle();
        shared.announce();
        Arc::new(Link {
            config,
            shared,
            task,
        })
    }

    /// Ends the link: the host was removed (call it once the host is out of the hub's list).
    pub(super) fn close(&self) {
        self.task.abort();
        let mut state = self.shared.lock();
        state.conn = None;
        drop(state);
        let _ = self.shared.events.send(RemoteEvent::Message {
            text: Arc::from(
                json!({"type": "host_update", "payload": {"name": self.shared.name, "host": null}})
                    .to_string(),
            ),
            agent: None,
            revision: 0,
            status_of: None,
        });
        // Its agents and workspaces leave every client's view: they read the state again.
        if !self.shared.lock().agents.is_empty() {
            let reason = format!("host `{}` was removed", self.shared.name);
            self.shared.relay(
                json!({"type": "resync_required", "payload": {"reason": reason}}).to_string(),
                None,
                0,
                None,
            );
        }
    }

    pub(super) fn info(&self) -> HostInfo {
        self.shared.info()
    }

    /// Whether the request field `key` (`agentId`, a new agent's `parentAgentId`,
    /// `workspaceId`) names one of this host's agents or workspaces.
    pub(super) fn holds(&self, key: &str, id: &str) -> bool {
        let state = self.shared.lock();
        match key {
            "workspaceId" => state.workspaces.contains_key(id),
            _ => id
                .parse::<AgentId>()
                .is_ok_and(|id| state.agents.contains_key(&id)),
        }
    }

    /// Sends a request over the link and waits for its answer (with the client's own
    /// `requestId` and this host marked).
    pub(super) async fn request(&self, message: Value) -> Result<Value, HostError> {
        self.shared.request(message).await
    }

    /// Appends this host's agents to a JSON array being written; whether it is still empty.
    pub(super) fn push_agents(
        &self,
        out: &mut String,
        include_archived: bool,
        first: bool,
    ) -> bool {
        let mut first = first;
        for remote in self.shared.lock().agents.values() {
            if remote.archived && !include_archived {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&remote.json);
        }
        first
    }

    /// The unarchived agents of this host whose parent is one of `parents`.
    pub(super) fn children_of(&self, parents: &HashSet<AgentId>) -> Vec<AgentId> {
        self.shared
            .lock()
            .agents
            .iter()
            .filter(|(_, a)| !a.archived && a.parent.is_some_and(|p| parents.contains(&p)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The `AgentInfo` of each unarchived agent of this host whose parent is `parent`.
    pub(super) fn children_info(&self, parent: AgentId) -> Vec<Value> {
        self.shared
            .lock()
            .agents
            .values()
            .filter(|a| !a.archived && a.parent == Some(parent))
            .filter_map(|a| serde_json::from_str(&a.json).ok())
            .collect()
    }

    /// Brings the host's subagents of the hub's agents in step with their parents' archived
    /// lineage (see [`sync_gates`]).
    pub(super) fn sync_gates(&self) {
        if self.shared.lock().conn.is_some() {
            tokio::spawn(sync_gates(self.shared.clone()));
        }
    }

    /// Waits (bounded) while the link is being made (see [`Shared::linked`]).
    pub(super) async fn settled(&self) {
        self.shared.linked().await;
    }

    /// The hub's agents (each the first of the hub's on a lineage here) that have a running
    /// subagent on this host, at any depth.
    pub(super) fn busy_upstreams(&self) -> Vec<AgentId> {
        let state = self.shared.lock();
        state
            .agents
            .iter()
            .filter(|(_, remote)| remote.busy && !remote.archived)
            .filter_map(|(id, _)| upstream(&state, *id))
            .filter(|up| (self.shared.is_local)(*up))
            .collect()
    }

    /// The first agent above this host's agent `id` that this host does not hold (one of the
    /// hub's, for a subagent made from the hub); `None` for a root.
    pub(super) fn upstream(&self, id: AgentId) -> Option<AgentId> {
        upstream(&self.shared.lock(), id)
    }

    /// Whether this host holds the agent `id`.
    pub(super) fn holds_agent(&self, id: AgentId) -> bool {
        self.shared.lock().agents.contains_key(&id)
    }

    /// The parent of this host's agent `id` (`None` for a root or an agent it does not hold).
    pub(super) fn parent_of(&self, id: AgentId) -> Option<AgentId> {
        self.shared.lock().agents.get(&id).and_then(|a| a.parent)
    }

    pub(super) fn workspaces(&self) -> Vec<Value> {
        self.shared.lock().workspaces.values().cloned().collect()
    }

    /// The host's unarchived subagents of the hub's agents, with what their subtrees there
    /// spent and the budgets the host holds them to.
    pub(super) fn remote_roots(&self) -> Vec<RemoteRoot> {
        let state = self.shared.lock();
        let mut roots: BTreeMap<AgentId, RemoteRoot> = state
            .agents
            .iter()
            .filter(|(_, remote)| !remote.archived)
            .filter_map(|(id, remote)| {
                let parent = remote.parent.filter(|p| !state.agents.contains_key(p))?;
                (self.shared.is_local)(parent).then(|| {
                    (
                        *id,
                        RemoteRoot {
                            id: *id,
                            parent,
                            subtree: Spend::default(),
                            budgets: remote.budgets.clone(),
                        },
                    )
                })
            })
            .collect();
        for (id, remote) in &state.agents {
            if let Some(root) = root_below(&state, *id).and_then(|r| roots.get_mut(&r)) {
                root.subtree.add(&remote.spend);
            }
        }
        roots.into_values().collect()
    }

    /// Whether the link was made since this daemon started (the host's agents' spend is
    /// counted here, as it said last).
    pub(super) fn heard(&self) -> bool {
        self.shared.lock().made > 0
    }

    /// While the link is up, which time it was made (1 the first): what the host refused over
    /// one connection is asked again over the next.
    pub(super) fn connection(&self) -> Option<u64> {
        let state = self.shared.lock();
        state.conn.as_ref().map(|_| state.made)
    }
}

/// The last of the host's agents on `id`'s lineage (itself, or the ancestor whose parent the
/// host does not hold); `None` on a cycle.
fn root_below(state: &State, id: AgentId) -> Option<AgentId> {
    let mut at = id;
    // Bounded: a lineage longer than the host's agents has a cycle.
    for _ in 0..=state.agents.len() {
        match state.agents.get(&at)?.parent {
            Some(parent) if state.agents.contains_key(&parent) => at = parent,
            _ => return Some(at),
        }
    }
    None
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the host's agents below each of the hub's agents spent (each agent under the first
    /// of the hub's on its lineage, archived ones too), as the host last said.
    fn remote_spend(&self) -> RemoteSpend {
        let state = self.lock();
        let mut spends = RemoteSpend::new();
        for (id, remote) in &state.agents {
            if let Some(up) = upstream(&state, *id).filter(|up| (self.is_local)(*up)) {
                spends
                    .entry(up)
                    .or_default()
                    .push((*id, remote.spend.clone()));
            }
        }
        spends
    }

    /// Sends a request over the link and waits for its answer (with the client's own
    /// `requestId` and this host marked).
    async fn request(&self, mut message: Value) -> Result<Value, HostError> {
        self.linked().await;
        let client_id = message.get("requestId").cloned().unwrap_or(Value::Null);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            let unreachable = self.unreachable(&state);
            let Some(conn) = state.conn.as_mut() else {
                return Err(unreachable);
            };
            conn.next += 1;
            let id = format!("hub-{}", conn.next);
            if let Some(object) = message.as_object_mut() {
                object.insert("requestId".into(), Value::String(id.clone()));
            }
            conn.pending.insert(id, tx);
            if conn.lines.send(message.to_string()).is_err() {
                return Err(unreachable);
            }
        }
        let mut answer = rx.await.map_err(|_| {
            let state = self.lock();
            let mut error = self.unreachable(&state);
            if let HostError::Unreachable { why, .. } = &mut error {
                *why = format!("the link closed before the answer came ({why})");
            }
            error
        })?;
        if let Some(payload) = answer.get_mut("payload").and_then(Value::as_object_mut)
            && payload.contains_key("requestId")
        {
            payload.insert("requestId".into(), client_id);
        }
        mark(&mut answer, &self.name);
        Ok(answer)
    }

    /// Waits (bounded) while the link is being made: a request sent just after the daemon
    /// started, or after a link broke, goes out once it is up rather than failing.
    async fn linked(&self) {
        let deadline = Instant::now() + CONNECTING_WAIT;
        loop {
            let changed = self.changed.notified();
            if self.lock().phase != HostState::Connecting {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return;
            }
        }
    }

    fn info(&self) -> HostInfo {
        let state = self.lock();
        let agents = state.agents.values().filter(|a| !a.archived);
        HostInfo {
            name: self.name.clone(),
            target: self.target.clone(),
            state: state.phase,
            since: state.since.to_string(),
            error: state.error.clone(),
            version: state.version.clone(),
            agents: u32::try_from(agents.clone().count()).unwrap_or(u32::MAX),
            live: u32::try_from(agents.filter(|a| a.live).count()).unwrap_or(u32::MAX),
            max_live: state.max_live,
        }
    }

    fn unreachable(&self, state: &State) -> HostError {
        HostError::Unreachable {
            name: self.name.clone(),
            since: state.since.to_string(),
            why: match (state.phase, &state.error) {
                (HostState::Connecting, _) => "the link is still being made".to_string(),
                (_, Some(error)) => error.clone(),
                (_, None) => "the link is down".to_string(),
            },
        }
    }

    /// Tells the hub's clients what the host is now.
    fn announce(&self) {
        self.changed.notify_waiters();
        let info = self.info();
        let message = json!({"type": "host_update", "payload": {"name": self.name, "host": info}});
        self.relay(message.to_string(), None, 0, None);
    }

    fn relay(
        &self,
        text: String,
        agent: Option<AgentId>,
        revision: u64,
        status_of: Option<AgentId>,
    ) {
        let _ = self.events.send(RemoteEvent::Message {
            text: Arc::from(text),
            agent,
            revision,
            status_of,
        });
    }

    /// The link went down: pending requests fail (their senders are dropped), the host shows
    /// why and since when.
    fn down(&self, ended: &Ended) {
        let mut state = self.lock();
        state.conn = None;
        state.phase = if ended.incompatible {
            HostState::Incompatible
        } else {
            HostState::Unreachable
        };
        state.since = Timestamp::now();
        state.error = Some(ended.why.clone());
        drop(state);
        tracing::warn!(host = %self.name, why = %ended.why, "host link down");
        self.announce();
        // What its subagents may still spend out of reach is kept from the other hosts' (see
        // `budgets::reserve`): their budgets are brought in step.
        (self.spend)(self.remote_spend());
    }

    /// Takes in one message the host's daemon sent. A streamed `agent_update` (most of what
    /// comes) is relayed as the host wrote it, read only for its agent and revision.
    fn receive(self: &Arc<Self>, line: String) -> Result<(), String> {
        // A refused key's hint means the host's config.toml and `drover login`, not the hub's.
        let line = drover_acp::placed_on_host(&line, &self.name).unwrap_or(line);
        if let Ok(Head {
            kind: "agent_update",
            payload:
                HeadPayload {
                    agent_id: Some(agent),
                    revision,
                    request_id: None,
                },
        }) = serde_json::from_str::<Head<'_>>(&line)
        {
            // Only for the host's own agents (never one of the hub's, see `is_local`).
            if let Ok(agent) = agent.parse::<AgentId>()
                && self.lock().agents.contains_key(&agent)
            {
                self.relay(line, Some(agent), revision.unwrap_or(u64::MAX), None);
            }
            return Ok(());
        }
        let Ok(mut message) = serde_json::from_str::<Value>(&line) else {
            return Ok(());
        };
        let kind = message
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let request_id = message
            .pointer("/payload/requestId")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(id) = request_id {
            let waiting = self
                .lock()
                .conn
                .as_mut()
                .and_then(|conn| conn.pending.remove(&id));
            if let Some(waiting) = waiting {
                let _ = waiting.send(message);
            }
            return Ok(());
        }
        match kind.as_str() {
            "agent_status" => {
                mark(&mut message, &self.name);
                let id = self.remember_agent(message.pointer("/payload/agent"));
                self.relay(message.to_string(), None, 0, id);
                self.tell_activity();
            }
            "workspace_update" => {
                mark(&mut message, &self.name);
                self.remember_workspace(&message);
                self.relay(message.to_string(), None, 0, None);
            }
            "job_update" | "schedule_update" => {
                mark(&mut message, &self.name);
                self.relay(message.to_string(), None, 0, None);
            }
            "notice_queued" => {
                if let Some(notice) = message
                    .pointer("/payload/notice")
                    .and_then(|n| serde_json::from_value::<NoticeInfo>(n.clone()).ok())
                {
                    tokio::spawn(deliver_notice(self.clone(), notice));
                }
            }
            "resync_required" => {
                return Err("the host's daemon asked the link to start over".to_string());
            }
            // A host's own hosts are its own; pushes for follows the link never makes.
            _ => {}
        }
        Ok(())
    }

    /// Keeps an agent's `AgentInfo` (marked); its id.
    fn remember_agent(&self, agent: Option<&Value>) -> Option<AgentId> {
        let agent = agent?;
        let id = agent.get("id")?.as_str()?.parse::<AgentId>().ok()?;
        if (self.is_local)(id) {
            tracing::warn!(host = %self.name, agent = %id, "the host reported one of this daemon's own agents; ignored");
            return None;
        }
        let remote = Remote {
            json: agent.to_string().into_boxed_str(),
            archived: agent.get("archivedAt").is_some_and(|a| !a.is_null()),
            live: agent.pointer("/runtime/state").and_then(Value::as_str) == Some("live"),
            parent: agent
                .get("parentAgentId")
                .and_then(Value::as_str)
                .and_then(|p| p.parse().ok()),
            gate: agent
                .pointer(&format!("/labels/{UPSTREAM_ARCHIVED_LABEL}"))
                .and_then(Value::as_str)
                .and_then(|a| a.parse().ok()),
            busy: matches!(
                agent.get("status").and_then(Value::as_str),
                Some("running" | "initializing")
            ),
            spend: agent
                .get("spend")
                .and_then(|s| serde_json::from_value::<SpendInfo>(s.clone()).ok())
                .map(|s| Spend {
                    tokens: s.tokens,
                    cost: s.cost,
                    currency: s.currency,
                })
                .unwrap_or_default(),
            budgets: agent
                .pointer(&format!("/labels/{UPSTREAM_BUDGET_LABEL}"))
                .and_then(Value::as_str)
                .and_then(|b| serde_json::from_str(b).ok())
                .unwrap_or_default(),
        };
        let (busy, parent) = (remote.busy, remote.parent);
        let (spend, budgets, archived) = (
            remote.spend.clone(),
            remote.budgets.clone(),
            remote.archived,
        );
        let before = self.lock().agents.insert(id, remote);
        if before
            .as_ref()
            .is_none_or(|b| b.busy != busy || b.parent != parent)
        {
            self.activity_may_change.store(true, Ordering::Relaxed);
        }
        if before.is_none_or(|b| {
            b.spend != spend || b.budgets != budgets || b.archived != archived || b.parent != parent
        }) {
            self.spend_may_change.store(true, Ordering::Relaxed);
        }
        Some(id)
    }

    fn remember_workspace(&self, message: &Value) {
        let Some(id) = message
            .pointer("/payload/workspaceId")
            .and_then(Value::as_str)
        else {
            return;
        };
        let mut state = self.lock();
        match message.pointer("/payload/workspace") {
            Some(workspace) if workspace.is_object() => {
                state.workspaces.insert(id.to_string(), workspace.clone());
            }
            _ => {
                let activity = message.pointer("/payload/activity").cloned();
                if let (Some(workspace), Some(activity)) = (state.workspaces.get_mut(id), activity)
                    && let Some(object) = workspace.as_object_mut()
                {
                    object.insert("activity".into(), activity);
                }
            }
        }
    }

    /// Replaces the view with a `session_state`, then announces every agent and workspace in
    /// it (so clients that knew the host before learn what changed while it was away).
    fn take_state(&self, mut state_message: Value) {
        mark(&mut state_message, &self.name);
        let agents = state_message
            .pointer("/payload/agents")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let workspaces = state_message
            .pointer("/payload/workspaces")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        {
            let mut state = self.lock();
            state.agents.clear();
            state.workspaces.clear();
        }
        for agent in &agents {
            if let Some(id) = self.remember_agent(Some(agent)) {
                let text = json!({"type": "agent_status", "payload": {"agent": agent}});
                self.relay(text.to_string(), None, 0, Some(id));
            }
        }
        for workspace in workspaces {
            let Some(id) = workspace
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                continue;
            };
            let activity = workspace.get("activity").cloned().unwrap_or(Value::Null);
            let message = json!({"type": "workspace_update",
                "payload": {"workspace": workspace, "workspaceId": id, "activity": activity}});
            self.remember_workspace(&message);
            self.relay(message.to_string(), None, 0, None);
        }
        self.activity_may_change.store(true, Ordering::Relaxed);
        self.spend_may_change.store(true, Ordering::Relaxed);
        self.tell_activity();
    }

    /// Calls `activity` if an agent's status or parent changed since it was last called, and
    /// `spend` if what the budgets read of the host's agents did.
    fn tell_activity(&self) {
        if self.activity_may_change.swap(false, Ordering::Relaxed) {
            (self.activity)();
        }
        if self.spend_may_change.swap(false, Ordering::Relaxed) {
            (self.spend)(self.remote_spend());
        }
    }
}

/// What [`Shared::receive`] reads first of a message: its type, and of its payload what routes
/// it (other fields are skipped, not built).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default, borrow)]
    payload: HeadPayload<'a>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeadPayload<'a> {
    #[serde(default, borrow)]
    agent_id: Option<&'a str>,
    #[serde(default)]
    revision: Option<u64>,
    #[serde(default, borrow)]
    request_id: Option<&'a str>,
}

/// The archived-lineage gate and the archive cascade across hosts: each of the host's agents
/// whose parent is one of the hub's is told which archived agent, if any, is on that parent's
/// lineage here, when the host says otherwise; one whose parent itself was archived here and
/// that was not told so yet is archived first, with what it runs (the cascade of an archive the
/// hub made without asking the host: an `autoArchive`, a workspace's). Run when the link is made
/// and after each archive and unarchive here, so what happened while the link was down reaches
/// the host once it is back; an agent already told is left as it is (a user may bring it back).
async fn sync_gates(shared: Arc<Shared>) {
    let stale: Vec<(AgentId, Option<AgentId>, bool)> = {
        let state = shared.lock();
        state
            .agents
            .iter()
            .filter_map(|(id, remote)| {
                let parent = remote.parent.filter(|p| (shared.is_local)(*p))?;
                let gate = (shared.gate)(parent);
                let cascade = gate == Some(parent) && !remote.archived;
                (gate != remote.gate).then_some((*id, gate, cascade))
            })
            .collect()
    };
    for (id, gate, cascade) in stale {
        if cascade {
            let asked = json!({"type": "archive", "agentId": id.to_string(), "stopActivity": true});
            match shared.request(asked).await {
                Ok(answer) if answer["type"] == "archived" => {
                    tracing::info!(host = %shared.name, agent = %id, "archived with its parent here");
                }
                other => {
                    tracing::warn!(host = %shared.name, agent = %id, answer = ?other, "the archive of a subagent whose parent was archived here waits for the next link");
                    return;
                }
            }
        }
        let asked = json!({"type": "set_upstream_gate", "agentId": id.to_string(),
            "archived": gate.map(|g| g.to_string())});
        if let Err(error) = shared.request(asked).await {
            tracing::info!(host = %shared.name, agent = %id, %error, "the lineage gate is set when the link is back");
            return;
        }
    }
}

/// Takes the notices the host keeps for the hub's agents and delivers each (see
/// `drover_core::outbox`).
async fn take_notices(shared: Arc<Shared>) {
    let answer = match shared.request(json!({"type": "take_notices"})).await {
        Ok(answer) if answer["type"] == "notices" => answer,
        Ok(refused) => {
            tracing::info!(host = %shared.name, answer = %refused, "the host did not give its notices yet");
            shared.undelivered.store(true, Ordering::Relaxed);
            return;
        }
        Err(error) => {
            tracing::info!(host = %shared.name, %error, "cannot take the host's notices yet");
            shared.undelivered.store(true, Ordering::Relaxed);
            return;
        }
    };
    let notices: Vec<NoticeInfo> = answer
        .pointer("/payload/notices")
        .and_then(|n| serde_json::from_value(n.clone()).ok())
        .unwrap_or_default();
    for notice in notices {
        deliver_notice(shared.clone(), notice).await;
    }
}

/// Queues one notice in its agent's inbox, then tells the host it may drop it. A link that
/// breaks before the host heard leaves it there: offered again, and found queued.
async fn deliver_notice(shared: Arc<Shared>, notice: NoticeInfo) {
    let _one = shared.delivering.lock().await;
    let id = notice.id.clone();
    match (shared.deliver)(notice).await {
        Delivered::Ack => {}
        Delivered::Later => {
            shared.undelivered.store(true, Ordering::Relaxed);
            return;
        }
        Delivered::NotMine => return,
    }
    match shared
        .request(json!({"type": "ack_notices", "ids": [id]}))
        .await
    {
        Ok(answer) if answer["type"] == "ok" => {}
        other => {
            tracing::info!(host = %shared.name, notice = %id, answer = ?other, "a delivered notice is not acknowledged yet; the host offers it again");
        }
    }
}

/// Links, and links again when the link ends, until the link is closed (the task aborted).
async fn keep_linked(shared: Arc<Shared>, argv: Vec<String>) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let ended = link_once(&shared, &argv).await;
        shared.down(&ended);
        if ended.was_up {
            backoff = BACKOFF_FIRST;
        }
        let wait = if ended.incompatible {
            INCOMPATIBLE_RETRY
        } else {
            backoff
        };
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One connection: starts the link command, says `hello`, takes the host's state, then
/// relays until the link ends; why it ended.
async fn link_once(shared: &Arc<Shared>, argv: &[String]) -> Ended {
    let failed = |why: String| Ended {
        why,
        incompatible: false,
        was_up: false,
    };
    let mut child = match LinkChild::spawn(argv).await {
        Ok(child) => child,
        Err(why) => return failed(why),
    };
    if let Err(ended) = handshake(shared, &mut child).await {
        return ended;
    }
    {
        let mut state = shared.lock();
        state.conn = Some(Conn {
            lines: child.lines.clone(),
            pending: HashMap::new(),
            next: 0,
        });
        state.made += 1;
        state.phase = HostState::Reachable;
        state.since = Timestamp::now();
        state.error = None;
    }
    tracing::info!(host = %shared.name, "host linked");
    shared.announce();
    tokio::spawn(take_notices(shared.clone()));
    tokio::spawn(sync_gates(shared.clone()));
    // The budgets the host holds the hub's subagents to are brought in step.
    (shared.spend)(shared.remote_spend());
    let why = relay(shared, &mut child).await;
    child.end().await;
    Ended {
        why,
        incompatible: false,
        was_up: true,
    }
}

/// The running link command: its stdin (a channel of lines), its stdout, its stderr's tail.
struct LinkChild {
    process: tokio::process::Child,
    lines: mpsc::UnboundedSender<String>,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: OutputTail,
    writer: tokio::task::JoinHandle<()>,
}

impl LinkChild {
    /// Starts `argv` like every child of the daemon: its own process group, killed by the
    /// kernel when the daemon dies, ended by the guard with its tree.
    async fn spawn(argv: &[String]) -> Result<LinkChild, String> {
        let Some((program, args)) = argv.split_first() else {
            return Err("the host has no link command".to_string());
        };
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        child::die_with_daemon(&mut command);
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let runtime = tokio::runtime::Handle::current();
        let mut process = child::on_spawner(move || {
            let _entered = runtime.enter();
            command.spawn()
        })
        .await
        .and_then(|r| r)
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            return Err("the link command's pipes are missing".to_string());
        };
        let tail = OutputTail::new(STDERR_TAIL);
        let stderr_tail = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                stderr_tail.push_line(&line, 512);
            }
        });
        let (lines, mut to_write) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            while let Some(mut line) = to_write.recv().await {
                line.push('\n');
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
        Ok(LinkChild {
            process,
            lines,
            stdout: BufReader::new(stdout).lines(),
            stderr: tail,
            writer,
        })
    }

    /// `fallback`, with what the command last said on stderr (a refused login, no drover).
    async fn why(&self, fallback: &str) -> String {
        // Give stderr a moment to be read: it says why.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let said = self.stderr.last_lines(3).join(" / ");
        if said.trim().is_empty() {
            fallback.to_string()
        } else {
            format!("{fallback}: {said}")
        }
    }

    async fn end(mut self) {
        self.writer.abort();
        if let Some(pid) = self.process.id() {
            child::signal_group(pid, Some(nix::sys::signal::Signal::SIGKILL));
        }
        let _ = self.process.kill().await;
    }
}

/// `hello`, then `welcome` and `session_state` (or a refusal), within [`HANDSHAKE`].
async fn handshake(shared: &Shared, child: &mut LinkChild) -> Result<(), Ended> {
    let failed = |why: String| Ended {
        why,
        incompatible: false,
        was_up: false,
    };
    let hello = json!({"type": "hello", "client": "drover-hub", "version": env!("CARGO_PKG_VERSION"),
        "protocolVersion": PROTOCOL_VERSION, "includeArchived": true});
    let _ = child.lines.send(hello.to_string());
    let deadline = Instant::now() + HANDSHAKE;
    let mut welcomed = false;
    loop {
        let line = match tokio::time::timeout_at(deadline, child.stdout.next_line()).await {
            Err(_) => return Err(failed(child.why("no answer to `hello` in 30 s").await)),
            Ok(Ok(Some(line))) => line,
            Ok(_) => return Err(failed(child.why("the link command ended").await)),
        };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            return Err(failed(format!(
                "the host answered something that is not the protocol: {}",
                line.chars().take(200).collect::<String>()
            )));
        };
        match message.get("type").and_then(Value::as_str) {
            Some("welcome") => {
                let mut state = shared.lock();
                state.version = message
                    .pointer("/payload/daemonVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                state.max_live = message
                    .pointer("/payload/maxLive")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok());
                welcomed = true;
            }
            Some("session_state") if welcomed => {
                shared.take_state(message);
                return Ok(());
            }
            Some("request_error") => return Err(refused(&message)),
            _ => {}
        }
    }
}

/// The host's daemon refused the `hello`.
fn refused(message: &Value) -> Ended {
    let code = message
        .pointer("/payload/code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let said = message
        .pointer("/payload/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let incompatible = code == "unsupported_version";
    Ended {
        why: if incompatible {
            format!(
                "its daemon does not speak this daemon's protocol {PROTOCOL_VERSION} ({said}); install the same drover there (`drover host add --install`)"
            )
        } else {
            format!("its daemon refused the link ({code}): {said}")
        },
        incompatible,
        was_up: false,
    }
}

/// Relays what the host says, and pings it, until the link ends; why it ended.
async fn relay(shared: &Arc<Shared>, child: &mut LinkChild) -> String {
    let mut heard = Instant::now();
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut pings = 0u64;
    loop {
        tokio::select! {
            line = child.stdout.next_line() => {
                let Ok(Some(line)) = line else {
                    return child.why("the link ended").await;
                };
                heard = Instant::now();
                if let Err(why) = shared.receive(line) {
                    return why;
                }
            },
            _ = ping.tick() => {
                if heard.elapsed() > SILENCE {
                    return format!("nothing came over the link for {} s", SILENCE.as_secs());
                }
                pings += 1;
                if shared.undelivered.swap(false, Ordering::Relaxed) {
                    tokio::spawn(take_notices(shared.clone()));
                }
                let ping = json!({"type": "ping", "requestId": format!("ping-{pings}")});
                let _ = child.lines.send(ping.to_string());
            }
        }
    }
}
