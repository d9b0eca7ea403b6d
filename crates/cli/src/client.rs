//! The client side of the protocol: finds the daemon (`--url`, `$DROVER_URL`, or the url in
//! `$DROVER_HOME/daemon.json`), connects to `/ws`, says `hello`, and pairs requests with their
//! answers by `requestId`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use drover_daemon::{DAEMON_INFO_FILE, DaemonInfo};
use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, ClientMessage, ClientRequest, DaemonMessage, ErrorCode, HostInfo, PROTOCOL_VERSION,
    UnsupportedVersionInfo, WorkspaceInfo,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::error::CliError;

/// How long connecting and the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the daemon is: the options every client command shares.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The data directory (for `daemon.json` and `token`).
    pub home: PathBuf,
    /// An explicit url (`--url` / `$DROVER_URL`): `http://HOST:PORT` or `ws://HOST:PORT/ws`.
    pub url: Option<String>,
}

impl Endpoint {
    /// What `daemon.json` says, if a daemon published it.
    pub fn published(&self) -> Option<DaemonInfo> {
        read_info(&self.home)
    }

    /// The WebSocket url to connect to, or why there is none.
    fn ws_url(&self) -> Result<String, CliError> {
        let base = match &self.url {
            Some(url) => url.clone(),
            None => match self.published() {
                Some(info) => info.url,
                None => return Err(not_published(&self.home)),
            },
        };
        Ok(ws_url(&base))
    }

    fn token(&self) -> Option<String> {
        read_token(&self.home)
    }
}

