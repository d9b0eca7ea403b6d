//! A scripted ACP agent: the logic of the `drover-scripted-agent` binary, a real child process
//! that speaks ACP v1 (JSON-RPC 2.0, one JSON object per line on stdin/stdout) and whose turns
//! are written by the test, so that daemon tests are fast and deterministic and can reproduce
//! the quirks of real agents (see `agents-offline.md`).
//!
//! # Methods
//! - `initialize` → `protocolVersion: 1`, `loadSession: true` (false with
//!   `SCRIPTED_AGENT_NO_LOAD=1`), `promptCapabilities {image: false, audio: false,
//!   embeddedContext: true}`, `mcpCapabilities {http: true, sse: false}`, `authMethods: []`.
//! - `session/new {cwd, mcpServers}` → `{sessionId, modes, models}`; modes `default` and `plan`,
//!   models `scripted-small` and `scripted-large`. `cwd` must be an absolute path.
//! - `session/load {sessionId, cwd, mcpServers}` replays the stored history as `session/update`
//!   notifications (`user_message_chunk`, `agent_message_chunk`, `agent_thought_chunk`), then
//!   replies `{modes, models}` with the session's current mode and model. Unknown id → error
//!   -32002.
//! - `session/resume {sessionId, cwd, mcpServers}`: as `session/load` without the replay
//!   (advertised as `sessionCapabilities.resume`; not with `SCRIPTED_AGENT_NO_RESUME=1`).
//! - `session/close {sessionId}` → `{}`; the session's history gets a `{"type": "closed"}`
//!   line (advertised as `sessionCapabilities.close`, with resume).
//! - `session/list {cwd?, cursor?}` → `{sessions: [{sessionId, cwd, title, updatedAt}],
//!   nextCursor?}`: the sessions in the state dir (those in `cwd` when given), most recently
//!   changed first, `SCRIPTED_AGENT_LIST_PAGE` (default 50) a page; the title is the first
//!   line of the session's first prompt (none before one), `updatedAt` its history's last
//!   change. The cursor is the next page's offset. Advertised as `sessionCapabilities.list`
//!   (not with `SCRIPTED_AGENT_NO_LIST=1`).
//! - `session/set_mode {sessionId, modeId}` → a `current_mode_update` notification, then `{}`.
//! - `session/set_model {sessionId, modelId}` → `{}`.
//! - With `SCRIPTED_AGENT_CONFIG_OPTIONS=1`, the answers of `session/new`, `session/load` and
//!   `session/resume` also carry `configOptions`: `session-mode` (category `mode`), `llm`
//!   (`model`) and `effort` (`thought_level`: `low`, `medium`, `high`), with their current
//!   values; `session/set_config_option {sessionId, configId, value}` sets one and answers
//!   every option, current (a mode set so also sends `current_mode_update`). Without it that
//!   method is unknown. A mode or model set either way is kept in the session's history with
//!   the method that set it (`via`).
//! - `session/prompt {sessionId, prompt}` plays the prompt's directives (below) and replies
//!   `{stopReason}`.
//! - `session/cancel {sessionId}` (notification) cancels the session's running prompts: they
//!   reply `stopReason: "cancelled"` (except `hang`).
//! - Any other request → error -32601; other notifications and malformed lines are logged to
//!   stderr and ignored. The agent never exits because of its input.
//!
//! # Directives
//! The text of the prompt's blocks (text blocks, the text of embedded resources, the uri of
//! resource links), joined with newlines, is read line by line; each non-empty line (trimmed)
//! is one directive, played in order. With `SCRIPTED_AGENT_READ_QUOTES=1`, a line quoted as
//! `> <directive>` (as drover quotes a job's output or a subagent's reply in its notices) is
//! that directive, so a job can script the turn its end wakes. Before each directive a
//! cancelled turn ends with `cancelled`. A prompt without directives says `ok`.
//!
//! | directive | what the agent does |
//! |---|---|
//! | `say <text>` | one `agent_message_chunk` with `<text>` |
//! | `stream <n> [<delay_ms>]` | `n` chunks `chunk <i>\n` (i from 1), `delay_ms` (default 0) apart; cancellable |
//! | `stream-stamped <n> [<delay_ms>]` | as `stream`, each chunk `chunk <i> @<ns>\n` where `<ns>` is the wall clock (`CLOCK_REALTIME`, nanoseconds since the Unix epoch, 19 digits) just before the chunk is written: a benchmark on the same host reads end-to-end delays from it |
//! | `think <text>` | one `agent_thought_chunk` |
//! | `tool <title>` | `tool_call` (status `pending`, kind `execute`), then `tool_call_update` `completed` with text content |
//! | `permission <title>` | `tool_call`, then `session/request_permission`; allow → `tool_call_update` `completed` + say `permission granted`; reject → `failed` + say `permission denied`; outcome `cancelled` or a `session/cancel` → stop reason `cancelled` (claude's order) |
//! | `permission-first <title>` | asks first; once allowed announces the `tool_call` (`in_progress`), then completes it; a reject only says `permission denied`, the tool call is never mentioned again (codex's order) |
//! | `permission-only <title>` | asks, then sends only `tool_call_update` for an id no `tool_call` announced; a reject as codex's (gemini's order) |
//! | `sleep <ms>` | waits; cancellable |
//! | `hang` | never replies to this prompt and ignores cancel (one sent before it is reached too); the process keeps running, even after stdin closes |
//! | `crash [<code>]` | flushes stdout, writes `scripted agent crashing` to stderr and exits with `code` (default 3) |
//! | `garbage` | writes a line that is not JSON to stdout |
//! | `plan <step>; <step>...` | a `plan` update, entries `pending`, priority `medium` |
//! | `usage` | a `usage_update` (`used`, `size`, `cost {amount, currency}`): 1000 tokens more each time in this process's session, and the cost their running total at 1 USD per million; from then on the prompt's answer carries `usage` with that running total (`totalTokens`), as claude-agent-acp's does |
//! | `unknown` | a `session/update` of the unknown kind `scripted_unknown_kind` and an unknown notification `_scripted/status` |
//! | `fail <message>` | replies to the prompt with JSON-RPC error -32603 `<message>` (ends the turn) |
//! | `limit <agent> <seconds> [noreset]` | the usage limit of `codex`, `claude` or `gemini`: until `<seconds>` after this prompt's text was first seen (kept in the state dir, across processes), the prompt fails as that agent fails it: codex -32603 `Internal error` with "You've hit your usage limit. Try again at 4:57 PM." (`noreset`: "… Try again later.") in `data`; claude -32603 `Internal error: Claude AI usage limit reached\\|<unix seconds>` (`noreset`: `Internal error: API Error: 429 {…rate_limit_error…}`); gemini code 429 "You exceeded your current quota, … Please retry in 3s." (`noreset`: "You have exhausted your daily quota on this model."); then the next directives play |
//! | `stop <reason>` | ends the turn now with stop reason `<reason>` (`max_tokens`, `refusal`, ...) |
//! | `env <VAR>` | says the variable's value, or `<unset>` |
//! | `cwd` | says the process's working directory |
//! | `session-cwd` | says the `cwd` given by `session/new` or `session/load` |
//! | `mcp-servers` | says the `mcpServers` given by `session/new` or `session/load`, as JSON |
//! | `mcp <tool> <json arguments>` | calls `<tool>` on the session's first HTTP MCP server (`tools/call`) and says `mcp <tool>: <result text>` (or `mcp <tool> error: ...`) |
//! | `spawn-child` | spawns `sleep 1000` in the agent's process group (stdio null) and says `child <pid>` |
//! | `spawn-tool` | spawns `sleep 1000` in a process group of its own, as real agents run their tools, and says `tool <pid>` |
//! | `spawn-escapee` | starts, through a shell that exits at once, `sleep 1000` in a session of its own with an empty environment: not the agent's descendant (its parent is gone) and without drover's markers; says `escapee <pid>` and a newline |
//! | `spawn-session` | spawns, with `setsid`, a shell in a session of its own that starts `sleep 1000` and waits for it; says `session <pid>` (the shell's) |
//! | `stderr <text>` | writes `<text>` to stderr |
//! | `echo-prompt` | says the whole prompt text as received |
//! | `recall` | says `recall: <n> earlier: <first line of each earlier prompt, joined by " / ">` from what this process knows of the session: the prompts it ran in it and those `session/load` replayed (a new session, or one this process only heard of, has none) |
//! | `terminal <program> [<arg>...]` | runs it in an ACP client terminal (`terminal/create` with `SCRIPTED_TERMINAL=1` in its env; refused unless the client advertised `terminal: true`), then `terminal/wait_for_exit`, `terminal/output`, `terminal/release`; says `terminal <id> exit <exitCode> signal <signal> truncated <bool> output "<output>"` (or `… error: <error>`) |
//! | `terminal-limit <n> <program> [<arg>...]` | as `terminal`, with `outputByteLimit: n` |
//! | `terminal-kill <program> [<arg>...]` | as `terminal`, with a `terminal/kill` right after the create |
//! | `terminal-release <program> [<arg>...]` | creates, releases at once (which kills it), then asks `terminal/output` of the released terminal and says what came back |
//! | `terminal-start <program> [<arg>...]` | creates the terminal and leaves it running; says `terminal <id> started` |
//! | `terminal-output <id>` | asks `terminal/output` of terminal `<id>`; says `terminal <id> output <result as JSON>` (or `… output error: <error>`) |
//! | `own-task <title>` | claude's Task tool: a `tool_call` (`in_progress`, kind `think`, `_meta.claudeCode.toolName` `Task`) titled `<title>`, left running |
//! | `own-task-done` | the last `own-task` call's `tool_call_update` `completed` |
//! | `own-subagent <title>` | an ACP child session (when the client advertised `subagents`; else says `no subagents`): `subagent_update` announcing it `running`, then on the child's session an `agent_message_chunk` and a `tool_call`; it goes on after the turn |
//! | `own-subagent-done` | the last child's `subagent_update` with state `idle` |
//! | `subagent <prompt>` | creates a subagent through the session's MCP server (`create_agent`: relationship `subagent`, workspace `current`, the caller's provider) whose first prompt is `<prompt>` (`\n` in it starts a new line); says `started subagent <agentId>` (or `subagent error: ...`) |
//! | `job <shell command>` | starts a background job through the session's MCP server (`start_job`); says `started job <jobId>: <command>` (or `job error: ...`) |
//! | `tour` | a show of the rest, for the demo: `think`, `plan`, text streamed a few words at a time, `tool`, `permission`, `subagent`, `job` |
//! | `help` | says the directives, for people (the demo's welcome) |
//! | anything else | says `ok: <line>` |
//!
//! # Demo mode
//! `drover demo-agent` (the `demo` provider) and `SCRIPTED_AGENT_DEMO=1` make the agent
//! pleasant for a person trying drover (see `docs/demo.md`): a prompt without a directive
//! gets a welcome streamed a few words at a time (what it is and what to type), a notice from
//! drover (a prompt starting with `[drover]`: a subagent finished, a job ended) is
//! acknowledged in one line and never read as directives, and `say` streams its text too.
//! It plays only the directives `docs/demo.md` lists (`tour`, `help`, `say`, `think`, `plan`,
//! `tool`, `permission`, `subagent`, `job`, `stream`, `sleep`, `recall`, `usage`, `fail`,
//! `stop`, `mcp`); any other line is plain text (`ok: <line>`): what makes an agent misbehave
//! for drover's tests (`spawn-escapee`, `env`, `crash`, `hang`, ...) is not a person's to reach.
//!
//! # Environment
//! - `SCRIPTED_AGENT_STATE_DIR`: where session histories are kept (one `<sessionId>.jsonl` per
//!   session); default `$TMPDIR/drover-scripted-agent`.
//! - `SCRIPTED_AGENT_NO_LOAD=1`: advertise `loadSession: false` (and refuse `session/load`).
//! - `SCRIPTED_AGENT_NO_RESUME=1`: advertise no `sessionCapabilities` (and refuse
//!   `session/resume` and `session/close`), as agents that predate them.
//! - `SCRIPTED_AGENT_CONFIG_OPTIONS=1`: session config options (above).
//! - `SCRIPTED_AGENT_NO_LIST=1`: advertise no `sessionCapabilities.list` (and refuse
//!   `session/list`).
//! - `SCRIPTED_AGENT_LIST_PAGE=N`: sessions per `session/list` page (default 50).
//! - `SCRIPTED_AGENT_PROTOCOL_VERSION=N`: `initialize` answers `protocolVersion: N`.
//! - `SCRIPTED_AGENT_STRING_IDS=1`: agent→client request ids are UUID strings (as codex-acp's),
//!   not integers from 0.
//! - `SCRIPTED_AGENT_LATE_UPDATES=1`: after each prompt reply, send a `usage_update` and a
//!   `session_info_update` (real agents do).
//! - `SCRIPTED_AGENT_IGNORE_EOF=1`: keep running after stdin closes (as codex-acp does).
//! - `SCRIPTED_AGENT_UNLIMITED=1`: `limit` does nothing (a provider whose limit was not hit).
//! - `SCRIPTED_AGENT_IGNORE_TERM=1`: ignore SIGTERM, so a client that ends it waits for its
//!   grace and then kills it (a process slow to end).
//! - `SCRIPTED_AGENT_READ_QUOTES=1`: a line quoted with `> ` is the directive it quotes.
//! - `SCRIPTED_AGENT_ON_DROVER=<directives>`: a prompt from drover itself (its text starts
//!   with `[drover]`: a notice, a turn to continue) plays these directives instead of its own
//!   lines (`\n` between two), so a test can script the turn a notice starts.
//! - `SCRIPTED_AGENT_HELPER=1`: at start, before any session, spawns `sleep 1000` as a child
//!   (in its process group, stdio null), as real agents start an engine process or their MCP
//!   servers: a process of the agent's own, not work it left running. `=session`: the helper
//!   is as `spawn-session`'s (a shell in a session of its own running `sleep 1000`), as a
//!   launcher's worker that left its group.
//! - `SCRIPTED_AGENT_LOGIN_MS=N`: `authenticate` with `scripted-login` takes N milliseconds
//!   (a browser round trip).
//! - `SCRIPTED_AGENT_LOGIN_BROWSER=<file>`: `authenticate` with `scripted-login` (and the
//!   terminal sign-in, `--login`) first opens
//!   a "browser", as `xdg-open` does for a sign-in page: through a shell that exits at once,
//!   `sleep 1000` in a session of its own, with the agent's environment; its pid goes into
//!   `<file>`.
//! - `SCRIPTED_AGENT_STALE_CANCEL=1`: a `session/cancel` is also kept, and the session's next
//!   prompt ends at once with an empty `end_turn`, saying and recording nothing (as
//!   claude-agent-acp 0.23 does, upstream #551).
//! - `SCRIPTED_AGENT_AUTH=1`: the agent requires sign-in, as codex-acp does. It advertises
//!   three `authMethods`: `scripted-key` (`type: env_var`, variable `SCRIPTED_KEY`),
//!   `scripted-login` (`agent`, no type) and `scripted-terminal` (`type: terminal`, args
//!   `["--login"]`, only when the client said `clientCapabilities.auth.terminal: true`).
//!   `session/new`, `session/load` and `session/prompt` answer -32000 `Authentication
//!   required` until an `authenticate` succeeded or the state dir holds `signed-in` (what a
//!   login leaves, as codex's `auth.json`). `authenticate {methodId: "scripted-key"}`
//!   succeeds when `SCRIPTED_KEY` is set and equals `SCRIPTED_AGENT_AUTH_KEY` (any non-empty
//!   value when that is unset), else -32000 `invalid key`; `scripted-login` succeeds and
//!   writes `signed-in`; any other id (the terminal method too) is -32602.
//!   `drover-scripted-agent --login` is the terminal method's program: it reads one line
//!   from stdin, writes `signed-in` when the line is not empty and exits 0 (1 otherwise);
//!   with `SCRIPTED_AGENT_HELPER=1` it leaves `sleep 1000` running in its process group.
//!
//! When stdin closes the agent cancels its running prompts, waits for them and exits 0; a
//! prompt in `hang` never ends, so the process then runs until it is killed.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

