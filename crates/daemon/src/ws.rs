//! The client protocol over WebSocket (`/ws`): handshake, lazy agent initialization, the
//! `agent_status` / `agent_update` / `workspace_update` streams, and the requests.
//!
//! Events are turned into JSON once, by the hub, and fanned out to every session through a
//! broadcast channel. A session that falls behind (its socket is slow) lags on that channel:
//! it is told `resync_required` and must re-initialize, while the daemon and the other
//! sessions go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, close_code};
use drover_acp::{AcpError, PermissionAnswer, PermissionChoice, RuntimeManager, TimelineEvent};
use drover_core::inbox::Delivery;
use drover_core::timeline::Page;
use drover_core::{
    AgentId, ArchiveOptions, CancelCause, Change, NewAgent, PermissionPolicy, ProviderConfig,
    Registry, RegistryError, RegistryEvent, WorkspaceId,
};
use drover_protocol::{
    ClientMessage, DaemonMessage, PROTOCOL_VERSION, ProviderInfo, decode_client,
};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use crate::wire;

/// How many serialized events a session may fall behind before it must resync.
const HUB_CAPACITY: usize = 4096;
/// Answers waiting to be written to one session's socket.
const REPLY_CAPACITY: usize = 256;
/// Timeline items in `agent_initialized` unless the client asks for another number.
const DEFAULT_HISTORY: usize = 200;
const MAX_PAGE: usize = 1000;

/// One event, serialized once for every session.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// `Some` for `agent_update`: only sessions that initialized this agent get it.
    agent: Option<AgentId>,
    revision: u64,
    text: Utf8Bytes,
}

/// Fans registry and runtime events out to sessions.
#[derive(Clone)]
pub(crate) struct Hub {
    tx: broadcast::Sender<Arc<Outgoing>>,
}

