//! A provider's own past sessions, listed through ACP `session/list`: its agent starts once,
//! outside any agent's runtime and without a session, is asked for every page of the list
//! (following `nextCursor`, bounded), and ends. What it asks the client meanwhile is refused.
//! The same short start, `initialize` only, tells which sign-in methods a provider offers
//! when none of its agents started since the daemon did (`offered_sign_ins`).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::process::{self, StderrTail};
use crate::providers::{Availability, Provider};
use crate::rpc::{Incoming, RpcClient, RpcError};
use crate::{AcpError, CLOSE_GRACE, RuntimeManager};
use crate::{auth, handshake};

/// How long one answer (`initialize`, `authenticate`, a page) may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Pages asked for at most: a cursor that never ends stops here.
const MAX_PAGES: usize = 100;
/// Sessions kept at most: the list goes whole into one answer.
const MAX_SESSIONS: usize = 10_000;
/// JSON-RPC: method not found, what the agent's own requests get.
const METHOD_NOT_FOUND: i64 = -32601;

/// One session a provider's agent listed (ACP `SessionInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSession {
    pub session_id: String,
    /// Its working directory; `None` when the agent did not say (it cannot be continued then).
    pub cwd: Option<PathBuf>,
    pub title: Option<String>,
    /// When it last changed (RFC 3339), as the agent said.
    pub updated_at: Option<String>,
}

impl RuntimeManager {
    /// The sessions `provider`'s agent lists (those in `cwd`, absolute, when given), newest
    /// first as the agent orders them. A provider whose agent does not advertise
    /// `sessionCapabilities.list` is an error that says so.
    pub async fn provider_sessions(
        &self,
        provider: &str,
        cwd: Option<&Path>,
    ) -> Result<Vec<ProviderSession>, AcpError> {
        let alone = self.start_alone(provider, cwd, listing_failed).await?;
        let listed = list(&alone.rpc, &alone.provider, &alone.env, cwd).await;
        let (provider, stderr) = alone.end().await;
        listed.map_err(|e| match e {
            Failure::Unsupported => AcpError::CannotList { provider },
            Failure::Agent(message) => {
                listing_failed(provider, format!("{message}{}", tail(&stderr)))
            }
        })
    }

    /// The sign-in methods `provider`'s agent offers in its `initialize` answer, asked of the
    /// agent started once as the daemon starts it (its environment, the user's home).
    pub(crate) async fn offered_sign_ins(
        &self,
        provider: &str,
    ) -> Result<Vec<drover_core::AuthMethod>, AcpError> {
        let alone = self.start_alone(provider, None, asking_failed).await?;
        let init = ask(
            &alone.rpc,
            "initialize",
            handshake::initialize_params(&handshake::runtime_capabilities()),
        )
        .await;
        let (provider, stderr) = alone.end().await;
        match init {
            // Its `authMethods` are read only in a version drover speaks, as a launch reads
            // them.
            Ok(init) => match handshake::answered_version(&init) {
                handshake::PROTOCOL_VERSION => Ok(auth::parse_methods(&init)),
                version => Err(asking_failed(
                    provider,
                    handshake::version_mismatch(version),
                )),
            },
            Err(e) => Err(asking_failed(provider, format!("{e}{}", tail(&stderr)))),
        }
    }

