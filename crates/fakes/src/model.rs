//! A scripted model on loopback, so that real coding agents run real turns offline.
//!
//! The server speaks the three wire formats the agents use, each streamed as server-sent
//! events: `OpenAI` Responses (`POST /v1/responses`, codex), Anthropic Messages
//! (`POST /v1/messages`, claude) and Gemini (`POST /v1beta/models/{model}:streamGenerateContent`,
//! plus the JSON-mode `:generateContent` calls gemini-cli makes to route a turn).
//!
//! What the model does is written in the latest user message, one directive a line (other
//! lines are ignored, so the agent's own context blocks do no harm):
//!
//! ```text
//! reply <text>            answer <text> and end the turn
//! stream <n> [<ms>]       answer n small text deltas, <ms> apart (default 5), and end the turn
//! shell <command>         call the agent's shell tool (codex exec_command/shell, claude Bash,
//!                         gemini run_shell_command)
//! write <path> <content>  call the agent's file-writing tool (codex apply_patch, claude Write,
//!                         gemini write_file); `\n` in <content> is a newline
//! read <path>             call the agent's file-reading tool (claude Read, gemini read_file,
//!                         codex `cat` through its shell tool)
//! sleep <ms>              wait <ms> before answering with the next directive (or the final
//!                         reply); the response headers go out first
//! call <tool> [<json>]    call the offered tool whose name is <tool> or ends with it, e.g. an
//!                         MCP tool (`call create_agent {...}` finds codex's `create_agent` in
//!                         its `mcp__drover` namespace, claude's `mcp__drover__create_agent`),
//!                         with the JSON object <json> as arguments (default `{}`)
//! limit <s> [noreset]     the provider's usage limit: every request with this message is
//!                         answered HTTP 429 until <s> seconds after the first one, as each
//!                         provider answers it (see [`limit_response`]); the reset time is in
//!                         the answer unless `noreset`. Then the other directives play.
//! ```
//!
//! One directive is played per model request: the number of tool results after the latest
//! user message picks it, so the server keeps no state between requests. When the directives
//! run out the model answers [`FINAL_REPLY`]. Tool names and argument names are taken from the
//! tools the request offers where possible, so the server follows the agents across versions.
//! Every request is logged ([`ModelServer::requests`], or `GET /requests`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// What the model answers once a message's directives are used up.
pub const FINAL_REPLY: &str = "done";

/// How long a request body may be; codex sends its whole instructions every turn.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// One step of a script: wait, then act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub delay_ms: u64,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "directive", rename_all = "lowercase")]
pub enum Action {
    Reply { text: String },
    Stream { count: u32, interval_ms: u64 },
    Shell { command: String },
    Write { path: String, content: String },
    Read { path: String },
    Call { tool: String, arguments: Value },
}

/// Parses the directives in a user message. Lines that are not directives are skipped.
pub fn parse_script(text: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut delay_ms = 0;
    for line in text.lines() {
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        let action = match word {
            "reply" if !rest.is_empty() => Action::Reply {
                text: rest.to_string(),
            },
            "stream" => {
                let mut nums = rest.split_whitespace().map(str::parse::<u64>);
                match (nums.next(), nums.next(), nums.next()) {
                    (Some(Ok(count)), interval, None) => Action::Stream {
                        count: u32::try_from(count).unwrap_or(u32::MAX),
                        interval_ms: match interval {
                            Some(Ok(ms)) => ms,
                            None => 5,
                            Some(Err(_)) => continue,
                        },
                    },
                    _ => continue,
                }
            }
            "shell" if !rest.is_empty() => Action::Shell {
                command: rest.to_string(),
            },
            "write" => match rest.split_once(' ') {
                Some((path, content)) => Action::Write {
                    path: path.to_string(),
                    content: content.replace("\\n", "\n"),
                },
                None => continue,
            },
            "read" if !rest.is_empty() => Action::Read {
                path: rest.to_string(),
            },
            "call" if !rest.is_empty() => {
                let (tool, arguments) = rest.split_once(' ').unwrap_or((rest, "{}"));
                match serde_json::from_str::<Value>(arguments.trim()) {
                    Ok(arguments @ Value::Object(_)) => Action::Call {
                        tool: tool.to_string(),
                        arguments,
                    },
                    _ => continue,
                }
            }
            "sleep" => match rest.parse::<u64>() {
                Ok(ms) => {
                    delay_ms += ms;
                    continue;
                }
                Err(_) => continue,
            },
            _ => continue,
        };
        steps.push(Step { delay_ms, action });
        delay_ms = 0;
    }
    if delay_ms > 0 {
        steps.push(Step {
            delay_ms,
            action: Action::Reply {
                text: FINAL_REPLY.to_string(),
            },
        });
    }
    steps
}

