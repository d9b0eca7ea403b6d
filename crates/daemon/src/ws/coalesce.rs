//! Coalesced streaming: text appended to one timeline item within a short window goes to
//! clients as one `append`.
//!
//! The hub runs every timeline event through a [`Coalescer`] before serializing it. An
//! `append` to an agent with no open window goes out at once and opens one; appends arriving
//! while the window is open are joined (same item and field, consecutive revisions) and go out
//! together when it closes, which opens the next window. Anything else (a new item, a patch,
//! a status change of the agent) first sends what the agent has pending, then goes out at
//! once: the first chunk of an item and non-text updates are never delayed, and an agent's
//! updates keep their order. The durable timeline is not touched: every chunk is still one
//! line of the agent's log, written as it arrives.

use std::collections::HashMap;
use std::sync::Arc;

use drover_acp::{TimelineEvent, TimelineUpdate};
use drover_core::AgentId;
use tokio::time::{Duration, Instant};

/// What a coalesced `append` joined: enough to send only the part after a revision to a
/// session whose snapshot already holds the rest (see `Outgoing::after`).
#[derive(Debug)]
pub(crate) struct Joined {
    pub(crate) agent_id: AgentId,
    pub(crate) seq: u64,
    pub(crate) field: String,
    pub(crate) text: String,
    /// The revision of the first chunk joined; the chunks have consecutive revisions.
    pub(crate) first_revision: u64,
    /// `ends[i]`: where the chunk of revision `first_revision + i` ends in `text`.
    pub(crate) ends: Vec<usize>,
}

impl Joined {
    /// The revision of the last chunk joined.
    pub(crate) fn last_revision(&self) -> u64 {
        self.first_revision + self.ends.len() as u64 - 1
    }

    /// One `append` event as it came.
    pub(crate) fn single(event: &TimelineEvent) -> Option<Joined> {
        let TimelineUpdate::Append { seq, field, text } = &event.update else {
            return None;
        };
        Some(Joined {
            agent_id: event.agent_id,
            seq: *seq,
            field: field.clone(),
            text: text.clone(),
            first_revision: event.revision,
            ends: vec![text.len()],
        })
    }

    /// The text of the chunks from revision `from` on (`first_revision <= from <= last`).
    pub(crate) fn text_from(&self, from: u64) -> &str {
        let skip = usize::try_from(from.saturating_sub(self.first_revision)).unwrap_or(usize::MAX);
        let start = match skip {
            0 => 0,
            n => self.ends.get(n - 1).copied().unwrap_or(self.text.len()),
        };
        self.text.get(start..).unwrap_or_default()
    }

    /// The event of the text after revision `seen` (`first_revision <= seen < last`).
    pub(crate) fn after(&self, seen: u64) -> TimelineEvent {
        self.event(self.text_from(seen + 1).to_string())
    }

    /// The `append` of `text` to this item, at revision `revision`.
    pub(crate) fn event_at(&self, revision: u64, text: String) -> TimelineEvent {
        TimelineEvent {
            agent_id: self.agent_id,
            revision,
            update: TimelineUpdate::Append {
                seq: self.seq,
                field: self.field.clone(),
                text,
            },
        }
    }

    fn event(&self, text: String) -> TimelineEvent {
        self.event_at(self.last_revision(), text)
    }
}

/// An event ready to be serialized: as it came, or several appends joined.
#[derive(Debug)]
pub(crate) enum Ready {
    One(TimelineEvent),
    Joined(Arc<Joined>),
}

impl Ready {
    /// The event to serialize.
    pub(crate) fn event(&self) -> TimelineEvent {
        match self {
            Ready::One(event) => event.clone(),
            Ready::Joined(joined) => joined.event(joined.text.clone()),
        }
    }
}

/// One agent's open window.
struct Window {
    closes: Instant,
    /// Appends held until `closes`, joined.
    held: Option<Joined>,
}

