//! The agent's process and ACP session: spawning it, the handshake (`initialize`, then
//! `session/load` or `session/new`), its mode and model, stopping it, and its unexpected exit.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use drover_core::{
    Agent, AgentStatus, AuthMethod, BoxFuture, ProviderConfig, RegistryError, ResumeHandle,
    TurnOutcome,
};
use drover_protocol::{ItemKind, TurnEnd};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Actor, Live};
use crate::auth::{self, SignInState};
use crate::process::{self, SpawnError};
use crate::providers::{Availability, Provider};
use crate::records;
use crate::rpc::{Incoming, RpcClient, RpcError};
use crate::slots::SlotGuard;
use crate::{AcpError, Advertised, CLOSE_GRACE, LiveSession, handshake};
use drover_protocol::{ConfigOptionInfo, ConfigValueInfo};

const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT: Duration = Duration::from_secs(120);
const SETTING_TIMEOUT: Duration = Duration::from_secs(30);
/// An `authenticate` with a key is quick; an agent's own login may wait for a browser.
const AUTHENTICATE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stopping runtime waits for its `session/close` answer before it ends the process.
const CLOSE_SESSION_TIMEOUT: Duration = Duration::from_secs(1);
/// The parameters of drover's `initialize` (an agent's, or a warm spare's: the same).
pub(crate) fn initialize_params() -> Value {
    handshake::initialize_params(&handshake::runtime_capabilities())
}

/// Why an agent's runtime did not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("unknown provider `{0}`")]
    UnknownProvider(String),
    /// `config.toml` changed and no longer reads.
    #[error("{0}")]
    Config(String),
    /// The provider's program is not there (the reason says what to install).
    #[error("{reason}")]
    Unavailable { reason: String },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The agent answered a handshake request with an error.
    #[error("{error}{stderr}")]
    Rpc {
        error: Box<RpcError>,
        stderr: LastStderr,
    },
    #[error(
        "the agent's connection closed before it answered `{method}`: the process exited ({status}){stderr}"
    )]
    Exited {
        method: &'static str,
        status: String,
        stderr: LastStderr,
    },
    #[error("no answer to {method} within {timeout:?}{stderr}")]
    Timeout {
        method: &'static str,
        timeout: Duration,
        stderr: LastStderr,
    },
    #[error("the agent process is gone")]
    Gone,
    /// The agent answered `initialize` with an ACP version drover does not speak.
    #[error("{}", crate::handshake::version_mismatch(*.0))]
    UnsupportedVersion(u64),
    #[error("session/new answered without a sessionId")]
    NoSessionId,
    /// The agent needs a sign-in and none of its methods could be used without the user.
    #[error("{provider} needs a sign-in ({refusal}): {how}")]
    AuthRequired {
        provider: String,
        /// What the agent said (its refusal, or its answer to `authenticate`).
        refusal: String,
        methods: Vec<AuthMethod>,
        how: String,
    },
}

impl LaunchError {
    /// The agent answered "authentication required" (ACP -32000).
    fn is_auth_required(&self) -> bool {
        matches!(self, LaunchError::Rpc { error, .. } if auth::is_auth_required(error))
    }

    /// The agent's own words, without the stderr tail.
    fn agent_words(&self) -> String {
        match self {
            LaunchError::Rpc { error, .. } => error.to_string(),
            other => other.to_string(),
        }
    }
}

/// The last lines the agent wrote to stderr, which usually say why it failed; shown after the
/// error as `; last stderr: a | b` (nothing when there are none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LastStderr(pub Vec<String>);

impl fmt::Display for LastStderr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "; last stderr: {}", self.0.join(" | "))
        }
    }
}

/// What `initialize` told us the agent can do.
struct Capabilities {
    load_session: bool,
    /// `session/resume`: the session continues without replaying its history.
    resume_session: bool,
    /// `session/close`: the agent frees a session it is told is over.
    close_session: bool,
    http_mcp: bool,
    /// The ways it can sign in (`authMethods`).
    auth_methods: Vec<AuthMethod>,
}

/// What of a provider's settings reaches its agent's process when it starts: its command, its
/// variables (keys among them) and its sign-in method. A live process started with others
/// than `config.toml` says now (a key replaced there or by `drover login`) is started again
/// before its next turn ([`Actor::restart_for_new_settings`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ProcessSettings {
    command: Vec<String>,
    env: BTreeMap<String, String>,
    auth: Option<String>,
}

impl ProcessSettings {
    fn of(provider: &Provider) -> Self {
        Self {
            command: provider.command.clone(),
            env: provider.env.clone(),
            auth: provider.auth.clone(),
        }
    }
}

/// What the start of a runtime knows beyond the agent's record: its provider and the
/// environment its process got (what a sign-in method may find its variables in).
struct Launched {
    rpc: RpcClient,
    provider: Provider,
    env: BTreeMap<String, String>,
    /// A warm spare's answer to `initialize` (it was asked before the agent took it).
    init: Option<Value>,
}

impl Actor {
    /// Starts the process in `slot` (its place under `max_live`) and opens its session.
    pub(super) async fn start_runtime(&mut self, slot: SlotGuard) -> Result<(), AcpError> {
        self.starting = true;
        self.publish_runtime();
        let started = self.start_in(slot).await;
        // A spare taken for a start that failed before it could use it.
        if let Some(spare) = self.spare.take() {
            spare.end(&self.shared.home).await;
        }
        self.starting = false;
        self.publish_runtime();
        started
    }

