//! How the CLI shows things: colour (off with `NO_COLOR` or when stdout is not a terminal),
//! tables, times, and the text rendering of an agent's timeline, live or from history.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use drover_protocol::{AgentStatus, InterruptCause, ItemKind, TurnEnd as End};
use jiff::{Timestamp, tz::TimeZone};
use serde_json::Value;

/// Whether to colour stdout.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

/// An ANSI colour (or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paint {
    Plain,
    Bold,
    Dim,
    Red,
    Green,
    Yellow,
    Cyan,
}

impl Style {
    /// Colour only for a terminal, and never with `NO_COLOR` set (to anything but "").
    pub fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: !no_color && std::io::stdout().is_terminal(),
        }
    }

    pub fn paint(self, paint: Paint, text: &str) -> String {
        let code = match paint {
            Paint::Plain => return text.to_string(),
            Paint::Bold => "1",
            Paint::Dim => "2",
            Paint::Red => "31",
            Paint::Green => "32",
            Paint::Yellow => "33",
            Paint::Cyan => "36",
        };
        if self.color && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// The colour of an agent status.
pub fn status_paint(status: AgentStatus) -> Paint {
    match status {
        AgentStatus::Running | AgentStatus::Initializing => Paint::Green,
        AgentStatus::Error => Paint::Red,
        AgentStatus::Closed => Paint::Dim,
        AgentStatus::Idle => Paint::Plain,
    }
}

/// A table of left-aligned columns, two spaces apart; widths come from the plain text so
/// colour never shifts a column.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<(String, Paint)>>,
}

impl Table {
    pub fn new(headers: Vec<&'static str>) -> Table {
        Table {
            headers,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Paint)>) {
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut impl Write, style: Style) -> std::io::Result<()> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, (text, _)) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(text.chars().count());
                }
            }
        }
        let last = self.headers.len().saturating_sub(1);
        let line = |cells: Vec<(String, Paint)>| {
            let mut line = String::new();
            for (i, (text, paint)) in cells.into_iter().enumerate() {
                line.push_str(&style.paint(paint, &text));
                if i < last {
                    let pad = widths[i].saturating_sub(text.chars().count()) + 2;
                    line.push_str(&" ".repeat(pad));
                }
            }
            line.trim_end().to_string()
        };
        let header = self
            .headers
            .iter()
            .map(|h| (h.to_string(), Paint::Bold))
            .collect();
        writeln!(out, "{}", line(header))?;
        for row in &self.rows {
            writeln!(out, "{}", line(row.clone()))?;
        }
        Ok(())
    }
}

/// `5s`, `3m`, `2h`, `4d`: how long ago `at` was.
pub fn age(at: &str, now: Timestamp) -> String {
    let Ok(at) = at.parse::<Timestamp>() else {
        return "-".to_string();
    };
    let secs = now.as_second().saturating_sub(at.as_second()).max(0);
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `14:03:27` in local time.
pub fn clock(at: &str) -> String {
    match at.parse::<Timestamp>() {
        Ok(at) => at
            .to_zoned_datetime(TimeZone::system())
            .strftime("%H:%M:%S")
            .to_string(),
        Err(_) => "--:--:--".to_string(),
    }
}

/// `2025-06-01 14:03:27 (3m ago)` in local time.
pub fn when(at: &str, now: Timestamp) -> String {
    match at.parse::<Timestamp>() {
        Ok(ts) => format!(
            "{} ({} ago)",
            ts.to_zoned_datetime(TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S"),
            age(at, now)
        ),
        Err(_) => at.to_string(),
    }
}

/// `2025-06-01 14:18:27 (in 15m)` in local time, for a time ahead.
pub fn when_ahead(at: &str, now: Timestamp) -> String {
    match at.parse::<Timestamp>() {
        Ok(ts) => {
            let secs = ts.as_second().saturating_sub(now.as_second()).max(0);
            let left = match secs {
                s if s < 60 => format!("{s}s"),
                s if s < 3600 => format!("{}m", s / 60),
                s if s < 86_400 => format!("{}h", s / 3600),
                s => format!("{}d", s / 86_400),
            };
            format!(
                "{} (in {left})",
                ts.to_zoned_datetime(TimeZone::system())
                    .strftime("%Y-%m-%d %H:%M:%S")
            )
        }
        Err(_) => at.to_string(),
    }
}

/// `41.3 MB` (decimal megabytes, one decimal).
#[expect(clippy::cast_precision_loss)] // a display, to one decimal
pub fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}

/// `$HOME/x` → `~/x`.
pub fn tilde(path: &str) -> String {
    match std::env::var("HOME") {
        Ok(home) if !home.is_empty() && home != "/" => match path.strip_prefix(&home) {
            Some("") => "~".to_string(),
            Some(rest) if rest.starts_with('/') => format!("~{rest}"),
            _ => path.to_string(),
        },
        _ => path.to_string(),
    }
}

/// At most `max` characters, with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    let single: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if single.chars().count() <= max {
        return single;
    }
    let mut cut: String = single.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// How a turn ended (a `turn_ended` item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    /// The item's `event` (a [`End`]'s name, or one a newer daemon wrote).
    pub event: String,
    pub detail: Option<String>,
}

