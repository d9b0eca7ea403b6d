//! Idle runtimes: when the task is quiet (no turn, nothing queued that wakes it, no pending
//! permission, no notice on its way, no start asked for or waiting, no ACP terminal of the
//! runtime still running) and its process tree holds no background work, its idle clock runs;
//! after `[runtimes] idle_timeout` a live runtime hibernates (its process tree ends, the
//! record keeps its status, the next message resumes it through `session/load`), and a task
//! without a process simply ends, so a cold agent holds nothing but its files.
//!
//! Background work is what the agent started itself and left running (a background shell, a
//! dev server, a build): the processes of its tree that are not the agent's own (see
//! [`process::background_processes`] for the rule). Hibernation would kill them, so a runtime
//! holding any is kept live: it is looked for when the task becomes quiet and again before it
//! hibernates or makes room under `max_live`, and looked at every [`BACKGROUND_LOOK`] while it
//! keeps the runtime live; once it ended, the idle clock starts.
//!
//! Also here: the runtime's slot under `max_live` (asked for before a process is spawned,
//! waited for in order when the ceiling is reached) and the runtime view clients see.

use std::time::Duration;

use drover_protocol::ItemKind;
use serde_json::json;
use tokio::time::Instant;

use super::Actor;
use crate::process;
use crate::slots::{Acquired, SlotGuard};
use crate::{RuntimeState, RuntimeView};

/// How often a runtime kept live by background processes looks whether they ended (one read
/// of `/proc`, only for such runtimes).
const BACKGROUND_LOOK: Duration = Duration::from_secs(2);

/// The background processes of an otherwise quiet runtime.
#[derive(Debug, Default)]
pub(super) struct Background {
    /// Looked for since the task became quiet.
    looked: bool,
    /// How many the last look found.
    pub(super) count: usize,
    /// When to look again (while some keep the runtime live).
    next: Option<Instant>,
}

impl Background {
    pub(super) fn next_look(&self) -> Option<Instant> {
        self.next
    }
}

/// Since when the task has been quiet, and when its runtime hibernates.
#[derive(Debug, Default)]
pub(super) struct IdleClock {
    since: Option<Instant>,
    deadline: Option<Instant>,
    /// The deadline as a wall-clock time, for clients.
    at: Option<jiff::Timestamp>,
}

impl IdleClock {
    /// The task is quiet (`true`) or busy at `now`; `timeout` is read when it becomes quiet.
    /// Returns whether that changed.
    pub(super) fn update(
        &mut self,
        quiet: bool,
        now: Instant,
        timeout: impl FnOnce() -> Option<Duration>,
    ) -> bool {
        match (quiet, self.since) {
            (true, None) => {
                let timeout = timeout();
                self.since = Some(now);
                self.deadline = timeout.map(|t| now + t);
                self.at = timeout.and_then(|t| {
                    let t = jiff::SignedDuration::try_from(t).ok()?;
                    jiff::Timestamp::now().checked_add(t).ok()
                });
                true
            }
            (false, Some(_)) => {
                *self = IdleClock::default();
                true
            }
            _ => false,
        }
    }

    /// Something used the runtime without making it busy (a client opened the agent): its
    /// idle time starts again at the next [`IdleClock::update`]. Returns whether it was quiet.
    pub(super) fn touch(&mut self) -> bool {
        let was = self.since.is_some();
        *self = IdleClock::default();
        was
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    pub(super) fn hibernate_at(&self) -> Option<jiff::Timestamp> {
        self.at
    }

    fn idle_for(&self) -> Duration {
        self.since.map(|s| s.elapsed()).unwrap_or_default()
    }
}

impl Actor {
    /// Nothing to do: no turn, nothing queued that wakes the agent, no pending permission,
    /// no notice on its way, no start asked for, waiting or under way, no terminal running
    /// (hibernation would kill it: it belongs to the ACP session).
    pub(super) fn quiet(&self) -> bool {
        // What waits for a user's retry after a failed start is not work to do now.
        let waits_for_user = self.retry.failing() && self.retry.due().is_none();
        self.turn.is_none()
            && self.permissions.is_empty()
            && self.notices.is_none()
            && (!self.inbox.has_wake()
                || waits_for_user
                || self.limit_wait.is_some()
                || self.budget_held)
            && self.retry.due().is_none()
            && self.slot_wait.is_none()
            && !self.want_start
            && !self.starting
            && !self.terminal_running()
    }

