//! Notifications: what needs the user, sent to the sinks of `[notify]` in `config.toml`
//! (a webhook, an ntfy topic, a command) while nobody watches.
//!
//! The events come from the registry's change stream, the one the WebSocket hub announces
//! `agent_status` from: an agent whose attention became `finished`, `error`, `permission`,
//! `auth_required`, and the agents boot found `interrupted`. By default only roots are told
//! about, and a subagent's need (a permission, a sign-in) is told once as its root's, until
//! every subagent of that root with that need has had it answered. Nothing is sent for an
//! agent a connected client shows (`watching`, sent by the web UI and `drover attach`), or
//! for a subagent whose root one shows. A sink with `all = true` gets every agent's own
//! events instead, watched or not.
//!
//! - [`config`]: the `[notify]` section.
//! - [`sink`]: one task per sink: queue, limit and summary, retries, delivery.

pub(crate) mod config;
pub(crate) mod sink;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use drover_core::{Agent, AgentId, Attention, AttentionReason, Change, Registry};
use jiff::Timestamp;
use tokio::sync::broadcast;

pub(crate) use config::{EventKind, NotifyConfig};
use sink::{Notice, Sink, SinkStatus, SubagentRef};

/// The notifier: its sinks and what clients watch.
#[derive(Clone, Debug)]
pub(crate) struct Notifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sinks: Vec<Sink>,
    /// The agent each connected session shows, by session id.
    watching: Mutex<HashMap<String, AgentId>>,
    /// The web UI's address, for links.
    web_url: String,
    /// Set at shutdown: the task that watches the registry ends.
    stop: tokio::sync::watch::Sender<bool>,
}

/// A sink as `notify_status` reports it.
#[derive(Debug)]
pub(crate) struct SinkReport {
    pub(crate) name: String,
    pub(crate) kind: drover_protocol::SinkKind,
    pub(crate) target: String,
    pub(crate) events: Vec<EventKind>,
    pub(crate) all: bool,
    pub(crate) status: SinkStatus,
}

/// The needs a subagent raises to its root.
const ROLLED_UP: [EventKind; 3] = [
    EventKind::Permission,
    EventKind::AuthRequired,
    EventKind::Limited,
];

impl Notifier {
    /// Starts the sinks and the task that turns `registry`'s changes into notifications;
    /// `interrupted` are the agents boot found busy. `daemon_url` is the link base unless the
    /// config names another.
    pub(crate) fn start(
        config: NotifyConfig,
        daemon_url: &str,
        home: &Path,
        registry: &Registry,
        interrupted: Vec<AgentId>,
    ) -> Notifier {
        let sinks = config
            .sinks
            .into_iter()
            .map(|s| Sink::start(s, home.to_path_buf()))
            .collect::<Vec<_>>();
        if !sinks.is_empty() {
            tracing::info!(sinks = sinks.len(), "notifications on");
        }
        let notifier = Notifier {
            inner: Arc::new(Inner {
                sinks,
                watching: Mutex::default(),
                web_url: config.web_url.unwrap_or_else(|| daemon_url.to_string()),
                stop: tokio::sync::watch::channel(false).0,
            }),
        };
        if !notifier.inner.sinks.is_empty() {
            let changes = registry.subscribe();
            let stop = notifier.inner.stop.subscribe();
            let tree = Tree::new(registry.clone(), notifier.clone());
            tokio::spawn(tree.run(changes, stop, interrupted));
        }
        notifier
    }

    /// No more notifications: what stopping the daemon does to its agents is not news. The
    /// sinks finish what they are delivering and end with the daemon.
    pub(crate) fn shutdown(&self) {
        self.inner.stop.send_replace(true);
    }

    /// Session `session` shows `agent` now (`None`: nothing).
    pub(crate) fn set_watching(&self, session: &str, agent: Option<AgentId>) {
        let mut watching = self.watching();
        match agent {
            Some(agent) => {
                watching.insert(session.to_string(), agent);
            }
            None => {
                watching.remove(session);
            }
        }
    }

