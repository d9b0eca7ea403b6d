//! Which agents' timeline updates one session gets, and the hand-off that makes an
//! `agent_initialized` answer plus the updates after it the whole timeline.

use std::collections::HashMap;
use std::sync::Arc;

use drover_core::AgentId;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::{HUB_CAPACITY, Outgoing};

/// Which agents' updates a session gets.
///
/// An `agent_initialized` covers the timeline up to a revision, read while the hub goes on
/// broadcasting. Updates of an agent that is being initialized are therefore held (not
/// dropped) until the answer is sent; then those newer than the answer follow it, so the
/// client's history plus the updates is the timeline, with no gap and no repeat.
#[derive(Default)]
pub(super) struct Subscriptions {
    /// Agent → the timeline revision its last `agent_initialized` covered.
    initialized: HashMap<AgentId, u64>,
    /// Agents not yet initialized with an `initialize_agent_request` in flight.
    pending: HashMap<AgentId, Pending>,
}

#[derive(Default)]
struct Pending {
    requests: usize,
    /// At most `HUB_CAPACITY`: more means the initialization took so long that the session
    /// must resync anyway.
    held: Vec<Arc<Outgoing>>,
}

pub(super) enum Route {
    /// This text (the event's, or the part of a joined `append` the session lacks).
    Send(Utf8Bytes),
    Skip,
    /// A held queue is full: the session fell behind.
    Overflow,
}

impl Subscriptions {
    /// An `initialize_agent_request` for `agent` was received; true if its updates are held
    /// until the answer (the agent is not initialized yet).
    pub(super) fn begin(&mut self, agent: AgentId) -> bool {
        if self.initialized.contains_key(&agent) {
            return false;
        }
        self.pending.entry(agent).or_default().requests += 1;
        true
    }

    pub(super) fn route(&mut self, event: &Arc<Outgoing>) -> Route {
        let Some(agent) = event.agent else {
            return Route::Send(event.text.clone());
        };
        if let Some(seen) = self.initialized.get(&agent) {
            return event.after(*seen).map_or(Route::Skip, Route::Send);
        }
        if let Some(pending) = self.pending.get_mut(&agent) {
            if pending.held.len() >= HUB_CAPACITY {
                return Route::Overflow;
            }
            pending.held.push(event.clone());
        }
        Route::Skip
    }

    /// An initialization ended: answered at `revision`, or failed (`None`). Returns what to
    /// send after the answer: the held updates newer than it.
    pub(super) fn finish(
        &mut self,
        agent: AgentId,
        held: bool,
        revision: Option<u64>,
    ) -> Vec<Utf8Bytes> {
        let mut release = Vec::new();
        if held && let Some(pending) = self.pending.get_mut(&agent) {
            pending.requests = pending.requests.saturating_sub(1);
            // A failure leaves the held updates to another request in flight, if any.
            if revision.is_some() || pending.requests == 0 {
                release = std::mem::take(&mut pending.held);
            }
            if pending.requests == 0 {
                self.pending.remove(&agent);
            }
        }
        let Some(revision) = revision else {
            return Vec::new();
        };
        self.initialized.insert(agent, revision);
        release
            .iter()
            .filter_map(|event| event.after(revision))
            .collect()
    }

    /// The revision `agent`'s last `agent_initialized` covered, if this session has one.
    pub(super) fn seen(&self, agent: AgentId) -> Option<u64> {
        self.initialized.get(&agent).copied()
    }

