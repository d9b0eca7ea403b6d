//! Turns: starting one from the inbox (through the registry's turn gate), cancelling it,
//! ending it, and telling whoever asked (notifyOnFinish) how it went.
//!
//! A turn's end is recorded in the registry before anyone is told, so an agent woken by the
//! notice finds this one idle; the notice itself is delivered by a task of its own, so a busy
//! target never holds up this agent's loop.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_core::inbox::{Claim, Delivery, InboxMessage};
use drover_core::{
    AgentId, AgentStatus, BoxFuture, CancelCause, RegistryError, TurnOutcome, store::StoreError,
};
use drover_protocol::{ItemKind, TurnEnd};
use serde_json::{Value, json};

use super::Actor;
use crate::rpc::RpcError;
use crate::{AcpError, RuntimeManager, Shared, TimelineUpdate};

/// How long a notice may wait to be queued for its target.
const NOTICE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest excerpt of a reply quoted in a notice, in characters.
const NOTICE_REPLY_CHARS: usize = 4000;

/// claude-agent-acp 0.23 keeps a `session/cancel` that reached a turn and ends the next prompt
/// at once (a few ms) with an empty `end_turn` (upstream agentclientprotocol/claude-agent-acp
/// #551), so a steer lost its reply. A prompt right after a cancel, answered `end_turn` within
/// this window without a single update, is sent once more: nothing of it reached the user or
/// did anything, and no real model answers that fast.
const STALE_CANCEL_WINDOW: Duration = Duration::from_millis(250);

/// What the first prompt of a new session starts with when the agent's earlier conversation
/// could not be loaded (a restart or a hibernation of an agent that cannot load sessions).
pub(super) const CONTEXT_LOST: &str = "[drover] Earlier context of this conversation was not restored: your process was restarted and could not load its previous session. Ask the user for anything you need from before.";

pub(super) struct Turn {
    pub(super) response: BoxFuture<'static, Result<Value, RpcError>>,
    pub(super) cancel: Option<CancelCause>,
    /// Who asked to hear how this turn goes (notifyOnFinish).
    pub(super) notify: Option<AgentId>,
    /// The timeline seq of this turn's `turn_started`.
    started_seq: u64,
    /// The `session/prompt` params, for the one resend of [`STALE_CANCEL_WINDOW`].
    prompt: Value,
    sent: Instant,
    /// The prompt follows a `session/cancel` on the same session.
    after_cancel: bool,
    /// The agent sent a `session/update` during this turn.
    pub(super) updated: bool,
    resent: bool,
    /// What the prompt carried, queued again if the turn hits a usage limit.
    claim: Claim,
}

/// Labels an agent that took over another's work on a usage limit: the agent it took over from.
pub const FALLBACK_LABEL: &str = "drover.fallback-of";

/// How much of the conversation a fallback agent's first prompt quotes, in characters.
const FALLBACK_HISTORY_CHARS: usize = 12_000;

/// The longest single message it quotes (its end), in characters.
const FALLBACK_MESSAGE_CHARS: usize = 3_000;

/// The longest wait for a usage limit without a reset time (the backoff doubles up to it).
const MAX_LIMIT_BACKOFF: Duration = Duration::from_secs(3600);

/// When a wait for a usage limit that ends at `retry_at` is over, on the runtime's clock
/// (`None`: it is over).
pub(super) fn limit_deadline(retry_at: jiff::Timestamp) -> Option<tokio::time::Instant> {
    let left = retry_at.duration_since(jiff::Timestamp::now());
    let left = Duration::try_from(left).ok().filter(|d| !d.is_zero())?;
    Some(tokio::time::Instant::now() + left)
}

/// Wakes agent `id` at `at` (a hibernated agent that waits for a usage limit): its next task
/// finds the wait over and sends the prompt.
pub(super) fn wake_at(shared: Arc<Shared>, id: AgentId, at: tokio::time::Instant) {
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        let manager = RuntimeManager { shared };
        if manager
            .shared
            .registry
            .get(id)
            .is_some_and(|a| a.limited.is_some())
            && let Ok(handle) = manager.handle(id).await
        {
            let _ = handle.commands.send(super::Command::Wake).await;
        }
    });
}