    /// Runs the idle clock, tells the slots whether the runtime is idle (what a waiting start
    /// makes room with), and publishes the runtime view. A quiet task with a live runtime
    /// looks for background processes once: while it has some it is not idle.
    pub(super) async fn track_idle(&mut self) {
        let mut quiet = self.quiet();
        if !quiet || self.live.is_none() {
            self.background = Background::default();
        } else if !self.background.looked {
            self.look_background().await;
        }
        quiet &= self.background.count == 0;
        let shared = self.shared.clone();
        if self
            .idle
            .update(quiet, Instant::now(), || shared.settings().idle_timeout)
        {
            self.shared
                .slots
                .set_idle(self.id, quiet && self.live.is_some());
        }
        self.publish_runtime();
    }

    /// A client used the runtime: its idle time (and its place among the least recently
    /// used) starts again.
    pub(super) fn touch(&mut self) {
        if self.idle.touch() {
            self.shared.slots.set_idle(self.id, false);
        }
    }

    /// Where the runtime is, for clients.
    pub(super) fn publish_runtime(&self) {
        let state = if self.starting {
            RuntimeState::Starting
        } else if self.live.is_some() {
            RuntimeState::Live
        } else if self.slot_wait.is_some() {
            RuntimeState::Queued
        } else {
            RuntimeState::Cold
        };
        let view = RuntimeView {
            state,
            pid: self.live.as_ref().map(|l| l.running.pid),
            hibernate_at: self
                .live
                .as_ref()
                .and_then(|_| self.idle.hibernate_at())
                .filter(|_| !self.starting),
            retry_at: self.retry.at(),
            background: self.background.count,
        };
        self.shared.set_runtime(self.id, view);
    }

    /// Makes sure the runtime is live: true when it is; false while its start waits for a
    /// slot under `max_live`, or when it failed to start.
    pub(super) async fn ensure_live(&mut self) -> bool {
        if self.live.is_some() {
            return true;
        }
        if self.slot_wait.is_some() {
            return false;
        }
        let slot = if let Some(slot) = self.granted.take() {
            slot
        } else if let Some(slot) = self.take_spare_slot() {
            // A warm spare comes with its slot: no other is asked for, even under a full
            // ceiling.
            slot
        } else {
            let max = self.shared.settings().max_live;
            match self.shared.slots.acquire(self.id, max) {
                Acquired::Now(slot) => slot,
                Acquired::Queued(rx) => {
                    tracing::info!(agent = %self.id, max_live = ?max, "the start waits for a live slot");
                    self.slot_wait = Some(rx);
                    self.publish_runtime();
                    return false;
                }
            }
        };
        self.start_runtime(slot).await.is_ok()
    }

    /// A ready warm spare of the agent's provider, kept for the start, and its slot made the
    /// agent's.
    fn take_spare_slot(&mut self) -> Option<SlotGuard> {
        let provider = self.shared.registry.get(self.id)?.provider;
        let providers = self.shared.providers.current().ok()?;
        let mut spare = self.shared.actors.spares.take(providers.get(&provider)?)?;
        let slot = self.shared.slots.rekey(spare.slot.take()?, self.id);
        self.spare = Some(spare);
        Some(slot)
    }

    /// A slot nobody took (the message that wanted it was cancelled or blocked) is freed, and
    /// a start nothing wants any more stops waiting.
    pub(super) fn settle_slot(&mut self) {
        self.granted = None;
        let wanted = self.want_start || self.wake_pending();
        if self.slot_wait.is_some() && !wanted {
            self.slot_wait = None;
        }
    }

    /// Reads which processes are the agent's own, once its session is ready.
    pub(super) async fn note_own_processes(&mut self) {
        let Some((pid, marker)) = self
            .live
            .as_ref()
            .map(|l| (l.running.pid, l.marker.clone()))
        else {
            return;
        };
        let own = tokio::task::spawn_blocking(move || process::own_processes(pid, Some(&marker)))
            .await
            .unwrap_or_default();
        if let Some(live) = self.live.as_mut() {
            live.own = Some(std::sync::Arc::new(own));
        }
    }

