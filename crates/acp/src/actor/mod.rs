//! The task that owns one agent's runtime: its process and ACP connection, its inbox, its
//! timeline, its running turn and pending permissions. It reacts to one event at a time:
//! a command, a message from the agent, the end of a prompt, the process exiting, a notice
//! to another agent delivered.
//!
//! The loop and the commands are here; the rest is cut along what the task does:
//! [`session`] starts and stops the agent's process and ACP session, [`turn`] runs turns from
//! the inbox and ends them, [`updates`] turns ACP `session/update`s into timeline items,
//! [`permissions`] handles the agent's permission requests, [`terminals`] the ACP client
//! terminals it opens (jobs), and [`idle`] hibernates an idle runtime (and ends a task with
//! nothing left to do).

mod idle;
mod own_subagents;
mod permissions;
mod session;
mod terminals;
mod turn;
mod updates;

use std::collections::HashMap;
use std::future::pending;
use std::sync::Arc;

use drover_core::inbox::{Delivery, Inbox, InboxMessage};
use drover_core::timeline::Timeline;
use drover_core::{AgentId, CancelCause};
use drover_protocol::{InterruptCause, ItemKind, TurnEnd};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::process;
use crate::rpc::{Incoming, RpcClient, RpcError};
use crate::slots::SlotGuard;
use crate::{AcpError, PendingPermission, PermissionAnswer, RuntimeManager, Shared};

pub(crate) use own_subagents::running as own_subagent_running;
pub use session::{LastStderr, LaunchError};

use permissions::Permission;
use turn::Turn;

type Reply<T> = oneshot::Sender<Result<T, AcpError>>;

pub(crate) enum Command {
    Deliver {
        message: InboxMessage,
        reply: Reply<()>,
    },
    /// Start the runtime now (a new agent without a prompt).
    Start,
    /// Look at the inbox again (messages kept across a restart).
    Wake,
    Cancel {
        cause: CancelCause,
        keep_inbox: bool,
        reply: Reply<()>,
    },
    Answer {
        answer: PermissionAnswer,
        reply: Reply<()>,
    },
    Pending {
        reply: Reply<Vec<PendingPermission>>,
    },
    SetMode {
        mode: String,
        reply: Reply<()>,
    },
    SetModel {
        model: String,
        reply: Reply<()>,
    },
    SetConfigOption {
        key: String,
        value: String,
        reply: Reply<()>,
    },
    Pid {
        reply: oneshot::Sender<Option<u32>>,
    },
    /// Answered once every command sent before it has been handled.
    Ping {
        reply: oneshot::Sender<()>,
    },
    /// End the runtime and the task (archive, close); a running turn ends canceled with
    /// `cause` unless a cancel gave it one.
    Close {
        cause: CancelCause,
        reply: oneshot::Sender<()>,
    },
    /// Same, for daemon shutdown: the registry is not told (boot reconciles).
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// Hibernate now if the runtime is idle (a start waits for its slot under `max_live`).
    Hibernate,
    /// The user asks to start the runtime again after a failed start (a retry, a sign-in).
    Retry,
    /// The messages queued and not delivered yet.
    Queued {
        reply: oneshot::Sender<Vec<InboxMessage>>,
    },
}

/// Starts the agent's task. The command channel holds 64 commands: clients wait when an
/// agent is that far behind, which only happens to that agent.
/// The task's command channel, its busy flag, and its end: a receiver whose sender is dropped
/// once the task has ended and left the task table (nothing is ever sent on it).
pub(crate) type Spawned = (
    mpsc::Sender<Command>,
    watch::Receiver<bool>,
    watch::Receiver<()>,
);