    async fn start_in(&mut self, slot: SlotGuard) -> Result<(), AcpError> {
        let registry = self.shared.registry.clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if agent.status != AgentStatus::Initializing {
            registry
                .set_status(self.id, AgentStatus::Initializing, None)
                .await?;
        }
        match self.launch(&agent, slot).await {
            Ok(()) => {
                self.retry.succeeded();
                registry
                    .set_status(self.id, AgentStatus::Idle, None)
                    .await?;
                Ok(())
            }
            Err(error) => {
                self.stop_runtime().await;
                self.start_failed = true;
                let message = error.to_string();
                let sign_in = match &error {
                    LaunchError::AuthRequired { methods, .. } => Some(methods.clone()),
                    _ => None,
                };
                // A sign-in is the user's to give: no retry on our own then.
                self.retry.failed(sign_in.is_none());
                self.publish_runtime();
                self.notice_once(&format!("the agent did not start: {message}"));
                tracing::warn!(agent = %self.id, error = %message, retry = ?self.retry.next_in(), "the agent did not start");
                if let Err(e) = registry
                    .record_start_failure(self.id, message, sign_in)
                    .await
                {
                    tracing::warn!(agent = %self.id, error = %e, "cannot record the failed start");
                }
                Err(AcpError::StartFailed {
                    agent: self.id,
                    error: Box::new(error),
                })
            }
        }
    }

    /// A notice, unless the timeline's last item is already the same notice (a start that
    /// fails the same way again says it once).
    fn notice_once(&mut self, text: &str) {
        let repeated = self.timeline.last().is_some_and(|item| {
            item.is(ItemKind::Notice) && item.data.get("text").and_then(Value::as_str) == Some(text)
        });
        if !repeated {
            self.push(ItemKind::Notice, json!({"text": text}));
        }
    }

    /// Spawns the process, runs the ACP handshake, and opens or loads the session, signing
    /// in first when the agent asks and a method fits (see [`auth`]).
    async fn launch(&mut self, agent: &Agent, slot: SlotGuard) -> Result<(), LaunchError> {
        let (provider, program) = self.provider_of(agent)?;
        let (launched, capabilities) = if let Some(spare) = self
            .spare
            .take()
            .or_else(|| self.shared.actors.spares.take(&provider))
        {
            let mut launched = self.take_spare(agent, spare, provider, slot);
            let init = launched.init.take().unwrap_or_default();
            let capabilities = self.accept_init(&init)?;
            (launched, capabilities)
        } else {
            let launched = self.spawn_process(agent, provider, program, slot).await?;
            let capabilities = self.initialize(&launched.rpc).await?;
            (launched, capabilities)
        };
        let mcp_servers = (self.shared.mcp)(self.id, capabilities.http_mcp);
        let mut signed_in = false;
        let (session_id, result) = loop {
            match self
                .open_session(&launched.rpc, agent, &capabilities, &mcp_servers)
                .await
            {
                Ok(session) => break session,
                Err(refusal) if refusal.is_auth_required() && !signed_in => {
                    self.sign_in(&launched, &capabilities.auth_methods, &refusal)
                        .await?;
                    signed_in = true;
                }
                Err(refusal) if refusal.is_auth_required() => {
                    // Signed in, and still refused: the user has to look.
                    return Err(self.needs_sign_in(
                        &launched.provider,
                        &capabilities.auth_methods,
                        refusal.agent_words(),
                    ));
                }
                Err(e) => return Err(e),
            }
        };
        self.shared.sign_ins.set(
            &launched.provider.name,
            SignInState::SignedIn,
            capabilities.auth_methods.clone(),
        );
        if let Some(live) = self.live.as_mut() {
            live.close_session = capabilities.close_session;
        }
        self.record_session(agent, session_id, &result).await;
        self.apply_config(&agent.config).await;
        self.note_own_processes().await;
        Ok(())
    }

    /// Before a turn: when the live process was started with other settings of its provider
    /// than `config.toml` says now (a refused key replaced, `drover login`), it ends, as when it
    /// hibernates, and the turn starts a new one that resumes the session. Not while the agent
    /// has work of its own running in the background (that would end it).
    pub(super) async fn restart_for_new_settings(&mut self) {
        let Some(live) = &self.live else { return };
        let Some(agent) = self.shared.registry.get(self.id) else {
            return;
        };
        let Ok((provider, _)) = self.provider_of(&agent) else {
            return;
        };
        if live.settings == ProcessSettings::of(&provider) {
            return;
        }
        self.look_background().await;
        if self.background.count > 0 {
            tracing::info!(agent = %self.id, "the provider's settings changed, but the agent's background work keeps its process");
            return;
        }
        tracing::info!(agent = %self.id, provider = %provider.name, "the provider's settings changed: its process starts again with them");
        self.stop_runtime().await;
        self.push(
            ItemKind::Notice,
            json!({"text": format!("the settings of provider `{}` changed since the agent's process started: it starts again with them", provider.name)}),
        );
    }