/// Per-agent windows of held appends.
pub(crate) struct Coalescer {
    window: Duration,
    open: HashMap<AgentId, Window>,
}

impl Coalescer {
    /// `window` zero: every event goes out as it comes.
    pub(crate) fn new(window: Duration) -> Coalescer {
        Coalescer {
            window,
            open: HashMap::new(),
        }
    }

    /// Takes one timeline event; returns what is to be sent now, in order.
    pub(crate) fn push(&mut self, event: TimelineEvent, now: Instant) -> Vec<Ready> {
        let mut ready = Vec::new();
        if self.window.is_zero() {
            ready.push(Ready::One(event));
            return ready;
        }
        let agent = event.agent_id;
        let TimelineUpdate::Append { seq, field, text } = &event.update else {
            // Not text: what the agent has held goes first, then this, at once.
            self.flush(agent, &mut ready);
            ready.push(Ready::One(event));
            return ready;
        };
        match self.open.get_mut(&agent) {
            Some(window) if window.closes > now => {
                if let Some(held) = &mut window.held
                    && held.seq == *seq
                    && held.field == *field
                    && held.last_revision() + 1 == event.revision
                {
                    held.text.push_str(text);
                    held.ends.push(held.text.len());
                    return ready;
                }
                if let Some(held) = window.held.take() {
                    ready.push(Ready::Joined(Arc::new(held)));
                }
                window.held = Some(Joined {
                    agent_id: agent,
                    seq: *seq,
                    field: field.clone(),
                    text: text.clone(),
                    first_revision: event.revision,
                    ends: vec![text.len()],
                });
            }
            _ => {
                // No window open (or one that closed and the timer has not run yet): this goes
                // now and opens the next window.
                self.flush(agent, &mut ready);
                self.open.insert(
                    agent,
                    Window {
                        closes: now + self.window,
                        held: None,
                    },
                );
                ready.push(Ready::One(event));
            }
        }
        ready
    }

    /// Sends what `agent` has held (before a change of its status, say).
    pub(crate) fn flush_agent(&mut self, agent: AgentId) -> Vec<Ready> {
        let mut ready = Vec::new();
        self.flush(agent, &mut ready);
        ready
    }

    fn flush(&mut self, agent: AgentId, ready: &mut Vec<Ready>) {
        if let Some(window) = self.open.get_mut(&agent)
            && let Some(held) = window.held.take()
        {
            ready.push(Ready::Joined(Arc::new(held)));
        }
    }

    /// When the next window closes, if one is open.
    pub(crate) fn next_close(&self) -> Option<Instant> {
        self.open.values().map(|w| w.closes).min()
    }