/// JSON-RPC: the method does not exist.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the params are wrong.
pub const INVALID_PARAMS: i64 = -32602;
/// ACP: authentication required.
pub const AUTH_REQUIRED: i64 = -32000;
/// JSON-RPC: internal error; `fail` uses it.
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP: the resource (here a session) was not found.
pub const RESOURCE_NOT_FOUND: i64 = -32002;

const MODES: [(&str, &str); 2] = [("default", "Default"), ("plan", "Plan")];
const MODELS: [(&str, &str); 2] = [
    ("scripted-small", "Scripted small"),
    ("scripted-large", "Scripted large"),
];
/// The values of the `effort` config option.
const EFFORTS: [&str; 3] = ["low", "medium", "high"];
/// What `garbage` writes to stdout.
pub const GARBAGE_LINE: &str = "this is not JSON {{{ scripted garbage";
/// What `crash` writes to stderr before exiting.
pub const CRASH_MESSAGE: &str = "scripted agent crashing";

/// Settings read once from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub load_session: bool,
    /// `session/resume` and `session/close` (`sessionCapabilities`), unless
    /// `SCRIPTED_AGENT_NO_RESUME=1`.
    pub resume_session: bool,
    /// `session/list` (`sessionCapabilities.list`), unless `SCRIPTED_AGENT_NO_LIST=1`.
    pub list_sessions: bool,
    /// `configOptions` and `session/set_config_option` (`SCRIPTED_AGENT_CONFIG_OPTIONS=1`).
    pub config_options: bool,
    /// Sessions per `session/list` page (`SCRIPTED_AGENT_LIST_PAGE`, default 50).
    pub list_page: usize,
    /// The ACP version `initialize` answers with (`SCRIPTED_AGENT_PROTOCOL_VERSION`, default 1).
    pub protocol_version: u64,
    pub string_ids: bool,
    pub late_updates: bool,
    pub ignore_eof: bool,
    pub ignore_term: bool,
    pub stale_cancel: bool,
    pub read_quotes: bool,
    pub state_dir: PathBuf,
    /// Sign-in required (`SCRIPTED_AGENT_AUTH=1`).
    pub auth: bool,
    /// A helper child from the start (`SCRIPTED_AGENT_HELPER=1`).
    pub helper: bool,
    /// That helper in a session of its own (`SCRIPTED_AGENT_HELPER=session`).
    pub helper_session: bool,
    /// How long `scripted-login` takes (`SCRIPTED_AGENT_LOGIN_MS`).
    pub login_delay: Duration,
    /// Demo mode (`SCRIPTED_AGENT_DEMO=1`, or `drover demo-agent`).
    pub demo: bool,
    /// What a prompt from drover itself (starting with `[drover]`) plays instead of its lines
    /// (`SCRIPTED_AGENT_ON_DROVER`, `\n` between directives).
    pub on_drover: Option<String>,
}

impl Config {
    pub fn from_env() -> Config {
        let flag = |name: &str| {
            std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
        };
        Config {
            load_session: !flag("SCRIPTED_AGENT_NO_LOAD"),
            resume_session: !flag("SCRIPTED_AGENT_NO_RESUME"),
            list_sessions: !flag("SCRIPTED_AGENT_NO_LIST"),
            config_options: flag("SCRIPTED_AGENT_CONFIG_OPTIONS"),
            list_page: std::env::var("SCRIPTED_AGENT_LIST_PAGE")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or(50),
            protocol_version: std::env::var("SCRIPTED_AGENT_PROTOCOL_VERSION")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
            string_ids: flag("SCRIPTED_AGENT_STRING_IDS"),
            late_updates: flag("SCRIPTED_AGENT_LATE_UPDATES"),
            ignore_eof: flag("SCRIPTED_AGENT_IGNORE_EOF"),
            ignore_term: flag("SCRIPTED_AGENT_IGNORE_TERM"),
            stale_cancel: flag("SCRIPTED_AGENT_STALE_CANCEL"),
            read_quotes: flag("SCRIPTED_AGENT_READ_QUOTES"),
            auth: flag("SCRIPTED_AGENT_AUTH"),
            helper: flag("SCRIPTED_AGENT_HELPER"),
            helper_session: std::env::var("SCRIPTED_AGENT_HELPER").is_ok_and(|v| v == "session"),
            login_delay: Duration::from_millis(
                std::env::var("SCRIPTED_AGENT_LOGIN_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            ),
            demo: flag("SCRIPTED_AGENT_DEMO"),
            on_drover: std::env::var("SCRIPTED_AGENT_ON_DROVER").ok(),
            state_dir: std::env::var_os("SCRIPTED_AGENT_STATE_DIR").map_or_else(
                || std::env::temp_dir().join("drover-scripted-agent"),
                PathBuf::from,
            ),
        }
    }
}

/// How a `permission*` directive orders the tool call and the question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionOrder {
    /// `tool_call`, then ask (claude).
    AnnounceFirst,
    /// Ask, then `tool_call` once allowed (codex).
    AskFirst,
    /// Ask, then only `tool_call_update`s (gemini).
    AskOnly,
}

/// One line of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    Say(String),
    Stream {
        count: u64,
        delay: Duration,
    },
    /// `stream` with the send time in each chunk.
    StreamStamped {
        count: u64,
        delay: Duration,
    },
    Think(String),
    Tool(String),
    Permission {
        title: String,
        order: PermissionOrder,
    },
    Sleep(Duration),
    Hang,
    Crash(i32),
    Garbage,
    Plan(Vec<String>),
    Usage,
    Unknown,
    Fail(String),
    /// `limit <agent> <seconds> [noreset]`.
    Limit {
        agent: String,
        seconds: u64,
        reset: bool,
    },
    Stop(String),
    Env(String),
    Cwd,
    SessionCwd,
    McpServers,
    /// Calls a tool of the session's MCP server.
    Mcp {
        tool: String,
        arguments: String,
    },
    SpawnChild,
    /// A child in a process group of its own.
    SpawnTool,
    /// A child in a session of its own, with a child of its own.
    SpawnSession,
    /// A process neither marked nor descended from the agent.
    SpawnEscapee,
    Stderr(String),
    EchoPrompt,
    /// Says what the session knows of its earlier prompts.
    Recall,
    /// Runs a command in an ACP client terminal (`terminal/create`), then as `how` says.
    Terminal {
        how: TerminalUse,
        /// `outputByteLimit`.
        limit: Option<u64>,
        program: String,
        args: Vec<String>,
    },
    /// `terminal/output` of a terminal by id.
    TerminalOutput(String),
    /// Creates a subagent with this first prompt.
    Subagent(String),
    /// A Task tool call of claude's, left running.
    OwnTask(String),
    OwnTaskDone,
    /// An ACP child session, left running.
    OwnSubagent(String),
    OwnSubagentDone,
    /// Starts a background job with this shell command.
    Job(String),
    Tour,
    Help,
    /// Any other line: says `ok: <line>`.
    Other(String),
}

impl Directive {
    /// Whether the demo plays it (the directives docs/demo.md lists).
    fn is_demos(&self) -> bool {
        matches!(
            self,
            Directive::Tour
                | Directive::Help
                | Directive::Say(_)
                | Directive::Think(_)
                | Directive::Plan(_)
                | Directive::Tool(_)
                | Directive::Permission {
                    order: PermissionOrder::AnnounceFirst,
                    ..
                }
                | Directive::Subagent(_)
                | Directive::Job(_)
                | Directive::Stream { .. }
                | Directive::Sleep(_)
                | Directive::Recall
                | Directive::Usage
                | Directive::Fail(_)
                | Directive::Stop(_)
                | Directive::Mcp { .. }
                | Directive::Other(_)
        )
    }

