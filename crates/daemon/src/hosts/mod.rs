//! Other machines' daemons, one fleet: the hub side of `drover host`.
//!
//! Every machine that runs agents runs its own daemon, which alone owns its agents, files and
//! worktrees. This daemon (the hub the user talks to) keeps one link per configured host: a
//! child process (`ssh … drover connect --stdio`, or the host's own command) whose stdin and
//! stdout carry the client protocol, one JSON message per line, to that host's daemon (see
//! `link`). Over it the hub is an ordinary client: it says `hello`, keeps the host's
//! `session_state` (its agents, workspaces, jobs and schedules: the view), and relays the
//! host's events to its own clients with `host` set. A client's request that names a remote
//! agent, workspace, job or schedule, or a `create_agent` with `host`, is forwarded over the
//! link and its answer relayed back (`route`, `forward`); nothing about a remote agent is
//! decided here. An agent's history and stream cross the link only once a client opens it
//! (its `initialize_agent_request` is forwarded, and the link stays subscribed).
//!
//! When a link is down its host and agents show `unreachable` (since when, and why), and a
//! request to them fails at once with `host_unreachable`; nothing is queued to be sent later,
//! so no answer is given from stale data.

mod budgets;
mod config;
mod link;
mod notices;
mod parents;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use drover_core::{ActivityBucket, AgentId, RegistryError, WorkspaceId};
use drover_protocol::{DaemonMessage, ErrorCode, HostConfig, HostInfo, HostState, NoticeInfo};
use serde_json::Value;
use tokio::sync::broadcast;

pub use config::ssh_command;
use link::Link;

/// Events relayed to the hub's clients; a lagging subscriber resyncs.
const EVENTS_CAPACITY: usize = 4096;

/// Why a request about a host failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostError {
    #[error("no host named `{0}`; `drover host ls` lists the hosts, `drover host add` adds one")]
    Unknown(String),
    #[error("host `{name}` is unreachable (since {since}): {why}")]
    Unreachable {
        name: String,
        since: String,
        why: String,
    },
    #[error("a host named `{0}` exists already; remove it first with `drover host rm {0}`")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("cannot save the hosts: {0}")]
    Store(String),
}

impl HostError {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            HostError::Unknown(_) => ErrorCode::UnknownHost,
            HostError::Unreachable { .. } => ErrorCode::HostUnreachable,
            HostError::Exists(_) | HostError::Invalid(_) => ErrorCode::InvalidInput,
            HostError::Store(_) => ErrorCode::StoreFailed,
        }
    }
}

/// Something a host's daemon said that the hub's clients are told.
#[derive(Debug, Clone)]
pub(crate) enum RemoteEvent {
    /// A message to relay as it is (already marked with its host).
    Message {
        text: Arc<str>,
        /// Set for an `agent_update`: only sessions that opened the agent get it, past
        /// their snapshot's revision.
        agent: Option<AgentId>,
        revision: u64,
        /// Set for an `agent_status`.
        status_of: Option<AgentId>,
    },
}

/// The hosts this daemon links to.
#[derive(Clone)]
pub(crate) struct Hosts {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.links().keys()).finish()
    }
}

