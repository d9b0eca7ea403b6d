//! `drover-scripted-agent` as a client sees it: the binary is spawned and driven with raw
//! JSON-RPC lines over its stdio, and every wait is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use drover_testkit::wait::poll_until_blocking;
use serde_json::{Value, json};

/// The longest any single expected message may take.
const TIMEOUT: Duration = Duration::from_secs(10);

const ENV_VARS: [&str; 6] = [
    "SCRIPTED_AGENT_STATE_DIR",
    "SCRIPTED_AGENT_NO_LOAD",
    "SCRIPTED_AGENT_STRING_IDS",
    "SCRIPTED_AGENT_LATE_UPDATES",
    "SCRIPTED_AGENT_IGNORE_EOF",
    "SCRIPTED_TEST_VALUE",
];

/// One scripted agent process; killed on drop.
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    next_id: u64,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    fn spawn(state_dir: &Path, envs: &[(&str, &str)]) -> Agent {
        let mut command = Command::new(env!("CARGO_BIN_EXE_drover-scripted-agent"));
        for var in ENV_VARS {
            command.env_remove(var);
        }
        command
            .env("SCRIPTED_AGENT_STATE_DIR", state_dir)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn drover-scripted-agent");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("stderr lock")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdin = child.stdin.take();
        Agent {
            child,
            stdin,
            lines,
            stderr,
            next_id: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{message}").expect("write to the agent");
        stdin.flush().expect("flush the agent's stdin");
    }

    fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to the agent");
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line, raw.
    fn next_line(&mut self) -> String {
        self.lines
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|e| panic!("no line from the agent within {TIMEOUT:?}: {e}"))
    }

    fn next(&mut self) -> Value {
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Reads until `done` holds; returns that message and the ones before it.
    fn until(&mut self, done: impl Fn(&Value) -> bool) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = self.next();
            if done(&message) {
                return (message, before);
            }
            before.push(message);
        }
    }

    /// Sends a request and reads up to its response.
    fn call_with_id(&mut self, id: &Value, method: &str, params: Value) -> (Value, Vec<Value>) {
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        message["params"] = params;
        self.send(&message);
        self.until(|m| m.get("method").is_none() && m["id"] == *id)
    }

    fn call(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.call_with_id(&id, method, params)
    }

    fn initialize(&mut self) -> Value {
        let (reply, _) = self.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        reply["result"].clone()
    }

    fn new_session(&mut self) -> String {
        let (reply, _) = self.call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        );
        reply["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId: {reply}"))
            .to_string()
    }

    fn start_prompt(&mut self, session: &str, text: &str) -> Value {
        let id = json!(format!("prompt-{}", self.next_id));
        self.next_id += 1;
        self.send(&json!({
            "jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": session, "prompt": [{"type": "text", "text": text}]},
        }));
        id
    }

    /// Runs a prompt with no client requests in it; returns the stop reason and the updates.
    fn prompt(&mut self, session: &str, text: &str) -> (String, Vec<Value>) {
        let id = self.start_prompt(session, text);
        self.finish_prompt(&id)
    }

    fn finish_prompt(&mut self, id: &Value) -> (String, Vec<Value>) {
        let (reply, updates) = self.until(|m| m.get("method").is_none() && m["id"] == *id);
        let reason = reply["result"]["stopReason"]
            .as_str()
            .unwrap_or_else(|| panic!("no stopReason: {reply}"))
            .to_string();
        (reason, updates)
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        poll_until_blocking(timeout, || self.child.try_wait().expect("try_wait"))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }
}

fn kind(message: &Value) -> &str {
    message["params"]["update"]["sessionUpdate"]
        .as_str()
        .unwrap_or_default()
}

