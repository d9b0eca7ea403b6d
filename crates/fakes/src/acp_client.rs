//! A minimal ACP (v1) client that drives one agent process directly, for tests and benchmarks.
//!
//! It speaks newline-delimited JSON-RPC 2.0 on the agent's stdin/stdout: `initialize`,
//! `session/new`, `session/prompt` (collecting the `session/update` notifications of the turn)
//! and `session/cancel`. It answers the agent's `session/request_permission` by option kind
//! (see [`PermissionAnswer`]), `fs/*` when the client advertised them, and refuses anything
//! else. Agent request ids are echoed verbatim, strings or numbers; unknown notifications are
//! ignored. The agent runs in its own process group, which [`AcpClient::shutdown`] (or drop,
//! without grace) signals together with the groups of the agent's descendants.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::procs::{self, Process};

/// How to start an agent: everything explicit, nothing inherited from the caller.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The agent's whole environment.
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
}

/// How the client answers `session/request_permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PermissionAnswer {
    /// The option of kind `allow_once` (else `allow_always`).
    #[default]
    AllowOnce,
    /// The option of kind `reject_once` (else `reject_always`).
    RejectOnce,
    /// Outcome `cancelled`.
    Cancelled,
}

#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// Advertise `fs.readTextFile` / `fs.writeTextFile` (and serve them). Not for gemini,
    /// whose `write_file` to a new path then fails.
    pub fs: bool,
    /// The longest wait for any answer, a whole prompt turn included.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            fs: true,
            timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("agent answered `{method}` with an error: {error}")]
    Rpc { method: String, error: Value },
    #[error("agent did not answer `{method}` within {timeout:?}; its stderr ends with:\n{stderr}")]
    Timeout {
        method: String,
        timeout: Duration,
        stderr: String,
    },
    #[error("agent went away before answering `{method}`; its stderr ends with:\n{stderr}")]
    Closed { method: String, stderr: String },
    #[error("agent's answer to `{method}` has no `{field}`: {result}")]
    Malformed {
        method: String,
        field: &'static str,
        result: Value,
    },
    #[error("nothing matching arrived within {0:?}")]
    WaitTimeout(Duration),
}

/// One `session/prompt` turn as the client saw it.
#[derive(Debug, Clone)]
pub struct Turn {
    pub stop_reason: String,
    /// The `update` objects of the turn's `session/update` notifications, in arrival order.
    pub updates: Vec<Value>,
    /// The turn's permission requests: `{"request": params, "answer": optionId | "cancelled"}`.
    pub permissions: Vec<Value>,
    pub elapsed: Duration,
}

impl Turn {
    /// The agent's reply: its `agent_message_chunk` texts joined.
    pub fn text(&self) -> String {
        self.updates
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["content"]["text"].as_str())
            .collect()
    }

    /// `sessionUpdate` kinds in arrival order.
    pub fn kinds(&self) -> Vec<&str> {
        self.updates
            .iter()
            .filter_map(|u| u["sessionUpdate"].as_str())
            .collect()
    }
}

/// Most of an agent's stderr worth keeping for an error message.
const STDERR_KEEP: usize = 16 * 1024;

#[derive(Debug, Default)]
struct State {
    /// Our requests waiting for an answer, by id.
    pending: HashMap<u64, (String, oneshot::Sender<Result<Value, Value>>)>,
    /// `session/update` params, in arrival order.
    updates: Vec<Value>,
    permissions: Vec<Value>,
    answer: PermissionAnswer,
    stderr: VecDeque<u8>,
    /// Stdout reached EOF: no answer will come.
    closed: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Woken on every `session/update`.
    updated: Notify,
    fs: bool,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stderr_tail(&self) -> String {
        let state = self.state();
        let (a, b) = state.stderr.as_slices();
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }
}

/// A running agent and the client's side of its connection.
#[derive(Debug)]
pub struct AcpClient {
    shared: Arc<Shared>,
    /// Lines to write to the agent's stdin, by the writer task.
    out: mpsc::Sender<String>,
    next_id: AtomicU64,
    child: Mutex<Option<Child>>,
    pgid: i32,
    timeout: Duration,
}

