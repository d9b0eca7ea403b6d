//! `drover mcp-proxy URL`: MCP over stdio for agents that only speak it that way, relayed to
//! the daemon's MCP server over HTTP. Each JSON-RPC line read on stdin is POSTed; each JSON
//! answer is written back as one line. The daemon serves MCP statelessly with plain JSON
//! answers, so the relay keeps no state. Loopback `http://` only.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};

/// A tool call may wait on an agent (`wait_for_agent`), so answers may take a while.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

pub fn run(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("`{url}` is not an http:// URL"))?;
    let (authority, path) = match rest.split_once('/') {
        Some((authority, path)) => (authority.to_string(), format!("/{path}")),
        None => (rest.to_string(), "/".to_string()),
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.context("cannot read stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        match post(&authority, &path, &line) {
            Ok(Some(answer)) => {
                writeln!(stdout, "{answer}")?;
                stdout.flush()?;
            }
            Ok(None) => {}
            Err(e) => {
                // Answer a request so the agent does not wait forever; a notification gets
                // nothing (as over HTTP).
                let id = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .filter(|id| !id.is_null());
                if let Some(id) = id {
                    let error = serde_json::json!({
                        "jsonrpc": "2.0", "id": id,
                        "error": {"code": -32603, "message": format!("drover MCP relay: {e:#}")},
                    });
                    writeln!(stdout, "{error}")?;
                    stdout.flush()?;
                }
            }
        }
    }
    Ok(())
}

/// POSTs one message; the answer's JSON, or `None` for an empty answer (a notification).
fn post(authority: &str, path: &str, body: &str) -> anyhow::Result<Option<String>> {
    let mut stream = TcpStream::connect(authority)
        .with_context(|| format!("cannot reach the daemon at {authority}"))?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the daemon sent no HTTP body")?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let body = body.trim();
    if body.is_empty() {
        if status.starts_with('2') {
            return Ok(None);
        }
        bail!("the daemon answered HTTP {status}");
    }
    // A streamed answer: the JSON is in the `data:` lines.
    if head.to_ascii_lowercase().contains("text/event-stream") {
        let data: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        return Ok(data.last().map(|d| d.to_string()));
    }
    // One line per message: re-encode compactly.
    let value: serde_json::Value = serde_json::from_str(body)
        .with_context(|| format!("the daemon's answer is not JSON: {body}"))?;
    Ok(Some(value.to_string()))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}
