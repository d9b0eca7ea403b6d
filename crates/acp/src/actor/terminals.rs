//! ACP client terminals (`terminal/create`, `terminal/output`, `terminal/wait_for_exit`,
//! `terminal/kill`, `terminal/release`), on top of jobs: a terminal is a job of the agent,
//! started as a program with its arguments (no shell), telling no one when it ends (the agent
//! asks), listed with the agent's other jobs (`terminal: true`).
//!
//! A terminal belongs to the runtime that opened it: only that runtime may use it, and when
//! the runtime ends (close, archive, its process exiting, daemon shutdown) its terminals that
//! still run are killed. While one runs the runtime is not idle, so it does not hibernate (a
//! task per terminal tells the actor when it ends). Requests that wait (`wait_for_exit`,
//! `kill`, `release`) are answered from a task of their own, so the agent's loop never waits
//! for a command.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::Actor;
use crate::jobs::{JobCommand, JobError, JobRecord, JobSpec, KillCause, output};

/// JSON-RPC: invalid params.
const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC: internal error.
const INTERNAL_ERROR: i64 = -32603;
/// How long `terminal/wait_for_exit` may wait (a command that never ends is killed with the
/// runtime, which answers nothing more).
const WAIT_FOR_EXIT: Duration = Duration::from_secs(24 * 3600);

/// The terminals one runtime opened: job id → `outputByteLimit`.
pub(super) type Terminals = HashMap<String, Option<u64>>;

pub(super) fn is_terminal_method(method: &str) -> bool {
    matches!(
        method,
        "terminal/create"
            | "terminal/output"
            | "terminal/wait_for_exit"
            | "terminal/kill"
            | "terminal/release"
    )
}

impl Actor {
    pub(super) async fn on_terminal(&mut self, id: Value, method: &str, params: Value) {
        let Some(live) = &self.live else { return };
        let rpc = live.rpc.clone();
        if method == "terminal/create" {
            let answer = self.create_terminal(&params).await;
            rpc.respond(id, answer).await;
            return;
        }
        let Some(terminal) = params.get("terminalId").and_then(Value::as_str) else {
            rpc.respond(id, Err((INVALID_PARAMS, "`terminalId` is missing".into())))
                .await;
            return;
        };
        let Some(limit) = self.terminals.get(terminal).copied() else {
            let message =
                format!("no terminal `{terminal}` in this session (released, or never created)");
            rpc.respond(id, Err((INVALID_PARAMS, message))).await;
            return;
        };
        let jobs = self.shared.jobs.clone();
        let terminal = terminal.to_string();
        match method {
            "terminal/output" => {
                let answer = match jobs.output(
                    &terminal,
                    None,
                    Some(limit_bytes(limit)),
                    output::MAX_READ,
                ) {
                    Ok(chunk) => {
                        let record = jobs.get(&terminal).ok();
                        // Cut from the beginning, at a character boundary.
                        let start = chunk
                            .bytes
                            .iter()
                            .position(|b| b & 0xC0 != 0x80)
                            .unwrap_or(chunk.bytes.len());
                        let text = String::from_utf8_lossy(&chunk.bytes[start..]).into_owned();
                        let mut answer = json!({
                            "output": text,
                            "truncated": chunk.offset + start as u64 > 0,
                        });
                        if let Some(record) = record.filter(|r| !r.is_running()) {
                            answer["exitStatus"] = exit_status(&record);
                        }
                        Ok(answer)
                    }
                    Err(e) => Err((INTERNAL_ERROR, e.to_string())),
                };
                rpc.respond(id, answer).await;
            }
            "terminal/wait_for_exit" => {
                tokio::spawn(async move {
                    let answer = match jobs.wait(&terminal, WAIT_FOR_EXIT).await {
                        Ok((record, true)) => Ok(exit_status(&record)),
                        Ok((_, false)) => Err((
                            INTERNAL_ERROR,
                            "the command did not end within a day".into(),
                        )),
                        Err(e) => Err((INTERNAL_ERROR, e.to_string())),
                    };
                    rpc.respond(id, answer).await;
                });
            }
            "terminal/kill" | "terminal/release" => {
                if method == "terminal/release" {
                    self.terminals.remove(&terminal);
                }
                tokio::spawn(async move {
                    let answer = match jobs.kill(&terminal, KillCause::Request).await {
                        Ok(_) => Ok(json!({})),
                        Err(e) => Err((INTERNAL_ERROR, e.to_string())),
                    };
                    rpc.respond(id, answer).await;
                });
            }
            _ => {}
        }
    }

