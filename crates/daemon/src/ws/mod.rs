//! The client protocol over WebSocket (`/ws`): the handshake, the `agent_status` /
//! `agent_update` / `workspace_update` streams, the output of the jobs a session follows
//! (`jobs`) and of the workspace terminals it is attached to (`pty`), and the requests, which
//! `requests` hands to the operations layer.
//!
//! Events are turned into JSON once, by the hub, and fanned out to every session through a
//! broadcast channel. A session that falls behind (its socket is slow) lags on that channel:
//! it is told `resync_required` and must re-initialize, while the daemon and the other
//! sessions go on.

mod coalesce;
mod jobs;
mod join;
mod pty;
mod requests;
mod snapshot;
pub(crate) mod socket;
mod subscriptions;

use std::sync::Arc;

use drover_acp::TimelineEvent;
use drover_core::{AgentId, Change, RegistryEvent};
use drover_protocol::Answer as Envelope;
use drover_protocol::answers;
use drover_protocol::{
    ClientMessage, ClientRequest, DaemonMessage, ErrorCode, OLDEST_PROTOCOL_VERSION,
    PROTOCOL_VERSION, decode_client,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message, Utf8Bytes};

use crate::hosts::{self, RemoteEvent};
use crate::metrics::ClientMetrics;
use crate::ops::Ops;
use crate::wire;
use coalesce::{Coalescer, Joined, Ready};
use prometheus_client::metrics::counter::Counter;
use requests::Reply;
use snapshot::AgentCache;
use socket::Socket;
use subscriptions::{Route, Subscriptions};

/// How many serialized events a session may fall behind before it must resync.
const HUB_CAPACITY: usize = 4096;
/// Answers waiting to be written to one session's socket.
const REPLY_CAPACITY: usize = 256;
/// Requests one session may have in flight; past it a request is answered
/// `too_many_requests`, so no client holds memory in proportion to how much it asks.
pub(crate) const MAX_IN_FLIGHT: usize = 256;

/// What a session's socket reads at most at once. The session looks for a client frame each
/// time it wakes (for every event it writes), and tungstenite zeroes this much of its read
/// buffer before every read, even one that finds nothing: at its default (128 KiB) that was a
/// third of the daemon's CPU while 50 agents streamed to 50 clients. Requests are small; a
/// larger one takes a few reads.
pub(crate) const READ_BUFFER: usize = 4 * 1024;

/// The most ready events a session writes before it flushes the socket (and looks at its
/// other work again).
const WRITE_BATCH: usize = 256;

/// The most chunks of followed jobs' output a session writes before it flushes (and looks at
/// its other work again).
const PUSH_BATCH: usize = 8;

/// One event, serialized once for every session.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// `Some` for `agent_update`: only sessions that initialized this agent get it.
    agent: Option<AgentId>,
    revision: u64,
    text: Utf8Bytes,
    /// Set for every `append`: its chunks (several if the hub joined them, see `coalesce`).
    joined: Option<Arc<Joined>>,
    /// Set for an `agent_status`: the agent it announces.
    status_of: Option<AgentId>,
}

impl Outgoing {
    /// An event for every session, encoded once.
    fn to_all(message: &DaemonMessage) -> Outgoing {
        Outgoing {
            agent: None,
            revision: 0,
            text: encode(message),
            joined: None,
            status_of: None,
        }
    }

    /// What a session whose view of the agent's timeline is at revision `seen` is sent: the
    /// whole event, nothing (it is older), or, for joined chunks the view holds some of, the
    /// text of the rest (encoded for this session alone: rare, a snapshot taken mid-window).
    fn after(&self, seen: u64) -> Option<Utf8Bytes> {
        if self.revision <= seen {
            return None;
        }
        match &self.joined {
            Some(joined) if joined.first_revision <= seen => Some(encode(
                &DaemonMessage::AgentUpdate(wire::update(&joined.after(seen))),
            )),
            _ => Some(self.text.clone()),
        }
    }
}

/// Fans registry and runtime events out to sessions.
#[derive(Clone)]
pub(crate) struct Hub {
    tx: broadcast::Sender<Arc<Outgoing>>,
    /// Every agent's encoded `AgentInfo`, for `session_state`.
    agents: AgentCache,
    /// Clients, bytes, drops and resyncs, for `/metrics`.
    pub(crate) metrics: ClientMetrics,
    /// Sessions that are behind join what waits for them (see `join`).
    join: bool,
}

