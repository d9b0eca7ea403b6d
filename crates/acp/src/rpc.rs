//! JSON-RPC 2.0 over newline-delimited JSON, the ACP transport.
//!
//! Our requests carry integer ids; the agent's own requests may carry strings or integers and
//! are answered with the id echoed verbatim. A line that is not a JSON-RPC message is reported
//! and skipped: it never breaks the connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// Longest line accepted from an agent (a huge tool output, not a runaway stream).
const MAX_LINE: usize = 64 * 1024 * 1024;

/// Something the agent sent that is not an answer to us.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A line that is not JSON-RPC (kept for the log).
    Garbage(String),
    /// stdout closed.
    Closed,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcError {
    /// Shown with the agent's own detail (`data.message`, or `data` when it is text): codex
    /// answers `-32603 Internal error` and says what went wrong only there.
    #[error("the agent answered `{method}` with error {code}: {message}{}", detail(.message, .data.as_ref()))]
    Remote {
        method: String,
        code: i64,
        message: String,
        data: Option<Value>,
    },
    #[error("the agent's connection closed before it answered `{method}`")]
    Closed { method: String },
}

type Pending = Arc<Mutex<HashMap<u64, (String, oneshot::Sender<Result<Value, RpcError>>)>>>;

/// Sends requests and notifications; cheap to clone.
#[derive(Debug, Clone)]
pub struct RpcClient {
    /// Lines to write. Bounded: a stuck agent stdin pushes back on its own runtime only.
    out: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
}

/// Starts the reader and writer tasks. Returns the client and the stream of incoming
/// requests and notifications.
pub fn connect(
    reader: impl AsyncRead + Unpin + Send + 'static,
    writer: impl AsyncWrite + Unpin + Send + 'static,
) -> (RpcClient, mpsc::Receiver<Incoming>) {
    // Capacities: 256 outgoing lines (we send few), 1024 incoming messages (a burst of
    // streamed chunks; beyond that the agent waits on its stdout, which is where the pressure
    // belongs).
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(256);
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(1024);
    let pending: Pending = Arc::default();
    tokio::spawn(write_lines(writer, out_rx));
    tokio::spawn(read_lines(reader, in_tx, pending.clone()));
    (
        RpcClient {
            out: out_tx,
            pending,
            next_id: Arc::new(AtomicU64::new(0)),
        },
        in_rx,
    )
}

impl RpcClient {
    /// Sends a request (queued for the agent at once, in call order); the returned future
    /// resolves with the agent's answer.
    pub fn request(
        &self,
        method: &str,
        params: Value,
    ) -> impl std::future::Future<Output = Result<Value, RpcError>> + Send + 'static {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, (method.to_string(), tx));
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        message["params"] = params;
        let line = encode(&message);
        let out = self.out.clone();
        let method = method.to_string();
        // Queued now, not when the answer is first awaited: what is sent after this call (a
        // `session/cancel` right after a prompt) reaches the agent after it. Only with 256
        // lines already waiting is it queued when awaited.
        let waiting = match self.out.try_send(line) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(line)) => Some(Ok(line)),
            Err(mpsc::error::TrySendError::Closed(_)) => Some(Err(())),
        };
        async move {
            let sent = match waiting {
                None => Ok(()),
                Some(Ok(line)) => out.send(line).await.map_err(drop),
                Some(Err(())) => Err(()),
            };
            if sent.is_err() {
                return Err(RpcError::Closed { method });
            }
            rx.await.unwrap_or(Err(RpcError::Closed { method }))
        }
    }

    pub async fn notify(&self, method: &str, params: Value) {
        let line = encode(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
        let _ = self.out.send(line).await;
    }

    /// Answers one of the agent's requests, echoing its id.
    pub async fn respond(&self, id: Value, result: Result<Value, (i64, String)>) {
        let message = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        let _ = self.out.send(encode(&message)).await;
    }
}

fn encode(value: &Value) -> Vec<u8> {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    line
}

async fn write_lines(mut writer: impl AsyncWrite + Unpin, mut lines: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = lines.recv().await {
        if writer.write_all(&line).await.is_err() || writer.flush().await.is_err() {
            break;
        }
    }
}