    /// Parses one trimmed, non-empty line; a line that fits no directive is `Other`.
    pub fn parse(line: &str) -> Directive {
        let (word, rest) = match line.split_once(char::is_whitespace) {
            Some((word, rest)) => (word, rest.trim()),
            None => (line, ""),
        };
        let bare = if rest.is_empty() {
            Directive::bare(word)
        } else {
            None
        };
        bare.or_else(|| Directive::with_text(word, rest))
            .or_else(|| Directive::with_numbers(word, rest))
            .unwrap_or_else(|| Directive::Other(line.to_string()))
    }

    /// A directive that takes no argument, by its word.
    fn bare(word: &str) -> Option<Directive> {
        Some(match word {
            "hang" => Directive::Hang,
            "crash" => Directive::Crash(3),
            "garbage" => Directive::Garbage,
            "usage" => Directive::Usage,
            "unknown" => Directive::Unknown,
            "cwd" => Directive::Cwd,
            "session-cwd" => Directive::SessionCwd,
            "mcp-servers" => Directive::McpServers,
            "spawn-child" => Directive::SpawnChild,
            "spawn-tool" => Directive::SpawnTool,
            "spawn-session" => Directive::SpawnSession,
            "spawn-escapee" => Directive::SpawnEscapee,
            "echo-prompt" => Directive::EchoPrompt,
            "recall" => Directive::Recall,
            "own-task-done" => Directive::OwnTaskDone,
            "own-subagent-done" => Directive::OwnSubagentDone,
            "tour" => Directive::Tour,
            "help" => Directive::Help,
            _ => return None,
        })
    }

    /// A directive whose argument is text (some may be empty, some not), by its word.
    fn with_text(word: &str, rest: &str) -> Option<Directive> {
        let text = rest.to_string();
        Some(match word {
            "say" => Directive::Say(text),
            "think" => Directive::Think(text),
            "tool" => Directive::Tool(text),
            "fail" => Directive::Fail(text),
            "stderr" => Directive::Stderr(text),
            "permission" | "permission-first" | "permission-only" => Directive::Permission {
                title: text,
                order: match word {
                    "permission" => PermissionOrder::AnnounceFirst,
                    "permission-first" => PermissionOrder::AskFirst,
                    _ => PermissionOrder::AskOnly,
                },
            },
            "plan" => Directive::Plan(
                rest.split(';')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            ),
            _ if rest.is_empty() => return None,
            "stop" => Directive::Stop(text),
            "env" => Directive::Env(text),
            "subagent" => Directive::Subagent(rest.replace("\\n", "\n")),
            "own-task" => Directive::OwnTask(text),
            "own-subagent" => Directive::OwnSubagent(text),
            "job" => Directive::Job(text),
            "terminal-output" if !rest.contains(char::is_whitespace) => {
                Directive::TerminalOutput(text)
            }
            "mcp" => {
                let (tool, arguments) =
                    rest.split_once(char::is_whitespace).unwrap_or((rest, "{}"));
                Directive::Mcp {
                    tool: tool.to_string(),
                    arguments: arguments.trim().to_string(),
                }
            }
            _ => return None,
        })
    }

    /// A directive whose arguments start with numbers or words it checks (`stream`, `sleep`,
    /// `crash <code>`, `limit`, the `terminal` family), by its word; `None` when they do not
    /// fit.
    fn with_numbers(word: &str, rest: &str) -> Option<Directive> {
        let ms = |s: &str| s.parse::<u64>().ok().map(Duration::from_millis);
        match word {
            "stream" | "stream-stamped" => {
                let mut args = rest.split_whitespace();
                let count = args.next()?.parse().ok()?;
                let delay = args.next().map_or(Some(Duration::ZERO), ms)?;
                if args.next().is_some() {
                    return None;
                }
                Some(if word == "stream" {
                    Directive::Stream { count, delay }
                } else {
                    Directive::StreamStamped { count, delay }
                })
            }
            "sleep" => ms(rest).map(Directive::Sleep),
            "crash" => rest.parse().ok().map(Directive::Crash),
            "limit" => match rest.split_whitespace().collect::<Vec<_>>().as_slice() {
                [agent @ ("codex" | "claude" | "gemini"), seconds, more @ ..]
                    if more.is_empty() || more == ["noreset"] =>
                {
                    Some(Directive::Limit {
                        agent: (*agent).to_string(),
                        seconds: seconds.parse().ok()?,
                        reset: more.is_empty(),
                    })
                }
                _ => None,
            },
            "terminal" | "terminal-kill" | "terminal-release" | "terminal-limit"
            | "terminal-start" => {
                let mut words = rest.split_whitespace().map(str::to_string);
                let limit = if word == "terminal-limit" {
                    Some(words.next()?.parse().ok()?)
                } else {
                    None
                };
                Some(Directive::Terminal {
                    how: match word {
                        "terminal-kill" => TerminalUse::Kill,
                        "terminal-release" => TerminalUse::Release,
                        "terminal-start" => TerminalUse::Start,
                        _ => TerminalUse::Wait,
                    },
                    limit,
                    program: words.next()?,
                    args: words.collect(),
                })
            }
            _ => None,
        }
    }

    /// The directives of a prompt's text, in order; with `read_quotes`, a line quoted with
    /// `> ` is the directive it quotes.
    pub fn parse_all(text: &str, read_quotes: bool) -> Vec<Directive> {
        text.lines()
            .map(str::trim)
            .map(|l| {
                if read_quotes {
                    l.strip_prefix("> ").unwrap_or(l)
                } else {
                    l
                }
            })
            .filter(|l| !l.is_empty())
            .map(Directive::parse)
            .collect()
    }
}

/// What a terminal directive does with the terminal it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalUse {
    /// `terminal/wait_for_exit`, `terminal/output`, `terminal/release`.
    Wait,
    /// `terminal/kill` at once, then as `Wait`.
    Kill,
    /// `terminal/release` at once (which kills it), then `terminal/output` (an error).
    Release,
    /// Nothing more: the terminal keeps running after the directive.
    Start,
}

/// A `config.toml` with the scripted agent at `agent_bin` as provider `scripted`, keeping its
/// sessions under `state_dir`.
pub fn provider_config(agent_bin: &Path, state_dir: &Path) -> String {
    format!(
        "[providers.scripted]\nlabel = \"Scripted\"\ncommand = [{bin:?}]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?} }}\n",
        bin = agent_bin.display().to_string(),
        state = state_dir.display().to_string(),
    )
}

fn write_signed_in(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, "signed in\n")
}

/// `--login`: the terminal sign-in: one line from stdin, not empty, signs in. With
/// `SCRIPTED_AGENT_HELPER=1` it leaves `sleep 1000` running in its process group (a login
/// that does not end the server it started for the browser's answer); with
/// `SCRIPTED_AGENT_LOGIN_BROWSER` it opens the "browser" first.
fn terminal_login() -> ExitCode {
    let config = Config::from_env();
    if config.helper && !config.helper_session {
        let _ = std::process::Command::new("sleep")
            .arg("1000")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    if let Some(pid_file) = std::env::var_os("SCRIPTED_AGENT_LOGIN_BROWSER") {
        open_browser(Path::new(&pid_file));
    }
    eprintln!("scripted agent: type anything to sign in");
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
        eprintln!("scripted agent: nothing typed; not signed in");
        return ExitCode::FAILURE;
    }
    match write_signed_in(&config.state_dir.join("signed-in")) {
        Ok(()) => {
            println!("signed in");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scripted agent: cannot write the sign-in marker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the agent on this process's stdin/stdout until stdin closes; the binary's `main`
/// (with `--login`, the terminal sign-in instead).
pub fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--login") {
        return terminal_login();
    }
    main_with(Config::from_env())
}

/// Runs the agent in demo mode (`drover demo-agent`).
pub fn demo_main() -> ExitCode {
    main_with(Config {
        demo: true,
        ..Config::from_env()
    })
}

fn main_with(config: Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("scripted agent: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(config));
    // Output is flushed by now; do not wait for anything else the runtime still holds.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Reads stdin until EOF, then ends the way the module doc describes.
pub async fn run(config: Config) -> ExitCode {
    // Bounded so that a client that stops reading stdout eventually stalls the agent, as a pipe
    // would; 1024 lines is far more than any directive writes at once.
    let (tx, rx) = mpsc::channel(1024);
    // Plain threads for stdio: the workspace's tokio has no `io-std`, and blocking reads and
    // writes are what stdio is anyway.
    std::thread::spawn(move || write_lines(rx));
    // Small: the reader should not run far ahead of the agent.
    let (lines_tx, mut lines) = mpsc::channel(16);
    std::thread::spawn(move || read_lines(&lines_tx));
    let ignore_eof = config.ignore_eof;
    if config.ignore_term {
        ignore_sigterm();
    }
    if config.helper {
        // Dropping the handle leaves it running; it ends with the agent's process group.
        if let Err(e) = std::process::Command::new("sleep")
            .arg("1000")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            log(format!("cannot start the helper: {e}"));
        }
    }
    if config.helper_session {
        log(spawn_session());
    }
    let agent = Arc::new(Agent::new(config, Output { tx }));
    let mut prompts = JoinSet::new();
    while let Some(line) = lines.recv().await {
        match String::from_utf8(line) {
            Ok(line) => agent.handle_line(&line, &mut prompts).await,
            Err(e) => log(format!("ignoring a line that is not UTF-8: {e}")),
        }
        while prompts.try_join_next().is_some() {}
    }
    if ignore_eof {
        log("stdin closed; staying alive (SCRIPTED_AGENT_IGNORE_EOF)");
        std::future::pending::<()>().await;
    }
    agent.cancel_all();
    // A prompt in `hang` never ends: then neither does this wait, like an agent that keeps
    // running after its client left.
    while prompts.join_next().await.is_some() {}
    agent.out.flush().await;
    ExitCode::SUCCESS
}

#[expect(unsafe_code)]
fn ignore_sigterm() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}

fn log(message: impl std::fmt::Display) {
    eprintln!("scripted agent: {message}");
}

enum Out {
    Line(String),
    /// Answered once every line sent before it is written.
    Flush(oneshot::Sender<()>),
}

/// Sends stdin's lines, raw, until EOF.
fn read_lines(tx: &mpsc::Sender<Vec<u8>>) {
    use std::io::BufRead as _;
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut line = Vec::new();
        match stdin.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if tx.blocking_send(line).is_err() {
                    return;
                }
            }
            Err(e) => {
                log(format!("reading stdin failed: {e}"));
                return;
            }
        }
    }
}

/// The only writer of stdout; each line is flushed on its own.
fn write_lines(mut rx: mpsc::Receiver<Out>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let mut broken = false;
    while let Some(out) = rx.blocking_recv() {
        match out {
            Out::Line(mut line) if !broken => {
                line.push('\n');
                let written = stdout
                    .write_all(line.as_bytes())
                    .and_then(|()| stdout.flush());
                if let Err(e) = written {
                    // Keep draining so that no sender blocks on a reader that is gone.
                    log(format!(
                        "writing stdout failed, dropping output from now on: {e}"
                    ));
                    broken = true;
                }
            }
            Out::Line(_) => {}
            Out::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Output {
    tx: mpsc::Sender<Out>,
}

impl Output {
    async fn line(&self, line: String) {
        let _ = self.tx.send(Out::Line(line)).await;
    }

    async fn send(&self, message: Value) {
        self.line(message.to_string()).await;
    }

    async fn reply(&self, id: Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}))
            .await;
    }

    async fn error(&self, id: Value, code: i64, message: impl Into<String>) {
        let message: String = message.into();
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
            .await;
    }

    async fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    async fn update(&self, session_id: &str, update: Value) {
        self.notify(
            "session/update",
            json!({"sessionId": session_id, "update": update}),
        )
        .await;
    }

    /// Waits (at most two seconds) until every line sent so far is written.
    async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.tx.send(Out::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), flushed).await;
        }
    }
}