impl Hub {
    pub(crate) fn start(registry: &Registry, runtimes: &RuntimeManager) -> Hub {
        let (tx, _) = broadcast::channel(HUB_CAPACITY);
        let hub = Hub { tx };
        let mut changes = registry.subscribe();
        let mut timelines = runtimes.subscribe();
        let out = hub.tx.clone();
        let (registry, runtimes) = (registry.clone(), runtimes.clone());
        tokio::spawn(async move {
            loop {
                let outgoing = tokio::select! {
                    change = changes.recv() => match change {
                        Ok(event) => status_message(&event, &registry, &runtimes),
                        Err(broadcast::error::RecvError::Lagged(n)) => Some(resync(format!("the daemon dropped {n} registry events"))),
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    update = timelines.recv() => match update {
                        Ok(event) => Some(update_message(&event)),
                        Err(broadcast::error::RecvError::Lagged(n)) => Some(resync(format!("the daemon dropped {n} timeline updates"))),
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                };
                if let Some(outgoing) = outgoing {
                    let _ = out.send(Arc::new(outgoing));
                }
            }
        });
        hub
    }
}

fn encode(message: &DaemonMessage) -> Utf8Bytes {
    // Our own types always serialize.
    Utf8Bytes::from(serde_json::to_string(message).unwrap_or_default())
}

fn resync(reason: String) -> Outgoing {
    Outgoing {
        agent: None,
        revision: 0,
        text: encode(&DaemonMessage::ResyncRequired { reason }),
    }
}

fn status_message(
    event: &RegistryEvent,
    registry: &Registry,
    runtimes: &RuntimeManager,
) -> Option<Outgoing> {
    let message = match &event.change {
        Change::AgentCreated(agent) | Change::AgentUpdated(agent) => DaemonMessage::AgentStatus {
            agent: wire::agent_info(agent, runtimes),
        },
        Change::WorkspaceRegistered(ws) => DaemonMessage::WorkspaceUpdate {
            workspace: Some(wire::workspace_info(ws, registry.workspace_activity(ws.id))),
            workspace_id: ws.id.to_string(),
            activity: wire::bucket(registry.workspace_activity(ws.id)),
        },
        Change::WorkspaceActivity(change) => DaemonMessage::WorkspaceUpdate {
            workspace: None,
            workspace_id: change.workspace_id.to_string(),
            activity: wire::bucket(change.activity),
        },
    };
    Some(Outgoing {
        agent: None,
        revision: 0,
        text: encode(&message),
    })
}

fn update_message(event: &TimelineEvent) -> Outgoing {
    Outgoing {
        agent: Some(event.agent_id),
        revision: event.revision,
        text: encode(&DaemonMessage::AgentUpdate(wire::update(event))),
    }
}

/// What one session shares with the daemon.
#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) registry: Registry,
    pub(crate) runtimes: RuntimeManager,
    pub(crate) hub: Hub,
    /// Required in `hello` when the daemon listens beyond loopback.
    pub(crate) token: Option<Arc<str>>,
}

/// What a request handler hands back to the session loop.
enum Reply {
    Send(DaemonMessage),
    /// `agent_initialized`: send it, then let through only the updates newer than `revision`.
    Initialized {
        agent: AgentId,
        revision: u64,
        message: DaemonMessage,
    },
}

/// A handler's reply, and the agent whose updates the session held for it (an
/// `initialize_agent_request`).
struct Answer {
    held: Option<AgentId>,
    reply: Reply,
}

/// Which agents' updates a session gets.
///
/// An `agent_initialized` covers the timeline up to a revision, read while the hub goes on
/// broadcasting. Updates of an agent that is being initialized are therefore held (not
/// dropped) until the answer is sent; then those newer than the answer follow it, so the
/// client's history plus the updates is the timeline, with no gap and no repeat.
#[derive(Default)]
struct Subscriptions {
    /// Agent → the timeline revision its last `agent_initialized` covered.
    initialized: HashMap<AgentId, u64>,
    /// Agents not yet initialized with an `initialize_agent_request` in flight.
    pending: HashMap<AgentId, Pending>,
}

#[derive(Default)]
struct Pending {
    requests: usize,
    /// At most `HUB_CAPACITY`: more means the initialization took so long that the session
    /// must resync anyway.
    held: Vec<Arc<Outgoing>>,
}

enum Route {
    Send,
    Skip,
    /// A held queue is full: the session fell behind.
    Overflow,
}

impl Subscriptions {
    /// An `initialize_agent_request` for `agent` was received; true if its updates are held
    /// until the answer (the agent is not initialized yet).
    fn begin(&mut self, agent: AgentId) -> bool {
        if self.initialized.contains_key(&agent) {
            return false;
        }
        self.pending.entry(agent).or_default().requests += 1;
        true
    }

    fn route(&mut self, event: &Arc<Outgoing>) -> Route {
        let Some(agent) = event.agent else {
            return Route::Send;
        };
        if let Some(seen) = self.initialized.get(&agent) {
            return if event.revision > *seen {
                Route::Send
            } else {
                Route::Skip
            };
        }
        if let Some(pending) = self.pending.get_mut(&agent) {
            if pending.held.len() >= HUB_CAPACITY {
                return Route::Overflow;
            }
            pending.held.push(event.clone());
        }
        Route::Skip
    }

    /// An initialization ended: answered at `revision`, or failed (`None`). Returns the held
    /// updates to send after the answer.
    fn finish(&mut self, agent: AgentId, held: bool, revision: Option<u64>) -> Vec<Arc<Outgoing>> {
        let mut release = Vec::new();
        if held && let Some(pending) = self.pending.get_mut(&agent) {
            pending.requests = pending.requests.saturating_sub(1);
            // A failure leaves the held updates to another request in flight, if any.
            if revision.is_some() || pending.requests == 0 {
                release = std::mem::take(&mut pending.held);
            }
            if pending.requests == 0 {
                self.pending.remove(&agent);
            }
        }
        let Some(revision) = revision else {
            return Vec::new();
        };
        self.initialized.insert(agent, revision);
        release.retain(|event| event.revision > revision);
        release
    }

