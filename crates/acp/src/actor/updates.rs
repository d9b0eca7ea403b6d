//! What the agent reports (ACP `session/update`) as timeline items: streamed chunks coalesce
//! into one message or thought, tool calls and their updates merge into one item per
//! `toolCallId`, and every change is written, then announced to live clients.

use std::sync::atomic::{AtomicUsize, Ordering};

use drover_protocol::ItemKind;
use serde_json::{Map, Value, json};

use super::Actor;
use crate::{RuntimeManager, TimelineUpdate};

/// The longest a turn waits for the spend reported before it to be recorded.
const SPEND_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The spends an agent reported that are not recorded yet (see `Actor::spends_pending`).
#[derive(Debug, Default)]
pub(super) struct PendingSpends {
    count: AtomicUsize,
    done: tokio::sync::Notify,
}

impl PendingSpends {
    /// Waits until none is pending, or [`SPEND_WAIT`] passed.
    async fn recorded(&self) {
        let deadline = tokio::time::Instant::now() + SPEND_WAIT;
        loop {
            let done = self.done.notified();
            if self.count.load(Ordering::SeqCst) == 0
                || tokio::time::timeout_at(deadline, done).await.is_err()
            {
                return;
            }
        }
    }
}

impl Actor {
    pub(super) fn on_update(&mut self, update: Value) {
        let Some(kind) = update.get("sessionUpdate").and_then(Value::as_str) else {
            self.push(ItemKind::Raw, json!({"update": update}));
            return;
        };
        match kind {
            "agent_message_chunk" => self.chunk(ItemKind::AgentMessage, &update),
            "agent_thought_chunk" => self.chunk(ItemKind::AgentThought, &update),
            "user_message_chunk" => self.chunk(ItemKind::UserMessage, &update),
            "tool_call" | "tool_call_update" => {
                let fields = strip_kind(update);
                if self.own_subagents.tool_call(&fields) {
                    self.publish_session();
                }
                self.merge_tool_call(fields);
            }
            "subagent_update" => {
                if self.own_subagents.subagent_update(&update) {
                    self.publish_session();
                }
            }
            "plan" => {
                self.push(ItemKind::Plan, json!({"entries": update.get("entries")}));
            }
            "current_mode_update" => self.mode_changed(&update),
            "config_option_update" => {
                if let (Some(options), Some(live)) = (
                    update.get("configOptions").filter(|o| o.is_array()),
                    self.live.as_mut(),
                ) {
                    live.config_options = Some(options.clone());
                }
                self.publish_session();
                self.push(ItemKind::Config, Value::Object(strip_kind(update)));
            }
            "usage_update" => {
                self.cost_reported(&update);
                self.push(ItemKind::Usage, Value::Object(strip_kind(update)));
            }
            "available_commands_update" => {
                self.push(
                    ItemKind::AvailableCommands,
                    Value::Object(strip_kind(update)),
                );
            }
            "session_info_update" => {
                self.push(ItemKind::SessionInfo, Value::Object(strip_kind(update)));
            }
            _ => {
                self.push(ItemKind::Raw, json!({"update": update}));
            }
        }
    }

    /// A `usage_update`'s `cost` (the session's running total, as the agent keeps it): what
    /// it adds is spent.
    fn cost_reported(&mut self, update: &Value) {
        let Some(amount) = update.pointer("/cost/amount").and_then(Value::as_f64) else {
            return;
        };
        let currency = update
            .pointer("/cost/currency")
            .and_then(Value::as_str)
            .unwrap_or("USD")
            .to_string();
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let spent = if amount >= live.reported_cost {
            amount - live.reported_cost
        } else {
            amount
        };
        live.reported_cost = amount;
        if spent > 0.0 || !self.spend_known(|s| s.cost.is_some()) {
            self.record_spend(None, Some((spent.max(0.0), currency)));
        }
    }