impl TurnEnd {
    pub fn from_data(data: &Value) -> TurnEnd {
        let text = |k: &str| data.get(k).and_then(Value::as_str).map(str::to_string);
        let event = text("event").unwrap_or_else(|| ItemKind::TurnEnded.to_string());
        let detail = match End::parse(&event) {
            Some(End::Completed) => text("stopReason"),
            Some(End::Failed) => text("error"),
            Some(End::Canceled) => text("cause"),
            Some(End::Interrupted) => {
                text("cause").map(|cause| match InterruptCause::parse(&cause) {
                    Some(InterruptCause::Shutdown) => "the daemon shut down".to_string(),
                    Some(InterruptCause::Crash) => "the daemon stopped".to_string(),
                    None => cause,
                })
            }
            Some(End::Blocked) => text("reason"),
            // The provider's words, and when drover sends the prompt again (or where the
            // work went on instead).
            Some(End::Limited) => {
                let next = match (text("fallbackAgentId"), text("retryAt")) {
                    // Its whole id: a handle made here could differ from the one `drover
                    // ls` shows (longer when two ids end alike) and be ambiguous.
                    (Some(to), _) => Some(format!("the work goes on in agent {to}")),
                    (None, Some(at)) => Some(format!(
                        "the prompt goes again at {} (`drover retry` sends it now)",
                        clock(&at)
                    )),
                    (None, None) => None,
                };
                match (text("error"), next) {
                    (Some(error), Some(next)) => Some(format!("{error}; {next}")),
                    (error, next) => error.or(next),
                }
            }
            None => None,
        };
        TurnEnd { event, detail }
    }

    pub fn succeeded(&self) -> bool {
        End::parse(&self.event).is_some_and(End::succeeded)
    }

    /// `completed (end_turn)`, `failed: …`, `canceled (user)`, `interrupted: the daemon stopped`.
    pub fn describe(&self) -> String {
        let word = self.event.strip_prefix("turn_").unwrap_or(&self.event);
        match (&self.detail, word) {
            (None, _) => word.to_string(),
            (Some(d), "failed" | "blocked" | "interrupted" | "limited") => format!("{word}: {d}"),
            (Some(d), _) => format!("{word} ({d})"),
        }
    }

    fn paint(&self) -> Paint {
        match End::parse(&self.event) {
            Some(End::Completed) => Paint::Green,
            Some(End::Canceled) => Paint::Yellow,
            _ => Paint::Red,
        }
    }
}

/// What a [`Renderer`] shows.
#[derive(Debug, Clone, Copy)]
pub struct View {
    /// Each item on its own line under a local time and a label (`drover logs`); otherwise a
    /// conversation (`drover run`, `drover attach`).
    pub timestamps: bool,
    pub show_user: bool,
    pub show_turns: bool,
    /// Updates keep coming: a tool call gets its line once it settles (or its turn ends).
    pub live: bool,
}

impl View {
    /// Whether an item of this kind gets a line in this view (the others, such as `usage`, are
    /// for `--json` readers; a kind this drover does not know is skipped).
    pub fn shows(self, kind: Option<&str>) -> bool {
        match kind.and_then(ItemKind::parse) {
            Some(
                ItemKind::AgentMessage
                | ItemKind::AgentThought
                | ItemKind::ToolCall
                | ItemKind::Permission
                | ItemKind::Plan
                | ItemKind::Mode
                | ItemKind::Notice,
            ) => true,
            Some(ItemKind::UserMessage) => self.show_user,
            Some(ItemKind::TurnStarted) => self.show_turns && self.timestamps,
            Some(ItemKind::TurnEnded) => self.show_turns,
            Some(
                ItemKind::Config
                | ItemKind::Usage
                | ItemKind::AvailableCommands
                | ItemKind::SessionInfo
                | ItemKind::Raw,
            )
            | None => false,
        }
    }
}