impl Actor {
    /// Starts a turn with the next message, if one wakes the agent and the gate lets it.
    pub(super) async fn maybe_start_turn(&mut self) {
        if self.turn.is_some() || !self.wake_pending() {
            return;
        }
        if self.archived() {
            // Archive wins over what was queued before it: it never runs.
            self.discard_archived_inbox(false);
            return;
        }
        let registry = self.shared.registry.clone();
        if let Err(e) = registry.check_turn_gate(self.id) {
            self.block_next(&e);
            return;
        }
        // What the turns before spent counts: recorded first.
        self.spends_recorded().await;
        if let Some(spent) = registry.spent_budget(self.id) {
            self.hold_for_budget(&spent);
            return;
        }
        self.restart_for_new_settings().await;
        if !self.ensure_live().await {
            return;
        }
        let Some(claim) = self.inbox.next() else {
            return;
        };
        if registry
            .get(self.id)
            .is_some_and(|a| a.status == AgentStatus::Running)
        {
            // No turn runs here, yet the record says one does: the end of the last one could
            // not be written (a full disk). Write it now, or the next turn cannot start.
            let outcome = TurnOutcome::Failed {
                error: "the end of the previous turn could not be recorded".to_string(),
            };
            if let Err(e) = registry.record_turn_end(self.id, outcome).await {
                tracing::error!(agent = %self.id, error = %e, "cannot start a turn; its message stays queued");
                self.start_failed = true;
                return;
            }
        }
        // Stamped before the turn gate below: a turn that passed it before an archive is
        // recorded as starting before it.
        let at = jiff::Timestamp::now();
        // Entering `running` passes the turn gate atomically with any archive: once this
        // succeeds no archive came first; if it fails, nothing of the message is recorded.
        if let Err(e) = registry
            .set_status(self.id, AgentStatus::Running, None)
            .await
        {
            if matches!(e, RegistryError::Store(_)) {
                tracing::error!(agent = %self.id, error = %e, "cannot start a turn; its message stays queued");
                self.start_failed = true;
            } else {
                self.block_next(&e);
            }
            return;
        }
        // The commit point of a delivery: the `user_message`, fsynced. Until it is written the
        // message stays queued (a crash or a full disk loses nothing); once it is, the message
        // is never sent again (the inbox settles against the timeline when it opens).
        if let Err(e) = self.record_user_message(&claim, at) {
            tracing::error!(agent = %self.id, error = %e, "cannot record the next message; it stays queued");
            self.start_failed = true;
            let outcome = TurnOutcome::Failed {
                error: format!("the message could not be recorded: {e}"),
            };
            if let Err(e) = registry.record_turn_end(self.id, outcome).await {
                tracing::warn!(agent = %self.id, error = %e, "cannot record the end of a turn that did not start");
            }
            return;
        }
        self.take(&claim);
        let started_seq = self
            .push(
                ItemKind::TurnStarted,
                json!({"messageId": claim.message.id}),
            )
            .unwrap_or_default();
        let mut text = claim.prompt_text();
        if std::mem::take(&mut self.context_lost) {
            text = format!("{CONTEXT_LOST}\n\n{text}");
        }
        let Some(live) = &mut self.live else { return };
        let prompt = json!({
            "sessionId": live.session_id,
            "prompt": [{"type": "text", "text": text}],
        });
        let request = live.rpc.request("session/prompt", prompt.clone());
        self.turn = Some(Turn {
            response: Box::pin(request),
            cancel: None,
            notify: claim.message.notify,
            started_seq,
            prompt,
            sent: Instant::now(),
            after_cancel: std::mem::take(&mut live.cancel_sent),
            updated: false,
            resent: false,
            claim,
        });
    }