    /// The running total of tokens a prompt's answer carries (`usage.totalTokens`): what it
    /// adds is spent.
    pub(super) fn tokens_reported(&mut self, answer: &Value) {
        let Some(total) = answer.pointer("/usage/totalTokens").and_then(Value::as_u64) else {
            return;
        };
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let spent = total.checked_sub(live.reported_tokens).unwrap_or(total);
        live.reported_tokens = total;
        if spent > 0 || !self.spend_known(|s| s.tokens.is_some()) {
            self.record_spend(Some(spent), None);
        }
    }

    /// Whether the record already knows this kind of spend (a first report of zero is
    /// recorded: the agent reports it, and spent nothing yet).
    fn spend_known(&self, known: impl Fn(&drover_core::Spend) -> bool) -> bool {
        self.shared
            .registry
            .get(self.id)
            .is_some_and(|a| known(&a.spend))
    }

    /// Records what the agent spent; when that spends a hard budget of its lineage, every
    /// turn running in the budgeted tree is cancelled (cause `budget`, queued messages kept).
    fn record_spend(&mut self, tokens: Option<u64>, cost: Option<(f64, String)>) {
        let shared = self.shared.clone();
        let id = self.id;
        let earlier = self.spends.take();
        let pending = self.spends_pending.clone();
        pending.count.fetch_add(1, Ordering::SeqCst);
        self.spends = Some(tokio::spawn(async move {
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            let added = shared.registry.add_spend(id, tokens, cost).await;
            pending.count.fetch_sub(1, Ordering::SeqCst);
            pending.done.notify_waiters();
            if let Err(e) = added {
                tracing::warn!(agent = %id, error = %e, "cannot record what the agent spent");
                return;
            }
            // The cancel may ask this agent's own task, which may be waiting for the writes
            // chained after this one: it runs on its own, and nothing waits for it.
            tokio::spawn(async move {
                RuntimeManager { shared }.cancel_for_hard_budgets(id).await;
            });
        }));
    }