/// The texts of the `agent_message_chunk` updates.
fn said(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|m| kind(m) == "agent_message_chunk")
        .map(|m| {
            m["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn state_dir() -> tempfile::TempDir {
    tempfile::TempDir::new().expect("state dir")
}

#[test]
fn initialize_and_new_session() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    let init = agent.initialize();
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"],
        json!({"image": false, "audio": false, "embeddedContext": true})
    );
    assert_eq!(
        init["agentCapabilities"]["mcpCapabilities"],
        json!({"http": true, "sse": false})
    );
    assert_eq!(init["authMethods"], json!([]));

    let (reply, _) = agent.call(
        "session/new",
        json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    let result = &reply["result"];
    assert_eq!(result["modes"]["currentModeId"], "default");
    assert_eq!(result["modes"]["availableModes"][1]["id"], "plan");
    assert_eq!(result["models"]["currentModelId"], "scripted-small");
    assert_eq!(
        result["models"]["availableModels"][1]["modelId"],
        "scripted-large"
    );
    let first = result["sessionId"].as_str().expect("sessionId").to_string();
    assert_ne!(first, agent.new_session(), "session ids are unique");

    let (reply, _) = agent.call("session/new", json!({"cwd": "relative", "mcpServers": []}));
    assert_eq!(reply["error"]["code"], -32602, "{reply}");

    let (reply, updates) = agent.call(
        "session/set_mode",
        json!({"sessionId": first, "modeId": "plan"}),
    );
    assert_eq!(reply["result"], json!({}));
    assert_eq!(updates.len(), 1);
    assert_eq!(kind(&updates[0]), "current_mode_update");
    assert_eq!(updates[0]["params"]["update"]["currentModeId"], "plan");
    let (reply, _) = agent.call(
        "session/set_model",
        json!({"sessionId": first, "modelId": "scripted-large"}),
    );
    assert_eq!(reply["result"], json!({}));

    let mut no_load = Agent::spawn(dir.path(), &[("SCRIPTED_AGENT_NO_LOAD", "1")]);
    assert_eq!(
        no_load.initialize()["agentCapabilities"]["loadSession"],
        false
    );
}

#[test]
fn say_stream_and_other_directives() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[("SCRIPTED_TEST_VALUE", "forty-two")]);
    agent.initialize();
    let session = agent.new_session();

    let (reason, updates) = agent.prompt(&session, "say hello\nstream 5");
    assert_eq!(reason, "end_turn");
    let expected: Vec<String> = std::iter::once("hello".to_string())
        .chain((1..=5).map(|i| format!("chunk {i}\n")))
        .collect();
    assert_eq!(said(&updates), expected);
    assert!(updates.iter().all(|m| m["params"]["sessionId"] == session));

    let (reason, updates) = agent.prompt(&session, "");
    assert_eq!(
        (reason.as_str(), said(&updates)),
        ("end_turn", vec!["ok".to_string()])
    );

    let (reason, updates) = agent.prompt(
        &session,
        "think hmm\ntool ls -la\nplan one; two\nusage\nunknown\nenv SCRIPTED_TEST_VALUE\nenv SCRIPTED_NOT_SET\nwhat now\nstop max_tokens\nsay never",
    );
    assert_eq!(reason, "max_tokens");
    let kinds: Vec<&str> = updates
        .iter()
        .map(|m| m["method"].as_str().unwrap_or_default())
        .collect();
    assert!(kinds.contains(&"_scripted/status"), "{kinds:?}");
    let update_kinds: Vec<&str> = updates
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(kind)
        .collect();
    assert_eq!(
        update_kinds,
        [
            "agent_thought_chunk",
            "tool_call",
            "tool_call_update",
            "plan",
            "usage_update",
            "scripted_unknown_kind",
            "agent_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
        ]
    );
    let tool_call = &updates[1]["params"]["update"];
    assert_eq!(tool_call["status"], "pending");
    assert_eq!(tool_call["kind"], "execute");
    assert_eq!(
        updates[2]["params"]["update"]["toolCallId"],
        tool_call["toolCallId"]
    );
    assert_eq!(updates[2]["params"]["update"]["status"], "completed");
    assert_eq!(
        updates[3]["params"]["update"]["entries"][1]["content"],
        "two"
    );
    assert_eq!(said(&updates), ["forty-two", "<unset>", "ok: what now"]);

    let id = agent.start_prompt(&session, "say before\nfail scripted failure\nsay after");
    let (reply, updates) = agent.until(|m| m["id"] == id);
    assert_eq!(reply["error"]["code"], -32603);
    assert_eq!(reply["error"]["message"], "scripted failure");
    assert_eq!(said(&updates), ["before"]);
}