    /// Something queued would wake the agent: no turn runs or waits, its start did not
    /// fail, no usage limit and no spent budget holds it.
    pub(super) fn wake_pending(&self) -> bool {
        self.inbox.has_wake()
            && !self.start_failed
            && self.limit_wait.is_none()
            && !self.budget_held
    }

    /// A budget of the lineage is spent: what is queued stays queued (durably, in the inbox)
    /// until the budget is raised, and the timeline says so once.
    fn hold_for_budget(&mut self, spent: &drover_core::SpentBudget) {
        self.budget_held = true;
        let waiting = self.inbox.pending().filter(|m| m.delivery.wakes()).count();
        let whose = if spent.agent == self.id {
            "its".to_string()
        } else {
            format!("agent `{}`'s", spent.agent)
        };
        tracing::info!(agent = %self.id, budgeted = %spent.agent, waiting, "a spent budget holds the queued messages");
        self.push(
            ItemKind::Notice,
            json!({"text": format!("{waiting} queued message(s) wait: {whose} budget is spent; raising it delivers them")}),
        );
    }

    /// The gate refused: the message that would have started the turn is taken, the turn ends
    /// `blocked`, and no prompt reaches the agent.
    fn block_next(&mut self, reason: &RegistryError) {
        if self.archived() {
            // The agent itself was archived meanwhile: archive wins, nothing is recorded.
            self.discard_archived_inbox(false);
            return;
        }
        let Some(claim) = self.inbox.next() else {
            self.start_failed = true;
            return;
        };
        if let Err(e) = self.record_user_message(&claim, jiff::Timestamp::now()) {
            tracing::error!(agent = %self.id, error = %e, "cannot record the next message; it stays queued");
            self.start_failed = true;
            return;
        }
        self.take(&claim);
        self.push(
            ItemKind::TurnEnded,
            json!({"event": TurnEnd::Blocked, "reason": reason.to_string()}),
        );
    }

    /// Marks a recorded claim claimed in the inbox. A failure loses nothing: the timeline
    /// holds the message, and the inbox settles against it when it next opens.
    fn take(&mut self, claim: &Claim) {
        if let Err(e) = self.inbox.take(claim) {
            tracing::warn!(agent = %self.id, error = %e, "cannot mark a delivered message claimed; the inbox settles it when it next opens");
        }
    }

    /// Records the message a turn starts with as a `user_message` stamped `at`, fsynced.
    fn record_user_message(
        &mut self,
        claim: &Claim,
        at: jiff::Timestamp,
    ) -> Result<(), StoreError> {
        self.close_chunk();
        let context: Vec<&str> = claim.context.iter().map(|c| c.text.as_str()).collect();
        let context_ids: Vec<&str> = claim.context.iter().map(|c| c.id.as_str()).collect();
        let data = json!({
            "text": claim.message.text,
            "context": context,
            "contextIds": context_ids,
            "messageId": claim.message.id,
            "delivery": claim.message.delivery,
            "source": claim.message.source,
        });
        // An object literal: never the default.
        let mut data = match data {
            Value::Object(data) => data,
            _ => serde_json::Map::new(),
        };
        // Who hears how the turn goes: a turn a restart cuts off passes it on to the followup
        // that continues it (see `Registry::open_with`).
        if let Some(notify) = claim.message.notify {
            data.insert("notify".to_string(), json!(notify.to_string()));
        }
        let item = self
            .timeline
            .push_synced(ItemKind::UserMessage.as_str(), data, at)?;
        // The jobs this turn starts inherit its depth (the self-wake cap).
        self.shared
            .jobs
            .turn_started(self.id, &claim.message.source);
        self.shared.emit(
            self.id,
            self.timeline.revision(),
            TimelineUpdate::Item { item },
        );
        Ok(())
    }