    /// `provider`'s agent started alone: outside any runtime, in `cwd` (else the user's home,
    /// else drover's), what it asks refused; `failed` names a start that failed.
    async fn start_alone(
        &self,
        provider: &str,
        cwd: Option<&Path>,
        failed: fn(String, String) -> AcpError,
    ) -> Result<Alone, AcpError> {
        let providers = self.providers()?;
        let provider = providers
            .get(provider)
            .ok_or_else(|| AcpError::UnknownProvider {
                name: provider.to_string(),
                known: providers.all().map(|p| p.name.clone()).collect(),
            })?
            .clone();
        let program = match providers.availability(&provider) {
            Availability::Available { path } => path,
            Availability::Unavailable { reason } => {
                return Err(AcpError::ProviderUnavailable {
                    provider: provider.name,
                    reason,
                });
            }
        };
        let mut spec = provider.spawn_spec(program, self.shared.home.clone(), None);
        // Its directory: the one asked about, else the user's home, else drover's.
        let home = spec
            .env
            .get("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_dir());
        if let Some(dir) = cwd.map(Path::to_path_buf).or(home) {
            spec.cwd = dir;
        }
        let process::Connected {
            running,
            rpc,
            incoming,
        } = process::spawn_connected(&spec)
            .await
            .map_err(|e| failed(provider.name.clone(), e.to_string()))?;
        let refusals = tokio::spawn(refuse_requests(rpc.clone(), incoming));
        Ok(Alone {
            provider,
            env: spec.env,
            rpc,
            ender: Ender {
                pid: running.pid,
                cgroup: running.cgroup.clone(),
                refusals,
                armed: true,
            },
            running,
        })
    }
}

fn listing_failed(provider: String, message: String) -> AcpError {
    AcpError::Listing { provider, message }
}

fn asking_failed(provider: String, message: String) -> AcpError {
    AcpError::Asking { provider, message }
}

/// A provider's agent started alone ([`RuntimeManager::start_alone`]); [`Alone::end`] ends its
/// process group.
struct Alone {
    provider: Provider,
    env: BTreeMap<String, String>,
    rpc: RpcClient,
    running: process::Running,
    ender: Ender,
}

impl Alone {
    /// Ends it (its whole group); its provider's name and what it wrote on stderr.
    async fn end(self) -> (String, StderrTail) {
        let Alone {
            provider,
            running,
            ender,
            ..
        } = self;
        ender.disarm();
        let process::Running {
            pid,
            stderr,
            mut exited,
            cgroup,
        } = running;
        process::terminate_group(pid, None, cgroup.as_deref(), &mut exited, CLOSE_GRACE).await;
        (provider.name, stderr)
    }
}

/// What ends an [`Alone`] dropped without [`Alone::end`] (its client left mid-request and the
/// request's future was dropped): its refusals stop and its group is killed at once. Nothing
/// else would end it: its process belongs to the task that waits for it, and its stdin stays
/// open while the refusals hold the connection.
struct Ender {
    pid: u32,
    cgroup: Option<PathBuf>,
    refusals: tokio::task::JoinHandle<()>,
    armed: bool,
}

impl Ender {
    /// `end` ends the group itself: only the refusals stop here.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Ender {
    fn drop(&mut self) {
        self.refusals.abort();
        if self.armed {
            tracing::info!(
                pid = self.pid,
                "its request was dropped: the agent asked alone is killed"
            );
            process::kill_group_now(self.pid, None, self.cgroup.as_deref());
        }
    }
}

/// Why a listing failed.
enum Failure {
    /// The agent does not advertise `sessionCapabilities.list`.
    Unsupported,
    Agent(String),
}

/// `initialize`, then every page of `session/list` (signing in once if the agent asks and a
/// method fits, as a runtime's start does).
async fn list(
    rpc: &RpcClient,
    provider: &Provider,
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<Vec<ProviderSession>, Failure> {
    let init = ask(
        rpc,
        "initialize",
        // A listing answers no client method.
        handshake::initialize_params(
            &json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}),
        ),
    )
    .await
    .map_err(|e| Failure::Agent(e.to_string()))?;
    let version = handshake::answered_version(&init);
    if version != handshake::PROTOCOL_VERSION {
        return Err(Failure::Agent(handshake::version_mismatch(version)));
    }
    if init
        .pointer("/agentCapabilities/sessionCapabilities/list")
        .is_none_or(Value::is_null)
    {
        return Err(Failure::Unsupported);
    }
    let methods = auth::parse_methods(&init);
    let mut signed_in = false;
    let mut sessions = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut cursors = HashSet::new();
    for _ in 0..MAX_PAGES {
        let mut params = json!({});
        if let Some(cwd) = cwd {
            params["cwd"] = json!(cwd.display().to_string());
        }
        if let Some(cursor) = &cursor {
            params["cursor"] = json!(cursor);
        }
        let page = match ask(rpc, "session/list", params.clone()).await {
            Err(Asked::Rpc(e)) if auth::is_auth_required(&e) && !signed_in => {
                let Some(method) = auth::choose(&methods, provider, env) else {
                    return Err(Failure::Agent(format!(
                        "{e}: {}",
                        auth::how_to_sign_in(provider, &methods)
                    )));
                };
                ask(rpc, "authenticate", json!({"methodId": method.id}))
                    .await
                    .map_err(|e| Failure::Agent(e.to_string()))?;
                signed_in = true;
                ask(rpc, "session/list", params).await
            }
            other => other,
        }
        .map_err(|e| Failure::Agent(e.to_string()))?;
        for info in page
            .get("sessions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(session) = session_info(info, cwd)
                && sessions.len() < MAX_SESSIONS
                && seen.insert(session.session_id.clone())
            {
                sessions.push(session);
            }
        }
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_string);
        match &cursor {
            // A cursor seen before would go round forever.
            Some(next) if cursors.insert(next.clone()) => {}
            _ => break,
        }
    }
    Ok(sessions)
}

/// One `SessionInfo`; `None` without a `sessionId`. A missing `cwd` is the one asked about.
fn session_info(info: &Value, asked: Option<&Path>) -> Option<ProviderSession> {
    let text = |key: &str| {
        info.get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Some(ProviderSession {
        session_id: text("sessionId")?,
        cwd: text("cwd")
            .map(PathBuf::from)
            .or_else(|| asked.map(Path::to_path_buf)),
        title: text("title"),
        updated_at: text("updatedAt"),
    })
}

/// Why one request got no answer.
enum Asked {
    Rpc(RpcError),
    Timeout(&'static str),
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asked::Rpc(e) => write!(f, "{e}"),
            Asked::Timeout(method) => {
                write!(f, "no answer to {method} within {ANSWER_TIMEOUT:?}")
            }
        }
    }
}

async fn ask(rpc: &RpcClient, method: &'static str, params: Value) -> Result<Value, Asked> {
    match tokio::time::timeout(ANSWER_TIMEOUT, rpc.request(method, params)).await {
        Ok(answer) => answer.map_err(Asked::Rpc),
        Err(_) => Err(Asked::Timeout(method)),
    }
}

/// Answers whatever the agent asks with "method not found": nothing runs while it lists.
async fn refuse_requests(rpc: RpcClient, mut incoming: mpsc::Receiver<Incoming>) {
    while let Some(message) = incoming.recv().await {
        match message {
            Incoming::Request { id, method, .. } => {
                rpc.respond(
                    id,
                    Err((
                        METHOD_NOT_FOUND,
                        format!(
                            "drover is only asking about the agent: `{method}` is not available"
                        ),
                    )),
                )
                .await;
            }
            Incoming::Closed => return,
            Incoming::Notification { .. } | Incoming::Garbage(_) => {}
        }
    }
}

/// `; last stderr: a | b`, or nothing.
fn tail(stderr: &StderrTail) -> String {
    crate::LastStderr(stderr.last(5)).to_string()
}