pub(crate) fn spawn(
    shared: Arc<Shared>,
    id: AgentId,
    generation: u64,
) -> Result<Spawned, AcpError> {
    let timeline = Timeline::open(&shared.home, id)?;
    // Settled against the timeline: a message it records is delivered, whatever the inbox says.
    let inbox = Inbox::open_with(&shared.home, id, || timeline.delivered())?;
    let (tx, rx) = mpsc::channel(64);
    // An agent whose last start failed waits for the user (or a sign-in), also in a new task.
    let retry = if shared
        .registry
        .get(id)
        .is_some_and(|a| a.start_failure.is_some())
    {
        session::StartRetry::after_recorded_failure()
    } else {
        session::StartRetry::default()
    };
    // An agent that waits for its provider's usage limit goes on waiting, also in a new task.
    let (limit_wait, limit_count) = shared
        .registry
        .get(id)
        .and_then(|a| a.limited)
        .map_or((None, 0), |l| (turn::limit_deadline(l.retry_at), l.count));
    let (busy_tx, busy_rx) =
        watch::channel(inbox.has_wake() && !retry.failing() && limit_wait.is_none());
    let mut tool_calls = HashMap::new();
    for item in timeline.items() {
        if item.is(ItemKind::ToolCall)
            && let Some(call) = item.data.get("toolCallId").and_then(Value::as_str)
        {
            tool_calls.insert(call.to_string(), item.seq);
        }
    }
    let actor = Actor {
        id,
        shared: shared.clone(),
        commands: rx,
        busy: busy_tx,
        inbox,
        timeline,
        live: None,
        turn: None,
        open_chunk: None,
        tool_calls,
        own_subagents: own_subagents::OwnSubagents::default(),
        permissions: Vec::new(),
        terminals: terminals::Terminals::new(),
        terminal_ended: Arc::new(Notify::new()),
        notices: None,
        spends: None,
        spends_pending: Arc::default(),
        start_failed: retry.failing(),
        retry,
        loading_flag: false,
        slot_wait: None,
        granted: None,
        spare: None,
        want_start: false,
        starting: false,
        idle: idle::IdleClock::default(),
        background: idle::Background::default(),
        hibernated: false,
        context_lost: false,
        published_queue: None,
        turn_clock: None,
        limit_wait,
        budget_held: false,
        limit_count,
    };
    let (ended_tx, ended_rx) = watch::channel(());
    // Every line the task logs, at any depth, names its agent (a field of the span); a root
    // span: not the request that happened to start the task.
    let span = tracing::info_span!(parent: None, "agent", agent = %id);
    tokio::spawn(async move {
        let leftover = tracing::Instrument::instrument(actor.run(), span).await;
        shared.forget(id, generation);
        drop(ended_tx);
        // Commands that reached a task as it hibernated go to its successor, answers and all.
        if !leftover.is_empty() {
            let manager = RuntimeManager { shared };
            match manager.handle(id).await {
                Ok(next) => {
                    for command in leftover {
                        let _ = next.commands.send(command).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(agent = %id, error = %e, "commands sent during a hibernation dropped");
                }
            }
        }
    });
    Ok((tx, busy_rx, ended_rx))
}

/// The agent's process and ACP session, while it runs.
struct Live {
    /// Its pid, stderr, exit and cgroup.
    running: process::Running,
    /// The `DROVER_AGENT_ID` its processes carry: the agent's id, or the id of the warm spare
    /// it took (see `crate::warm`).
    marker: String,
    rpc: RpcClient,
    incoming: mpsc::Receiver<Incoming>,
    session_id: String,
    /// The agent offers `session/close`: a stopping runtime closes its session first.
    close_session: bool,
    modes: Option<Value>,
    models: Option<Value>,
    /// The session's `configOptions` (ACP session config options), kept current from the
    /// agent's answers and `config_option_update`s: where one has the category, mode and model
    /// are set through `session/set_config_option`.
    config_options: Option<Value>,
    /// A `session/cancel` went to this session since its last prompt started, or that prompt
    /// hit a usage limit (see `turn::STALE_CANCEL_WINDOW`).
    cancel_sent: bool,
    /// The totals this process reported so far (agents report running totals: what they add
    /// is what was spent; a total that goes down started again from zero).
    reported_tokens: u64,
    reported_cost: f64,
    /// The processes that are the agent itself, read once its session is ready (`None`
    /// before): the rest of its tree is background work (see [`idle::Background`]).
    own: Option<Arc<process::OwnProcesses>>,
    /// What of its provider's settings the process was started with (see
    /// [`session::ProcessSettings`]): when `config.toml` or a `drover login` changes them, the
    /// next turn starts a new process with them first.
    settings: session::ProcessSettings,
    /// Counted in `/health` while this exists.
    _counted: crate::LiveCount,
    /// Its slot under `max_live`, freed once the process has ended (this is dropped).
    _slot: SlotGuard,
}

enum Event {
    Command(Option<Command>),
    Incoming(Option<Incoming>),
    TurnDone(Result<Value, RpcError>),
    Exited,
    /// A slot under `max_live` was handed over (`None`: the slots are gone).
    SlotGranted(Option<SlotGuard>),
    /// The idle timeout passed.
    IdleTimeout,
    /// The notices handed to other agents so far are delivered (or given up).
    NoticesSent,
    /// A terminal this runtime opened ended (the runtime may be idle now).
    TerminalEnded,
    /// The backoff after a failed start is over: it may try again.
    RetryStart,
    /// Time to look again whether the background processes that keep the runtime live ended.
    LookBackground,
    /// The wait for a usage limit is over: the prompt is sent again.
    LimitOver,
}

struct Actor {
    id: AgentId,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    busy: watch::Sender<bool>,
    inbox: Inbox,
    timeline: Timeline,
    live: Option<Live>,
    turn: Option<Turn>,
    /// The message or thought item that streamed chunks still coalesce into.
    open_chunk: Option<(ItemKind, u64)>,
    /// toolCallId → timeline seq.
    tool_calls: HashMap<String, u64>,
    /// The subagents the agent's process runs itself.
    own_subagents: own_subagents::OwnSubagents,
    permissions: Vec<Permission>,
    /// The ACP terminals this runtime opened.
    terminals: terminals::Terminals,
    /// Told when one of them ends, by the task that waits for it.
    terminal_ended: Arc<Notify>,
    /// The task delivering this agent's latest notice to another agent (it waits for the
    /// ones before it, so they arrive in order).
    notices: Option<JoinHandle<()>>,
    /// The task recording what the agent spent last (it waits for the ones before it): a
    /// notice waits for it, so a parent told of a turn's end finds that turn's spend counted
    /// in its tree's budget.
    spends: Option<JoinHandle<()>>,
    /// How many of those tasks have not recorded their spend yet: the next turn waits for
    /// them, so a turn that spent the budget holds the next one (see `Actor::spends_recorded`).
    spends_pending: Arc<updates::PendingSpends>,
    /// Do not start the runtime or a turn now: its start failed (see `retry` for when it
    /// tries again), or a turn could not be recorded (the next command tries again).
    start_failed: bool,
    /// Failed starts in a row and the next automatic try.
    retry: session::StartRetry,
    /// `session/load` is replaying history we already have.
    loading_flag: bool,
    /// A start waiting for a slot under `max_live`.
    slot_wait: Option<oneshot::Receiver<SlotGuard>>,
    /// A slot handed over, for the start that waited for it.
    granted: Option<SlotGuard>,
    /// A warm spare taken with its slot, for the start about to run (see `crate::warm`).
    spare: Option<crate::warm::Spare>,
    /// A start was asked for (`Command::Start`) and has not happened yet.
    want_start: bool,
    /// The process is being spawned or is in its handshake.
    starting: bool,
    /// Since when nothing has happened, and when the runtime hibernates.
    idle: idle::IdleClock,
    /// The background processes of an otherwise quiet runtime, which keep it live.
    background: idle::Background,
    /// The task ends because it was idle: the commands still in its channel go to the next.
    hibernated: bool,
    /// The session is new although the agent had one it could not load: the next prompt
    /// tells the agent (see [`turn::CONTEXT_LOST`]).
    context_lost: bool,
    /// The queue last published for readers (`Shared::queued`): its length, first and last ids.
    published_queue: Option<(usize, Option<String>, Option<String>)>,
    /// The running turn's `turn_started` seq (`None` if it could not be written) and when it
    /// was: how long it ran, when its `turn_ended` is (metrics and the turn's log line).
    turn_clock: Option<(Option<u64>, std::time::Instant)>,
    /// The agent waits for its provider's usage limit until then: no turn starts before (its
    /// failed prompt waits first in the inbox).
    limit_wait: Option<tokio::time::Instant>,
    /// Usage limits hit in a row (the backoff without a reset time grows with it).
    limit_count: u32,
    /// A budget of the agent's lineage is spent: what is queued waits for it to be raised
    /// (a `Wake` looks again).
    budget_held: bool,
}

impl Actor {
    /// Runs until the task ends; returns the commands that reached it as it hibernated.
    async fn run(mut self) -> Vec<Command> {
        let mut leftover = Vec::new();
        loop {
            self.publish_queue();
            self.maybe_start_turn().await;
            self.publish_queue();
            if self.want_start
                && (self.start_failed || self.ensure_live().await || self.slot_wait.is_none())
            {
                self.want_start = false;
            }
            self.settle_slot();
            self.track_idle().await;
            // A notice on its way counts: whoever waits for this agent to settle (a test, a
            // client's wait_idle) then finds the notified agent already woken.
            let busy = self.turn.is_some() || self.notices.is_some() || self.wake_pending();
            self.busy
                .send_if_modified(|b| std::mem::replace(b, busy) != busy);
            match self.next_event().await {
                Event::Command(None) => break,
                Event::Command(Some(command)) => {
                    if !self.on_command(command).await {
                        break;
                    }
                }
                Event::Incoming(Some(message)) => self.on_incoming(message).await,
                Event::Incoming(None) | Event::Exited => self.on_exit().await,
                Event::TurnDone(result) => self.finish_turn(result).await,
                Event::NoticesSent => self.notices = None,
                // Nothing to do but look again at whether the runtime is quiet.
                Event::TerminalEnded => {}
                Event::RetryStart => {
                    self.retry.take_due();
                    self.start_failed = false;
                    self.want_start = true;
                }
                Event::SlotGranted(slot) => {
                    self.slot_wait = None;
                    self.granted = slot;
                }
                Event::LookBackground => self.look_background().await,
                Event::LimitOver => {
                    tracing::info!(agent = %self.id, "the usage limit's wait is over: the prompt goes again");
                    self.limit_wait = None;
                }
                Event::IdleTimeout => {
                    if self.hibernate("idle timeout", false).await {
                        break;
                    }
                }
            }
        }
        // What the end discarded (an archive) is what readers find until the next task.
        self.publish_queue();
        if self.hibernated
            && let Some(at) = self.limit_wait
        {
            // Nothing runs for a hibernated agent: something must wake it at the reset.
            turn::wake_at(self.shared.clone(), self.id, at);
        }
        if self.hibernated {
            while let Ok(command) = self.commands.try_recv() {
                leftover.push(command);
            }
        }
        self.busy.send_replace(false);
        self.shared.set_runtime(self.id, crate::RuntimeView::COLD);
        leftover
    }

    /// Publishes the queued messages for readers (`get_agent`), when they changed: a read never
    /// waits for this task, which may be busy starting the agent. Runs at every turn of the
    /// loop (every streamed chunk): the check allocates nothing. A message is only added at the
    /// back or removed, so the length with the first and last ids tells any change between two
    /// turns of the loop.
    fn publish_queue(&mut self) {
        let first = self.inbox.pending().next().map(|m| m.id.as_str());
        let last = self.inbox.pending().last().map(|m| m.id.as_str());
        let len = self.inbox.pending().count();
        if let Some((n, f, l)) = &self.published_queue
            && *n == len
            && f.as_deref() == first
            && l.as_deref() == last
        {
            return;
        }
        let mark = (len, first.map(str::to_string), last.map(str::to_string));
        self.shared
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(self.id, self.inbox.pending().cloned().collect());
        self.published_queue = Some(mark);
    }

    async fn next_event(&mut self) -> Event {
        let deadline = self.idle.deadline();
        let retry_due = self.retry.due();
        let look_due = self.background.next_look();
        let limit_due = self.limit_wait;
        let Actor {
            commands,
            live,
            turn,
            notices,
            slot_wait,
            terminal_ended,
            ..
        } = self;
        let (incoming, exited) = match live {
            Some(l) => (Some(&mut l.incoming), Some(&mut l.running.exited)),
            None => (None, None),
        };
        // An arm whose source is absent waits forever.
        tokio::select! {
            biased;
            command = commands.recv() => Event::Command(command),
            message = async {
                match incoming {
                    Some(incoming) => incoming.recv().await,
                    None => pending().await,
                }
            } => Event::Incoming(message),
            result = async {
                match turn {
                    Some(turn) => turn.response.as_mut().await,
                    None => pending().await,
                }
            } => Event::TurnDone(result),
            () = async {
                match exited {
                    Some(exited) => {
                        let _ = exited.wait_for(Option::is_some).await;
                    }
                    None => pending().await,
                }
            } => Event::Exited,
            () = async {
                match notices {
                    Some(task) => {
                        let _ = task.await;
                    }
                    None => pending().await,
                }
            } => Event::NoticesSent,
            slot = async {
                match slot_wait {
                    Some(rx) => rx.await.ok(),
                    None => pending().await,
                }
            } => Event::SlotGranted(slot),
            () = terminal_ended.notified() => Event::TerminalEnded,
            () = async {
                match retry_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => pending().await,
                }
            } => Event::RetryStart,
            () = async {
                match limit_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => pending().await,
                }
            } => Event::LimitOver,
            () = async {
                match look_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => pending().await,
                }
            } => Event::LookBackground,
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => pending().await,
                }
            } => Event::IdleTimeout,
        }
    }

    /// Returns false when the task should end.
    async fn on_command(&mut self, command: Command) -> bool {
        match command {
            Command::Deliver { message, reply } => self.deliver(message, reply).await,
            Command::Start => {
                // A client opened the agent: its idle time starts again. One whose last start
                // failed is not started by that: only a retry or a sign-in does.
                self.touch();
                if !self.retry.failing() {
                    self.start_failed = false;
                    self.want_start = true;
                }
            }
            Command::Retry => {
                // Also: the user sends a prompt that waits for a usage limit now.
                self.limit_wait = None;
                self.retry.succeeded();
                self.start_failed = false;
                self.touch();
                self.want_start = true;
                self.publish_runtime();
            }
            Command::Hibernate => {
                if self
                    .hibernate("another start needed its slot under max_live", true)
                    .await
                {
                    return false;
                }
            }
            Command::Wake => {
                if !self.retry.failing() {
                    self.start_failed = false;
                }
                // A budget raised: look at it again.
                self.budget_held = false;
            }
            Command::Cancel {
                cause,
                keep_inbox,
                reply,
            } => {
                let result = self.cancel(cause, keep_inbox).await;
                let _ = reply.send(result);
            }
            Command::Answer { answer, reply } => {
                let result = self.answer(answer).await;
                let _ = reply.send(result);
            }
            Command::Pending { reply } => {
                let _ = reply.send(Ok(self.pending_permissions()));
            }
            Command::SetMode { mode, reply } => {
                let result = self.set_mode(mode).await;
                let _ = reply.send(result);
            }
            Command::SetModel { model, reply } => {
                let result = self.set_model(model).await;
                let _ = reply.send(result);
            }
            Command::SetConfigOption { key, value, reply } => {
                let result = self.set_option(key, value).await;
                let _ = reply.send(result);
            }
            Command::Ping { reply } => {
                let _ = reply.send(());
            }
            Command::Queued { reply } => {
                let _ = reply.send(self.inbox.pending().cloned().collect());
            }
            Command::Pid { reply } => {
                let _ = reply.send(self.live.as_ref().map(|l| l.running.pid));
            }
            Command::Close { cause, reply } => {
                // Later senders find the channel closed and start a fresh task.
                self.commands.close();
                self.close_turn(cause);
                self.stop_runtime().await;
                if self.archived() {
                    self.discard_archived_inbox(true);
                }
                let _ = reply.send(());
                return false;
            }
            Command::Shutdown { reply } => {
                if self.turn.is_some() {
                    // The record stays `running` for boot to interrupt; the timeline says now
                    // how the turn ended, so boot does not say it was a crash.
                    self.close_chunk();
                    self.push(
                        ItemKind::TurnEnded,
                        json!({"event": TurnEnd::Interrupted, "cause": InterruptCause::Shutdown}),
                    );
                }
                self.stop_runtime().await;
                let _ = self.timeline.sync();
                let _ = reply.send(());
                return false;
            }
        }
        true
    }

    /// Queues a message; a steer cancels the running turn (keeping the inbox) so it goes next.
    async fn deliver(&mut self, message: InboxMessage, reply: Reply<()>) {
        if self.archived() {
            // An archive that raced the caller's own check won: its close comes after this
            // command and would discard the message anyway.
            let _ = reply.send(Err(
                drover_core::RegistryError::Archived { agent: self.id }.into()
            ));
            return;
        }
        // A message is kept, and runs once the runtime starts: it does not start one whose
        // last start failed (the backoff or the user does).
        if !self.retry.failing() {
            self.start_failed = false;
        }
        let steer = message.delivery == Delivery::Steer;
        let result = self.inbox.queue(message).map_err(AcpError::from);
        let ok = result.is_ok();
        let _ = reply.send(result);
        if ok
            && steer
            && self.turn.is_some()
            && let Err(e) = self.cancel(CancelCause::User, true).await
        {
            tracing::warn!(agent = %self.id, error = %e, "cannot steer");
        }
    }

    fn archived(&self) -> bool {
        self.shared
            .registry
            .get(self.id)
            .is_some_and(|a| a.is_archived())
    }

    /// Archive wins: what the inbox holds never runs, not after unarchive, not at the next
    /// boot. The timeline says what was dropped; with `remove` (the task ends, nothing holds
    /// the file open) the file goes.
    fn discard_archived_inbox(&mut self, remove: bool) {
        match self.inbox.discard_all() {
            Ok(dropped) if !dropped.is_empty() => {
                self.push(
                    ItemKind::Notice,
                    json!({"text": format!("{} queued message(s) dropped (archived)", dropped.len())}),
                );
                let _ = self.timeline.sync();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(agent = %self.id, error = %e, "cannot discard the inbox of an archived agent");
                return;
            }
        }
        if remove && let Err(e) = Inbox::remove(&self.shared.home, self.id) {
            tracing::warn!(agent = %self.id, error = %e, "cannot remove the inbox of an archived agent");
        }
    }

    // ---- from the agent -------------------------------------------------------------------

    async fn on_incoming(&mut self, message: Incoming) {
        match message {
            Incoming::Notification { method, params } => {
                if method == "session/update" {
                    if let Some(turn) = self.turn.as_mut() {
                        turn.updated = true;
                    }
                    let update = params.get("update").cloned().unwrap_or(Value::Null);
                    // A child session's work (ACP subagents) is its own, not this agent's.
                    let session = params.get("sessionId").and_then(Value::as_str);
                    if let Some(child) = session.filter(|s| self.own_subagents.is_child(s)) {
                        if self.own_subagents.child_update(child, &update) {
                            self.publish_session();
                        }
                    } else if !self.loading_flag {
                        self.on_update(update);
                    }
                } else {
                    tracing::debug!(agent = %self.id, %method, "ignored a notification");
                }
            }
            Incoming::Request { id, method, params } => self.on_request(id, &method, params).await,
            Incoming::Garbage(line) => {
                tracing::warn!(agent = %self.id, %line, "the agent wrote a line that is not JSON-RPC");
            }
            Incoming::Closed => {}
        }
    }

    /// Handles what the agent already sent, without waiting for more.
    async fn drain_incoming(&mut self) {
        loop {
            let Some(live) = self.live.as_mut() else {
                return;
            };
            match live.incoming.try_recv() {
                Ok(Incoming::Closed) | Err(_) => return,
                Ok(message) => self.on_incoming(message).await,
            }
        }
    }

    async fn on_request(&mut self, id: Value, method: &str, params: Value) {
        if method == "session/request_permission" {
            self.on_permission(id, params).await;
            return;
        }
        if terminals::is_terminal_method(method) {
            self.on_terminal(id, method, params).await;
            return;
        }
        let Some(live) = &self.live else { return };
        // drover does not offer the client file system (it says so in `initialize`); agents
        // use their own tools.
        live.rpc
            .respond(
                id,
                Err((-32601, format!("`{method}` is not supported by drover"))),
            )
            .await;
    }
}