/// The client token in `home`, if this user can read one.
pub fn read_token(home: &Path) -> Option<String> {
    std::fs::read_to_string(home.join("token"))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// `daemon.json` in `home`, if it is there and readable.
pub fn read_info(home: &Path) -> Option<DaemonInfo> {
    let bytes = std::fs::read(home.join(DAEMON_INFO_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Why `home` has no `daemon.json` this user can read: none was published (no daemon runs),
/// or this user may not read it (another user's home), which is not the same thing to be told.
pub fn not_published(home: &Path) -> CliError {
    let path = home.join(DAEMON_INFO_FILE);
    let denied = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
    let unreadable = match std::fs::metadata(&path) {
        Err(e) if denied(&e) => Some(e),
        Ok(_) => std::fs::read(&path).err().filter(denied),
        Err(_) => None,
    };
    match unreadable {
        Some(e) => CliError::Unreadable {
            path,
            reason: e.to_string(),
        },
        None => CliError::NotRunning {
            home: home.to_path_buf(),
        },
    }
}

/// `http://h:p` → `ws://h:p/ws`; a `ws://` url is taken as given.
pub fn ws_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.starts_with("ws://") || base.starts_with("wss://") {
        return base.to_string();
    }
    let rest = base
        .strip_prefix("http://")
        .map(|r| format!("ws://{r}"))
        .or_else(|| base.strip_prefix("https://").map(|r| format!("wss://{r}")))
        .unwrap_or_else(|| format!("ws://{base}"));
    if rest.ends_with("/ws") {
        rest
    } else {
        format!("{rest}/ws")
    }
}

/// What `session_state` said on connect.
#[derive(Debug)]
pub struct SessionState {
    pub agents: Vec<AgentInfo>,
    pub workspaces: Vec<WorkspaceInfo>,
    pub hosts: Vec<HostInfo>,
}

/// One session with the daemon.
#[derive(Debug)]
pub struct Connection {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_request: u64,
    /// Messages read while waiting for an answer, in order.
    backlog: VecDeque<DaemonMessage>,
}

impl Connection {
    /// Connects and says `hello`; `include_archived` also lists archived agents in the state.
    pub async fn open(
        endpoint: &Endpoint,
        include_archived: bool,
    ) -> anyhow::Result<(Connection, SessionState)> {
        let url = endpoint.ws_url()?;
        let unreachable = |reason: String| -> CliError {
            if endpoint.url.is_none() {
                // daemon.json outlived its daemon (a crash): nobody is running.
                CliError::NotRunning {
                    home: endpoint.home.clone(),
                }
            } else {
                CliError::Unreachable {
                    url: url.clone(),
                    reason,
                }
            }
        };
        let (socket, _) = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            // Requests go out at once, not after the answer to the one before.
            tokio_tungstenite::connect_async_with_config(&url, None, true),
        )
        .await
        {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => return Err(unreachable(e.to_string()).into()),
            Err(_) => return Err(unreachable("no answer in time".to_string()).into()),
        };
        let mut connection = Connection {
            socket,
            next_request: 0,
            backlog: VecDeque::new(),
        };
        connection
            .send(&ClientRequest::new(rq::Hello {
                client: "drover-cli".to_string(),
                version: Some(env!("CARGO_PKG_VERSION").to_string()),
                protocol_version: PROTOCOL_VERSION,
                capabilities: Vec::new(),
                token: endpoint.token(),
                include_archived,
            }))
            .await?;
        let state = tokio::time::timeout(CONNECT_TIMEOUT, connection.handshake())
            .await
            .map_err(|_| unreachable("no `welcome` in time".to_string()))?
            .map_err(|e| other_protocol(e, endpoint))?;
        Ok((connection, state))
    }

    async fn handshake(&mut self) -> anyhow::Result<SessionState> {
        loop {
            match self.recv().await? {
                DaemonMessage::SessionState {
                    agents,
                    workspaces,
                    hosts,
                } => {
                    return Ok(SessionState {
                        agents,
                        workspaces,
                        hosts,
                    });
                }
                DaemonMessage::RequestError(Answer {
                    body:
                        answers::RequestError {
                            code,
                            message,
                            details,
                            ..
                        },
                    ..
                }) => {
                    return Err(CliError::Daemon {
                        code,
                        message,
                        details,
                    }
                    .into());
                }
                // `welcome` first, and anything else before the state.
                _ => {}
            }
        }
    }

    async fn send(&mut self, message: &ClientRequest) -> anyhow::Result<()> {
        let text = serde_json::to_string(message).context("cannot encode a request")?;
        self.socket
            .send(Message::Text(text.into()))
            .await
            .context("cannot send to the daemon")
    }

    /// Sends `message` with a fresh `requestId` and returns its answer; a `request_error`
    /// becomes [`CliError::Daemon`]. Other messages wait in the backlog.
    pub async fn request(
        &mut self,
        message: impl Into<ClientMessage>,
    ) -> anyhow::Result<DaemonMessage> {
        self.next_request += 1;
        let id = format!("cli-{}", self.next_request);
        self.send(&ClientRequest::with_id(id.clone(), message))
            .await?;
        loop {
            let message = self.read().await?;
            if message.request_id() != Some(id.as_str()) {
                self.backlog.push_back(message);
                continue;
            }
            if let DaemonMessage::RequestError(Answer {
                body:
                    answers::RequestError {
                        code,
                        message,
                        details,
                        ..
                    },
                ..
            }) = message
            {
                let message = for_the_command_line(&code, message, details.as_ref());
                return Err(CliError::Daemon {
                    code,
                    message,
                    details,
                }
                .into());
            }
            return Ok(message);
        }
    }

    /// Forgets the events that arrived while waiting for answers (a long loop of requests
    /// that reads none of them must not keep them all).
    pub fn discard_backlog(&mut self) {
        self.backlog.clear();
    }

    /// The next message: from the backlog first, then the socket.
    pub async fn recv(&mut self) -> anyhow::Result<DaemonMessage> {
        match self.backlog.pop_front() {
            Some(message) => Ok(message),
            None => self.read().await,
        }
    }

    async fn read(&mut self) -> anyhow::Result<DaemonMessage> {
        loop {
            let frame = self
                .socket
                .next()
                .await
                .ok_or_else(|| anyhow::anyhow!("the daemon closed the connection"))?
                .context("lost the connection to the daemon")?;
            match frame {
                Message::Text(text) => {
                    // A newer daemon may send messages this client does not know: skip them.
                    if let Ok(message) = serde_json::from_str::<DaemonMessage>(&text) {
                        return Ok(message);
                    }
                }
                Message::Close(frame) => {
                    let reason = frame
                        .map(|f| f.reason.to_string())
                        .filter(|r| !r.is_empty())
                        .unwrap_or_else(|| "no reason given".to_string());
                    anyhow::bail!("the daemon closed the connection ({reason})");
                }
                _ => {}
            }
        }
    }

    /// Says goodbye (best effort).
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// A daemon's refusal of this drover's protocol (`unsupported_version` in answer to `hello`) as
/// what the user does about it: a daemon of another drover, to stop and start again. Any other
/// error is kept.
fn other_protocol(error: anyhow::Error, endpoint: &Endpoint) -> anyhow::Error {
    match error.downcast::<CliError>() {
        Ok(CliError::Daemon {
            code,
            message,
            details,
        }) if ErrorCode::parse(&code) == Some(ErrorCode::UnsupportedVersion) => {
            let typed = details
                .and_then(|d| serde_json::from_value::<UnsupportedVersionInfo>(d).ok())
                .map(|info| info.protocol_version);
            CliError::OtherProtocol {
                theirs: typed.or_else(|| spoken_protocol(&message)),
                url: endpoint.url.clone(),
            }
            .into()
        }
        Ok(other) => other.into(),
        Err(error) => error,
    }
}

/// The protocol a daemon's `unsupported_version` names as its own, for a daemon from before
/// its `details` said it: every drover's message says "this daemon speaks protocol N".
fn spoken_protocol(message: &str) -> Option<u32> {
    let (_, rest) = message.split_once("speaks protocol ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A daemon's refusal as a user of the command line acts on it: a spent budget names the agent
/// by its handle, and the `drover budget` command that raises it.
fn for_the_command_line(code: &str, message: String, details: Option<&Value>) -> String {
    if ErrorCode::parse(code) != Some(ErrorCode::BudgetExhausted) {
        return by_handles(&message);
    }
    let field = |name| details.and_then(|d| d.get(name)).and_then(Value::as_str);
    // The hub's budget over a subagent it made here: raised on the hub, where the message
    // already says so.
    if field("upstream").is_some() {
        return by_handles(&message);
    }
    let Some(agent) = field("agentId") else {
        return message;
    };
    let hex = agent.replace('-', "");
    let handle = &hex[hex.len().saturating_sub(8)..];
    format!(
        "{}; raise it with `drover budget {handle} --tokens N` (or `--cost X`; the limits \
         given replace the old ones), or lift it with `drover budget {handle} --clear`",
        by_handles(&message)
    )
}

/// `message` with each agent or workspace the daemon names by its full id (`` `ID` ``) named
/// by its handle instead, as every other line of the CLI names it; the words around it stay
/// ("agent 7efb7ac5", "subagent 7efb7ac5").
fn by_handles(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find('`') {
        let quoted = &rest[start + 1..];
        let Some(end) = quoted.find('`') else { break };
        let id = &quoted[..end];
        if is_uuid(id) {
            out.push_str(&rest[..start]);
            out.push_str(&id[id.len() - 8..]);
        } else {
            out.push_str(&rest[..=start + end + 1]);
        }
        rest = &quoted[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Whether `s` is written as a UUID: 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

#[cfg(test)]
mod tests {
    use super::{by_handles, ws_url};

    #[test]
    fn urls_become_websocket_urls() {
        assert_eq!(ws_url("http://127.0.0.1:7433"), "ws://127.0.0.1:7433/ws");
        assert_eq!(ws_url("http://127.0.0.1:7433/"), "ws://127.0.0.1:7433/ws");
        assert_eq!(ws_url("ws://127.0.0.1:1/ws"), "ws://127.0.0.1:1/ws");
        assert_eq!(ws_url("127.0.0.1:9"), "ws://127.0.0.1:9/ws");
    }

    #[test]
    fn the_daemons_full_ids_become_handles() {
        let id = "01a24ab9-2bf2-704c-ace9-60ef7efb7ac5";
        assert_eq!(
            by_handles(&format!("agent `{id}` has no pending permission request")),
            "agent 7efb7ac5 has no pending permission request"
        );
        assert_eq!(
            by_handles(&format!("its subagent `{id}` here")),
            "its subagent 7efb7ac5 here"
        );
        assert_eq!(
            by_handles(&format!("workspace `{id}` is archived; `job-3` and `x`")),
            "workspace 7efb7ac5 is archived; `job-3` and `x`"
        );
        assert_eq!(by_handles("a ` lone backtick"), "a ` lone backtick");
    }
}