struct Inner {
    home: PathBuf,
    links: Mutex<BTreeMap<String, Arc<Link>>>,
    events: broadcast::Sender<RemoteEvent>,
    /// This daemon's own runtimes (its `max_live` and live count, for `--host auto`; the
    /// inboxes hosts' notices go to).
    runtimes: drover_acp::RuntimeManager,
    /// This daemon's agents that created subagents on each host.
    parents: parents::Parents,
    /// This daemon's workspaces whose root agents have a subagent running on a host (see
    /// [`Hosts::merge_activity`]).
    remote_running: Mutex<HashSet<WorkspaceId>>,
    /// Host notices handed to an agent's runtime and not seen queued yet (see `notices`).
    in_flight: Mutex<HashSet<String>>,
    /// Wakes the task that keeps the hosts' budgets in step (see `budgets`).
    budgets: Arc<tokio::sync::Notify>,
    /// What the hosts' spend changed here that the task has not acted on yet.
    spend_changes: Mutex<Vec<(AgentId, i128, f64)>>,
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) enum Route {
    /// To this host's daemon, as `message` says (a `create_agent`'s `host` taken out).
    Remote { host: String, message: Value },
    /// Answered here.
    Local,
    /// A list of the whole fleet's (`list_jobs`, `list_schedules` naming no agent): answered
    /// here, and by every reachable host, the answers' lists joined.
    Everywhere { message: Value },
    /// A `follow_job` of a host's job (`job`, as the host numbers it; the client names it
    /// `job@host`): the session reads its output over the link (see `ws::jobs`).
    FollowJob { host: String, job: String },
}

impl Hosts {
    /// Reads `hosts.json` and starts a link to each host in it; a broken file stops the
    /// daemon, naming it.
    pub(crate) fn open(
        home: &Path,
        runtimes: &drover_acp::RuntimeManager,
    ) -> Result<Hosts, String> {
        let configs = config::load(home)?;
        let (events, _) = broadcast::channel(EVENTS_CAPACITY);
        let hosts = Hosts {
            inner: Arc::new(Inner {
                home: home.to_path_buf(),
                links: Mutex::default(),
                events,
                runtimes: runtimes.clone(),
                parents: parents::Parents::open(home)?,
                remote_running: Mutex::default(),
                in_flight: Mutex::default(),
                budgets: Arc::default(),
                spend_changes: Mutex::default(),
            }),
        };
        tokio::spawn(budgets::keep_in_step(
            Arc::downgrade(&hosts.inner),
            hosts.inner.budgets.clone(),
        ));
        hosts.follow_archives();
        // Each link is in the list before it can report any spend (see `budgets::counted`).
        let mut links = hosts.links();
        for host in configs {
            let link = Link::start(
                host.clone(),
                hosts.inner.events.clone(),
                hosts.is_local(),
                hosts.deliver(&host.name),
                hosts.gate(),
                hosts.activity(),
                hosts.spend(&host.name),
            );
            links.insert(host.name, link);
        }
        drop(links);
        Ok(hosts)
    }

    /// Whether this daemon holds an agent (what a link must not take a host's word for).
    fn is_local(&self) -> link::Local {
        let registry = self.inner.runtimes.registry().clone();
        Arc::new(move |id| registry.get(id).is_some())
    }

    /// The archived agent on the lineage of this daemon's agent (itself included), if any.
    fn gate(&self) -> link::Gate {
        let registry = self.inner.runtimes.registry().clone();
        Arc::new(move |id| match registry.check_turn_gate(id) {
            Err(
                RegistryError::Archived { agent }
                | RegistryError::TurnBlocked {
                    archived: agent, ..
                },
            ) => Some(agent),
            _ => None,
        })
    }

    /// Called by a link when its agents' running turns may have changed: the workspaces here
    /// whose activity that changes are announced (`workspace_update`).
    fn activity(&self) -> link::Activity {
        let inner = Arc::downgrade(&self.inner);
        Arc::new(move || {
            if let Some(inner) = inner.upgrade() {
                Hosts { inner }.activity_changed();
            }
        })
    }

    /// Told by `host`'s link what its agents below this daemon's spent, when that (or the
    /// budgets it holds them to) may have changed: counted here at once, before the link takes
    /// its next message (a notice the spend came before finds the budget spent), the rest
    /// left to the budgets' task (see `budgets`).
    fn spend(&self, host: &str) -> link::SpendChanged {
        let inner = Arc::downgrade(&self.inner);
        let host = host.to_string();
        Arc::new(move |spends| {
            if let Some(inner) = inner.upgrade() {
                budgets::counted(&inner, &host, spends);
            }
        })
    }