/// A running model server. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct ModelServer {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Value>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ModelServer {
    /// `http://127.0.0.1:PORT`, without a path.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far, oldest first: `{seq, ms, method, path, api, body, played}`, where
    /// `ms` is when it arrived, after the server started, and `played` the step answered, e.g.
    /// `{"directive": "shell", "command": "ls", "delay_ms": 0}`.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.log).clone()
    }

    /// Stops accepting, gives open streams a second to finish, then drops them.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.task).await;
        self.task.abort();
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug)]
struct Shared {
    log: Arc<Mutex<Vec<Value>>>,
    ids: AtomicU64,
    started: Instant,
    /// When a message with a `limit` directive was first asked about, by its text.
    limits: Mutex<std::collections::HashMap<String, Instant>>,
}

impl Shared {
    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves the scripted model on `listener` until the returned handle is shut down or dropped.
pub fn serve(listener: tokio::net::TcpListener) -> ModelServer {
    let shared = Arc::new(Shared {
        log: Arc::default(),
        ids: AtomicU64::new(0),
        started: Instant::now(),
        limits: Mutex::default(),
    });
    let log = shared.log.clone();
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let app = Router::new().fallback(handle).with_state(shared);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    ModelServer {
        addr,
        log,
        stop: Some(stop),
        task,
    }
}

/// Which wire format a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
    Gemini,
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or(path.clone(), |p| p.as_str().to_string());
    if method == Method::GET && path == "/requests" {
        return json_response(&Value::Array(lock(&shared.log).clone()));
    }
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);

    let (api_name, played, response) = route(&shared, &method, &path, &body);
    let mut log = lock(&shared.log);
    let seq = log.len();
    log.push(json!({
        "seq": seq,
        "ms": shared.started.elapsed().as_millis(),
        "method": method.as_str(),
        "path": path_and_query,
        "api": api_name,
        "body": body,
        "played": played,
    }));
    response
}

/// Picks the answer: (api name for the log, what was played, the response).
fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: &Value,
) -> (&'static str, Value, Response) {
    if *method != Method::POST {
        return (
            "unknown",
            Value::Null,
            StatusCode::NOT_FOUND.into_response(),
        );
    }
    if path.ends_with("/responses") {
        let turn = Turn::openai(body);
        if let Some(limited) = limited(shared, &turn, Api::OpenAi) {
            return limited;
        }
        let step = turn.step();
        let played = describe(&step);
        return ("openai", played, sse(openai_events(shared, &turn, &step)));
    }
    if path.ends_with("/messages/count_tokens") {
        return (
            "anthropic-count",
            Value::Null,
            json_response(&json!({"input_tokens": 10})),
        );
    }
    if path.ends_with("/messages") {
        let turn = Turn::anthropic(body);
        if let Some(limited) = limited(shared, &turn, Api::Anthropic) {
            return limited;
        }
        let step = turn.step();
        let played = describe(&step);
        let events = anthropic_events(shared, &turn, &step);
        if body["stream"].as_bool() == Some(true) {
            return ("anthropic", played, sse(events));
        }
        return (
            "anthropic",
            played,
            json_response(&anthropic_message(&events)),
        );
    }
    if let Some((_, call)) = path.rsplit_once(':') {
        match call {
            "streamGenerateContent" => {
                let turn = Turn::gemini(body);
                if let Some(limited) = limited(shared, &turn, Api::Gemini) {
                    return limited;
                }
                let step = turn.step();
                let played = describe(&step);
                return ("gemini", played, sse(gemini_events(&turn, &step)));
            }
            "generateContent" => {
                let text = if body["generationConfig"]["responseMimeType"] == "application/json" {
                    // The router's classifier (and any other JSON-mode helper call) gets one
                    // object carrying every field those calls ask for.
                    json!({
                        "reasoning": "scripted model",
                        "complexity_reasoning": "scripted model",
                        "complexity_score": 1,
                        "model_choice": "flash",
                        "next_speaker": "user",
                    })
                    .to_string()
                } else {
                    FINAL_REPLY.to_string()
                };
                return (
                    "gemini-json",
                    json!({"reply": text}),
                    json_response(&json!({
                        "candidates": [{
                            "content": {"role": "model", "parts": [{"text": text}]},
                            "finishReason": "STOP",
                            "index": 0,
                        }],
                        "usageMetadata": gemini_usage(),
                    })),
                );
            }
            "countTokens" => {
                return (
                    "gemini-count",
                    Value::Null,
                    json_response(&json!({"totalTokens": 10})),
                );
            }
            _ => {}
        }
    }
    (
        "unknown",
        Value::Null,
        StatusCode::NOT_FOUND.into_response(),
    )
}