    /// Loads the agent's session (or opens a new one when it has none or cannot load it).
    async fn open_session(
        &mut self,
        rpc: &RpcClient,
        agent: &Agent,
        capabilities: &Capabilities,
        mcp_servers: &Value,
    ) -> Result<(String, Value), LaunchError> {
        // A session brought in from elsewhere (`drover import`): drover has none of its
        // conversation, so it loads it and keeps what the agent replays.
        let adopted = !self
            .timeline
            .items()
            .iter()
            .any(|i| i.is(ItemKind::UserMessage) || i.is(ItemKind::AgentMessage));
        // The ways it can open its session again, in order: an adopted one is loaded with its
        // replay kept; else `session/resume` (no replay), then `session/load` (the replay is
        // history drover already has).
        let ways: Vec<(&'static str, bool)> = if adopted && capabilities.load_session {
            vec![("session/load", true)]
        } else {
            [
                ("session/resume", capabilities.resume_session),
                ("session/load", capabilities.load_session),
            ]
            .into_iter()
            .filter_map(|(method, offered)| offered.then_some((method, false)))
            .collect()
        };
        let loaded = match &agent.resume {
            Some(resume) => {
                let mut refusal = None;
                let mut reopened = None;
                for (method, keep_replay) in ways {
                    let id = &resume.acp_session_id;
                    match self
                        .reopen_session(rpc, agent, method, id, mcp_servers, keep_replay)
                        .await?
                    {
                        Ok(session) => {
                            reopened = Some(session);
                            break;
                        }
                        Err(e) => refusal = Some(e),
                    }
                }
                if reopened.is_none() {
                    let text = match refusal {
                        Some(e) => format!(
                            "context was not restored: the agent could not load its session ({e})"
                        ),
                        None => "context was not restored: the agent cannot load sessions; a new session starts".to_string(),
                    };
                    self.push(ItemKind::Notice, json!({"text": text, "restored": false}));
                }
                reopened
            }
            None => None,
        };
        // The agent had a conversation it does not have now: its next prompt says so.
        self.context_lost = agent.resume.is_some() && loaded.is_none();
        match loaded {
            Some(session) => Ok(session),
            None => self.new_session(rpc, agent, mcp_servers).await,
        }
    }

    /// The agent asked for a sign-in: `authenticate` with the method that fits, or the error
    /// that says how to sign in when none does.
    async fn sign_in(
        &mut self,
        launched: &Launched,
        methods: &[AuthMethod],
        refusal: &LaunchError,
    ) -> Result<(), LaunchError> {
        let Some(method) = auth::choose(methods, &launched.provider, &launched.env) else {
            return Err(self.needs_sign_in(&launched.provider, methods, refusal.agent_words()));
        };
        tracing::info!(agent = %self.id, provider = %launched.provider.name, method = %method.id, "signing in");
        let answer = self
            .handshake_step(
                "authenticate",
                launched
                    .rpc
                    .request("authenticate", json!({"methodId": method.id})),
                AUTHENTICATE_TIMEOUT,
            )
            .await;
        match answer {
            Ok(_) => Ok(()),
            // The agent is still there and said no (a wrong key): the user has to act.
            Err(LaunchError::Rpc { error, .. }) => Err(self.needs_sign_in(
                &launched.provider,
                methods,
                format!("signing in with `{}` failed: {error}", method.id),
            )),
            Err(other) => Err(other),
        }
    }

    fn needs_sign_in(
        &self,
        provider: &Provider,
        methods: &[AuthMethod],
        refusal: String,
    ) -> LaunchError {
        self.shared
            .sign_ins
            .set(&provider.name, SignInState::NeedsSignIn, methods.to_vec());
        LaunchError::AuthRequired {
            provider: provider.name.clone(),
            refusal,
            methods: methods.to_vec(),
            how: auth::how_to_sign_in(provider, methods),
        }
    }

    /// The agent's provider as `config.toml` says now, and where its program is.
    fn provider_of(&self, agent: &Agent) -> Result<(Provider, std::path::PathBuf), LaunchError> {
        let providers = self
            .shared
            .providers
            .current()
            .map_err(|e| LaunchError::Config(e.to_string()))?;
        let provider = providers
            .get(&agent.provider)
            .ok_or_else(|| LaunchError::UnknownProvider(agent.provider.clone()))?
            .clone();
        match providers.availability(&provider) {
            Availability::Available { path } => Ok((provider, path)),
            Availability::Unavailable { reason } => Err(LaunchError::Unavailable { reason }),
        }
    }

    /// Makes a warm spare of the provider (started and `initialize`d) this agent's process:
    /// its session opens next, in the agent's directory with the agent's MCP servers. The
    /// spare's own `DROVER_AGENT_ID` stays the marker of its processes (see `crate::warm`).
    fn take_spare(
        &mut self,
        agent: &Agent,
        spare: crate::warm::Spare,
        provider: Provider,
        slot: SlotGuard,
    ) -> Launched {
        let crate::warm::Spare {
            id: spare_id,
            process,
            init,
            env,
            slot: spare_slot,
            ..
        } = spare;
        let (pid, rpc) = (process.running.pid, process.rpc.clone());
        let marker = spare_id.to_string();
        // The agent's record replaces the spare's, naming the marker.
        let written = records::RuntimeRecord::of(self.id, pid).map(|mut record| {
            record.marker = Some(marker.clone());
            records::write(&self.shared.home, &record)
        });
        if let Some(Err(e)) = written {
            tracing::warn!(agent = %self.id, pid, error = %e, "cannot write the runtime record");
        }
        records::remove_named(&self.shared.home, &marker);
        // The agent holds its own slot: the spare's (if it still has it) is free for its
        // replacement.
        drop(spare_slot);
        self.live = Some(self.new_live(process, marker, slot, &provider));
        self.publish_runtime();
        tracing::info!(agent = %self.id, pid, spare = %spare_id, provider = %agent.provider, "agent took a warm spare");
        Launched {
            rpc,
            provider,
            env,
            init: Some(init),
        }
    }