    /// Closes the windows due by `now`: what they held goes out, and a window that sent
    /// something opens again (the agent is streaming); one that held nothing ends.
    pub(crate) fn close_due(&mut self, now: Instant) -> Vec<Ready> {
        let mut ready = Vec::new();
        let window = self.window;
        self.open.retain(|_, w| {
            if w.closes > now {
                return true;
            }
            match w.held.take() {
                Some(held) => {
                    ready.push(Ready::Joined(Arc::new(held)));
                    w.closes = now + window;
                    true
                }
                None => false,
            }
        });
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(agent: AgentId, revision: u64, seq: u64, text: &str) -> TimelineEvent {
        TimelineEvent {
            agent_id: agent,
            revision,
            update: TimelineUpdate::Append {
                seq,
                field: "text".to_string(),
                text: text.to_string(),
            },
        }
    }

    fn texts(ready: &[Ready]) -> Vec<(u64, String)> {
        ready
            .iter()
            .map(|r| {
                let event = r.event();
                match event.update {
                    TimelineUpdate::Append { text, .. } => (event.revision, text),
                    other => (event.revision, format!("{other:?}")),
                }
            })
            .collect()
    }

    #[test]
    fn the_first_append_goes_at_once_and_the_rest_of_the_window_goes_as_one() {
        let agent = AgentId::new();
        let mut c = Coalescer::new(Duration::from_millis(40));
        let t0 = Instant::now();
        assert_eq!(
            texts(&c.push(append(agent, 1, 7, "a"), t0)),
            [(1, "a".into())]
        );
        assert!(c.push(append(agent, 2, 7, "b"), t0).is_empty());
        assert!(c.push(append(agent, 3, 7, "c"), t0).is_empty());
        assert_eq!(c.next_close(), Some(t0 + Duration::from_millis(40)));
        assert!(c.close_due(t0 + Duration::from_millis(39)).is_empty());
        let due = c.close_due(t0 + Duration::from_millis(40));
        assert_eq!(texts(&due), [(3, "bc".into())]);
        // The window opened again; an empty one then ends.
        assert!(c.close_due(t0 + Duration::from_millis(80)).is_empty());
        assert_eq!(c.next_close(), None);
        // A later chunk goes at once again.
        let later = t0 + Duration::from_millis(100);
        assert_eq!(
            texts(&c.push(append(agent, 4, 7, "d"), later)),
            [(4, "d".into())]
        );
    }

    #[test]
    fn other_updates_and_other_items_send_what_was_held_first() {
        let agent = AgentId::new();
        let other = AgentId::new();
        let mut c = Coalescer::new(Duration::from_millis(40));
        let t0 = Instant::now();
        c.push(append(agent, 1, 7, "a"), t0);
        c.push(append(agent, 2, 7, "b"), t0);
        // Another agent's chunk does not flush this one's.
        assert_eq!(
            texts(&c.push(append(other, 1, 1, "x"), t0)),
            [(1, "x".into())]
        );
        // A chunk of another item: the held text goes first, the new one is held.
        assert_eq!(
            texts(&c.push(append(agent, 3, 8, "c"), t0)),
            [(2, "b".into())]
        );
        let patch = TimelineEvent {
            agent_id: agent,
            revision: 4,
            update: TimelineUpdate::Patch {
                seq: 8,
                fields: serde_json::Map::new(),
                at: None,
            },
        };
        let sent = c.push(patch, t0);
        assert_eq!(sent.len(), 2);
        assert_eq!(texts(&sent[..1]), [(3, "c".into())]);
        assert_eq!(sent[1].event().revision, 4);
        c.push(append(agent, 5, 8, "d"), t0);
        assert_eq!(texts(&c.flush_agent(agent)), [(5, "d".into())]);
        assert!(c.flush_agent(agent).is_empty());
    }

    #[test]
    fn the_part_after_a_revision_is_the_text_of_the_later_chunks() {
        let agent = AgentId::new();
        let mut c = Coalescer::new(Duration::from_millis(40));
        let t0 = Instant::now();
        c.push(append(agent, 10, 7, "a"), t0);
        for (revision, text) in [(11, "bb"), (12, "ccc"), (13, "dddd")] {
            c.push(append(agent, revision, 7, text), t0);
        }
        let due = c.close_due(t0 + Duration::from_secs(1));
        let Ready::Joined(joined) = &due[0] else {
            panic!("expected a joined append");
        };
        assert_eq!((joined.first_revision, joined.last_revision()), (11, 13));
        let after = |seen| match joined.after(seen).update {
            TimelineUpdate::Append { text, .. } => text,
            other => panic!("{other:?}"),
        };
        assert_eq!(after(11), "cccdddd");
        assert_eq!(after(12), "dddd");
    }

    #[test]
    fn a_zero_window_sends_everything_as_it_comes() {
        let agent = AgentId::new();
        let mut c = Coalescer::new(Duration::ZERO);
        let t0 = Instant::now();
        for revision in 1..=3 {
            assert_eq!(c.push(append(agent, revision, 7, "a"), t0).len(), 1);
        }
        assert_eq!(c.next_close(), None);
    }
}
