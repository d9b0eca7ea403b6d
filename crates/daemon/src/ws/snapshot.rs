//! Cached snapshots: each agent's `AgentInfo` kept encoded, so that `session_state` is the
//! concatenation of those encodings instead of a serialization of every record.
//!
//! The hub keeps the cache: it fills it at start, and replaces an agent's entry when it
//! handles that agent's registry event, before the event goes out. A session subscribes to
//! the hub before it reads the cache, so whatever its snapshot missed reaches it as an event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use drover_acp::LiveSession;
use drover_core::{Agent, AgentId};
use drover_protocol::DaemonMessage;
use drover_protocol::answers;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::ops::Ops;
use crate::ops::agents::AgentScope;
use crate::wire;

/// One agent's encoded `AgentInfo`.
struct Cached {
    archived: bool,
    /// The live session's settings it was encoded with: a snapshot re-encodes an agent whose
    /// settings changed since (an announcement lost to a lagging hub).
    settings: Option<LiveSession>,
    json: Box<str>,
}

/// Every agent's encoded `AgentInfo`, in id (creation) order, as `list_agents` orders them.
#[derive(Clone, Default)]
pub(crate) struct AgentCache {
    entries: Arc<Mutex<BTreeMap<AgentId, Cached>>>,
}

impl AgentCache {
    /// Encodes every agent the registry has.
    pub(crate) fn fill(&self, ops: &Ops) {
        for agent in ops.list_agents(AgentScope::All, true) {
            self.put(&agent, ops);
        }
    }

    /// Encodes `agent` as clients see it now, keeps it, and returns the encoding (for the
    /// `agent_status` that announces it).
    pub(crate) fn put(&self, agent: &Agent, ops: &Ops) -> String {
        let settings = ops.live_session(agent.id);
        let info = wire::agent_info(agent, settings.clone(), &ops.runtime(agent.id), None);
        // Our own types always serialize.
        let json = serde_json::to_string(&info).unwrap_or_default();
        self.lock().insert(
            agent.id,
            Cached {
                archived: agent.is_archived(),
                settings,
                json: json.clone().into_boxed_str(),
            },
        );
        json
    }

    /// The `session_state` message: every agent (archived ones if asked) and every workspace.
    pub(crate) fn session_state(&self, ops: &Ops, include_archived: bool) -> Utf8Bytes {
        // Workspaces are few; they are encoded afresh (archived ones too, as before
        // `list_workspaces` existed).
        let mut workspaces =
            serde_json::to_string(&super::requests::workspace_infos(ops, true)).unwrap_or_default();
        // Other hosts' workspaces after this machine's.
        for remote in ops.hosts.workspaces() {
            workspaces.pop();
            if workspaces.len() > 1 {
                workspaces.push(',');
            }
            workspaces.push_str(&remote.to_string());
            workspaces.push(']');
        }
        let mut out = String::new();
        out.push_str(r#"{"type":"session_state","payload":{"agents":"#);
        self.push_agents(ops, include_archived, &mut out, workspaces.len() + 64);
        out.push_str(r#","workspaces":"#);
        out.push_str(&workspaces);
        let hosts = ops.hosts.list();
        if !hosts.is_empty() {
            out.push_str(r#","hosts":"#);
            out.push_str(&serde_json::to_string(&hosts).unwrap_or_default());
        }
        out.push_str("}}");
        Utf8Bytes::from(out)
    }

    /// The answer to `list_agents`: the same encodings as `session_state`'s.
    pub(crate) fn agents_message(
        &self,
        ops: &Ops,
        request_id: Option<String>,
        include_archived: bool,
    ) -> Utf8Bytes {
        // The message with no agents, then the agents in its place: whatever else it says
        // (the request id) is encoded by its own type.
        let empty = serde_json::to_string(&DaemonMessage::answer(
            request_id,
            answers::Agents { agents: Vec::new() },
        ))
        .unwrap_or_default();
        let Some(at) = empty.find(r#""agents":[]"#) else {
            return Utf8Bytes::from(empty);
        };
        let at = at + r#""agents":"#.len();
        let mut out = String::new();
        out.push_str(&empty[..at]);
        self.push_agents(ops, include_archived, &mut out, empty.len());
        out.push_str(&empty[at + 2..]);
        Utf8Bytes::from(out)
    }

    /// Appends the JSON array of every agent (archived ones if asked) to `out`, reserving
    /// `more` bytes beyond it.
    fn push_agents(&self, ops: &Ops, include_archived: bool, out: &mut String, more: usize) {
        let stale: Vec<AgentId> = self
            .lock()
            .iter()
            .filter(|(id, cached)| ops.live_session(**id) != cached.settings)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Ok(agent) = ops.agent(id) {
                self.put(&agent, ops);
            }
        }
        let entries = self.lock();
        let agents: usize = entries.values().map(|c| c.json.len() + 1).sum();
        // One allocation of the final size: a growing buffer would leave freed copies of
        // every size it passed through.
        out.reserve_exact(agents + more + 2);
        out.push('[');
        let mut first = true;
        for cached in entries.values().filter(|c| include_archived || !c.archived) {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&cached.json);
        }
        drop(entries);
        ops.hosts.push_agents(out, include_archived, first);
        out.push(']');
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<AgentId, Cached>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
