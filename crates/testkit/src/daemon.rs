//! A real daemon for tests, in this process (`drover_daemon::run` on 127.0.0.1:0), with the
//! scripted agent as provider `scripted`, and a small WebSocket client for the protocol.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for any one message.
pub const WAIT: Duration = Duration::from_secs(20);

/// A daemon running in this process; stopped (in order) on drop or [`TestDaemon::stop`].
#[derive(Debug)]
pub struct TestDaemon {
    pub home: PathBuf,
    pub cwd: TempDir,
    pub url: String,
    /// `ws://127.0.0.1:PORT/ws`.
    pub ws_url: String,
    home_dir: Option<TempDir>,
    _state: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestDaemon {
    /// A daemon on a fresh home.
    pub async fn start() -> TestDaemon {
        let home = TempDir::new().expect("home");
        let path = home.path().to_path_buf();
        Self::start_in(path, Some(home), false).await
    }

    /// A daemon on a fresh home and a client of it that has said `hello`.
    pub async fn start_with_client() -> (TestDaemon, Client) {
        let daemon = Self::start().await;
        let (client, _) = daemon.client().await;
        (daemon, client)
    }

    /// A daemon on `home` (kept by the caller); with `no_token`, one that lets clients in
    /// without the token (`--no-token`).
    pub async fn start_in(home: PathBuf, keep: Option<TempDir>, no_token: bool) -> TestDaemon {
        Self::start_at(home, keep, no_token, "127.0.0.1:0").await
    }

    /// As [`TestDaemon::start_in`], listening on `addr` (a restart on the port a browser
    /// page reconnects to).
    pub async fn start_at(
        home: PathBuf,
        keep: Option<TempDir>,
        no_token: bool,
        addr: &str,
    ) -> TestDaemon {
        let state = TempDir::new().expect("agent state");
        let config = crate::scripted_config(&crate::scripted_agent_bin(), state.path());
        Self::start_with(home, keep, no_token, state, config, addr).await
    }

    /// A daemon on a fresh home listening on `addr` (say another loopback address), letting
    /// `Host` name it as `allowed_hosts` too (`--allow-host`).
    pub async fn start_allowing(addr: &str, allowed_hosts: &[&str]) -> TestDaemon {
        let home = TempDir::new().expect("home");
        let path = home.path().to_path_buf();
        let state = TempDir::new().expect("agent state");
        let config = crate::scripted_config(&crate::scripted_agent_bin(), state.path());
        let hosts = allowed_hosts.iter().map(ToString::to_string).collect();
        Self::start_configured(
            path,
            Some(home),
            false,
            state,
            config,
            addr,
            None,
            true,
            hosts,
        )
        .await
    }

    /// A daemon on a fresh home that sends every streamed chunk as its own `append`, to every
    /// session (no joining window, and a session that is behind joins nothing), for tests
    /// that need many updates.
    pub async fn start_unjoined() -> TestDaemon {
        Self::start_unwindowed(false).await
    }

    /// A daemon on a fresh home with no joining window: a client that keeps up gets every
    /// streamed chunk as its own `append`; one that is behind gets what waits for it joined.
    pub async fn start_windowless() -> TestDaemon {
        Self::start_unwindowed(true).await
    }

    async fn start_unwindowed(join: bool) -> TestDaemon {
        let home = TempDir::new().expect("home");
        let path = home.path().to_path_buf();
        let state = TempDir::new().expect("agent state");
        let config = crate::scripted_config(&crate::scripted_agent_bin(), state.path());
        Self::start_windowed(
            path,
            Some(home),
            false,
            state,
            config,
            "127.0.0.1:0",
            Some(Duration::ZERO),
            join,
        )
        .await
    }

    /// A daemon on `home` with this `config.toml` (the scripted provider is not added).
    pub async fn start_with_config(
        home: PathBuf,
        keep: Option<TempDir>,
        config: String,
    ) -> TestDaemon {
        let state = TempDir::new().expect("agent state");
        Self::start_with(home, keep, false, state, config, "127.0.0.1:0").await
    }

    /// A daemon on a fresh home with this `config.toml` (the scripted provider is not added).
    pub async fn start_fresh_with_config(config: String) -> TestDaemon {
        let home = TempDir::new().expect("home");
        Self::start_with_config(home.path().to_path_buf(), Some(home), config).await
    }

    /// A daemon on a fresh home with the scripted provider, `env` (TOML `KEY = "value"` pairs,
    /// or nothing) added to the provider's environment and `extra` appended to `config.toml`;
    /// the agents' state dir goes with it.
    pub async fn start_scripted(env: &str, extra: &str) -> (TestDaemon, TempDir) {
        let state = TempDir::new().expect("agent state");
        let mut config = crate::scripted_config(&crate::scripted_agent_bin(), state.path());
        if !env.is_empty() {
            config = config.replacen("env = { ", &format!("env = {{ {env}, "), 1);
        }
        if !extra.is_empty() {
            config = format!("{config}\n{extra}\n");
        }
        (Self::start_fresh_with_config(config).await, state)
    }

    async fn start_with(
        home: PathBuf,
        keep: Option<TempDir>,
        no_token: bool,
        state: TempDir,
        config: String,
        addr: &str,
    ) -> TestDaemon {
        Self::start_windowed(home, keep, no_token, state, config, addr, None, true).await
    }

    #[expect(clippy::too_many_arguments)] // as `start_configured`
    async fn start_windowed(
        home: PathBuf,
        keep: Option<TempDir>,
        no_token: bool,
        state: TempDir,
        config: String,
        addr: &str,
        stream_window: Option<Duration>,
        join: bool,
    ) -> TestDaemon {
        Self::start_configured(
            home,
            keep,
            no_token,
            state,
            config,
            addr,
            stream_window,
            join,
            Vec::new(),
        )
        .await
    }

    #[expect(clippy::too_many_arguments)] // the private constructor every public one calls
    async fn start_configured(
        home: PathBuf,
        keep: Option<TempDir>,
        no_token: bool,
        state: TempDir,
        config: String,
        addr: &str,
        stream_window: Option<Duration>,
        join: bool,
        allowed_hosts: Vec<String>,
    ) -> TestDaemon {
        crate::hermetic::in_process();
        std::fs::create_dir_all(&home).expect("home");
        std::fs::write(home.join("config.toml"), config).expect("config.toml");
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut config = drover_daemon::DaemonConfig::new(&home, addr).expect("config");
        config.no_token = no_token;
        config.allowed_hosts = allowed_hosts;
        // The default window unless the test asks for another, whatever the caller's shell
        // says in DROVER_STREAM_WINDOW_MS.
        config.stream_window =
            stream_window.unwrap_or(drover_daemon::config::DEFAULT_STREAM_WINDOW);
        // Whatever DROVER_STREAM_JOIN says.
        config.stream_join = join;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = drover_daemon::run(listener, config, shutdown).await {
                panic!("daemon failed: {e}");
            }
        });
        let daemon = TestDaemon {
            home,
            cwd: TempDir::new().expect("cwd"),
            url: format!("http://{addr}"),
            ws_url: format!("ws://{addr}/ws"),
            home_dir: keep,
            _state: state,
            stop: Some(stop),
            task: Some(task),
        };
        // Serving once daemon.json is there.
        let daemon_json = daemon.home.join("daemon.json");
        crate::wait::eventually("the daemon to start (daemon.json)", WAIT, async || {
            daemon_json.exists()
        })
        .await;
        daemon
    }

    /// The agents' working directory, canonical.
    pub fn cwd(&self) -> PathBuf {
        std::fs::canonicalize(self.cwd.path()).expect("cwd")
    }

    /// Stops the daemon and waits for its ordered shutdown.
    pub async fn stop(mut self) -> (PathBuf, Option<TempDir>) {
        self.shutdown().await;
        (self.home.clone(), self.home_dir.take())
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(WAIT, task).await;
        }
    }

    /// The client token (`$DROVER_HOME/token`), when the daemon keeps one.
    pub fn token(&self) -> Option<String> {
        let token = std::fs::read_to_string(self.home.join("token")).ok()?;
        Some(token.trim().to_owned())
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// `GET /health` with the token: the daemon's details.
    pub async fn health(&self) -> Value {
        let bearer = format!("Authorization: Bearer {}", self.token().unwrap_or_default());
        let (status, body) = http(self.addr(), "GET", "/health", self.addr(), &[&bearer]).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("health is JSON")
    }

    /// A client that has said `hello` (with the token) and read `welcome` and `session_state`.
    pub async fn client(&self) -> (Client, Value) {
        let mut client = Client::connect(&self.ws_url).await;
        let state = client.hello(self.token().as_deref()).await;
        (client, state)
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A protocol client: JSON frames over a WebSocket, every wait bounded.
#[derive(Debug)]
pub struct Client {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_request: u64,
    /// Messages read while waiting for another one.
    backlog: Vec<Value>,
}

impl Client {
    pub async fn connect(url: &str) -> Client {
        Self::connect_with(url, &[]).await.expect("connect")
    }

    /// Connects with extra headers (e.g. `Origin`); the error is the refused handshake.
    pub async fn connect_with(url: &str, headers: &[(&str, &str)]) -> Result<Client, String> {
        let mut request = url.into_client_request().map_err(|e| e.to_string())?;
        for (k, v) in headers {
            request.headers_mut().insert(
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| e.to_string())?,
                v.parse().map_err(
                    |e: tokio_tungstenite::tungstenite::http::header::InvalidHeaderValue| {
                        e.to_string()
                    },
                )?,
            );
        }
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Client {
            socket,
            next_request: 0,
            backlog: Vec::new(),
        })
    }

    /// Sends `hello`; returns the `session_state` payload.
    pub async fn hello(&mut self, token: Option<&str>) -> Value {
        self.send(json!({"type": "hello", "client": "test", "protocolVersion": 2, "token": token}))
            .await;
        let welcome = self.recv_type("welcome").await;
        assert_eq!(welcome["payload"]["protocolVersion"], 2);
        self.recv_type("session_state").await["payload"].clone()
    }

    pub async fn send(&mut self, message: Value) {
        self.send_text(message.to_string()).await;
    }

    pub async fn send_text(&mut self, text: String) {
        self.socket
            .send(Message::Text(text.into()))
            .await
            .expect("send");
    }

    /// Sends a request with a fresh `requestId` and returns the answer carrying it.
    pub async fn request(&mut self, mut message: Value) -> Value {
        self.next_request += 1;
        let id = format!("r{}", self.next_request);
        message["requestId"] = json!(id);
        self.send(message).await;
        self.recv_where(|m| m["payload"]["requestId"] == json!(id))
            .await
    }

    /// The next message (from the backlog first).
    pub async fn recv(&mut self) -> Value {
        if !self.backlog.is_empty() {
            return self.backlog.remove(0);
        }
        self.read().await.expect("the daemon closed the connection")
    }

    /// Reads the next frame from the socket: `None` when the connection closed.
    pub async fn read(&mut self) -> Option<Value> {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("no message from the daemon in time")?;
            match frame {
                Ok(Message::Text(text)) => {
                    return Some(serde_json::from_str(&text).expect("JSON from the daemon"));
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The close frame's code once the daemon closes the connection.
    pub async fn close_code(&mut self) -> Option<u16> {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .ok()??;
            match frame {
                Ok(Message::Close(Some(frame))) => return Some(frame.code.into()),
                Ok(Message::Close(None)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The first message matching `want`; others are kept for later `recv`s.
    pub async fn recv_where(&mut self, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&want) {
            return self.backlog.remove(i);
        }
        loop {
            let message = self.read().await.expect("the daemon closed the connection");
            if want(&message) {
                return message;
            }
            self.backlog.push(message);
        }
    }

    pub async fn recv_type(&mut self, kind: &str) -> Value {
        self.recv_where(|m| m["type"] == kind).await
    }

    /// Messages received so far and not yet taken.
    pub fn backlog(&self) -> &[Value] {
        &self.backlog
    }

    /// Creates an agent with `fields` (those of `create_agent`: provider, cwd, prompt, title,
    /// ...); its id. Fails the test unless it was created.
    pub async fn create_agent(&mut self, fields: Value) -> String {
        let mut message = json!({"type": "create_agent"});
        for (k, v) in fields.as_object().expect("create_agent's fields") {
            message[k] = v.clone();
        }
        let created = self.request(message).await;
        assert_eq!(created["type"], "agent_created", "{created}");
        string_at(&created["payload"]["agent"]["id"])
    }

    /// Creates an agent of the scripted provider in `cwd` with `fields` (those of
    /// `create_agent`: prompt, title, ...); its id. Fails the test unless it was created.
    pub async fn create_scripted(&mut self, cwd: &Path, fields: Value) -> String {
        let mut all = json!({"provider": "scripted", "cwd": cwd});
        for (k, v) in fields.as_object().expect("create_agent's fields") {
            all[k] = v.clone();
        }
        self.create_agent(all).await
    }

    /// `initialize_agent_request`: this client catches up on the agent's timeline. Fails the
    /// test unless the daemon answers `agent_initialized`.
    pub async fn initialize_agent(&mut self, agent: &str) {
        let init = self
            .request(json!({"type": "initialize_agent_request", "agentId": agent}))
            .await;
        assert_eq!(init["type"], "agent_initialized", "{init}");
    }

    /// `send_message` of `text` to the agent, delivered as the daemon's default does. Fails
    /// the test unless it was queued.
    pub async fn send_message(&mut self, agent: &str, text: &str) {
        let queued = self
            .request(json!({"type": "send_message", "agentId": agent, "text": text}))
            .await;
        assert_eq!(queued["type"], "message_queued", "{queued}");
    }

    /// `get_agent`: the agent's record. Fails the test unless the daemon answers `agent`.
    pub async fn get_agent(&mut self, agent: &str) -> Value {
        let got = self
            .request(json!({"type": "get_agent", "agentId": agent}))
            .await;
        assert_eq!(got["type"], "agent", "{got}");
        got["payload"]["agent"].clone()
    }

    /// The agent as `list_agents` (archived ones included) shows it; fails the test when it is
    /// not listed.
    pub async fn listed_agent(&mut self, agent: &str) -> Value {
        self.agents(true)
            .await
            .into_iter()
            .find(|a| a["id"] == agent)
            .unwrap_or_else(|| panic!("agent {agent} not listed"))
    }

    /// Waits (at most [`WAIT`]) until `list_agents` shows the agent with this `status`.
    pub async fn wait_status(&mut self, agent: &str, status: &str) {
        crate::wait::eventually(format!("agent {agent} to be {status}"), WAIT, async || {
            self.listed_agent(agent).await["status"] == status
        })
        .await;
    }

    /// The texts of the agent's `notice` items, in order.
    pub async fn notices(&mut self, agent: &str) -> Vec<String> {
        self.texts_of(agent, "notice").await
    }

    /// The `text` of each of the agent's timeline items of this `kind`, in order.
    pub async fn texts_of(&mut self, agent: &str, kind: &str) -> Vec<String> {
        self.timeline(agent)
            .await
            .iter()
            .filter(|i| i["kind"] == kind)
            .filter_map(|i| i["data"]["text"].as_str().map(str::to_string))
            .collect()
    }

    /// Waits (at most 20 s) for the agent to be idle with nothing queued; fails if it is not.
    pub async fn wait_idle(&mut self, agent: &str) {
        let idle = self
            .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 20000}))
            .await;
        assert_eq!(idle["payload"]["idle"], true, "{idle}");
    }

    /// The texts of the agent's `agent_message` items, in order.
    pub async fn replies(&mut self, agent: &str) -> Vec<String> {
        self.texts_of(agent, "agent_message").await
    }

    /// The agent's timeline items (`fetch_timeline`, up to 1000).
    pub async fn timeline(&mut self, agent: &str) -> Vec<Value> {
        let page = self
            .request(json!({"type": "fetch_timeline", "agentId": agent, "limit": 1000}))
            .await;
        page["payload"]["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The agent's `user_message` items whose `source` starts with `source` (`job:`,
    /// `schedule:`, ...), in order.
    pub async fn messages_from(&mut self, agent: &str, source: &str) -> Vec<Value> {
        self.timeline(agent)
            .await
            .into_iter()
            .filter(|i| {
                i["kind"] == "user_message"
                    && i["data"]["source"]
                        .as_str()
                        .is_some_and(|s| s.starts_with(source))
            })
            .collect()
    }

    /// The `event` of each `turn_ended` item of the agent, in order.
    pub async fn turn_events(&mut self, agent: &str) -> Vec<String> {
        self.timeline(agent)
            .await
            .iter()
            .filter(|i| i["kind"] == "turn_ended")
            .map(|i| i["data"]["event"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// `list_agents`.
    pub async fn agents(&mut self, include_archived: bool) -> Vec<Value> {
        let list = self
            .request(json!({"type": "list_agents", "includeArchived": include_archived}))
            .await;
        list["payload"]["agents"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets the messages received so far and not yet taken.
    pub fn clear_backlog(&mut self) {
        self.backlog.clear();
    }

    /// Waits until an `agent_update` for `agent` satisfies `want`.
    pub async fn update_where(&mut self, agent: &str, want: impl Fn(&Value) -> bool) -> Value {
        self.recv_where(|m| {
            m["type"] == "agent_update"
                && m["payload"]["agentId"] == agent
                && want(&m["payload"]["notification"])
        })
        .await
    }
}

/// The string at `value` (an id in an answer, say), owned; fails the test when there is none.
pub fn string_at(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("a string, not {value}"))
        .to_string()
}

/// The first entry of the array `list` that `want` picks, owned; fails the test, naming
/// `what`, when there is none.
pub fn find_where(list: &Value, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    list.as_array()
        .unwrap_or_else(|| panic!("{what}: no list in {list}"))
        .iter()
        .find(|v| want(v))
        .cloned()
        .unwrap_or_else(|| panic!("{what}: not in {list}"))
}

/// Writes the scripted provider into an existing home's config (for a daemon started as a
/// process).
pub fn write_scripted_config(home: &Path, state_dir: &Path) {
    let config = crate::scripted_config(&crate::scripted_agent_bin(), state_dir);
    std::fs::write(home.join("config.toml"), config).expect("config.toml");
}

/// One HTTP/1.1 request as written, with this `Host` and these header lines and nothing else
/// added (no client library fills anything in): the status and the body.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    host: &str,
    headers: &[&str],
) -> (u16, String) {
    http_with_body(addr, method, path, host, headers, "").await
}

/// As [`http`], with `body` after the head (give its `Content-Length` among `headers`).
pub async fn http_with_body(
    addr: &str,
    method: &str,
    path: &str,
    host: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut response))
        .await
        .expect("HTTP answer in time")
        .expect("read");
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}