/// When an item was made and last changed.
#[derive(Debug, Clone, Copy)]
struct Dates<'a> {
    made: &'a str,
    changed: &'a str,
}

impl<'a> Dates<'a> {
    /// The time to show: a settled tool call or an answered permission is dated by its last
    /// change, anything else by when it was made.
    fn shown(self, settled: bool) -> &'a str {
        if settled { self.changed } else { self.made }
    }
}

#[derive(Debug)]
struct Tool {
    title: String,
    status: String,
    /// Why it did not run: its permission was `denied` or `cancelled`.
    permission: Option<String>,
    at: String,
    printed: bool,
}

/// Writes an agent's timeline as text: items as they come, message text as it is appended,
/// tool calls one line each, permission requests with how to answer them.
#[derive(Debug)]
pub struct Renderer<W: Write> {
    out: W,
    style: Style,
    view: View,
    /// How to name the agent in hints (`drover permit NAME allow`).
    name: String,
    mid_line: bool,
    /// Continuation lines of the current item start this far in.
    indent: usize,
    /// The item appended text belongs to, and its colour.
    open: Option<(u64, Paint)>,
    tools: HashMap<u64, Tool>,
    tool_order: Vec<u64>,
    permissions: HashMap<u64, String>,
    /// Tool calls seen.
    pub tool_count: usize,
}

const LABEL_WIDTH: usize = 8;

impl<W: Write> Renderer<W> {
    pub fn new(out: W, style: Style, view: View, name: String) -> Renderer<W> {
        Renderer {
            out,
            style,
            view,
            name,
            mid_line: false,
            indent: 0,
            open: None,
            tools: HashMap::new(),
            tool_order: Vec::new(),
            permissions: HashMap::new(),
            tool_count: 0,
        }
    }

    /// Renders one `agent_update` notification (`op`: `item`, `append`, `patch`); returns how
    /// a turn ended when this was a `turn_ended` item.
    pub fn notification(&mut self, notification: &Value) -> std::io::Result<Option<TurnEnd>> {
        let end = match notification.get("op").and_then(Value::as_str) {
            Some("item") => match notification.get("item") {
                Some(item) => self.item(item)?,
                None => None,
            },
            Some("append") => {
                let seq = notification.get("seq").and_then(Value::as_u64);
                let text = notification.get("text").and_then(Value::as_str);
                if let (Some(seq), Some(text), Some((open, paint))) = (seq, text, self.open)
                    && open == seq
                {
                    self.text(text, paint)?;
                }
                None
            }
            Some("patch") => {
                let seq = notification.get("seq").and_then(Value::as_u64);
                let fields = notification.get("fields");
                // When the change happened (drovers before 0.1 sent no time: now, then).
                let at = notification
                    .get("at")
                    .and_then(Value::as_str)
                    .map_or_else(|| jiff::Timestamp::now().to_string(), str::to_string);
                if let (Some(seq), Some(fields)) = (seq, fields) {
                    self.patch(seq, &at, fields)?;
                }
                None
            }
            _ => None,
        };
        self.out.flush()?;
        Ok(end)
    }