/// The `limit <s> [noreset]` line of a message: the seconds, and whether the answer gives the
/// reset time.
fn limit_directive(text: &str) -> Option<(u64, bool)> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("limit") {
            return None;
        }
        let seconds = words.next()?.parse().ok()?;
        Some((seconds, words.next() != Some("noreset")))
    })
}

/// The 429 of a limited message, while its limit lasts: (api, played, response).
fn limited(shared: &Shared, turn: &Turn, api: Api) -> Option<(&'static str, Value, Response)> {
    let (seconds, with_reset) = limit_directive(&turn.user_text)?;
    let first = *lock(&shared.limits)
        .entry(turn.user_text.clone())
        .or_insert_with(Instant::now);
    let left = Duration::from_secs(seconds).checked_sub(first.elapsed())?;
    let reset = std::time::SystemTime::now() + left;
    let name = match api {
        Api::OpenAi => "openai",
        Api::Anthropic => "anthropic",
        Api::Gemini => "gemini",
    };
    let played = json!({"directive": "limit", "leftMs": left.as_millis(), "reset": with_reset});
    Some((name, played, limit_response(api, left, reset, with_reset)))
}

/// A usage limit as each provider's API answers it: HTTP 429 and
/// - `OpenAI` (codex, signed in to ChatGPT): `{"error": {"type": "usage_limit_reached",
///   "message", "resets_at": <unix seconds>, "resets_in_seconds"}}`, which codex reports as
///   "You've hit your usage limit. Try again at <local time>.";
/// - Anthropic: `{"type": "error", "error": {"type": "rate_limit_error", "message"}}` with
///   `retry-after` (seconds) and `anthropic-ratelimit-unified-reset` (unix seconds);
/// - Gemini: `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message", "details":
///   [{"@type": "…google.rpc.QuotaFailure", "violations": [{"quotaId": "…PerDay…"}]},
///   {"@type": "…google.rpc.RetryInfo", "retryDelay": "<n>s"}]}}` (a daily quota).
///
/// Without `with_reset` none of the reset fields or headers are there.
fn limit_response(
    api: Api,
    left: Duration,
    reset: std::time::SystemTime,
    with_reset: bool,
) -> Response {
    let reset_unix = reset
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
    let left_s = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let (body, headers): (Value, Vec<(&str, String)>) = match api {
        Api::OpenAi => {
            let mut error = json!({
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
            });
            if with_reset {
                error["resets_at"] = json!(reset_unix);
                error["resets_in_seconds"] = json!(left_s);
            }
            (json!({ "error": error }), Vec::new())
        }
        Api::Anthropic => (
            json!({"type": "error", "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed your account's rate limit. Please try again later.",
            }}),
            if with_reset {
                vec![
                    ("retry-after", left_s.to_string()),
                    ("anthropic-ratelimit-unified-reset", reset_unix.to_string()),
                ]
            } else {
                Vec::new()
            },
        ),
        Api::Gemini => {
            // A free tier's daily quota: gemini-cli gives up at once (a shorter limit it
            // retries itself, ten times, 5 to 30 s apart).
            let mut details = vec![json!({
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                }],
            })];
            if with_reset {
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": format!("{left_s}s"),
                }));
            }
            let error = json!({
                "code": 429,
                "status": "RESOURCE_EXHAUSTED",
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "details": details,
            });
            (json!({ "error": error }), Vec::new())
        }
    };
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    for (name, value) in headers {
        if let Ok(value) = header::HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn describe(step: &Step) -> Value {
    serde_json::to_value(step).unwrap_or(Value::Null)
}

/// A tool the request offers: its name, kind (`function`, `custom`, ...) and parameter schema,
/// and the namespace it was offered in (codex groups an MCP server's tools in a `namespace`
/// tool named `mcp__<server>`).
#[derive(Debug, Clone, Default)]
struct Tool {
    name: String,
    kind: String,
    params: Value,
    namespace: Option<String>,
}

impl Tool {
    /// `<namespace>__<name>`, or the name.
    fn qualified_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}__{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The part of a request the script needs.
#[derive(Debug, Default)]
struct Turn {
    /// Text of the latest user message that is not only tool results.
    user_text: String,
    /// Tool results after that message.
    tool_results: usize,
    tools: Vec<Tool>,
}

impl Turn {
    fn step(&self) -> Step {
        parse_script(&self.user_text)
            .into_iter()
            .nth(self.tool_results)
            .unwrap_or(Step {
                delay_ms: 0,
                action: Action::Reply {
                    text: FINAL_REPLY.to_string(),
                },
            })
    }

    /// The agent's own tool with one of `names`, in that order of preference (tools in a
    /// namespace belong to MCP servers and are never picked here).
    fn tool(&self, names: &[&str]) -> Option<&Tool> {
        names.iter().find_map(|n| {
            self.tools
                .iter()
                .find(|t| t.namespace.is_none() && t.name == *n)
        })
    }

    /// The tool named `wanted` (bare or qualified), else the first whose qualified name ends
    /// with it.
    fn tool_ending_with(&self, wanted: &str) -> Option<&Tool> {
        self.tools
            .iter()
            .find(|t| t.name == wanted || t.qualified_name() == wanted)
            .or_else(|| {
                self.tools
                    .iter()
                    .find(|t| t.qualified_name().ends_with(wanted))
            })
    }

    /// Codex: `input` is a list of items; user messages carry `input_text` parts and tool
    /// results are `function_call_output` / `custom_tool_call_output` items.
    fn openai(body: &Value) -> Turn {
        let items = body["input"].as_array().map_or(&[][..], Vec::as_slice);
        let mut turn = Turn {
            tools: body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(openai_tools)
                .collect(),
            ..Turn::default()
        };
        for item in items {
            let kind = item["type"].as_str().unwrap_or("message");
            if kind == "message" && item["role"] == "user" {
                let text = content_text(&item["content"]);
                // Codex adds context as user messages of its own (`<environment_context>`,
                // `<user_instructions>`...); only a message with directives restarts the count.
                if !parse_script(&text).is_empty() || !text.trim_start().starts_with('<') {
                    turn.user_text = text;
                    turn.tool_results = 0;
                }
            } else if kind.ends_with("_call_output") {
                turn.tool_results += 1;
            }
        }
        turn
    }

    /// Claude: a user message holding `tool_result` blocks is a tool result, not a prompt.
    fn anthropic(body: &Value) -> Turn {
        let mut turn = Turn {
            tools: body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| Tool {
                    name: t["name"].as_str().unwrap_or_default().to_string(),
                    kind: "function".to_string(),
                    params: t["input_schema"].clone(),
                    namespace: None,
                })
                .collect(),
            ..Turn::default()
        };
        for msg in body["messages"].as_array().into_iter().flatten() {
            if msg["role"] != "user" {
                continue;
            }
            let results = msg["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|b| b["type"] == "tool_result")
                .count();
            if results > 0 {
                turn.tool_results += results;
            } else {
                turn.user_text = content_text(&msg["content"]);
                turn.tool_results = 0;
            }
        }
        turn
    }

    /// Gemini: `contents` with `parts`; tool results are `functionResponse` parts.
    fn gemini(body: &Value) -> Turn {
        let mut turn = Turn {
            tools: body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten())
                .map(|f| Tool {
                    name: f["name"].as_str().unwrap_or_default().to_string(),
                    kind: "function".to_string(),
                    params: if f["parametersJsonSchema"].is_null() {
                        f["parameters"].clone()
                    } else {
                        f["parametersJsonSchema"].clone()
                    },
                    namespace: None,
                })
                .collect(),
            ..Turn::default()
        };
        for content in body["contents"].as_array().into_iter().flatten() {
            if content["role"] != "user" {
                continue;
            }
            let parts = content["parts"].as_array().map_or(&[][..], Vec::as_slice);
            let results = parts
                .iter()
                .filter(|p| !p["functionResponse"].is_null())
                .count();
            if results > 0 {
                turn.tool_results += results;
            } else {
                turn.user_text = script_text(parts.iter().filter_map(|p| p["text"].as_str()));
                turn.tool_results = 0;
            }
        }
        turn
    }
}

/// One entry of a Responses API `tools` list: a tool, or a `namespace` holding tools.
fn openai_tools(t: &Value) -> Vec<Tool> {
    let tool = |t: &Value, namespace: Option<String>| Tool {
        name: t["name"].as_str().unwrap_or_default().to_string(),
        kind: t["type"].as_str().unwrap_or_default().to_string(),
        params: t["parameters"].clone(),
        namespace,
    };
    if t["type"] == "namespace" {
        let ns = t["name"].as_str().unwrap_or_default().to_string();
        t["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|inner| tool(inner, Some(ns.clone())))
            .collect()
    } else {
        vec![tool(t, None)]
    }
}

/// The script of a message: its last text part that holds directives. Claude merges the
/// user messages of an interrupted turn into the next one, and agents add context parts, so
/// earlier parts are not the prompt.
fn script_text<'a>(parts: impl DoubleEndedIterator<Item = &'a str>) -> String {
    let mut last = None;
    for text in parts.rev() {
        last.get_or_insert(text);
        if !parse_script(text).is_empty() {
            return text.to_string();
        }
    }
    last.unwrap_or_default().to_string()
}

/// The script of a message's content: a string, or text parts (`OpenAI` or Anthropic).
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => script_text(parts.iter().filter_map(|p| p["text"].as_str())),
        _ => String::new(),
    }
}