async fn read_lines(
    reader: impl AsyncRead + Unpin,
    incoming: mpsc::Sender<Incoming>,
    pending: Pending,
) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let Ok(Value::Object(message)) = serde_json::from_str::<Value>(text) else {
            let _ = incoming
                .send(Incoming::Garbage(text.chars().take(500).collect()))
                .await;
            continue;
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = message.get("id").cloned().filter(|id| !id.is_null());
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let forward = match (method, id) {
            (Some(method), Some(id)) => Incoming::Request { id, method, params },
            (Some(method), None) => Incoming::Notification { method, params },
            (None, Some(id)) => {
                answer(&pending, &id, &message);
                continue;
            }
            (None, None) => Incoming::Garbage(text.chars().take(500).collect()),
        };
        if incoming.send(forward).await.is_err() {
            break;
        }
    }
    let waiting: Vec<_> = pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .drain()
        .collect();
    for (_, (method, tx)) in waiting {
        let _ = tx.send(Err(RpcError::Closed { method }));
    }
    let _ = incoming.send(Incoming::Closed).await;
}

fn answer(pending: &Pending, id: &Value, message: &serde_json::Map<String, Value>) {
    // We send integers; accept them back as numbers or numeric strings.
    let key = id
        .as_u64()
        .or_else(|| id.as_str().and_then(|s| s.parse().ok()));
    let Some(key) = key else { return };
    let Some((method, tx)) = pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&key)
    else {
        return;
    };
    let result = match message.get("error") {
        Some(error) => Err(RpcError::Remote {
            method,
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_string(),
            data: error.get("data").cloned(),
        }),
        None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
    };
    let _ = tx.send(result);
}

/// The agent's own detail of an error, as ` (detail)`; empty when there is none or it only
/// repeats the message.
fn detail(message: &str, data: Option<&Value>) -> String {
    let text = match data {
        Some(Value::String(text)) => Some(text.as_str()),
        Some(data) => ["message", "details", "error"]
            .iter()
            .find_map(|key| data.get(*key).and_then(Value::as_str)),
        None => None,
    };
    match text.map(str::trim) {
        Some(text) if !text.is_empty() && text != message => format!(" ({text})"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn an_error_keeps_the_agents_own_detail() {
        let error = |data: Option<Value>| RpcError::Remote {
            method: "session/prompt".to_string(),
            code: -32603,
            message: "Internal error".to_string(),
            data,
        };
        let codex = serde_json::json!({"message": "stream disconnected before completion: error sending request for url (http://127.0.0.1:9/v1/responses)"});
        assert_eq!(
            error(Some(codex)).to_string(),
            "the agent answered `session/prompt` with error -32603: Internal error (stream disconnected before completion: error sending request for url (http://127.0.0.1:9/v1/responses))"
        );
        assert_eq!(
            error(Some(Value::String("quota exceeded".into()))).to_string(),
            "the agent answered `session/prompt` with error -32603: Internal error (quota exceeded)"
        );
        assert_eq!(
            error(None).to_string(),
            "the agent answered `session/prompt` with error -32603: Internal error"
        );
        let same = serde_json::json!({"message": "Internal error"});
        assert!(!error(Some(same)).to_string().contains("(Internal error)"));
    }
}

#[cfg(test)]
mod order_tests {
    use tokio::io::AsyncBufReadExt;

    use super::*;

    /// A steer cancels the turn whose prompt was just asked for: the agent must read the
    /// prompt before the cancel, even when nothing has awaited the prompt's answer yet.
    #[tokio::test]
    async fn a_request_goes_out_before_what_is_sent_after_it() {
        let (agent_side, client_side) = tokio::io::duplex(4096);
        let (client_read, client_write) = tokio::io::split(client_side);
        let (rpc, _incoming) = connect(client_read, client_write);
        let prompt = rpc.request("session/prompt", serde_json::json!({"sessionId": "s"}));
        rpc.notify("session/cancel", serde_json::json!({"sessionId": "s"}))
            .await;
        let mut lines = tokio::io::BufReader::new(agent_side).lines();
        let first = lines.next_line().await.expect("read").expect("a line");
        let second = lines.next_line().await.expect("read").expect("a line");
        assert!(first.contains("session/prompt"), "{first}");
        assert!(second.contains("session/cancel"), "{second}");
        drop(prompt);
    }
}