    /// Renders one timeline item (`{seq, at, kind, data}`).
    pub fn item(&mut self, item: &Value) -> std::io::Result<Option<TurnEnd>> {
        let seq = item.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let at = item.get("at").and_then(Value::as_str).unwrap_or_default();
        let dates = Dates {
            made: at,
            changed: item.get("updatedAt").and_then(Value::as_str).unwrap_or(at),
        };
        // A kind this drover does not know is skipped, like the ones it does not show.
        let kind = item
            .get("kind")
            .and_then(Value::as_str)
            .and_then(ItemKind::parse);
        let empty = Value::Object(serde_json::Map::new());
        let data = item.get("data").unwrap_or(&empty);
        let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or_default();
        self.open = None;
        match kind {
            Some(ItemKind::AgentMessage | ItemKind::AgentThought) => {
                let thought = kind == Some(ItemKind::AgentThought);
                let label = if thought { "thought" } else { "agent" };
                self.start(at, label)?;
                if thought && !self.view.timestamps {
                    let prefix = self.style.paint(Paint::Dim, "thinking: ");
                    write!(self.out, "{prefix}")?;
                    self.mid_line = true;
                }
                let paint = if thought { Paint::Dim } else { Paint::Plain };
                self.text(text("text"), paint)?;
                self.open = Some((seq, paint));
            }
            Some(ItemKind::UserMessage) if self.view.show_user => self.user_message(at, data)?,
            Some(ItemKind::ToolCall) => self.tool_call(seq, dates, data)?,
            Some(ItemKind::Permission) => self.permission(seq, dates, data)?,
            Some(ItemKind::Plan) => self.plan(at, data)?,
            Some(ItemKind::Mode) => {
                let mode = data.get("modeId").and_then(Value::as_str).unwrap_or("?");
                let text = self.labelled("mode: ", mode);
                self.line(at, "mode", Paint::Dim, &text)?;
            }
            Some(ItemKind::Notice) => {
                let text = self.labelled("notice: ", text("text"));
                self.line(at, "notice", Paint::Yellow, &text)?;
            }
            Some(ItemKind::TurnStarted) if self.view.show_turns && self.view.timestamps => {
                self.line(at, "turn", Paint::Dim, "started")?;
            }
            Some(ItemKind::TurnEnded) => {
                let end = TurnEnd::from_data(data);
                self.flush_tools()?;
                if self.view.show_turns {
                    let text = if self.view.timestamps {
                        end.describe()
                    } else {
                        format!("-- turn {}", end.describe())
                    };
                    self.line(at, "turn", end.paint(), &text)?;
                }
                return Ok(Some(end));
            }
            // usage, config, available_commands, session_info, raw: for --json readers.
            _ => {}
        }
        Ok(None)
    }

    /// A `user_message` item, with its delivery when not a followup and its context lines.
    fn user_message(&mut self, at: &str, data: &Value) -> std::io::Result<()> {
        let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or_default();
        self.start(at, "user")?;
        if !self.view.timestamps {
            write!(self.out, "{}", self.style.paint(Paint::Bold, "> "))?;
            self.mid_line = true;
        }
        self.text(text("text"), Paint::Bold)?;
        let delivery = text("delivery");
        if !delivery.is_empty() && delivery != "followup" {
            let note = format!(" ({delivery})");
            write!(self.out, "{}", self.style.paint(Paint::Dim, &note))?;
        }
        if let Some(context) = data.get("context").and_then(Value::as_array) {
            for c in context.iter().filter_map(Value::as_str) {
                self.start(at, "context")?;
                if !self.view.timestamps {
                    write!(self.out, "{}", self.style.paint(Paint::Dim, "  + "))?;
                    self.mid_line = true;
                }
                self.text(c, Paint::Dim)?;
            }
        }
        // Whole when it arrives: end its line now, so a live reader sees it.
        self.break_line()
    }

    /// A `tool_call` item: counted, kept for its patches, and shown once it settles.
    fn tool_call(&mut self, seq: u64, dates: Dates<'_>, data: &Value) -> std::io::Result<()> {
        self.tool_count += 1;
        let status = data
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("pending")
            .to_string();
        let settled = matches!(status.as_str(), "completed" | "failed");
        let tool = Tool {
            title: tool_title(data),
            status,
            permission: data
                .get("permission")
                .and_then(Value::as_str)
                .map(str::to_string),
            at: dates.shown(settled).to_string(),
            printed: false,
        };
        self.tools.insert(seq, tool);
        self.tool_order.push(seq);
        self.settle_tool(seq, !self.view.live)
    }

    /// A `permission` item: the question while pending, else how it was answered.
    fn permission(&mut self, seq: u64, dates: Dates<'_>, data: &Value) -> std::io::Result<()> {
        let title = data
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or("a tool call")
            .to_string();
        self.permissions.insert(seq, title.clone());
        let pending = data.get("status").and_then(Value::as_str) == Some("pending");
        let text = if pending {
            self.permission_question(&title)
        } else {
            format!("permission for {title}: {}", permission_answer(data))
        };
        self.line(dates.shown(!pending), "perm", Paint::Yellow, &text)
    }