/// The name of the first parameter in `tool`'s schema among `candidates`, else the first
/// candidate.
fn param<'a>(tool: &Tool, candidates: &[&'a str]) -> &'a str {
    candidates
        .iter()
        .find(|c| !tool.params["properties"][**c].is_null())
        .or(candidates.first())
        .copied()
        .unwrap_or("path")
}

/// What the model emits for one step, in no particular wire format.
#[derive(Debug, Clone)]
enum Output {
    Text {
        deltas: Vec<String>,
        interval_ms: u64,
    },
    Call {
        name: String,
        /// The namespace the tool was offered in (codex's MCP tools).
        namespace: Option<String>,
        args: Args,
    },
}

#[derive(Debug, Clone)]
enum Args {
    Json(Value),
    /// The raw input of a codex freeform tool (`custom_tool_call`), e.g. an `apply_patch` patch.
    Freeform(String),
}

impl Args {
    fn into_json(self) -> Value {
        match self {
            Args::Json(v) => v,
            Args::Freeform(input) => json!({ "input": input }),
        }
    }
}

impl Output {
    fn text(s: impl Into<String>) -> Output {
        Output::Text {
            deltas: vec![s.into()],
            interval_ms: 0,
        }
    }

    fn call(tool: &Tool, args: Args) -> Output {
        Output::Call {
            name: tool.name.clone(),
            namespace: tool.namespace.clone(),
            args,
        }
    }
}

