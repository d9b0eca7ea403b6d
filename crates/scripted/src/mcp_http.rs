//! One MCP `tools/call` over HTTP, as the scripted agent and the benchmarks make it against
//! drover's MCP server (which answers statelessly with plain JSON). Loopback `http://` only.
//!
//! This is the fake agent's own client, as a real agent has its own: it shares no code with
//! drover (drover's is `drover_daemon::http_client`, on hyper). It speaks HTTP/1.0, so the
//! answer comes whole (no chunked encoding) and ends when the server closes; the body is
//! read as bytes and decoded once, so no character is ever cut in two.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The request never got a tool result: transport, HTTP or JSON-RPC error.
    Protocol(String),
    /// The tool ran and reported an error (`isError`): its text.
    Tool(String),
}

/// Calls `tool` with `arguments`; the text of the result's content.
pub fn tools_call(
    url: &str,
    tool: &str,
    arguments: &Value,
    timeout: Duration,
) -> Result<String, CallError> {
    let protocol = |e: String| CallError::Protocol(e);
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    })
    .to_string();
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| protocol("only http:// MCP urls".to_string()))?;
    let (authority, path) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap_or((rest, "/".to_string()));
    let mut stream = TcpStream::connect(authority).map_err(|e| protocol(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| protocol(e.to_string()))?;
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| protocol(e.to_string()))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| protocol(e.to_string()))?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            protocol(format!(
                "no HTTP body: {}",
                String::from_utf8_lossy(&response)
            ))
        })?;
    let head = String::from_utf8_lossy(&response[..split]);
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(protocol(format!("a chunked answer to HTTP/1.0: {head}")));
    }
    let body = String::from_utf8(response[split + 4..].to_vec())
        .map_err(|e| protocol(format!("the answer is not UTF-8: {e}")))?;
    let message: Value = serde_json::from_str(body.trim())
        .map_err(|e| protocol(format!("not JSON ({e}): {body}")))?;
    if let Some(error) = message.get("error") {
        return Err(protocol(error.to_string()));
    }
    let result = &message["result"];
    let text = result["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    if result["isError"] == json!(true) {
        return Err(CallError::Tool(text));
    }
    Ok(text)
}
