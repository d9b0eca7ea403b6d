//! The client protocol through the real daemon (in this process, on 127.0.0.1:0, with the
//! scripted agent as provider `scripted`), checked as a client would notice it: the
//! handshake, lazy and idempotent initialization, who gets which stream, reconnects, many
//! clients, refusals, malformed input, every request, paging, and a slow client.
//!
//! Every wait is bounded (`WAIT` per message in the testkit client, `deadline`s here).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use drover_fakes::procs;
use drover_testkit::daemon::{Client, TestDaemon, WAIT, find_where};
use drover_testkit::wait::poll_until;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

// ---- helpers ------------------------------------------------------------------------------

/// Creates a scripted agent; returns its `agent` info.
async fn create(client: &mut Client, cwd: &Path, prompt: Option<&str>) -> Value {
    create_with(client, json!({"cwd": cwd, "prompt": prompt})).await
}

async fn create_with(client: &mut Client, fields: Value) -> Value {
    let mut message = json!({"type": "create_agent", "provider": "scripted"});
    for (k, v) in fields.as_object().expect("fields") {
        message[k] = v.clone();
    }
    let answer = client.request(message).await;
    assert_eq!(answer["type"], "agent_created", "{answer}");
    answer["payload"]["agent"].clone()
}

fn id_of(agent: &Value) -> String {
    agent["id"].as_str().expect("agent id").to_string()
}

async fn wait_idle(client: &mut Client, id: &str) {
    let answer = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 15_000}))
        .await;
    assert_eq!(answer["type"], "idle", "{answer}");
    assert_eq!(answer["payload"]["idle"], true, "agent {id} did not settle");
}

async fn send(client: &mut Client, id: &str, text: &str, delivery: &str) -> Value {
    let answer = client
        .request(json!({"type": "send_message", "agentId": id, "text": text, "delivery": delivery}))
        .await;
    assert_eq!(answer["type"], "message_queued", "{answer}");
    answer
}

/// Every timeline item of the agent, oldest first.
async fn timeline(client: &mut Client, id: &str) -> Vec<Value> {
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "limit": 1000}))
        .await;
    assert_eq!(page["type"], "timeline_page", "{page}");
    page["payload"]["items"].as_array().expect("items").clone()
}