impl Hub {
    /// `window`: how long an agent's streamed text is joined before it goes out (zero: never).
    /// `join`: whether a session that is behind joins what waits for it.
    pub(crate) fn start(ops: &Ops, window: Duration, join: bool, metrics: ClientMetrics) -> Hub {
        let (tx, _) = broadcast::channel(HUB_CAPACITY);
        let hub = Hub {
            tx,
            agents: AgentCache::default(),
            metrics,
            join,
        };
        let mut changes = ops.subscribe_changes();
        let mut timelines = ops.subscribe_timelines();
        let mut runtime_changes = ops.subscribe_runtime_changes();
        let mut schedules = ops.subscribe_schedules();
        let mut schedules_open = true;
        // Filled after subscribing: a change in between is applied again by its event.
        hub.agents.fill(ops);
        let out = hub.tx.clone();
        let cache = hub.agents.clone();
        let ops_for_jobs = ops.clone();
        let ops = ops.clone();
        let dropped = hub.metrics.hub_dropped_events.clone();
        tokio::spawn(async move {
            let mut coalescer = Coalescer::new(window);
            loop {
                let next_close = coalescer.next_close();
                let mut ready = Vec::new();
                // Timelines first: an agent writes its text before its status changes, so a
                // client sees the last words before the `idle`.
                let status = tokio::select! {
                    biased;
                    update = timelines.recv() => {
                        match update {
                            Ok(event) => {
                                let now = Instant::now();
                                // A busy hub still closes windows on time.
                                if next_close.is_some_and(|t| t <= now) {
                                    ready = coalescer.close_due(now);
                                }
                                ready.extend(coalescer.push(event, now));
                            }
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                let _ = out.send(Arc::new(dropped_events(&dropped, n, "timeline updates")));
                            }
                            Err(broadcast::error::RecvError::Closed) => break,
                        }
                        None
                    },
                    change = changes.recv() => match change {
                        Ok(event) => {
                            // What the agent said goes before what became of it.
                            if let Change::AgentCreated(agent) | Change::AgentUpdated(agent) = &event.change {
                                ready = coalescer.flush_agent(agent.id);
                            }
                            Some(status_message(&event, &ops, &cache))
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => Some(dropped_events(&dropped, n, "registry events")),
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    // A runtime went cold, queued, starting or live, or will hibernate at
                    // another time: the agent's `AgentInfo` changed.
                    changed = runtime_changes.recv() => match changed {
                        Ok(id) => match ops.agent(id) {
                            Ok(agent) => {
                                ready = coalescer.flush_agent(agent.id);
                                Some(agent_status(&agent, &ops, &cache))
                            }
                            Err(_) => None,
                        },
                        Err(broadcast::error::RecvError::Lagged(n)) => Some(dropped_events(&dropped, n, "runtime changes")),
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    change = schedules.recv(), if schedules_open => match change {
                        Ok(event) => Some(schedule_message(&event)),
                        Err(broadcast::error::RecvError::Lagged(n)) => Some(dropped_events(&dropped, n, "schedule events")),
                        // Nothing more to hear (the schedules went first at shutdown).
                        Err(broadcast::error::RecvError::Closed) => {
                            schedules_open = false;
                            None
                        }
                    },
                    () = async {
                        match next_close {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        ready = coalescer.close_due(Instant::now());
                        None
                    }
                };
                for ready in ready {
                    let _ = out.send(Arc::new(ready_message(ready)));
                }
                if let Some(status) = status {
                    let _ = out.send(Arc::new(status));
                }
            }
        });
        hub.forward_jobs(&ops_for_jobs);
        hub
    }

    /// What other hosts' daemons say goes to every session as it came (marked with its host);
    /// a remote agent's updates only to sessions that opened it.
    fn forward_hosts(&self, ops: &Ops) {
        let mut remote = ops.hosts.subscribe();
        let out = self.tx.clone();
        let dropped = self.metrics.hub_dropped_events.clone();
        tokio::spawn(async move {
            loop {
                let message = match remote.recv().await {
                    Ok(RemoteEvent::Message {
                        text,
                        agent,
                        revision,
                        status_of,
                    }) => Outgoing {
                        agent,
                        revision,
                        text: Utf8Bytes::from(text.as_ref()),
                        joined: None,
                        status_of,
                    },
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        dropped_events(&dropped, n, "events from other hosts")
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                let _ = out.send(Arc::new(message));
            }
        });
    }

    /// Each notice for an agent of the hub goes to every session as `notice_queued` (the
    /// hub's link takes it; see `drover_core::outbox`).
    fn forward_notices(&self, ops: &Ops) {
        // The hub takes what it missed with `take_notices` when it links again.
        forward_each(
            self.tx.clone(),
            ops.subscribe_notices(),
            |notice| DaemonMessage::NoticeQueued {
                notice: wire::notice_info(&notice),
            },
            |_| resync("the daemon dropped notices for the hub".to_string()),
        );
    }

    /// Every workspace terminal opened, resized or ended goes to every session as
    /// `terminal_update`.
    fn forward_terminals(&self, ops: &Ops) {
        let dropped = self.metrics.hub_dropped_events.clone();
        forward_each(
            self.tx.clone(),
            ops.subscribe_terminals(),
            |event| DaemonMessage::TerminalUpdate {
                terminal_id: event.id.clone(),
                terminal: event.terminal.as_deref().map(wire::terminal_info),
            },
            move |n| dropped_events(&dropped, n, "terminal updates"),
        );
    }

    /// Every job start and end goes to every session as `job_update`; so do what other
    /// hosts' daemons say (see `forward_hosts`) and workspace terminals' changes.
    fn forward_jobs(&self, ops: &Ops) {
        self.forward_hosts(ops);
        self.forward_notices(ops);
        self.forward_terminals(ops);
        let dropped = self.metrics.hub_dropped_events.clone();
        forward_each(
            self.tx.clone(),
            ops.subscribe_jobs(),
            |event| DaemonMessage::JobUpdate {
                job: wire::job_info(&event.record),
            },
            move |n| dropped_events(&dropped, n, "job updates"),
        );
    }
}

/// Sends every event of `events` to every session as `message` makes it, until the sender is
/// gone; events missed for lagging behind are the `resync_required` `lagged` makes.
fn forward_each<T: Clone + Send + 'static>(
    out: broadcast::Sender<Arc<Outgoing>>,
    mut events: broadcast::Receiver<T>,
    message: impl Fn(T) -> DaemonMessage + Send + 'static,
    lagged: impl Fn(u64) -> Outgoing + Send + 'static,
) {
    tokio::spawn(async move {
        loop {
            let outgoing = match events.recv().await {
                Ok(event) => Outgoing::to_all(&message(event)),
                Err(broadcast::error::RecvError::Lagged(n)) => lagged(n),
                Err(broadcast::error::RecvError::Closed) => break,
            };
            let _ = out.send(Arc::new(outgoing));
        }
    });
}

pub(super) fn encode(message: &DaemonMessage) -> Utf8Bytes {
    // Our own types always serialize.
    Utf8Bytes::from(serde_json::to_string(message).unwrap_or_default())
}

fn resync(reason: String) -> Outgoing {
    Outgoing::to_all(&DaemonMessage::ResyncRequired { reason })
}

/// The `resync_required` for `n` events of a source (`what`) the hub dropped for lagging
/// behind, counted in `dropped`.
fn dropped_events(dropped: &Counter, n: u64, what: &str) -> Outgoing {
    dropped.inc_by(n);
    resync(format!("the daemon dropped {n} {what}"))
}

/// The `agent_status` announcing `agent` as clients see it now.
fn agent_status(agent: &drover_core::Agent, ops: &Ops, cache: &AgentCache) -> Outgoing {
    // The cache is updated before the event goes out (see `snapshot`); the agent is encoded
    // once for both.
    let info = cache.put(agent, ops);
    Outgoing {
        agent: None,
        revision: 0,
        text: Utf8Bytes::from(format!(
            r#"{{"type":"agent_status","payload":{{"agent":{info}}}}}"#
        )),
        joined: None,
        status_of: Some(agent.id),
    }
}

fn schedule_message(event: &crate::schedules::ScheduleEvent) -> Outgoing {
    Outgoing::to_all(&DaemonMessage::ScheduleUpdate {
        schedule_id: event.id.to_string(),
        schedule: event.schedule.as_ref().map(wire::schedule),
    })
}

fn status_message(event: &RegistryEvent, ops: &Ops, cache: &AgentCache) -> Outgoing {
    let message = match &event.change {
        Change::AgentCreated(agent) | Change::AgentUpdated(agent) => {
            return agent_status(agent, ops, cache);
        }
        Change::WorkspaceRegistered(ws) => {
            let activity = ops.workspace_activity(ws.id);
            DaemonMessage::WorkspaceUpdate {
                workspace: Some(wire::workspace_info(ws, activity)),
                workspace_id: ws.id.to_string(),
                activity: wire::bucket(activity),
            }
        }
        Change::WorkspaceActivity(change) => DaemonMessage::WorkspaceUpdate {
            workspace: None,
            workspace_id: change.workspace_id.to_string(),
            activity: wire::bucket(ops.merge_activity(change.workspace_id, change.activity)),
        },
    };
    Outgoing::to_all(&message)
}

fn update_message(event: &TimelineEvent) -> Outgoing {
    Outgoing {
        agent: Some(event.agent_id),
        revision: event.revision,
        text: encode(&DaemonMessage::AgentUpdate(wire::update(event))),
        joined: None,
        status_of: None,
    }
}

fn ready_message(ready: Ready) -> Outgoing {
    let event = ready.event();
    let mut outgoing = update_message(&event);
    outgoing.joined = match ready {
        Ready::Joined(joined) => Some(joined),
        // A session that is behind may join it with the next ones (see `join`).
        Ready::One(_) => Joined::single(&event).map(Arc::new),
    };
    outgoing
}

/// What one session shares with the daemon.
#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) ops: Ops,
    pub(crate) hub: Hub,
    /// Required in `hello`, unless the daemon runs with `--no-token`.
    pub(crate) token: Option<Arc<str>>,
}

/// A request's reply, and the agent whose updates the session held for it (an
/// `initialize_agent_request`).
struct Answer {
    held: Option<AgentId>,
    reply: Reply,
}

/// What a session does after a frame.
enum Next {
    Continue,
    /// The connection is over (the client left, or was told to go).
    Close,
}

/// Runs one connection until the client leaves or the daemon stops.
pub(crate) async fn session(
    mut socket: Socket,
    context: Context,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut session = Session {
        id: drover_core::AgentId::new().to_string(),
        // Replaced at `hello`: events from before the `session_state` snapshot are not sent.
        events: context.hub.tx.subscribe(),
        subscriptions: Subscriptions::default(),
        follows: jobs::Follows::new(),
        greeted: false,
        context,
    };
    // Counted while the connection lasts, however it ends.
    let _connected = Connected::new(&session.context.hub.metrics);
    let (reply_tx, mut replies) = mpsc::channel::<Answer>(REPLY_CAPACITY);
    // The session's requests: dropped with it, which aborts the ones still running.
    let mut requests = tokio::task::JoinSet::new();
    loop {
        let next = tokio::select! {
            () = async { let _ = stop.wait_for(|s| *s).await; } => {
                let _ = socket.send(Message::Close(Some(CloseFrame { code: CloseCode::Away, reason: "the daemon is shutting down".into() }))).await;
                Next::Close
            }
            frame = socket.next() => session.on_frame(&mut socket, frame, &reply_tx, &mut requests).await,
            Some(_) = requests.join_next(), if !requests.is_empty() => Next::Continue,
            Some(answer) = replies.recv() => session.on_answer(&mut socket, answer).await,
            push = session.follows.next() => session.on_push(&mut socket, push).await,
            event = session.events.recv(), if session.greeted => session.on_event(&mut socket, event).await,
        };
        if matches!(next, Next::Close) {
            return;
        }
    }
}

/// One connected client in `drover_clients`, from its upgrade until its session ends.
struct Connected(prometheus_client::metrics::gauge::Gauge);

impl Connected {
    fn new(metrics: &ClientMetrics) -> Connected {
        metrics.connected.inc();
        Connected(metrics.connected.clone())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One connection's state.
struct Session {
    id: String,
    context: Context,
    events: broadcast::Receiver<Arc<Outgoing>>,
    subscriptions: Subscriptions,
    /// The jobs whose output this session is pushed.
    follows: jobs::Follows,
    greeted: bool,
}

impl Drop for Session {
    /// A client that left shows nothing any more.
    fn drop(&mut self) {
        self.context.ops.forget_session(&self.id);
    }
}

/// Sends one message (in fragments if it is big, see `socket`); `Close` if the socket is gone.
async fn send(socket: &mut Socket, sent: &Counter, text: Utf8Bytes) -> Next {
    send_all(socket, sent, [text]).await
}

/// Sends messages that are ready together: written into the socket's buffer one after the
/// other (a big one in fragments, see `socket`) and flushed once, so they leave in as few
/// segments as the kernel can make.
async fn send_all(
    socket: &mut Socket,
    sent: &Counter,
    texts: impl IntoIterator<Item = Utf8Bytes>,
) -> Next {
    for text in texts {
        sent.inc_by(text.len() as u64);
        if socket::feed(socket, text).await.is_err() {
            return Next::Close;
        }
    }
    match socket.flush().await {
        Ok(()) => Next::Continue,
        Err(_) => Next::Close,
    }
}

impl Session {
    /// The byte count of what this daemon writes to clients.
    fn sent(&self) -> &Counter {
        &self.context.hub.metrics.sent_bytes
    }

    async fn on_frame(
        &mut self,
        socket: &mut Socket,
        frame: Option<Result<Message, tungstenite::Error>>,
        replies: &mpsc::Sender<Answer>,
        requests: &mut tokio::task::JoinSet<()>,
    ) -> Next {
        let text = match frame {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                let error = request_error(
                    None,
                    ErrorCode::InvalidMessage,
                    "binary frames are not part of the protocol; send JSON text".into(),
                    None,
                );
                return send(socket, self.sent(), encode(&error)).await;
            }
            Some(Ok(Message::Close(_))) => {
                // The WebSocket layer queued the answer to the peer's close (the same code, or
                // 1002 for one no endpoint may send, RFC 6455 §7.4): write it before going.
                let _ = socket.flush().await;
                return Next::Close;
            }
            None => return Next::Close,
            Some(Ok(_)) => return Next::Continue,
            Some(Err(e)) => {
                // RFC 6455 §7.4: say why before going, when the socket can still carry it.
                if let Some((code, reason)) = violation(&e) {
                    let _ = socket
                        .send(Message::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        })))
                        .await;
                }
                return Next::Close;
            }
        };
        let request = match decode_client(&text) {
            Ok(request) => request,
            Err(e) => {
                let error = request_error(e.request_id, e.code, e.message, None);
                return send(socket, self.sent(), encode(&error)).await;
            }
        };
        if let ClientMessage::Hello(hello) = &request.message {
            return self
                .hello(
                    socket,
                    hello.protocol_version,
                    hello.token.as_deref(),
                    hello.include_archived,
                )
                .await;
        }
        if !self.greeted {
            let error = request_error(
                request.request_id.clone(),
                ErrorCode::HelloRequired,
                "send `hello` first".into(),
                None,
            );
            return send(socket, self.sent(), encode(&error)).await;
        }
        if requests.len() >= MAX_IN_FLIGHT {
            let error = request_error(
                request.request_id.clone(),
                ErrorCode::TooManyRequests,
                format!(
                    "this connection has {MAX_IN_FLIGHT} requests in flight; wait for their answers"
                ),
                None,
            );
            return send(socket, self.sent(), encode(&error)).await;
        }
        if let Some(next) = self.route(socket, &text, &request, replies, requests).await {
            return next;
        }
        if let Some(answer) = self.answer_here(&request) {
            return send(socket, self.sent(), answer).await;
        }
        let held = self.hold_updates_for(&request);
        // Requests run beside the session, so a slow one (a `wait_idle`) holds up nothing;
        // they end with it.
        let ops = self.context.ops.clone();
        let replies = replies.clone();
        // What the operation logs names the request (and the connection) it serves.
        let span =
            tracing::info_span!("request", request_id = request.request_id(), session = %self.id);
        requests.spawn(tracing::Instrument::instrument(
            async move {
                let reply = requests::handle(request, &ops).await;
                let _ = replies.send(Answer { held, reply }).await;
            },
            span,
        ));
        Next::Continue
    }

