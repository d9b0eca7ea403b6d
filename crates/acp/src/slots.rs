//! The live runtimes' slots: the `[runtimes] max_live` ceiling on agent processes. An agent's
//! task holds a [`SlotGuard`] from before it spawns its process until the process has ended.
//! When a start would pass the ceiling, the least recently used idle runtime is asked to
//! hibernate, and the start waits, in the order starts asked, until a slot is free.
//!
//! The bookkeeping is a plain state machine under one lock; what it decides (slots to hand
//! over, runtimes to ask to hibernate) is done after the lock is released, so a guard is
//! never dropped, nor an agent's task reached, while the lock is held.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use drover_core::AgentId;
use tokio::sync::oneshot;

/// Asks an agent's task to hibernate its idle runtime (it checks again that it is idle).
pub(crate) type Evictor = Box<dyn Fn(AgentId) + Send + Sync>;

/// The slots of one daemon.
pub(crate) struct Slots {
    state: Mutex<State>,
    evictor: Evictor,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// One agent's right to a live process; the slot is free again when it is dropped.
#[derive(Debug)]
pub(crate) struct SlotGuard {
    slots: Arc<Slots>,
    agent: AgentId,
}

/// What asking for a slot gave.
pub(crate) enum Acquired {
    Now(SlotGuard),
    /// Wait for it: the guard comes on this channel once a slot is free (in the order asked).
    Queued(oneshot::Receiver<SlotGuard>),
}

#[derive(Debug, Default)]
struct State {
    /// `None`: no ceiling.
    max: Option<usize>,
    holders: HashMap<AgentId, Holder>,
    waiting: VecDeque<(AgentId, oneshot::Sender<SlotGuard>)>,
    /// Orders the moments runtimes became idle (a counter, not a clock: only the order counts).
    tick: u64,
}

#[derive(Debug, Default)]
struct Holder {
    /// When its runtime became idle, as a [`State::tick`] (`None`: busy or starting).
    idle_since: Option<u64>,
    /// It was asked to hibernate and has not answered by becoming busy or ending.
    evicting: bool,
}

/// Slots to hand over (made under the lock, sent after it).
type Grants = Vec<(oneshot::Sender<SlotGuard>, SlotGuard)>;

impl Slots {
    pub(crate) fn new(evictor: Evictor) -> Slots {
        Slots {
            state: Mutex::default(),
            evictor,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for a slot for `agent` under the ceiling `max` (as `config.toml` says now).
    pub(crate) fn acquire(self: &Arc<Self>, agent: AgentId, max: Option<usize>) -> Acquired {
        let mut state = self.lock();
        state.max = max;
        state.purge_gone();
        let room = max.is_none_or(|m| state.holders.len() < m);
        if room && state.waiting.is_empty() {
            state.holders.insert(agent, Holder::default());
            return Acquired::Now(self.guard(agent));
        }
        let (tx, rx) = oneshot::channel();
        state.waiting.push_back((agent, tx));
        self.settle(state);
        Acquired::Queued(rx)
    }

    /// A slot for a warm spare (see `crate::warm`), only if one is free now and no start
    /// waits: a spare never makes a real start wait. It counts as the runtime idle longest,
    /// so it is the first given up when a start needs room.
    pub(crate) fn acquire_spare(
        self: &Arc<Self>,
        spare: AgentId,
        max: Option<usize>,
    ) -> Option<SlotGuard> {
        let mut state = self.lock();
        state.max = max;
        state.purge_gone();
        let room = max.is_none_or(|m| state.holders.len() < m);
        if !room || !state.waiting.is_empty() {
            return None;
        }
        state.holders.insert(
            spare,
            Holder {
                idle_since: Some(0),
                evicting: false,
            },
        );
        Some(self.guard(spare))
    }

    /// Makes a warm spare's slot `agent`'s (the agent took the spare): no other slot is asked
    /// for, so a full ceiling does not end the spare it is about to use.
    pub(crate) fn rekey(self: &Arc<Self>, mut guard: SlotGuard, agent: AgentId) -> SlotGuard {
        let mut state = self.lock();
        state.holders.remove(&guard.agent);
        state.holders.insert(agent, Holder::default());
        guard.agent = agent;
        // If the spare was asked to make room, another is asked now.
        self.settle(state);
        guard
    }

    /// `agent`'s runtime became idle (`true`) or busy. An idle one is what a waiting start
    /// makes room with, least recently used first.
    pub(crate) fn set_idle(self: &Arc<Self>, agent: AgentId, idle: bool) {
        let mut state = self.lock();
        state.tick += 1;
        let tick = state.tick;
        if let Some(holder) = state.holders.get_mut(&agent) {
            if idle {
                holder.idle_since.get_or_insert(tick);
            } else {
                holder.idle_since = None;
                // Whatever asked it to hibernate asks another.
                holder.evicting = false;
            }
        }
        self.settle(state);
    }

    /// How many slots are held (agents with a process, or about to start one).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.lock().holders.len()
    }

    /// How many starts wait for a slot.
    pub(crate) fn queued(&self) -> usize {
        let mut state = self.lock();
        state.purge_gone();
        state.waiting.len()
    }

    fn guard(self: &Arc<Self>, agent: AgentId) -> SlotGuard {
        SlotGuard {
            slots: self.clone(),
            agent,
        }
    }

    fn release(self: &Arc<Self>, agent: AgentId) {
        let mut state = self.lock();
        state.holders.remove(&agent);
        self.settle(state);
    }

    /// Decides under the lock, then acts without it: hands the slots over (a start that gave
    /// up meanwhile drops its guard here, which frees the slot for the next) and asks the
    /// chosen runtimes to hibernate.
    fn settle(self: &Arc<Self>, mut state: MutexGuard<'_, State>) {
        let (grants, evict) = state.decide(self);
        drop(state);
        for (tx, guard) in grants {
            drop(tx.send(guard));
        }
        for agent in evict {
            (self.evictor)(agent);
        }
    }
}

impl State {
    /// Forgets the starts nobody waits for any more (their task ended).
    fn purge_gone(&mut self) {
        self.waiting.retain(|(_, tx)| !tx.is_closed());
    }

