//! The task that owns one agent's runtime: its process and ACP connection, its inbox, its
//! timeline, its running turn and pending permissions. It reacts to one event at a time:
//! a command, a message from the agent, the end of a prompt, the process exiting.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use drover_core::inbox::{Claim, Inbox, InboxMessage};
use drover_core::timeline::Timeline;
use drover_core::{
    AgentId, AgentStatus, AttentionReason, BoxFuture, CancelCause, PermissionPolicy,
    ProviderConfig, RegistryError, ResumeHandle, TurnOutcome,
};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::process::{self, AgentProcess, SpawnSpec};
use crate::providers::Availability;
use crate::rpc::{self, Incoming, RpcClient, RpcError};
use crate::{
    AcpError, PendingPermission, PermissionAnswer, PermissionChoice, Shared, TimelineUpdate,
};

const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT: Duration = Duration::from_secs(120);
const SETTING_TIMEOUT: Duration = Duration::from_secs(30);

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
    Pid {
        reply: oneshot::Sender<Option<u32>>,
    },
    /// Answered once every command sent before it has been handled.
    Ping {
        reply: oneshot::Sender<()>,
    },
    /// End the runtime and the task (archive, close).
    Close {
        reply: oneshot::Sender<()>,
    },
    /// Same, for daemon shutdown: the registry is not told (boot reconciles).
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// Starts the agent's task. The command channel holds 64 commands: clients wait when an
/// agent is that far behind, which only happens to that agent.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    id: AgentId,
    generation: u64,
) -> Result<(mpsc::Sender<Command>, watch::Receiver<bool>), AcpError> {
    let inbox = Inbox::open(&shared.home, id)?;
    let timeline = Timeline::open(&shared.home, id)?;
    let (tx, rx) = mpsc::channel(64);
    let (busy_tx, busy_rx) = watch::channel(inbox.has_wake());
    let mut tool_calls = HashMap::new();
    for item in timeline.items() {
        if item.kind == "tool_call"
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
        permissions: Vec::new(),
        start_failed: false,
        loading_flag: false,
    };
    tokio::spawn(async move {
        actor.run().await;
        shared.forget(id, generation);
    });
    Ok((tx, busy_rx))
}

struct Live {
    pid: u32,
    rpc: RpcClient,
    incoming: mpsc::Receiver<Incoming>,
    exited: watch::Receiver<Option<ExitStatus>>,
    stderr: process::StderrTail,
    stderr_closed: watch::Receiver<bool>,
    session_id: String,
    modes: Option<Value>,
    models: Option<Value>,
}

struct Turn {
    response: BoxFuture<'static, Result<Value, RpcError>>,
    cancel: Option<CancelCause>,
    /// Who asked to hear how this turn goes (notifyOnFinish).
    notify: Option<AgentId>,
    /// The timeline seq of this turn's `turn_started`.
    started_seq: u64,
}

struct Permission {
    rpc_id: Value,
    seq: u64,
    tool_call_id: Option<String>,
    title: Option<String>,
    options: Vec<Value>,
}

enum Event {
    Command(Option<Command>),
    Incoming(Option<Incoming>),
    TurnDone(Result<Value, RpcError>),
    Exited,
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
    open_chunk: Option<(&'static str, u64)>,
    /// toolCallId → timeline seq.
    tool_calls: HashMap<String, u64>,
    permissions: Vec<Permission>,
    /// The runtime failed to start; wait for a new command before trying again.
    start_failed: bool,
    /// `session/load` is replaying history we already have.
    loading_flag: bool,
}

impl Actor {
    async fn run(mut self) {
        loop {
            self.maybe_start_turn().await;
            let busy = self.turn.is_some() || (self.inbox.has_wake() && !self.start_failed);
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
            }
        }
        self.busy.send_replace(false);
    }

    async fn next_event(&mut self) -> Event {
        let Actor {
            commands,
            live,
            turn,
            ..
        } = self;
        let (incoming, exited) = match live {
            Some(l) => (Some(&mut l.incoming), Some(&mut l.exited)),
            None => (None, None),
        };
        let has_live = incoming.is_some();
        let has_turn = turn.is_some();
        tokio::select! {
            biased;
            command = commands.recv() => Event::Command(command),
            message = async { incoming.expect("live").recv().await }, if has_live => Event::Incoming(message),
            result = async { turn.as_mut().expect("turn").response.as_mut().await }, if has_turn => Event::TurnDone(result),
            _ = async { let _ = exited.expect("live").wait_for(Option::is_some).await; }, if has_live => Event::Exited,
        }
    }

    // ---- commands -------------------------------------------------------------------------

