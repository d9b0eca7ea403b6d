//! Streaming as a client sees it: fast text joined into few `append`s with every byte kept,
//! slow text never held back, the durable timeline still one line per chunk, and a create
//! answered before the agent's process is up.
//!
//! Every wait is bounded (`WAIT` per message in the testkit client).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use drover_testkit::daemon::{Client, TestDaemon, string_at};
use serde_json::{Value, json};
use tempfile::TempDir;

fn stream_text(n: usize) -> String {
    let mut text = String::new();
    for i in 1..=n {
        writeln!(text, "chunk {i}").expect("write to a String");
    }
    text
}

/// Creates an idle scripted agent and initializes it for `client`; returns its id.
async fn initialized_agent(daemon: &TestDaemon, client: &mut Client) -> String {
    let id = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 15_000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{idle}");
    client.initialize_agent(&id).await;
    id
}

/// The `agent_message` of the turn that `prompt` starts, as the client receives it: the
/// item's first text, then each `append` (with the wall clock it arrived at, in ns), until
/// the turn ends.
async fn follow_message(
    client: &mut Client,
    id: &str,
    prompt: &str,
) -> (String, Vec<(String, u128)>) {
    let queued = client
        .request(
            json!({"type": "send_message", "agentId": id, "text": prompt, "delivery": "followup"}),
        )
        .await;
    assert_eq!(queued["type"], "message_queued", "{queued}");
    let mut first = None;
    let mut message_seq = None;
    let mut appends = Vec::new();
    loop {
        let update = client
            .recv_where(|m| m["type"] == "agent_update" && m["payload"]["agentId"] == id)
            .await;
        let arrived = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let n = &update["payload"]["notification"];
        match n["op"].as_str() {
            Some("item") if n["item"]["kind"] == "agent_message" => {
                message_seq = n["item"]["seq"].as_u64();
                first = n["item"]["data"]["text"].as_str().map(str::to_string);
            }
            Some("item") if n["item"]["kind"] == "turn_ended" => break,
            Some("append") if n["seq"].as_u64() == message_seq && message_seq.is_some() => {
                assert_eq!(n["field"], "text", "{n}");
                appends.push((n["text"].as_str().expect("text").to_string(), arrived));
            }
            _ => {}
        }
    }
    (first.expect("an agent_message item"), appends)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_text_arrives_in_few_appends_with_every_byte() {
    const CHUNKS: usize = 300;
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = initialized_agent(&daemon, &mut client).await;
    // A chunk every millisecond: about ten of them fall in each window.
    let (first, appends) = follow_message(&mut client, &id, &format!("stream {CHUNKS} 1")).await;
    let text = first + &appends.iter().map(|(t, _)| t.as_str()).collect::<String>();
    assert_eq!(
        text,
        stream_text(CHUNKS),
        "the appends rebuild the text exactly"
    );
    assert!(
        appends.len() * 4 <= CHUNKS,
        "{} appends for {CHUNKS} chunks: streamed text was not joined",
        appends.len()
    );
    // The durable timeline keeps one line per chunk, written as it came.
    let log = std::fs::read_to_string(daemon.home.join("timelines").join(format!("{id}.jsonl")))
        .expect("the agent's timeline");
    let lines = log
        .lines()
        .filter(|l| l.contains("\"op\":\"append\""))
        .count();
    assert_eq!(
        lines,
        CHUNKS - 1,
        "every chunk after the first is its own line"
    );
    // Another client initializing now gets the same text in one snapshot.
    let (mut late, _) = daemon.client().await;
    let init = late
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    let snapshot: Vec<&Value> = init["payload"]["updates"]
        .as_array()
        .expect("updates")
        .iter()
        .filter(|u| u["notification"]["item"]["kind"] == "agent_message")
        .collect();
    assert_eq!(
        snapshot[0]["notification"]["item"]["data"]["text"],
        stream_text(CHUNKS)
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_text_is_never_held_for_the_next_chunk() {
    const CHUNKS: usize = 5;
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = initialized_agent(&daemon, &mut client).await;
    // Chunks 150 ms apart, well beyond the window: each must reach the client on its own,
    // before the agent writes the next one.
    let (first, appends) =
        follow_message(&mut client, &id, &format!("stream-stamped {CHUNKS} 150")).await;
    assert!(first.starts_with("chunk 1 @"), "{first:?}");
    assert_eq!(
        appends.len(),
        CHUNKS - 1,
        "one append per slow chunk: {appends:?}"
    );
    let stamp = |text: &str| -> u128 {
        text.trim_end()
            .rsplit_once('@')
            .and_then(|(_, ns)| ns.parse().ok())
            .unwrap_or_else(|| panic!("no stamp in {text:?}"))
    };
    for (i, window) in appends.windows(2).enumerate() {
        let ((_, arrived), (next, _)) = (&window[0], &window[1]);
        assert!(
            *arrived < stamp(next),
            "chunk {} arrived after chunk {} was written: it waited for it",
            i + 2,
            i + 3
        );
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_is_answered_before_the_agent_process_answers() {
    // A provider whose process never speaks ACP: the create is still answered at once, with
    // the agent initializing; the handshake would only come later.
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("state");
    let config = format!(
        "{}\n[providers.mute]\nlabel = \"Mute\"\ncommand = [\"sleep\", \"30\"]\n",
        drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), state.path())
    );
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), None, config).await;
    let (mut client, _) = daemon.client().await;
    let answer = client
        .request(json!({"type": "create_agent", "provider": "mute", "cwd": daemon.cwd(), "prompt": "hello"}))
        .await;
    assert_eq!(answer["type"], "agent_created", "{answer}");
    assert_eq!(
        answer["payload"]["agent"]["status"], "initializing",
        "{answer}"
    );
    // The record is durable when answered.
    let id = answer["payload"]["agent"]["id"].as_str().expect("id");
    // (`agents/{cwd-with-dashes}/{id}.json`)
    let written = std::fs::read_dir(daemon.home.join("agents"))
        .expect("agents/")
        .flatten()
        .any(|dir| dir.path().join(format!("{id}.json")).exists());
    assert!(
        written,
        "agent_created answered before the record was written"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_from_cached_encodings_is_what_list_agents_says() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let answer = client
            .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "title": format!("a{i}")}))
            .await;
        ids.push(string_at(&answer["payload"]["agent"]["id"]));
    }
    for id in &ids {
        let idle = client
            .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 15_000}))
            .await;
        assert_eq!(idle["payload"]["idle"], true, "{idle}");
    }
    let archived = client
        .request(json!({"type": "archive", "agentId": ids[0]}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    // The archive's close ends the runtime after the answer: wait until it is announced cold
    // (archived: the agent was announced cold at its creation too).
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == ids[0].as_str()
                && m["payload"]["agent"]["archivedAt"].is_string()
                && m["payload"]["agent"]["runtime"]["state"] == "cold"
        })
        .await;
    // Every change so far is announced: a new session's snapshot holds all of them.
    for include_archived in [false, true] {
        let mut fresh = Client::connect(&daemon.ws_url).await;
        fresh
            .send(
                json!({"type": "hello", "client": "test", "protocolVersion": 1,
                         "includeArchived": include_archived, "token": daemon.token()}),
            )
            .await;
        let state = fresh.recv_type("session_state").await;
        let listed = fresh
            .request(json!({"type": "list_agents", "includeArchived": include_archived}))
            .await;
        assert_eq!(
            state["payload"]["agents"], listed["payload"]["agents"],
            "includeArchived {include_archived}"
        );
        let shown = state["payload"]["agents"].as_array().expect("agents").len();
        assert_eq!(shown, if include_archived { 3 } else { 2 });
    }
    daemon.stop().await;
}

