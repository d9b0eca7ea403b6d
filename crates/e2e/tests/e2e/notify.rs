//! Notifications through the real daemon: `[notify]` sinks in `config.toml`, a real HTTP
//! receiver on 127.0.0.1 recording what it is sent, and a command sink writing its stdin to a
//! file. What must be sent (a root's turn end, a root's permission, a subagent's need once as
//! its root's), what must not (a subagent's second need while the first is pending, an agent a
//! client watches), the limit and its summary, a receiver that is down or hangs, the HMAC
//! signature, the status and the sample.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_testkit::daemon::{Client, TestDaemon, WAIT};
use drover_testkit::wait::{eventually, poll_until};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request a receiver read.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    path: String,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Received {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// How a receiver answers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    Status(u16),
    /// Reads the request, then never answers.
    Hang,
}

/// A tiny HTTP/1.1 server on 127.0.0.1 that records every request.
#[derive(Debug, Clone)]
pub(crate) struct Receiver {
    pub(crate) url: String,
    seen: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub(crate) async fn start(answer: Answer) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else {
                        return;
                    };
                    record.lock().expect("lock").push(request);
                    match answer {
                        Answer::Status(code) => {
                            let head = format!(
                                "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            );
                            let _ = socket.write_all(head.as_bytes()).await;
                            let _ = socket.shutdown().await;
                        }
                        Answer::Hang => {
                            tokio::time::sleep(Duration::from_secs(120)).await;
                        }
                    }
                });
            }
        });
        Receiver { url, seen }
    }

    fn all(&self) -> Vec<Received> {
        self.seen.lock().expect("lock").clone()
    }

    /// The bodies (JSON) received so far.
    pub(crate) fn events(&self) -> Vec<Value> {
        self.all().iter().map(Received::json).collect()
    }

    /// Waits until `n` requests came; all of them.
    pub(crate) async fn wait_for(&self, n: usize) -> Vec<Received> {
        eventually(format!("{n} requests at {}", self.url), WAIT, async || {
            let all = self.all();
            (all.len() >= n).then_some(all)
        })
        .await
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let mut lines = head.lines();
        let path = lines.next()?.split_whitespace().nth(1)?.to_string();
        let headers: BTreeMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let length: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        if body.len() >= length {
            return Some(Received {
                path,
                headers,
                body: body.to_string(),
            });
        }
    }
}

/// A daemon with the scripted provider and this `[notify]` text.
pub(crate) async fn daemon_with(notify: &str) -> TestDaemon {
    let home = TempDir::new().expect("home");
    let path = home.path().to_path_buf();
    // The agents' state lives (and goes) with the daemon's home.
    let state = path.join("agent-state");
    std::fs::create_dir_all(&state).expect("state");
    let mut config = drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), &state);
    config.push('\n');
    config.push_str(notify);
    TestDaemon::start_with_config(path, Some(home), config).await
}

async fn create(client: &mut Client, daemon: &TestDaemon, fields: Value) -> String {
    client.create_scripted(&daemon.cwd(), fields).await
}

async fn send(client: &mut Client, id: &str, text: &str) {
    let answer = client
        .request(
            json!({"type": "send_message", "agentId": id, "text": text, "delivery": "followup"}),
        )
        .await;
    assert_eq!(answer["type"], "message_queued", "{answer}");
}

/// Waits until the agent's attention is `reason`.
async fn attention(client: &mut Client, id: &str, reason: &str) {
    eventually(
        format!("{id} to need attention `{reason}`"),
        WAIT,
        async || {
            let answer = client
                .request(json!({"type": "get_agent", "agentId": id}))
                .await;
            answer["payload"]["agent"]["attentionReason"] == reason
        },
    )
    .await;
}

