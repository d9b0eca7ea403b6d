//! The durable inbox: messages queued for an agent's next turns.
//!
//! One delivery primitive with three presets: `followup` (next turn; wakes an idle agent),
//! `steer` (ahead of everything else; the caller also cancels the current turn), `inject`
//! (context prepended to the next prompt; never wakes). A message is written to
//! `inbox/{agent-id}.jsonl` and fsynced before the call that queued it returns.
//!
//! Delivery is exactly once, and the timeline decides it: a message is delivered when its
//! `user_message` item (naming its id in `messageId` or `contextIds`) is fsynced in the
//! agent's timeline; only then is it marked `claimed` here, and only then is the prompt sent.
//! A crash between the two leaves the log out of step, and opening settles it against the
//! timeline: a pending message the timeline already records is marked claimed (never sent
//! twice), and a claimed message the timeline does not record (a log written by an older
//! drover, which claimed first) is queued again (never lost).
//!
//! ```text
//! {"op":"queued","message":{"id":"…","at":"…","delivery":"followup","text":"…","source":"user"}}
//! {"op":"claimed","ids":["…"]}
//! {"op":"discarded","ids":["…"]}
//! ```

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::ids::AgentId;
use crate::jsonl::Log;
use crate::store::StoreError;
use crate::timeline::Timeline;

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
    /// The ids of the messages it carries: the context first, the message last.
    pub fn ids(&self) -> Vec<String> {
        self.context
            .iter()
            .map(|m| m.id.clone())
            .chain([self.message.id.clone()])
            .collect()
    }

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

    /// Opens the inbox, replaying its log (a torn last line is cut off) and settling it
    /// against the agent's timeline on disk (read only when the log holds something).
    pub fn open(home: &Path, agent: AgentId) -> Result<Inbox, StoreError> {
        let mut unreadable = None;
        let inbox = Self::open_with(home, agent, || {
            Timeline::read_delivered(home, agent).unwrap_or_else(|e| {
                unreadable = Some(e);
                HashSet::new()
            })
        })?;
        match unreadable {
            // Without the timeline the claims cannot be settled; better not guess.
            Some(e) => Err(e),
            None => Ok(inbox),
        }
    }

    /// Opens the inbox and settles it against `delivered` (the message ids the agent's
    /// timeline records, see [`Timeline::delivered`]), called only when the log holds
    /// anything to settle.
    pub fn open_with(
        home: &Path,
        agent: AgentId,
        delivered: impl FnOnce() -> HashSet<String>,
    ) -> Result<Inbox, StoreError> {
        let mut pending: VecDeque<InboxMessage> = VecDeque::new();
        // Each `claimed` entry's messages (context first, the waking message last).
        let mut claims: Vec<Vec<InboxMessage>> = Vec::new();
        let mut discarded: HashSet<String> = HashSet::new();
        let (log, _) = Log::open(&Self::path_for(home, agent), |entry| match entry {
            Entry::Queued { message } => pending.push_back(message),
            Entry::Claimed { ids } => {
                claims.push(
                    pending
                        .iter()
                        .filter(|m| ids.contains(&m.id))
                        .cloned()
                        .collect(),
                );
                pending.retain(|m| !ids.contains(&m.id));
            }
            Entry::Discarded { ids } => {
                pending.retain(|m| !ids.contains(&m.id));
                discarded.extend(ids);
            }
        })?;
        // What was discarded stays discarded, whatever an earlier claim says.
        claims.retain(|claim| {
            claim
                .last()
                .is_some_and(|wake| !discarded.contains(&wake.id))
        });
        let mut inbox = Inbox { log, pending };
        if inbox.pending.is_empty() && claims.is_empty() {
            if !inbox.log.is_empty()? {
                inbox.log.clear()?;
            }
            return Ok(inbox);
        }
        inbox.settle(&delivered(), claims)?;
        if inbox.pending.is_empty() {
            // Nothing pending: start the log afresh instead of growing it forever.
            inbox.log.clear()?;
        }
        Ok(inbox)
    }

    /// Brings the log in step with the timeline after a crash between recording a message and
    /// claiming it (or a claim an older drover wrote before recording).
    fn settle(
        &mut self,
        delivered: &HashSet<String>,
        claims: Vec<Vec<InboxMessage>>,
    ) -> Result<(), StoreError> {
        let recorded: Vec<String> = self
            .pending
            .iter()
            .filter(|m| delivered.contains(&m.id))
            .map(|m| m.id.clone())
            .collect();
        if !recorded.is_empty() {
            tracing::info!(
                count = recorded.len(),
                "the timeline already records queued messages; marked them claimed"
            );
            self.write(&Entry::Claimed {
                ids: recorded.clone(),
            })?;
            self.pending.retain(|m| !recorded.contains(&m.id));
        }
        for claim in claims {
            let lost = claim
                .last()
                .is_some_and(|wake| !delivered.contains(&wake.id));
            if !lost {
                continue;
            }
            tracing::warn!(
                count = claim.len(),
                "claimed messages the timeline never recorded are queued again"
            );
            for message in claim {
                if !self.pending.iter().any(|m| m.id == message.id)
                    && !delivered.contains(&message.id)
                {
                    self.queue(message)?;
                }
            }
        }
        Ok(())
    }

    /// The id of every message the log on disk ever queued (claimed, discarded or pending),
    /// read without opening it for writing: whoever queued a message with an id of its own
    /// choosing can tell after a crash whether it got there. Missing file: none.
    pub fn read_queued_ids(home: &Path, agent: AgentId) -> Result<HashSet<String>, StoreError> {
        let mut ids = HashSet::new();
        crate::jsonl::read(&Self::path_for(home, agent), |entry| {
            if let Entry::Queued { message } = entry {
                ids.insert(message.id);
            }
        })?;
        Ok(ids)
    }

    /// Whether the message `id` got to the agent: queued in its inbox, or (having left it)
    /// recorded in its timeline. What queues a message under an id of its own choosing asks
    /// this first to queue it once, however often it tries.
    pub fn reached(home: &Path, agent: AgentId, id: &str) -> bool {
        // The inbox first: a message leaves it only after the timeline recorded it.
        Self::read_queued_ids(home, agent).is_ok_and(|ids| ids.contains(id))
            || Timeline::read_delivered(home, agent).is_ok_and(|ids| ids.contains(id))
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

    /// Takes what the next prompt carries ([`Inbox::next`]), durably. The runtime records the
    /// claim in the timeline first and then calls [`Inbox::take`]; this does only the second.
    pub fn claim(&mut self) -> Result<Option<Claim>, StoreError> {
        let Some(claim) = self.next() else {
            return Ok(None);
        };
        self.take(&claim)?;
        Ok(Some(claim))
    }

    /// Marks `claim` claimed (fsynced). Its messages leave the pending list even if the write
    /// fails: the timeline already records them, and the next open settles the log.
    pub fn take(&mut self, claim: &Claim) -> Result<(), StoreError> {
        let ids = claim.ids();
        self.pending.retain(|m| !ids.contains(&m.id));
        self.write(&Entry::Claimed { ids })
    }

    /// What the next prompt carries, without taking it: the oldest steer, else the oldest
    /// followup, with every inject queued so far as context.
    pub fn next(&self) -> Option<Claim> {
        let pick = self
            .pending
            .iter()
            .position(|m| m.delivery == Delivery::Steer)
            .or_else(|| {
                self.pending
                    .iter()
                    .position(|m| m.delivery == Delivery::Followup)
            });
        let message = self.pending[pick?].clone();
        let context: Vec<InboxMessage> = self
            .pending
            .iter()
            .filter(|m| m.delivery == Delivery::Inject)
            .cloned()
            .collect();
        Some(Claim { context, message })
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

    /// Removes the inbox file of an archived agent: what it held can never be delivered (an
    /// archive discards it), so nothing of it is kept. A missing file is fine.
    pub fn remove(home: &Path, agent: AgentId) -> Result<(), StoreError> {
        let path = Self::path_for(home, agent);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("remove", &path)(e)),
        }
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
        // What the timeline records as delivered (the runtime records before it claims).
        let mut delivered = HashSet::new();
        let mut inbox = Inbox::open(home.path(), agent).expect("reopen");
        assert_eq!(inbox.pending().count(), 3);
        let claim = inbox.claim().expect("claim").expect("some");
        assert_eq!(claim.message.text, "now");
        assert_eq!(claim.prompt_text(), "ctx\n\nnow");
        delivered.extend(claim.ids());
        drop(inbox);
        let mut inbox = Inbox::open_with(home.path(), agent, || delivered.clone()).expect("reopen");
        let claim = inbox.claim().expect("claim").expect("some");
        assert_eq!(claim.message.text, "first");
        assert!(claim.context.is_empty());
        delivered.extend(claim.ids());
        assert!(inbox.claim().expect("claim").is_none());
        drop(inbox);
        let inbox = Inbox::open_with(home.path(), agent, || delivered).expect("reopen");
        assert!(inbox.is_empty());
        assert_eq!(
            std::fs::metadata(Inbox::path_for(home.path(), agent))
                .expect("meta")
                .len(),
            0
        );
    }

    #[test]
    fn opening_settles_the_log_against_the_timeline() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut inbox = Inbox::open(home.path(), agent).expect("open");
        let ctx = InboxMessage::new(Delivery::Inject, "ctx", "user");
        let recorded = InboxMessage::new(Delivery::Followup, "recorded, not claimed", "user");
        let claimed = InboxMessage::new(Delivery::Followup, "claimed, not recorded", "user");
        for m in [&ctx, &claimed, &recorded] {
            inbox.queue(m.clone()).expect("q");
        }
        // An older drover claimed first and died before recording.
        let claim = inbox.claim().expect("claim").expect("some");
        assert_eq!(claim.ids(), [ctx.id.clone(), claimed.id.clone()]);
        drop(inbox);
        // The timeline holds `recorded` (its claim never made it to the inbox).
        let delivered = HashSet::from([recorded.id.clone()]);
        let inbox = Inbox::open_with(home.path(), agent, || delivered.clone()).expect("reopen");
        let mut pending: Vec<&str> = inbox.pending().map(|m| m.text.as_str()).collect();
        pending.sort_unstable();
        assert_eq!(pending, ["claimed, not recorded", "ctx"]);
        drop(inbox);
        // Settled on disk: opening again changes nothing.
        let inbox = Inbox::open_with(home.path(), agent, || delivered.clone()).expect("reopen");
        assert_eq!(inbox.pending().count(), 2);
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