    /// Waits (bounded) until what the agent reported spending is recorded: the budget a turn
    /// is checked against counts the turns before it. Only the registry's writes are waited
    /// for (each chained on the one before), never a hard budget's cancel (which may ask this
    /// agent's own task, and runs apart from the chain).
    pub(super) fn spends_recorded(&self) -> impl Future<Output = ()> + Send + 'static {
        let pending = self.spends_pending.clone();
        async move { pending.recorded().await }
    }

    fn mode_changed(&mut self, update: &Value) {
        let mode = update.get("currentModeId").cloned();
        self.push(ItemKind::Mode, json!({"modeId": mode}));
        if let (Some(mode), Some(live)) = (
            mode.and_then(|m| m.as_str().map(str::to_string)),
            self.live.as_mut(),
        ) && let Some(modes) = live.modes.as_mut()
        {
            modes["currentModeId"] = json!(mode);
        }
        self.publish_session();
    }

    fn chunk(&mut self, kind: ItemKind, update: &Value) {
        let content = update.get("content").cloned().unwrap_or(Value::Null);
        let Some(text) = content.get("text").and_then(Value::as_str) else {
            // Images, resources: their own item.
            self.push(kind, json!({"content": content}));
            self.open_chunk = None;
            return;
        };
        if kind != ItemKind::UserMessage {
            self.shared
                .metrics
                .streamed(kind == ItemKind::AgentThought, text.len());
        }
        match self.open_chunk {
            Some((open, seq)) if open == kind => {
                if let Err(e) = self.timeline.append_text(seq, "text", text) {
                    tracing::error!(agent = %self.id, error = %e, "cannot append to the timeline");
                    return;
                }
                self.shared.emit(
                    self.id,
                    self.timeline.revision(),
                    TimelineUpdate::Append {
                        seq,
                        field: "text".to_string(),
                        text: text.to_string(),
                    },
                );
            }
            _ => {
                let text = text.to_string();
                if let Some(seq) = self.push(kind, json!({"text": text})) {
                    self.open_chunk = Some((kind, seq));
                }
            }
        }
    }

    pub(super) fn close_chunk(&mut self) {
        self.open_chunk = None;
    }

    /// `tool_call`, `tool_call_update`, and the tool call of a permission request all merge
    /// into one item per `toolCallId`.
    pub(super) fn merge_tool_call(&mut self, fields: Map<String, Value>) -> Option<u64> {
        let call_id = fields
            .get("toolCallId")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(seq) = call_id
            .as_ref()
            .and_then(|c| self.tool_calls.get(c))
            .copied()
        {
            self.close_chunk();
            let at = self
                .timeline
                .patch(seq, fields.clone())
                .unwrap_or_else(|e| {
                    tracing::error!(agent = %self.id, error = %e, "cannot update the timeline");
                    None
                });
            self.shared.emit(
                self.id,
                self.timeline.revision(),
                TimelineUpdate::Patch { seq, fields, at },
            );
            Some(seq)
        } else {
            let seq = self.push(ItemKind::ToolCall, Value::Object(fields))?;
            if let Some(call) = call_id {
                self.tool_calls.insert(call, seq);
            }
            Some(seq)
        }
    }

    /// Appends an item (logging a failed write: the timeline is a record, not a reason to
    /// break the agent) and announces it.
    pub(super) fn push(&mut self, kind: ItemKind, data: Value) -> Option<u64> {
        let streams = matches!(
            kind,
            ItemKind::AgentMessage | ItemKind::AgentThought | ItemKind::UserMessage
        );
        if !streams || self.open_chunk.is_some() {
            self.open_chunk = None;
        }
        let data = match data {
            Value::Object(map) => map,
            other => {
                let mut map = Map::new();
                map.insert("value".to_string(), other);
                map
            }
        };
        let event = (kind == ItemKind::TurnEnded).then(|| {
            data.get("event")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        });
        let seq = match self.timeline.push(kind.as_str(), data) {
            Ok(item) => {
                let seq = item.seq;
                self.shared.emit(
                    self.id,
                    self.timeline.revision(),
                    TimelineUpdate::Item { item },
                );
                Some(seq)
            }
            Err(e) => {
                tracing::error!(agent = %self.id, error = %e, "cannot write the timeline");
                None
            }
        };
        if kind == ItemKind::TurnStarted {
            self.shared.metrics.turn_started();
            self.turn_clock = Some((seq, std::time::Instant::now()));
            tracing::info!(agent = %self.id, turn = seq, "turn started");
        } else if let Some(event) = event {
            self.turn_ended(&event);
        }
        seq
    }

    /// Counts a turn's end and logs it: one line per turn, with its outcome and how long it
    /// ran (`turn` is the seq of its `turn_started`; a turn the gate blocked has neither).
    fn turn_ended(&mut self, event: &str) {
        let clock = self.turn_clock.take();
        let ran = clock.map(|(_, at)| at.elapsed());
        let outcome = self.shared.metrics.turn_ended(event, ran);
        let duration_ms = ran.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        tracing::info!(agent = %self.id, turn = clock.and_then(|(seq, _)| seq), outcome, duration_ms,
            "turn ended");
    }

    pub(super) fn patch(&mut self, seq: u64, fields: Map<String, Value>) {
        let at = match self.timeline.patch(seq, fields.clone()) {
            Ok(at) => at,
            Err(e) => {
                tracing::error!(agent = %self.id, error = %e, "cannot update the timeline");
                return;
            }
        };
        self.shared.emit(
            self.id,
            self.timeline.revision(),
            TimelineUpdate::Patch { seq, fields, at },
        );
    }
}

/// The update's fields without its `sessionUpdate` tag.
fn strip_kind(update: Value) -> Map<String, Value> {
    let mut map = match update {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    map.remove("sessionUpdate");
    map
}

#[cfg(test)]
mod tests {
    use drover_protocol::ItemKind;

    #[test]
    fn every_kind_is_written_and_read_as_its_name() {
        for &kind in ItemKind::ALL {
            let json = serde_json::to_value(kind).expect("serialize");
            assert_eq!(json, kind.as_str(), "{kind:?}");
            assert_eq!(ItemKind::parse(kind.as_str()), Some(kind));
            let back: ItemKind = serde_json::from_value(json).expect("deserialize");
            assert_eq!(back, kind);
        }
        assert_eq!(ItemKind::parse("a_kind_from_the_future"), None);
    }
}