#[test]
fn permission_allow_reject_and_cancel() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    agent.initialize();
    let session = agent.new_session();
    let is_request = |m: &Value| m["method"] == "session/request_permission";

    // Allowed, claude's order: announce, then ask.
    let prompt = agent.start_prompt(&session, "permission rm -rf build");
    let (request, before) = agent.until(is_request);
    assert_eq!(before.len(), 1);
    assert_eq!(kind(&before[0]), "tool_call");
    let tool_call_id = before[0]["params"]["update"]["toolCallId"].clone();
    assert_eq!(request["id"], 0, "integer ids from 0");
    let params = &request["params"];
    assert_eq!(params["sessionId"], session.as_str());
    assert_eq!(params["toolCall"]["toolCallId"], tool_call_id);
    let options: Vec<(&str, &str)> = params["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|o| {
            (
                o["optionId"].as_str().unwrap_or_default(),
                o["kind"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        options,
        [
            ("allow-once", "allow_once"),
            ("allow-always", "allow_always"),
            ("reject-once", "reject_once"),
            ("reject-always", "reject_always"),
        ]
    );
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
    let (reason, updates) = agent.finish_prompt(&prompt);
    assert_eq!(reason, "end_turn");
    assert_eq!(kind(&updates[0]), "tool_call_update");
    assert_eq!(updates[0]["params"]["update"]["status"], "completed");
    assert_eq!(said(&updates), ["permission granted"]);

    // Rejected.
    let prompt = agent.start_prompt(&session, "permission rm -rf /");
    let (request, _) = agent.until(is_request);
    assert_eq!(request["id"], 1);
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}}));
    let (reason, updates) = agent.finish_prompt(&prompt);
    assert_eq!(reason, "end_turn");
    assert_eq!(updates[0]["params"]["update"]["status"], "failed");
    assert_eq!(said(&updates), ["permission denied"]);

    // The client answers `cancelled`.
    let prompt = agent.start_prompt(&session, "permission make\nsay never");
    let (request, _) = agent.until(is_request);
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"outcome": {"outcome": "cancelled"}}}));
    let (reason, updates) = agent.finish_prompt(&prompt);
    assert_eq!(reason, "cancelled");
    assert!(said(&updates).is_empty());

    // session/cancel while the question is open.
    let prompt = agent.start_prompt(&session, "permission make\nsay never");
    agent.until(is_request);
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    );
    let (reason, updates) = agent.finish_prompt(&prompt);
    assert_eq!(reason, "cancelled");
    assert!(said(&updates).is_empty());

    // codex's order: ask, then announce.
    let prompt = agent.start_prompt(&session, "permission-first cargo test");
    let (request, before) = agent.until(is_request);
    assert!(
        before.is_empty(),
        "nothing announced before asking: {before:?}"
    );
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow-always"}}}));
    let (_, updates) = agent.finish_prompt(&prompt);
    let kinds: Vec<&str> = updates.iter().map(kind).collect();
    assert_eq!(
        kinds,
        ["tool_call", "tool_call_update", "agent_message_chunk"]
    );

    // gemini's order: ask, then only updates for an id never announced.
    let prompt = agent.start_prompt(&session, "permission-only cargo test");
    let (request, before) = agent.until(is_request);
    assert!(before.is_empty());
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
    let (_, updates) = agent.finish_prompt(&prompt);
    let kinds: Vec<&str> = updates.iter().map(kind).collect();
    assert_eq!(kinds, ["tool_call_update", "agent_message_chunk"]);
    assert_eq!(
        updates[0]["params"]["update"]["toolCallId"],
        request["params"]["toolCall"]["toolCallId"]
    );
}