#[derive(Debug)]
struct Session {
    cwd: String,
    mcp_servers: Value,
    mode: String,
    model: String,
    /// The `effort` config option's value.
    effort: String,
    /// Bumped by `session/cancel`; a prompt is cancelled once it differs from its start value.
    cancel: watch::Sender<u64>,
    /// A `session/cancel` kept for the next prompt (`SCRIPTED_AGENT_STALE_CANCEL`).
    stale_cancel: bool,
    used_tokens: u64,
    /// The prompts this process knows the session had, oldest first: those `session/load`
    /// replayed and those it ran.
    prompts: Vec<String>,
}

impl Session {
    fn new(cwd: String, mcp_servers: Value) -> Session {
        Session {
            cwd,
            mcp_servers,
            mode: MODES[0].0.to_string(),
            model: MODELS[0].0.to_string(),
            effort: EFFORTS[1].to_string(),
            cancel: watch::Sender::new(0),
            stale_cancel: false,
            used_tokens: 0,
            prompts: Vec::new(),
        }
    }

    fn modes_and_models(&self) -> Value {
        json!({
            "modes": {
                "currentModeId": self.mode,
                "availableModes": MODES.iter()
                    .map(|(id, name)| json!({"id": id, "name": name}))
                    .collect::<Vec<_>>(),
            },
            "models": {
                "currentModelId": self.model,
                "availableModels": MODELS.iter()
                    .map(|(id, name)| json!({"modelId": id, "name": name}))
                    .collect::<Vec<_>>(),
            },
        })
    }

    /// The session's `configOptions`.
    fn config_options(&self) -> Value {
        let select =
            |id: &str, name: &str, category: &str, current: &str, values: Vec<(&str, &str)>| {
                json!({
                    "id": id, "name": name, "category": category, "type": "select",
                    "currentValue": current,
                    "options": values.iter()
                        .map(|(value, name)| json!({"value": value, "name": name}))
                        .collect::<Vec<_>>(),
                })
            };
        json!([
            select("session-mode", "Mode", "mode", &self.mode, MODES.to_vec()),
            select("llm", "Model", "model", &self.model, MODELS.to_vec()),
            select(
                "effort",
                "Reasoning effort",
                "thought_level",
                &self.effort,
                EFFORTS.iter().map(|e| (*e, *e)).collect()
            ),
        ])
    }
}

/// What `session/set_mode`, `session/set_model` and `session/set_config_option` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Mode,
    Model,
    Effort,
}

impl Choice {
    /// How the history names it.
    fn kind(self) -> &'static str {
        match self {
            Choice::Mode => "mode",
            Choice::Model => "model",
            Choice::Effort => "effort",
        }
    }

    fn offers(self, value: &str) -> bool {
        match self {
            Choice::Mode => MODES.iter().any(|(id, _)| *id == value),
            Choice::Model => MODELS.iter().any(|(id, _)| *id == value),
            Choice::Effort => EFFORTS.contains(&value),
        }
    }

    fn of(self, session: &mut Session) -> &mut String {
        match self {
            Choice::Mode => &mut session.mode,
            Choice::Model => &mut session.model,
            Choice::Effort => &mut session.effort,
        }
    }
}

type Answer = Result<Value, Value>;

#[derive(Debug)]
struct Agent {
    config: Config,
    out: Output,
    sessions: Mutex<HashMap<String, Session>>,
    /// Our requests to the client awaiting an answer, by the id's JSON text.
    pending: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    next_request: AtomicU64,
    next_session: AtomicU64,
    next_tool: AtomicU64,
    /// The client said `clientCapabilities.terminal: true` in `initialize`.
    client_terminals: AtomicBool,
    /// The client said `clientCapabilities.auth.terminal: true` in `initialize`.
    client_auth_terminal: AtomicBool,
    /// The client said `clientCapabilities.subagents` in `initialize`.
    client_subagents: AtomicBool,
    /// The last `own-task` tool call and `own-subagent` child session.
    own_task: Mutex<Option<String>>,
    own_child: Mutex<Option<String>>,
    /// `authenticate` succeeded on this connection.
    signed_in: AtomicBool,
}

/// One running prompt.
#[derive(Debug)]
struct Turn {
    session_id: String,
    text: String,
    cancel: watch::Receiver<u64>,
    start: u64,
    /// The session's prompts before this one (what `recall` says).
    earlier: Vec<String>,
}

impl Turn {
    fn cancelled(&self) -> bool {
        *self.cancel.borrow() != self.start
    }

    async fn until_cancelled(&mut self) {
        let start = self.start;
        if self.cancel.wait_for(|v| *v != start).await.is_err() {
            // Sessions are never dropped, so this cannot happen; never cancel if it does.
            std::future::pending::<()>().await;
        }
    }

    /// Waits `delay`; false when the turn was cancelled first.
    async fn waited(&mut self, delay: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.until_cancelled() => false,
        }
    }

    /// `recall`: what the session's earlier prompts were (their first lines).
    fn recall(&self) -> String {
        let firsts: Vec<&str> = self
            .earlier
            .iter()
            .map(|p| p.lines().next().unwrap_or_default())
            .collect();
        format!("recall: {} earlier: {}", firsts.len(), firsts.join(" / "))
    }
}

/// How a directive leaves the turn.
enum Flow {
    Continue,
    End(String),
    Fail(String),
    /// A JSON-RPC error as a real agent fails a prompt: code, message, data.
    FailWith(i64, String, Option<String>),
    Hang,
}

fn cancelled() -> Flow {
    Flow::End("cancelled".to_string())
}