    /// Sends a request that names another host's agent, workspace, job or schedule there
    /// (see `crate::hosts`); `None` for one this daemon answers.
    async fn route(
        &mut self,
        socket: &mut Socket,
        text: &str,
        request: &ClientRequest,
        replies: &mpsc::Sender<Answer>,
        requests: &mut tokio::task::JoinSet<()>,
    ) -> Option<Next> {
        let ops = &self.context.ops;
        match ops.hosts.route(text, |key, id| ops.holds(key, id)) {
            Ok(hosts::Route::Local) => None,
            Ok(hosts::Route::Everywhere { message: out }) => {
                let (ops, replies) = (self.context.ops.clone(), replies.clone());
                let request = request.clone();
                requests.spawn(async move {
                    let answers = ops.hosts.ask_all(&out).await;
                    let reply = match requests::handle(request, &ops).await {
                        Reply::Send(local) => Reply::Send(join_lists(local, answers)),
                        other @ Reply::Initialized { .. } => other,
                    };
                    let _ = replies.send(Answer { held: None, reply }).await;
                });
                Some(Next::Continue)
            }
            // Workspace terminals are the connected daemon's own (`crate::ptys`): one opened
            // over a link could not be attached to or closed from here.
            Ok(hosts::Route::Remote { host, .. })
                if matches!(
                    request.message,
                    ClientMessage::CreateTerminal(_) | ClientMessage::ListTerminals(_)
                ) =>
            {
                let error = request_error(
                    request.request_id.clone(),
                    ErrorCode::NotPermitted,
                    format!(
                        "the workspace is on host `{host}`: open its terminals in the web UI of the daemon there"
                    ),
                    None,
                );
                Some(send(socket, self.sent(), encode(&error)).await)
            }
            Ok(hosts::Route::Remote { host, message: out }) => {
                self.forward(host, out, request, replies, requests);
                Some(Next::Continue)
            }
            Ok(hosts::Route::FollowJob { host, job }) => {
                let ClientMessage::FollowJob(r) = &request.message else {
                    return None;
                };
                let answer = self.follows.follow_remote(
                    request.request_id.clone(),
                    r,
                    host,
                    job,
                    &self.context.ops,
                );
                Some(match answer {
                    Some(refused) => send(socket, self.sent(), encode(&refused)).await,
                    None => Next::Continue,
                })
            }
            Err(e) => {
                let error =
                    request_error(request.request_id.clone(), e.code(), e.to_string(), None);
                Some(send(socket, self.sent(), encode(&error)).await)
            }
        }
    }