impl AcpClient {
    /// Starts the agent in its own process group with exactly `cmd.env`.
    pub fn spawn(cmd: &AgentCommand, options: ClientOptions) -> Result<AcpClient, AcpError> {
        let spawn_error = |source| AcpError::Spawn {
            program: cmd.program.clone(),
            source,
        };
        let mut child = Command::new(&cmd.program)
            .args(&cmd.args)
            .env_clear()
            .envs(&cmd.env)
            .current_dir(&cmd.cwd)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let missing = || spawn_error(std::io::Error::other("no pid or pipes"));
        let pgid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(missing)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(missing());
        };
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            updated: Notify::new(),
            fs: options.fs,
        });
        // Requests, answers and cancels are small and few; a full queue means a stuck agent.
        let (out, lines) = mpsc::channel(64);
        tokio::spawn(write_lines(stdin, lines));
        tokio::spawn(read_messages(shared.clone(), stdout, out.clone()));
        tokio::spawn(drain_stderr(shared.clone(), stderr));
        Ok(AcpClient {
            shared,
            out,
            next_id: AtomicU64::new(0),
            child: Mutex::new(Some(child)),
            pgid,
            timeout: options.timeout,
        })
    }

    /// The agent's process group id (its pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    pub fn set_permission_answer(&self, answer: PermissionAnswer) {
        self.shared.state().answer = answer;
    }

    /// The last bytes the agent wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.shared.stderr_tail()
    }

    /// Sends a request and waits (at most the client's timeout) for its result.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, AcpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.state();
            if state.closed {
                drop(state);
                return Err(self.closed(method));
            }
            state.pending.insert(id, (method.to_string(), tx));
        }
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.out.send(line.to_string()).await.is_err() {
            return Err(self.closed(method));
        }
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(error))) => Err(AcpError::Rpc {
                method: method.to_string(),
                error,
            }),
            Ok(Err(_)) => Err(self.closed(method)),
            Err(_) => {
                self.shared.state().pending.remove(&id);
                Err(AcpError::Timeout {
                    method: method.to_string(),
                    timeout: self.timeout,
                    stderr: self.stderr_tail(),
                })
            }
        }
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), AcpError> {
        let line = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.out
            .send(line.to_string())
            .await
            .map_err(|_| self.closed(method))
    }

    fn closed(&self, method: &str) -> AcpError {
        AcpError::Closed {
            method: method.to_string(),
            stderr: self.stderr_tail(),
        }
    }

    /// `initialize` with protocol version 1; returns the agent's answer.
    pub async fn initialize(&self) -> Result<Value, AcpError> {
        let fs = self.shared.fs;
        self.request(
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": {
                    "fs": {"readTextFile": fs, "writeTextFile": fs},
                    "terminal": false,
                },
                "clientInfo": {"name": "drover-fakes", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await
    }

    /// `session/new` in `cwd` (absolute) without MCP servers; returns the session id.
    pub async fn new_session(&self, cwd: &Path) -> Result<String, AcpError> {
        let method = "session/new";
        let result = self
            .request(method, json!({"cwd": cwd, "mcpServers": []}))
            .await?;
        match result["sessionId"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => Err(AcpError::Malformed {
                method: method.to_string(),
                field: "sessionId",
                result,
            }),
        }
    }

    /// One `session/prompt` turn with a text prompt, and what arrived while it ran.
    pub async fn prompt(&self, session_id: &str, text: &str) -> Result<Turn, AcpError> {
        let method = "session/prompt";
        let started = Instant::now();
        let (first_update, first_permission) = {
            let state = self.shared.state();
            (state.updates.len(), state.permissions.len())
        };
        let result = self
            .request(
                method,
                json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}),
            )
            .await?;
        let elapsed = started.elapsed();
        let Some(stop_reason) = result["stopReason"].as_str() else {
            return Err(AcpError::Malformed {
                method: method.to_string(),
                field: "stopReason",
                result,
            });
        };
        let state = self.shared.state();
        let ours = |p: &&Value| p["sessionId"] == session_id;
        Ok(Turn {
            stop_reason: stop_reason.to_string(),
            updates: state.updates[first_update..]
                .iter()
                .filter(ours)
                .map(|p| p["update"].clone())
                .collect(),
            permissions: state.permissions[first_permission..]
                .iter()
                .filter(|p| p["request"]["sessionId"] == session_id)
                .cloned()
                .collect(),
            elapsed,
        })
    }

    /// `session/cancel` (a notification; the running prompt answers `cancelled`).
    pub async fn cancel(&self, session_id: &str) -> Result<(), AcpError> {
        self.notify("session/cancel", json!({"sessionId": session_id}))
            .await
    }

    /// How many `session/update` notifications arrived so far.
    pub fn update_count(&self) -> usize {
        self.shared.state().updates.len()
    }

    /// Waits until an update at index `from` or later matches `pred`; returns its `update`.
    pub async fn wait_for_update(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value, AcpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.updated.notified();
            tokio::pin!(notified);
            // Registered before looking, so an update that lands in between still wakes us.
            notified.as_mut().enable();
            {
                let state = self.shared.state();
                if let Some(u) = state.updates.iter().skip(from).find(|p| pred(&p["update"])) {
                    return Ok(u["update"].clone());
                }
                if state.closed {
                    drop(state);
                    return Err(self.closed("session/update"));
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(AcpError::WaitTimeout(timeout));
            }
        }
    }

    /// The agent's processes (not zombies): its process group, and every descendant of its
    /// leader whatever the group. Agents start tool commands in groups of their own.
    pub fn processes(&self) -> Vec<Process> {
        procs::tree(self.pgid)
    }

    /// The process groups of `tree` and the agent's own, never the caller's.
    fn groups(&self, tree: &[Process]) -> Vec<i32> {
        let own_group = procs::own_group();
        let mut groups: Vec<i32> = tree.iter().map(|p| p.pgrp).collect();
        groups.push(self.pgid);
        groups.sort_unstable();
        groups.dedup();
        groups.retain(|g| *g > 1 && Some(*g) != own_group);
        groups
    }

    /// Stops the agent: SIGTERM to its process group and to the groups of its descendants,
    /// SIGKILL to what is left after `grace`. Returns the pids still alive (zombies aside) a
    /// second after that; empty when all is gone. A process that left the tree before (a
    /// daemonized background job) is out of reach.
    pub async fn shutdown(&self, grace: Duration) -> Vec<i32> {
        let tree = self.processes();
        let groups = self.groups(&tree);
        let pids: Vec<i32> = tree.iter().map(|p| p.pid).collect();
        let alive = || -> Vec<i32> {
            procs::live()
                .into_iter()
                .filter(|p| pids.contains(&p.pid) || groups.contains(&p.pgrp))
                .map(|p| p.pid)
                .collect()
        };
        let signal_all = |signal| {
            for group in &groups {
                signal_group(*group, signal);
            }
        };

        let child = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        signal_all(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        if let Some(mut child) = child
            && tokio::time::timeout(grace, child.wait()).await.is_err()
        {
            signal_all(libc::SIGKILL);
            let _ = child.wait().await;
        }
        loop {
            let left = alive();
            if left.is_empty() {
                return left;
            }
            if Instant::now() >= deadline {
                signal_all(libc::SIGKILL);
                tokio::time::sleep(Duration::from_secs(1)).await;
                return alive();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for AcpClient {
    fn drop(&mut self) {
        if self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            for group in self.groups(&self.processes()) {
                signal_group(group, libc::SIGKILL);
            }
        }
    }
}

/// Sends `signal` to every process of group `pgid`.
#[expect(unsafe_code)]
fn signal_group(pgid: i32, signal: libc::c_int) {
    if pgid > 1 {
        // SAFETY: kill(2) takes two integers and touches no memory of this process.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

async fn write_lines(mut stdin: ChildStdin, mut lines: mpsc::Receiver<String>) {
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
}

async fn drain_stderr(shared: Arc<Shared>, mut stderr: tokio::process::ChildStderr) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let mut state = shared.state();
        state.stderr.extend(&buf[..n]);
        let excess = state.stderr.len().saturating_sub(STDERR_KEEP);
        state.stderr.drain(..excess);
    }
}

async fn read_messages(
    shared: Arc<Shared>,
    stdout: tokio::process::ChildStdout,
    out: mpsc::Sender<String>,
) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue; // not JSON-RPC: agents sometimes log to stdout
        };
        let method = msg["method"].as_str();
        let has_id = msg.get("id").is_some_and(|id| !id.is_null());
        match (method, has_id) {
            (Some(method), true) => {
                let reply = match answer_request(&shared, method, &msg["params"]) {
                    Ok(result) => json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}),
                    Err(error) => json!({"jsonrpc": "2.0", "id": msg["id"], "error": error}),
                };
                if out.send(reply.to_string()).await.is_err() {
                    break;
                }
            }
            (Some("session/update"), false) => {
                shared.state().updates.push(msg["params"].clone());
                shared.updated.notify_waiters();
            }
            // Other notifications (e.g. `_auth/status_update`) and id-less garbage.
            (_, false) => {}
            (None, true) => {
                let waiter = msg["id"]
                    .as_u64()
                    .and_then(|id| shared.state().pending.remove(&id));
                if let Some((_, tx)) = waiter {
                    let outcome = match msg.get("error") {
                        Some(error) => Err(error.clone()),
                        None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                    };
                    let _ = tx.send(outcome);
                }
            }
        }
    }
    let mut state = shared.state();
    state.closed = true;
    // Dropping the senders fails every waiting request.
    state.pending.clear();
    drop(state);
    shared.updated.notify_waiters();
}