fn stream_deltas(count: u32) -> Vec<String> {
    (0..count).map(|i| format!("chunk{i} ")).collect()
}

/// Maps a step to the agent's own tools: `shell`, `write`, `read` become tool calls.
fn output(api: Api, turn: &Turn, action: &Action) -> Output {
    match action {
        Action::Reply { text } => Output::text(text.clone()),
        Action::Stream { count, interval_ms } => Output::Text {
            deltas: stream_deltas(*count),
            interval_ms: *interval_ms,
        },
        Action::Shell { command } => shell_call(api, turn, command),
        Action::Write { path, content } => match api {
            Api::OpenAi => match turn.tool(&["apply_patch"]) {
                Some(tool) => {
                    let mut patch = format!("*** Begin Patch\n*** Add File: {path}\n");
                    for line in content.lines() {
                        patch.push('+');
                        patch.push_str(line);
                        patch.push('\n');
                    }
                    patch.push_str("*** End Patch\n");
                    Output::call(
                        tool,
                        if tool.kind == "custom" {
                            Args::Freeform(patch)
                        } else {
                            Args::Json(json!({ "input": patch }))
                        },
                    )
                }
                None => missing_tool("apply_patch"),
            },
            Api::Anthropic | Api::Gemini => {
                let names: &[&str] = if api == Api::Anthropic {
                    &["Write"]
                } else {
                    &["write_file"]
                };
                match turn.tool(names) {
                    Some(tool) => {
                        let key = param(tool, &["file_path", "absolute_path", "path"]);
                        Output::call(tool, Args::Json(json!({ key: path, "content": content })))
                    }
                    None => missing_tool(names[0]),
                }
            }
        },
        Action::Read { path } => match api {
            Api::OpenAi => shell_call(api, turn, &format!("cat {path}")),
            Api::Anthropic | Api::Gemini => {
                let names: &[&str] = if api == Api::Anthropic {
                    &["Read"]
                } else {
                    &["read_file"]
                };
                match turn.tool(names) {
                    Some(tool) => {
                        let key = param(tool, &["file_path", "absolute_path", "path"]);
                        Output::call(tool, Args::Json(json!({ key: path })))
                    }
                    None => missing_tool(names[0]),
                }
            }
        },
        Action::Call { tool, arguments } => match turn.tool_ending_with(tool) {
            Some(found) => Output::call(found, Args::Json(arguments.clone())),
            None => missing_tool(tool),
        },
    }
}