    /// The session fell behind: every subscription ends; the client re-initializes.
    fn reset(&mut self) {
        self.initialized.clear();
        for pending in self.pending.values_mut() {
            pending.held.clear();
        }
    }
}

/// Runs one connection until the client leaves or the daemon stops.
pub(crate) async fn session(
    mut socket: WebSocket,
    context: Context,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let session_id = uuid_v7();
    // Replaced at `hello`: events from before the `session_state` snapshot are not sent.
    let mut events = context.hub.tx.subscribe();
    let (reply_tx, mut replies) = mpsc::channel::<Answer>(REPLY_CAPACITY);
    let mut subscriptions = Subscriptions::default();
    let mut greeted = false;
    loop {
        tokio::select! {
            () = async { let _ = stop.wait_for(|s| *s).await; } => {
                let _ = socket.send(Message::Close(Some(CloseFrame { code: close_code::AWAY, reason: "the daemon is shutting down".into() }))).await;
                return;
            }
            frame = socket.recv() => {
                let text = match frame {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Binary(_))) => {
                        let error = request_error(None, "invalid_message", "binary frames are not part of the protocol; send JSON text".into(), None);
                        if socket.send(Message::Text(encode(&error))).await.is_err() { return; }
                        continue;
                    }
                    Some(Ok(Message::Close(_))) | None => return,
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        let text = e.to_string();
                        if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
                            let _ = socket.send(Message::Close(Some(CloseFrame { code: close_code::SIZE, reason: "message too big".into() }))).await;
                        }
                        return;
                    }
                };
                let message = match decode_client(&text) {
                    Ok(message) => message,
                    Err(e) => {
                        let error = request_error(e.request_id, e.code.as_str(), e.message, None);
                        if socket.send(Message::Text(encode(&error))).await.is_err() { return; }
                        continue;
                    }
                };
                if let ClientMessage::Hello { protocol_version, token, include_archived, .. } = &message {
                    if let Some(expected) = &context.token
                        && token.as_deref() != Some(expected)
                    {
                        let error = request_error(None, "unauthorized", "this daemon needs its token (the `token` file in its home) in `hello`".into(), None);
                        let _ = socket.send(Message::Text(encode(&error))).await;
                        let _ = socket.send(Message::Close(Some(CloseFrame { code: close_code::POLICY, reason: "unauthorized".into() }))).await;
                        return;
                    }
                    if *protocol_version != PROTOCOL_VERSION {
                        let error = request_error(None, "unsupported_version", format!("this daemon speaks protocol {PROTOCOL_VERSION}, not {protocol_version}"), None);
                        if socket.send(Message::Text(encode(&error))).await.is_err() { return; }
                        continue;
                    }
                    if !greeted {
                        // Subscribe before taking the snapshot: a change between the two is
                        // sent again rather than lost.
                        events = context.hub.tx.subscribe();
                        greeted = true;
                    }
                    let welcome = DaemonMessage::Welcome {
                        daemon_version: env!("CARGO_PKG_VERSION").to_string(),
                        protocol_version: PROTOCOL_VERSION,
                        session_id: session_id.clone(),
                    };
                    let state = session_state(&context, *include_archived);
                    if socket.send(Message::Text(encode(&welcome))).await.is_err()
                        || socket.send(Message::Text(encode(&state))).await.is_err()
                    {
                        return;
                    }
                    continue;
                }
                if !greeted {
                    let error = request_error(message.request_id().map(str::to_string), "hello_required", "send `hello` first".into(), None);
                    if socket.send(Message::Text(encode(&error))).await.is_err() { return; }
                    continue;
                }
                let held = match &message {
                    ClientMessage::InitializeAgentRequest { agent_id, .. } => agent_id
                        .parse::<AgentId>()
                        .ok()
                        .filter(|agent| subscriptions.begin(*agent)),
                    _ => None,
                };
                let context = context.clone();
                let reply_tx = reply_tx.clone();
                tokio::spawn(async move {
                    let reply = handle(message, &context).await;
                    let _ = reply_tx.send(Answer { held, reply }).await;
                });
            }
            Some(Answer { held, reply }) = replies.recv() => {
                let (message, release) = match reply {
                    Reply::Send(message) => {
                        if let Some(agent) = held {
                            subscriptions.finish(agent, true, None);
                        }
                        (message, Vec::new())
                    }
                    Reply::Initialized { agent, revision, message } => {
                        (message, subscriptions.finish(agent, held.is_some(), Some(revision)))
                    }
                };
                if socket.send(Message::Text(encode(&message))).await.is_err() { return; }
                for event in release {
                    if socket.send(Message::Text(event.text.clone())).await.is_err() { return; }
                }
            }
            event = events.recv(), if greeted => {
                let text = match event {
                    Ok(event) => match subscriptions.route(&event) {
                        Route::Send => event.text.clone(),
                        Route::Skip => continue,
                        Route::Overflow => {
                            subscriptions.reset();
                            encode(&DaemonMessage::ResyncRequired { reason: "this session fell behind while initializing an agent".to_string() })
                        }
                    },
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        // Too slow: drop the subscriptions; the client re-initializes.
                        subscriptions.reset();
                        encode(&DaemonMessage::ResyncRequired { reason: format!("this session fell {n} events behind") })
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if socket.send(Message::Text(text)).await.is_err() { return; }
            }
        }
    }
}