    /// The session fell behind: every subscription ends; the client re-initializes.
    pub(super) fn reset(&mut self) {
        self.initialized.clear();
        for pending in self.pending.values_mut() {
            pending.held.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(agent: AgentId, revision: u64) -> Arc<Outgoing> {
        Arc::new(Outgoing {
            agent: Some(agent),
            revision,
            text: Utf8Bytes::from(format!("r{revision}")),
            joined: None,
            status_of: None,
        })
    }

    fn revisions(texts: &[Utf8Bytes]) -> Vec<u64> {
        texts
            .iter()
            .map(|t| {
                t.as_str()
                    .trim_start_matches('r')
                    .parse()
                    .expect("r<revision>")
            })
            .collect()
    }

    #[test]
    fn updates_during_initialization_are_held_then_only_newer_ones_sent() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        assert!(matches!(subs.route(&update(agent, 1)), Route::Skip));
        assert!(subs.begin(agent));
        for revision in 2..=5 {
            assert!(matches!(subs.route(&update(agent, revision)), Route::Skip));
        }
        // The answer covered revision 3: 4 and 5 follow it.
        assert_eq!(revisions(&subs.finish(agent, true, Some(3))), [4, 5]);
        assert!(matches!(subs.route(&update(agent, 6)), Route::Send(_)));
        // Initialized already: a second request holds nothing and moves the mark.
        assert!(!subs.begin(agent));
        assert!(subs.finish(agent, false, Some(8)).is_empty());
        assert!(matches!(subs.route(&update(agent, 8)), Route::Skip));
        assert!(matches!(subs.route(&update(agent, 9)), Route::Send(_)));
        // Status events always go.
        let status = Arc::new(Outgoing {
            agent: None,
            revision: 0,
            text: Utf8Bytes::from_static("s"),
            joined: None,
            status_of: None,
        });
        assert!(matches!(subs.route(&status), Route::Send(_)));
    }

    #[test]
    fn a_joined_append_the_snapshot_partly_holds_sends_only_the_rest() {
        use super::super::coalesce::Joined;
        let agent = AgentId::new();
        let joined = Arc::new(Joined {
            agent_id: agent,
            seq: 3,
            field: "text".to_string(),
            text: "abbccc".to_string(),
            first_revision: 5,
            ends: vec![1, 3, 6],
        });
        let event = Arc::new(Outgoing {
            agent: Some(agent),
            revision: 7,
            text: Utf8Bytes::from_static("all of it"),
            joined: Some(joined),
            status_of: None,
        });
        let mut subs = Subscriptions::default();
        assert!(subs.begin(agent));
        assert!(matches!(subs.route(&event), Route::Skip));
        // The snapshot covered revisions up to 5 ("a"): only "bbccc" follows.
        let release = subs.finish(agent, true, Some(5));
        assert_eq!(release.len(), 1);
        let sent: serde_json::Value = serde_json::from_str(release[0].as_str()).expect("JSON");
        assert_eq!(sent["payload"]["notification"]["text"], "bbccc", "{sent}");
        // A snapshot before all of it gets the whole event; one after it, nothing.
        subs.finish(agent, false, Some(4));
        assert!(matches!(subs.route(&event), Route::Send(t) if t.as_str() == "all of it"));
        subs.finish(agent, false, Some(7));
        assert!(matches!(subs.route(&event), Route::Skip));
    }

    #[test]
    fn a_failed_initialization_subscribes_nothing() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        assert!(subs.begin(agent));
        assert!(subs.begin(agent));
        subs.route(&update(agent, 1));
        // One of two requests fails: the other still gets the held updates.
        assert!(subs.finish(agent, true, None).is_empty());
        assert_eq!(revisions(&subs.finish(agent, true, Some(0))), [1]);
        let other = AgentId::new();
        assert!(subs.begin(other));
        subs.route(&update(other, 1));
        assert!(subs.finish(other, true, None).is_empty());
        assert!(subs.pending.is_empty());
        assert!(matches!(subs.route(&update(other, 2)), Route::Skip));
    }

    #[test]
    fn holding_is_bounded_and_a_reset_unsubscribes() {
        let agent = AgentId::new();
        let mut subs = Subscriptions::default();
        subs.begin(agent);
        for revision in 1..=HUB_CAPACITY as u64 {
            assert!(matches!(subs.route(&update(agent, revision)), Route::Skip));
        }
        assert!(matches!(
            subs.route(&update(agent, HUB_CAPACITY as u64 + 1)),
            Route::Overflow
        ));
        subs.reset();
        let initialized = AgentId::new();
        subs.begin(initialized);
        subs.finish(initialized, true, Some(0));
        subs.reset();
        assert!(matches!(subs.route(&update(initialized, 1)), Route::Skip));
    }
}