fn shell_call(api: Api, turn: &Turn, command: &str) -> Output {
    match api {
        Api::OpenAi => match turn.tool(&["exec_command", "shell_command", "shell"]) {
            Some(tool) => {
                let args = match tool.name.as_str() {
                    "exec_command" => json!({ param(tool, &["cmd", "command"]): command }),
                    "shell_command" => json!({ "command": command }),
                    _ => json!({ "command": ["bash", "-lc", command] }),
                };
                Output::call(tool, Args::Json(args))
            }
            None => missing_tool("exec_command"),
        },
        Api::Anthropic => match turn.tool(&["Bash"]) {
            Some(tool) => Output::call(
                tool,
                Args::Json(json!({ "command": command, "description": "Run a scripted command" })),
            ),
            None => missing_tool("Bash"),
        },
        Api::Gemini => match turn.tool(&["run_shell_command"]) {
            Some(tool) => Output::call(
                tool,
                Args::Json(json!({ "command": command, "description": "Run a scripted command" })),
            ),
            None => missing_tool("run_shell_command"),
        },
    }
}

/// Side calls (titles, summaries) offer no tools; they get a plain answer.
fn missing_tool(name: &str) -> Output {
    Output::text(format!("(scripted model: no {name} tool offered)"))
}

/// One SSE event: its name (`event:` line; Gemini sends none) and JSON data, after a pause.
#[derive(Debug, Clone)]
struct Event {
    pause_ms: u64,
    name: Option<&'static str>,
    data: Value,
}

fn event(name: Option<&'static str>, data: Value) -> Event {
    Event {
        pause_ms: 0,
        name,
        data,
    }
}

/// Streams `events` as SSE; stops when the client goes away.
fn sse(events: Vec<Event>) -> Response {
    // A few events in flight are plenty; the producer waits on a slow reader.
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::spawn(async move {
        for ev in events {
            if ev.pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(ev.pause_ms)).await;
            }
            let mut frame = String::new();
            if let Some(name) = ev.name {
                frame.push_str("event: ");
                frame.push_str(name);
                frame.push('\n');
            }
            frame.push_str("data: ");
            frame.push_str(&ev.data.to_string());
            frame.push_str("\n\n");
            if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(ReceiverStream(rx)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// An mpsc receiver as a `Stream`, for `Body::from_stream`.
#[derive(Debug)]
struct ReceiverStream<T>(mpsc::Receiver<T>);

impl<T> futures_core::Stream for ReceiverStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

fn json_response(v: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Puts the step's delay before the first event (the response headers are already out).
fn pace(mut events: Vec<Event>, delay_ms: u64) -> Vec<Event> {
    if let Some(first) = events.first_mut() {
        first.pause_ms += delay_ms;
    }
    events
}

fn openai_events(shared: &Shared, turn: &Turn, step: &Step) -> Vec<Event> {
    let n = shared.next_id();
    let resp_id = format!("resp_{n}");
    let mut events = vec![event(
        Some("response.created"),
        json!({"type": "response.created", "response": {"id": resp_id}}),
    )];
    let item = |item: Value| {
        [
            event(
                Some("response.output_item.added"),
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ),
            event(
                Some("response.output_item.done"),
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
        ]
    };
    match output(Api::OpenAi, turn, &step.action) {
        Output::Text {
            deltas,
            interval_ms,
        } => {
            let msg_id = format!("msg_{n}");
            let [added, _] = item(json!({
                "type": "message", "role": "assistant", "id": msg_id, "content": [],
            }));
            events.push(added);
            for d in &deltas {
                events.push(Event {
                    pause_ms: interval_ms,
                    name: Some("response.output_text.delta"),
                    data: json!({
                        "type": "response.output_text.delta",
                        "item_id": msg_id, "output_index": 0, "content_index": 0, "delta": d,
                    }),
                });
            }
            let [_, done] = item(json!({
                "type": "message", "role": "assistant", "id": msg_id,
                "content": [{"type": "output_text", "text": deltas.concat(), "annotations": []}],
            }));
            events.push(done);
        }
        Output::Call {
            name,
            namespace,
            args: Args::Json(args),
        } => {
            let mut call = json!({
                "type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"),
                "name": name, "arguments": args.to_string(),
            });
            // A tool offered in a namespace is called by its name within it.
            if let Some(ns) = namespace {
                call["namespace"] = json!(ns);
            }
            events.extend(item(call));
        }
        Output::Call {
            name,
            args: Args::Freeform(input),
            ..
        } => {
            events.extend(item(json!({
                "type": "custom_tool_call", "id": format!("ctc_{n}"),
                "call_id": format!("call_{n}"), "name": name, "input": input,
            })));
        }
    }
    events.push(event(
        Some("response.completed"),
        json!({"type": "response.completed", "response": {
            "id": resp_id,
            "usage": {
                "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 15,
            },
        }}),
    ));
    pace(events, step.delay_ms)
}

fn anthropic_events(shared: &Shared, turn: &Turn, step: &Step) -> Vec<Event> {
    let n = shared.next_id();
    let usage = json!({
        "input_tokens": 10, "output_tokens": 1,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    });
    let mut events = vec![event(
        Some("message_start"),
        json!({"type": "message_start", "message": {
            "id": format!("msg_{n}"), "type": "message", "role": "assistant",
            "model": "claude-scripted", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": usage,
        }}),
    )];
    let stop_reason = match output(Api::Anthropic, turn, &step.action) {
        Output::Text {
            deltas,
            interval_ms,
        } => {
            events.push(event(
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            for d in deltas {
                events.push(Event {
                    pause_ms: interval_ms,
                    name: Some("content_block_delta"),
                    data: json!({"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": d}}),
                });
            }
            "end_turn"
        }
        Output::Call { name, args, .. } => {
            events.push(event(
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {
                    "type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": {},
                }}),
            ));
            events.push(event(
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": {
                    "type": "input_json_delta", "partial_json": args.into_json().to_string(),
                }}),
            ));
            "tool_use"
        }
    };
    events.push(event(
        Some("content_block_stop"),
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        Some("message_delta"),
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    ));
    events.push(event(Some("message_stop"), json!({"type": "message_stop"})));
    pace(events, step.delay_ms)
}