fn uuid_v7() -> String {
    drover_core::AgentId::new().to_string()
}

fn session_state(context: &Context, include_archived: bool) -> DaemonMessage {
    let agents = context
        .registry
        .agents()
        .iter()
        .filter(|a| include_archived || !a.is_archived())
        .map(|a| wire::agent_info(a, &context.runtimes))
        .collect();
    let workspaces = context
        .registry
        .workspaces()
        .iter()
        .map(|w| wire::workspace_info(w, context.registry.workspace_activity(w.id)))
        .collect();
    DaemonMessage::SessionState { agents, workspaces }
}

fn request_error(
    request_id: Option<String>,
    code: &str,
    message: String,
    details: Option<Value>,
) -> DaemonMessage {
    DaemonMessage::RequestError {
        request_id,
        code: code.to_string(),
        message,
        details,
    }
}

/// A failure, as the protocol reports it.
struct Failure {
    code: &'static str,
    message: String,
    details: Option<Value>,
}

impl From<RegistryError> for Failure {
    fn from(e: RegistryError) -> Failure {
        let details = match &e {
            RegistryError::AgentActive(report) => serde_json::to_value(report).ok(),
            _ => None,
        };
        Failure {
            code: e.code(),
            message: e.to_string(),
            details,
        }
    }
}

