//! The subagents an agent runs itself, as its process reports them: claude's Task (or Agent)
//! tool calls, and ACP child sessions announced by `subagent_update`. They live inside the
//! agent's process, so drover only shows them (read-only) and counts the running ones as
//! `subagent` activity in archive admission; they end with the process.

use drover_protocol::{OwnSubagentInfo, SubagentVia};
use jiff::Timestamp;
use serde_json::{Map, Value};

/// At most this many ended ones are kept (the running ones always are).
const KEEP_ENDED: usize = 20;

/// Claude Code's tools that run a subagent, as claude-agent-acp names them in
/// `_meta.claudeCode.toolName`.
const TASK_TOOLS: [&str; 2] = ["Task", "Agent"];

#[derive(Debug, Default)]
pub(super) struct OwnSubagents {
    /// Oldest first.
    list: Vec<OwnSubagentInfo>,
}

impl OwnSubagents {
    pub(super) fn list(&self) -> &[OwnSubagentInfo] {
        &self.list
    }

    /// A `tool_call` or `tool_call_update`: a Task tool call starts one, its update ends it.
    /// True when the list changed.
    pub(super) fn tool_call(&mut self, fields: &Map<String, Value>) -> bool {
        let Some(id) = fields.get("toolCallId").and_then(Value::as_str) else {
            return false;
        };
        let status = fields.get("status").and_then(Value::as_str);
        if let Some(known) = self
            .list
            .iter_mut()
            .find(|s| s.via == SubagentVia::ToolCall && s.id == id)
        {
            let mut changed = false;
            if let Some(title) = fields.get("title").and_then(Value::as_str)
                && known.title != title
            {
                title.clone_into(&mut known.title);
                changed = true;
            }
            if let Some(state @ ("completed" | "failed")) = status
                && known.state == "running"
            {
                state.clone_into(&mut known.state);
                known.ended_at = Some(Timestamp::now().to_string());
                changed = true;
            }
            return changed;
        }
        let tool = fields
            .get("_meta")
            .and_then(|m| m.get("claudeCode"))
            .and_then(|c| c.get("toolName"))
            .and_then(Value::as_str);
        if !tool.is_some_and(|t| TASK_TOOLS.contains(&t)) {
            return false;
        }
        let ended = matches!(status, Some("completed" | "failed"));
        let now = Timestamp::now().to_string();
        self.add(OwnSubagentInfo {
            id: id.to_string(),
            title: fields
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or("Task")
                .to_string(),
            description: None,
            state: status.filter(|_| ended).unwrap_or("running").to_string(),
            via: SubagentVia::ToolCall,
            started_at: now.clone(),
            ended_at: ended.then_some(now),
            tool_calls: 0,
        });
        true
    }

    /// A `subagent_update` on the agent's own session: announces a child session or patches
    /// it (omitted fields stay, `null` clears). True when the list changed.
    pub(super) fn subagent_update(&mut self, update: &Value) -> bool {
        let Some(id) = update.get("sessionId").and_then(Value::as_str) else {
            return false;
        };
        let state = match update.get("state") {
            None => None,
            Some(Value::Null) => Some("unknown".to_string()),
            Some(state) => Some(
                state
                    .get("state")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string(),
            ),
        };
        let text = |name: &str| update.get(name).map(|v| v.as_str().map(str::to_string));
        let now = Timestamp::now().to_string();
        let known = self
            .list
            .iter()
            .position(|s| s.via == SubagentVia::SubagentUpdate && s.id == id);
        let index = if let Some(index) = known {
            index
        } else {
            self.add(OwnSubagentInfo {
                id: id.to_string(),
                title: "subagent".to_string(),
                description: None,
                state: "running".to_string(),
                via: SubagentVia::SubagentUpdate,
                started_at: now.clone(),
                ended_at: None,
                tool_calls: 0,
            });
            self.list.len() - 1
        };
        let child = &mut self.list[index];
        if let Some(Some(title)) = text("title") {
            child.title = title;
        }
        if let Some(description) = text("description") {
            child.description = description;
        }
        if let Some(state) = state {
            child.ended_at = (state != "running").then_some(now);
            child.state = state;
        }
        true
    }

    /// Whether `session` is one of the child sessions the agent announced.
    pub(super) fn is_child(&self, session: &str) -> bool {
        self.list
            .iter()
            .any(|s| s.via == SubagentVia::SubagentUpdate && s.id == session)
    }

    /// An update on a child session: counted on the child, not written to the agent's own
    /// timeline. True when the list changed.
    pub(super) fn child_update(&mut self, session: &str, update: &Value) -> bool {
        let new_call = update.get("sessionUpdate").and_then(Value::as_str) == Some("tool_call");
        match self
            .list
            .iter_mut()
            .find(|s| s.via == SubagentVia::SubagentUpdate && s.id == session)
        {
            Some(child) if new_call => {
                child.tool_calls += 1;
                true
            }
            _ => false,
        }
    }

    /// The turn ended: a Task tool call still running was cut with it (child sessions go on:
    /// they report their own state). True when the list changed.
    pub(super) fn turn_ended(&mut self) -> bool {
        let now = Timestamp::now().to_string();
        let mut changed = false;
        for cut in self
            .list
            .iter_mut()
            .filter(|s| s.via == SubagentVia::ToolCall && s.state == "running")
        {
            "interrupted".clone_into(&mut cut.state);
            cut.ended_at = Some(now.clone());
            changed = true;
        }
        changed
    }

    /// The process ended: so did every one of them.
    pub(super) fn clear(&mut self) -> bool {
        let had = !self.list.is_empty();
        self.list.clear();
        had
    }

    fn add(&mut self, info: OwnSubagentInfo) {
        self.list.push(info);
        let ended = self.list.iter().filter(|s| s.ended_at.is_some()).count();
        if ended > KEEP_ENDED
            && let Some(oldest) = self.list.iter().position(|s| s.ended_at.is_some())
        {
            self.list.remove(oldest);
        }
    }
}

/// Whether it still runs (archive admission's `subagent` activity).
pub(crate) fn running(subagent: &OwnSubagentInfo) -> bool {
    subagent.state == "running"
}