    /// `terminal/create`: starts the job and answers its id.
    async fn create_terminal(&mut self, params: &Value) -> Result<Value, (i64, String)> {
        let invalid = |m: String| (INVALID_PARAMS, m);
        let program = params
            .get("command")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("`command` is missing".into()))?
            .to_string();
        let args: Vec<String> = match params.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(args)) => args
                .iter()
                .map(|a| a.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("`args` must be strings".into()))?,
            Some(_) => return Err(invalid("`args` must be an array of strings".into())),
        };
        let mut env = BTreeMap::new();
        if let Some(vars) = params.get("env").and_then(Value::as_array) {
            for var in vars {
                let (Some(name), Some(value)) = (
                    var.get("name").and_then(Value::as_str),
                    var.get("value").and_then(Value::as_str),
                ) else {
                    return Err(invalid(format!(
                        "`env` entry {var} needs `name` and `value`"
                    )));
                };
                env.insert(name.to_string(), value.to_string());
            }
        }
        let agent_cwd = self
            .shared
            .registry
            .get(self.id)
            .map(|a| a.cwd)
            .unwrap_or_default();
        let cwd = match params.get("cwd").and_then(Value::as_str) {
            Some(cwd) => PathBuf::from(cwd),
            None => agent_cwd,
        };
        let limit = params.get("outputByteLimit").and_then(Value::as_u64);
        let spec = JobSpec {
            owner: self.id,
            command: JobCommand::Exec { program, args },
            cwd,
            env,
            timeout: None,
            notify_on_exit: false,
            started_by: "terminal".to_string(),
            terminal: true,
        };
        match self.shared.jobs.start(spec).await {
            Ok(record) => {
                self.terminals.insert(record.id.clone(), limit);
                let (jobs, ended, id) = (
                    self.shared.jobs.clone(),
                    self.terminal_ended.clone(),
                    record.id.clone(),
                );
                // Its end may make the runtime idle: the actor looks again.
                tokio::spawn(async move {
                    let _ = jobs.wait(&id, WAIT_FOR_EXIT).await;
                    ended.notify_one();
                });
                Ok(json!({"terminalId": record.id}))
            }
            Err(e @ JobError::Invalid { .. }) => Err((INVALID_PARAMS, e.to_string())),
            Err(e) => Err((INTERNAL_ERROR, e.to_string())),
        }
    }

    /// Whether a terminal this runtime opened (and has not released) still runs.
    pub(super) fn terminal_running(&self) -> bool {
        self.terminals
            .keys()
            .any(|id| self.shared.jobs.get(id).is_ok_and(|r| r.is_running()))
    }

    /// The runtime ended: its terminals that still run are killed (each in a task of its
    /// own: the kill's grace never holds up the runtime's end).
    pub(super) fn end_terminals(&mut self) {
        for (terminal, _) in self.terminals.drain() {
            let jobs = self.shared.jobs.clone();
            tokio::spawn(async move {
                let _ = jobs.kill(&terminal, KillCause::RuntimeEnded).await;
            });
        }
    }
}

/// What a terminal keeps: its `outputByteLimit`, within what one read returns.
fn limit_bytes(limit: Option<u64>) -> usize {
    limit
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(output::MAX_READ)
        .min(output::MAX_READ)
}

/// ACP's `TerminalExitStatus`: `{exitCode, signal}` (a signal by name).
fn exit_status(record: &JobRecord) -> Value {
    let signal = record.signal.map(|s| {
        nix::sys::signal::Signal::try_from(s)
            .map_or_else(|_| s.to_string(), |sig| sig.as_str().to_string())
    });
    json!({"exitCode": record.exit_code, "signal": signal})
}