    /// For an `initialize_agent_request`: the agent whose updates this session holds until
    /// its snapshot is sent (none when it holds them already, or the id is not one).
    fn hold_updates_for(&mut self, request: &ClientRequest) -> Option<AgentId> {
        match &request.message {
            ClientMessage::InitializeAgentRequest(r) => r
                .agent_id
                .parse::<AgentId>()
                .ok()
                .filter(|agent| self.subscriptions.begin(*agent)),
            _ => None,
        }
    }

    /// Sends a request to the host that holds what it names (see `crate::hosts`) and relays
    /// the answer: an opened remote agent's updates are held until its snapshot is sent, as a
    /// local one's are.
    fn forward(
        &mut self,
        host: String,
        out: Value,
        request: &ClientRequest,
        replies: &mpsc::Sender<Answer>,
        requests: &mut tokio::task::JoinSet<()>,
    ) {
        let held = self.hold_updates_for(request);
        let request_id = request.request_id.clone();
        let hosts = self.context.ops.hosts.clone();
        let replies = replies.clone();
        requests.spawn(async move {
            let reply = match hosts.forward(&host, out).await {
                Ok(answer) => remote_reply(answer, request_id, &host),
                Err(e) => Reply::Send(request_error(request_id, e.code(), e.to_string(), None)),
            };
            let _ = replies.send(Answer { held, reply }).await;
        });
    }

