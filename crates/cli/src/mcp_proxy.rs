//! `drover mcp-proxy URL`: MCP over stdio for agents that only speak it that way, relayed to
//! the daemon's MCP server over HTTP. Each JSON-RPC line read on stdin is `POSTed` on its own,
//! at once, so a slow call (`wait_for_agent` may take minutes) never holds back the agent's
//! other calls; each JSON answer is written back as one line as soon as it comes. The daemon
//! serves MCP statelessly with plain JSON answers, so the relay keeps no state.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::Context;
use drover_daemon::http_client::HttpClient;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// A tool call may wait on an agent (`wait_for_agent`), so answers may take a while.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// Lines read ahead of the relay, and answers waiting for stdout: a few are plenty, as
/// either side only waits on a pipe.
const QUEUE: usize = 64;

pub fn run(url: &str) -> anyhow::Result<()> {
    if !url.starts_with("http://") {
        anyhow::bail!("`{url}` is not an http:// URL");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // stdin and stdout are blocking pipes: each gets a thread, the requests share the runtime.
    let (lines_tx, mut lines) = mpsc::channel::<String>(QUEUE);
    let reader = std::thread::spawn(move || -> anyhow::Result<()> {
        for line in std::io::stdin().lock().lines() {
            let line = line.context("cannot read stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            if lines_tx.blocking_send(line).is_err() {
                break;
            }
        }
        Ok(())
    });
    let (answers, mut answers_rx) = mpsc::channel::<String>(QUEUE);
    // The one writer: answers go out whole, one line each, in the order they complete.
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut stdout = std::io::stdout().lock();
        while let Some(answer) = answers_rx.blocking_recv() {
            writeln!(stdout, "{answer}")?;
            stdout.flush()?;
        }
        Ok(())
    });
    let client = HttpClient::new(ANSWER_TIMEOUT);
    runtime.block_on(async {
        let mut requests = JoinSet::new();
        loop {
            tokio::select! {
                line = lines.recv() => {
                    let Some(line) = line else { break };
                    let answers = answers.clone();
                    let url = url.to_string();
                    requests.spawn(async move {
                        if let Some(answer) = relay(client, &url, &line).await {
                            // The writer is gone only when stdout is: nobody to tell.
                            let _ = answers.send(answer).await;
                        }
                    });
                }
                // Reap finished requests as they go, so the set does not grow.
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
            }
        }
        // stdin closed: the calls still running get their answers out first.
        while requests.join_next().await.is_some() {}
    });
    drop(answers);
    let written = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the stdout writer panicked"))?;
    match written {
        Ok(()) => {}
        // The agent went away: nothing more to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e).context("cannot write to stdout"),
    }
    // The relay stops when the reader does (stdin closed or unreadable).
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stdin reader panicked"))?
}

/// Relays one message: the line to write back, if any. A request that fails gets a JSON-RPC
/// error, so the agent does not wait forever; a notification gets nothing (as over HTTP).
async fn relay(client: HttpClient, url: &str, line: &str) -> Option<String> {
    match post(client, url, line).await {
        Ok(answer) => answer,
        Err(e) => {
            let id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .filter(|id| !id.is_null())?;
            let error = json!({
                "jsonrpc": "2.0", "id": id,
                "error": {"code": -32603, "message": format!("drover MCP relay: {e:#}")},
            });
            Some(error.to_string())
        }
    }
}

/// POSTs one message; the answer's JSON as one line, or `None` for an empty answer (a
/// notification).
async fn post(client: HttpClient, url: &str, body: &str) -> anyhow::Result<Option<String>> {
    let answer = client
        .post_json(
            url,
            &[("accept", "application/json, text/event-stream")],
            body.to_string(),
        )
        .await?;
    let text = answer.text();
    let text = text.trim();
    if text.is_empty() {
        if answer.is_success() {
            return Ok(None);
        }
        anyhow::bail!("the daemon answered HTTP {}", answer.status);
    }
    // A streamed answer: the JSON is in the `data:` lines.
    let streamed = answer
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if streamed {
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        return Ok(data.last().map(ToString::to_string));
    }
    // One line per message: re-encode compactly.
    let value: Value = serde_json::from_str(text)
        .with_context(|| format!("the daemon's answer is not JSON: {text}"))?;
    Ok(Some(value.to_string()))
}