fn texts(items: &[Value], kind: &str) -> Vec<String> {
    items
        .iter()
        .filter(|i| i["kind"] == kind)
        .map(|i| i["data"]["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn kinds(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| i["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Asserts a `request_error` with `code`; returns its payload.
fn expect_error(answer: &Value, code: &str) -> Value {
    assert_eq!(answer["type"], "request_error", "{answer}");
    assert_eq!(answer["payload"]["code"], code, "{answer}");
    assert!(
        answer["payload"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{answer}"
    );
    answer["payload"].clone()
}

/// Waits for an `agent_status` of `id` that satisfies `want`.
async fn status_where(client: &mut Client, id: &str, want: impl Fn(&Value) -> bool) -> Value {
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == id
                && want(&m["payload"]["agent"])
        })
        .await["payload"]["agent"]
        .clone()
}

/// Waits until the turn carrying `text` started (its `user_message` item; the session must
/// have initialized the agent).
async fn started(client: &mut Client, id: &str, text: &str) {
    client
        .update_where(id, |n| {
            n["op"] == "item"
                && n["item"]["kind"] == "user_message"
                && n["item"]["data"]["text"] == text
        })
        .await;
}

/// Waits for the `item` notification of a `turn_ended` of `id`.
async fn turn_ended(client: &mut Client, id: &str) -> Value {
    client
        .update_where(id, |n| {
            n["op"] == "item" && n["item"]["kind"] == "turn_ended"
        })
        .await["payload"]["notification"]["item"]
        .clone()
}

/// What a client builds from `agent_initialized` and the `agent_update`s after it.
#[derive(Debug, Default)]
struct View {
    items: BTreeMap<u64, Value>,
}

impl View {
    fn from_initialized(answer: &Value) -> View {
        assert_eq!(answer["type"], "agent_initialized", "{answer}");
        let mut view = View::default();
        for update in answer["payload"]["updates"].as_array().expect("updates") {
            assert_eq!(update["notification"]["op"], "item", "{update}");
            view.apply(&update["notification"]);
        }
        view
    }

    fn apply(&mut self, notification: &Value) {
        match notification["op"].as_str() {
            Some("item") => {
                let item = notification["item"].clone();
                let seq = item["seq"].as_u64().expect("seq");
                assert!(
                    !self.items.contains_key(&seq),
                    "item {seq} delivered twice: {notification}"
                );
                if let Some((&last, _)) = self.items.last_key_value() {
                    assert!(seq > last, "item {seq} after {last}: out of order");
                }
                self.items.insert(seq, item);
            }
            Some("append") => {
                let seq = notification["seq"].as_u64().expect("seq");
                let field = notification["field"].as_str().expect("field");
                let item = self
                    .items
                    .get_mut(&seq)
                    .unwrap_or_else(|| panic!("append to unknown item {seq}: {notification}"));
                let text = notification["text"].as_str().expect("text");
                match &mut item["data"][field] {
                    Value::String(s) => s.push_str(text),
                    other => *other = json!(text),
                }
            }
            Some("patch") => {
                let seq = notification["seq"].as_u64().expect("seq");
                if let Some(item) = self.items.get_mut(&seq) {
                    for (k, v) in notification["fields"].as_object().expect("fields") {
                        item["data"][k] = v.clone();
                    }
                    // docs/protocol.md: the item's updatedAt becomes the patch's `at`.
                    if let Some(at) = notification.get("at") {
                        item["updatedAt"] = at.clone();
                    }
                }
            }
            other => panic!("unknown op {other:?}: {notification}"),
        }
    }

    fn items(&self) -> Vec<Value> {
        self.items.values().cloned().collect()
    }
}

/// Applies every `agent_update` of `id` until a `turn_ended` item (inclusive).
async fn follow_turn(client: &mut Client, id: &str, view: &mut View) {
    loop {
        let message = client
            .recv_where(|m| m["type"] == "agent_update" && m["payload"]["agentId"] == id)
            .await;
        let notification = &message["payload"]["notification"];
        view.apply(notification);
        if notification["op"] == "item" && notification["item"]["kind"] == "turn_ended" {
            return;
        }
    }
}

/// Asserts that `actual` is `expected`, showing only where they part (the texts are long).
fn assert_same_text(actual: Option<&str>, expected: &str, context: &str) {
    let actual = actual.unwrap_or_else(|| panic!("{context}: no text"));
    if actual == expected {
        return;
    }
    let at = actual
        .char_indices()
        .zip(expected.chars())
        .find(|((_, a), e)| a != e)
        .map_or(actual.len().min(expected.len()), |((i, _), _)| i);
    let around = |s: &str| {
        let (start, end) = (at.saturating_sub(40), (at + 40).min(s.len()));
        String::from_utf8_lossy(&s.as_bytes()[start.min(end)..end]).into_owned()
    };
    panic!(
        "{context}: the texts part at byte {at} ({} vs {} bytes)\n got: {:?}\nwant: {:?}",
        actual.len(),
        expected.len(),
        around(actual),
        around(expected)
    );
}

fn stream_text(n: usize) -> String {
    let mut text = String::new();
    for i in 1..=n {
        writeln!(text, "chunk {i}").expect("write to a String");
    }
    text
}

/// The scripted-agent processes whose working directory is `cwd` (Linux: from `/proc`).
fn agent_pids(cwd: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = procs::all()
        .into_iter()
        .filter(|p| {
            p.argv()
                .first()
                .is_some_and(|bin| bin.ends_with("drover-scripted-agent"))
                && p.cwd().is_some_and(|d| d == cwd)
        })
        .map(|p| p.pid)
        .collect();
    pids.sort_unstable();
    pids
}

/// A bare WebSocket client, for what the testkit client does not do: binary frames, a tiny
/// receive buffer, not reading at all.
struct Raw {
    socket: WebSocketStream<TcpStream>,
}

impl Raw {
    /// Connects; with `recv_buffer`, the socket's receive buffer is that small, so that a
    /// client that stops reading stalls the daemon's writes quickly.
    async fn connect(ws_url: &str, recv_buffer: Option<u32>) -> Raw {
        let addr: std::net::SocketAddr = ws_url
            .trim_start_matches("ws://")
            .trim_end_matches("/ws")
            .parse()
            .expect("address");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        if let Some(size) = recv_buffer {
            socket.set_recv_buffer_size(size).expect("SO_RCVBUF");
        }
        let stream = socket.connect(addr).await.expect("connect");
        let (socket, _) = tokio_tungstenite::client_async(ws_url, stream)
            .await
            .expect("handshake");
        Raw { socket }
    }

    async fn send(&mut self, message: Value) {
        self.socket
            .send(Message::Text(message.to_string().into()))
            .await
            .expect("send");
    }

    async fn recv(&mut self) -> Value {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("a message in time")
                .expect("open")
                .expect("frame");
            if let Message::Text(text) = frame {
                return serde_json::from_str(&text).expect("JSON");
            }
        }
    }

    async fn recv_type(&mut self, kind: &str) -> Value {
        loop {
            let message = self.recv().await;
            if message["type"] == kind {
                return message;
            }
        }
    }
}

// ---- handshake ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_sends_welcome_then_session_state_without_archived_agents() {
    let daemon = TestDaemon::start().await;
    let (mut setup, state) = daemon.client().await;
    assert_eq!(state, json!({"agents": [], "workspaces": []}));
    let kept = create_with(
        &mut setup,
        json!({"cwd": daemon.cwd(), "title": "kept", "labels": {"team": "a"}}),
    )
    .await;
    let gone = create_with(&mut setup, json!({"cwd": daemon.cwd(), "title": "gone"})).await;
    let archived = setup
        .request(json!({"type": "archive", "agentId": id_of(&gone)}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");

    // The handshake, frame by frame.
    let mut client = Client::connect(&daemon.ws_url).await;
    client
        .send(json!({"type": "hello", "client": "protocol-test", "version": "1.0", "protocolVersion": 1, "token": daemon.token(), "capabilities": ["x"]}))
        .await;
    // A client of protocol 1 is still served (2 only added); `welcome` names this daemon's.
    let welcome = client.recv().await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    assert_eq!(
        welcome["payload"]["protocolVersion"],
        drover_protocol::PROTOCOL_VERSION
    );
    assert_eq!(
        welcome["payload"]["daemonVersion"],
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        welcome["payload"]["sessionId"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    let state = client.recv().await;
    assert_eq!(state["type"], "session_state", "{state}");
    let agents = state["payload"]["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "archived agents are left out: {state}");
    let agent = &agents[0];
    assert_eq!(agent["id"], kept["id"]);
    for field in [
        "id",
        "status",
        "createdAt",
        "type",
        "sessionId",
        "error",
        "currentModeId",
        "availableModes",
        "title",
        "cwd",
        "parentAgentId",
        "workspaceId",
        "labels",
        "archivedAt",
        "requiresAttention",
        "attentionReason",
    ] {
        assert!(agent.get(field).is_some(), "`{field}` missing from {agent}");
    }
    assert_eq!(agent["type"], "scripted");
    assert_eq!(agent["title"], "kept");
    assert_eq!(agent["labels"], json!({"team": "a"}));
    assert_eq!(agent["cwd"], json!(daemon.cwd()));
    assert_eq!(agent["parentAgentId"], Value::Null);
    assert_eq!(agent["archivedAt"], Value::Null);
    let workspaces = state["payload"]["workspaces"]
        .as_array()
        .expect("workspaces");
    assert_eq!(workspaces.len(), 1, "{state}");
    assert_eq!(workspaces[0]["id"], agent["workspaceId"]);
    assert_eq!(workspaces[0]["path"], json!(daemon.cwd()));
    assert!(workspaces[0].get("activity").is_some(), "{state}");

    // Archived agents on request.
    let mut all = Client::connect(&daemon.ws_url).await;
    all.send(
        json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": daemon.token(), "includeArchived": true}),
    )
    .await;
    let state = all.recv_type("session_state").await;
    let agents = state["payload"]["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 2, "{state}");
    let archived = agents
        .iter()
        .find(|a| a["id"] == gone["id"])
        .expect("archived agent");
    assert!(archived["archivedAt"].is_string(), "{archived}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_hello_sends_the_state_again_and_keeps_subscriptions() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = id_of(&create(&mut client, &daemon.cwd(), None).await);
    wait_idle(&mut client, &id).await;
    let init = client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let mut view = View::from_initialized(&init);
    client
        .send(
            json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": daemon.token()}),
        )
        .await;
    let welcome = client.recv_type("welcome").await;
    let state = client.recv_type("session_state").await;
    assert_eq!(state["payload"]["agents"][0]["id"], id.as_str());
    let again = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(again["type"], "agents");
    // Same session, still subscribed.
    client
        .send(
            json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": daemon.token()}),
        )
        .await;
    assert_eq!(
        client.recv_type("welcome").await["payload"]["sessionId"],
        welcome["payload"]["sessionId"]
    );
    send(&mut client, &id, "say still here", "followup").await;
    follow_turn(&mut client, &id, &mut view).await;
    assert_eq!(texts(&view.items(), "agent_message"), ["still here"]);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_before_hello_get_hello_required() {
    let daemon = TestDaemon::start().await;
    let mut client = Client::connect(&daemon.ws_url).await;
    client
        .send(json!({"type": "list_agents", "requestId": "early"}))
        .await;
    let answer = client.recv().await;
    let error = expect_error(&answer, "hello_required");
    assert_eq!(error["requestId"], "early");
    // A wrong protocol version is refused, and the connection stays open for a good hello.
    client
        .send(
            json!({"type": "hello", "client": "t", "protocolVersion": 99, "token": daemon.token()}),
        )
        .await;
    let refused = expect_error(&client.recv().await, "unsupported_version");
    // What it serves is typed, for a client to tell an older daemon from a newer one.
    assert_eq!(
        refused["details"],
        json!({"protocolVersion": drover_protocol::PROTOCOL_VERSION,
               "oldestProtocolVersion": drover_protocol::OLDEST_PROTOCOL_VERSION}),
        "{refused}"
    );
    let state = client.hello(daemon.token().as_deref()).await;
    assert_eq!(state["agents"], json!([]));
    let agents = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(agents["type"], "agents", "{agents}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_loads_no_runtime_and_initialize_starts_it() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let cwd_path = std::fs::canonicalize(cwd.path()).expect("cwd");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    let id = id_of(&create(&mut client, &cwd_path, Some("say before the restart")).await);
    wait_idle(&mut client, &id).await;
    drop(client);
    daemon.stop().await;
    assert!(
        poll_until(WAIT, async || agent_pids(&cwd_path).is_empty())
            .await
            .is_some(),
        "the agent process outlived its daemon"
    );

    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, state) = daemon.client().await;
    let agents = state["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{state}");
    assert_eq!(agents[0]["id"], id.as_str());
    assert_eq!(agents[0]["status"], "idle");
    let health = daemon.health().await;
    assert_eq!(health["activeRuntimes"], 0, "{health}");
    assert_eq!(health["liveRuntimes"], 0, "{health}");
    assert!(
        agent_pids(&cwd_path).is_empty(),
        "a runtime started on connect"
    );

    let init = client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let view = View::from_initialized(&init);
    assert_eq!(
        texts(&view.items(), "agent_message"),
        ["before the restart"],
        "{init}"
    );
    assert!(
        poll_until(WAIT, async || agent_pids(&cwd_path).len() == 1)
            .await
            .is_some(),
        "initialize did not start the runtime"
    );
    // Every client sees the cold runtime starting, then ready.
    status_where(&mut client, &id, |a| a["status"] == "initializing").await;
    status_where(&mut client, &id, |a| a["status"] == "idle").await;
    let health = daemon.health().await;
    assert_eq!(health["activeRuntimes"], 1, "{health}");
    assert_eq!(health["liveRuntimes"], 1, "{health}");
    daemon.stop().await;
}

/// A turn cut off by a shutdown ends `interrupted` (cause `shutdown`) in its history, once:
/// the next boot does not call it a crash, and `drover logs` does not stop at "turn started".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_off_by_a_shutdown_ends_interrupted() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let cwd_path = std::fs::canonicalize(cwd.path()).expect("cwd");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    let id = id_of(&create(&mut client, &cwd_path, Some("say working\nsleep 100000")).await);
    let working = poll_until(WAIT, async || {
        let items = timeline(&mut client, &id).await;
        (!texts(&items, "agent_message").is_empty()).then_some(())
    })
    .await;
    assert!(working.is_some(), "the agent never started its turn");
    drop(client);
    daemon.stop().await;

    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, state) = daemon.client().await;
    assert_eq!(state["agents"][0]["status"], "idle", "{state}");
    assert_eq!(
        state["agents"][0]["attentionReason"], "interrupted",
        "{state}"
    );
    let items = timeline(&mut client, &id).await;
    let ends: Vec<&Value> = items.iter().filter(|i| i["kind"] == "turn_ended").collect();
    assert_eq!(ends.len(), 1, "{items:?}");
    assert_eq!(ends[0]["data"]["event"], "turn_interrupted", "{items:?}");
    assert_eq!(ends[0]["data"]["cause"], "shutdown", "{items:?}");
    daemon.stop().await;
}

// ---- initialization and streams -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_is_idempotent() {
    let daemon = TestDaemon::start().await;
    let (mut driver, _) = daemon.client().await;
    let id = id_of(&create(&mut driver, &daemon.cwd(), Some("say hello\ntool look")).await);
    wait_idle(&mut driver, &id).await;
    let (mut client, _) = daemon.client().await;
    client
        .send(json!({"type": "initialize_agent_request", "agentId": id, "requestId": "mine"}))
        .await;
    let first = client
        .recv_where(|m| m["payload"]["requestId"] == "mine")
        .await;
    assert_eq!(first["type"], "agent_initialized", "{first}");
    assert_eq!(first["payload"]["requestId"], "mine");
    assert_eq!(first["payload"]["agentId"], id.as_str());
    assert_eq!(first["payload"]["info"]["id"], id.as_str());
    assert_eq!(first["payload"]["info"]["status"], "idle");
    assert_eq!(first["payload"]["hasOlder"], false);
    assert_eq!(first["payload"]["pendingPermissions"], json!([]));
    let updates = first["payload"]["updates"].as_array().expect("updates");
    assert!(
        updates
            .iter()
            .all(|u| u["agentId"] == id.as_str() && u["timestamp"].is_string()),
        "{first}"
    );
    assert_eq!(
        first["payload"]["cursor"],
        updates[0]["notification"]["item"]["seq"]
    );
    let pids = agent_pids(&daemon.cwd());
    assert_eq!(pids.len(), 1, "one runtime: {pids:?}");

    client
        .send(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let second = client.recv_type("agent_initialized").await;
    assert_eq!(second["payload"]["requestId"], Value::Null);
    assert_eq!(second["payload"]["updates"], first["payload"]["updates"]);
    assert_eq!(second["payload"]["info"]["status"], "idle");
    assert_eq!(agent_pids(&daemon.cwd()), pids, "the runtime was restarted");
    // Nothing moved: no status change, no timeline item was added by initializing twice.
    let agents = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(agents["payload"]["agents"][0]["status"], "idle");
    assert_eq!(timeline(&mut client, &id).await.len(), updates.len());
    assert!(
        !client.backlog().iter().any(|m| m["type"] == "agent_update"
            || (m["type"] == "agent_status" && m["payload"]["agent"]["status"] != "idle")),
        "initializing again changed something: {:?}",
        client.backlog()
    );
    // The agent still works after both, and the updates apply to the cached history.
    send(&mut client, &id, "say again", "followup").await;
    let mut view = View::from_initialized(&second);
    follow_turn(&mut client, &id, &mut view).await;
    assert_eq!(texts(&view.items(), "agent_message"), ["hello", "again"]);
    assert_eq!(agent_pids(&daemon.cwd()), pids);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_reach_only_initialized_sessions_and_statuses_reach_all() {
    let daemon = TestDaemon::start().await;
    let (mut watcher, _) = daemon.client().await;
    let (mut bystander, _) = daemon.client().await;
    let id = id_of(&create(&mut watcher, &daemon.cwd(), None).await);
    wait_idle(&mut watcher, &id).await;
    let init = watcher
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let mut view = View::from_initialized(&init);
    send(&mut watcher, &id, "stream 20 5", "followup").await;
    follow_turn(&mut watcher, &id, &mut view).await;
    assert_eq!(
        texts(&view.items(), "agent_message"),
        [stream_text(20)],
        "the appends rebuild the streamed text exactly"
    );
    // The client's view is the daemon's timeline.
    assert_eq!(view.items(), timeline(&mut watcher, &id).await);

    // The bystander saw the agent run and settle, but none of its timeline.
    status_where(&mut bystander, &id, |a| a["status"] == "running").await;
    status_where(&mut bystander, &id, |a| {
        a["status"] == "idle" && a["attentionReason"] == "finished"
    })
    .await;
    wait_idle(&mut bystander, &id).await;
    bystander.request(json!({"type": "list_agents"})).await;
    assert!(
        !bystander
            .backlog()
            .iter()
            .any(|m| m["type"] == "agent_update"),
        "a session that never initialized got updates: {:?}",
        bystander.backlog()
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initializing_mid_stream_loses_and_repeats_nothing() {
    let daemon = TestDaemon::start().await;
    let (mut driver, _) = daemon.client().await;
    let id = id_of(&create(&mut driver, &daemon.cwd(), None).await);
    wait_idle(&mut driver, &id).await;
    let init = driver
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let mut driver_view = View::from_initialized(&init);
    // Rounds in which the history ended mid-text, so updates had to continue it.
    let mut mid_stream = 0;
    for round in 0..8 {
        let (mut late, _) = daemon.client().await;
        let ended = |items: &[Value]| items.iter().filter(|i| i["kind"] == "turn_ended").count();
        let ended_before = ended(&driver_view.items());
        send(&mut driver, &id, "stream 3000", "followup").await;
        // Initialize while the turn streams: once the driver sees text arrive.
        loop {
            let update = driver
                .recv_where(|m| {
                    m["type"] == "agent_update" && m["payload"]["agentId"] == id.as_str()
                })
                .await;
            driver_view.apply(&update["payload"]["notification"]);
            if update["payload"]["notification"]["op"] == "append" {
                break;
            }
        }
        let init = late
            .request(json!({"type": "initialize_agent_request", "agentId": id, "limit": 1000}))
            .await;
        let mut view = View::from_initialized(&init);
        // Updates that arrived before the answer belong to no subscription.
        let early: Vec<Value> = late
            .backlog()
            .iter()
            .filter(|m| m["type"] == "agent_update")
            .cloned()
            .collect();
        assert!(
            early.is_empty(),
            "updates before agent_initialized: {early:?}"
        );
        let text_at_init = texts(&view.items(), "agent_message")
            .last()
            .map_or(0, String::len);
        // On a loaded machine the whole turn may end before the late client asks: then its
        // snapshot holds the end, and no update follows.
        if ended(&view.items()) == ended_before {
            follow_turn(&mut late, &id, &mut view).await;
        }
        if text_at_init < stream_text(3000).len() {
            mid_stream += 1;
        }
        let messages = texts(&view.items(), "agent_message");
        assert_same_text(
            messages.last().map(String::as_str),
            &stream_text(3000),
            &format!(
                "round {round}: the text rebuilt from agent_initialized and the updates after it"
            ),
        );
        follow_turn(&mut driver, &id, &mut driver_view).await;
        // Items whole: the same as the daemon's timeline and as the driver's view.
        assert!(
            view.items() == timeline(&mut driver, &id).await,
            "round {round}: the late view is not the timeline"
        );
        assert!(
            view.items() == driver_view.items(),
            "round {round}: the late view is not the driver's"
        );
        wait_idle(&mut driver, &id).await;
    }
    assert!(
        mid_stream > 0,
        "no round initialized while the agent streamed"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_replays_no_history() {
    let daemon = TestDaemon::start().await;
    let (mut first, _) = daemon.client().await;
    let id = id_of(&create(&mut first, &daemon.cwd(), Some("say one")).await);
    first
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    wait_idle(&mut first, &id).await;
    drop(first);

    let (mut again, state) = daemon.client().await;
    assert_eq!(state["agents"][0]["id"], id.as_str());
    send(&mut again, &id, "say two", "followup").await;
    status_where(&mut again, &id, |a| a["status"] == "running").await;
    status_where(&mut again, &id, |a| a["status"] == "idle").await;
    wait_idle(&mut again, &id).await;
    assert!(
        !again.backlog().iter().any(|m| m["type"] == "agent_update"),
        "a new connection got history or updates before initializing: {:?}",
        again.backlog()
    );
    // Initializing gives the history, then live updates follow.
    let init = again
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let mut view = View::from_initialized(&init);
    assert_eq!(texts(&view.items(), "agent_message"), ["one", "two"]);
    send(&mut again, &id, "say three", "followup").await;
    follow_turn(&mut again, &id, &mut view).await;
    assert_eq!(
        texts(&view.items(), "agent_message"),
        ["one", "two", "three"]
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_see_the_same_changes_in_the_same_order() {
    let daemon = TestDaemon::start().await;
    let (mut a, _) = daemon.client().await;
    let (mut b, _) = daemon.client().await;
    let other = TempDir::new().expect("second workspace");
    let x = id_of(&create(&mut a, &daemon.cwd(), Some("say one")).await);
    let y = id_of(&create(&mut b, other.path(), Some("stream 5")).await);
    send(&mut a, &x, "tool look\nsay two", "followup").await;
    wait_idle(&mut a, &x).await;
    wait_idle(&mut b, &y).await;
    let marker = id_of(&create(&mut a, &daemon.cwd(), None).await);
    a.request(json!({"type": "archive", "agentId": marker}))
        .await;

    let mut seen = Vec::new();
    for client in [&mut a, &mut b] {
        status_where(client, &marker, |agent| agent["archivedAt"].is_string()).await;
        let stream: Vec<Value> = client
            .backlog()
            .iter()
            .filter(|m| m["type"] == "agent_status" || m["type"] == "workspace_update")
            .cloned()
            .collect();
        seen.push(stream);
    }
    assert!(
        seen[0].iter().any(|m| m["type"] == "workspace_update"),
        "{:?}",
        seen[0]
    );
    assert!(
        seen[0]
            .iter()
            .any(|m| m["payload"]["agent"]["id"] == y.as_str()),
        "{:?}",
        seen[0]
    );
    // One client may have read past the archive status while waiting for its own answers, so
    // one stream may go on where the other ends. Same messages, same order; but a session
    // that was behind for a moment may have been sent an agent's later `agent_status` in place
    // of earlier ones (docs/protocol.md, "Joined for a session that is behind").
    let (a, b) = (&seen[0], &seen[1]);
    assert!(a.len().min(b.len()) >= 10, "too little to compare: {a:?}");
    assert!(
        same_but_superseded(a, b),
        "the two clients saw different streams:\n{a:#?}\n{b:#?}"
    );
    daemon.stop().await;
}

/// Whether two streams are the same messages in the same order until one ends, but for
/// `agent_status`es that one has and the other does not, each replaced by a later
/// `agent_status` of the same agent in the stream that has it.
fn same_but_superseded(a: &[Value], b: &[Value]) -> bool {
    let agent = |m: &Value| m["payload"]["agent"]["id"].as_str().map(str::to_string);
    let replaced = |stream: &[Value], i: usize| {
        let m = &stream[i];
        m["type"] == "agent_status"
            && stream[i + 1..]
                .iter()
                .any(|later| later["type"] == "agent_status" && agent(later) == agent(m))
    };
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
        } else if replaced(a, i) {
            i += 1;
        } else if replaced(b, j) {
            j += 1;
        } else {
            return false;
        }
    }
    true
}

// ---- security and malformed input -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_origins_are_refused() {
    let daemon = TestDaemon::start().await;
    let refused = Client::connect_with(&daemon.ws_url, &[("Origin", "http://evil.example")]).await;
    let error = refused.expect_err("a cross-origin handshake must fail");
    assert!(error.contains("403"), "{error}");
    let port = daemon.url.rsplit(':').next().expect("port");
    for origin in [daemon.url.clone(), format!("http://localhost:{port}")] {
        let mut client = Client::connect_with(&daemon.ws_url, &[("Origin", &origin)])
            .await
            .unwrap_or_else(|e| panic!("same origin {origin} refused: {e}"));
        client.hello(daemon.token().as_deref()).await;
    }
    // Another port on the same host is another origin.
    let refused = Client::connect_with(&daemon.ws_url, &[("Origin", "http://127.0.0.1:1")]).await;
    assert!(refused.is_err());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_an_error_and_the_connection_stays_usable() {
    let daemon = TestDaemon::start().await;
    let mut raw = Raw::connect(&daemon.ws_url, None).await;
    raw.send(
        json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": daemon.token()}),
    )
    .await;
    raw.recv_type("session_state").await;
    let cases: Vec<(Message, &str, Value)> = vec![
        (
            Message::Text("{not json".into()),
            "invalid_message",
            Value::Null,
        ),
        (
            Message::Text(
                r#"{"type":"list_agents","includeArchived":"yes","requestId":"w"}"#.into(),
            ),
            "invalid_message",
            json!("w"),
        ),
        (
            Message::Text(r#"{"type":"send_message","agentId":"a","requestId":"m"}"#.into()),
            "invalid_message",
            json!("m"),
        ),
        (
            Message::Text(r#"{"type":"launch_missiles","requestId":"u"}"#.into()),
            "unknown_type",
            json!("u"),
        ),
        (
            Message::Text(r#"{"type":"list_agents","bogus":1,"requestId":"f"}"#.into()),
            "invalid_message",
            json!("f"),
        ),
        (
            Message::Text(r#"{"requestId":"n"}"#.into()),
            "invalid_message",
            json!("n"),
        ),
        (
            Message::Text("[1,2]".into()),
            "invalid_message",
            Value::Null,
        ),
        (
            Message::Binary(vec![0x7b, 0x7d].into()),
            "invalid_message",
            Value::Null,
        ),
    ];
    for (frame, code, request_id) in cases {
        let shown = format!("{frame:?}");
        raw.socket.send(frame).await.expect("send");
        let answer = raw.recv().await;
        let error = expect_error(&answer, code);
        assert_eq!(error["requestId"], request_id, "{shown}: {answer}");
        // Still usable.
        raw.send(json!({"type": "list_agents", "requestId": "still"}))
            .await;
        let answer = raw.recv().await;
        assert_eq!(answer["type"], "agents", "{shown}: {answer}");
        assert_eq!(answer["payload"]["requestId"], "still");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_limit_closes_with_1009() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    // Exactly at the limit is fine.
    let filler = drover_protocol::MAX_CLIENT_FRAME
        - json!({"type": "list_agents", "requestId": ""})
            .to_string()
            .len();
    let at_limit = json!({"type": "list_agents", "requestId": "x".repeat(filler)}).to_string();
    assert_eq!(at_limit.len(), drover_protocol::MAX_CLIENT_FRAME);
    client.send_text(at_limit).await;
    let answer = client.recv().await;
    assert_eq!(answer["type"], "agents");
    // One byte more closes the connection with "message too big".
    let over = json!({"type": "list_agents", "requestId": "x".repeat(filler + 1)}).to_string();
    client.send_text(over).await;
    assert_eq!(client.close_code().await, Some(1009));
    // The daemon goes on.
    let (mut other, _) = daemon.client().await;
    assert_eq!(
        other.request(json!({"type": "list_agents"})).await["type"],
        "agents"
    );
    daemon.stop().await;
}

// ---- requests -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_agent_validates_its_input() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let cwd = daemon.cwd();
    let cases = [
        (json!({"provider": "nope", "cwd": cwd}), "unknown_provider"),
        (
            json!({"provider": "scripted", "cwd": "relative/dir"}),
            "invalid_input",
        ),
        (
            json!({"provider": "scripted", "cwd": "/does/not/exist/drover"}),
            "invalid_input",
        ),
        (json!({"provider": "scripted"}), "invalid_message"),
        (
            json!({"provider": "scripted", "workspaceId": "nope"}),
            "unknown_workspace",
        ),
        (
            json!({"provider": "scripted", "workspaceId": "0193b1c2-7d40-7000-8000-00000000abcd"}),
            "unknown_workspace",
        ),
        (
            json!({"provider": "scripted", "cwd": cwd, "parentAgentId": "nope"}),
            "unknown_agent",
        ),
        (json!({"provider": "", "cwd": cwd}), "unknown_provider"),
    ];
    for (fields, code) in cases {
        let mut message = json!({"type": "create_agent"});
        for (k, v) in fields.as_object().expect("fields") {
            message[k] = v.clone();
        }
        let answer = client.request(message).await;
        expect_error(&answer, code);
        assert!(answer["payload"]["requestId"].is_string(), "{answer}");
    }
    assert_eq!(
        client.request(json!({"type": "list_agents"})).await["payload"]["agents"],
        json!([])
    );

    // Every option shows in the new agent.
    let agent = create_with(
        &mut client,
        json!({
            "cwd": cwd, "title": "full", "model": "scripted-large", "mode": "plan",
            "labels": {"k": "v"}, "autoArchive": false, "permissionPolicy": "allow",
        }),
    )
    .await;
    assert_eq!(agent["title"], "full");
    assert_eq!(agent["model"], "scripted-large");
    assert_eq!(agent["currentModeId"], "plan");
    assert_eq!(agent["labels"], json!({"k": "v"}));
    assert_eq!(agent["permissionPolicy"], "allow");
    assert_eq!(agent["status"], "initializing");
    // A workspace stands for its directory.
    let in_workspace = create_with(
        &mut client,
        json!({"workspaceId": agent["workspaceId"], "prompt": "cwd"}),
    )
    .await;
    assert_eq!(in_workspace["cwd"], json!(cwd));
    assert_eq!(in_workspace["workspaceId"], agent["workspaceId"]);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_that_cannot_run() {
    let home = TempDir::new().expect("home");
    let config = "[providers.ghost]\nlabel = \"Ghost\"\ncommand = [\"/nonexistent/ghost-acp\"]\n\
                  [providers.broken]\nlabel = \"Broken\"\ncommand = [\"false\"]\n";
    let daemon =
        TestDaemon::start_with_config(home.path().to_path_buf(), None, config.to_string()).await;
    let (mut client, _) = daemon.client().await;
    let providers = client.request(json!({"type": "list_providers"})).await;
    let ghost = find_where(&providers["payload"]["providers"], "ghost", |p| {
        p["name"] == "ghost"
    });
    assert_eq!(ghost["available"], false, "{ghost}");
    assert!(ghost["detail"].as_str().is_some_and(|d| !d.is_empty()));
    let answer = client
        .request(json!({"type": "create_agent", "provider": "ghost", "cwd": daemon.cwd()}))
        .await;
    expect_error(&answer, "provider_unavailable");

    // A command that runs but is no agent: the agent exists, in error, and says why.
    let agent = create_with(
        &mut client,
        json!({"provider": "broken", "cwd": daemon.cwd()}),
    )
    .await;
    let id = id_of(&agent);
    let failed = status_where(&mut client, &id, |a| a["status"] == "error").await;
    assert!(failed["error"].is_string(), "{failed}");
    // Initializing it still answers, with the failure in its history.
    let init = client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let view = View::from_initialized(&init);
    assert!(
        texts(&view.items(), "notice")
            .iter()
            .any(|t| t.contains("did not start")),
        "{init}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followup_steer_and_inject_show_in_the_timeline() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = id_of(&create(&mut client, &daemon.cwd(), None).await);
    wait_idle(&mut client, &id).await;

    // inject: context for the next prompt; it wakes nobody.
    let injected = send(&mut client, &id, "remember the milk", "inject").await;
    assert!(injected["payload"]["messageId"].is_string(), "{injected}");
    wait_idle(&mut client, &id).await;
    assert!(
        !kinds(&timeline(&mut client, &id).await).contains(&"user_message".to_string()),
        "an inject started a turn"
    );
    send(&mut client, &id, "echo-prompt", "followup").await;
    wait_idle(&mut client, &id).await;
    let items = timeline(&mut client, &id).await;
    let user = items
        .iter()
        .find(|i| i["kind"] == "user_message")
        .expect("user message");
    assert_eq!(user["data"]["text"], "echo-prompt");
    assert_eq!(user["data"]["context"], json!(["remember the milk"]));
    assert!(
        texts(&items, "agent_message")[0].contains("remember the milk"),
        "{items:?}"
    );

    // followup: waits for the running turn.
    send(&mut client, &id, "sleep 400\nsay first", "followup").await;
    send(&mut client, &id, "say second", "followup").await;
    wait_idle(&mut client, &id).await;
    let items = timeline(&mut client, &id).await;
    let messages = texts(&items, "agent_message");
    assert_eq!(messages[messages.len() - 2..], ["first", "second"]);

    // steer: cancels the running turn, keeps the queue, and goes first.
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    send(&mut client, &id, "sleep 10000\nsay never", "followup").await;
    started(&mut client, &id, "sleep 10000\nsay never").await;
    send(&mut client, &id, "say queued", "followup").await;
    send(&mut client, &id, "say steered", "steer").await;
    wait_idle(&mut client, &id).await;
    let items = timeline(&mut client, &id).await;
    let tail: Vec<(String, String)> = items
        .iter()
        .skip_while(|i| i["data"]["text"] != "sleep 10000\nsay never")
        .filter(|i| {
            matches!(
                i["kind"].as_str(),
                Some("user_message" | "agent_message" | "turn_ended")
            )
        })
        .map(|i| {
            let what = if i["kind"] == "turn_ended" {
                i["data"]["event"].as_str().unwrap_or_default().to_string()
            } else {
                i["data"]["text"].as_str().unwrap_or_default().to_string()
            };
            (i["kind"].as_str().unwrap_or_default().to_string(), what)
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("user_message", "sleep 10000\nsay never"),
        ("turn_ended", "turn_canceled"),
        ("user_message", "say steered"),
        ("agent_message", "steered"),
        ("turn_ended", "turn_completed"),
        ("user_message", "say queued"),
        ("agent_message", "queued"),
        ("turn_ended", "turn_completed"),
    ]
    .iter()
    .map(|(k, t)| (k.to_string(), t.to_string()))
    .collect();
    assert_eq!(tail, expected);

    // An empty message and a bad delivery are refused.
    let answer = client
        .request(json!({"type": "send_message", "agentId": id, "text": "  "}))
        .await;
    expect_error(&answer, "invalid_message");
    let answer = client
        .request(json!({"type": "send_message", "agentId": id, "text": "x", "delivery": "shout"}))
        .await;
    expect_error(&answer, "invalid_message");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_and_without_the_inbox() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = id_of(&create(&mut client, &daemon.cwd(), None).await);
    wait_idle(&mut client, &id).await;
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;

    for keep_inbox in [false, true] {
        let long = format!("sleep 10000\nsay never {keep_inbox}");
        send(&mut client, &id, &long, "followup").await;
        started(&mut client, &id, &long).await;
        send(
            &mut client,
            &id,
            &format!("say kept {keep_inbox}"),
            "followup",
        )
        .await;
        let answer = client
            .request(json!({"type": "cancel", "agentId": id, "keepInbox": keep_inbox}))
            .await;
        assert_eq!(answer["type"], "ok", "{answer}");
        assert_eq!(answer["payload"]["agentId"], id.as_str());
        let ended = turn_ended(&mut client, &id).await;
        assert_eq!(ended["data"]["event"], "turn_canceled", "{ended}");
        wait_idle(&mut client, &id).await;
        let said = texts(&timeline(&mut client, &id).await, "agent_message");
        assert_eq!(
            said.contains(&format!("kept {keep_inbox}")),
            keep_inbox,
            "keepInbox {keep_inbox}: {said:?}"
        );
    }
    // Cancelling an idle agent is fine.
    let answer = client
        .request(json!({"type": "cancel", "agentId": id}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_refuses_running_work_and_stop_activity_stops_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = id_of(&create(&mut client, &daemon.cwd(), Some("sleep 10000")).await);
    status_where(&mut client, &id, |a| a["status"] == "running").await;

    let answer = client
        .request(json!({"type": "archive", "agentId": id}))
        .await;
    let error = expect_error(&answer, "agent_active");
    let turns = error["details"]["families"]["turn"]
        .as_array()
        .unwrap_or_else(|| panic!("no turn listed: {answer}"));
    assert_eq!(turns.len(), 1, "{answer}");
    assert_eq!(error["details"]["agentId"], id.as_str());
    let agents = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(agents["payload"]["agents"][0]["archivedAt"], Value::Null);

    let answer = client
        .request(json!({"type": "archive", "agentId": id, "stopActivity": true}))
        .await;
    assert_eq!(answer["type"], "archived", "{answer}");
    assert_eq!(answer["payload"]["archived"], json!([id]));
    assert_eq!(
        answer["payload"]["stopped"]["families"]["turn"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "{answer}"
    );
    let archived = status_where(&mut client, &id, |a| a["archivedAt"].is_string()).await;
    assert_eq!(archived["status"], "closed", "{archived}");
    wait_idle(&mut client, &id).await;
    // The turn is stopped, ended by the archive in the timeline, and the runtime closed.
    let items = timeline(&mut client, &id).await;
    let ended = items.last().expect("a timeline");
    assert_eq!(ended["kind"], "turn_ended", "{items:?}");
    assert_eq!(ended["data"]["event"], "turn_canceled", "{ended}");
    assert_eq!(ended["data"]["cause"], "archive", "{ended}");
    assert!(
        poll_until(WAIT, async || agent_pids(&daemon.cwd()).is_empty())
            .await
            .is_some(),
        "the archived agent's process still runs"
    );

    // Archived: out of the default list, refused for new work, still readable.
    let listed = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(listed["payload"]["agents"], json!([]));
    let listed = client
        .request(json!({"type": "list_agents", "includeArchived": true}))
        .await;
    assert_eq!(listed["payload"]["agents"][0]["id"], id.as_str());
    let answer = client
        .request(json!({"type": "send_message", "agentId": id, "text": "say hi"}))
        .await;
    expect_error(&answer, "agent_archived");
    // Archiving again archives nothing more.
    let answer = client
        .request(json!({"type": "archive", "agentId": id}))
        .await;
    assert_eq!(answer["payload"]["archived"], json!([]), "{answer}");

    let answer = client
        .request(json!({"type": "unarchive", "agentId": id}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    status_where(&mut client, &id, |a| a["archivedAt"].is_null()).await;
    let back = client
        .request(json!({"type": "get_agent", "agentId": id}))
        .await;
    assert_eq!(
        back["payload"]["agent"]["status"], "closed",
        "closed until it starts again: {back}"
    );
    let listed = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(listed["payload"]["agents"][0]["id"], id.as_str());
    // Nothing was restarted; new work runs.
    send(&mut client, &id, "say back", "followup").await;
    wait_idle(&mut client, &id).await;
    let agent = client
        .request(json!({"type": "get_agent", "agentId": id}))
        .await;
    assert_eq!(agent["payload"]["agent"]["status"], "idle", "{agent}");
    assert_eq!(
        texts(&timeline(&mut client, &id).await, "agent_message"),
        ["back"]
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagents_detach_and_archive_idle_children() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let cwd = daemon.cwd();
    let parent = id_of(&create(&mut client, &cwd, None).await);
    let idle_child = create_with(
        &mut client,
        json!({"cwd": cwd, "parentAgentId": parent, "title": "idle"}),
    )
    .await;
    assert_eq!(idle_child["parentAgentId"], parent.as_str());
    let busy_child = id_of(
        &create_with(
            &mut client,
            json!({"cwd": cwd, "parentAgentId": parent, "prompt": "sleep 10000", "title": "busy"}),
        )
        .await,
    );
    let loose_child =
        id_of(&create_with(&mut client, json!({"cwd": cwd, "parentAgentId": parent})).await);
    wait_idle(&mut client, &id_of(&idle_child)).await;
    wait_idle(&mut client, &loose_child).await;
    status_where(&mut client, &busy_child, |a| a["status"] == "running").await;

    let answer = client
        .request(json!({"type": "detach", "agentId": loose_child}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    let detached = status_where(&mut client, &loose_child, |a| a["parentAgentId"].is_null()).await;
    assert_eq!(detached["cwd"], json!(cwd));

    let answer = client
        .request(json!({"type": "archive_idle_children", "agentId": parent}))
        .await;
    assert_eq!(answer["type"], "children_archived", "{answer}");
    assert_eq!(answer["payload"]["archived"], json!([id_of(&idle_child)]));
    let skipped = answer["payload"]["skipped"].as_array().expect("skipped");
    assert_eq!(skipped.len(), 1, "{answer}");
    assert_eq!(skipped[0]["agentId"], busy_child.as_str());

    let listed = client.request(json!({"type": "list_agents"})).await;
    let mut ids: Vec<String> = listed["payload"]["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(id_of)
        .collect();
    ids.sort();
    let mut expected = vec![parent.clone(), busy_child.clone(), loose_child.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    client
        .request(json!({"type": "cancel", "agentId": busy_child}))
        .await;
    daemon.stop().await;
}

const REJECT: &str = r#"{"optionId": "reject-once"}"#;
const CANCEL: &str = r#"{"cancel": true}"#;

/// A session that initializes `id` now finds permission request `seq` waiting, with its
/// options.
async fn assert_waiting(daemon: &TestDaemon, id: &str, seq: &Value) {
    let (mut late, _) = daemon.client().await;
    let init = late
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let pending = init["payload"]["pendingPermissions"]
        .as_array()
        .expect("pending");
    assert_eq!(pending.len(), 1, "{init}");
    assert_eq!(&pending[0]["seq"], seq);
    assert_eq!(pending[0]["title"], "deploy");
    let options: Vec<&str> = pending[0]["options"]
        .as_array()
        .expect("options")
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert!(
        options.contains(&"allow_once") && options.contains(&"reject_once"),
        "{options:?}"
    );
}

/// In the history after its answer: the permission item is dated by the answer (the patch's
/// `at`), and its tool call ended `completed`, or `failed` saying why (`refused`).
fn assert_answered(
    items: &[Value],
    seq: &Value,
    answered_at: &Value,
    refused: Option<&str>,
    directive: &str,
) {
    let asked = items
        .iter()
        .find(|i| &i["seq"] == seq)
        .expect("the permission item");
    assert_eq!(&asked["updatedAt"], answered_at, "{asked}");
    let when = |v: &Value| {
        v.as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .expect("a time")
    };
    assert!(when(answered_at) >= when(&asked["at"]), "{asked}");
    let tool = items
        .iter()
        .find(|i| i["seq"] == asked["data"]["toolSeq"])
        .unwrap_or_else(|| panic!("{directive}: the tool call of {asked}"));
    assert_eq!(tool["kind"], "tool_call", "{tool}");
    match refused {
        Some(refused) => {
            assert_eq!(tool["data"]["status"], "failed", "{directive}: {tool}");
            assert_eq!(tool["data"]["permission"], refused, "{directive}: {tool}");
        }
        None => assert_eq!(tool["data"]["status"], "completed", "{directive}: {tool}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_are_answered_by_kind_option_or_cancel() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = id_of(&create(&mut client, &daemon.cwd(), None).await);
    wait_idle(&mut client, &id).await;
    let answer = client
        .request(json!({"type": "answer_permission", "agentId": id, "kind": "allow_once"}))
        .await;
    expect_error(&answer, "no_such_permission");
    let answer = client
        .request(json!({"type": "answer_permission", "agentId": id, "kind": "allow_once", "cancel": true}))
        .await;
    expect_error(&answer, "invalid_message");
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;

    // Each answer, in the orders of claude (`permission`), codex (`permission-first`) and
    // gemini (`permission-only`): a refused tool call ends `failed` saying why, whether or not
    // the agent says so itself.
    let choices = [
        (
            "permission",
            r#"{"kind": "allow_once"}"#,
            Some("permission granted"),
            None,
        ),
        (
            "permission",
            REJECT,
            Some("permission denied"),
            Some("denied"),
        ),
        (
            "permission-first",
            REJECT,
            Some("permission denied"),
            Some("denied"),
        ),
        (
            "permission-only",
            REJECT,
            Some("permission denied"),
            Some("denied"),
        ),
        ("permission", CANCEL, None, Some("cancelled")),
        ("permission-first", CANCEL, None, Some("cancelled")),
    ];
    for (directive, choice, said, refused) in choices {
        let choice: Value = serde_json::from_str(choice).expect("a choice");
        send(&mut client, &id, &format!("{directive} deploy"), "followup").await;
        let asked = client
            .update_where(&id, |n| {
                n["op"] == "item" && n["item"]["kind"] == "permission"
            })
            .await;
        let item = &asked["payload"]["notification"]["item"];
        assert_eq!(item["data"]["status"], "pending", "{item}");
        assert_eq!(item["data"]["title"], "deploy", "{item}");
        let seq = item["seq"].clone();
        let flagged =
            status_where(&mut client, &id, |a| a["attentionReason"] == "permission").await;
        assert_eq!(flagged["requiresAttention"], true);

        // A session that initializes now finds the question waiting.
        assert_waiting(&daemon, &id, &seq).await;

        let mut message = json!({"type": "answer_permission", "agentId": id, "seq": seq});
        for (k, v) in choice.as_object().expect("choice") {
            message[k] = v.clone();
        }
        let answer = client.request(message).await;
        assert_eq!(answer["type"], "ok", "{choice}: {answer}");
        let patched = client
            .update_where(&id, |n| n["op"] == "patch" && n["seq"] == seq)
            .await;
        assert_eq!(
            patched["payload"]["notification"]["fields"]["status"], "answered",
            "{patched}"
        );
        let ended = turn_ended(&mut client, &id).await;
        wait_idle(&mut client, &id).await;
        let items = timeline(&mut client, &id).await;
        let answered_at = &patched["payload"]["notification"]["at"];
        assert_answered(&items, &seq, answered_at, refused, directive);
        let messages = texts(&items, "agent_message");
        match said {
            Some(said) => {
                assert_eq!(messages.last().map(String::as_str), Some(said), "{choice}");
                assert_eq!(ended["data"]["event"], "turn_completed");
            }
            None => {
                assert_eq!(ended["data"]["event"], "turn_canceled", "{ended}");
            }
        }
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_model_providers_and_wait_idle() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let providers = client.request(json!({"type": "list_providers"})).await;
    assert_eq!(providers["type"], "providers", "{providers}");
    let scripted = find_where(
        &providers["payload"]["providers"],
        "the scripted provider",
        |p| p["name"] == "scripted",
    );
    assert_eq!(scripted["available"], true, "{scripted}");
    assert_eq!(scripted["label"], "Scripted");

    let id = id_of(&create(&mut client, &daemon.cwd(), Some("say ready")).await);
    wait_idle(&mut client, &id).await;
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let answer = client
        .request(json!({"type": "set_mode", "agentId": id, "modeId": "plan"}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    // The mode is recorded and the live agent switched (its `mode` item).
    client
        .update_where(&id, |n| n["op"] == "item" && n["item"]["kind"] == "mode")
        .await;
    let answer = client
        .request(json!({"type": "set_model", "agentId": id, "modelId": "scripted-large"}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    status_where(&mut client, &id, |a| a["model"] == "scripted-large").await;
    let listed = client.request(json!({"type": "list_agents"})).await;
    let agent = &listed["payload"]["agents"][0];
    assert_eq!(agent["currentModeId"], "plan", "{agent}");
    assert_eq!(agent["model"], "scripted-large", "{agent}");
    let modes: Vec<&str> = agent["availableModes"]
        .as_array()
        .expect("modes of a live runtime")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(modes, ["default", "plan"]);

    // wait_idle answers at its timeout while the agent works, and when it settles.
    send(&mut client, &id, "sleep 1500", "followup").await;
    let answer = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 100}))
        .await;
    assert_eq!(answer["type"], "idle");
    assert_eq!(answer["payload"]["idle"], false, "{answer}");
    wait_idle(&mut client, &id).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_timeline_pages_through_history() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let mut prompt = String::new();
    for i in 1..=30 {
        writeln!(prompt, "tool t{i}").expect("write to a String");
    }
    let id = id_of(&create(&mut client, &daemon.cwd(), Some(&prompt)).await);
    wait_idle(&mut client, &id).await;
    let all = timeline(&mut client, &id).await;
    let total = all.len() as u64;
    assert!(total > 30, "{total} items");
    let seqs: Vec<u64> = all
        .iter()
        .map(|i| i["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>());

    // agent_initialized carries the tail and a cursor; fetch_timeline walks back from it.
    let init = client
        .request(json!({"type": "initialize_agent_request", "agentId": id, "limit": 7}))
        .await;
    assert_eq!(init["payload"]["updates"].as_array().map(Vec::len), Some(7));
    assert_eq!(init["payload"]["hasOlder"], true);
    let mut cursor = init["payload"]["cursor"].as_u64().expect("cursor");
    assert_eq!(cursor, total - 6);
    let mut walked: Vec<Value> = init["payload"]["updates"]
        .as_array()
        .expect("updates")
        .iter()
        .map(|u| u["notification"]["item"].clone())
        .collect();
    loop {
        let page = client
            .request(
                json!({"type": "fetch_timeline", "agentId": id, "before": cursor, "limit": 10}),
            )
            .await;
        assert_eq!(page["type"], "timeline_page", "{page}");
        assert_eq!(page["payload"]["agentId"], id.as_str());
        assert_eq!(page["payload"]["hasNewer"], true, "{page}");
        let items = page["payload"]["items"].as_array().expect("items").clone();
        assert!(!items.is_empty() && items.len() <= 10);
        cursor = items[0]["seq"].as_u64().expect("seq");
        walked.splice(0..0, items);
        if page["payload"]["hasOlder"] == false {
            break;
        }
    }
    assert_eq!(walked, all, "walking back gives the whole timeline");

    // Forward from a seq, the tail, and the limits.
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "after": 3, "limit": 4}))
        .await;
    let after: Vec<u64> = page["payload"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(after, [4, 5, 6, 7]);
    assert_eq!(page["payload"]["hasOlder"], true);
    assert_eq!(page["payload"]["hasNewer"], true);
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "limit": 5}))
        .await;
    assert_eq!(page["payload"]["items"].as_array().map(Vec::len), Some(5));
    assert_eq!(page["payload"]["items"][4]["seq"], total);
    assert_eq!(page["payload"]["hasOlder"], true);
    assert_eq!(page["payload"]["hasNewer"], false);
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "limit": 0}))
        .await;
    assert_eq!(
        page["payload"]["items"].as_array().map(Vec::len),
        Some(1),
        "a limit of 0 gives one item"
    );
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "after": total}))
        .await;
    assert_eq!(page["payload"]["items"], json!([]));
    assert_eq!(page["payload"]["hasNewer"], false);
    let answer = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "before": 5, "after": 2}))
        .await;
    expect_error(&answer, "invalid_message");
    let answer = client
        .request(json!({"type": "fetch_timeline", "agentId": id, "before": -1}))
        .await;
    expect_error(&answer, "invalid_message");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_about_unknown_agents_say_unknown_agent() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    for bogus in ["nope", "0193b1c2-7d4e-7a10-8000-0123456789ab", ""] {
        for message in [
            json!({"type": "initialize_agent_request", "agentId": bogus}),
            json!({"type": "fetch_timeline", "agentId": bogus}),
            json!({"type": "send_message", "agentId": bogus, "text": "hi"}),
            json!({"type": "cancel", "agentId": bogus}),
            json!({"type": "archive", "agentId": bogus}),
            json!({"type": "unarchive", "agentId": bogus}),
            json!({"type": "detach", "agentId": bogus}),
            json!({"type": "archive_idle_children", "agentId": bogus}),
            json!({"type": "answer_permission", "agentId": bogus, "cancel": true}),
            json!({"type": "set_mode", "agentId": bogus, "modeId": "plan"}),
            json!({"type": "set_model", "agentId": bogus, "modelId": "m"}),
            json!({"type": "wait_idle", "agentId": bogus, "timeoutMs": 10}),
        ] {
            let answer = client.request(message.clone()).await;
            let error = expect_error(&answer, "unknown_agent");
            assert!(error["requestId"].is_string(), "{message}: {answer}");
        }
    }
    daemon.stop().await;
}

// ---- a slow client ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_gets_resync_required_and_stalls_nobody() {
    const CHUNKS: usize = 30_000;
    // Every chunk its own update: joined, 30,000 chunks are a few dozen and nobody lags.
    let daemon = TestDaemon::start_unjoined().await;
    let (mut fast, _) = daemon.client().await;
    let id = id_of(&create(&mut fast, &daemon.cwd(), None).await);
    wait_idle(&mut fast, &id).await;
    let init = fast
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let mut view = View::from_initialized(&init);

    // The slow client subscribes too, then stops reading (with a tiny receive buffer).
    let mut slow = Raw::connect(&daemon.ws_url, Some(4096)).await;
    slow.send(
        json!({"type": "hello", "client": "slow", "protocolVersion": 1, "token": daemon.token()}),
    )
    .await;
    slow.recv_type("session_state").await;
    slow.send(json!({"type": "initialize_agent_request", "agentId": id, "requestId": "s"}))
        .await;
    slow.recv_type("agent_initialized").await;

    let started = Instant::now();
    send(&mut fast, &id, &format!("stream {CHUNKS}"), "followup").await;
    follow_turn(&mut fast, &id, &mut view).await;
    let streamed = started.elapsed();
    assert_same_text(
        texts(&view.items(), "agent_message")
            .last()
            .map(String::as_str),
        &stream_text(CHUNKS),
        "the fast client",
    );

    // While the slow client still reads nothing, the daemon answers at once.
    let asked = Instant::now();
    let health = daemon.health().await;
    assert_eq!(health["status"], "ok");
    let (mut third, _) = daemon.client().await;
    let listed = third.request(json!({"type": "list_agents"})).await;
    assert_eq!(listed["payload"]["agents"][0]["id"], id.as_str());
    let answered = asked.elapsed();
    assert!(
        answered < Duration::from_secs(5),
        "the daemon took {answered:?} to answer beside a stalled client"
    );

    // The slow client reads what was buffered, then learns it fell behind.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut updates_before = 0;
    loop {
        assert!(Instant::now() < deadline, "no resync_required");
        let message = slow.recv().await;
        if message["type"] == "resync_required" {
            assert!(message["payload"]["reason"].is_string(), "{message}");
            break;
        }
        if message["type"] == "agent_update" {
            updates_before += 1;
        }
    }
    assert!(
        updates_before < CHUNKS,
        "{updates_before} updates before the resync"
    );
    // `/metrics` counts the resync and the events the slow client never got.
    let bearer = format!(
        "Authorization: Bearer {}",
        daemon.token().unwrap_or_default()
    );
    let (_, metrics) =
        drover_testkit::daemon::http(daemon.addr(), "GET", "/metrics", daemon.addr(), &[&bearer])
            .await;
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(counter("drover_client_resyncs_total") >= 1, "{metrics}");
    assert!(
        counter("drover_client_dropped_events_total") >= 1,
        "{metrics}"
    );
    // It re-initializes over the same connection and is up to date.
    slow.send(json!({"type": "initialize_agent_request", "agentId": id, "requestId": "again"}))
        .await;
    let init = slow.recv_type("agent_initialized").await;
    assert_eq!(init["payload"]["requestId"], "again");
    let view = View::from_initialized(&init);
    assert_same_text(
        texts(&view.items(), "agent_message")
            .last()
            .map(String::as_str),
        &stream_text(CHUNKS),
        "the slow client after re-initializing",
    );
    eprintln!(
        "streamed {CHUNKS} chunks in {streamed:?}; daemon answered beside the stalled client in {answered:?}; \
         the slow client read {updates_before} updates before resync_required"
    );
    daemon.stop().await;
}