/// HMAC-SHA256 (RFC 2104), written here again so the test checks the daemon's against its own.
fn hmac_hex(key: &[u8], body: &[u8]) -> String {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let inner = Sha256::new()
        .chain_update(block.map(|b| b ^ 0x36))
        .chain_update(body)
        .finalize();
    let outer = Sha256::new()
        .chain_update(block.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// Nothing more than `n` requests arrive within `quiet`.
async fn stays_at(receiver: &Receiver, n: usize, quiet: Duration) {
    tokio::time::sleep(quiet).await;
    let all = receiver.events();
    assert_eq!(all.len(), n, "{all:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_roots_turn_end_and_permission_reach_a_signed_webhook_and_a_command() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let ntfy = Receiver::start(Answer::Status(200)).await;
    let out = TempDir::new().expect("out");
    let file = out.path().join("events.jsonl");
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
name = "hook"
url = "{}/hook"
secret = "s3cret-key"

[[notify.sink]]
kind = "command"
name = "log"
command = ["/bin/sh", "-c", "cat >> \"$0\"", "{}"]

[[notify.sink]]
kind = "ntfy"
name = "phone"
url = "{}/ntfy/drover-topic"
events = ["permission"]
"#,
        hook.url,
        file.display(),
        ntfy.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let lead = create(
        &mut client,
        &daemon,
        json!({"title": "lead", "prompt": "say hi"}),
    )
    .await;

    let first = hook.wait_for(1).await.remove(0);
    assert_eq!(first.path, "/hook");
    let event = first.json();
    assert_eq!(event["event"], "finished", "{event}");
    assert_eq!(event["agentId"], lead.as_str());
    assert_eq!(event["title"], "lead");
    assert_eq!(event["provider"], "scripted");
    assert_eq!(event["message"], "lead finished its turn");
    assert_eq!(
        event["url"],
        format!("{}/#agent={lead}", daemon.url).as_str(),
        "{event}"
    );
    assert_eq!(first.headers["x-drover-event"], "finished");
    assert_eq!(first.headers["content-type"], "application/json");
    // The signature is the body's, under the secret, and the body holds neither secret.
    assert_eq!(
        first.headers["x-drover-signature"],
        format!("sha256={}", hmac_hex(b"s3cret-key", first.body.as_bytes()))
    );
    assert_ne!(
        first.headers["x-drover-signature"],
        format!("sha256={}", hmac_hex(b"another-key", first.body.as_bytes()))
    );
    let token = daemon.token().expect("token");
    assert!(!first.body.contains(&token) && !first.body.contains("s3cret"));

    send(&mut client, &lead, "permission deploy").await;
    let asked = hook.wait_for(2).await.remove(1).json();
    assert_eq!(asked["event"], "permission", "{asked}");
    assert_eq!(asked["message"], "lead needs permission");

    // ntfy got only the permission, in its JSON form, at the server's root.
    let phone = ntfy.wait_for(1).await.remove(0);
    assert_eq!(phone.path, "/ntfy/");
    let message = phone.json();
    assert_eq!(message["topic"], "drover-topic", "{message}");
    assert_eq!(message["title"], "drover: lead");
    assert_eq!(message["message"], "lead needs permission");
    assert_eq!(message["priority"], 4);
    assert_eq!(message["tags"][1], "permission");
    assert_eq!(message["click"], asked["url"]);

    // The command got both, one JSON line each on its stdin.
    let lines = eventually("two lines from the command sink", WAIT, async || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        (lines.len() >= 2).then_some(lines)
    })
    .await;
    assert_eq!(lines[0]["event"], "finished");
    assert_eq!(lines[1]["event"], "permission");
    assert_eq!(lines[1]["agentId"], lead.as_str());

    let status = client.request(json!({"type": "notify_status"})).await;
    let sinks = status["payload"]["sinks"]
        .as_array()
        .expect("sinks")
        .clone();
    assert_eq!(sinks.len(), 3, "{status}");
    assert_eq!(sinks[0]["name"], "hook");
    assert_eq!(sinks[0]["kind"], "webhook");
    assert_eq!(sinks[0]["target"], hook.url.as_str());
    assert_eq!(sinks[0]["sent"], 2);
    assert_eq!(sinks[0]["lastError"], Value::Null);
    assert_eq!(sinks[1]["target"], "/bin/sh");
    // The topic is the secret part of an ntfy URL: not shown.
    assert_eq!(sinks[2]["target"], ntfy.url.as_str());
    assert!(!status.to_string().contains("s3cret"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_subagents_need_goes_once_as_its_roots_while_it_is_pending() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let everything = Receiver::start(Answer::Status(200)).await;
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
url = "{}/"
events = ["permission"]

[[notify.sink]]
kind = "webhook"
url = "{}/"
events = ["permission"]
all = true
"#,
        hook.url, everything.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let lead = create(&mut client, &daemon, json!({"title": "lead"})).await;
    client.wait_idle(&lead).await;
    let one = create(
        &mut client,
        &daemon,
        json!({"title": "one", "parentAgentId": lead, "prompt": "permission write a"}),
    )
    .await;
    let rolled = hook.wait_for(1).await.remove(0).json();
    assert_eq!(rolled["event"], "permission", "{rolled}");
    assert_eq!(rolled["agentId"], lead.as_str(), "{rolled}");
    assert_eq!(rolled["title"], "lead");
    assert_eq!(rolled["message"], "lead: a subagent needs permission");
    assert_eq!(rolled["subagent"]["agentId"], one.as_str());
    assert_eq!(rolled["subagent"]["title"], "one");

    // A second subagent asks while the first still waits: nothing more for the root...
    let two = create(
        &mut client,
        &daemon,
        json!({"title": "two", "parentAgentId": lead, "prompt": "permission write b"}),
    )
    .await;
    attention(&mut client, &two, "permission").await;
    // ...while the sink that wants everything hears each subagent on its own.
    let own = everything.wait_for(2).await;
    let mut agents: Vec<String> = own
        .iter()
        .map(|r| r.json()["agentId"].as_str().unwrap_or_default().to_string())
        .collect();
    agents.sort();
    let mut expected = vec![one.clone(), two.clone()];
    expected.sort();
    assert_eq!(agents, expected);
    stays_at(&hook, 1, Duration::from_millis(700)).await;

    // Both answered: the next need is told again.
    for id in [&one, &two] {
        let answer = client
            .request(json!({"type": "answer_permission", "agentId": id, "kind": "allow_once"}))
            .await;
        assert_eq!(answer["type"], "ok", "{answer}");
        client.wait_idle(id).await;
    }
    send(&mut client, &one, "permission write c").await;
    let again = hook.wait_for(2).await.remove(1).json();
    assert_eq!(again["agentId"], lead.as_str(), "{again}");
    assert_eq!(again["subagent"]["agentId"], one.as_str(), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_nothing_is_sent_for_an_agent_a_client_watches() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let everything = Receiver::start(Answer::Status(200)).await;
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
url = "{}/"

[[notify.sink]]
kind = "webhook"
url = "{}/"
all = true
"#,
        hook.url, everything.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let watched = create(&mut client, &daemon, json!({"title": "watched"})).await;
    let other = create(&mut client, &daemon, json!({"title": "other"})).await;
    client.wait_idle(&watched).await;
    client.wait_idle(&other).await;

    // A second client (a browser tab) shows `watched`.
    let (mut browser, _) = daemon.client().await;
    let answer = browser
        .request(json!({"type": "watching", "agentId": watched}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    let unknown = browser
        .request(json!({"type": "watching", "agentId": "0193b1c2-7d4e-7a10-8000-0123456789ab"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "unknown_agent", "{unknown}");

    send(&mut client, &watched, "say while watched").await;
    client.wait_idle(&watched).await;
    attention(&mut client, &watched, "finished").await;
    send(&mut client, &other, "say unwatched").await;
    let told = hook.wait_for(1).await.remove(0).json();
    assert_eq!(told["agentId"], other.as_str(), "{told}");
    // The sink that asks for everything heard both.
    let all = everything.wait_for(2).await;
    assert_eq!(all[0].json()["agentId"], watched.as_str());
    stays_at(&hook, 1, Duration::from_millis(500)).await;

    // The page is hidden: `watched` is told about again.
    let answer = browser
        .request(json!({"type": "watching", "agentId": null}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    send(&mut client, &watched, "say hidden").await;
    let told = hook.wait_for(2).await.remove(1).json();
    assert_eq!(told["agentId"], watched.as_str(), "{told}");

    // Watching again, then the connection closes: it watches nothing any more.
    browser
        .request(json!({"type": "watching", "agentId": watched}))
        .await;
    send(&mut client, &watched, "say watched again").await;
    client.wait_idle(&watched).await;
    attention(&mut client, &watched, "finished").await;
    stays_at(&hook, 2, Duration::from_millis(500)).await;
    drop(browser);
    // The session ends once the daemon reads the close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&mut client, &watched, "say after the client left").await;
    let told = hook.wait_for(3).await.remove(2).json();
    assert_eq!(told["agentId"], watched.as_str(), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_burst_is_limited_then_summarized_once() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
name = "hook"
url = "{}/"
limit = 3
window = "2s"
"#,
        hook.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let started = Instant::now();
    let mut agents = Vec::new();
    for i in 0..6 {
        agents.push(
            create(
                &mut client,
                &daemon,
                json!({"title": format!("a{i}"), "prompt": "say hi"}),
            )
            .await,
        );
    }
    for id in &agents {
        client.wait_idle(id).await;
    }
    let first = hook.wait_for(3).await;
    assert!(first.iter().all(|r| r.json()["event"] == "finished"));
    let all = hook.wait_for(4).await;
    let summary = all[3].json();
    assert_eq!(summary["event"], "summary", "{summary}");
    assert_eq!(summary["held"]["finished"], 3, "{summary}");
    assert!(
        summary["message"]
            .as_str()
            .unwrap_or_default()
            .contains("3 more"),
        "{summary}"
    );
    // After the window, not before.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    stays_at(&hook, 4, Duration::from_millis(2500)).await;
    let status = client.request(json!({"type": "notify_status"})).await;
    let sink = &status["payload"]["sinks"][0];
    assert_eq!(
        (sink["sent"].as_u64(), sink["summarized"].as_u64()),
        (Some(4), Some(3)),
        "{sink}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_receiver_that_is_down_is_retried_then_reported_and_the_daemon_still_answers() {
    let failing = Receiver::start(Answer::Status(500)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_url = format!("http://{}/", closed.local_addr().expect("addr"));
    drop(closed);
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
name = "failing"
url = "{}/"
retries = 2

[[notify.sink]]
kind = "ntfy"
name = "down"
url = "{closed_url}topic"
retries = 1
"#,
        failing.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let started = Instant::now();
    let lead = create(
        &mut client,
        &daemon,
        json!({"title": "lead", "prompt": "say hi"}),
    )
    .await;
    client.wait_idle(&lead).await;
    // The daemon answers at once while the sinks retry.
    let asked = Instant::now();
    let listed = client.request(json!({"type": "list_agents"})).await;
    assert_eq!(listed["type"], "agents");
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );

    // Three tries (1 s, then 2 s apart), each the same notification.
    let tries = failing.wait_for(3).await;
    assert!(tries.iter().all(|t| t.body == tries[0].body));
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let sinks = eventually("both failures in notify_status", WAIT, async || {
        let status = client.request(json!({"type": "notify_status"})).await;
        let sinks = status["payload"]["sinks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        sinks.iter().all(|s| s["failed"] == 1).then_some(sinks)
    })
    .await;
    let failed = sinks[0]["lastError"].as_str().unwrap_or_default();
    assert!(failed.contains("HTTP 500"), "{failed}");
    assert!(sinks[0]["lastErrorAt"].is_string());
    assert_eq!(sinks[0]["sent"], 0);
    let down = sinks[1]["lastError"].as_str().unwrap_or_default();
    assert!(down.contains("cannot connect"), "{down}");
    assert_eq!(failing.all().len(), 3);

    // A sample says the same, and fails.
    let tested = client
        .request(json!({"type": "notify_test", "sink": "down"}))
        .await;
    let results = &tested["payload"]["results"];
    assert_eq!(results.as_array().map(Vec::len), Some(1), "{tested}");
    assert_eq!(results[0]["sink"], "down");
    assert_eq!(results[0]["delivered"], false);
    assert!(
        results[0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot connect")
    );
    let unknown = client
        .request(json!({"type": "notify_test", "sink": "nope"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "invalid_message", "{unknown}");
    assert!(
        unknown["payload"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("failing, down"),
        "{unknown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_receiver_or_command_that_hangs_times_out_and_holds_up_nothing() {
    let hanging = Receiver::start(Answer::Hang).await;
    let quick = Receiver::start(Answer::Status(204)).await;
    let out = TempDir::new().expect("out");
    let pid_file = out.path().join("pid");
    let daemon = daemon_with(&format!(
        r#"
[[notify.sink]]
kind = "webhook"
name = "hanging"
url = "{}/"
timeout = "1s"
retries = 0

[[notify.sink]]
kind = "command"
name = "stuck"
command = ["/bin/sh", "-c", "echo $$ > \"$0\"; exec sleep 600", "{}"]
timeout = "1s"
retries = 0

[[notify.sink]]
kind = "webhook"
name = "quick"
url = "{}/"
"#,
        hanging.url,
        pid_file.display(),
        quick.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let lead = create(
        &mut client,
        &daemon,
        json!({"title": "lead", "prompt": "say hi"}),
    )
    .await;
    // The quick sink is not held up by the others.
    let started = Instant::now();
    quick.wait_for(1).await;
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    hanging.wait_for(1).await;
    let asked = Instant::now();
    client.wait_idle(&lead).await;
    assert!(asked.elapsed() < Duration::from_millis(500));

    let sinks = eventually("both timeouts in notify_status", WAIT, async || {
        let status = client.request(json!({"type": "notify_status"})).await;
        let sinks = status["payload"]["sinks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (sinks[0]["failed"] == 1 && sinks[1]["failed"] == 1).then_some(sinks)
    })
    .await;
    let hung = sinks[0]["lastError"].as_str().unwrap_or_default();
    assert!(hung.contains("no answer") && hung.contains("1s"), "{hung}");
    let stuck = sinks[1]["lastError"].as_str().unwrap_or_default();
    assert!(
        stuck.contains("did not finish within 1s; killed"),
        "{stuck}"
    );
    assert_eq!(sinks[2]["sent"], 1);
    // The command's process was killed.
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let gone = poll_until(Duration::from_secs(5), async || {
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
    })
    .await;
    assert!(
        gone.is_some(),
        "the command sink's process {pid} still runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_a_mistake_in_the_config_stops_the_daemon_naming_the_key() {
    let home = TempDir::new().expect("home");
    std::fs::write(
        home.path().join("config.toml"),
        "[[notify.sink]]\nkind = \"webhook\"\nname = \"team\"\nurl = \"http://127.0.0.1:9/\"\nevents = [\"finish\"]\n",
    )
    .expect("config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = drover_daemon::DaemonConfig::new(home.path(), addr).expect("config");
    let ran = tokio::time::timeout(
        WAIT,
        drover_daemon::run(listener, config, std::future::pending()),
    )
    .await
    .expect("the daemon stops by itself");
    let error = ran.expect_err("a bad [notify] is refused").to_string();
    assert!(
        error.contains("config.toml")
            && error.contains("[[notify.sink]] 1 (\"team\"): `events` names \"finish\""),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_an_agent_the_daemon_stopped_mid_turn_is_told_as_interrupted_at_the_next_start() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let notify = format!(
        "[[notify.sink]]\nkind = \"webhook\"\nurl = \"{}/\"\nevents = [\"interrupted\"]\n",
        hook.url
    );
    let daemon = daemon_with(&notify).await;
    let (mut client, _) = daemon.client().await;
    let lead = create(
        &mut client,
        &daemon,
        json!({"title": "lead", "prompt": "sleep 60000"}),
    )
    .await;
    eventually("lead to be running", WAIT, async || {
        let answer = client
            .request(json!({"type": "get_agent", "agentId": lead}))
            .await;
        answer["payload"]["agent"]["status"] == "running"
    })
    .await;
    drop(client);
    let config = std::fs::read_to_string(daemon.home.join("config.toml")).expect("config");
    let (home, keep) = daemon.stop().await;
    assert!(hook.all().is_empty());

    let daemon = TestDaemon::start_with_config(home, keep, config).await;
    let told = hook.wait_for(1).await.remove(0).json();
    assert_eq!(told["event"], "interrupted", "{told}");
    assert_eq!(told["agentId"], lead.as_str());
    assert_eq!(
        told["message"],
        "lead was interrupted: the daemon stopped during its turn"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_imported_agents_bring_their_attention_as_history_not_news() {
    let hook = Receiver::start(Answer::Status(200)).await;
    let daemon = daemon_with(&format!(
        "[[notify.sink]]\nkind = \"webhook\"\nurl = \"{}/\"\nall = true\n",
        hook.url
    ))
    .await;
    let paseo = TempDir::new().expect("paseo home");
    drover_testkit::paseo_home(paseo.path(), &daemon.cwd(), "scripted");
    let (mut client, _) = daemon.client().await;
    let imported = client
        .request(json!({"type": "import_paseo", "path": paseo.path(), "apply": true}))
        .await;
    assert_eq!(imported["type"], "imported", "{imported}");
    let agents = client.agents(false).await;
    assert!(
        agents.iter().any(|a| a["attentionReason"] == "finished")
            && agents.iter().any(|a| a["attentionReason"] == "interrupted"),
        "{agents:#?}"
    );
    // A turn of one of them afterwards is news.
    let mine = create(
        &mut client,
        &daemon,
        json!({"title": "mine", "prompt": "say hi"}),
    )
    .await;
    let told = hook.wait_for(1).await.remove(0).json();
    assert_eq!(told["agentId"], mine.as_str(), "{told}");
    stays_at(&hook, 1, Duration::from_millis(300)).await;
}