    /// Answers the requests the session answers itself, in order with its pushes
    /// (`follow_job`, `unfollow_job`: see `jobs::Follows`), about itself (`watching`) or from
    /// the hub's cache (`list_agents`); `None` for any other.
    fn answer_here(&mut self, request: &ClientRequest) -> Option<Utf8Bytes> {
        let id = request.request_id.clone();
        let answer = match &request.message {
            ClientMessage::Watching(r) => self.watching(id, r.agent_id.clone()),
            ClientMessage::FollowJob(r) => self.follows.follow_job(id, r, &self.context.ops),
            ClientMessage::UnfollowJob(r) => self.follows.unfollow_job(id, r),
            ClientMessage::AttachTerminal(r) => {
                pty::attach_terminal(&mut self.follows, id, r, &self.context.ops)
            }
            ClientMessage::DetachTerminal(r) => pty::detach_terminal(&mut self.follows, id, r),
            ClientMessage::TerminalInput(r) => pty::terminal_input(&self.context.ops, id, r),
            // The encodings `session_state` is made of: no agent is encoded again.
            ClientMessage::ListAgents(r) => {
                return Some(self.context.hub.agents.agents_message(
                    &self.context.ops,
                    id,
                    r.include_archived,
                ));
            }
            _ => return None,
        };
        Some(encode(&answer))
    }