    /// Hands free slots to the starts that wait, in order; then asks as many idle runtimes to
    /// hibernate as starts still wait (least recently used first, none asked twice).
    fn decide(&mut self, slots: &Arc<Slots>) -> (Grants, Vec<AgentId>) {
        self.purge_gone();
        let mut grants = Vec::new();
        while self.max.is_none_or(|m| self.holders.len() < m) {
            let Some((agent, tx)) = self.waiting.pop_front() else {
                break;
            };
            self.holders.insert(agent, Holder::default());
            grants.push((tx, slots.guard(agent)));
        }
        let asked = self.holders.values().filter(|h| h.evicting).count();
        let mut wanted = self.waiting.len().saturating_sub(asked);
        let mut idle: Vec<(u64, AgentId)> = self
            .holders
            .iter()
            .filter(|(_, h)| !h.evicting)
            .filter_map(|(id, h)| h.idle_since.map(|t| (t, *id)))
            .collect();
        idle.sort();
        let mut evict = Vec::new();
        for (_, id) in idle {
            if wanted == 0 {
                break;
            }
            if let Some(holder) = self.holders.get_mut(&id) {
                holder.evicting = true;
                evict.push(id);
                wanted -= 1;
            }
        }
        (grants, evict)
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.release(self.agent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> AgentId {
        AgentId::new()
    }

    /// Slots whose evictions are recorded, and the record.
    fn recorded() -> (Arc<Slots>, Arc<Mutex<Vec<AgentId>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = asked.clone();
        let slots = Slots::new(Box::new(move |a| {
            record.lock().expect("record").push(a);
        }));
        (Arc::new(slots), asked)
    }

    fn take(asked: &Mutex<Vec<AgentId>>) -> Vec<AgentId> {
        std::mem::take(&mut *asked.lock().expect("record"))
    }

    fn now(acquired: Acquired) -> SlotGuard {
        match acquired {
            Acquired::Now(g) => g,
            Acquired::Queued(_) => panic!("queued, expected a slot at once"),
        }
    }

    fn queued(acquired: Acquired) -> oneshot::Receiver<SlotGuard> {
        match acquired {
            Acquired::Queued(rx) => rx,
            Acquired::Now(_) => panic!("got a slot, expected to wait"),
        }
    }

    #[test]
    fn a_full_ceiling_evicts_the_least_recently_idle_and_queues_in_order() {
        let (slots, asked) = recorded();
        let (first, second, third, fourth, fifth) = (id(), id(), id(), id(), id());
        let slot_a = now(slots.acquire(first, Some(2)));
        let slot_b = now(slots.acquire(second, Some(2)));
        // Both busy: a third start waits and nobody is asked to hibernate.
        let mut wait_c = queued(slots.acquire(third, Some(2)));
        assert!(take(&asked).is_empty());
        // The second goes idle before the first: it is the least recently used, and is asked.
        slots.set_idle(second, true);
        assert_eq!(take(&asked), vec![second]);
        slots.set_idle(first, true);
        assert!(take(&asked).is_empty(), "one start waits: one eviction");
        // A fourth start asks for the next idle one.
        let mut wait_d = queued(slots.acquire(fourth, Some(2)));
        assert_eq!(take(&asked), vec![first]);
        // A fifth finds nobody idle left to ask.
        let wait_e = queued(slots.acquire(fifth, Some(2)));
        assert!(take(&asked).is_empty());
        assert_eq!(slots.queued(), 3);
        // The second hibernates: its slot goes to the third, the first that waited.
        drop(slot_b);
        let slot_c = wait_c.try_recv().expect("the third got the second's slot");
        assert!(wait_d.try_recv().is_err());
        assert_eq!(slots.held(), 2);
        // The fourth gives up (its task ended): the first's slot goes to the fifth.
        drop(wait_d);
        drop(slot_a);
        let mut wait_e = wait_e;
        let slot_e = wait_e.try_recv().expect("the fifth got the first's slot");
        assert_eq!(slots.queued(), 0);
        drop((slot_c, slot_e));
        assert_eq!(slots.held(), 0);
        assert!(
            take(&asked).is_empty(),
            "nothing waits: nobody else is asked"
        );
    }

    #[test]
    fn an_asked_runtime_that_became_busy_passes_the_request_on() {
        let (slots, asked) = recorded();
        let (a, b, c) = (id(), id(), id());
        let _ga = now(slots.acquire(a, Some(2)));
        let _gb = now(slots.acquire(b, Some(2)));
        slots.set_idle(a, true);
        slots.set_idle(b, true);
        assert!(take(&asked).is_empty(), "nobody waits");
        let _rc = queued(slots.acquire(c, Some(2)));
        assert_eq!(take(&asked), vec![a], "a was idle longest");
        // A message reached a before it hibernated: b is asked instead.
        slots.set_idle(a, false);
        assert_eq!(take(&asked), vec![b]);
    }

    #[test]
    fn a_spare_takes_only_a_free_slot_and_is_given_up_first() {
        let (slots, asked) = recorded();
        let (a, spare, b, c) = (id(), id(), id(), id());
        let _ga = now(slots.acquire(a, Some(2)));
        slots.set_idle(a, true);
        let spare_slot = slots.acquire_spare(spare, Some(2)).expect("a free slot");
        assert!(slots.acquire_spare(id(), Some(2)).is_none(), "full");
        // A start needs room: the spare goes first, although `a` was idle before it came.
        let mut wait_b = queued(slots.acquire(b, Some(2)));
        assert_eq!(take(&asked), vec![spare]);
        drop(spare_slot);
        let _gb = wait_b.try_recv().expect("the spare's slot");
        // A start waits: no spare may take a slot before it.
        let _wait_c = queued(slots.acquire(c, Some(2)));
        assert!(slots.acquire_spare(id(), Some(3)).is_none());
    }

    #[test]
    fn a_taken_spares_slot_becomes_the_agents() {
        let (slots, asked) = recorded();
        let (spare, agent, other) = (id(), id(), id());
        let guard = slots.acquire_spare(spare, Some(1)).expect("a free slot");
        let mut wait = queued(slots.acquire(other, Some(1)));
        assert_eq!(take(&asked), vec![spare]);
        // An agent takes the spare before it ended: the slot is the agent's, busy.
        let mine = slots.rekey(guard, agent);
        assert!(take(&asked).is_empty(), "nobody idle to ask");
        assert_eq!(slots.held(), 1);
        assert!(wait.try_recv().is_err());
        slots.set_idle(agent, true);
        assert_eq!(take(&asked), vec![agent]);
        drop(mine);
        assert!(
            wait.try_recv().is_ok(),
            "the agent's slot went to the waiting start"
        );
    }

    #[test]
    fn without_a_ceiling_every_start_gets_a_slot() {
        let (slots, asked) = recorded();
        let guards: Vec<SlotGuard> = (0..50).map(|_| now(slots.acquire(id(), None))).collect();
        assert!(take(&asked).is_empty());
        assert_eq!(slots.held(), 50);
        drop(guards);
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn a_raised_ceiling_lets_waiting_starts_in() {
        let (slots, _) = recorded();
        let _ga = now(slots.acquire(id(), Some(1)));
        let mut rb = queued(slots.acquire(id(), Some(1)));
        // The next start reads a higher ceiling from config.toml: both fit now, in order.
        let mut rc = queued(slots.acquire(id(), Some(3)));
        assert!(rb.try_recv().is_ok() && rc.try_recv().is_ok());
    }
}
