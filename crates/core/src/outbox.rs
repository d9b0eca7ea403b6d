//! The outbox: what this daemon's agents tell agents of the hub that links to it (a
//! subagent's "my turn ended" to its parent on another machine), kept until the hub says it
//! has them.
//!
//! A notice is written to `outbox.jsonl` and fsynced before it is offered to the hub; the hub
//! queues it in its agent's inbox under the notice's id (a message id: the inbox and timeline
//! tell whether it got there, so a notice offered twice is queued once) and then acknowledges
//! it, and only then is it dropped here. A link that breaks in between leaves the notice
//! here, offered again when the hub links again: delivered exactly once, late rather than
//! never.
//!
//! ```text
//! {"op":"queued","notice":{"id":"…","at":"…","from":"…","to":"…","delivery":"followup","text":"…"}}
//! {"op":"acked","ids":["…"]}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::ids::AgentId;
use crate::inbox::Delivery;
use crate::jsonl::Log;
use crate::store::StoreError;

/// One message for an agent of the hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// Also the id of the message it becomes in the hub agent's inbox.
    pub id: String,
    pub at: Timestamp,
    /// This daemon's agent that tells.
    pub from: AgentId,
    /// The hub's agent it is for.
    pub to: AgentId,
    pub delivery: Delivery,
    pub text: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Entry {
    Queued { notice: Notice },
    Acked { ids: Vec<String> },
}

/// The daemon's outbox.
#[derive(Debug)]
pub struct Outbox {
    state: Mutex<State>,
    /// Each notice as it is queued, for the hub's links.
    queued: broadcast::Sender<Notice>,
}

#[derive(Debug)]
struct State {
    log: Log,
    /// In the order they were queued (ids are time-ordered UUIDs).
    pending: BTreeMap<String, Notice>,
}

impl Outbox {
    pub fn path_for(home: &Path) -> PathBuf {
        home.join("outbox.jsonl")
    }

    /// Opens the outbox, replaying its log (a torn last line is cut off); a log with nothing
    /// pending starts afresh.
    pub fn open(home: &Path) -> Result<Outbox, StoreError> {
        let mut pending = BTreeMap::new();
        let (mut log, _) = Log::open(&Self::path_for(home), |entry| match entry {
            Entry::Queued { notice } => {
                pending.insert(notice.id.clone(), notice);
            }
            Entry::Acked { ids } => {
                for id in ids {
                    pending.remove(&id);
                }
            }
        })?;
        if pending.is_empty() && !log.is_empty()? {
            log.clear()?;
        }
        let (queued, _) = broadcast::channel(256);
        Ok(Outbox {
            state: Mutex::new(State { log, pending }),
            queued,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `text` for the hub's agent `to` (fsynced), then offers it to the hub.
    pub fn queue(
        &self,
        from: AgentId,
        to: AgentId,
        delivery: Delivery,
        text: String,
    ) -> Result<Notice, StoreError> {
        let notice = Notice {
            id: uuid::Uuid::now_v7().to_string(),
            at: Timestamp::now(),
            from,
            to,
            delivery,
            text,
        };
        let mut state = self.lock();
        state.log.append_synced(&Entry::Queued {
            notice: notice.clone(),
        })?;
        state.pending.insert(notice.id.clone(), notice.clone());
        drop(state);
        let _ = self.queued.send(notice.clone());
        Ok(notice)
    }

    /// Every notice the hub has not acknowledged, oldest first.
    pub fn pending(&self) -> Vec<Notice> {
        self.lock().pending.values().cloned().collect()
    }

    /// The hub has these (ids it does not know are ignored): they are dropped, durably.
    pub fn ack(&self, ids: &[String]) -> Result<(), StoreError> {
        let mut state = self.lock();
        let known: Vec<String> = ids
            .iter()
            .filter(|id| state.pending.contains_key(*id))
            .cloned()
            .collect();
        if known.is_empty() {
            return Ok(());
        }
        state
            .log
            .append_synced(&Entry::Acked { ids: known.clone() })?;
        for id in &known {
            state.pending.remove(id);
        }
        if state.pending.is_empty() {
            state.log.clear()?;
        }
        Ok(())
    }

    /// Each notice as it is queued.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.queued.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_stays_until_acknowledged_across_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (from, to) = (AgentId::new(), AgentId::new());
        let outbox = Outbox::open(dir.path()).expect("open");
        let first = outbox
            .queue(from, to, Delivery::Followup, "one".into())
            .expect("queue");
        let second = outbox
            .queue(from, to, Delivery::Followup, "two".into())
            .expect("queue");
        drop(outbox);

        let outbox = Outbox::open(dir.path()).expect("reopen");
        assert_eq!(outbox.pending(), [first.clone(), second.clone()]);
        outbox
            .ack(&[first.id.clone(), "unknown".into()])
            .expect("ack");
        drop(outbox);

        let outbox = Outbox::open(dir.path()).expect("reopen");
        assert_eq!(outbox.pending(), std::slice::from_ref(&second));
        outbox.ack(&[second.id]).expect("ack");
        assert!(outbox.pending().is_empty());
        assert_eq!(
            std::fs::metadata(Outbox::path_for(dir.path()))
                .expect("log")
                .len(),
            0,
            "an outbox with nothing pending starts afresh"
        );
    }
}