/// A client reading over a small receive buffer (so the daemon's writes to it block soon):
/// says `hello`, initializes `id`, then reads nothing until `go`, then one message per
/// millisecond until the turn ends. Returns the turn's `agent_message` text as it rebuilt it,
/// how many `agent_update`s of the agent it read, and how many `resync_required`.
async fn slow_reader(
    url: String,
    token: Option<String>,
    id: String,
    ready: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> (String, usize, usize) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let addr = url
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .parse()
        .expect("addr");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("connect");
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("WebSocket handshake");
    let send = async |ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
                      v: Value| {
        ws.send(Message::Text(v.to_string().into()))
            .await
            .expect("send");
    };
    let recv = async |ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>| {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
            .await
            .expect("a message within 30 s")
            .expect("the connection open")
            .expect("a frame");
        match frame {
            Message::Text(text) => serde_json::from_str::<Value>(&text).expect("JSON"),
            _ => Value::Null,
        }
    };
    send(
        &mut ws,
        json!({"type": "hello", "client": "slow", "protocolVersion": 1, "token": token}),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "initialize_agent_request", "agentId": id, "requestId": "init"}),
    )
    .await;
    while recv(&mut ws).await["type"] != "agent_initialized" {}
    ready.send(()).expect("the test waits");
    go.await.expect("the test says when");
    let (mut text, mut updates, mut resyncs) = (String::new(), 0, 0);
    let mut message_seq = None;
    loop {
        let m = recv(&mut ws).await;
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        if m["type"] == "resync_required" {
            resyncs += 1;
            continue;
        }
        if m["type"] != "agent_update" || m["payload"]["agentId"] != id.as_str() {
            continue;
        }
        updates += 1;
        let n = &m["payload"]["notification"];
        match n["op"].as_str() {
            Some("item") if n["item"]["kind"] == "agent_message" => {
                message_seq = n["item"]["seq"].as_u64();
                text.push_str(n["item"]["data"]["text"].as_str().expect("text"));
            }
            Some("item") if n["item"]["kind"] == "turn_ended" => break,
            Some("append") if n["seq"].as_u64() == message_seq && message_seq.is_some() => {
                assert_eq!(n["field"], "text", "{n}");
                text.push_str(n["text"].as_str().expect("text"));
            }
            _ => {}
        }
    }
    (text, updates, resyncs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_gets_all_the_text_in_order_in_fewer_messages() {
    // Fewer than the 4096 events a session may fall behind, more than the kernel buffers of
    // its socket hold (64 KiB asked for the send buffer, 4 KiB the receive one).
    const CHUNKS: usize = 3500;
    // No window: every chunk is its own `append` for a client that keeps up.
    let daemon = TestDaemon::start_windowless().await;
    let (mut client, _) = daemon.client().await;
    let id = initialized_agent(&daemon, &mut client).await;
    let (ready, slow_ready) = tokio::sync::oneshot::channel();
    let (go, slow_go) = tokio::sync::oneshot::channel();
    // It reads nothing while the agent streams, then one message a millisecond: what waits
    // for it in the daemon meanwhile is joined.
    let slow = tokio::spawn(slow_reader(
        daemon.ws_url.clone(),
        daemon.token(),
        id.clone(),
        ready,
        slow_go,
    ));
    slow_ready
        .await
        .expect("the slow client initialized the agent");
    let (first, appends) = follow_message(&mut client, &id, &format!("stream {CHUNKS} 1")).await;
    let fast = first + &appends.iter().map(|(t, _)| t.as_str()).collect::<String>();
    assert_eq!(fast, stream_text(CHUNKS), "the fast client's text");
    go.send(()).expect("the slow client waits");
    let (slow_text, slow_updates, resyncs) = slow.await.expect("the slow client");
    eprintln!(
        "{CHUNKS} chunks: {} appends to the fast client, {slow_updates} updates to the slow one",
        appends.len()
    );
    assert_eq!(resyncs, 0, "the slow client was told to resync");
    assert_eq!(
        slow_text,
        stream_text(CHUNKS),
        "the slow client rebuilt the text exactly, in order"
    );
    // The fast client got about one `append` per chunk.
    assert!(
        appends.len() * 2 >= CHUNKS,
        "{} appends for {CHUNKS} chunks to a client that keeps up",
        appends.len()
    );
    // What the kernel buffered reaches it as it was written (at most 128 KiB, some 800
    // updates); what waited in the daemon, joined.
    assert!(
        slow_updates * 2 <= appends.len(),
        "the slow client read {slow_updates} updates, the fast one {}: nothing was joined",
        appends.len()
    );
    daemon.stop().await;
}