#[test]
fn sleep_is_cancelled_by_session_cancel_and_sessions_run_concurrently() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    agent.initialize();
    let slow = agent.new_session();
    let fast = agent.new_session();

    let started = Instant::now();
    let sleeping = agent.start_prompt(&slow, "sleep 30000\nsay never");
    // Another session answers while the first sleeps.
    let (reason, updates) = agent.prompt(&fast, "say quick");
    assert_eq!(
        (reason.as_str(), said(&updates)),
        ("end_turn", vec!["quick".to_string()])
    );

    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": slow}}),
    );
    let (reason, updates) = agent.finish_prompt(&sleeping);
    assert_eq!(reason, "cancelled");
    assert!(said(&updates).is_empty());
    assert!(started.elapsed() < Duration::from_secs(10));

    // A streamed turn with delays is cancellable between chunks.
    let streaming = agent.start_prompt(&slow, "stream 1000 20");
    agent.until(|m| kind(m) == "agent_message_chunk");
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": slow}}),
    );
    let (reason, updates) = agent.finish_prompt(&streaming);
    assert_eq!(reason, "cancelled");
    assert!(said(&updates).len() < 999);
}

#[test]
fn crash_exits_with_its_code_after_flushing() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    agent.initialize();
    let session = agent.new_session();
    agent.start_prompt(&session, "say bye\nstderr last words\ncrash 7\nsay never");
    let bye = agent.next();
    assert_eq!(said(&[bye]), ["bye"]);
    let status = agent.wait_exit(TIMEOUT).expect("the agent exits");
    assert_eq!(status.code(), Some(7));
    // The stderr reader may lag the exit a little.
    let _ = poll_until_blocking(TIMEOUT, || {
        agent.stderr().contains("scripted agent crashing")
    });
    let stderr = agent.stderr();
    assert!(stderr.contains("last words"), "{stderr}");
    assert!(stderr.contains("scripted agent crashing"), "{stderr}");
}

#[test]
fn garbage_and_malformed_input_are_survived() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    agent.initialize();
    let session = agent.new_session();
    let id = agent.start_prompt(&session, "garbage\nsay after");
    let line = agent.next_line();
    assert!(serde_json::from_str::<Value>(&line).is_err(), "{line}");
    let (reason, updates) = agent.finish_prompt(&id);
    assert_eq!(
        (reason.as_str(), said(&updates)),
        ("end_turn", vec!["after".to_string()])
    );

    // Malformed lines and unknown notifications from the client are ignored.
    agent.send_raw("{not json");
    agent.send_raw("[1, 2, 3]");
    agent.send(&json!({"jsonrpc": "2.0", "method": "_client/whatever", "params": {}}));
    agent.send(&json!({"jsonrpc": "2.0", "id": 999, "result": {}}));
    let (reply, _) = agent.call("nonexistent/method", json!({}));
    assert_eq!(reply["error"]["code"], -32601);
    let (reason, _) = agent.prompt(&session, "say still here");
    assert_eq!(reason, "end_turn");
    assert!(agent.wait_exit(Duration::ZERO).is_none());
}

#[test]
fn unknown_method_and_client_ids_of_any_type() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    for id in [json!("init-a"), json!(1.5), json!(-4), json!(null)] {
        let (reply, _) = agent.call_with_id(&id, "initialize", json!({"protocolVersion": 1}));
        assert_eq!(reply["id"], id);
        assert_eq!(reply["result"]["protocolVersion"], 1);
    }
    let (reply, _) = agent.call_with_id(&json!("x"), "session/frobnicate", json!({}));
    assert_eq!(reply["id"], "x");
    assert_eq!(reply["error"]["code"], -32601);
    let (reply, _) = agent.call(
        "session/prompt",
        json!({"sessionId": "no-such-session", "prompt": []}),
    );
    assert!(reply["error"]["code"].is_i64(), "{reply}");
    // Still alive and answering.
    agent.initialize();
}