/// The client's answer to a request from the agent. File access is blocking: the files are
/// small and the reader has nothing else to do meanwhile.
fn answer_request(shared: &Shared, method: &str, params: &Value) -> Result<Value, Value> {
    match method {
        "session/request_permission" => {
            let answer = shared.state().answer;
            let kinds: &[&str] = match answer {
                PermissionAnswer::AllowOnce => &["allow_once", "allow_always"],
                PermissionAnswer::RejectOnce => &["reject_once", "reject_always"],
                PermissionAnswer::Cancelled => &[],
            };
            let options = params["options"].as_array().map_or(&[][..], Vec::as_slice);
            let chosen = kinds
                .iter()
                .find_map(|k| options.iter().find(|o| o["kind"] == *k))
                .and_then(|o| o["optionId"].as_str());
            shared.state().permissions.push(json!({
                "request": params,
                "answer": chosen.unwrap_or("cancelled"),
            }));
            Ok(match chosen {
                Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
                None => json!({"outcome": {"outcome": "cancelled"}}),
            })
        }
        "fs/read_text_file" if shared.fs => {
            let path = params["path"].as_str().unwrap_or_default();
            // A missing file reads as empty: gemini's write_file to a new path reads it first.
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let skip = params["line"].as_u64().map_or(0, |l| {
                usize::try_from(l.saturating_sub(1)).unwrap_or(usize::MAX)
            });
            let take = params["limit"]
                .as_u64()
                .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
            let content = if skip == 0 && take == usize::MAX {
                text
            } else {
                text.split_inclusive('\n').skip(skip).take(take).collect()
            };
            Ok(json!({"content": content}))
        }
        "fs/write_text_file" if shared.fs => {
            let path = PathBuf::from(params["path"].as_str().unwrap_or_default());
            let content = params["content"].as_str().unwrap_or_default();
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::write(&path, content) {
                Ok(()) => Ok(json!({})),
                Err(e) => Err(json!({
                    "code": -32603,
                    "message": format!("cannot write {}: {e}", path.display()),
                })),
            }
        }
        _ => Err(json!({"code": -32601, "message": format!("method not found: {method}")})),
    }
}
