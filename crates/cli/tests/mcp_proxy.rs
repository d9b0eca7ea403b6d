//! `drover mcp-proxy`: MCP over stdio relayed to the daemon's HTTP MCP server, for agents that
//! cannot speak MCP over HTTP.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use drover_testkit::daemon::{Client, TestDaemon};
use serde_json::{Value, json};

/// A scripted agent that said its MCP servers: (its id, its MCP URL).
async fn agent_with_mcp(daemon: &TestDaemon, client: &mut Client, title: &str) -> (String, String) {
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": "mcp-servers", "title": title}))
        .await;
    let id = created["payload"]["agent"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 20000}))
        .await;
    let page = client
        .request(json!({"type": "fetch_timeline", "agentId": id}))
        .await;
    let said = page["payload"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["kind"] == "agent_message")
        .and_then(|i| i["data"]["text"].as_str())
        .expect("the agent said its MCP servers")
        .to_string();
    let servers: Value = serde_json::from_str(&said).expect("servers JSON");
    let url = servers[0]["url"]
        .as_str()
        .expect("an http MCP server")
        .to_string();
    (id, url)
}

fn spawn_proxy(url: &str) -> Child {
    // The proxy as an agent runs it: with the system's PATH and a HOME that is not the user's.
    drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover"), Path::new("/nonexistent"))
        .args(["mcp-proxy", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn proxy")
}

/// The answer with this JSON-RPC id (answers come in the order they are ready).
fn answer<'a>(answers: &'a [Value], id: &Value) -> &'a Value {
    answers
        .iter()
        .find(|a| a["id"] == *id)
        .unwrap_or_else(|| panic!("no answer for {id}: {answers:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_tool_calls_for_the_agent_whose_url_it_was_given() {
    let daemon = TestDaemon::start().await;
    let (mut client, _) = daemon.client().await;
    let (id, url) = agent_with_mcp(&daemon, &mut client, "relayed").await;

    let mut proxy = spawn_proxy(&url);
    let mut stdin = proxy.stdin.take().expect("stdin");
    let stdout = proxy.stdout.take().expect("stdout");
    let answers = tokio::task::spawn_blocking(move || {
        let requests = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": "two", "method": "tools/call", "params": {"name": "get_agent", "arguments": {"agentId": id}}}),
        ];
        for r in &requests {
            writeln!(stdin, "{r}").expect("write");
        }
        drop(stdin);
        BufReader::new(stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(&l.expect("line")).expect("JSON line"))
            .collect::<Vec<Value>>()
    })
    .await
    .expect("relay");
    assert!(proxy.wait().expect("wait").success());
    assert_eq!(
        answers.len(),
        2,
        "one answer per request, none for the notification: {answers:?}"
    );
    let first = answer(&answers, &json!(1));
    assert_eq!(first["id"], 1);
    assert_eq!(first["result"]["serverInfo"]["name"], "drover");
    let second = answer(&answers, &json!("two"));
    assert_eq!(second["id"], "two");
    let text = second["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("\"title\": \"relayed\""), "{text}");
    daemon.stop().await;
}

/// Writes `request` to the proxy.
fn send(stdin: &mut ChildStdin, request: &Value) {
    writeln!(stdin, "{request}").expect("write");
    stdin.flush().expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_does_not_hold_back_other_calls() {
    let daemon = TestDaemon::start().await;
    let (mut client, _) = daemon.client().await;
    let (_, url) = agent_with_mcp(&daemon, &mut client, "caller").await;
    let busy = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": "sleep 30000", "title": "busy"}))
        .await;
    let busy = busy["payload"]["agent"]["id"]
        .as_str()
        .expect("id")
        .to_string();

    let mut proxy = spawn_proxy(&url);
    let mut stdin = proxy.stdin.take().expect("stdin");
    let stdout = proxy.stdout.take().expect("stdout");
    let (tx, answers) = mpsc::channel::<(Value, Instant)>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let value = serde_json::from_str::<Value>(&line).expect("JSON line");
            if tx.send((value, Instant::now())).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": "wait", "method": "tools/call", "params": {"name": "wait_for_agent", "arguments": {"agentId": busy, "timeoutSeconds": 3}}}),
    );
    // Sent after the wait, answered before it.
    std::thread::sleep(Duration::from_millis(200));
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": "quick", "method": "tools/call", "params": {"name": "list_providers", "arguments": {}}}),
    );
    let (first, first_at) = answers
        .recv_timeout(Duration::from_secs(20))
        .expect("an answer");
    assert_eq!(first["id"], "quick", "{first}");
    assert!(
        first_at - started < Duration::from_secs(2),
        "the quick call waited for the slow one: {:?}",
        first_at - started
    );
    let text = first["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("scripted"), "{text}");
    let (second, second_at) = answers
        .recv_timeout(Duration::from_secs(20))
        .expect("the wait's answer");
    assert_eq!(second["id"], "wait", "{second}");
    assert!(second_at - started >= Duration::from_secs(3));
    let text = second["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("\"timedOut\": true"), "{text}");
    drop(stdin);
    assert!(proxy.wait().expect("wait").success());
    daemon.stop().await;
}