/// Folds streamed Anthropic events into one message, for requests that do not stream.
fn anthropic_message(events: &[Event]) -> Value {
    let mut message = Value::Null;
    let mut text = String::new();
    let mut tool: Option<Value> = None;
    for ev in events {
        let d = &ev.data;
        match d["type"].as_str() {
            Some("message_start") => message = d["message"].clone(),
            Some("content_block_start") if d["content_block"]["type"] == "tool_use" => {
                tool = Some(d["content_block"].clone());
            }
            Some("content_block_delta") => {
                if let Some(t) = d["delta"]["text"].as_str() {
                    text.push_str(t);
                }
                if let (Some(t), Some(json)) = (&mut tool, d["delta"]["partial_json"].as_str()) {
                    t["input"] = serde_json::from_str(json).unwrap_or(Value::Null);
                }
            }
            Some("message_delta") => {
                message["stop_reason"] = d["delta"]["stop_reason"].clone();
            }
            _ => {}
        }
    }
    message["content"] = match tool {
        Some(t) => json!([t]),
        None => json!([{"type": "text", "text": text}]),
    };
    message
}

fn gemini_usage() -> Value {
    json!({"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15})
}

fn gemini_events(turn: &Turn, step: &Step) -> Vec<Event> {
    let chunk = |parts: Value, last: bool| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        let mut data = json!({});
        if last {
            candidate["finishReason"] = json!("STOP");
            data["usageMetadata"] = gemini_usage();
        }
        data["candidates"] = json!([candidate]);
        event(None, data)
    };
    let events = match output(Api::Gemini, turn, &step.action) {
        Output::Text {
            deltas,
            interval_ms,
        } => {
            let last = deltas.len().saturating_sub(1);
            deltas
                .into_iter()
                .enumerate()
                .map(|(i, d)| Event {
                    pause_ms: interval_ms,
                    ..chunk(json!([{ "text": d }]), i == last)
                })
                .collect()
        }
        Output::Call { name, args, .. } => {
            vec![chunk(
                json!([{ "functionCall": { "name": name, "args": args.into_json() } }]),
                true,
            )]
        }
    };
    pace(events, step.delay_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_directives_and_skips_other_lines() {
        let steps = parse_script(
            "<context>\nreply hello there\nsleep 20\nsleep 5\nshell touch a\nwrite /x/y a\\nb\n\
             stream 3 40\nstream 2\nread /x/y\nWrite something\nsleep 7",
        );
        let actions: Vec<_> = steps.iter().map(|s| (s.delay_ms, &s.action)).collect();
        assert_eq!(
            actions,
            vec![
                (
                    0,
                    &Action::Reply {
                        text: "hello there".into()
                    }
                ),
                (
                    25,
                    &Action::Shell {
                        command: "touch a".into()
                    }
                ),
                (
                    0,
                    &Action::Write {
                        path: "/x/y".into(),
                        content: "a\nb".into()
                    }
                ),
                (
                    0,
                    &Action::Stream {
                        count: 3,
                        interval_ms: 40
                    }
                ),
                (
                    0,
                    &Action::Stream {
                        count: 2,
                        interval_ms: 5
                    }
                ),
                (
                    0,
                    &Action::Read {
                        path: "/x/y".into()
                    }
                ),
                (
                    7,
                    &Action::Reply {
                        text: FINAL_REPLY.into()
                    }
                ),
            ]
        );
    }

    #[test]
    fn parses_tool_calls() {
        let steps = parse_script(
            "call create_agent {\"relationship\": {\"kind\": \"subagent\"}}\n\
             call list_providers\ncall broken {not json\ncall listed [1]\ncall",
        );
        let actions: Vec<_> = steps.into_iter().map(|s| s.action).collect();
        assert_eq!(
            actions,
            vec![
                Action::Call {
                    tool: "create_agent".into(),
                    arguments: json!({"relationship": {"kind": "subagent"}}),
                },
                Action::Call {
                    tool: "list_providers".into(),
                    arguments: json!({}),
                },
            ]
        );
    }

    #[test]
    fn a_call_finds_the_tool_by_suffix_in_codex_namespaces() {
        let body = json!({
            "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "call create_agent {\"title\": \"kid\"}"},
            ]}],
            "tools": [
                {"type": "function", "name": "exec_command", "parameters": {}},
                {"type": "namespace", "name": "mcp__drover", "tools": [
                    {"type": "function", "name": "create_agent", "parameters": {}},
                    {"type": "function", "name": "exec_command", "parameters": {}},
                ]},
            ],
        });
        let turn = Turn::openai(&body);
        let step = turn.step();
        match output(Api::OpenAi, &turn, &step.action) {
            Output::Call {
                name,
                namespace,
                args: Args::Json(args),
            } => {
                assert_eq!(name, "create_agent");
                assert_eq!(namespace.as_deref(), Some("mcp__drover"));
                assert_eq!(args, json!({"title": "kid"}));
            }
            other => panic!("{other:?}"),
        }
        let events = openai_events(
            &Shared {
                log: Arc::default(),
                ids: AtomicU64::new(0),
                started: Instant::now(),
                limits: Mutex::default(),
            },
            &turn,
            &step,
        );
        let call = &events[1].data["item"];
        assert_eq!(call["type"], "function_call");
        assert_eq!(call["namespace"], "mcp__drover");
        assert_eq!(call["name"], "create_agent");
        // The agent's own shell tool is still the one outside any namespace.
        match shell_call(Api::OpenAi, &turn, "ls") {
            Output::Call { namespace, .. } => assert_eq!(namespace, None),
            other @ Output::Text { .. } => panic!("{other:?}"),
        }
        // Claude's flat MCP names (`mcp__drover__create_agent`) match by suffix.
        let body = json!({
            "messages": [{"role": "user", "content": "call create_agent"}],
            "tools": [{"name": "mcp__drover__create_agent", "input_schema": {}}],
        });
        let turn = Turn::anthropic(&body);
        match output(Api::Anthropic, &turn, &turn.step().action) {
            Output::Call { name, .. } => assert_eq!(name, "mcp__drover__create_agent"),
            other @ Output::Text { .. } => panic!("{other:?}"),
        }
        // No such tool: a plain answer says so.
        let turn = Turn::anthropic(&json!({
            "messages": [{"role": "user", "content": "call nothing_here {}"}],
        }));
        assert!(matches!(
            output(Api::Anthropic, &turn, &turn.step().action),
            Output::Text { .. }
        ));
    }

    #[test]
    fn tool_results_after_the_prompt_pick_the_step() {
        let body = json!({"messages": [
            {"role": "user", "content": "shell a\nshell b"},
            {"role": "assistant", "content": [{"type": "tool_use"}]},
            {"role": "user", "content": [{"type": "tool_result"}, {"type": "text", "text": "x"}]},
        ], "tools": [{"name": "Bash", "input_schema": {}}]});
        let turn = Turn::anthropic(&body);
        assert_eq!(turn.tool_results, 1);
        assert_eq!(
            turn.step().action,
            Action::Shell {
                command: "b".into()
            }
        );
    }
}