    /// Cancels the running turn; without `keep_inbox` the queued messages go too.
    pub(super) async fn cancel(
        &mut self,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> Result<(), AcpError> {
        if !keep_inbox {
            let dropped = self.inbox.discard_all()?;
            if !dropped.is_empty() {
                self.push(
                    ItemKind::Notice,
                    json!({"text": format!("{} queued message(s) dropped ({cause})", dropped.len())}),
                );
            }
            // The prompt that waited for a usage limit went with them: nothing waits now.
            if self.limit_wait.take().is_some()
                && let Err(e) = self.shared.registry.clear_limited(self.id).await
            {
                tracing::warn!(agent = %self.id, error = %e, "cannot record the end of a usage limit's wait");
            }
        }
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        if turn.cancel.is_none() {
            turn.cancel = Some(cause);
            if let Some(live) = &mut self.live {
                live.cancel_sent = true;
                live.rpc
                    .notify("session/cancel", json!({"sessionId": live.session_id}))
                    .await;
            }
        }
        // Every pending permission is answered `cancelled` (the agent must not wait on them).
        self.resolve_all_permissions().await;
        Ok(())
    }

    /// The agent answered `session/prompt`.
    pub(super) async fn finish_turn(&mut self, result: Result<Value, RpcError>) {
        if matches!(result, Err(RpcError::Closed { .. })) {
            // The process went away mid-turn.
            self.on_exit().await;
            return;
        }
        // Updates the agent sent before its answer are already queued: take them first.
        self.drain_incoming().await;
        if self.resend_stale_cancel(&result) {
            return;
        }
        let Some(turn) = self.turn.take() else { return };
        self.close_chunk();
        let turn = match &result {
            Err(e) if turn.cancel.is_none() => match self.limit_hit(&e.to_string()) {
                Some((hit, fallback)) => {
                    // A fallback that cannot be made waits for the limit instead.
                    let turn = match fallback {
                        Some(to) => match self.fall_back(turn, e.to_string(), &to).await {
                            Ok(()) => return,
                            Err(turn) => *turn,
                        },
                        None => turn,
                    };
                    match self.wait_for_limit(turn, e.to_string(), hit).await {
                        Ok(()) => return,
                        Err(turn) => *turn,
                    }
                }
                None => turn,
            },
            _ => turn,
        };
        self.limit_count = 0;
        if let Ok(answer) = &result {
            self.tokens_reported(answer);
        }
        let outcome = match &result {
            Ok(value) => match value.get("stopReason").and_then(Value::as_str) {
                Some("cancelled") => TurnOutcome::Canceled,
                _ => TurnOutcome::Completed,
            },
            Err(e) => {
                let mut error = e.to_string();
                let provider = self.shared.registry.get(self.id).map(|a| a.provider);
                if let Some(hint) =
                    provider.and_then(|provider| crate::refused_key::hint(&error, &provider))
                {
                    error = format!("{error}; {hint}");
                }
                TurnOutcome::Failed { error }
            }
        };
        let mut data = json!({"event": outcome.event_name()});
        if let Ok(value) = &result
            && let Some(reason) = value.get("stopReason")
        {
            data["stopReason"] = reason.clone();
        }
        if let TurnOutcome::Failed { error } = &outcome {
            data["error"] = json!(error);
        }
        if let Some(cause) = turn.cancel {
            data["cause"] = json!(cause.to_string());
        }
        self.end_turn(turn, outcome, data).await;
    }

    /// Whether `error` is the provider's usage limit and the agent waits for those or falls
    /// back to another provider (`on_limit`: its own, else its provider's, else `wait`), and
    /// the provider it falls back to.
    fn limit_hit(&self, error: &str) -> Option<(crate::limits::LimitHit, Option<String>)> {
        let agent = self.shared.registry.get(self.id)?;
        let providers = self.shared.providers.current().ok();
        let provider = providers.as_ref().and_then(|p| p.get(&agent.provider));
        let (policy, fallback) = match agent.config.on_limit {
            Some(own) => (own, None),
            None => (
                provider.and_then(|p| p.on_limit).unwrap_or_default(),
                provider.and_then(|p| p.limit_fallback.clone()),
            ),
        };
        if fallback.is_none() && policy != drover_core::OnLimit::Wait {
            return None;
        }
        let hit = crate::limits::recognize(error, &jiff::ZonedDateTime::now())?;
        Some((hit, fallback))
    }

    /// The turn hit the provider's usage limit and its provider falls back to `to`: the same
    /// work starts there as a new agent, a subagent of this one (in its track, under its budget
    /// and its archive), whose first prompt is what this agent's timeline holds of its
    /// conversation and the prompt that failed. The new agent never falls back again (its
    /// `on_limit` is `wait`). This turn ends `turn_limited` with `fallbackAgentId`, nothing
    /// waits here, and whoever asked to hear how the turn goes is told where the work went
    /// and hears when the new agent's turn ends. Gives the turn back (it then waits for the
    /// limit) when the new agent cannot be made: a spent budget, an unavailable provider.
    async fn fall_back(&mut self, turn: Turn, error: String, to: &str) -> Result<(), Box<Turn>> {
        let registry = self.shared.registry.clone();
        let Some(agent) = registry.get(self.id) else {
            return Err(Box::new(turn));
        };
        if let Some(spent) = registry.spent_budget(self.id) {
            tracing::info!(agent = %self.id, budgeted = %spent.agent, "a spent budget makes no fallback agent; the prompt waits for the limit");
            return Err(Box::new(turn));
        }
        let prompt = self.fallback_prompt(&agent, &turn, &error);
        let name = agent
            .title
            .clone()
            .unwrap_or_else(|| format!("agent {}", self.id));
        let mut new = drover_core::NewAgent {
            provider: to.to_string(),
            cwd: agent.cwd.clone(),
            workspace_id: Some(agent.workspace_id),
            title: Some(format!("{name} (on {to})")),
            labels: std::collections::BTreeMap::from([(
                FALLBACK_LABEL.to_string(),
                self.id.to_string(),
            )]),
            parent: Some(self.id),
            upstream: None,
            auto_archive: false,
            config: drover_core::ProviderConfig {
                permission_policy: agent.config.permission_policy,
                on_interrupt: agent.config.on_interrupt,
                on_limit: Some(drover_core::OnLimit::Wait),
                ..Default::default()
            },
            budget: None,
            upstream_budgets: Vec::new(),
        };
        let manager = RuntimeManager {
            shared: self.shared.clone(),
        };
        let created = match manager.prepare(&mut new) {
            Ok(()) => registry.create_agent(new).await.map_err(AcpError::from),
            Err(e) => Err(e),
        };
        let created = match created {
            Ok(created) => created,
            Err(e) => {
                tracing::warn!(agent = %self.id, provider = to, error = %e, "cannot fall back to another provider; the prompt waits for the limit");
                return Err(Box::new(turn));
            }
        };
        if let Err(e) = manager
            .start_new(&created, Some(prompt), "system".to_string(), turn.notify)
            .await
        {
            // The new agent stays, idle, in the track; this one waits for the limit.
            tracing::warn!(agent = %self.id, fallback = %created.id, error = %e, "cannot queue the fallback agent's prompt; the prompt waits for the limit");
            return Err(Box::new(turn));
        }
        tracing::info!(agent = %self.id, fallback = %created.id, provider = to, "the turn hit the provider's usage limit; the work goes on another provider");
        self.limit_count = 0;
        self.push(
            ItemKind::TurnEnded,
            json!({"event": "turn_limited", "error": error, "fallbackAgentId": created.id.to_string(), "fallbackProvider": to}),
        );
        let _ = self.timeline.sync();
        self.resolve_all_permissions().await;
        if let Err(e) = registry.record_turn_handed_off(self.id).await {
            tracing::warn!(agent = %self.id, error = %e, "cannot record the end of a turn handed to another provider");
        }
        if let Some(target) = turn.notify {
            let text = format!(
                "[drover] {}: its turn stopped on its provider's usage limit ({error}). The work goes on on `{to}` as agent \"{name} (on {to})\" ({}); you will hear when its turn ends.",
                self.name(),
                created.id,
            );
            self.tell_as(target, text, Delivery::Inject);
        }
        Ok(())
    }

    /// The first prompt of the agent that takes the work over: what this agent's timeline
    /// holds of its conversation (the latest messages, up to [`FALLBACK_HISTORY_CHARS`],
    /// quoted), and the prompt that hit the limit, as it was sent.
    fn fallback_prompt(&self, agent: &drover_core::Agent, turn: &Turn, error: &str) -> String {
        let mut said = Vec::new();
        for item in self.timeline.items() {
            let who = if item.is(ItemKind::UserMessage) {
                if item.data.get("messageId").and_then(Value::as_str)
                    == Some(turn.claim.message.id.as_str())
                {
                    continue;
                }
                "User"
            } else if item.is(ItemKind::AgentMessage) {
                "Agent"
            } else {
                continue;
            };
            let text = item
                .data
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim();
            if text.is_empty() {
                continue;
            }
            // The end of a long message: what it came to.
            let skip = text.chars().count().saturating_sub(FALLBACK_MESSAGE_CHARS);
            let text: String = text.chars().skip(skip).collect();
            let quoted: Vec<String> = text.lines().map(|l| format!("> {l}")).collect();
            let cut = if skip > 0 { "> …\n" } else { "" };
            said.push(format!("{who}:\n{cut}{}", quoted.join("\n")));
        }
        let mut kept = Vec::new();
        let mut size = 0;
        for message in said.iter().rev() {
            size += message.len();
            if size > FALLBACK_HISTORY_CHARS {
                break;
            }
            kept.push(message.as_str());
        }
        kept.reverse();
        let name = agent.title.as_ref().map_or_else(
            || format!("agent {}", self.id),
            |t| format!("agent \"{t}\" ({})", self.id),
        );
        let mut text = format!(
            "[drover] You take over the work of {name}, which runs on `{}`: its turn stopped on that provider's usage limit ({error}). You work in the same directory.",
            agent.provider
        );
        if !kept.is_empty() {
            let left = said.len() - kept.len();
            let earlier = if left > 0 {
                format!(" ({left} earlier message(s) left out)")
            } else {
                String::new()
            };
            let _ = write!(
                text,
                "\n\nIts conversation so far{earlier}, most recent last:\n\n{}",
                kept.join("\n\n")
            );
        }
        let _ = write!(
            text,
            "\n\nThe request it was working on, now yours:\n\n{}",
            turn.claim.prompt_text()
        );
        text
    }

    /// The turn hit the provider's usage limit: its prompt is queued again, first (durably,
    /// before anything else is recorded: a crash from here on sends it once, at the latest at
    /// the next boot), the turn ends `turn_limited`, the agent waits (`limited`, attention
    /// `limited`) until the reset time the agent gave (else the backoff: the provider's
    /// `limit_backoff`, doubling with each limit in a row up to an hour), and whoever asked to
    /// hear how the turn goes is told why it waits, as context (it does not wake them), and
    /// hears once when the turn that follows ends. Gives the turn back when the prompt cannot
    /// be queued: it fails as any other.
    async fn wait_for_limit(
        &mut self,
        turn: Turn,
        error: String,
        hit: crate::limits::LimitHit,
    ) -> Result<(), Box<Turn>> {
        let now = jiff::Timestamp::now();
        let count = self.limit_count.saturating_add(1);
        let retry_at = if let Some(reset) = hit.reset_at {
            reset.max(now + jiff::SignedDuration::from_secs(1))
        } else {
            let first = self
                .shared
                .registry
                .get(self.id)
                .and_then(|a| {
                    self.shared
                        .providers
                        .current()
                        .ok()?
                        .get(&a.provider)?
                        .limit_backoff
                })
                .unwrap_or(crate::providers::DEFAULT_LIMIT_BACKOFF);
            let wait = first
                .saturating_mul(1 << count.saturating_sub(1).min(16))
                .min(MAX_LIMIT_BACKOFF.max(first));
            now + jiff::SignedDuration::try_from(wait)
                .unwrap_or(jiff::SignedDuration::from_hours(1))
        };
        // The whole prompt (what was injected included), ahead of everything queued since.
        let again = InboxMessage::new(
            Delivery::Steer,
            turn.claim.prompt_text(),
            turn.claim.message.source.clone(),
        )
        .notifying(turn.notify);
        if let Err(e) = self.inbox.queue(again) {
            tracing::error!(agent = %self.id, error = %e, "cannot queue the prompt a usage limit stopped again; the turn fails");
            return Err(Box::new(turn));
        }
        self.limit_count = count;
        // Readers see it queued by the time they see the agent wait.
        self.publish_queue();
        let mut data = json!({
            "event": TurnEnd::Limited,
            "error": error,
            "retryAt": retry_at.to_string(),
        });
        if let Some(reset) = hit.reset_at {
            data["resetAt"] = json!(reset.to_string());
        }
        self.push(ItemKind::TurnEnded, data);
        let _ = self.timeline.sync();
        self.resolve_all_permissions().await;
        let limited = drover_core::Limited {
            at: now,
            reset_at: hit.reset_at,
            retry_at,
            count,
            error: error.clone(),
        };
        if let Err(e) = self
            .shared
            .registry
            .record_turn_limited(self.id, limited)
            .await
        {
            tracing::warn!(agent = %self.id, error = %e, "cannot record the usage limit");
        }
        tracing::info!(agent = %self.id, %retry_at, "the turn hit the provider's usage limit; its prompt waits");
        self.limit_wait = limit_deadline(retry_at);
        // claude-agent-acp 0.23 ends the prompt after a failed one at once, empty, as after a
        // cancel (#551): the prompt sent again is guarded the same way.
        if let Some(live) = &mut self.live {
            live.cancel_sent = true;
        }
        if let Some(target) = turn.notify {
            let text = format!(
                "[drover] {}: its turn stopped on its provider's usage limit ({error}). It waits and sends its prompt again at {retry_at}; you will hear when that turn ends.",
                self.name(),
                retry_at = retry_at.round(jiff::Unit::Second).unwrap_or(retry_at),
            );
            self.tell_as(target, text, Delivery::Inject);
        }
        Ok(())
    }

    /// Sends the running turn's prompt once more if `result` is the empty, instant `end_turn`
    /// of a stale cancel ([`STALE_CANCEL_WINDOW`]); returns whether it did.
    fn resend_stale_cancel(&mut self, result: &Result<Value, RpcError>) -> bool {
        let (Some(turn), Some(live)) = (self.turn.as_mut(), self.live.as_ref()) else {
            return false;
        };
        let ended = matches!(result, Ok(v) if v.get("stopReason").and_then(Value::as_str) == Some("end_turn"));
        if !ended
            || !turn.after_cancel
            || turn.resent
            || turn.updated
            || turn.cancel.is_some()
            || turn.sent.elapsed() > STALE_CANCEL_WINDOW
        {
            return false;
        }
        tracing::info!(agent = %self.id, "the prompt after a cancel ended at once with nothing said; sent again (claude-agent-acp#551)");
        turn.resent = true;
        turn.sent = Instant::now();
        turn.response = Box::pin(live.rpc.request("session/prompt", turn.prompt.clone()));
        true
    }

    /// Ends `turn`: its `turn_ended` item (`data`), then the registry, then the notice to
    /// whoever asked, in that order.
    pub(super) async fn end_turn(&mut self, turn: Turn, outcome: TurnOutcome, data: Value) {
        self.push(ItemKind::TurnEnded, data);
        let _ = self.timeline.sync();
        // The agent is done with them, answered or not.
        self.resolve_all_permissions().await;
        if self.own_subagents.turn_ended() {
            self.publish_session();
        }
        let notice = turn
            .notify
            .map(|target| (target, self.finish_notice(&outcome, turn.started_seq)));
        if let Err(e) = self.shared.registry.record_turn_end(self.id, outcome).await {
            tracing::warn!(agent = %self.id, error = %e, "cannot record the end of a turn");
        }
        if let Some((target, text)) = notice {
            self.tell(target, text);
        }
    }

    /// The runtime is closing under a running turn (archive, close): the registry already
    /// moved the agent on, the timeline says how the turn ended and why (the cause of a cancel
    /// that came first, else the close's own: `archive` for the archived agent, `parent` for
    /// its cascade).
    pub(super) fn close_turn(&mut self, cause: CancelCause) {
        let Some(turn) = &self.turn else {
            return;
        };
        let cause = turn.cancel.unwrap_or(cause);
        self.close_chunk();
        self.push(
            ItemKind::TurnEnded,
            json!({"event": TurnEnd::Canceled, "cause": cause, "stopReason": "cancelled"}),
        );
        let _ = self.timeline.sync();
    }

    /// Queues `text` for `target` from a task of its own, after this agent's earlier notices.
    pub(super) fn tell(&mut self, target: AgentId, text: String) {
        self.tell_as(target, text, Delivery::Followup);
    }

    /// [`Actor::tell`] as `delivery`.
    pub(super) fn tell_as(&mut self, target: AgentId, text: String, delivery: Delivery) {
        let earlier = self.notices.take();
        // What the agent spent so far is recorded first (see `Actor::spends`).
        let spends = self.spends.take();
        let shared = self.shared.clone();
        let from = self.id;
        self.notices = Some(tokio::spawn(async move {
            if let Some(spends) = spends {
                let _ = spends.await;
            }
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            notify(shared, from, target, text, delivery).await;
        }));
    }

    /// "Agent \"title\" (id)" for notices.
    pub(super) fn name(&self) -> String {
        let title = self.shared.registry.get(self.id).and_then(|a| a.title);
        match title {
            Some(title) => format!("Agent \"{title}\" ({})", self.id),
            None => format!("Agent {}", self.id),
        }
    }

    /// What the notified agent reads when this agent's turn ends.
    fn finish_notice(&self, outcome: &TurnOutcome, started_seq: u64) -> String {
        let name = self.name();
        let reply: String = self
            .timeline
            .items()
            .iter()
            .filter(|i| i.seq > started_seq && i.is(ItemKind::AgentMessage))
            .filter_map(|i| i.data.get("text").and_then(Value::as_str))
            .collect();
        // Quoted, so the reply reads as the child's words, not as instructions.
        let reply: String = excerpt(&reply, NOTICE_REPLY_CHARS)
            .lines()
            .flat_map(|l| ["> ", l, "\n"])
            .collect();
        match outcome {
            TurnOutcome::Completed if reply.is_empty() => {
                format!("[drover] {name} finished its turn.")
            }
            TurnOutcome::Completed => {
                format!("[drover] {name} finished its turn. Its reply:\n{reply}")
            }
            TurnOutcome::Canceled => format!("[drover] {name}: its turn was cancelled."),
            TurnOutcome::Failed { error } => format!("[drover] {name}: its turn failed: {error}"),
        }
    }
}

/// Queues `text` for `target` as `delivery` from agent `from`: it never interrupts the
/// target's turn. An archived target gets nothing (the gate).
async fn notify(
    shared: Arc<Shared>,
    from: AgentId,
    target: AgentId,
    text: String,
    delivery: Delivery,
) {
    // An agent of the hub that asked for this one over a link: the notice waits in the
    // outbox until the hub has it (see `drover_core::outbox`).
    if shared.registry.get(target).is_none()
        && shared.registry.get(from).and_then(|a| a.upstream_id()) == Some(target)
    {
        if let Err(e) = shared.outbox.queue(from, target, delivery, text) {
            tracing::warn!(agent = %from, %target, error = %e, "cannot keep a notice for the hub");
        }
        return;
    }
    let manager = RuntimeManager { shared };
    let delivery = manager.deliver(target, delivery, text, format!("agent:{from}"));
    match tokio::time::timeout(NOTICE_TIMEOUT, delivery).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::info!(agent = %from, %target, error = %e, "notification not delivered");
        }
        Err(_) => tracing::warn!(agent = %from, %target, "notification timed out"),
    }
}

/// The first `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}