impl From<AcpError> for Failure {
    fn from(e: AcpError) -> Failure {
        match e {
            AcpError::Registry(e) => e.into(),
            other => Failure {
                code: other.code(),
                message: other.to_string(),
                details: None,
            },
        }
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Failure {
    Failure {
        code: "invalid_message",
        message: format!("`{field}`: {}", message.into()),
        details: None,
    }
}

fn agent_id(context: &Context, raw: &str) -> Result<AgentId, Failure> {
    let id: AgentId = raw.parse().map_err(|_| Failure {
        code: "unknown_agent",
        message: format!(
            "agent `{}` not found",
            raw.chars().take(80).collect::<String>()
        ),
        details: None,
    })?;
    if context.registry.get(id).is_none() {
        return Err(RegistryError::UnknownAgent(id.to_string()).into());
    }
    Ok(id)
}

async fn handle(message: ClientMessage, context: &Context) -> Reply {
    let request_id = message.request_id().map(str::to_string);
    match answer(message, context).await {
        Ok(reply) => reply,
        Err(f) => Reply::Send(request_error(request_id, f.code, f.message, f.details)),
    }
}

async fn answer(message: ClientMessage, context: &Context) -> Result<Reply, Failure> {
    let registry = &context.registry;
    let runtimes = &context.runtimes;
    let send = |m| Ok(Reply::Send(m));
    match message {
        // Not reached: the session loop answers every `hello` itself (a repeated one sends
        // `welcome` and `session_state` again).
        ClientMessage::Hello { .. } => send(request_error(
            None,
            "invalid_message",
            "`hello` was already sent".into(),
            None,
        )),
        ClientMessage::InitializeAgentRequest {
            agent_id: raw,
            request_id,
            limit,
        } => {
            let id = agent_id(context, &raw)?;
            runtimes.ensure_started(id).await?;
            let page = runtimes
                .timeline(
                    id,
                    Page::Tail {
                        limit: limit.unwrap_or(DEFAULT_HISTORY).min(MAX_PAGE),
                    },
                )
                .await?;
            let agent = registry
                .get(id)
                .ok_or_else(|| Failure::from(RegistryError::UnknownAgent(raw.clone())))?;
            let pending = runtimes
                .pending_permissions(id)
                .await?
                .into_iter()
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect();
            let message = DaemonMessage::AgentInitialized {
                agent_id: id.to_string(),
                info: wire::agent_info(&agent, runtimes),
                updates: page
                    .items
                    .iter()
                    .map(|i| wire::item_update(&agent, i))
                    .collect(),
                has_older: page.has_older,
                cursor: page.items.first().map(|i| i.seq),
                pending_permissions: pending,
                request_id,
            };
            Ok(Reply::Initialized {
                agent: id,
                revision: page.revision,
                message,
            })
        }
        ClientMessage::FetchTimeline {
            agent_id: raw,
            request_id,
            before,
            after,
            limit,
        } => {
            let id = agent_id(context, &raw)?;
            let limit = limit.unwrap_or(DEFAULT_HISTORY).clamp(1, MAX_PAGE);
            let page = match (before, after) {
                (Some(_), Some(_)) => {
                    return Err(invalid("before", "give `before` or `after`, not both"));
                }
                (Some(seq), None) => Page::Before { seq, limit },
                (None, Some(seq)) => Page::After { seq, limit },
                (None, None) => Page::Tail { limit },
            };
            let page = runtimes.timeline(id, page).await?;
            send(DaemonMessage::TimelinePage {
                request_id,
                agent_id: id.to_string(),
                items: page
                    .items
                    .iter()
                    .filter_map(|i| serde_json::to_value(i).ok())
                    .collect(),
                has_older: page.has_older,
                has_newer: page.has_newer,
            })
        }
        ClientMessage::CreateAgent {
            request_id,
            provider,
            cwd,
            workspace_id,
            prompt,
            title,
            model,
            mode,
            labels,
            parent_agent_id,
            auto_archive,
            permission_policy,
            worktree: _,
        } => {
            let workspace_id = match workspace_id {
                Some(raw) => Some(raw.parse::<WorkspaceId>().map_err(|_| Failure {
                    code: "unknown_workspace",
                    message: format!("workspace `{raw}` not found"),
                    details: None,
                })?),
                None => None,
            };
            let cwd = match (cwd, workspace_id) {
                (Some(cwd), _) => std::path::PathBuf::from(cwd),
                (None, Some(ws)) => registry.workspace(ws).map(|w| w.path).ok_or_else(|| {
                    Failure::from(RegistryError::UnknownWorkspace(ws.to_string()))
                })?,
                (None, None) => return Err(invalid("cwd", "give `cwd` or `workspaceId`")),
            };
            let parent = match parent_agent_id {
                Some(raw) => Some(agent_id(context, &raw)?),
                None => None,
            };
            let new = NewAgent {
                provider,
                cwd,
                workspace_id,
                title,
                labels,
                parent,
                auto_archive,
                config: ProviderConfig {
                    model,
                    mode,
                    permission_policy: match permission_policy {
                        drover_protocol::PermissionPolicy::Ask => PermissionPolicy::Ask,
                        drover_protocol::PermissionPolicy::Allow => PermissionPolicy::Allow,
                    },
                },
            };
            let agent = runtimes.create_agent(new, prompt).await?;
            send(DaemonMessage::AgentCreated {
                request_id,
                agent: wire::agent_info(&agent, runtimes),
            })
        }
        ClientMessage::SendMessage {
            request_id,
            agent_id: raw,
            text,
            delivery,
        } => {
            let id = agent_id(context, &raw)?;
            if text.trim().is_empty() {
                return Err(invalid("text", "must not be empty"));
            }
            let delivery = match delivery {
                drover_protocol::Delivery::Followup => Delivery::Followup,
                drover_protocol::Delivery::Steer => Delivery::Steer,
                drover_protocol::Delivery::Inject => Delivery::Inject,
            };
            let message_id = runtimes
                .deliver(id, delivery, text, "user".to_string())
                .await?;
            send(DaemonMessage::MessageQueued {
                request_id,
                agent_id: id.to_string(),
                message_id,
            })
        }
        ClientMessage::Cancel {
            request_id,
            agent_id: raw,
            keep_inbox,
        } => {
            let id = agent_id(context, &raw)?;
            runtimes
                .cancel_turn(id, CancelCause::User, keep_inbox)
                .await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::Archive {
            request_id,
            agent_id: raw,
            stop_activity,
        } => {
            let id = agent_id(context, &raw)?;
            let outcome = registry
                .archive(id, ArchiveOptions { stop_activity })
                .await?;
            send(DaemonMessage::Archived {
                request_id,
                agent_id: id.to_string(),
                archived: outcome.archived.iter().map(|a| a.to_string()).collect(),
                stopped: serde_json::to_value(&outcome.stopped).unwrap_or(Value::Null),
            })
        }
        ClientMessage::Unarchive {
            request_id,
            agent_id: raw,
        } => {
            let id = agent_id(context, &raw)?;
            registry.unarchive(id).await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::Detach {
            request_id,
            agent_id: raw,
        } => {
            let id = agent_id(context, &raw)?;
            registry.detach(id).await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::ArchiveIdleChildren {
            request_id,
            agent_id: raw,
        } => {
            let id = agent_id(context, &raw)?;
            let outcome = registry.archive_idle_children(id).await?;
            send(DaemonMessage::ChildrenArchived {
                request_id,
                agent_id: id.to_string(),
                archived: outcome.archived.iter().map(|a| a.to_string()).collect(),
                skipped: serde_json::to_value(&outcome.skipped).unwrap_or(Value::Null),
            })
        }
        ClientMessage::AnswerPermission {
            request_id,
            agent_id: raw,
            seq,
            kind,
            option_id,
            cancel,
        } => {
            let id = agent_id(context, &raw)?;
            let choice = match (kind, option_id, cancel) {
                (Some(kind), None, false) => PermissionChoice::Kind(kind),
                (None, Some(option), false) => PermissionChoice::OptionId(option),
                (None, None, true) => PermissionChoice::Cancel,
                _ => {
                    return Err(invalid(
                        "kind",
                        "give exactly one of `kind`, `optionId` or `cancel: true`",
                    ));
                }
            };
            runtimes
                .answer_permission(
                    id,
                    PermissionAnswer {
                        request: seq,
                        choice,
                    },
                )
                .await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::SetMode {
            request_id,
            agent_id: raw,
            mode_id,
        } => {
            let id = agent_id(context, &raw)?;
            runtimes.set_mode(id, mode_id).await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::SetModel {
            request_id,
            agent_id: raw,
            model_id,
        } => {
            let id = agent_id(context, &raw)?;
            runtimes.set_model(id, model_id).await?;
            send(DaemonMessage::Ok {
                request_id,
                agent_id: Some(id.to_string()),
            })
        }
        ClientMessage::ListProviders { request_id } => {
            let providers = runtimes.providers();
            let list = providers
                .all()
                .map(|p| {
                    let (available, detail) = match providers.availability(p) {
                        drover_acp::Availability::Available { path } => {
                            (true, path.display().to_string())
                        }
                        drover_acp::Availability::Unavailable { reason } => (false, reason),
                    };
                    ProviderInfo {
                        name: p.name.clone(),
                        label: p.label.clone(),
                        command: p.command.clone(),
                        available,
                        detail,
                    }
                })
                .collect();
            send(DaemonMessage::Providers {
                request_id,
                providers: list,
            })
        }
        ClientMessage::ListAgents {
            request_id,
            include_archived,
        } => {
            let agents = registry
                .agents()
                .iter()
                .filter(|a| include_archived || !a.is_archived())
                .map(|a| wire::agent_info(a, runtimes))
                .collect();
            send(DaemonMessage::Agents { request_id, agents })
        }
        ClientMessage::ListWorkspaces { .. }
        | ClientMessage::CreateWorktree { .. }
        | ClientMessage::GetWorktreeStatus { .. }
        | ClientMessage::ArchiveWorkspace { .. } => Err(invalid("type", "not served yet")),
        ClientMessage::WaitIdle {
            request_id,
            agent_id: raw,
            timeout_ms,
        } => {
            let id = agent_id(context, &raw)?;
            let timeout =
                Duration::from_millis(timeout_ms.unwrap_or(u64::MAX / 4).min(7 * 24 * 3600 * 1000));
            let idle = runtimes.wait_idle(id, timeout).await?;
            send(DaemonMessage::Idle {
                request_id,
                agent_id: id.to_string(),
                idle,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(agent: AgentId, revision: u64) -> Arc<Outgoing> {
        Arc::new(Outgoing {
            agent: Some(agent),
            revision,
            text: Utf8Bytes::from(format!("r{revision}")),
        })
    }

    fn revisions(events: &[Arc<Outgoing>]) -> Vec<u64> {
        events.iter().map(|e| e.revision).collect()
    }

    #[test]
    fn updates_during_initialization_are_held_then_only_newer_ones_sent() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        assert!(matches!(subs.route(&update(agent, 1)), Route::Skip));
        assert!(subs.begin(agent));
        for revision in 2..=5 {
            assert!(matches!(subs.route(&update(agent, revision)), Route::Skip));
        }
        // The answer covered revision 3: 4 and 5 follow it.
        assert_eq!(revisions(&subs.finish(agent, true, Some(3))), [4, 5]);
        assert!(matches!(subs.route(&update(agent, 6)), Route::Send));
        // Initialized already: a second request holds nothing and moves the mark.
        assert!(!subs.begin(agent));
        assert!(subs.finish(agent, false, Some(8)).is_empty());
        assert!(matches!(subs.route(&update(agent, 8)), Route::Skip));
        assert!(matches!(subs.route(&update(agent, 9)), Route::Send));
        // Status events always go.
        let status = Arc::new(Outgoing {
            agent: None,
            revision: 0,
            text: Utf8Bytes::from_static("s"),
        });
        assert!(matches!(subs.route(&status), Route::Send));
    }

    #[test]
    fn a_failed_initialization_subscribes_nothing() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        assert!(subs.begin(agent));
        assert!(subs.begin(agent));
        subs.route(&update(agent, 1));
        // One of two requests fails: the other still gets the held updates.
        assert!(subs.finish(agent, true, None).is_empty());
        assert_eq!(revisions(&subs.finish(agent, true, Some(0))), [1]);
        let other = AgentId::new();
        assert!(subs.begin(other));
        subs.route(&update(other, 1));
        assert!(subs.finish(other, true, None).is_empty());
        assert!(subs.pending.is_empty());
        assert!(matches!(subs.route(&update(other, 2)), Route::Skip));
    }

    #[test]
    fn holding_is_bounded_and_a_reset_unsubscribes() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        subs.begin(agent);
        for revision in 1..=HUB_CAPACITY as u64 {
            assert!(matches!(subs.route(&update(agent, revision)), Route::Skip));
        }
        assert!(matches!(
            subs.route(&update(agent, HUB_CAPACITY as u64 + 1)),
            Route::Overflow
        ));
        subs.reset();
        let initialized = AgentId::new();
        subs.begin(initialized);
        subs.finish(initialized, true, Some(0));
        subs.reset();
        assert!(matches!(subs.route(&update(initialized, 1)), Route::Skip));
    }
}
