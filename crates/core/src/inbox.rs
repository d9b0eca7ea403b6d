//! The durable inbox: messages queued for an agent's next turns.
//!
//! One delivery primitive with three presets: `followup` (next turn; wakes an idle agent),
//! `steer` (ahead of everything else; the caller also cancels the current turn), `inject`
//! (context prepended to the next prompt; never wakes). A message is written to
//! `inbox/{agent-id}.jsonl` and fsynced before the call that queued it returns; it is marked
//! `claimed` (fsynced) right before the prompt that carries it is sent, so a message queued
//! before a crash is delivered after the restart, once.
//!
//! ```text
//! {"op":"queued","message":{"id":"…","at":"…","delivery":"followup","text":"…","source":"user"}}
//! {"op":"claimed","ids":["…"]}
//! {"op":"discarded","ids":["…"]}
//! ```

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::ids::AgentId;
use crate::jsonl::Log;
use crate::store::StoreError;

/// Where a message goes and whether it wakes the agent: the protocol's enum, stored as is.
pub use drover_protocol::Delivery;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxMessage {
    pub id: String,
    pub at: Timestamp,
    pub delivery: Delivery,
    pub text: String,
    /// Who sent it: `user`, `agent:{id}`, `system`.
    pub source: String,
    /// The agent to tell when the turn this message starts ends, fails, or asks for a
    /// permission (notifyOnFinish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<AgentId>,
}

impl InboxMessage {
    pub fn new(delivery: Delivery, text: impl Into<String>, source: impl Into<String>) -> Self {
        InboxMessage {
            id: uuid::Uuid::now_v7().to_string(),
            at: Timestamp::now(),
            delivery,
            text: text.into(),
            source: source.into(),
            notify: None,
        }
    }

    /// The same message, telling `agent` how the turn it starts goes.
    #[must_use]
    pub fn notifying(mut self, agent: Option<AgentId>) -> Self {
        self.notify = agent;
        self
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Entry {
    Queued { message: InboxMessage },
    Claimed { ids: Vec<String> },
    Discarded { ids: Vec<String> },
}

/// What the next prompt carries: injected context, then the message that woke the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub context: Vec<InboxMessage>,
    pub message: InboxMessage,
}

impl Claim {
    /// The prompt text: each injected context first, then the message.
    pub fn prompt_text(&self) -> String {
        let mut text = String::new();
        for c in &self.context {
            text.push_str(&c.text);
            text.push_str("\n\n");
        }
        text.push_str(&self.message.text);
        text
    }
}

/// One agent's inbox.
#[derive(Debug)]
pub struct Inbox {
    log: Log,
    pending: VecDeque<InboxMessage>,
}

impl Inbox {
    pub fn path_for(home: &Path, agent: AgentId) -> PathBuf {
        home.join("inbox").join(format!("{agent}.jsonl"))
    }

    /// Opens the inbox, replaying its log (a torn last line is cut off).
    pub fn open(home: &Path, agent: AgentId) -> Result<Inbox, StoreError> {
        let mut pending: VecDeque<InboxMessage> = VecDeque::new();
        let (mut log, _) = Log::open(&Self::path_for(home, agent), |entry| match entry {
            Entry::Queued { message } => pending.push_back(message),
            Entry::Claimed { ids } | Entry::Discarded { ids } => {
                pending.retain(|m| !ids.contains(&m.id));
            }
        })?;
        if pending.is_empty() && !log.is_empty()? {
            // Nothing pending: start the log afresh instead of growing it forever.
            log.clear()?;
        }
        Ok(Inbox { log, pending })
    }

    pub fn pending(&self) -> impl Iterator<Item = &InboxMessage> {
        self.pending.iter()
    }

    /// Whether a message waits that wakes the agent.
    pub fn has_wake(&self) -> bool {
        self.pending.iter().any(|m| m.delivery.wakes())
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Queues a message durably.
    pub fn queue(&mut self, message: InboxMessage) -> Result<(), StoreError> {
        self.write(&Entry::Queued {
            message: message.clone(),
        })?;
        self.pending.push_back(message);
        Ok(())
    }

    /// Takes what the next prompt carries: the oldest steer, else the oldest followup, with
    /// every inject queued so far as context. Durable before it returns.
    pub fn claim(&mut self) -> Result<Option<Claim>, StoreError> {
        let pick = self
            .pending
            .iter()
            .position(|m| m.delivery == Delivery::Steer)
            .or_else(|| {
                self.pending
                    .iter()
                    .position(|m| m.delivery == Delivery::Followup)
            });
        let Some(pick) = pick else { return Ok(None) };
        let message = self.pending[pick].clone();
        let context: Vec<InboxMessage> = self
            .pending
            .iter()
            .filter(|m| m.delivery == Delivery::Inject)
            .cloned()
            .collect();
        let ids: Vec<String> = context
            .iter()
            .map(|m| m.id.clone())
            .chain([message.id.clone()])
            .collect();
        self.write(&Entry::Claimed { ids: ids.clone() })?;
        self.pending.retain(|m| !ids.contains(&m.id));
        Ok(Some(Claim { context, message }))
    }

    /// Drops every pending message (a cancel without keepInbox, an archive). Returns them.
    pub fn discard_all(&mut self) -> Result<Vec<InboxMessage>, StoreError> {
        if self.pending.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.pending.iter().map(|m| m.id.clone()).collect();
        self.write(&Entry::Discarded { ids })?;
        Ok(self.pending.drain(..).collect())
    }

    fn write(&mut self, entry: &Entry) -> Result<(), StoreError> {
        self.log.append_synced(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steer_first_injects_ride_along_and_the_log_replays() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut inbox = Inbox::open(home.path(), agent).expect("open");
        inbox
            .queue(InboxMessage::new(Delivery::Followup, "first", "user"))
            .expect("q");
        inbox
            .queue(InboxMessage::new(Delivery::Inject, "ctx", "user"))
            .expect("q");
        inbox
            .queue(InboxMessage::new(Delivery::Steer, "now", "user"))
            .expect("q");
        drop(inbox);
        let mut inbox = Inbox::open(home.path(), agent).expect("reopen");
        assert_eq!(inbox.pending().count(), 3);
        let claim = inbox.claim().expect("claim").expect("some");
        assert_eq!(claim.message.text, "now");
        assert_eq!(claim.prompt_text(), "ctx\n\nnow");
        drop(inbox);
        let mut inbox = Inbox::open(home.path(), agent).expect("reopen");
        let claim = inbox.claim().expect("claim").expect("some");
        assert_eq!(claim.message.text, "first");
        assert!(claim.context.is_empty());
        assert!(inbox.claim().expect("claim").is_none());
        drop(inbox);
        let inbox = Inbox::open(home.path(), agent).expect("reopen");
        assert!(inbox.is_empty());
        assert_eq!(
            std::fs::metadata(Inbox::path_for(home.path(), agent))
                .expect("meta")
                .len(),
            0
        );
    }

    #[test]
    fn injects_alone_do_not_wake() {
        let home = tempfile::tempdir().expect("home");
        let mut inbox = Inbox::open(home.path(), AgentId::new()).expect("open");
        inbox
            .queue(InboxMessage::new(Delivery::Inject, "ctx", "user"))
            .expect("q");
        assert!(!inbox.has_wake());
        assert!(inbox.claim().expect("claim").is_none());
        assert_eq!(inbox.discard_all().expect("discard").len(), 1);
        assert!(inbox.is_empty());
    }
}