fn text_content(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The prompt's text as the directives read it.
fn prompt_text(prompt: &Value) -> String {
    let blocks = prompt.as_array().map(Vec::as_slice).unwrap_or_default();
    blocks
        .iter()
        .filter_map(|block| match block["type"].as_str() {
            Some("text") => block["text"].as_str(),
            Some("resource") => block["resource"]["text"].as_str(),
            Some("resource_link") => block["uri"].as_str(),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Agent {
    fn new(config: Config, out: Output) -> Agent {
        Agent {
            config,
            out,
            sessions: Mutex::default(),
            pending: Mutex::default(),
            next_request: AtomicU64::new(0),
            next_session: AtomicU64::new(0),
            next_tool: AtomicU64::new(0),
            client_terminals: AtomicBool::new(false),
            client_auth_terminal: AtomicBool::new(false),
            client_subagents: AtomicBool::new(false),
            own_task: Mutex::new(None),
            own_child: Mutex::new(None),
            signed_in: AtomicBool::new(false),
        }
    }

    async fn handle_line(self: &Arc<Self>, line: &str, prompts: &mut JoinSet<()>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let message: Value = match serde_json::from_str(line) {
            Ok(message) => message,
            Err(e) => return log(format!("ignoring a line that is not JSON ({e}): {line}")),
        };
        let Some(object) = message.as_object() else {
            return log(format!("ignoring a message that is not an object: {line}"));
        };
        let params = object.get("params").cloned().unwrap_or(Value::Null);
        match (
            object.get("method").and_then(Value::as_str),
            object.get("id"),
        ) {
            (Some(method), Some(id)) => self.request(id.clone(), method, params, prompts).await,
            (Some(method), None) => self.notification(method, &params),
            (None, Some(id)) => self.answer(id, object),
            (None, None) => log(format!("ignoring a message without method or id: {line}")),
        }
    }

    async fn request(
        self: &Arc<Self>,
        id: Value,
        method: &str,
        params: Value,
        prompts: &mut JoinSet<()>,
    ) {
        let result = match method {
            "initialize" => {
                let terminals = params["clientCapabilities"]["terminal"] == true;
                let subagents = params["clientCapabilities"]["subagents"].is_object();
                self.client_subagents.store(subagents, Ordering::Relaxed);
                self.client_terminals.store(terminals, Ordering::Relaxed);
                let auth_terminal = params["clientCapabilities"]["auth"]["terminal"] == true;
                self.client_auth_terminal
                    .store(auth_terminal, Ordering::Relaxed);
                Ok(self.initialize())
            }
            "authenticate" => self.authenticate(&params),
            "session/new" | "session/load" | "session/prompt" if !self.is_signed_in() => {
                Err((AUTH_REQUIRED, "Authentication required".to_string()))
            }
            "session/new" => self.new_session(&params),
            "session/load" if self.config.load_session => self.load_session(&params, true).await,
            "session/resume" if self.config.resume_session => {
                self.load_session(&params, false).await
            }
            "session/close" if self.config.resume_session => self.close_session(&params),
            "session/list" if self.config.list_sessions => self.list_sessions(&params),
            "session/set_mode" => self.set_mode(&params).await,
            "session/set_model" => self.set_model(&params).await,
            "session/set_config_option" if self.config.config_options => {
                self.set_config_option(&params).await
            }
            "session/prompt" => match self.start_turn(&params) {
                Ok(turn) => {
                    let agent = Arc::clone(self);
                    prompts.spawn(async move { agent.prompt(id, turn).await });
                    return;
                }
                Err(e) => Err(e),
            },
            _ => Err((METHOD_NOT_FOUND, format!("method not found: {method}"))),
        };
        match result {
            Ok(result) => self.out.reply(id, result).await,
            Err((code, message)) => self.out.error(id, code, message).await,
        }
    }

    fn notification(&self, method: &str, params: &Value) {
        match method {
            "session/cancel" => {
                let session_id = params["sessionId"].as_str().unwrap_or_default();
                match lock(&self.sessions).get_mut(session_id) {
                    Some(session) => {
                        session.cancel.send_modify(|v| *v += 1);
                        session.stale_cancel = self.config.stale_cancel;
                    }
                    None => log(format!("session/cancel for unknown session `{session_id}`")),
                }
            }
            _ => log(format!("ignoring notification `{method}`")),
        }
    }

    /// A response from the client to one of our requests.
    fn answer(&self, id: &Value, object: &serde_json::Map<String, Value>) {
        let Some(waiter) = lock(&self.pending).remove(&id.to_string()) else {
            return log(format!("ignoring a response to unknown request {id}"));
        };
        let answer = match object.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(object.get("result").cloned().unwrap_or(Value::Null)),
        };
        let _ = waiter.send(answer);
    }

    fn cancel_all(&self) {
        for session in lock(&self.sessions).values() {
            session.cancel.send_modify(|v| *v += 1);
        }
    }

    fn initialize(&self) -> Value {
        let mut session_capabilities = serde_json::Map::new();
        if self.config.resume_session {
            session_capabilities.insert("resume".to_string(), json!({}));
            session_capabilities.insert("close".to_string(), json!({}));
        }
        if self.config.list_sessions {
            session_capabilities.insert("list".to_string(), json!({}));
        }
        json!({
            "protocolVersion": self.config.protocol_version,
            "agentCapabilities": {
                "loadSession": self.config.load_session,
                "sessionCapabilities": session_capabilities,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                "mcpCapabilities": {"http": true, "sse": false},
            },
            "authMethods": self.auth_methods(),
            "agentInfo": {"name": "drover-scripted-agent", "version": env!("CARGO_PKG_VERSION")},
        })
    }

    fn auth_methods(&self) -> Value {
        if !self.config.auth {
            return json!([]);
        }
        let mut methods = vec![
            json!({"id": "scripted-key", "type": "env_var", "name": "Scripted key",
                   "description": "Set SCRIPTED_KEY to the key.",
                   "vars": [{"name": "SCRIPTED_KEY", "label": "Scripted key"}]}),
            json!({"id": "scripted-login", "name": "Scripted login",
                   "description": "The agent signs in by itself."}),
        ];
        if self.client_auth_terminal.load(Ordering::Relaxed) {
            methods.push(json!({"id": "scripted-terminal", "type": "terminal",
                   "name": "Scripted terminal login",
                   "description": "Type anything at the prompt.",
                   "args": ["--login"], "env": {"SCRIPTED_LOGIN_VIA": "terminal"}}));
        }
        Value::Array(methods)
    }

    fn signed_in_marker(&self) -> PathBuf {
        self.config.state_dir.join("signed-in")
    }

    fn is_signed_in(&self) -> bool {
        !self.config.auth
            || self.signed_in.load(Ordering::Relaxed)
            || self.signed_in_marker().exists()
    }

    fn authenticate(&self, params: &Value) -> Result<Value, (i64, String)> {
        match params["methodId"].as_str() {
            Some("scripted-key") => {
                let key = std::env::var("SCRIPTED_KEY").unwrap_or_default();
                let good = match std::env::var("SCRIPTED_AGENT_AUTH_KEY") {
                    Ok(expected) => key == expected,
                    Err(_) => !key.is_empty(),
                };
                if !good {
                    return Err((AUTH_REQUIRED, "invalid key".to_string()));
                }
                self.signed_in.store(true, Ordering::Relaxed);
                Ok(json!({}))
            }
            Some("scripted-login") => {
                if let Some(pid_file) = std::env::var_os("SCRIPTED_AGENT_LOGIN_BROWSER") {
                    open_browser(Path::new(&pid_file));
                }
                std::thread::sleep(self.config.login_delay);
                if let Err(e) = write_signed_in(&self.signed_in_marker()) {
                    log(format!("cannot write the sign-in marker: {e}"));
                }
                self.signed_in.store(true, Ordering::Relaxed);
                Ok(json!({}))
            }
            other => Err((
                INVALID_PARAMS,
                format!("unknown or non-callable auth method {other:?}"),
            )),
        }
    }

    fn history_path(&self, session_id: &str) -> PathBuf {
        self.config.state_dir.join(format!("{session_id}.jsonl"))
    }

    /// Appends one history entry; a failure is logged, not fatal.
    fn record(&self, session_id: &str, entry: &Value) {
        let path = self.history_path(session_id);
        if let Err(e) = append_line(&path, &entry.to_string()) {
            log(format!("cannot record history in {}: {e}", path.display()));
        }
    }

    fn new_session(&self, params: &Value) -> Result<Value, (i64, String)> {
        let cwd = session_cwd(params)?;
        let mcp_servers = params.get("mcpServers").cloned().unwrap_or(json!([]));
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        let session_id = format!("scripted-{}-{n}-{nanos}", std::process::id());
        let path = self.history_path(&session_id);
        std::fs::create_dir_all(&self.config.state_dir)
            .and_then(|()| append_line(&path, &json!({"type": "session", "cwd": cwd}).to_string()))
            .map_err(|e| {
                (
                    INTERNAL_ERROR,
                    format!("cannot create {}: {e}", path.display()),
                )
            })?;
        let session = Session::new(cwd, mcp_servers);
        let mut result = session.modes_and_models();
        if self.config.config_options {
            result["configOptions"] = session.config_options();
        }
        result["sessionId"] = json!(session_id);
        lock(&self.sessions).insert(session_id, session);
        Ok(result)
    }

    /// `session/load` (`replay`: the history is sent as updates first) or `session/resume`.
    async fn load_session(&self, params: &Value, replay: bool) -> Result<Value, (i64, String)> {
        let session_id = params["sessionId"].as_str().unwrap_or_default();
        let cwd = session_cwd(params)?;
        let not_found = || {
            (
                RESOURCE_NOT_FOUND,
                format!("session `{session_id}` not found"),
            )
        };
        if !valid_session_id(session_id) {
            return Err(not_found());
        }
        let path = self.history_path(session_id);
        let history = match std::fs::read_to_string(&path) {
            Ok(history) => history,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
            Err(e) => {
                return Err((
                    INTERNAL_ERROR,
                    format!("cannot read {}: {e}", path.display()),
                ));
            }
        };
        let mut session = Session::new(cwd, params.get("mcpServers").cloned().unwrap_or(json!([])));
        for line in history.lines() {
            // A torn last line (the agent was killed mid-write) is skipped.
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let text = entry["text"].as_str().unwrap_or_default();
            let kind = match entry["type"].as_str() {
                Some("user") => {
                    session.prompts.push(text.to_string());
                    "user_message_chunk"
                }
                Some("agent") => "agent_message_chunk",
                Some("thought") => "agent_thought_chunk",
                Some("mode") => {
                    session.mode = text.to_string();
                    continue;
                }
                Some("model") => {
                    session.model = text.to_string();
                    continue;
                }
                _ => continue,
            };
            if !replay {
                continue;
            }
            self.out
                .update(
                    session_id,
                    json!({"sessionUpdate": kind, "content": text_content(text)}),
                )
                .await;
        }
        let mut result = session.modes_and_models();
        if self.config.config_options {
            result["configOptions"] = session.config_options();
        }
        let mut sessions = lock(&self.sessions);
        match sessions.get_mut(session_id) {
            // Loaded again in this process: keep the cancel channel its prompts watch.
            Some(existing) => {
                existing.cwd = session.cwd;
                existing.mcp_servers = session.mcp_servers;
                existing.mode = session.mode;
                existing.model = session.model;
                existing.prompts = session.prompts;
            }
            None => {
                sessions.insert(session_id.to_string(), session);
            }
        }
        Ok(result)
    }

    /// `session/list`: the sessions whose history is in the state dir, newest first.
    fn list_sessions(&self, params: &Value) -> Result<Value, (i64, String)> {
        let only = match params.get("cwd") {
            None | Some(Value::Null) => None,
            Some(_) => Some(session_cwd(params)?),
        };
        let offset = match params.get("cursor").and_then(Value::as_str) {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| (INVALID_PARAMS, format!("unknown cursor `{cursor}`")))?,
        };
        let entries = match std::fs::read_dir(&self.config.state_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(json!({"sessions": []}));
            }
            Err(e) => {
                return Err((
                    INTERNAL_ERROR,
                    format!("cannot read {}: {e}", self.config.state_dir.display()),
                ));
            }
        };
        let mut sessions = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(session_id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".jsonl"))
                .filter(|id| valid_session_id(id))
            else {
                continue;
            };
            let Ok(history) = std::fs::read_to_string(&path) else {
                continue;
            };
            let entries: Vec<Value> = history
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let Some(cwd) = entries
                .iter()
                .find(|e| e["type"] == "session")
                .and_then(|e| e["cwd"].as_str())
            else {
                continue;
            };
            if only.as_deref().is_some_and(|only| only != cwd) {
                continue;
            }
            let title = entries
                .iter()
                .find(|e| e["type"] == "user")
                .and_then(|e| e["text"].as_str())
                .and_then(|t| t.lines().next())
                .map(str::to_string);
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(UNIX_EPOCH);
            sessions.push((modified, session_id.to_string(), cwd.to_string(), title));
        }
        sessions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let total = sessions.len();
        let page: Vec<Value> = sessions
            .into_iter()
            .skip(offset)
            .take(self.config.list_page)
            .map(|(modified, id, cwd, title)| {
                let updated = jiff::Timestamp::try_from(modified)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                json!({"sessionId": id, "cwd": cwd, "title": title, "updatedAt": updated})
            })
            .collect();
        let mut result = json!({"sessions": page});
        if offset + self.config.list_page < total {
            result["nextCursor"] = json!((offset + self.config.list_page).to_string());
        }
        Ok(result)
    }

    /// `session/close`: the session is forgotten by this process, and its history says so (a
    /// `{"type": "closed"}` line, which tests read).
    fn close_session(&self, params: &Value) -> Result<Value, (i64, String)> {
        let session_id = params["sessionId"].as_str().unwrap_or_default();
        if lock(&self.sessions).remove(session_id).is_none() {
            return Err((
                RESOURCE_NOT_FOUND,
                format!("session `{session_id}` not found"),
            ));
        }
        self.record(session_id, &json!({"type": "closed"}));
        Ok(json!({}))
    }

    async fn set_mode(&self, params: &Value) -> Result<Value, (i64, String)> {
        let value = params["modeId"].as_str().unwrap_or_default();
        self.choose(params, Choice::Mode, value, "session/set_mode")
            .await?;
        Ok(json!({}))
    }

    async fn set_model(&self, params: &Value) -> Result<Value, (i64, String)> {
        let value = params["modelId"].as_str().unwrap_or_default();
        self.choose(params, Choice::Model, value, "session/set_model")
            .await?;
        Ok(json!({}))
    }

    /// `session/set_config_option`: one of the session's `configOptions`; answers them all.
    async fn set_config_option(&self, params: &Value) -> Result<Value, (i64, String)> {
        let id = params["configId"].as_str().unwrap_or_default();
        let value = params["value"].as_str().unwrap_or_default();
        let choice = match id {
            "session-mode" => Choice::Mode,
            "llm" => Choice::Model,
            "effort" => Choice::Effort,
            _ => return Err((INVALID_PARAMS, format!("unknown config option `{id}`"))),
        };
        if !choice.offers(value) {
            return Err((INVALID_PARAMS, format!("`{id}` has no value `{value}`")));
        }
        self.choose(params, choice, value, "session/set_config_option")
            .await?;
        let session_id = params["sessionId"].as_str().unwrap_or_default();
        let options = self.with_session(session_id, |s| s.config_options())?;
        Ok(json!({"configOptions": options}))
    }

    /// Sets the session's mode, model or effort to `value` (one it offers) as the method
    /// `via` asked: kept in the session and in its history; a mode is also told to the
    /// client (`current_mode_update`).
    async fn choose(
        &self,
        params: &Value,
        choice: Choice,
        value: &str,
        via: &str,
    ) -> Result<(), (i64, String)> {
        if !choice.offers(value) {
            return Err((
                INVALID_PARAMS,
                format!("unknown {} `{value}`", choice.kind()),
            ));
        }
        let session_id = params["sessionId"].as_str().unwrap_or_default();
        self.with_session(session_id, |s| *choice.of(s) = value.to_string())?;
        let kind = choice.kind();
        self.record(
            session_id,
            &json!({"type": kind, "text": value, "via": via}),
        );
        if choice == Choice::Mode {
            self.out
                .update(
                    session_id,
                    json!({"sessionUpdate": "current_mode_update", "currentModeId": value}),
                )
                .await;
        }
        Ok(())
    }

    fn with_session<T>(
        &self,
        session_id: &str,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, (i64, String)> {
        match lock(&self.sessions).get_mut(session_id) {
            Some(session) => Ok(f(session)),
            None => Err((
                RESOURCE_NOT_FOUND,
                format!("session `{session_id}` not found"),
            )),
        }
    }

    /// Registers a prompt before its task starts, so that a cancel read next applies to it.
    fn start_turn(&self, params: &Value) -> Result<Turn, (i64, String)> {
        let session_id = params["sessionId"].as_str().unwrap_or_default();
        let text = prompt_text(&params["prompt"]);
        let (cancel, earlier) = self.with_session(session_id, |s| {
            let earlier = s.prompts.clone();
            s.prompts.push(text.clone());
            (s.cancel.subscribe(), earlier)
        })?;
        let start = *cancel.borrow();
        Ok(Turn {
            session_id: session_id.to_string(),
            text,
            cancel,
            start,
            earlier,
        })
    }

    async fn prompt(self: Arc<Self>, id: Value, mut turn: Turn) {
        let stale = self
            .with_session(&turn.session_id, |s| std::mem::take(&mut s.stale_cancel))
            .unwrap_or(false);
        if stale {
            return self.out.reply(id, json!({"stopReason": "end_turn"})).await;
        }
        self.record(
            &turn.session_id,
            &json!({"type": "user", "text": turn.text}),
        );
        let mut directives = if self.config.demo {
            demo_directives(&turn.text)
        } else {
            Directive::parse_all(&turn.text, self.config.read_quotes)
        };
        if let Some(script) = &self.config.on_drover
            && turn.text.starts_with("[drover]")
        {
            directives = Directive::parse_all(&script.replace("\\n", "\n"), false);
        }
        if directives.is_empty() {
            directives.push(Directive::Say("ok".to_string()));
        }
        let mut stop_reason = "end_turn".to_string();
        for directive in directives {
            // `hang` ignores cancel, also one that came just before it: a test that saw the
            // output before `hang` knows the prompt hangs.
            if directive != Directive::Hang && turn.cancelled() {
                stop_reason = "cancelled".to_string();
                break;
            }
            match self.play(&mut turn, directive).await {
                Flow::Continue => {}
                Flow::End(reason) => {
                    stop_reason = reason;
                    break;
                }
                Flow::Fail(message) => {
                    return self.out.error(id, INTERNAL_ERROR, message).await;
                }
                Flow::FailWith(code, message, data) => {
                    let mut error = json!({"code": code, "message": message});
                    if let Some(data) = data {
                        error["data"] = json!(data);
                    }
                    return self
                        .out
                        .send(json!({"jsonrpc": "2.0", "id": id, "error": error}))
                        .await;
                }
                Flow::Hang => std::future::pending::<()>().await,
            }
        }
        let mut answer = json!({"stopReason": stop_reason});
        // The session's running total, as claude-agent-acp answers, once `usage` reported any.
        let used = self
            .with_session(&turn.session_id, |s| s.used_tokens)
            .unwrap_or_default();
        if used > 0 {
            answer["usage"] = json!({"totalTokens": used, "inputTokens": used, "outputTokens": 0});
        }
        self.out.reply(id, answer).await;
        if self.config.late_updates {
            self.usage(&turn.session_id).await;
            let title = title_of(&turn.text);
            self.out
                .update(
                    &turn.session_id,
                    json!({
                        "sessionUpdate": "session_info_update",
                        "title": title,
                        "updatedAt": jiff::Timestamp::now().to_string(),
                    }),
                )
                .await;
        }
    }

    /// Says `text` a few words at a time, as a model streams (the demo's way); cancellable.
    async fn say_slowly(&self, turn: &mut Turn, text: &str) -> Flow {
        let words: Vec<&str> = text.split_inclusive(' ').collect();
        for (i, chunk) in words.chunks(3).enumerate() {
            if i > 0 && !turn.waited(Duration::from_millis(40)).await {
                return cancelled();
            }
            self.say(turn, &chunk.concat()).await;
        }
        Flow::Continue
    }

    /// Calls `tool` on the session's first HTTP MCP server (drover's): its answer on one line.
    async fn call_mcp(
        &self,
        session_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<String, String> {
        let url = self
            .with_session(session_id, |s| {
                s.mcp_servers
                    .as_array()
                    .and_then(|all| {
                        all.iter()
                            .find_map(|m| m.get("url").and_then(Value::as_str))
                    })
                    .map(str::to_string)
            })
            .ok()
            .flatten()
            .ok_or_else(|| "no HTTP MCP server in this session".to_string())?;
        let (tool, arguments) = (tool.to_string(), arguments.clone());
        tokio::task::spawn_blocking(move || mcp_call(&url, &tool, &arguments))
            .await
            .map_err(|e| e.to_string())?
    }

    async fn say(&self, turn: &Turn, text: &str) {
        self.record(&turn.session_id, &json!({"type": "agent", "text": text}));
        self.out
            .update(
                &turn.session_id,
                json!({"sessionUpdate": "agent_message_chunk", "content": text_content(text)}),
            )
            .await;
    }

    /// `limit`: while the limit lasts (`seconds` after this prompt's text was first seen,
    /// kept in the state dir so that a new process of the agent knows), the error `agent`
    /// fails the prompt with (code, message, data); `None` once it is over.
    fn limited(
        &self,
        prompt: &str,
        agent: &str,
        seconds: u64,
        reset: bool,
    ) -> Option<(i64, String, Option<String>)> {
        use std::hash::{Hash, Hasher};
        if std::env::var_os("SCRIPTED_AGENT_UNLIMITED").is_some() {
            // A provider whose limit was not hit (another provider an agent falls back to).
            return None;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        prompt.hash(&mut hasher);
        let path = self
            .config
            .state_dir
            .join("limits")
            .join(format!("{:016x}", hasher.finish()));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let first = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        let first = first.unwrap_or_else(|| {
            let _ = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")));
            let _ = std::fs::write(&path, now.as_millis().to_string());
            now
        });
        let end = first + Duration::from_secs(seconds);
        let left = end.checked_sub(now).filter(|d| !d.is_zero())?;
        let left_s = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let end_s = end.as_secs() + u64::from(end.subsec_nanos() > 0);
        let internal = |data: String| (INTERNAL_ERROR, "Internal error".to_string(), Some(data));
        Some(match (agent, reset) {
            // codex-acp 0.16: `Internal error`, its words in `data`, the reset in local time,
            // to the minute.
            ("codex", true) => {
                let at = jiff::Timestamp::from_second(i64::try_from(end_s).unwrap_or(0))
                    .unwrap_or_default()
                    .to_zoned_datetime(jiff::tz::TimeZone::system());
                let (hour, minute) = (at.hour(), at.minute());
                let (h12, half) = match hour {
                    0 => (12, "AM"),
                    1..=11 => (hour, "AM"),
                    12 => (12, "PM"),
                    _ => (hour - 12, "PM"),
                };
                internal(format!(
                    "You've hit your usage limit. Try again at {h12}:{minute:02} {half}."
                ))
            }
            ("codex", false) => internal("You've hit your usage limit. Try again later.".to_string()),
            // claude-agent-acp 0.23: Claude Code's result text in the message.
            ("claude", true) => (
                INTERNAL_ERROR,
                format!("Internal error: Claude AI usage limit reached|{end_s}"),
                None,
            ),
            ("claude", false) => (
                INTERNAL_ERROR,
                r#"Internal error: API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Please try again later."}}"#.to_string(),
                None,
            ),
            // gemini-cli 0.61: the HTTP status as the code, its quota error's message.
            (_, true) => (
                429,
                format!(
                    "You exceeded your current quota, please check your plan and billing details. Please retry in {left_s}s."
                ),
                None,
            ),
            (_, false) => (
                429,
                "You have exhausted your daily quota on this model.".to_string(),
                None,
            ),
        })
    }

    /// Plays one directive: one line each, the directive's work in a function of its own.
    async fn play(&self, turn: &mut Turn, directive: Directive) -> Flow {
        let session_id = turn.session_id.clone();
        let said = match directive {
            Directive::Say(text) if self.config.demo => return self.say_slowly(turn, &text).await,
            Directive::Say(text) => text,
            Directive::Stream { count, delay } => {
                return self.stream(turn, count, delay, false).await;
            }
            Directive::StreamStamped { count, delay } => {
                return self.stream(turn, count, delay, true).await;
            }
            Directive::Think(text) => return self.think(&session_id, &text).await,
            Directive::Tool(title) => return self.tool(&session_id, &title).await,
            Directive::Permission { title, order } => {
                return self.permission(turn, &title, order).await;
            }
            Directive::Sleep(duration) if turn.waited(duration).await => return Flow::Continue,
            Directive::Sleep(_) => return cancelled(),
            Directive::Hang => return Flow::Hang,
            Directive::Crash(code) => return self.crash(code).await,
            Directive::Garbage => {
                self.out.line(GARBAGE_LINE.to_string()).await;
                return Flow::Continue;
            }
            Directive::Plan(steps) => return self.plan(&session_id, &steps).await,
            Directive::Usage => {
                self.usage(&session_id).await;
                return Flow::Continue;
            }
            Directive::Unknown => return self.unknown(&session_id).await,
            Directive::Fail(message) => return Flow::Fail(message),
            Directive::Limit {
                agent,
                seconds,
                reset,
            } => return self.limit(&turn.text, &agent, seconds, reset),
            Directive::Stop(reason) => return Flow::End(reason),
            Directive::Env(name) => std::env::var(&name).unwrap_or_else(|_| "<unset>".to_string()),
            Directive::Cwd => std::env::current_dir().map_or_else(
                |e| format!("<cwd unknown: {e}>"),
                |d| d.display().to_string(),
            ),
            Directive::SessionCwd => self.session_said(&session_id, |s| s.cwd.clone()),
            Directive::Mcp { tool, arguments } => self.mcp(&session_id, &tool, &arguments).await,
            Directive::McpServers => self.session_said(&session_id, |s| s.mcp_servers.to_string()),
            Directive::SpawnChild => spawn_sleeper("child", false),
            Directive::SpawnTool => spawn_sleeper("tool", true),
            Directive::SpawnSession => spawn_session(),
            Directive::SpawnEscapee => spawn_escapee().await,
            Directive::Stderr(text) => {
                eprintln!("{text}");
                return Flow::Continue;
            }
            Directive::EchoPrompt => turn.text.clone(),
            Directive::Recall => turn.recall(),
            Directive::Terminal {
                how,
                limit,
                program,
                args,
            } => {
                self.terminal(&session_id, how, limit, &program, &args)
                    .await
            }
            Directive::TerminalOutput(id) => self.terminal_output(&session_id, &id).await,
            Directive::Other(line) => format!("ok: {line}"),
            Directive::OwnTask(title) => return self.own_task(&session_id, &title).await,
            Directive::OwnTaskDone => return self.own_task_done(&session_id).await,
            Directive::OwnSubagent(title) => return self.own_subagent(turn, &title).await,
            Directive::OwnSubagentDone => return self.own_subagent_done(&session_id).await,
            Directive::Subagent(prompt) => self.subagent(&session_id, &prompt).await,
            Directive::Job(command) => self.job(&session_id, &command).await,
            Directive::Tour => return self.tour(turn).await,
            Directive::Help => return self.say_slowly(turn, HELP).await,
        };
        self.say(turn, &said).await;
        Flow::Continue
    }

    /// `stream`: `count` chunks, `delay` apart (stamped with the wall clock when asked);
    /// cancellable.
    async fn stream(&self, turn: &mut Turn, count: u64, delay: Duration, stamped: bool) -> Flow {
        for i in 1..=count {
            if i > 1 && !delay.is_zero() && !turn.waited(delay).await {
                return cancelled();
            }
            if turn.cancelled() {
                return cancelled();
            }
            let text = if stamped {
                let ns = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                format!("chunk {i} @{ns}\n")
            } else {
                format!("chunk {i}\n")
            };
            self.say(turn, &text).await;
        }
        Flow::Continue
    }

    async fn think(&self, session_id: &str, text: &str) -> Flow {
        self.record(session_id, &json!({"type": "thought", "text": text}));
        self.out
            .update(
                session_id,
                json!({"sessionUpdate": "agent_thought_chunk", "content": text_content(text)}),
            )
            .await;
        Flow::Continue
    }

    /// `tool`: a tool call, completed at once.
    async fn tool(&self, session_id: &str, title: &str) -> Flow {
        let tool_call = self.tool_call(title);
        let tool_call_id = tool_call["toolCallId"].clone();
        self.out
            .update(session_id, with_kind("tool_call", tool_call))
            .await;
        self.complete_tool(session_id, &tool_call_id, title).await;
        Flow::Continue
    }

    /// `crash`: flushes stdout, says so on stderr and exits with `code`.
    async fn crash(&self, code: i32) -> Flow {
        self.out.flush().await;
        eprintln!("{CRASH_MESSAGE}");
        std::process::exit(code);
    }

    async fn plan(&self, session_id: &str, steps: &[String]) -> Flow {
        let entries: Vec<Value> = steps
            .iter()
            .map(|s| json!({"content": s, "priority": "medium", "status": "pending"}))
            .collect();
        self.out
            .update(
                session_id,
                json!({"sessionUpdate": "plan", "entries": entries}),
            )
            .await;
        Flow::Continue
    }

    /// `unknown`: an update of a kind no client knows, and an unknown notification.
    async fn unknown(&self, session_id: &str) -> Flow {
        self.out
            .update(
                session_id,
                json!({"sessionUpdate": "scripted_unknown_kind", "detail": "a kind no client knows"}),
            )
            .await;
        self.out
            .notify(
                "_scripted/status",
                json!({"sessionId": session_id, "status": "busy"}),
            )
            .await;
        Flow::Continue
    }

    /// `limit`: the prompt fails as `agent` fails it while the limit lasts; then goes on.
    fn limit(&self, prompt: &str, agent: &str, seconds: u64, reset: bool) -> Flow {
        self.limited(prompt, agent, seconds, reset)
            .map_or(Flow::Continue, |(code, message, data)| {
                Flow::FailWith(code, message, data)
            })
    }

    /// What the session holds, as `f` says it (empty for a session it does not know).
    fn session_said(&self, session_id: &str, f: impl FnOnce(&mut Session) -> String) -> String {
        self.with_session(session_id, f).unwrap_or_default()
    }

    /// `mcp`: calls `tool` on the session's MCP server; what to say about it.
    async fn mcp(&self, session_id: &str, tool: &str, arguments: &str) -> String {
        match serde_json::from_str::<Value>(arguments) {
            Err(e) => format!("mcp {tool} error: arguments are not JSON: {e}"),
            Ok(arguments) => match self.call_mcp(session_id, tool, &arguments).await {
                Ok(result) => format!("mcp {tool}: {result}"),
                Err(e) => format!("mcp {tool} error: {e}"),
            },
        }
    }

    /// `terminal-output`: asks the client for terminal `id`'s output; what to say about it.
    async fn terminal_output(&self, session_id: &str, id: &str) -> String {
        let terminal = json!({"sessionId": session_id, "terminalId": id});
        match self.call("terminal/output", terminal).await {
            Ok(out) => format!("terminal {id} output {out}"),
            Err(e) => format!("terminal {id} output error: {e}"),
        }
    }

    /// `own-task`: claude's Task tool call, left running.
    async fn own_task(&self, session_id: &str, title: &str) -> Flow {
        let n = self.next_tool.fetch_add(1, Ordering::Relaxed);
        let id = format!("scripted-task-{}-{n}", std::process::id());
        let update = json!({
            "sessionUpdate": "tool_call", "toolCallId": id, "title": title,
            "kind": "think", "status": "in_progress",
            "_meta": {"claudeCode": {"toolName": "Task"}},
        });
        self.out.update(session_id, update).await;
        *lock(&self.own_task) = Some(id);
        Flow::Continue
    }

    /// `own-task-done`: the last `own-task` call completed.
    async fn own_task_done(&self, session_id: &str) -> Flow {
        let id = lock(&self.own_task).take();
        if let Some(id) = id {
            let update = json!({
                "sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed",
                "_meta": {"claudeCode": {"toolName": "Task"}},
            });
            self.out.update(session_id, update).await;
        }
        Flow::Continue
    }

    /// `own-subagent`: an ACP child session, announced running, that says something and starts
    /// a tool.
    async fn own_subagent(&self, turn: &Turn, title: &str) -> Flow {
        if !self.client_subagents.load(Ordering::Relaxed) {
            self.say(turn, "no subagents").await;
            return Flow::Continue;
        }
        let session_id = &turn.session_id;
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        let child = format!("{session_id}-child-{n}");
        let announce = json!({
            "sessionUpdate": "subagent_update", "sessionId": child, "title": title,
            "description": "a scripted child session", "state": {"state": "running"},
        });
        self.out.update(session_id, announce).await;
        let words = json!({
            "sessionUpdate": "agent_message_chunk",
            "content": text_content(&format!("child working on {title}")),
        });
        self.out.update(&child, words).await;
        let call = with_kind("tool_call", self.tool_call("child tool"));
        self.out.update(&child, call).await;
        *lock(&self.own_child) = Some(child);
        Flow::Continue
    }

    /// `own-subagent-done`: the last child session idle.
    async fn own_subagent_done(&self, session_id: &str) -> Flow {
        let child = lock(&self.own_child).take();
        if let Some(child) = child {
            let update = json!({
                "sessionUpdate": "subagent_update", "sessionId": child,
                "state": {"state": "idle"},
            });
            self.out.update(session_id, update).await;
        }
        Flow::Continue
    }

    /// `subagent`: creates one through the session's MCP server; what to say about it.
    async fn subagent(&self, session_id: &str, prompt: &str) -> String {
        let title = title_of(prompt);
        let arguments = json!({
            "relationship": {"kind": "subagent"},
            "workspace": {"kind": "current"},
            "prompt": prompt,
            "title": format!("subagent: {title}"),
        });
        match self.call_mcp(session_id, "create_agent", &arguments).await {
            Ok(result) => format!("started subagent {}\n", answer_field(&result, "agentId")),
            Err(e) => format!("subagent error: {e}\n"),
        }
    }

    /// `job`: starts one through the session's MCP server; what to say about it.
    async fn job(&self, session_id: &str, command: &str) -> String {
        let arguments = json!({"command": command});
        match self.call_mcp(session_id, "start_job", &arguments).await {
            Ok(result) => format!(
                "started job {}: {command}\n",
                answer_field(&result, "jobId")
            ),
            Err(e) => format!("job error: {e}\n"),
        }
    }

    /// `tour`: the demo's show, played directive by directive.
    async fn tour(&self, turn: &mut Turn) -> Flow {
        for directive in tour() {
            if turn.cancelled() {
                return cancelled();
            }
            match Box::pin(self.play(turn, directive)).await {
                Flow::Continue => {}
                other => return other,
            }
        }
        Flow::Continue
    }

    /// Uses an ACP client terminal as `how` says; what to say about it.
    async fn terminal(
        &self,
        session_id: &str,
        how: TerminalUse,
        limit: Option<u64>,
        program: &str,
        args: &[String],
    ) -> String {
        if !self.client_terminals.load(Ordering::Relaxed) {
            return "terminal error: the client offers no terminals".to_string();
        }
        let mut params = json!({"sessionId": session_id, "command": program, "args": args,
            "env": [{"name": "SCRIPTED_TERMINAL", "value": "1"}]});
        if let Some(limit) = limit {
            params["outputByteLimit"] = json!(limit);
        }
        let created = self.call("terminal/create", params).await;
        let id = match created {
            Ok(result) => match result["terminalId"].as_str() {
                Some(id) => id.to_string(),
                None => return format!("terminal error: no terminalId in {result}"),
            },
            Err(e) => return format!("terminal error: {e}"),
        };
        let terminal = json!({"sessionId": session_id, "terminalId": id});
        let mut said = format!("terminal {id}");
        match how {
            TerminalUse::Start => said.push_str(" started"),
            TerminalUse::Wait | TerminalUse::Kill => {
                if how == TerminalUse::Kill
                    && let Err(e) = self.call("terminal/kill", terminal.clone()).await
                {
                    return format!("{said} kill error: {e}");
                }
                match self.call("terminal/wait_for_exit", terminal.clone()).await {
                    Ok(exit) => {
                        let _ =
                            write!(said, " exit {} signal {}", exit["exitCode"], exit["signal"]);
                    }
                    Err(e) => return format!("{said} wait error: {e}"),
                }
                match self.call("terminal/output", terminal.clone()).await {
                    Ok(out) => {
                        let _ = write!(
                            said,
                            " truncated {} output {:?}",
                            out["truncated"],
                            out["output"].as_str().unwrap_or_default()
                        );
                    }
                    Err(e) => return format!("{said} output error: {e}"),
                }
                if let Err(e) = self.call("terminal/release", terminal).await {
                    let _ = write!(said, " release error: {e}");
                }
            }
            TerminalUse::Release => {
                if let Err(e) = self.call("terminal/release", terminal.clone()).await {
                    return format!("{said} release error: {e}");
                }
                match self.call("terminal/output", terminal).await {
                    Ok(out) => {
                        let _ = write!(said, " output after release: {out}");
                    }
                    Err(e) => {
                        let _ = write!(said, " released; output: {e}");
                    }
                }
            }
        }
        said
    }

    /// A request to the client and its answer (an error as its JSON text).
    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let (_, answer) = self.ask(method, params).await;
        match answer.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("no answer".to_string()),
        }
    }

    async fn usage(&self, session_id: &str) {
        let used = self
            .with_session(session_id, |s| {
                s.used_tokens += 1000;
                s.used_tokens
            })
            .unwrap_or_default();
        self.out
            .update(
                session_id,
                json!({
                    "sessionUpdate": "usage_update",
                    "used": used,
                    "size": 200_000,
                    "cost": {"amount": used as f64 / 1_000_000.0, "currency": "USD"},
                }),
            )
            .await;
    }

    fn tool_call(&self, title: &str) -> Value {
        let n = self.next_tool.fetch_add(1, Ordering::Relaxed);
        json!({
            "toolCallId": format!("scripted-tool-{}-{n}", std::process::id()),
            "title": title,
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": title},
        })
    }

    async fn complete_tool(&self, session_id: &str, tool_call_id: &Value, title: &str) {
        self.out
            .update(
                session_id,
                json!({
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": tool_call_id,
                    "status": "completed",
                    "content": [{"type": "content", "content": text_content(&format!("ran {title}"))}],
                }),
            )
            .await;
    }

    async fn permission(&self, turn: &mut Turn, title: &str, order: PermissionOrder) -> Flow {
        let session_id = turn.session_id.clone();
        let tool_call = self.tool_call(title);
        let tool_call_id = tool_call["toolCallId"].clone();
        if order == PermissionOrder::AnnounceFirst {
            self.out
                .update(&session_id, with_kind("tool_call", tool_call.clone()))
                .await;
        }
        let options: Vec<Value> = [
            ("allow-once", "Allow once", "allow_once"),
            ("allow-always", "Always allow", "allow_always"),
            ("reject-once", "Reject", "reject_once"),
            ("reject-always", "Always reject", "reject_always"),
        ]
        .iter()
        .map(|(id, name, kind)| json!({"optionId": id, "name": name, "kind": kind}))
        .collect();
        let params = json!({"sessionId": session_id, "toolCall": tool_call, "options": options});
        let (key, answer) = self.ask("session/request_permission", params).await;
        let answer = tokio::select! {
            answer = answer => answer,
            () = turn.until_cancelled() => {
                lock(&self.pending).remove(&key);
                return cancelled();
            }
        };
        let option = match answer {
            Ok(Ok(result)) => match result["outcome"]["outcome"].as_str() {
                Some("selected") => result["outcome"]["optionId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                Some("cancelled") => return cancelled(),
                _ => {
                    log(format!("permission answer without an outcome: {result}"));
                    return cancelled();
                }
            },
            Ok(Err(error)) => {
                log(format!("permission request failed: {error}"));
                return cancelled();
            }
            Err(_) => return cancelled(),
        };
        if option.starts_with("allow") {
            if order == PermissionOrder::AskFirst {
                let mut announce = with_kind("tool_call", tool_call);
                announce["status"] = json!("in_progress");
                self.out.update(&session_id, announce).await;
            }
            self.complete_tool(&session_id, &tool_call_id, title).await;
            self.say(turn, "permission granted").await;
        } else {
            if !option.starts_with("reject") {
                log(format!(
                    "unknown permission option `{option}`, taken as a reject"
                ));
            }
            // Only claude says the refused tool call failed; codex and gemini never mention
            // it again.
            if order == PermissionOrder::AnnounceFirst {
                self.out
                    .update(
                    &session_id,
                    json!({
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": tool_call_id,
                        "status": "failed",
                        "content": [{"type": "content", "content": text_content("the user rejected this")}],
                    }),
                    )
                    .await;
            }
            self.say(turn, "permission denied").await;
        }
        Flow::Continue
    }

    /// Sends a request to the client; returns its pending key and where its answer arrives.
    async fn ask(&self, method: &str, params: Value) -> (String, oneshot::Receiver<Answer>) {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        let id = if self.config.string_ids {
            json!(uuid::Uuid::now_v7().to_string())
        } else {
            json!(n)
        };
        let key = id.to_string();
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(key.clone(), tx);
        self.out
            .send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        (key, rx)
    }
}

/// `spawn-child` and `spawn-tool`: `sleep 1000` in the agent's process group, or in one of its
/// own (as real agents run their tools); what to say about it.
fn spawn_sleeper(label: &str, own_group: bool) -> String {
    let mut command = tokio::process::Command::new("sleep");
    command.arg("1000");
    if own_group {
        command.process_group(0);
    }
    spawn_detached(label, &mut command)
}

/// `spawn-session`: a shell in a session of its own that starts `sleep 1000` and waits.
fn spawn_session() -> String {
    // `setsid` is not a group leader here, so it calls setsid(2) and execs the shell in place:
    // the pid is the shell's.
    let mut command = tokio::process::Command::new("setsid");
    command.args(["sh", "-c", "sleep 1000 & wait"]);
    spawn_detached("session", &mut command)
}

/// Starts `command` with stdio null (so it holds none of the agent's pipes) and leaves it
/// running; says `<label> <pid>`.
fn spawn_detached(label: &str, command: &mut tokio::process::Command) -> String {
    let spawned = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(child) => format!("{label} {}", child.id().unwrap_or_default()),
        Err(e) => format!("spawn failed: {e}"),
    }
}