    /// Looks for the live runtime's background processes now (none before its session is
    /// ready); while there are some, it looks again every [`BACKGROUND_LOOK`].
    pub(super) async fn look_background(&mut self) {
        let found = match self.live.as_ref() {
            Some(live) => match live.own.clone() {
                Some(own) => {
                    let (pid, marker) = (live.running.pid, live.marker.clone());
                    tokio::task::spawn_blocking(move || {
                        process::background_processes(pid, Some(&marker), &own)
                    })
                    .await
                    .unwrap_or_default()
                }
                None => 0,
            },
            None => 0,
        };
        match (self.background.count, found) {
            (before, now) if before == now => {}
            (_, 0) => tracing::info!(agent = %self.id, "the background processes ended"),
            _ => {
                tracing::info!(agent = %self.id, background = found, "background processes keep the runtime live");
            }
        }
        self.background = Background {
            looked: true,
            count: found,
            next: (found > 0).then(|| Instant::now() + BACKGROUND_LOOK),
        };
    }

    /// Ends the task if it is quiet: a live runtime hibernates first (its process tree ends;
    /// the record keeps its status), unless it holds background processes. With `only_live`,
    /// a task without a process stays. Returns whether the task ends; it takes no more
    /// commands then.
    pub(super) async fn hibernate(&mut self, why: &str, only_live: bool) -> bool {
        if !self.quiet() || (only_live && self.live.is_none()) {
            return false;
        }
        if self.live.is_some() {
            // Work the agent started since the last look counts too.
            self.look_background().await;
            if self.background.count > 0 {
                return false;
            }
        }
        // Later senders find the channel closed and wait for this task's end; what is already
        // in it goes to the next task (see `spawn`).
        self.commands.close();
        self.hibernated = true;
        if self.live.is_some() {
            let idle_for = self.idle.idle_for();
            tracing::info!(agent = %self.id, why, idle_secs = idle_for.as_secs(), "hibernating an idle runtime");
            self.stop_runtime().await;
            self.push(
                ItemKind::Notice,
                json!({"text": format!("the runtime hibernated ({why}); the next message resumes it"), "hibernated": true}),
            );
            let _ = self.timeline.sync();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(900);

    #[test]
    fn the_deadline_is_a_timeout_after_the_first_quiet_moment() {
        let start = Instant::now();
        let mut clock = IdleClock::default();
        assert!(clock.update(true, start, || Some(TIMEOUT)));
        assert_eq!(clock.deadline(), Some(start + TIMEOUT));
        assert!(clock.hibernate_at().is_some());
        // Still quiet later: nothing changes, the timeout is not read again.
        let later = start + Duration::from_secs(600);
        assert!(!clock.update(true, later, || panic!("read only when it becomes quiet")));
        assert_eq!(clock.deadline(), Some(start + TIMEOUT));
    }

    #[test]
    fn busy_stops_the_clock_and_a_touch_restarts_it() {
        let start = Instant::now();
        let mut clock = IdleClock::default();
        clock.update(true, start, || Some(TIMEOUT));
        // A turn: no deadline while busy.
        assert!(clock.update(false, start + Duration::from_secs(50), || None));
        assert_eq!(clock.deadline(), None);
        assert_eq!(clock.hibernate_at(), None);
        // Quiet again: a whole timeout from then, not from the first quiet moment.
        let again = start + Duration::from_secs(100);
        clock.update(true, again, || Some(TIMEOUT));
        assert_eq!(clock.deadline(), Some(again + TIMEOUT));
        // A client opens the agent: the clock starts over at the next quiet moment.
        assert!(clock.touch());
        assert_eq!(clock.deadline(), None);
        let opened = start + Duration::from_secs(130);
        clock.update(true, opened, || Some(TIMEOUT));
        assert_eq!(clock.deadline(), Some(opened + TIMEOUT));
        assert!(!IdleClock::default().touch(), "a busy clock was not quiet");
    }

    #[test]
    fn a_zero_timeout_never_hibernates() {
        let mut clock = IdleClock::default();
        assert!(clock.update(true, Instant::now(), || None));
        assert_eq!(clock.deadline(), None);
        assert_eq!(clock.hibernate_at(), None);
    }
}