    fn activity_changed(&self) {
        let upstreams: Vec<AgentId> = self
            .links()
            .values()
            .flat_map(|link| link.busy_upstreams())
            .collect();
        let registry = self.inner.runtimes.registry();
        let now: HashSet<WorkspaceId> = upstreams
            .into_iter()
            .filter_map(|up| {
                let root = registry.ancestors(up).last().copied().unwrap_or(up);
                registry
                    .get(root)
                    .filter(|a| !a.is_archived())
                    .map(|a| a.workspace_id)
            })
            .collect();
        let before = std::mem::replace(
            &mut *self
                .inner
                .remote_running
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            now.clone(),
        );
        for workspace in before.symmetric_difference(&now) {
            let activity = self.merge_activity(*workspace, registry.workspace_activity(*workspace));
            let message = DaemonMessage::WorkspaceUpdate {
                workspace: None,
                workspace_id: workspace.to_string(),
                activity: activity.map(Into::into),
            };
            let _ = self.inner.events.send(RemoteEvent::Message {
                text: Arc::from(serde_json::to_string(&message).unwrap_or_default()),
                agent: None,
                revision: 0,
                status_of: None,
            });
        }
    }

    /// This daemon's workspace's activity `local` with its root agents' subagents on other
    /// hosts: `running` while one of them runs (seed 000: a running subagent counts in its root
    /// parent's workspace).
    pub(crate) fn merge_activity(
        &self,
        workspace: WorkspaceId,
        local: Option<ActivityBucket>,
    ) -> Option<ActivityBucket> {
        let running = self
            .inner
            .remote_running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&workspace);
        if running {
            local.max(Some(ActivityBucket::Running))
        } else {
            local
        }
    }

    /// Whenever an agent that gave a host agents is archived here, however (an explicit
    /// archive, which cascaded already, an `autoArchive`, a workspace's archive), its
    /// subagents there are archived and gated (see `link::sync_gates`).
    fn follow_archives(&self) {
        let mut changes = self.inner.runtimes.registry().subscribe();
        let hosts = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let archived = match changes.recv().await {
                    Ok(event) => match event.change {
                        drover_core::Change::AgentUpdated(agent) => {
                            // A spend, a budget, a lineage here: the hosts' budgets follow.
                            if let Some(inner) = hosts.upgrade()
                                && (Hosts {
                                    inner: inner.clone(),
                                })
                                .any()
                            {
                                inner.budgets.notify_one();
                            }
                            agent.is_archived().then_some(agent.id)
                        }
                        _ => None,
                    },
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Changes were missed: the hosts' budgets and gates are brought in
                        // step from the current state.
                        let Some(inner) = hosts.upgrade() else {
                            return;
                        };
                        inner.budgets.notify_one();
                        Hosts { inner }.sync_gates();
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(inner) = hosts.upgrade() else {
                    return;
                };
                if archived.is_some_and(|id| inner.parents.knows(id)) {
                    Hosts { inner }.sync_gates();
                }
            }
        });
    }

    /// After an archive or unarchive here: every reachable host's subagents of this daemon's
    /// agents are brought in step with their parents' archived lineage.
    pub(crate) fn sync_gates(&self) {
        for link in self.links().values() {
            link.sync_gates();
        }
    }

    /// Queues a host's notices in the inboxes of this daemon's agents (see `notices`).
    fn deliver(&self, host: &str) -> link::Deliver {
        let inner = Arc::downgrade(&self.inner);
        let host = host.to_string();
        Arc::new(move |notice: NoticeInfo| {
            let inner = inner.upgrade();
            let host = host.clone();
            Box::pin(async move {
                match inner {
                    Some(inner) => notices::deliver(&Hosts { inner }, &host, notice).await,
                    None => notices::Delivered::Later,
                }
            })
        })
    }

    fn links(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Link>>> {
        self.inner
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any host is configured (when none, no request is looked at twice).
    pub(crate) fn any(&self) -> bool {
        !self.links().is_empty()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<RemoteEvent> {
        self.inner.events.subscribe()
    }

    /// Every host, as `list_hosts` answers.
    pub(crate) fn list(&self) -> Vec<HostInfo> {
        self.links().values().map(|link| link.info()).collect()
    }

    /// Adds a host, keeps it in `hosts.json`, and starts its link.
    pub(crate) fn add(&self, mut host: HostConfig) -> Result<Vec<HostInfo>, HostError> {
        config::validate(&host).map_err(HostError::Invalid)?;
        if let Some(identity) = &host.identity
            && !Path::new(identity).is_absolute()
        {
            return Err(HostError::Invalid(format!(
                "identity `{identity}`: give an absolute path"
            )));
        }
        host.ssh_options.retain(|o| !o.trim().is_empty());
        let mut links = self.links();
        if links.contains_key(&host.name) {
            return Err(HostError::Exists(host.name));
        }
        let mut configs: Vec<HostConfig> = links.values().map(|l| l.config.clone()).collect();
        configs.push(host.clone());
        config::save(&self.inner.home, &configs).map_err(HostError::Store)?;
        let link = Link::start(
            host.clone(),
            self.inner.events.clone(),
            self.is_local(),
            self.deliver(&host.name),
            self.gate(),
            self.activity(),
            self.spend(&host.name),
        );
        links.insert(host.name, link);
        drop(links);
        Ok(self.list())
    }

    /// Forgets a host and closes its link; its agents go on running on their own daemon.
    pub(crate) fn remove(&self, name: &str) -> Result<Vec<HostInfo>, HostError> {
        let mut links = self.links();
        if !links.contains_key(name) {
            return Err(HostError::Unknown(name.to_string()));
        }
        let configs: Vec<HostConfig> = links
            .values()
            .filter(|l| l.config.name != name)
            .map(|l| l.config.clone())
            .collect();
        config::save(&self.inner.home, &configs).map_err(HostError::Store)?;
        if let Some(link) = links.remove(name) {
            link.close();
        }
        self.inner.parents.forget_host(name);
        drop(links);
        // Its agents' spend no longer counts here.
        budgets::counted(&self.inner, name, drover_core::RemoteSpend::new());
        Ok(self.list())
    }

    /// Where the request `text` goes: to the host that holds the agent, workspace, job or
    /// schedule it names, or the one a `create_agent` asks for. `text` is only parsed when a
    /// host is configured. An id `local` says this daemon holds is never sent away (a host
    /// that reported the same id gets nothing meant for this machine); a remote job's or
    /// schedule's id carries its host (`job-3@box`, see [`mark`]).
    pub(crate) fn route(
        &self,
        text: &str,
        local: impl Fn(&str, &str) -> bool,
    ) -> Result<Route, HostError> {
        if !self.any() {
            return Ok(Route::Local);
        }
        let Ok(mut message) = serde_json::from_str::<Value>(text) else {
            return Ok(Route::Local);
        };
        // A client message is one flat object: its type and its fields.
        let Some(payload) = message.as_object_mut() else {
            return Ok(Route::Local);
        };
        // A subagent of one of this daemon's agents on a host is made here (see
        // `ops::remote`): its parent must know of it.
        let parent_here = payload
            .get("parentAgentId")
            .and_then(Value::as_str)
            .is_some_and(|id| local("parentAgentId", id));
        if !parent_here && let Some(host) = payload.remove("host") {
            let Some(name) = host.as_str() else {
                return Ok(Route::Local);
            };
            return match name {
                "local" => Ok(Route::Local),
                "auto" => match self.place() {
                    Some(host) => Ok(Route::Remote { host, message }),
                    None => Ok(Route::Local),
                },
                name => {
                    self.link(name)?;
                    Ok(Route::Remote {
                        host: name.to_string(),
                        message,
                    })
                }
            };
        }
        let kind = payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if matches!(kind, "list_jobs" | "list_schedules")
            && payload.get("agentId").is_none_or(Value::is_null)
        {
            return Ok(Route::Everywhere { message });
        }
        for key in ["jobId", "scheduleId"] {
            let Some((id, host)) = payload
                .get(key)
                .and_then(Value::as_str)
                .and_then(|id| id.rsplit_once('@'))
                .map(|(id, host)| (id.to_string(), host.to_string()))
            else {
                continue;
            };
            self.link(&host)?;
            match kind {
                "follow_job" => return Ok(Route::FollowJob { host, job: id }),
                // The session's follow of it, by the id the client gave.
                "unfollow_job" => return Ok(Route::Local),
                _ => {}
            }
            payload.insert(key.into(), Value::String(id));
            return Ok(Route::Remote { host, message });
        }
        for key in ["agentId", "parentAgentId", "workspaceId"] {
            let Some(id) = payload.get(key).and_then(Value::as_str) else {
                continue;
            };
            if local(key, id) {
                return Ok(Route::Local);
            }
            let links = self.links();
            if let Some(link) = links.values().find(|link| link.holds(key, id)) {
                let host = link.config.name.clone();
                drop(links);
                return Ok(Route::Remote { host, message });
            }
        }
        Ok(Route::Local)
    }

    /// The host a request names: `None` for this machine (`local`, or `auto` finding the most
    /// room here).
    pub(crate) fn resolve(&self, name: &str) -> Result<Option<String>, HostError> {
        match name {
            "local" => Ok(None),
            "auto" => Ok(self.place()),
            name => {
                self.link(name)?;
                Ok(Some(name.to_string()))
            }
        }
    }

    /// `--host auto`: the reachable host with the most free `max_live` slots (its ceiling less
    /// its live runtimes; no ceiling is unlimited), this machine included (`None`, also on a
    /// tie).
    fn place(&self) -> Option<String> {
        let free = |max: Option<u32>, live: u32| -> i64 {
            max.map_or(i64::from(u32::MAX), |m| i64::from(m) - i64::from(live))
        };
        let mut best: Option<(i64, Option<String>)> = None;
        for info in self.list() {
            if info.state != HostState::Reachable {
                continue;
            }
            let slots = free(info.max_live, info.live);
            if best.as_ref().is_none_or(|(b, _)| slots > *b) {
                best = Some((slots, Some(info.name)));
            }
        }
        let runtimes = &self.inner.runtimes;
        let local = free(
            runtimes
                .runtime_settings()
                .max_live
                .and_then(|n| u32::try_from(n).ok()),
            u32::try_from(runtimes.live_count()).unwrap_or(u32::MAX),
        );
        match best {
            Some((slots, name)) if slots > local => name,
            _ => None,
        }
    }

    fn link(&self, name: &str) -> Result<Arc<Link>, HostError> {
        self.links()
            .get(name)
            .cloned()
            .ok_or_else(|| HostError::Unknown(name.to_string()))
    }

    /// Sends `message` to `host`'s daemon and waits for its answer, which is marked with the
    /// host and carries the client's own `requestId`.
    pub(crate) async fn forward(&self, host: &str, message: Value) -> Result<Value, HostError> {
        self.link(host)?.request(message).await
    }

    /// `message` asked of every reachable host (each answer marked with its host); the
    /// hosts that did not answer are left out.
    pub(crate) async fn ask_all(&self, message: &Value) -> Vec<Value> {
        let links: Vec<Arc<Link>> = self
            .links()
            .values()
            .filter(|link| link.info().state == HostState::Reachable)
            .cloned()
            .collect();
        let asked = links.iter().map(|link| link.request(message.clone()));
        futures_util::future::join_all(asked)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .collect()
    }

    /// This daemon's `agent` has an agent made on `host` that reports to it (a subagent, or
    /// one that tells it how its first turn went): remembered before the host is asked, so
    /// that archiving `agent` asks that host even after a restart, and its notices are taken.
    /// The host's answer is told with [`Hosts::parent_answered`].
    pub(crate) fn will_parent(&self, host: &str, agent: AgentId) -> Result<(), HostError> {
        self.link(host)?;
        self.inner
            .parents
            .add(host, agent)
            .map_err(HostError::Store)
    }

    /// What a new subagent on a host of this daemon's `parent` may spend with its subtree there
    /// under each budget of `parent`'s lineage here (see `budgets`): given with its creation, so
    /// its host holds it to them from its first turn on.
    pub(crate) fn allowances(&self, parent: AgentId) -> Vec<drover_core::Budget> {
        budgets::allowances(&self.inner, parent, &drover_core::Spend::default())
    }

    /// `host` answered the creation [`Hosts::will_parent`] announced: `made` unless it refused.
    pub(crate) fn parent_answered(&self, host: &str, agent: AgentId, made: bool) {
        self.inner.parents.answered(host, agent, made);
    }

    /// The unarchived subagents other hosts hold of the agents in `tree` (this daemon's
    /// `agent` and its descendants), each with its host, as those hosts say now. Refused when
    /// a host that holds some, or was ever given one, is not reachable: an archive is never
    /// answered from what a host said before it went away.
    pub(crate) async fn subagents_of(
        &self,
        agent: AgentId,
        tree: &HashSet<AgentId>,
    ) -> Result<Vec<(String, AgentId)>, HostError> {
        let given = self.inner.parents.hosts_of(tree);
        let links: Vec<(String, Arc<Link>)> = self
            .links()
            .iter()
            .map(|(name, link)| (name.clone(), link.clone()))
            .collect();
        let mut found = Vec::new();
        for (name, link) in links {
            if given.contains(&name) {
                // A link still being made (a hub just started) is waited for, bounded.
                link.settled().await;
            }
            let children = link.children_of(tree);
            if children.is_empty() && !given.contains(&name) {
                continue;
            }
            let info = link.info();
            if info.state != HostState::Reachable {
                return Err(HostError::Unreachable {
                    name: name.clone(),
                    since: info.since,
                    why: format!(
                        "{}; agent `{agent}` has subagents there, and archiving it now would leave them running unseen: archive it once the host is back, or remove the host",
                        info.error.as_deref().unwrap_or("the link is down")
                    ),
                });
            }
            found.extend(children.into_iter().map(|id| (name.clone(), id)));
        }
        Ok(found)
    }

    /// The unarchived subagents of this daemon's `parent` on other hosts (`AgentInfo`s with
    /// `host`), as the hosts last said.
    pub(crate) fn subagents(&self, parent: AgentId) -> Vec<Value> {
        self.links()
            .values()
            .flat_map(|link| link.children_info(parent))
            .collect()
    }

    /// The agents in `tree` were archived with their subagents on every host.
    pub(crate) fn archived(&self, tree: &HashSet<AgentId>) {
        self.inner.parents.forget(tree);
    }

    /// The agent of this daemon that a host's agent `id` was made for (its parent here), if
    /// any: the only one its notices reach.
    pub(crate) fn upstream_of(&self, id: AgentId) -> Option<AgentId> {
        let links = self.links();
        let link = links.values().find(|link| link.holds_agent(id))?;
        link.parent_of(id)
            .filter(|parent| !link.holds_agent(*parent))
    }

    /// The host holding `id` (not this daemon's), and the first of this daemon's agents its
    /// lineage reaches there, if any: who may control it.
    pub(crate) fn holder(&self, id: AgentId) -> Option<(String, Option<AgentId>)> {
        let links = self.links();
        let (name, link) = links.iter().find(|(_, link)| link.holds_agent(id))?;
        Some((name.clone(), link.upstream(id)))
    }

    /// Appends the remote agents (archived ones if asked) to a JSON array being written,
    /// `first` saying whether it has none yet.
    pub(crate) fn push_agents(&self, out: &mut String, include_archived: bool, mut first: bool) {
        for link in self.links().values() {
            first = link.push_agents(out, include_archived, first);
        }
    }

    /// The remote workspaces, encoded.
    pub(crate) fn workspaces(&self) -> Vec<Value> {
        self.links()
            .values()
            .flat_map(|link| link.workspaces())
            .collect()
    }
}

/// Sets `host` on every agent and workspace a message carries (its `payload`'s `agent`,
/// `info`, `workspace`, `agents` and `workspaces`), and makes its job and schedule ids the
/// hub's (`job-3` of host `box` is `job-3@box`: each daemon numbers its own).
pub(crate) fn mark(message: &mut Value, host: &str) {
    let Some(payload) = message.get_mut("payload").and_then(Value::as_object_mut) else {
        return;
    };
    let suffix = |id: &mut Value| {
        if let Value::String(id) = id
            && !id.contains('@')
        {
            id.push('@');
            id.push_str(host);
        }
    };
    for key in ["jobId", "scheduleId"] {
        if let Some(id) = payload.get_mut(key) {
            suffix(id);
        }
    }
    for key in ["job", "schedule"] {
        if let Some(id) = payload.get_mut(key).and_then(|o| o.get_mut("id")) {
            suffix(id);
        }
    }
    for key in ["jobs", "schedules"] {
        if let Some(Value::Array(items)) = payload.get_mut(key) {
            for item in items {
                if let Some(id) = item.get_mut("id") {
                    suffix(id);
                }
            }
        }
    }
    for key in ["agent", "info", "workspace"] {
        if let Some(Value::Object(object)) = payload.get_mut(key) {
            object.insert("host".into(), Value::String(host.to_string()));
        }
    }
    for key in ["agents", "workspaces"] {
        if let Some(Value::Array(items)) = payload.get_mut(key) {
            for item in items {
                if let Value::Object(object) = item {
                    object.insert("host".into(), Value::String(host.to_string()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use drover_core::{AgentId, RemoteSpend, Spend};
    use drover_protocol::HostConfig;

    use super::{Hosts, budgets, config};

    #[tokio::test]
    async fn a_report_counted_after_its_hosts_removal_counts_nothing() {
        let home = tempfile::tempdir().expect("tempdir");
        let providers = drover_acp::Providers::load(home.path()).expect("providers");
        let (runtimes, registry, _) =
            drover_acp::RuntimeManager::open(home.path(), providers, drover_acp::no_mcp_servers())
                .await
                .expect("runtimes");
        // A host whose link never answers: only what is counted here matters.
        let host = HostConfig {
            name: "b".to_string(),
            ssh: None,
            identity: None,
            ssh_options: Vec::new(),
            command: Some(vec!["sleep".to_string(), "60".to_string()]),
        };
        config::save(home.path(), &[host]).expect("hosts.json");
        let hosts = Hosts::open(home.path(), &runtimes).expect("hosts");
        let (parent, kid) = (AgentId::new(), AgentId::new());
        let report = |tokens: u64| {
            RemoteSpend::from([(
                parent,
                vec![(
                    kid,
                    Spend {
                        tokens: Some(tokens),
                        ..Spend::default()
                    },
                )],
            )])
        };
        // Reported again and again, it is counted once: the registry holds 1500, not 3000.
        budgets::counted(&hosts.inner, "b", report(1500));
        budgets::counted(&hosts.inner, "b", report(1500));
        assert!(registry.set_remote_spend("b", report(1500)).is_empty());
        // The link took in one more report as `remove` took the host out; counted after the
        // removal, it brings nothing back.
        hosts.remove("b").expect("removed");
        budgets::counted(&hosts.inner, "b", report(1600));
        assert!(
            registry
                .set_remote_spend("b", RemoteSpend::new())
                .is_empty(),
            "a removed host's late report was counted"
        );
        runtimes.shutdown().await;
    }
}