    /// Spawns the provider's program in the agent's directory, with the allowed environment.
    async fn spawn_process(
        &mut self,
        agent: &Agent,
        provider: Provider,
        program: std::path::PathBuf,
        slot: SlotGuard,
    ) -> Result<Launched, LaunchError> {
        let spec = provider.spawn_spec(program, agent.cwd.clone(), Some(self.id.to_string()));
        let process = process::spawn_connected(&spec).await?;
        let (pid, rpc) = (process.running.pid, process.rpc.clone());
        self.record_runtime(pid);
        let marker = self.id.to_string();
        self.live = Some(self.new_live(process, marker, slot, &provider));
        self.publish_runtime();
        tracing::info!(agent = %self.id, pid, provider = %agent.provider, "agent process started");
        Ok(Launched {
            rpc,
            provider,
            env: spec.env,
            init: None,
        })
    }

    fn new_live(
        &self,
        process: process::Connected,
        marker: String,
        slot: SlotGuard,
        provider: &Provider,
    ) -> Live {
        let process::Connected {
            running,
            rpc,
            incoming,
        } = process;
        Live {
            running,
            marker,
            rpc,
            incoming,
            session_id: String::new(),
            close_session: false,
            modes: None,
            models: None,
            config_options: None,
            cancel_sent: false,
            reported_tokens: 0,
            reported_cost: 0.0,
            own: None,
            settings: ProcessSettings::of(provider),
            _counted: crate::LiveCount::new(&self.shared),
            _slot: slot,
        }
    }

    /// Records the new process for the next boot (`records`): if the daemon dies now, that
    /// boot ends its group before anything starts. A record that cannot be written is logged:
    /// the process still dies with the daemon, and its marker still finds what it started.
    fn record_runtime(&self, pid: u32) {
        let written = records::RuntimeRecord::of(self.id, pid)
            .map(|record| records::write(&self.shared.home, &record));
        if let Some(Err(e)) = written {
            tracing::warn!(agent = %self.id, pid, error = %e, "cannot write the runtime record");
        }
    }

    async fn initialize(&mut self, rpc: &RpcClient) -> Result<Capabilities, LaunchError> {
        let init = self
            .handshake_step(
                "initialize",
                rpc.request("initialize", initialize_params()),
                INITIALIZE_TIMEOUT,
            )
            .await?;
        self.accept_init(&init)
    }

    /// What the agent's answer to `initialize` says it can do (and is kept for clients).
    fn accept_init(&mut self, init: &Value) -> Result<Capabilities, LaunchError> {
        // The agent answers with the version it chose: ours, or one we cannot speak.
        let version = handshake::answered_version(init);
        let advertised = advertised(init, version);
        self.shared
            .advertised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(self.id, advertised);
        if version != handshake::PROTOCOL_VERSION {
            return Err(LaunchError::UnsupportedVersion(version));
        }
        let flag = |pointer: &str| init.pointer(pointer).and_then(Value::as_bool);
        let has = |pointer: &str| init.pointer(pointer).is_some_and(|v| !v.is_null());
        Ok(Capabilities {
            load_session: flag("/agentCapabilities/loadSession").unwrap_or(false),
            resume_session: has("/agentCapabilities/sessionCapabilities/resume"),
            close_session: has("/agentCapabilities/sessionCapabilities/close"),
            http_mcp: flag("/agentCapabilities/mcpCapabilities/http").unwrap_or(false),
            auth_methods: auth::parse_methods(init),
        })
    }

    /// The agent's previous session again through `method` (`session/resume` or
    /// `session/load`). What the agent replays meanwhile goes into the timeline only with
    /// `keep_replay` (an adopted session: drover has none of it). The inner error is a refusal
    /// (then the next way, or a new session); a refusal for want of a sign-in is the outer one:
    /// once signed in, the session opens.
    async fn reopen_session(
        &mut self,
        rpc: &RpcClient,
        agent: &Agent,
        method: &'static str,
        session_id: &str,
        mcp_servers: &Value,
        keep_replay: bool,
    ) -> Result<Result<(String, Value), LaunchError>, LaunchError> {
        let params = json!({"sessionId": session_id, "cwd": agent.cwd.display().to_string(), "mcpServers": mcp_servers});
        self.loading(!keep_replay);
        let answer = self
            .handshake_step(method, rpc.request(method, params), SESSION_TIMEOUT)
            .await;
        self.loading(false);
        match answer {
            Ok(result) => {
                self.open_chunk = None;
                self.push(
                    ItemKind::Notice,
                    json!({"text": "resumed the agent's session", "restored": true, "via": method, "replayed": keep_replay}),
                );
                Ok(Ok((session_id.to_string(), result)))
            }
            Err(e) if e.is_auth_required() => Err(e),
            Err(e) => {
                tracing::info!(agent = %self.id, method, error = %e, "the agent did not open its session again");
                Ok(Err(e))
            }
        }
    }

    async fn new_session(
        &mut self,
        rpc: &RpcClient,
        agent: &Agent,
        mcp_servers: &Value,
    ) -> Result<(String, Value), LaunchError> {
        let params = json!({"cwd": agent.cwd.display().to_string(), "mcpServers": mcp_servers});
        let result = self
            .handshake_step(
                "session/new",
                rpc.request("session/new", params),
                SESSION_TIMEOUT,
            )
            .await?;
        let id = result
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or(LaunchError::NoSessionId)?
            .to_string();
        Ok((id, result))
    }