    /// A `plan` item: a heading, then one line per entry.
    fn plan(&mut self, at: &str, data: &Value) -> std::io::Result<()> {
        let text = self.labelled("plan:", "");
        self.line(at, "plan", Paint::Cyan, &text)?;
        let entries = data.get("entries").and_then(Value::as_array);
        for entry in entries.into_iter().flatten() {
            let status = entry.get("status").and_then(Value::as_str).unwrap_or("?");
            let content = entry.get("content").and_then(Value::as_str).unwrap_or("");
            let text = format!("  [{status}] {content}");
            self.continuation(&text, Paint::Cyan)?;
        }
        Ok(())
    }

    /// A change to item `seq`, made at `at`.
    fn patch(&mut self, seq: u64, at: &str, fields: &Value) -> std::io::Result<()> {
        if let Some(tool) = self.tools.get_mut(&seq) {
            if let Some(status) = fields.get("status").and_then(Value::as_str) {
                tool.status = status.to_string();
                tool.at = at.to_string();
            }
            if let Some(title) = fields.get("title").and_then(Value::as_str) {
                tool.title = title.to_string();
            }
            if let Some(permission) = fields.get("permission").and_then(Value::as_str) {
                tool.permission = Some(permission.to_string());
            }
            return self.settle_tool(seq, false);
        }
        if let Some(title) = self.permissions.get(&seq).cloned()
            && fields.get("status").and_then(Value::as_str) == Some("answered")
        {
            let answer = permission_answer(fields);
            self.line(
                at,
                "perm",
                Paint::Yellow,
                &format!("permission for {title}: {answer}"),
            )?;
        }
        Ok(())
    }

    /// Prints the tool call's line once it has settled (or now, if `force`).
    fn settle_tool(&mut self, seq: u64, force: bool) -> std::io::Result<()> {
        let Some(tool) = self.tools.get(&seq) else {
            return Ok(());
        };
        let settled = matches!(tool.status.as_str(), "completed" | "failed");
        if tool.printed || !(settled || force) {
            return Ok(());
        }
        let paint = match tool.status.as_str() {
            "completed" => Paint::Green,
            "failed" => Paint::Red,
            _ => Paint::Yellow,
        };
        let text = match &tool.permission {
            Some(refused) => format!("{} ({}: permission {refused})", tool.title, tool.status),
            None => format!("{} ({})", tool.title, tool.status),
        };
        let text = self.labelled("tool: ", &text);
        let at = tool.at.clone();
        if let Some(tool) = self.tools.get_mut(&seq) {
            tool.printed = true;
        }
        self.line(&at, "tool", paint, &text)
    }

    /// Prints the tool calls that never settled (their turn ended).
    fn flush_tools(&mut self) -> std::io::Result<()> {
        for seq in self.tool_order.clone() {
            self.settle_tool(seq, true)?;
        }
        Ok(())
    }

    /// `prefix` + `text` in a conversation; in the log view the label says it already.
    fn labelled(&self, prefix: &str, text: &str) -> String {
        if self.view.timestamps {
            text.to_string()
        } else {
            format!("{prefix}{text}")
        }
    }

    fn permission_question(&self, title: &str) -> String {
        format!(
            "permission requested: {title}\n  answer with: drover permit {} allow|deny [--always]",
            self.name
        )
    }

    /// Ends the current line, if any, so that a message on stderr starts a line of its own.
    pub fn end_line(&mut self) -> std::io::Result<()> {
        self.break_line()?;
        self.out.flush()
    }

    /// Ends the current line, if any.
    fn break_line(&mut self) -> std::io::Result<()> {
        if self.mid_line {
            writeln!(self.out)?;
            self.mid_line = false;
        }
        Ok(())
    }

    /// Starts an item: a fresh line, with time and label in log view.
    fn start(&mut self, at: &str, label: &str) -> std::io::Result<()> {
        self.break_line()?;
        if self.view.timestamps {
            let time = self.style.paint(Paint::Dim, &clock(at));
            write!(self.out, "{time} {label:<LABEL_WIDTH$} ")?;
            self.mid_line = true;
            self.indent = 8 + 1 + LABEL_WIDTH + 1;
        } else {
            self.indent = 0;
        }
        Ok(())
    }

    /// A whole item of one or more lines.
    fn line(&mut self, at: &str, label: &str, paint: Paint, text: &str) -> std::io::Result<()> {
        self.open = None;
        self.start(at, label)?;
        self.text(text, paint)?;
        self.break_line()
    }