    fn is_watched(&self, agent: AgentId) -> bool {
        self.watching().values().any(|a| *a == agent)
    }

    fn watching(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentId>> {
        self.inner
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn report(&self) -> Vec<SinkReport> {
        self.inner
            .sinks
            .iter()
            .map(|s| SinkReport {
                name: s.config.name.clone(),
                kind: s.config.target.kind(),
                target: s.config.target.describe(),
                events: s.config.events.iter().copied().collect(),
                all: s.config.all,
                status: s.snapshot(),
            })
            .collect()
    }

    /// Sends a sample to the sink named `name` (every sink: `None`), each through its queue,
    /// and waits for each outcome. `Err`: no such sink, or none at all.
    pub(crate) async fn test(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<(String, Result<(), String>)>, String> {
        let names = || {
            self.inner
                .sinks
                .iter()
                .map(|s| s.config.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.inner.sinks.is_empty() {
            return Err(
                "no notification sinks: add a [[notify.sink]] to config.toml and restart the daemon"
                    .to_string(),
            );
        }
        let chosen: Vec<&Sink> = self
            .inner
            .sinks
            .iter()
            .filter(|s| name.is_none_or(|n| n == s.config.name))
            .collect();
        if chosen.is_empty() {
            return Err(format!(
                "no sink named `{}`; the sinks are: {}",
                name.unwrap_or_default(),
                names()
            ));
        }
        let tests = chosen.into_iter().map(|sink| async move {
            let notice = Notice {
                kind: EventKind::Test,
                event: EventKind::Test.as_str(),
                agent_id: None,
                title: None,
                provider: None,
                message: format!(
                    "A test notification from drover to the sink `{}`",
                    sink.config.name
                ),
                url: Some(format!("{}/", self.inner.web_url)),
                at: Timestamp::now().to_string(),
                subagent: None,
                held: None,
            };
            (sink.config.name.clone(), sink.test(notice).await)
        });
        Ok(futures_util::future::join_all(tests).await)
    }

    fn offer(&self, notice: &Notice, all: bool) {
        for sink in &self.inner.sinks {
            if sink.config.all == all && sink.config.events.contains(&notice.kind) {
                sink.offer(notice.clone());
            }
        }
    }
}

/// What the notifier task keeps to tell a new need from one already told.
struct Tree {
    registry: Registry,
    notifier: Notifier,
    /// Each agent's attention as last seen.
    seen: HashMap<AgentId, Option<Attention>>,
    /// The subagents whose need was told as their root's and is not answered yet, by root and
    /// need: a root's need is told again only once this is empty.
    pending: HashMap<(AgentId, EventKind), HashSet<AgentId>>,
}

impl Tree {
    fn new(registry: Registry, notifier: Notifier) -> Tree {
        let mut tree = Tree {
            registry,
            notifier,
            seen: HashMap::new(),
            pending: HashMap::new(),
        };
        tree.reseed();
        tree
    }

    /// Takes every agent's attention as seen (at start, and after missing events).
    fn reseed(&mut self) {
        self.seen = self
            .registry
            .agents()
            .into_iter()
            .map(|a| (a.id, a.attention))
            .collect();
    }

    async fn run(
        mut self,
        mut changes: broadcast::Receiver<drover_core::RegistryEvent>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        interrupted: Vec<AgentId>,
    ) {
        for id in interrupted {
            if let Some(agent) = self.registry.get(id) {
                self.raise(&agent, EventKind::Interrupted);
            }
        }
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = stop.wait_for(|stopped| *stopped) => return,
            };
            match change {
                Ok(event) => match &event.change {
                    // What a new record says (an import's `finished`, `interrupted`) is its
                    // history, not news.
                    Change::AgentCreated(agent) => {
                        self.seen.insert(agent.id, agent.attention);
                    }
                    Change::AgentUpdated(agent) => self.on_agent(agent),
                    _ => {}
                },
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "notifications: missed registry events");
                    self.reseed();
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn on_agent(&mut self, agent: &Agent) {
        let before = self.seen.insert(agent.id, agent.attention).flatten();
        let reason = agent.attention.map(|a| a.reason);
        if agent.is_archived() || before.map(|a| a.reason) != reason {
            // Whatever it needed before is over (answered, or replaced by another need).
            for waiting in self.pending.values_mut() {
                waiting.remove(&agent.id);
            }
        }
        if agent.is_archived() {
            return;
        }
        let Some(attention) = agent.attention else {
            return;
        };
        if before == Some(attention) {
            return;
        }
        let kind = match attention.reason {
            AttentionReason::Finished => EventKind::Finished,
            AttentionReason::Error => EventKind::Failed,
            AttentionReason::Permission => EventKind::Permission,
            AttentionReason::AuthRequired => EventKind::AuthRequired,
            AttentionReason::Interrupted => EventKind::Interrupted,
            AttentionReason::Limited => EventKind::Limited,
            // Shown on the agent (`drover ls`, the UI); no notification is sent for it.
            AttentionReason::BudgetWarning => return,
        };
        self.raise(agent, kind);
    }

    /// A new need of `agent`: its own notice to the sinks that want everything, and to the
    /// others a root's notice, unless someone watches.
    fn raise(&mut self, agent: &Agent, kind: EventKind) {
        let notifier = &self.notifier;
        let own = self.notice(agent, kind, None);
        notifier.offer(&own, true);
        let root = self.registry.ancestors(agent.id).last().copied();
        let Some(root) = root else {
            if !notifier.is_watched(agent.id) {
                notifier.offer(&own, false);
            }
            return;
        };
        if !ROLLED_UP.contains(&kind) {
            // A subagent's turn ends and failures are its parent's to handle.
            return;
        }
        let waiting = self.pending.entry((root, kind)).or_default();
        let first = waiting.is_empty();
        waiting.insert(agent.id);
        if !first || notifier.is_watched(agent.id) || notifier.is_watched(root) {
            return;
        }
        if let Some(root) = self.registry.get(root) {
            let rolled = self.notice(&root, kind, Some(agent));
            self.notifier.offer(&rolled, false);
        }
    }

    fn notice(&self, agent: &Agent, kind: EventKind, subagent: Option<&Agent>) -> Notice {
        let name = display_name(agent);
        let message = match (kind, subagent) {
            (EventKind::Permission, Some(_)) => format!("{name}: a subagent needs permission"),
            (EventKind::AuthRequired, Some(_)) => {
                format!("{name}: a subagent needs its provider signed in")
            }
            (EventKind::Finished, _) => format!("{name} finished its turn"),
            (EventKind::Failed, _) if agent.start_failure.is_some() => {
                format!("{name} could not start")
            }
            (EventKind::Failed, _) => format!("{name} failed"),
            (EventKind::Permission, None) => format!("{name} needs permission"),
            (EventKind::AuthRequired, None) => {
                format!("{name} needs its provider ({}) signed in", agent.provider)
            }
            (EventKind::Interrupted, _) => {
                format!("{name} was interrupted: the daemon stopped during its turn")
            }
            (EventKind::Limited, Some(_)) => {
                format!("{name}: a subagent waits for its provider's usage limit")
            }
            (EventKind::Limited, None) => {
                format!("{name} waits for its provider's usage limit")
            }
            (EventKind::Summary | EventKind::Test, _) => name.clone(),
        };
        Notice {
            kind,
            event: kind.as_str(),
            agent_id: Some(agent.id.to_string()),
            title: Some(name),
            provider: Some(agent.provider.clone()),
            message,
            url: Some(format!(
                "{}/#agent={}",
                self.notifier.inner.web_url, agent.id
            )),
            at: Timestamp::now().to_string(),
            subagent: subagent.map(|s| SubagentRef {
                agent_id: s.id.to_string(),
                title: s.title.clone(),
            }),
            held: None,
        }
    }
}

/// The agent's title, else the start of its id.
fn display_name(agent: &Agent) -> String {
    match agent.title.as_deref().map(str::trim) {
        Some(title) if !title.is_empty() => title.chars().take(80).collect(),
        _ => agent.id.to_string().chars().take(8).collect(),
    }
}