    /// Keeps the session's id, modes and models, and the id as the agent's resume handle.
    async fn record_session(&mut self, agent: &Agent, session_id: String, result: &Value) {
        if let Some(live) = self.live.as_mut() {
            live.session_id.clone_from(&session_id);
            live.modes = result.get("modes").cloned().filter(|m| !m.is_null());
            live.models = result.get("models").cloned().filter(|m| !m.is_null());
            live.config_options = result.get("configOptions").cloned().filter(Value::is_array);
        }
        self.publish_session();
        if agent.resume.as_ref().map(|r| &r.acp_session_id) != Some(&session_id) {
            let _ = self
                .shared
                .registry
                .set_resume_handle(
                    self.id,
                    Some(ResumeHandle {
                        acp_session_id: session_id,
                    }),
                )
                .await;
        }
    }

    /// Sends the agent the configured mode, model, reasoning effort and other options when it
    /// offers them and they differ: through its config option of that category (or id) where
    /// it has one, else (mode and model) `session/set_mode` and `session/set_model`.
    async fn apply_config(&mut self, config: &ProviderConfig) {
        let by_category = [
            ("mode", &config.mode),
            ("model", &config.model),
            ("thought_level", &config.effort),
        ];
        let by_id = config
            .options
            .iter()
            .map(|(id, value)| (id.as_str(), value));
        for (key, value) in by_category
            .into_iter()
            .filter_map(|(key, value)| Some((key, value.as_ref()?)))
            .chain(by_id)
        {
            let what = if key == "thought_level" {
                "reasoning effort"
            } else {
                key
            };
            match self.set_config_option(key, value).await {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    let text = format!("{what} `{value}` not applied: {e}");
                    self.push(ItemKind::Notice, json!({ "text": text }));
                }
                // Mode and model have older methods, below.
                None if matches!(key, "mode" | "model") => {}
                None => {
                    let text =
                        format!("{what} `{value}` not applied: the agent offers no such setting");
                    self.push(ItemKind::Notice, json!({ "text": text }));
                }
            }
        }
        let Some(live) = &self.live else { return };
        let by_option =
            |category: &str| config_option(live.config_options.as_ref(), category).is_some();
        let (mode, model) = (
            config.mode.as_ref().filter(|_| !by_option("mode")),
            config.model.as_ref().filter(|_| !by_option("model")),
        );
        if let Some(mode) = mode {
            let ids = mode_ids(live.modes.as_ref());
            let current = live
                .modes
                .as_ref()
                .and_then(|modes| modes.get("currentModeId"))
                .and_then(Value::as_str)
                == Some(mode.as_str());
            // A mode the agent does not have is said, with the ones it has, not dropped.
            if !current && !ids.contains(mode) {
                let offers = if ids.is_empty() {
                    "the agent offers no modes".to_string()
                } else {
                    format!("the agent's modes are {}", ids.join(", "))
                };
                self.push(
                    ItemKind::Notice,
                    json!({"text": format!("mode `{mode}` not applied: {offers}")}),
                );
            } else if !current {
                let request = live.rpc.request(
                    "session/set_mode",
                    json!({"sessionId": live.session_id, "modeId": mode}),
                );
                if let Err(e) = self.await_setting("session/set_mode", request).await {
                    self.push(
                        ItemKind::Notice,
                        json!({"text": format!("mode `{mode}` not applied: {e}")}),
                    );
                }
            }
        }
        let Some(live) = &self.live else { return };
        if let (Some(model), Some(models)) = (model, &live.models) {
            let current = models.get("currentModelId").and_then(Value::as_str);
            if current != Some(model.as_str()) {
                let request = model_request(live, model);
                if let Err(e) = self.await_setting("model selection", request).await {
                    self.push(
                        ItemKind::Notice,
                        json!({"text": format!("model `{model}` not applied: {e}")}),
                    );
                }
            }
        }
    }

    /// Awaits one handshake answer while still reading (and answering) the agent's messages.
    async fn handshake_step(
        &mut self,
        method: &'static str,
        request: impl Future<Output = Result<Value, RpcError>>,
        timeout: Duration,
    ) -> Result<Value, LaunchError> {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(request, deadline);
        loop {
            let live = self.live.as_mut().ok_or(LaunchError::Gone)?;
            tokio::select! {
                result = &mut request => {
                    // What the agent sent before its answer belongs before it.
                    self.drain_incoming().await;
                    if let Err(RpcError::Closed { .. }) = result {
                        // The same failure as the stream's end below, told the same way
                        // whichever the runtime sees first: with the exit status.
                        let status = match self.live.as_mut() {
                            Some(live) => wait_exit(&mut live.running.exited).await,
                            None => "gone".to_string(),
                        };
                        return Err(LaunchError::Exited { method, status, stderr: self.last_words().await });
                    }
                    return result.map_err(|error| LaunchError::Rpc { error: Box::new(error), stderr: self.last_stderr() });
                }
                message = live.incoming.recv() => match message {
                    Some(Incoming::Closed) | None => {
                        let status = wait_exit(&mut live.running.exited).await;
                        return Err(LaunchError::Exited { method, status, stderr: self.last_words().await });
                    }
                    Some(message) => self.on_incoming(message).await,
                },
                () = &mut deadline => {
                    return Err(LaunchError::Timeout { method, timeout, stderr: self.last_stderr() });
                }
            }
        }
    }

    fn loading(&mut self, on: bool) {
        // Replayed history is already in our timeline; `session/load` updates are not stored.
        self.open_chunk = None;
        self.loading_flag = on;
    }

    /// The last stderr lines of a process that exited, once the reader has taken them all (or
    /// after 1 s): the exit can be seen before its last words are read, and a failure must
    /// read the same whichever comes first.
    async fn last_words(&mut self) -> LastStderr {
        let tail = self.live.as_ref().map(|l| l.running.stderr.clone());
        match tail {
            Some(tail) => LastStderr(tail.last_words(5).await),
            None => LastStderr(Vec::new()),
        }
    }

    fn last_stderr(&self) -> LastStderr {
        LastStderr(
            self.live
                .as_ref()
                .map(|l| l.running.stderr.last(5))
                .unwrap_or_default(),
        )
    }

    /// Shares the live runtime's modes with clients (or forgets them when it is gone).
    /// Publishes what the live session offers to set (modes, config options) for clients,
    /// and tells them when it changed.
    pub(super) fn publish_session(&self) {
        let session = LiveSession {
            modes: self.live.as_ref().and_then(|l| l.modes.clone()),
            config_options: self
                .live
                .as_ref()
                .and_then(|l| l.config_options.as_ref())
                .map(config_options_info),
            own_subagents: self.own_subagents.list().to_vec(),
        };
        let settings = (session != LiveSession::default()).then_some(session);
        let changed = {
            let mut all = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match settings {
                Some(s) => all.insert(self.id, s.clone()).is_none_or(|old| old != s),
                None => all.remove(&self.id).is_some(),
            }
        };
        if changed {
            let _ = self.shared.runtime_changes.send(self.id);
        }
    }

    pub(super) async fn stop_runtime(&mut self) {
        self.resolve_all_permissions().await;
        self.end_terminals();
        if let Some(mut live) = self.live.take() {
            // They ran inside the process that ends here.
            self.own_subagents.clear();
            self.publish_session();
            if live.close_session && !live.session_id.is_empty() {
                // The agent frees the session (and saves it) before its process ends.
                let closed = tokio::time::timeout(
                    CLOSE_SESSION_TIMEOUT,
                    live.rpc
                        .request("session/close", json!({"sessionId": live.session_id})),
                )
                .await;
                if !matches!(closed, Ok(Ok(_))) {
                    tracing::debug!(agent = %self.id, "session/close went unanswered");
                }
            }
            process::terminate_group(
                live.running.pid,
                Some(&live.marker),
                live.running.cgroup.as_deref(),
                &mut live.running.exited,
                CLOSE_GRACE,
            )
            .await;
            records::remove(&self.shared.home, self.id);
            tracing::info!(agent = %self.id, pid = live.running.pid, "agent process stopped");
        }
        self.turn = None;
    }

    /// The process ended on its own: its turn fails, or the agent is in error.
    pub(super) async fn on_exit(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let status = wait_exit(&mut live.running.exited).await;
        // Whatever else is in its group or its cgroup goes too, and the terminals it opened.
        process::kill_group_now(
            live.running.pid,
            Some(&live.marker),
            live.running.cgroup.as_deref(),
        );
        self.end_terminals();
        records::remove(&self.shared.home, self.id);
        // The exit can be seen before the reader has passed on what the agent wrote just
        // before it: take that first, up to the end of its output.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.read_to_end()).await;
        let Some(live) = self.live.take() else {
            return;
        };
        self.publish_session();
        // Its last words explain the exit: let the reader take them all.
        let tail = live.running.stderr.last_words(10).await;
        let mut message = format!("the agent process exited unexpectedly ({status})");
        if !tail.is_empty() {
            // Writing to a `String` cannot fail.
            let _ = write!(message, "; last stderr:\n{}", tail.join("\n"));
        }
        tracing::warn!(agent = %self.id, %message);
        self.push(ItemKind::Notice, json!({"text": message}));
        self.permissions.clear();
        if let Some(turn) = self.turn.take() {
            self.close_chunk();
            let data = json!({"event": TurnEnd::Failed, "error": message});
            self.end_turn(turn, TurnOutcome::Failed { error: message }, data)
                .await;
        } else if let Err(e) = self
            .shared
            .registry
            .set_status(self.id, AgentStatus::Error, Some(message))
            .await
        {
            tracing::debug!(agent = %self.id, error = %e, "cannot record the exit");
        }
        // Do not restart on our own: the next message does.
        self.start_failed = true;
    }

    /// Handles the agent's messages until its output ends.
    async fn read_to_end(&mut self) {
        while let Some(live) = self.live.as_mut() {
            match live.incoming.recv().await {
                Some(Incoming::Closed) | None => return,
                Some(message) => self.on_incoming(message).await,
            }
        }
    }

    pub(super) async fn set_mode(&mut self, mode: String) -> Result<(), AcpError> {
        let registry = self.shared.registry.clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if let Some(set) = self.set_config_option("mode", &mode).await {
            set?;
        } else if let Some(live) = &self.live {
            // A mode the agent does not list is refused here, naming the ones it lists.
            let ids = mode_ids(live.modes.as_ref());
            if !ids.contains(&mode) {
                return Err(AcpError::NoSuchOption {
                    agent: self.id,
                    message: if ids.is_empty() {
                        "it offers no modes".to_string()
                    } else {
                        format!(
                            "`{mode}` is not a mode it has; give one of: {}",
                            ids.join(", ")
                        )
                    },
                });
            }
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

    pub(super) async fn set_model(&mut self, model: String) -> Result<(), AcpError> {
        let registry = self.shared.registry.clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        if let Some(set) = self.set_config_option("model", &model).await {
            set?;
        } else if let Some(live) = &self.live {
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

    /// Sets one config option, named by `key`: its id, or its category (`effort` names
    /// `thought_level`). Recorded in the agent's config (mode, model and effort in their own
    /// fields, any other by its id) so a later runtime applies it too, and sent to the live
    /// agent, which must offer the option and the value.
    pub(super) async fn set_option(&mut self, key: String, value: String) -> Result<(), AcpError> {
        let asked = key.clone();
        let key = if key == "effort" {
            "thought_level".to_string()
        } else {
            key
        };
        let offered = self
            .live
            .as_ref()
            .map(|live| config_option(live.config_options.as_ref(), &key).cloned());
        let category = match &offered {
            Some(Some(option)) => option
                .get("category")
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => Some(key.clone()),
        };
        // Mode and model keep the older methods for agents without config options.
        match category.as_deref() {
            Some("mode") => return self.set_mode(value).await,
            Some("model") => return self.set_model(value).await,
            _ => {}
        }
        if let Some(offered) = offered {
            let Some(option) = offered else {
                // Mode and model, set through the older methods, are settings too.
                let ids = self.live.as_ref().map(|live| {
                    let mut ids = option_ids(live.config_options.as_ref());
                    for (name, offered) in [
                        ("mode", !mode_ids(live.modes.as_ref()).is_empty()),
                        ("model", live.models.is_some()),
                    ] {
                        let listed = ids.split(", ").any(|id| id == name);
                        if offered && !listed {
                            if !ids.is_empty() {
                                ids.push_str(", ");
                            }
                            ids.push_str(name);
                        }
                    }
                    ids
                });
                return Err(AcpError::NoSuchOption {
                    agent: self.id,
                    message: format!(
                        "it offers no setting `{asked}`; it offers: {}",
                        ids.filter(|ids| !ids.is_empty())
                            .unwrap_or_else(|| "none".to_string())
                    ),
                });
            };
            let values = option_values(&option);
            if !values.is_empty() && !values.contains(&value) {
                return Err(AcpError::NoSuchOption {
                    agent: self.id,
                    message: format!(
                        "`{value}` is not a value of `{asked}`; give one of: {}",
                        values.join(", ")
                    ),
                });
            }
            if let Some(set) = self.set_config_option(&key, &value).await {
                set?;
            }
        }
        let registry = self.shared.registry.clone();
        let agent = registry
            .get(self.id)
            .ok_or_else(|| RegistryError::UnknownAgent(self.id.to_string()))?;
        let mut config = agent.config;
        if category.as_deref() == Some("thought_level") {
            config.effort = Some(value);
        } else {
            let id = offered_id(self.live.as_ref(), &key).unwrap_or(key);
            config.options.insert(id, value);
        }
        registry.set_config(self.id, config).await?;
        Ok(())
    }

    /// Sets `value` through the live session's config option named `key` (its id, or its
    /// category: `mode`, `model`, `thought_level`) with `session/set_config_option`, unless it
    /// is already the option's value; `None` when the agent offers no such option (or nothing
    /// runs), so the caller uses the older method. The agent's answer (every option, current)
    /// is kept.
    async fn set_config_option(&mut self, key: &str, value: &str) -> Option<Result<(), AcpError>> {
        let live = self.live.as_ref()?;
        let option = config_option(live.config_options.as_ref(), key)?;
        let id = option.get("id").and_then(Value::as_str)?.to_string();
        let category = option
            .get("category")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if option.get("currentValue").and_then(Value::as_str) == Some(value) {
            return Some(Ok(()));
        }
        let request = live.rpc.request(
            "session/set_config_option",
            json!({"sessionId": live.session_id, "configId": id, "value": value}),
        );
        let answer = match self
            .await_answer("session/set_config_option", request)
            .await
        {
            Ok(answer) => answer,
            Err(e) => return Some(Err(e)),
        };
        if let Some(live) = self.live.as_mut() {
            match answer.get("configOptions").filter(|o| o.is_array()) {
                Some(options) => live.config_options = Some(options.clone()),
                None => {
                    if let Some(option) = live
                        .config_options
                        .as_mut()
                        .and_then(Value::as_array_mut)
                        .and_then(|all| all.iter_mut().find(|o| o["id"] == id.as_str()))
                    {
                        option["currentValue"] = json!(value);
                    }
                }
            }
            // The older view of modes that clients read follows.
            if category == "mode"
                && let Some(modes) = live.modes.as_mut()
            {
                modes["currentModeId"] = json!(value);
            }
        }
        self.publish_session();
        Some(Ok(()))
    }

    async fn await_setting(
        &mut self,
        what: &str,
        request: impl Future<Output = Result<Value, RpcError>>,
    ) -> Result<(), AcpError> {
        self.await_answer(what, request).await.map(|_| ())
    }

    async fn await_answer(
        &mut self,
        what: &str,
        request: impl Future<Output = Result<Value, RpcError>>,
    ) -> Result<Value, AcpError> {
        match tokio::time::timeout(SETTING_TIMEOUT, request).await {
            Ok(Ok(answer)) => Ok(answer),
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
}

/// The session config option of `category` among `options` (the first, as the agent orders
/// them).
/// The config option that `key` names: the one with that id, else the one of that category.
fn config_option<'a>(options: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    let all = options?.as_array()?;
    let field = |o: &Value, name: &str| o.get(name).and_then(Value::as_str) == Some(key);
    all.iter()
        .find(|o| field(o, "id"))
        .or_else(|| all.iter().find(|o| field(o, "category")))
}

/// The session's config options as clients see them: `select` options with string values
/// (groups flattened); others are left out.
fn config_options_info(options: &Value) -> Vec<ConfigOptionInfo> {
    let text = |o: &Value, name: &str| o.get(name).and_then(Value::as_str).map(str::to_string);
    options
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| {
            let id = text(o, "id")?;
            let mut values = Vec::new();
            select_values(&o["options"], &mut values);
            Some(ConfigOptionInfo {
                name: text(o, "name").unwrap_or_else(|| id.clone()),
                description: text(o, "description"),
                category: text(o, "category"),
                current_value: text(o, "currentValue")?,
                values,
                id,
            })
        })
        .collect()
}

/// The ids of the session's config options, for a message.
fn option_ids(options: Option<&Value>) -> String {
    options
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("id").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ids of the modes a session's `modes` lists (`availableModes`).
fn mode_ids(modes: Option<&Value>) -> Vec<String> {
    modes
        .and_then(|modes| modes.get("availableModes"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("id").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// The id of the live session's option that `key` names.
fn offered_id(live: Option<&Live>, key: &str) -> Option<String> {
    let option = config_option(live?.config_options.as_ref(), key)?;
    Some(option.get("id")?.as_str()?.to_string())
}

/// Every value a `select` config option takes (its groups flattened).
fn option_values(option: &Value) -> Vec<String> {
    let mut values = Vec::new();
    select_values(&option["options"], &mut values);
    values.into_iter().map(|v| v.value).collect()
}

/// The values of a `select` option's `options`, groups flattened.
fn select_values(list: &Value, out: &mut Vec<ConfigValueInfo>) {
    for entry in list.as_array().into_iter().flatten() {
        let text = |name: &str| entry.get(name).and_then(Value::as_str);
        match text("value") {
            Some(value) => out.push(ConfigValueInfo {
                value: value.to_string(),
                name: text("name").unwrap_or(value).to_string(),
                description: text("description").map(str::to_string),
            }),
            None => select_values(&entry["options"], out),
        }
    }
}

/// Model selection without a `model` config option: `session/set_model` where the agent
/// offers models, else an option with the id `model` (agents that predate categories).
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

/// How long a failed start waits before the runtime tries again by itself: after the first,
/// second and third failure in a row. After that (and after any failure for want of a
/// sign-in) only a user's retry or sign-in starts it.
const START_BACKOFF: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
];

/// Failed starts in a row, and when the next automatic try is due.
#[derive(Debug, Default)]
pub(super) struct StartRetry {
    failures: usize,
    due: Option<tokio::time::Instant>,
    /// `due` on the wall clock, for clients.
    at: Option<jiff::Timestamp>,
}

impl StartRetry {
    /// The agent's record says its last start failed (a daemon restart, a task that ended):
    /// it waits for the user.
    pub(super) fn after_recorded_failure() -> StartRetry {
        StartRetry {
            failures: START_BACKOFF.len() + 1,
            due: None,
            at: None,
        }
    }

    pub(super) fn succeeded(&mut self) {
        *self = StartRetry::default();
    }

    /// A start failed; `automatic`: the runtime may try again by itself (while the backoff
    /// lasts).
    fn failed(&mut self, automatic: bool) {
        self.failures = if automatic {
            self.failures + 1
        } else {
            START_BACKOFF.len() + 1
        };
        let wait = START_BACKOFF.get(self.failures.wrapping_sub(1)).copied();
        self.due = wait.map(|w| tokio::time::Instant::now() + w);
        self.at = wait.and_then(|w| {
            let w = jiff::SignedDuration::try_from(w).ok()?;
            jiff::Timestamp::now().checked_add(w).ok()
        });
    }

    fn next_in(&self) -> Option<Duration> {
        self.due
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// The last start failed (a start now waits for `due`, or for the user).
    pub(super) fn failing(&self) -> bool {
        self.failures > 0
    }

    pub(super) fn due(&self) -> Option<tokio::time::Instant> {
        self.due
    }

    pub(super) fn at(&self) -> Option<jiff::Timestamp> {
        self.at
    }

    /// The automatic try is due now: it may start once more.
    pub(super) fn take_due(&mut self) {
        self.due = None;
        self.at = None;
    }
}

/// What the `initialize` answer says of the agent (see [`Advertised`]).
fn advertised(init: &Value, protocol_version: u64) -> Advertised {
    let text = |pointer: &str| {
        init.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let present = |pointer: &str| {
        init.pointer(pointer)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
    };
    let capabilities = [
        ("/agentCapabilities/loadSession", "load"),
        ("/agentCapabilities/sessionCapabilities/resume", "resume"),
        ("/agentCapabilities/sessionCapabilities/close", "close"),
        ("/agentCapabilities/sessionCapabilities/list", "list"),
        ("/agentCapabilities/sessionCapabilities/fork", "fork"),
        ("/agentCapabilities/promptCapabilities/image", "image"),
        ("/agentCapabilities/promptCapabilities/audio", "audio"),
        (
            "/agentCapabilities/promptCapabilities/embeddedContext",
            "embedded-context",
        ),
        ("/agentCapabilities/mcpCapabilities/http", "mcp-http"),
        ("/agentCapabilities/mcpCapabilities/sse", "mcp-sse"),
    ]
    .into_iter()
    .filter(|(pointer, _)| present(pointer))
    .map(|(_, name)| name.to_string())
    .collect();
    Advertised {
        name: text("/agentInfo/name"),
        title: text("/agentInfo/title"),
        version: text("/agentInfo/version"),
        protocol_version,
        capabilities,
    }
}