    /// One more line of the current item.
    fn continuation(&mut self, text: &str, paint: Paint) -> std::io::Result<()> {
        self.break_line()?;
        self.text(text, paint)?;
        self.break_line()
    }

    /// Text of the current item; continuation lines are indented under it.
    fn text(&mut self, text: &str, paint: Paint) -> std::io::Result<()> {
        for (i, part) in text.split('\n').enumerate() {
            if i > 0 {
                writeln!(self.out)?;
                self.mid_line = false;
            }
            if part.is_empty() {
                continue;
            }
            if !self.mid_line {
                write!(self.out, "{}", " ".repeat(self.indent))?;
            }
            write!(self.out, "{}", self.style.paint(paint, part))?;
            self.mid_line = true;
        }
        Ok(())
    }

    /// Ends the output cleanly: the open line closed, unsettled tool calls shown.
    pub fn finish(&mut self) -> std::io::Result<()> {
        self.break_line()?;
        self.flush_tools()?;
        self.out.flush()
    }
}

fn tool_title(data: &Value) -> String {
    data.get("title")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            data.get("kind")
                .and_then(Value::as_str)
                .map(|k| format!("{k} tool"))
        })
        .unwrap_or_else(|| "tool call".to_string())
}

/// `allowed (allow_once)`, `denied (reject_always)`, `cancelled`.
fn permission_answer(fields: &Value) -> String {
    match fields.get("kind").and_then(Value::as_str) {
        Some(kind) if kind.starts_with("allow") => format!("allowed ({kind})"),
        Some(kind) if kind.starts_with("reject") => format!("denied ({kind})"),
        Some(kind) => format!("answered ({kind})"),
        None => match fields.pointer("/outcome/outcome").and_then(Value::as_str) {
            Some("cancelled") | None => "cancelled".to_string(),
            Some(other) => other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn render(view: View, updates: &[Value]) -> String {
        let mut out = Vec::new();
        {
            let mut r = Renderer::new(&mut out, Style { color: false }, view, "abc".into());
            for u in updates {
                r.notification(u).expect("render");
            }
            r.finish().expect("finish");
        }
        String::from_utf8(out).expect("utf8")
    }

    const LIVE: View = View {
        timestamps: false,
        show_user: false,
        show_turns: false,
        live: true,
    };
    /// `drover logs -t`: everything, dated.
    const LOG: View = View {
        timestamps: true,
        show_user: true,
        show_turns: true,
        live: false,
    };

    #[test]
    fn streams_text_and_settles_tool_calls_on_one_line() {
        let updates = [
            json!({"op": "item", "item": {"seq": 1, "at": "", "kind": "agent_message", "data": {"text": "hel"}}}),
            json!({"op": "append", "seq": 1, "field": "text", "text": "lo\nworld"}),
            json!({"op": "item", "item": {"seq": 2, "at": "", "kind": "tool_call", "data": {"title": "build", "status": "pending"}}}),
            json!({"op": "patch", "seq": 2, "fields": {"status": "completed"}}),
            json!({"op": "item", "item": {"seq": 3, "at": "", "kind": "turn_ended", "data": {"event": "turn_completed", "stopReason": "end_turn"}}}),
        ];
        assert_eq!(
            render(LIVE, &updates),
            "hello\nworld\ntool: build (completed)\n"
        );
    }

    #[test]
    fn a_limited_turn_says_the_providers_words_and_when_the_prompt_goes_again() {
        let limited = TurnEnd::from_data(&json!({
            "event": "turn_limited",
            "error": "exceeded retry limit, last status: 429 Too Many Requests",
            "retryAt": "2026-12-06T12:03:42Z",
        }));
        let described = limited.describe();
        assert!(
            described.starts_with(
                "limited: exceeded retry limit, last status: 429 Too Many Requests; the prompt goes again at "
            ) && described.ends_with(" (`drover retry` sends it now)"),
            "{described}"
        );
        assert!(!described.contains("--:--:--"), "{described}");
        let fell_back = TurnEnd::from_data(&json!({
            "event": "turn_limited",
            "error": "usage limit reached",
            "fallbackAgentId": "01a24b38-797e-750b-8d50-80a3a4997ce7",
        }));
        assert_eq!(
            fell_back.describe(),
            "limited: usage limit reached; the work goes on in agent \
             01a24b38-797e-750b-8d50-80a3a4997ce7"
        );
    }

    #[test]
    fn log_view_indents_continuations_under_the_label() {
        let updates = [
            json!({"op": "item", "item": {"seq": 1, "at": "bad", "kind": "agent_message", "data": {"text": "a\nb\n"}}}),
        ];
        assert_eq!(
            render(LOG, &updates),
            "--:--:-- agent    a\n                  b\n"
        );
    }

    /// NEWCOMER 12: a tool that settled and a permission answered seconds after they were
    /// asked are dated by the change, not by the request.
    #[test]
    fn the_log_dates_an_outcome_by_when_it_happened() {
        let asked = "2026-12-02T10:00:01Z";
        let answered = "2026-12-02T10:00:08Z";
        let (asked_clock, answered_clock) = (clock(asked), clock(answered));
        // Read back from the timeline: the items carry `updatedAt`.
        let history = [
            json!({"op": "item", "item": {"seq": 1, "at": asked, "updatedAt": answered, "kind": "permission", "data": {"title": "rm build", "status": "answered", "kind": "allow_once"}}}),
            json!({"op": "item", "item": {"seq": 2, "at": asked, "updatedAt": answered, "kind": "tool_call", "data": {"title": "rm build", "status": "completed"}}}),
        ];
        assert_eq!(
            render(LOG, &history),
            format!(
                "{answered_clock} perm     permission for rm build: allowed (allow_once)\n\
                 {answered_clock} tool     rm build (completed)\n"
            )
        );
        // Followed live: the patches carry their own time.
        let live = [
            json!({"op": "item", "item": {"seq": 1, "at": asked, "kind": "permission", "data": {"title": "rm build", "status": "pending"}}}),
            json!({"op": "item", "item": {"seq": 2, "at": asked, "kind": "tool_call", "data": {"title": "rm build", "status": "pending"}}}),
            json!({"op": "patch", "seq": 1, "at": answered, "fields": {"status": "answered", "kind": "allow_once"}}),
            json!({"op": "patch", "seq": 2, "at": answered, "fields": {"status": "completed"}}),
        ];
        let text = render(View { live: true, ..LOG }, &live);
        assert!(
            text.starts_with(&format!(
                "{asked_clock} perm     permission requested: rm build"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{answered_clock} perm     permission for rm build: allowed (allow_once)\n"
            )) && text.ends_with(&format!("{answered_clock} tool     rm build (completed)\n")),
            "{text}"
        );
    }

    #[test]
    fn shows_says_which_items_print() {
        let conversation = View {
            timestamps: false,
            ..LOG
        };
        for view in [LOG, conversation, LIVE] {
            for kind in ItemKind::ALL.iter().map(|k| k.as_str()).chain(["unknown"]) {
                let item = json!({"op": "item", "item": {"seq": 1, "at": "", "kind": kind, "data": {"text": "x", "status": "completed", "event": "turn_completed"}}});
                let printed = !render(view, &[item]).is_empty();
                assert_eq!(printed, view.shows(Some(kind)), "{kind} in {view:?}");
            }
        }
    }

    /// A tool call whose permission was denied says so, not only that it failed.
    #[test]
    fn a_denied_tool_call_says_why_it_did_not_run() {
        let view = View {
            timestamps: false,
            show_user: true,
            show_turns: true,
            live: true,
        };
        let live = [
            json!({"op": "item", "item": {"seq": 1, "at": "", "kind": "tool_call", "data": {"title": "rm -rf build", "status": "pending"}}}),
            json!({"op": "patch", "seq": 1, "at": "", "fields": {"status": "failed", "permission": "denied"}}),
        ];
        let text = render(view, &live);
        assert!(
            text.contains("rm -rf build (failed: permission denied)"),
            "{text}"
        );
    }

    #[test]
    fn turn_ends_read_well() {
        let end = TurnEnd::from_data(&json!({"event": "turn_failed", "error": "boom"}));
        assert_eq!(end.describe(), "failed: boom");
        assert!(!end.succeeded());
        let end = TurnEnd::from_data(&json!({"event": "turn_canceled", "cause": "user"}));
        assert_eq!(end.describe(), "canceled (user)");
        let end = TurnEnd::from_data(&json!({"event": "turn_interrupted", "cause": "crash"}));
        assert_eq!(end.describe(), "interrupted: the daemon stopped");
        assert!(!end.succeeded());
    }
}
