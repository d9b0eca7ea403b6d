//! `drover mcp-proxy`: MCP over stdio relayed to the daemon's HTTP MCP server, for agents that
//! cannot speak MCP over HTTP.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use drover_testkit::daemon::TestDaemon;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_tool_calls_for_the_agent_whose_url_it_was_given() {
    let daemon = TestDaemon::start().await;
    let (mut client, _) = daemon.client().await;
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": "mcp-servers", "title": "relayed"}))
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

    let mut proxy = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["mcp-proxy", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn proxy");
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
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "drover");
    assert_eq!(answers[1]["id"], "two");
    let text = answers[1]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("\"title\": \"relayed\""), "{text}");
    daemon.stop().await;
}
