//! The agent's permission requests (`session/request_permission`): recorded as a timeline
//! item, answered at once under the `allow` policy, otherwise flagged for attention (and the
//! agent that asked to hear about this one told) until a client answers; answers pick one of
//! the agent's options.

use drover_core::{AttentionReason, PermissionPolicy};
use drover_protocol::ItemKind;
use serde_json::{Map, Value, json};

use super::Actor;
use crate::{AcpError, PendingPermission, PermissionAnswer, PermissionChoice};

/// A request the agent is waiting on.
pub(super) struct Permission {
    rpc_id: Value,
    seq: u64,
    tool_call_id: Option<String>,
    /// The timeline item of the tool call it asks about.
    tool_seq: Option<u64>,
    title: Option<String>,
    options: Vec<Value>,
}

impl Actor {
    pub(super) async fn on_permission(&mut self, id: Value, params: Value) {
        let tool = params
            .get("toolCall")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let tool_seq = self.merge_tool_call(tool.clone());
        let options: Vec<Value> = params
            .get("options")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let title = tool
            .get("title")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                tool_seq
                    .and_then(|s| self.timeline.get(s))
                    .and_then(|i| i.data.get("title"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        let tool_call_id = tool
            .get("toolCallId")
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(seq) = self.push(
            ItemKind::Permission,
            json!({
                "toolCallId": tool_call_id,
                "toolSeq": tool_seq,
                "title": title,
                "options": options,
                "status": "pending",
            }),
        ) else {
            return;
        };
        self.permissions.push(Permission {
            rpc_id: id,
            seq,
            tool_call_id,
            tool_seq,
            title: title.clone(),
            options,
        });
        self.apply_policy(seq, title).await;
    }

    /// What happens to a new request: cancelled in a cancelled turn, allowed under `allow`,
    /// else it waits for an answer with the agent flagged.
    async fn apply_policy(&mut self, seq: u64, title: Option<String>) {
        let registry = self.shared.registry.clone();
        let policy = registry
            .get(self.id)
            .map(|a| a.config.permission_policy)
            .unwrap_or_default();
        if self.turn.as_ref().is_some_and(|t| t.cancel.is_some()) {
            // A cancelled turn gets no new permissions.
            self.resolve_all_permissions().await;
        } else if policy == PermissionPolicy::Allow {
            let answer = PermissionAnswer {
                request: Some(seq),
                choice: PermissionChoice::Kind("allow_once".to_string()),
            };
            if let Err(e) = self.answer(answer).await {
                tracing::warn!(agent = %self.id, error = %e, "cannot allow a permission");
            }
        } else {
            if let Err(e) = registry
                .set_attention(self.id, AttentionReason::Permission)
                .await
            {
                tracing::warn!(agent = %self.id, error = %e, "cannot flag the permission request");
            }
            if let Some(target) = self.turn.as_ref().and_then(|t| t.notify) {
                let name = self.name();
                let text = format!(
                    "[drover] {name} needs a permission: {}. Answer it with the `answer_permission` tool (agentId {}), or look at it with `get_agent`.",
                    title.as_deref().unwrap_or("a tool call"),
                    self.id
                );
                self.tell(target, text);
            }
        }
    }

    pub(super) fn pending_permissions(&self) -> Vec<PendingPermission> {
        self.permissions
            .iter()
            .map(|p| PendingPermission {
                seq: p.seq,
                tool_call_id: p.tool_call_id.clone(),
                title: p.title.clone(),
                options: p.options.clone(),
            })
            .collect()
    }

    pub(super) async fn answer(&mut self, answer: PermissionAnswer) -> Result<(), AcpError> {
        let index = self.permission_index(answer.request)?;
        let option = self.chosen_option(index, &answer.choice)?;
        let permission = self.permissions.remove(index);
        let outcome = match &option {
            Some(option) => json!({"outcome": "selected", "optionId": option.get("optionId")}),
            None => json!({"outcome": "cancelled"}),
        };
        if let Some(live) = &self.live {
            live.rpc
                .respond(permission.rpc_id, Ok(json!({"outcome": outcome})))
                .await;
        }
        let kind = option
            .as_ref()
            .map(|o| o.get("kind").cloned().unwrap_or(Value::Null));
        let refused = match kind.as_ref().map(|k| k.as_str()) {
            None => Some("cancelled"),
            Some(Some(k)) if k.starts_with("reject") => Some("denied"),
            Some(_) => None,
        };
        let mut fields = Map::new();
        fields.insert("status".to_string(), json!("answered"));
        fields.insert("outcome".to_string(), outcome);
        if let Some(kind) = kind {
            fields.insert("kind".to_string(), kind);
        }
        self.patch(permission.seq, fields);
        if let (Some(refused), Some(tool_seq)) = (refused, permission.tool_seq) {
            self.refuse_tool_call(tool_seq, refused);
        }
        if self.permissions.is_empty() {
            let registry = &self.shared.registry;
            if registry
                .get(self.id)
                .and_then(|a| a.attention)
                .is_some_and(|a| a.reason == AttentionReason::Permission)
            {
                let _ = registry.clear_attention(self.id).await;
            }
        }
        Ok(())
    }

    /// A tool call whose permission was denied (or cancelled) does not run: it ends `failed`,
    /// saying why (`permission`), unless the agent already settled it. Codex and gemini never
    /// say so themselves; an agent that does (claude) patches it again, which changes nothing.
    fn refuse_tool_call(&mut self, tool_seq: u64, refused: &str) {
        let settled = self
            .timeline
            .get(tool_seq)
            .and_then(|i| i.data.get("status"))
            .and_then(Value::as_str)
            .is_some_and(|s| matches!(s, "completed" | "failed"));
        if settled {
            return;
        }
        let mut fields = Map::new();
        fields.insert("status".to_string(), json!("failed"));
        fields.insert("permission".to_string(), json!(refused));
        self.patch(tool_seq, fields);
    }

    /// The pending request `request` names (its seq), or the oldest.
    fn permission_index(&self, request: Option<u64>) -> Result<usize, AcpError> {
        match request {
            Some(seq) => {
                self.permissions
                    .iter()
                    .position(|p| p.seq == seq)
                    .ok_or(AcpError::Permission {
                        agent: self.id,
                        message: format!("no pending permission request #{seq}"),
                    })
            }
            None if self.permissions.is_empty() => Err(AcpError::NoPendingPermission(self.id)),
            None => Ok(0),
        }
    }

    /// The option `choice` picks among request `index`'s; `None` declines.
    fn chosen_option(
        &self,
        index: usize,
        choice: &PermissionChoice,
    ) -> Result<Option<Value>, AcpError> {
        let options = &self.permissions[index].options;
        let missing = |message: String| AcpError::Permission {
            agent: self.id,
            message,
        };
        match choice {
            PermissionChoice::Cancel => Ok(None),
            PermissionChoice::OptionId(wanted) => options
                .iter()
                .find(|o| o.get("optionId").and_then(Value::as_str) == Some(wanted))
                .cloned()
                .map(Some)
                .ok_or_else(|| missing(format!("the request has no option `{wanted}`"))),
            PermissionChoice::Kind(kind) => pick_by_kind(options, kind)
                .map(Some)
                .ok_or_else(|| missing(format!("the request offers no `{kind}` option"))),
        }
    }

    /// Answers every pending request `cancelled`.
    pub(super) async fn resolve_all_permissions(&mut self) {
        while !self.permissions.is_empty() {
            let answer = PermissionAnswer {
                request: None,
                choice: PermissionChoice::Cancel,
            };
            if self.answer(answer).await.is_err() {
                self.permissions.clear();
            }
        }
    }
}

/// The option of `kind`; for `allow_once` an `allow_always` will do, for `reject_once` a
/// `reject_always`, when the agent offers only those.
fn pick_by_kind(options: &[Value], kind: &str) -> Option<Value> {
    let find = |k: &str| {
        options
            .iter()
            .find(|o| o.get("kind").and_then(Value::as_str) == Some(k))
            .cloned()
    };
    find(kind).or_else(|| match kind {
        "allow_once" => find("allow_always"),
        "reject_once" => find("reject_always"),
        _ => None,
    })
}