    /// Returns false when the task should end.
    async fn on_command(&mut self, command: Command) -> bool {
        match command {
            Command::Deliver { message, reply } => {
                self.start_failed = false;
                let steer = message.delivery == drover_core::inbox::Delivery::Steer;
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
            Command::Start => {
                self.start_failed = false;
                if self.live.is_none()
                    && let Err(e) = self.start_runtime().await
                {
                    tracing::warn!(agent = %self.id, error = %e, "agent did not start");
                }
            }
            Command::Wake => self.start_failed = false,
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
                let pending = self
                    .permissions
                    .iter()
                    .map(|p| PendingPermission {
                        seq: p.seq,
                        tool_call_id: p.tool_call_id.clone(),
                        title: p.title.clone(),
                        options: p.options.clone(),
                    })
                    .collect();
                let _ = reply.send(Ok(pending));
            }
            Command::SetMode { mode, reply } => {
                let result = self.set_mode(mode).await;
                let _ = reply.send(result);
            }
            Command::SetModel { model, reply } => {
                let result = self.set_model(model).await;
                let _ = reply.send(result);
            }
            Command::Ping { reply } => {
                let _ = reply.send(());
            }
            Command::Pid { reply } => {
                let _ = reply.send(self.live.as_ref().map(|l| l.pid));
            }
            Command::Close { reply } => {
                // Later senders find the channel closed and start a fresh task.
                self.commands.close();
                if self.turn.is_some() {
                    // The registry already moved the agent on (archive); the timeline says
                    // how the turn ended.
                    self.close_chunk();
                    self.push(
                        "turn_ended",
                        json!({"event": "turn_canceled", "cause": "closed", "stopReason": "cancelled"}),
                    );
                    let _ = self.timeline.sync();
                }
                self.stop_runtime().await;
                let _ = reply.send(());
                return false;
            }
            Command::Shutdown { reply } => {
                if self.turn.is_some() {
                    self.push(
                        "notice",
                        json!({"text": "the daemon shut down during this turn"}),
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

    async fn cancel(&mut self, cause: CancelCause, keep_inbox: bool) -> Result<(), AcpError> {
        if !keep_inbox {
            let dropped = self.inbox.discard_all()?;
            if !dropped.is_empty() {
                self.push(
                    "notice",
                    json!({"text": format!("{} queued message(s) dropped ({cause})", dropped.len())}),
                );
            }
        }
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        if turn.cancel.is_none() {
            turn.cancel = Some(cause);
            if let Some(live) = &self.live {
                live.rpc
                    .notify("session/cancel", json!({"sessionId": live.session_id}))
                    .await;
            }
        }
        // Every pending permission is answered `cancelled` (the agent must not wait on them).
        self.resolve_all_permissions().await;
        Ok(())
    }

    async fn set_mode(&mut self, mode: String) -> Result<(), AcpError> {
        let registry = self.shared.registry().clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if let Some(live) = &self.live {
            let request = live.rpc.request(
                "session/set_mode",
                json!({"sessionId": live.session_id, "modeId": mode}),
            );
            self.await_setting("session/set_mode", request).await?;
        }
        registry
            .set_config(
                self.id,
                ProviderConfig {
                    mode: Some(mode),
                    ..agent.config
                },
            )
            .await?;
        Ok(())
    }

    async fn set_model(&mut self, model: String) -> Result<(), AcpError> {
        let registry = self.shared.registry().clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if let Some(live) = &self.live {
            let request = model_request(live, &model);
            self.await_setting("model selection", request).await?;
        }
        registry
            .set_config(
                self.id,
                ProviderConfig {
                    model: Some(model),
                    ..agent.config
                },
            )
            .await?;
        Ok(())
    }

    async fn await_setting(
        &mut self,
        what: &str,
        request: impl std::future::Future<Output = Result<Value, RpcError>>,
    ) -> Result<(), AcpError> {
        match tokio::time::timeout(SETTING_TIMEOUT, request).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(AcpError::Agent {
                agent: self.id,
                message: e.to_string(),
            }),
            Err(_) => Err(AcpError::Agent {
                agent: self.id,
                message: format!("{what} got no answer within {SETTING_TIMEOUT:?}"),
            }),
        }
    }

    // ---- runtime --------------------------------------------------------------------------

    async fn start_runtime(&mut self) -> Result<(), AcpError> {
        let registry = self.shared.registry().clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if agent.status != AgentStatus::Initializing {
            registry
                .set_status(self.id, AgentStatus::Initializing, None)
                .await?;
        }
        match self.launch(&agent).await {
            Ok(()) => {
                registry
                    .set_status(self.id, AgentStatus::Idle, None)
                    .await?;
                Ok(())
            }
            Err(message) => {
                self.stop_runtime().await;
                self.start_failed = true;
                self.push(
                    "notice",
                    json!({"text": format!("the agent did not start: {message}")}),
                );
                let _ = registry
                    .set_status(self.id, AgentStatus::Error, Some(message.clone()))
                    .await;
                Err(AcpError::StartFailed {
                    agent: self.id,
                    message,
                })
            }
        }
    }

    /// Spawns the process, runs the ACP handshake, and opens or loads the session.
    async fn launch(&mut self, agent: &drover_core::Agent) -> Result<(), String> {
        let providers = &self.shared.providers;
        let provider = providers
            .get(&agent.provider)
            .ok_or_else(|| format!("unknown provider `{}`", agent.provider))?;
        let program = match providers.availability(provider) {
            Availability::Available { path } => path,
            Availability::Unavailable { reason } => return Err(reason),
        };
        let mut env: std::collections::BTreeMap<String, String> = process::ENV_ALLOWLIST
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        env.extend(provider.env.clone());
        env.insert("DROVER_AGENT_ID".to_string(), self.id.to_string());
        let spec = SpawnSpec {
            program,
            args: provider.command[1..].to_vec(),
            cwd: agent.cwd.clone(),
            env,
        };
        let AgentProcess {
            pid,
            stdin,
            stdout,
            stderr,
            exited,
            stderr_closed,
        } = process::spawn(&spec).map_err(|e| e.to_string())?;
        let (rpc, incoming) = rpc::connect(stdout, stdin);
        self.live = Some(Live {
            pid,
            rpc: rpc.clone(),
            incoming,
            exited,
            stderr,
            stderr_closed,
            session_id: String::new(),
            modes: None,
            models: None,
        });
        tracing::info!(agent = %self.id, pid, provider = %agent.provider, "agent process started");

        let init = self
            .handshake_step(
                "initialize",
                rpc.request(
                    "initialize",
                    json!({
                        "protocolVersion": 1,
                        "clientCapabilities": {
                            "fs": {"readTextFile": false, "writeTextFile": false},
                            "terminal": false
                        },
                        "clientInfo": {"name": "drover", "version": env!("CARGO_PKG_VERSION")}
                    }),
                ),
                INITIALIZE_TIMEOUT,
            )
            .await?;
        if let Some(version) = init.get("protocolVersion").and_then(Value::as_u64)
            && version != 1
        {
            tracing::warn!(agent = %self.id, version, "the agent speaks another ACP version; trying v1");
        }
        let can_load = init
            .pointer("/agentCapabilities/loadSession")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let cwd = agent.cwd.display().to_string();
        let http_mcp = init
            .pointer("/agentCapabilities/mcpCapabilities/http")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mcp_servers = match self.shared.mcp.get() {
            Some(servers) => servers(self.id, http_mcp),
            None => json!([]),
        };

        let mut session = None;
        if let Some(resume) = &agent.resume {
            if can_load {
                let params = json!({"sessionId": resume.acp_session_id, "cwd": cwd, "mcpServers": mcp_servers.clone()});
                self.loading(true);
                let loaded = self
                    .handshake_step(
                        "session/load",
                        rpc.request("session/load", params),
                        SESSION_TIMEOUT,
                    )
                    .await;
                self.loading(false);
                match loaded {
                    Ok(result) => {
                        session = Some((resume.acp_session_id.clone(), result));
                        self.push(
                            "notice",
                            json!({"text": "resumed the agent's session", "restored": true}),
                        );
                    }
                    Err(e) => {
                        self.push(
                            "notice",
                            json!({"text": format!("context was not restored: the agent could not load its session ({e})"), "restored": false}),
                        );
                    }
                }
            } else {
                self.push(
                    "notice",
                    json!({"text": "context was not restored: the agent cannot load sessions; a new session starts", "restored": false}),
                );
            }
        }
        let (session_id, result) = match session {
            Some(s) => s,
            None => {
                let result = self
                    .handshake_step(
                        "session/new",
                        rpc.request(
                            "session/new",
                            json!({"cwd": cwd, "mcpServers": mcp_servers.clone()}),
                        ),
                        SESSION_TIMEOUT,
                    )
                    .await?;
                let id = result
                    .get("sessionId")
                    .and_then(Value::as_str)
                    .ok_or("session/new answered without a sessionId")?
                    .to_string();
                (id, result)
            }
        };
        if let Some(live) = self.live.as_mut() {
            live.session_id = session_id.clone();
            live.modes = result.get("modes").cloned().filter(|m| !m.is_null());
            live.models = result.get("models").cloned().filter(|m| !m.is_null());
        }
        self.publish_modes();
        if agent.resume.as_ref().map(|r| &r.acp_session_id) != Some(&session_id) {
            let _ = self
                .shared
                .registry()
                .set_resume_handle(
                    self.id,
                    Some(ResumeHandle {
                        acp_session_id: session_id.clone(),
                    }),
                )
                .await;
        }
        self.apply_config(&agent.config).await;
        Ok(())
    }

    /// Sends the agent the configured mode and model when it offers them and they differ.
    async fn apply_config(&mut self, config: &ProviderConfig) {
        let Some(live) = &self.live else { return };
        if let (Some(mode), Some(modes)) = (&config.mode, &live.modes) {
            let current = modes.get("currentModeId").and_then(Value::as_str);
            let offered = modes
                .get("availableModes")
                .and_then(Value::as_array)
                .is_some_and(|all| {
                    all.iter()
                        .any(|m| m.get("id").and_then(Value::as_str) == Some(mode))
                });
            if current != Some(mode.as_str()) && offered {
                let request = live.rpc.request(
                    "session/set_mode",
                    json!({"sessionId": live.session_id, "modeId": mode}),
                );
                if let Err(e) = self.await_setting("session/set_mode", request).await {
                    self.push(
                        "notice",
                        json!({"text": format!("mode `{mode}` not applied: {e}")}),
                    );
                }
            }
        }
        let Some(live) = &self.live else { return };
        if let (Some(model), Some(models)) = (&config.model, &live.models) {
            let current = models.get("currentModelId").and_then(Value::as_str);
            if current != Some(model.as_str()) {
                let request = model_request(live, model);
                if let Err(e) = self.await_setting("model selection", request).await {
                    self.push(
                        "notice",
                        json!({"text": format!("model `{model}` not applied: {e}")}),
                    );
                }
            }
        }
    }

    /// Awaits one handshake answer while still reading (and answering) the agent's messages.
    async fn handshake_step(
        &mut self,
        method: &str,
        request: impl std::future::Future<Output = Result<Value, RpcError>>,
        timeout: Duration,
    ) -> Result<Value, String> {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(request, deadline);
        loop {
            let live = self.live.as_mut().ok_or("the agent process is gone")?;
            tokio::select! {
                result = &mut request => {
                    // What the agent sent before its answer belongs before it.
                    self.drain_incoming().await;
                    return result.map_err(|e| self.with_stderr(e.to_string()));
                }
                message = live.incoming.recv() => match message {
                    Some(Incoming::Closed) | None => {
                        let status = wait_exit(&mut live.exited).await;
                        return Err(self.with_stderr(format!("the agent process exited during {method} ({status})")));
                    }
                    Some(message) => self.on_incoming(message).await,
                },
                () = &mut deadline => return Err(self.with_stderr(format!("no answer to {method} within {timeout:?}"))),
            }
        }
    }

    fn loading(&mut self, on: bool) {
        // Replayed history is already in our timeline; `session/load` updates are not stored.
        self.open_chunk = None;
        self.loading_flag = on;
    }

    fn with_stderr(&self, message: String) -> String {
        let tail = self
            .live
            .as_ref()
            .map(|l| l.stderr.last(5))
            .unwrap_or_default();
        if tail.is_empty() {
            message
        } else {
            format!("{message}; last stderr: {}", tail.join(" | "))
        }
    }

    /// Shares the live runtime's modes with clients (or forgets them when it is gone).
    fn publish_modes(&self) {
        let mut modes = self
            .shared
            .modes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match self.live.as_ref().and_then(|l| l.modes.clone()) {
            Some(m) => modes.insert(self.id, m),
            None => modes.remove(&self.id),
        };
    }

    async fn stop_runtime(&mut self) {
        self.resolve_all_permissions().await;
        if let Some(mut live) = self.live.take() {
            self.publish_modes();
            process::terminate_group(
                live.pid,
                Some(&self.id.to_string()),
                &mut live.exited,
                crate::CLOSE_GRACE,
            )
            .await;
            tracing::info!(agent = %self.id, pid = live.pid, "agent process stopped");
        }
        self.turn = None;
    }

    async fn on_exit(&mut self) {
        let Some(mut live) = self.live.take() else {
            return;
        };
        self.publish_modes();
        let status = wait_exit(&mut live.exited).await;
        // Whatever else is in its group goes too.
        process::kill_group_now(live.pid, Some(&self.id.to_string()));
        // Its last words explain the exit: let the reader take them all.
        let _ =
            tokio::time::timeout(Duration::from_secs(1), live.stderr_closed.wait_for(|c| *c)).await;
        let tail = live.stderr.last(10);
        let mut message = format!("the agent process exited unexpectedly ({status})");
        if !tail.is_empty() {
            message.push_str(&format!("; last stderr:\n{}", tail.join("\n")));
        }
        tracing::warn!(agent = %self.id, %message);
        self.push("notice", json!({"text": message}));
        self.permissions.clear();
        let registry = self.shared.registry().clone();
        if let Some(turn) = self.turn.take() {
            self.close_chunk();
            if let Some(target) = turn.notify {
                let failed = TurnOutcome::Failed {
                    error: message.clone(),
                };
                let text = self.finish_notice(&failed, turn.started_seq);
                notify(self.shared.clone(), self.id, target, text).await;
            }
            self.push(
                "turn_ended",
                json!({"event": "turn_failed", "error": message}),
            );
            let _ = self.timeline.sync();
            if let Err(e) = registry
                .record_turn_end(self.id, TurnOutcome::Failed { error: message })
                .await
            {
                tracing::warn!(agent = %self.id, error = %e, "cannot record the failed turn");
            }
        } else if let Err(e) = registry
            .set_status(self.id, AgentStatus::Error, Some(message))
            .await
        {
            tracing::debug!(agent = %self.id, error = %e, "cannot record the exit");
        }
        // Do not restart on our own: the next message does.
        self.start_failed = true;
    }

    // ---- turns ----------------------------------------------------------------------------

    async fn maybe_start_turn(&mut self) {
        if self.turn.is_some() || self.start_failed || !self.inbox.has_wake() {
            return;
        }
        let registry = self.shared.registry().clone();
        if let Err(e) = registry.check_turn_gate(self.id) {
            self.block_next(e).await;
            return;
        }
        if self.live.is_none() && self.start_runtime().await.is_err() {
            return;
        }
        let claim = match self.inbox.claim() {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(agent = %self.id, error = %e, "cannot claim from the inbox");
                self.start_failed = true;
                return;
            }
        };
        if let Err(e) = registry
            .set_status(self.id, AgentStatus::Running, None)
            .await
        {
            self.record_user_message(&claim);
            self.push(
                "turn_ended",
                json!({"event": "turn_blocked", "reason": e.to_string()}),
            );
            return;
        }
        self.record_user_message(&claim);
        let started_seq = self
            .push("turn_started", json!({"messageId": claim.message.id}))
            .unwrap_or_default();
        let Some(live) = &self.live else { return };
        let request = live.rpc.request(
            "session/prompt",
            json!({
                "sessionId": live.session_id,
                "prompt": [{"type": "text", "text": claim.prompt_text()}],
            }),
        );
        self.turn = Some(Turn {
            response: Box::pin(request),
            cancel: None,
            notify: claim.message.notify,
            started_seq,
        });
    }

    /// The gate refused: the message that would have started the turn is taken, the turn ends
    /// `blocked`, and no prompt reaches the agent.
    async fn block_next(&mut self, reason: RegistryError) {
        match self.inbox.claim() {
            Ok(Some(claim)) => {
                self.record_user_message(&claim);
                self.push(
                    "turn_ended",
                    json!({"event": "turn_blocked", "reason": reason.to_string()}),
                );
            }
            _ => self.start_failed = true,
        }
    }

    fn record_user_message(&mut self, claim: &Claim) {
        self.close_chunk();
        let context: Vec<&str> = claim.context.iter().map(|c| c.text.as_str()).collect();
        self.push(
            "user_message",
            json!({
                "text": claim.message.text,
                "context": context,
                "messageId": claim.message.id,
                "delivery": claim.message.delivery,
                "source": claim.message.source,
            }),
        );
    }

    async fn finish_turn(&mut self, result: Result<Value, RpcError>) {
        if matches!(result, Err(RpcError::Closed { .. })) {
            // The process went away mid-turn.
            self.on_exit().await;
            return;
        }
        // Updates the agent sent before its answer are already queued: take them first.
        self.drain_incoming().await;
        let Some(turn) = self.turn.take() else { return };
        self.close_chunk();
        let outcome = match &result {
            Ok(value) => match value.get("stopReason").and_then(Value::as_str) {
                Some("cancelled") => TurnOutcome::Canceled,
                _ => TurnOutcome::Completed,
            },
            Err(e) => TurnOutcome::Failed {
                error: e.to_string(),
            },
        };
        let mut data = json!({"event": outcome.event_name()});
        if let Ok(value) = &result
            && let Some(reason) = value.get("stopReason")
        {
            data["stopReason"] = reason.clone();
        }
        if let TurnOutcome::Failed { error } = &outcome {
            data["error"] = json!(error);
        }
        if let Some(cause) = turn.cancel {
            data["cause"] = json!(cause.to_string());
        }
        self.push("turn_ended", data);
        let _ = self.timeline.sync();
        // The agent is done with them, answered or not.
        self.resolve_all_permissions().await;
        if let Some(target) = turn.notify {
            let text = self.finish_notice(&outcome, turn.started_seq);
            notify(self.shared.clone(), self.id, target, text).await;
        }
        if let Err(e) = self
            .shared
            .registry()
            .record_turn_end(self.id, outcome)
            .await
        {
            tracing::warn!(agent = %self.id, error = %e, "cannot record the end of a turn");
        }
    }

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

    // ---- from the agent -------------------------------------------------------------------

    async fn on_incoming(&mut self, message: Incoming) {
        match message {
            Incoming::Notification { method, params } => {
                if method == "session/update" {
                    if !self.loading_flag {
                        self.on_update(params.get("update").cloned().unwrap_or(Value::Null));
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

    fn on_update(&mut self, update: Value) {
        let Some(kind) = update.get("sessionUpdate").and_then(Value::as_str) else {
            self.push("raw", json!({"update": update}));
            return;
        };
        match kind {
            "agent_message_chunk" => self.chunk("agent_message", &update),
            "agent_thought_chunk" => self.chunk("agent_thought", &update),
            "user_message_chunk" => self.chunk("user_message", &update),
            "tool_call" | "tool_call_update" => {
                let mut fields = update.as_object().cloned().unwrap_or_default();
                fields.remove("sessionUpdate");
                self.merge_tool_call(fields);
            }
            "plan" => {
                self.push("plan", json!({"entries": update.get("entries")}));
            }
            "current_mode_update" => {
                let mode = update.get("currentModeId").cloned();
                self.push("mode", json!({"modeId": mode}));
                if let (Some(mode), Some(live)) = (
                    mode.and_then(|m| m.as_str().map(str::to_string)),
                    self.live.as_mut(),
                ) && let Some(modes) = live.modes.as_mut()
                {
                    modes["currentModeId"] = json!(mode);
                }
                self.publish_modes();
            }
            "config_option_update" => {
                self.push("config", strip_kind(update));
            }
            "usage_update" => {
                self.push("usage", strip_kind(update));
            }
            "available_commands_update" => {
                self.push("available_commands", strip_kind(update));
            }
            "session_info_update" => {
                self.push("session_info", strip_kind(update));
            }
            _ => {
                self.push("raw", json!({"update": update}));
            }
        }
    }

    fn chunk(&mut self, kind: &'static str, update: &Value) {
        let content = update.get("content").cloned().unwrap_or(Value::Null);
        let Some(text) = content.get("text").and_then(Value::as_str) else {
            // Images, resources: their own item.
            self.push(kind, json!({"content": content}));
            self.open_chunk = None;
            return;
        };
        match self.open_chunk {
            Some((open, seq)) if open == kind => {
                if let Err(e) = self.timeline.append_text(seq, "text", text) {
                    tracing::error!(agent = %self.id, error = %e, "cannot append to the timeline");
                    return;
                }
                self.shared.emit(
                    self.id,
                    self.timeline.revision(),
                    TimelineUpdate::Append {
                        seq,
                        field: "text".to_string(),
                        text: text.to_string(),
                    },
                );
            }
            _ => {
                let text = text.to_string();
                if let Some(seq) = self.push(kind, json!({"text": text})) {
                    self.open_chunk = Some((kind, seq));
                }
            }
        }
    }

    fn close_chunk(&mut self) {
        self.open_chunk = None;
    }

    /// `tool_call`, `tool_call_update`, and the tool call of a permission request all merge
    /// into one item per `toolCallId`.
    fn merge_tool_call(&mut self, fields: Map<String, Value>) -> Option<u64> {
        let call_id = fields
            .get("toolCallId")
            .and_then(Value::as_str)
            .map(str::to_string);
        match call_id
            .as_ref()
            .and_then(|c| self.tool_calls.get(c))
            .copied()
        {
            Some(seq) => {
                self.close_chunk();
                if let Err(e) = self.timeline.patch(seq, fields.clone()) {
                    tracing::error!(agent = %self.id, error = %e, "cannot update the timeline");
                }
                self.shared.emit(
                    self.id,
                    self.timeline.revision(),
                    TimelineUpdate::Patch { seq, fields },
                );
                Some(seq)
            }
            None => {
                let seq = self.push("tool_call", Value::Object(fields))?;
                if let Some(call) = call_id {
                    self.tool_calls.insert(call, seq);
                }
                Some(seq)
            }
        }
    }

    async fn on_request(&mut self, id: Value, method: &str, params: Value) {
        if method == "session/request_permission" {
            self.on_permission(id, params).await;
            return;
        }
        let Some(live) = &self.live else { return };
        // drover does not offer the client file system or terminals (it says so in
        // `initialize`); agents use their own tools.
        live.rpc
            .respond(
                id,
                Err((-32601, format!("`{method}` is not supported by drover"))),
            )
            .await;
    }

    async fn on_permission(&mut self, id: Value, params: Value) {
        let tool = params
            .get("toolCall")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let tool_seq = self.merge_tool_call(tool.clone());
        let options: Vec<Value> = params
            .get("options")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let title = tool
            .get("title")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                tool_seq
                    .and_then(|s| self.timeline.get(s))
                    .and_then(|i| i.data.get("title"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        let tool_call_id = tool
            .get("toolCallId")
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(seq) = self.push(
            "permission",
            json!({
                "toolCallId": tool_call_id,
                "toolSeq": tool_seq,
                "title": title,
                "options": options,
                "status": "pending",
            }),
        ) else {
            return;
        };
        self.permissions.push(Permission {
            rpc_id: id,
            seq,
            tool_call_id,
            title: title.clone(),
            options,
        });
        let registry = self.shared.registry().clone();
        let policy = registry
            .get(self.id)
            .map(|a| a.config.permission_policy)
            .unwrap_or_default();
        if self.turn.as_ref().is_some_and(|t| t.cancel.is_some()) {
            // A cancelled turn gets no new permissions.
            self.resolve_all_permissions().await;
        } else if policy == PermissionPolicy::Allow {
            let answer = PermissionAnswer {
                request: Some(seq),
                choice: PermissionChoice::Kind("allow_once".to_string()),
            };
            if let Err(e) = self.answer(answer).await {
                tracing::warn!(agent = %self.id, error = %e, "cannot allow a permission");
            }
        } else {
            if let Err(e) = registry
                .set_attention(self.id, AttentionReason::Permission)
                .await
            {
                tracing::warn!(agent = %self.id, error = %e, "cannot flag the permission request");
            }
            if let Some(target) = self.turn.as_ref().and_then(|t| t.notify) {
                let name = self.name();
                let text = format!(
                    "[drover] {name} needs a permission: {}. Answer it with the `answer_permission` tool (agentId {}), or look at it with `get_agent`.",
                    title.as_deref().unwrap_or("a tool call"),
                    self.id
                );
                notify(self.shared.clone(), self.id, target, text).await;
            }
        }
    }

    /// "Subagent \"title\" (id)" for notices.
    fn name(&self) -> String {
        let title = self.shared.registry().get(self.id).and_then(|a| a.title);
        match title {
            Some(title) => format!("Agent \"{title}\" ({})", self.id),
            None => format!("Agent {}", self.id),
        }
    }

    /// What the notified agent reads when this agent's turn ends.
    fn finish_notice(&self, outcome: &TurnOutcome, started_seq: u64) -> String {
        let name = self.name();
        let reply: String = self
            .timeline
            .items()
            .iter()
            .filter(|i| i.seq > started_seq && i.kind == "agent_message")
            .filter_map(|i| i.data.get("text").and_then(Value::as_str))
            .collect();
        // Quoted, so the reply reads as the child's words, not as instructions.
        let reply: String = excerpt(&reply, 4000)
            .lines()
            .map(|l| format!("> {l}\n"))
            .collect();
        match outcome {
            TurnOutcome::Completed if reply.is_empty() => {
                format!("[drover] {name} finished its turn.")
            }
            TurnOutcome::Completed => {
                format!("[drover] {name} finished its turn. Its reply:\n{reply}")
            }
            TurnOutcome::Canceled => format!("[drover] {name}: its turn was cancelled."),
            TurnOutcome::Failed { error } => format!("[drover] {name}: its turn failed: {error}"),
        }
    }

    async fn answer(&mut self, answer: PermissionAnswer) -> Result<(), AcpError> {
        let index =
            match answer.request {
                Some(seq) => self.permissions.iter().position(|p| p.seq == seq).ok_or(
                    AcpError::Permission {
                        agent: self.id,
                        message: format!("no pending permission request #{seq}"),
                    },
                )?,
                None if self.permissions.is_empty() => {
                    return Err(AcpError::NoPendingPermission(self.id));
                }
                None => 0,
            };
        let option = match &answer.choice {
            PermissionChoice::Cancel => None,
            PermissionChoice::OptionId(wanted) => Some(
                self.permissions[index]
                    .options
                    .iter()
                    .find(|o| o.get("optionId").and_then(Value::as_str) == Some(wanted))
                    .cloned()
                    .ok_or_else(|| AcpError::Permission {
                        agent: self.id,
                        message: format!("the request has no option `{wanted}`"),
                    })?,
            ),
            PermissionChoice::Kind(kind) => Some(
                pick_by_kind(&self.permissions[index].options, kind).ok_or_else(|| {
                    AcpError::Permission {
                        agent: self.id,
                        message: format!("the request offers no `{kind}` option"),
                    }
                })?,
            ),
        };
        let permission = self.permissions.remove(index);
        let outcome = match &option {
            Some(option) => json!({"outcome": "selected", "optionId": option.get("optionId")}),
            None => json!({"outcome": "cancelled"}),
        };
        if let Some(live) = &self.live {
            live.rpc
                .respond(permission.rpc_id, Ok(json!({"outcome": outcome})))
                .await;
        }
        let mut fields = Map::new();
        fields.insert("status".to_string(), json!("answered"));
        fields.insert("outcome".to_string(), outcome);
        if let Some(option) = option {
            fields.insert(
                "kind".to_string(),
                option.get("kind").cloned().unwrap_or(Value::Null),
            );
        }
        self.patch(permission.seq, fields);
        if self.permissions.is_empty() {
            let registry = self.shared.registry();
            if registry
                .get(self.id)
                .and_then(|a| a.attention)
                .is_some_and(|a| a.reason == AttentionReason::Permission)
            {
                let _ = registry.clear_attention(self.id).await;
            }
        }
        Ok(())
    }

    async fn resolve_all_permissions(&mut self) {
        while !self.permissions.is_empty() {
            let answer = PermissionAnswer {
                request: None,
                choice: PermissionChoice::Cancel,
            };
            if self.answer(answer).await.is_err() {
                self.permissions.clear();
            }
        }
    }

    // ---- timeline -------------------------------------------------------------------------

    /// Appends an item (logging a failed write: the timeline is a record, not a reason to
    /// break the agent) and announces it.
    fn push(&mut self, kind: &str, data: Value) -> Option<u64> {
        if !matches!(kind, "agent_message" | "agent_thought" | "user_message")
            || self.open_chunk.is_some()
        {
            self.open_chunk = None;
        }
        let data = match data {
            Value::Object(map) => map,
            other => {
                let mut map = Map::new();
                map.insert("value".to_string(), other);
                map
            }
        };
        match self.timeline.push(kind, data) {
            Ok(item) => {
                let seq = item.seq;
                self.shared.emit(
                    self.id,
                    self.timeline.revision(),
                    TimelineUpdate::Item { item },
                );
                Some(seq)
            }
            Err(e) => {
                tracing::error!(agent = %self.id, error = %e, "cannot write the timeline");
                None
            }
        }
    }

    fn patch(&mut self, seq: u64, fields: Map<String, Value>) {
        if let Err(e) = self.timeline.patch(seq, fields.clone()) {
            tracing::error!(agent = %self.id, error = %e, "cannot update the timeline");
            return;
        }
        self.shared.emit(
            self.id,
            self.timeline.revision(),
            TimelineUpdate::Patch { seq, fields },
        );
    }
}

/// Queues `text` for `target` as a followup from agent `from`: it never interrupts the
/// target's turn. An archived target gets nothing (the gate).
async fn notify(shared: Arc<Shared>, from: AgentId, target: AgentId, text: String) {
    let manager = crate::RuntimeManager { shared };
    let delivery = manager.deliver(
        target,
        drover_core::inbox::Delivery::Followup,
        text,
        format!("agent:{from}"),
    );
    match tokio::time::timeout(Duration::from_secs(10), delivery).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::info!(agent = %from, %target, error = %e, "notification not delivered")
        }
        Err(_) => tracing::warn!(agent = %from, %target, "notification timed out"),
    }
}

/// The first `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn strip_kind(update: Value) -> Value {
    let mut map = update.as_object().cloned().unwrap_or_default();
    map.remove("sessionUpdate");
    Value::Object(map)
}

/// The option of `kind`; for `allow_once` an `allow_always` will do, for `reject_once` a
/// `reject_always`, when the agent offers only those.
fn pick_by_kind(options: &[Value], kind: &str) -> Option<Value> {
    let find = |k: &str| {
        options
            .iter()
            .find(|o| o.get("kind").and_then(Value::as_str) == Some(k))
            .cloned()
    };
    find(kind).or_else(|| match kind {
        "allow_once" => find("allow_always"),
        "reject_once" => find("reject_always"),
        _ => None,
    })
}

/// Model selection: `session/set_model` where the agent offers models, else the `model`
/// config option.
fn model_request(live: &Live, model: &str) -> BoxFuture<'static, Result<Value, RpcError>> {
    if live.models.is_some() {
        Box::pin(live.rpc.request(
            "session/set_model",
            json!({"sessionId": live.session_id, "modelId": model}),
        ))
    } else {
        Box::pin(live.rpc.request(
            "session/set_config_option",
            json!({"sessionId": live.session_id, "configId": "model", "value": model}),
        ))
    }
}

async fn wait_exit(exited: &mut watch::Receiver<Option<ExitStatus>>) -> String {
    match tokio::time::timeout(Duration::from_secs(2), exited.wait_for(Option::is_some)).await {
        Ok(Ok(status)) => status
            .as_ref()
            .map(process::describe_exit)
            .unwrap_or_default(),
        _ => "still running".to_string(),
    }
}