    /// `watching`: this session shows `agent_id` now (or nothing).
    fn watching(&self, request_id: Option<String>, agent_id: Option<String>) -> DaemonMessage {
        match self.context.ops.set_watching(&self.id, agent_id.as_deref()) {
            Ok(()) => DaemonMessage::answer(request_id, answers::Ok { agent_id }),
            Err(e) => request_error(request_id, e.code(), e.to_string(), None),
        }
    }

    /// `hello`: checks the token and the version, then sends `welcome` and `session_state`.
    async fn hello(
        &mut self,
        socket: &mut Socket,
        protocol_version: u32,
        token: Option<&str>,
        include_archived: bool,
    ) -> Next {
        if let Some(expected) = &self.context.token
            && !token.is_some_and(|token| crate::lock::secret_matches(token, expected))
        {
            let error = request_error(
                None,
                ErrorCode::Unauthorized,
                "this daemon needs its token in `hello`: the `token` file in its home, or the page address `drover ui --print` shows".into(),
                None,
            );
            let _ = socket.send(Message::Text(encode(&error))).await;
            let _ = socket
                .send(Message::Close(Some(CloseFrame {
                    code: CloseCode::Policy,
                    reason: "unauthorized".into(),
                })))
                .await;
            return Next::Close;
        }
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&protocol_version) {
            let error = request_error(
                None,
                ErrorCode::UnsupportedVersion,
                format!(
                    "this daemon speaks protocol {PROTOCOL_VERSION} (and serves clients of {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}), not {protocol_version}"
                ),
                serde_json::to_value(drover_protocol::UnsupportedVersionInfo {
                    protocol_version: PROTOCOL_VERSION,
                    oldest_protocol_version: OLDEST_PROTOCOL_VERSION,
                })
                .ok(),
            );
            return send(socket, self.sent(), encode(&error)).await;
        }
        if !self.greeted {
            // Subscribe before taking the snapshot: a change between the two is sent again
            // rather than lost.
            self.events = self.context.hub.tx.subscribe();
            self.greeted = true;
        }
        let welcome = DaemonMessage::Welcome {
            daemon_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: PROTOCOL_VERSION,
            session_id: self.id.clone(),
            max_live: self.context.ops.max_live(),
        };
        let state = self
            .context
            .hub
            .agents
            .session_state(&self.context.ops, include_archived);
        send_all(socket, self.sent(), [encode(&welcome), state]).await
    }

    async fn on_answer(&mut self, socket: &mut Socket, answer: Answer) -> Next {
        let Answer { held, reply } = answer;
        let (message, release) = match reply {
            Reply::Send(message) => {
                if let Some(agent) = held {
                    self.subscriptions.finish(agent, true, None);
                }
                (message, Vec::new())
            }
            Reply::Initialized {
                agent,
                revision,
                message,
            } => (
                message,
                self.subscriptions
                    .finish(agent, held.is_some(), Some(revision)),
            ),
        };
        send_all(
            socket,
            self.sent(),
            std::iter::once(encode(&message)).chain(release),
        )
        .await
    }

    /// Writes this chunk of a followed job's output and the others already waiting, then
    /// flushes once; drops those of follows that ended.
    async fn on_push(&mut self, socket: &mut Socket, push: jobs::Push) -> Next {
        let mut texts = Vec::new();
        let mut next = Some(push);
        let mut taken = 0;
        while let Some(push) = next.take() {
            if self.follows.accept(&push) {
                texts.push(push.text);
            }
            taken += 1;
            if taken == PUSH_BATCH {
                break;
            }
            next = self.follows.try_next();
        }
        if texts.is_empty() {
            return Next::Continue;
        }
        send_all(socket, self.sent(), texts).await
    }

    /// Writes this event and every other one already waiting (up to `WRITE_BATCH`), joined
    /// when there are several (see `join`), then flushes once.
    async fn on_event(
        &mut self,
        socket: &mut Socket,
        event: Result<Arc<Outgoing>, broadcast::error::RecvError>,
    ) -> Next {
        let mut queued = Vec::new();
        let mut next = Some(event);
        let mut taken = 0;
        while let Some(event) = next.take() {
            match event {
                Ok(event) => match self.subscriptions.route(&event) {
                    Route::Send(text) => {
                        let kind = self.join_kind(&event);
                        queued.push(join::Queued { text, kind });
                    }
                    Route::Skip => {}
                    Route::Overflow => {
                        self.context.hub.metrics.resyncs.inc();
                        self.subscriptions.reset();
                        queued.push(join::Queued {
                            text: encode(&DaemonMessage::ResyncRequired {
                                reason: "this session fell behind while initializing an agent"
                                    .to_string(),
                            }),
                            kind: join::Kind::Barrier,
                        });
                    }
                },
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Too slow: drop the subscriptions; the client re-initializes.
                    self.context.hub.metrics.dropped_events.inc_by(n);
                    self.context.hub.metrics.resyncs.inc();
                    self.subscriptions.reset();
                    queued.push(join::Queued {
                        text: encode(&DaemonMessage::ResyncRequired {
                            reason: format!("this session fell {n} events behind"),
                        }),
                        kind: join::Kind::Barrier,
                    });
                }
                Err(broadcast::error::RecvError::Closed) => return Next::Close,
            }
            taken += 1;
            if taken == WRITE_BATCH {
                break;
            }
            next = match self.events.try_recv() {
                Ok(ready) => Some(Ok(ready)),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    Some(Err(broadcast::error::RecvError::Lagged(n)))
                }
                Err(broadcast::error::TryRecvError::Empty) => None,
                Err(broadcast::error::TryRecvError::Closed) => {
                    Some(Err(broadcast::error::RecvError::Closed))
                }
            };
        }
        if queued.is_empty() {
            return Next::Continue;
        }
        let texts = if self.context.hub.join {
            join::join(queued)
        } else {
            queued.into_iter().map(|q| q.text).collect()
        };
        send_all(socket, self.sent(), texts).await
    }

    /// What joining needs to know of an event this session is sent.
    fn join_kind(&self, event: &Outgoing) -> join::Kind {
        match (event.agent, &event.joined, event.status_of) {
            (Some(agent), Some(joined), _) => join::Kind::Append {
                joined: joined.clone(),
                // The session is sent the chunks after what its snapshot holds.
                from: self
                    .subscriptions
                    .seen(agent)
                    .map_or(joined.first_revision, |seen| {
                        joined.first_revision.max(seen + 1)
                    }),
            },
            (Some(agent), None, _) => join::Kind::Update(agent),
            (None, _, Some(agent)) => join::Kind::Status(agent),
            (None, _, None) => join::Kind::Other,
        }
    }
}