/// `SCRIPTED_AGENT_LOGIN_BROWSER`: `sleep 1000` started through a shell that exits at once, in
/// a session of its own (a browser `xdg-open` started: no longer the agent's descendant); its
/// pid written to `pid_file` once it is in that session (as `xdg-open` returns once the
/// browser runs: until then it is still in the agent's group, which a sign-in that ends at
/// once would end with it).
fn open_browser(pid_file: &Path) {
    let started = std::process::Command::new("sh")
        .args([
            "-c",
            "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match started {
        Ok(out) => {
            let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
            for _ in 0..500 {
                if session_of(&pid).is_none_or(|session| session == pid) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = std::fs::write(pid_file, &pid) {
                log(format!("cannot write the browser's pid: {e}"));
            }
        }
        Err(e) => log(format!("cannot open the browser: {e}")),
    }
}

/// The session id of process `pid` (`/proc/<pid>/stat`), if it exists.
fn session_of(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp session …; comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(3).map(str::to_string)
}

/// `spawn-escapee`: `sleep 1000` started through a shell that exits at once, in a session of
/// its own with an empty environment; what to say about it.
async fn spawn_escapee() -> String {
    let spawned = tokio::process::Command::new("sh")
        .args([
            "-c",
            "env -i setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .await;
    match spawned {
        Ok(out) => format!("escapee {}\n", String::from_utf8_lossy(&out.stdout).trim()),
        Err(e) => format!("spawn failed: {e}"),
    }
}

fn with_kind(kind: &str, mut update: Value) -> Value {
    update["sessionUpdate"] = json!(kind);
    update
}

fn session_cwd(params: &Value) -> Result<String, (i64, String)> {
    match params["cwd"].as_str() {
        Some(cwd) if Path::new(cwd).is_absolute() => Ok(cwd.to_string()),
        Some(cwd) => Err((
            INVALID_PARAMS,
            format!("cwd `{cwd}` is not an absolute path"),
        )),
        None => Err((INVALID_PARAMS, "cwd is missing".to_string())),
    }
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write per line, so concurrent appends do not interleave within a line.
    file.write_all(format!("{line}\n").as_bytes())
}

/// One MCP `tools/call`: the result's text on one line (a reader picks it out of the agent's
/// message), or why it failed (`protocol error: ...` when no tool result came back).
fn mcp_call(url: &str, tool: &str, arguments: &Value) -> Result<String, String> {
    match crate::mcp_http::tools_call(url, tool, arguments, Duration::from_secs(120)) {
        Ok(text) => Ok(text.split_whitespace().collect::<Vec<_>>().join(" ")),
        Err(crate::mcp_http::CallError::Tool(text)) => Err(text),
        Err(crate::mcp_http::CallError::Protocol(e)) => Err(format!("protocol error: {e}")),
    }
}

/// A string field of a tool's JSON answer (`?` when it is not there).
fn answer_field(answer: &str, field: &str) -> String {
    serde_json::from_str::<Value>(answer)
        .ok()
        .and_then(|v| v.get(field).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// A title made from a prompt: its first line, at most 40 characters.
fn title_of(prompt: &str) -> String {
    prompt
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(40)
        .collect()
}

/// What the demo says to a prompt without directives.
const WELCOME: &str = "Hello! I am drover's **demo agent**: a script, not a model, so nothing leaves this machine and no key is needed. Everything you see (this text streaming in, tool calls, permission cards, subagents, jobs) is drover at work, as it would be with Codex, Claude Code or Gemini.\n\n";

/// The demo's directives, for people.
const HELP: &str = "Each line of your message is one thing for me to do. Try:\n\n\
- `tour`: all of the below, in one go\n\
- `permission Edit README.md`: a permission card for you to answer\n\
- `subagent hello`: a subagent, created through drover's MCP server; drover tells me when it is done\n\
- `job sleep 5; echo done`: a background job; drover tells me when it ends\n\
- `say <text>`, `think <text>`, `tool <title>`, `plan first; second; third`, `stream 20 100`, `sleep 2000`\n\n\
Every directive is in docs/demo.md.\n";

/// What the demo plays for `tour`.
fn tour() -> Vec<Directive> {
    vec![
        Directive::Think("The user asked for a tour: show a plan, stream some text, use a tool, ask a permission, start a subagent and a job.".to_string()),
        Directive::Plan(
            ["Stream a reply", "Use a tool", "Ask a permission", "Start a subagent", "Start a job"]
                .map(str::to_string)
                .to_vec(),
        ),
        Directive::Say("This text streams in a few words at a time, as a model's reply would. Next, a tool call, then a permission card: answer it to go on.\n\n".to_string()),
        Directive::Tool("Read the project".to_string()),
        Directive::Permission {
            title: "Edit the demo file".to_string(),
            order: PermissionOrder::AnnounceFirst,
        },
        Directive::Say("\n\nNow a subagent and a background job, both through drover's MCP server:\n".to_string()),
        Directive::Subagent("say Hello from the subagent!\nstream 5 300".to_string()),
        Directive::Job("for i in 1 2 3 4 5; do echo tick $i; sleep 1; done".to_string()),
        Directive::Say("That was the tour. The subagent and the job run on by themselves; drover tells me when each is done.\n".to_string()),
    ]
}

/// In demo mode: a notice from drover is acknowledged and never read as directives; a
/// prompt without any directive gets the welcome and the help.
fn demo_directives(text: &str) -> Vec<Directive> {
    let text = text.trim_start();
    if text.starts_with("[drover]") {
        let first = text.lines().next().unwrap_or_default();
        return vec![Directive::Say(format!("Noted: {first}\n"))];
    }
    // Only the demo's own directives (docs/demo.md): the ones that test drover against a
    // misbehaving agent (a process left outside drover's tree, the environment printed, a
    // crash, a hang) are not a person's to reach; their lines are plain text here.
    let directives: Vec<Directive> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| match Directive::parse(line) {
            d if d.is_demos() => d,
            _ => Directive::Other(line.to_string()),
        })
        .collect();
    if directives.iter().all(|d| matches!(d, Directive::Other(_))) {
        return vec![
            Directive::Think(
                "No directive in this message: say hello and what I can do.".to_string(),
            ),
            Directive::Say(WELCOME.to_string()),
            Directive::Help,
        ];
    }
    directives
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_directives() {
        assert_eq!(
            Directive::parse("say hello world"),
            Directive::Say("hello world".into())
        );
        assert_eq!(
            Directive::parse("stream 5"),
            Directive::Stream {
                count: 5,
                delay: Duration::ZERO
            }
        );
        assert_eq!(
            Directive::parse("stream 3 20"),
            Directive::Stream {
                count: 3,
                delay: Duration::from_millis(20)
            }
        );
        assert_eq!(
            Directive::parse("stream x"),
            Directive::Other("stream x".into())
        );
        assert_eq!(
            Directive::parse("stream-stamped 3 20"),
            Directive::StreamStamped {
                count: 3,
                delay: Duration::from_millis(20)
            }
        );
        assert_eq!(Directive::parse("crash"), Directive::Crash(3));
        assert_eq!(Directive::parse("crash 7"), Directive::Crash(7));
        assert_eq!(
            Directive::parse("plan a; b ;"),
            Directive::Plan(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            Directive::parse("permission-only rm -rf x"),
            Directive::Permission {
                title: "rm -rf x".into(),
                order: PermissionOrder::AskOnly
            }
        );
        assert_eq!(
            Directive::parse("hello there"),
            Directive::Other("hello there".into())
        );
        assert_eq!(
            Directive::parse_all("\n  say a \n\nhang\n", false),
            vec![Directive::Say("a".into()), Directive::Hang]
        );
        // Reading quotes, a quoted line is the directive it quotes.
        let notice = "[drover] Job job-1 exited\n> say again\n>";
        assert_eq!(
            Directive::parse_all(notice, true),
            vec![
                Directive::Other("[drover] Job job-1 exited".into()),
                Directive::Say("again".into()),
                Directive::Other(">".into())
            ]
        );
        assert_eq!(
            Directive::parse_all(notice, false)[1],
            Directive::Other("> say again".into())
        );
    }

    #[test]
    fn demo_directives_parse() {
        assert_eq!(
            Directive::parse("subagent say a\\nsay b"),
            Directive::Subagent("say a\nsay b".into())
        );
        assert_eq!(
            Directive::parse("job sleep 1; echo done"),
            Directive::Job("sleep 1; echo done".into())
        );
        assert_eq!(Directive::parse("tour"), Directive::Tour);
        assert_eq!(Directive::parse("help"), Directive::Help);
        assert_eq!(Directive::parse("job"), Directive::Other("job".into()));
    }

    #[test]
    fn the_demo_welcomes_a_plain_prompt_and_notes_drover_notices() {
        let plain = demo_directives("hello there");
        assert!(
            matches!(plain.as_slice(), [Directive::Think(_), Directive::Say(w), Directive::Help] if w == WELCOME)
        );
        // A notice quoting a reply with directive-like lines is never played.
        let notice = "[drover] Job job-1 exited (exit status 0)\n> crash";
        assert_eq!(
            demo_directives(notice),
            [Directive::Say(
                "Noted: [drover] Job job-1 exited (exit status 0)\n".into()
            )]
        );
        let scripted = Directive::parse_all("say hi\nhello", false);
        assert_eq!(demo_directives("say hi\nhello"), scripted);
    }

    #[test]
    fn the_demo_plays_only_its_own_directives() {
        let text = "say hi\nspawn-escapee\nenv OPENAI_API_KEY\ncrash\nhang\nspawn-session\n\
                    terminal sh -c id\npermission-only rm\nlimit codex 60\nstream 2";
        let played = demo_directives(text);
        let mut expected = vec![Directive::Say("hi".into())];
        expected.extend(
            text.lines()
                .skip(1)
                .take(8)
                .map(|l| Directive::Other(l.to_string())),
        );
        expected.push(Directive::Stream {
            count: 2,
            delay: Duration::ZERO,
        });
        assert_eq!(played, expected);
        // Nothing but test directives: the welcome, as for any text.
        assert!(matches!(
            demo_directives("spawn-escapee\nenv HOME").as_slice(),
            [Directive::Think(_), Directive::Say(w), Directive::Help] if w == WELCOME
        ));
        // Every directive the demo documents still plays.
        for line in [
            "tour",
            "help",
            "say a",
            "think a",
            "plan a; b",
            "tool a",
            "permission a",
            "subagent say a",
            "job echo a",
            "stream 3 10",
            "sleep 5",
            "recall",
            "usage",
            "fail a",
            "stop refusal",
            "mcp list_agents {}",
        ] {
            assert_eq!(demo_directives(line), [Directive::parse(line)], "{line}");
        }
    }

    #[test]
    fn prompt_text_joins_blocks() {
        let prompt = json!([
            {"type": "text", "text": "context"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "say inner"}},
            {"type": "image", "data": "", "mimeType": "image/png"},
            {"type": "text", "text": "say outer"},
        ]);
        assert_eq!(prompt_text(&prompt), "context\nsay inner\nsay outer");
    }
}