#[test]
fn load_replays_history_in_a_new_process() {
    let dir = state_dir();
    let mut first = Agent::spawn(dir.path(), &[]);
    first.initialize();
    let session = first.new_session();
    let (reason, _) = first.prompt(&session, "say remembered\nthink quietly");
    assert_eq!(reason, "end_turn");
    first.close_stdin();
    let status = first.wait_exit(TIMEOUT).expect("exits when stdin closes");
    assert_eq!(status.code(), Some(0));

    let mut second = Agent::spawn(dir.path(), &[]);
    second.initialize();
    let (reply, updates) = second.call(
        "session/load",
        json!({"sessionId": session, "cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    assert!(reply.get("error").is_none(), "{reply}");
    assert_eq!(reply["result"]["modes"]["currentModeId"], "default");
    let replay: Vec<(&str, &str)> = updates
        .iter()
        .map(|m| {
            assert_eq!(m["params"]["sessionId"], session.as_str());
            (
                kind(m),
                m["params"]["update"]["content"]["text"]
                    .as_str()
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        replay,
        [
            ("user_message_chunk", "say remembered\nthink quietly"),
            ("agent_message_chunk", "remembered"),
            ("agent_thought_chunk", "quietly"),
        ]
    );
    // The loaded session takes prompts.
    let (reason, updates) = second.prompt(&session, "say again");
    assert_eq!(
        (reason.as_str(), said(&updates)),
        ("end_turn", vec!["again".to_string()])
    );

    let (reply, updates) = second.call(
        "session/load",
        json!({"sessionId": "scripted-nope", "cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    assert!(updates.is_empty());
    assert_eq!(reply["error"]["code"], -32002, "{reply}");
    let (reply, _) = second.call(
        "session/load",
        json!({"sessionId": "../../etc/passwd", "cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    assert!(reply.get("error").is_some(), "{reply}");
}

#[test]
fn string_ids_and_late_updates() {
    let dir = state_dir();
    let mut agent = Agent::spawn(
        dir.path(),
        &[
            ("SCRIPTED_AGENT_STRING_IDS", "1"),
            ("SCRIPTED_AGENT_LATE_UPDATES", "1"),
        ],
    );
    agent.initialize();
    let session = agent.new_session();
    let prompt = agent.start_prompt(&session, "permission ls");
    let (request, _) = agent.until(|m| m["method"] == "session/request_permission");
    let id = request["id"].as_str().expect("a string id").to_string();
    assert_eq!(id.len(), 36, "UUID-like: {id}");
    agent.send(&json!({"jsonrpc": "2.0", "id": id,
        "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
    let (reason, _) = agent.finish_prompt(&prompt);
    assert_eq!(reason, "end_turn");
    // After the reply: a usage_update and a session_info_update.
    assert_eq!(kind(&agent.next()), "usage_update");
    let info = agent.next();
    assert_eq!(kind(&info), "session_info_update");
    assert!(info["params"]["update"]["updatedAt"].is_string());
}

#[test]
fn hang_ignores_cancel_and_outlives_stdin() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[]);
    agent.initialize();
    let session = agent.new_session();
    let other = agent.new_session();
    let hung = agent.start_prompt(&session, "say going\nhang");
    let (_, _) = agent.until(|m| kind(m) == "agent_message_chunk");
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    );
    // Still reading stdin: another session answers, and the hung prompt never does.
    let (reason, updates) = agent.prompt(&other, "say alive");
    assert_eq!(reason, "end_turn");
    assert!(updates.iter().all(|m| m["id"] != hung));
    agent.close_stdin();
    let exit = agent.wait_exit(Duration::from_millis(500));
    assert!(
        exit.is_none(),
        "a hung agent keeps running after stdin closes: {exit:?} {}",
        agent.stderr()
    );
}

#[test]
fn ignore_eof_keeps_running_and_spawn_child_reports_a_live_pid() {
    let dir = state_dir();
    let mut agent = Agent::spawn(dir.path(), &[("SCRIPTED_AGENT_IGNORE_EOF", "1")]);
    agent.initialize();
    let session = agent.new_session();
    let (_, updates) = agent.prompt(&session, "spawn-child\ncwd\nsession-cwd\necho-prompt");
    let said = said(&updates);
    let pid: u32 = said[0]
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{said:?}"));
    let _grandchild = KillOnDrop(pid);
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(said[2], std::env::temp_dir().display().to_string());
    assert_eq!(said[3], "spawn-child\ncwd\nsession-cwd\necho-prompt");
    agent.close_stdin();
    assert!(agent.wait_exit(Duration::from_millis(300)).is_none());
}

/// Kills the grandchild `spawn-child` started, which killing the agent alone leaves running.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.to_string()).status();
    }
}