/// This daemon's answer to a list request with the lists of other hosts' answers appended
/// (`jobs`, `schedules`).
fn join_lists(local: DaemonMessage, remote: Vec<Value>) -> DaemonMessage {
    let Ok(mut joined) = serde_json::to_value(&local) else {
        return local;
    };
    for answer in remote {
        for key in ["jobs", "schedules"] {
            if let (Some(Value::Array(into)), Some(Value::Array(more))) = (
                joined.pointer_mut(&format!("/payload/{key}")),
                answer.pointer(&format!("/payload/{key}")),
            ) {
                into.extend(more.iter().cloned());
            }
        }
    }
    serde_json::from_value(joined).unwrap_or(local)
}

/// A host's answer as this daemon's own: an `agent_initialized` lets through the updates
/// after its snapshot.
fn remote_reply(answer: Value, request_id: Option<String>, host: &str) -> Reply {
    match serde_json::from_value::<DaemonMessage>(answer) {
        Ok(message @ DaemonMessage::AgentInitialized(_)) => {
            let DaemonMessage::AgentInitialized(Envelope {
                body:
                    answers::AgentInitialized {
                        agent_id, revision, ..
                    },
                ..
            }) = &message
            else {
                return Reply::Send(message);
            };
            match agent_id.parse::<AgentId>() {
                Ok(agent) => Reply::Initialized {
                    agent,
                    revision: *revision,
                    message,
                },
                Err(_) => Reply::Send(message),
            }
        }
        Ok(message) => Reply::Send(message),
        Err(e) => Reply::Send(request_error(
            request_id,
            ErrorCode::InvalidMessage,
            format!("host `{host}` answered something this daemon cannot read: {e}"),
            None,
        )),
    }
}

/// The close code and reason for a frame the client got wrong: 1009 for one too big, 1007
/// for text that is not UTF-8, 1002 for a broken frame; `None` when the connection itself
/// failed.
fn violation(e: &tungstenite::Error) -> Option<(CloseCode, &'static str)> {
    match e {
        tungstenite::Error::Capacity(_) => Some((CloseCode::Size, "message too big")),
        tungstenite::Error::Utf8(_) => Some((CloseCode::Invalid, "text is not UTF-8")),
        tungstenite::Error::Protocol(_) => {
            Some((CloseCode::Protocol, "WebSocket protocol violation"))
        }
        _ => None,
    }
}

pub(crate) fn request_error(
    request_id: Option<String>,
    code: ErrorCode,
    message: String,
    details: Option<Value>,
) -> DaemonMessage {
    DaemonMessage::answer(
        request_id,
        answers::RequestError {
            code: code.as_str().to_string(),
            message,
            details,
        },
    )
}
