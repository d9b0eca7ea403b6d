//! Schedules: prompts on a timetable. Each one delivers its prompt to an existing agent (a
//! followup) or creates a new agent, once at a time, every fixed duration, or by cron.
//!
//! - One task, [`Schedules::start`], sleeps until the earliest due time in an ordered set
//!   (a change wakes it); nothing ticks over all schedules. It wakes at least every
//!   [`MAX_SLEEP`] to re-read the wall clock, which a suspended machine moves without telling
//!   the monotonic one.
//! - A firing goes through the operations layer (the sink, [`Deliver`]): the send path for a
//!   followup, the create path for a new agent. It is at-least-once with the window closed
//!   at boot: the schedule records a *pending* run with the message id it will use (fsynced)
//!   before it queues the prompt, and the run after the inbox has it. A crash in between
//!   leaves the pending run, and the next boot looks for that message id in the agent's
//!   inbox and timeline (and for the agent created with the run's label): found, the run is
//!   recorded; not found, it is delivered then. So a firing is delivered exactly once.
//! - After downtime a recurring schedule runs its latest missed occurrence once; a `once`
//!   schedule whose time passed runs at boot.
//! - A schedule is `schedule` activity of the agent it targets (or the parent of the agents
//!   it creates): archive admission lists it, and `stopActivity` deletes it. A schedule
//!   whose agent is archived, or whose lineage reaches an archived agent, never fires: it is
//!   paused, with a run saying why.

pub(crate) mod cadence;
pub(crate) mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use drover_core::inbox::{Delivery, InboxMessage};
use drover_core::runtime::BoxFuture;
use drover_core::{ActivityFamily, ActivityItem, Agent, AgentId};
use jiff::Timestamp;
use tokio::sync::{Notify, Semaphore, broadcast, watch};

pub(crate) use cadence::{Cadence, CadenceError};
pub(crate) use store::{NewAgentSpec, PendingRun, Run, Schedule, ScheduleId, State, Target};

/// The longest the timer sleeps before it reads the wall clock again.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Firings at once (each queues one prompt: a few fsyncs).
const CONCURRENT_FIRINGS: usize = 32;
/// Schedule changes a slow subscriber may fall behind by before it must re-read the list.
const EVENT_CAPACITY: usize = 1024;
/// The label a created agent carries: the schedule that made it.
pub(crate) const SCHEDULE_LABEL: &str = "drover.schedule";
/// The label a created agent carries: the run (its prompt's message id) that made it.
pub(crate) const RUN_LABEL: &str = "drover.schedule-run";

/// Where a firing goes: the operations layer in the daemon.
pub(crate) trait Deliver: Send + Sync + 'static {
    /// Why the schedule must not fire now (its agent or lineage is archived, or the agent that
    /// made it no longer controls its agent), if so.
    fn blocked(&self, schedule: &Schedule) -> Option<String>;
    /// Delivers `message`, a run's prompt, to the schedule's target, and resolves with the
    /// agent it went to once it is durable: a followup to its agent, or the first prompt of
    /// the agent its spec describes, created labelled with the schedule and the run (unless
    /// `existing`, one a crashed run already created).
    fn deliver(
        &self,
        schedule: &Schedule,
        message: InboxMessage,
        existing: Option<AgentId>,
    ) -> BoxFuture<'static, Result<AgentId, String>>;
    /// Whether `message_id` reached `agent`'s inbox or timeline (read only).
    fn reached(&self, agent: AgentId, message_id: &str) -> bool;
    /// The agent a run created, by its labels.
    fn created_by_run(&self, schedule: ScheduleId, message_id: &str) -> Option<AgentId>;
}

/// What clients hear: a schedule as it is now, or gone.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleEvent {
    pub(crate) id: ScheduleId,
    /// `None`: deleted.
    pub(crate) schedule: Option<Schedule>,
}

/// Where "now" comes from: the system clock, or (in tests under `tokio::time::pause`) a wall
/// clock that moves with tokio's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    System,
    #[cfg_attr(not(test), expect(dead_code))]
    Tokio {
        base: Timestamp,
        at: tokio::time::Instant,
    },
}

impl Clock {
    #[cfg(test)]
    pub(crate) fn tokio_from(base: Timestamp) -> Clock {
        Clock::Tokio {
            base,
            at: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now(self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Tokio { base, at } => {
                let elapsed = jiff::SignedDuration::try_from(at.elapsed()).unwrap_or_default();
                base.checked_add(elapsed).unwrap_or(base)
            }
        }
    }
}

/// Why a schedule request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScheduleError {
    #[error("schedule `{0}` not found")]
    Unknown(String),
    #[error(transparent)]
    Cadence(#[from] CadenceError),
    #[error(transparent)]
    Store(#[from] drover_core::store::StoreError),
    #[error("the daemon is shutting down")]
    ShuttingDown,
}

/// The daemon's schedules. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Schedules {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Schedules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedules")
            .field("home", &self.inner.home)
            .finish_non_exhaustive()
    }
}

struct Inner {
    home: PathBuf,
    clock: Clock,
    state: Mutex<Table>,
    /// Serializes writes of schedule files: held across the blocking write, never across a
    /// delivery.
    writer: tokio::sync::Mutex<()>,
    /// Wakes the timer when the earliest due time may have changed.
    wake: Notify,
    events: broadcast::Sender<ScheduleEvent>,
    stop: watch::Sender<bool>,
}

#[derive(Default)]
struct Table {
    all: BTreeMap<ScheduleId, Schedule>,
    /// Armed schedules by due time: the timer's queue.
    due: BTreeSet<(Timestamp, ScheduleId)>,
    next_id: u64,
}

impl Table {
    fn put(&mut self, schedule: Schedule) {
        self.remove(schedule.id);
        if let Some(at) = armed(&schedule) {
            self.due.insert((at, schedule.id));
        }
        self.all.insert(schedule.id, schedule);
    }

    fn remove(&mut self, id: ScheduleId) -> Option<Schedule> {
        let old = self.all.remove(&id)?;
        if let Some(at) = armed(&old) {
            self.due.remove(&(at, id));
        }
        Some(old)
    }
}

/// When the timer should fire it: active, not in the middle of a delivery.
fn armed(s: &Schedule) -> Option<Timestamp> {
    if s.paused || s.pending.is_some() {
        return None;
    }
    s.next_run_at
}

fn lock(m: &Mutex<Table>) -> MutexGuard<'_, Table> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a request makes: everything but the id and the times.
#[derive(Debug, Clone)]
pub(crate) struct NewSchedule {
    pub(crate) created_by: Option<AgentId>,
    pub(crate) title: Option<String>,
    pub(crate) target: Target,
    pub(crate) prompt: String,
    pub(crate) cadence: Cadence,
}

impl Schedules {
    /// Loads `$DROVER_HOME/schedules/`. Nothing fires until [`Schedules::start`].
    pub(crate) fn open(home: &Path, clock: Clock) -> Schedules {
        let mut table = Table::default();
        let loaded = store::load(home);
        // Past every id on disk, the files boot left alone included: none is taken over.
        table.next_id = loaded.highest_id;
        for s in loaded.schedules {
            table.put(s);
        }
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let (stop, _) = watch::channel(false);
        Schedules {
            inner: Arc::new(Inner {
                home: home.to_path_buf(),
                clock,
                state: Mutex::new(table),
                writer: tokio::sync::Mutex::new(()),
                wake: Notify::new(),
                events,
                stop,
            }),
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ScheduleEvent> {
        self.inner.events.subscribe()
    }

    pub(crate) fn list(&self) -> Vec<Schedule> {
        lock(&self.inner.state).all.values().cloned().collect()
    }

    pub(crate) fn get(&self, id: ScheduleId) -> Option<Schedule> {
        lock(&self.inner.state).all.get(&id).cloned()
    }

    /// How many schedules are active, paused and finished (in that order): for `/metrics`.
    pub(crate) fn count_by_state(&self) -> [(store::State, usize); 3] {
        let mut counts = [
            (store::State::Active, 0),
            (store::State::Paused, 0),
            (store::State::Finished, 0),
        ];
        for schedule in lock(&self.inner.state).all.values() {
            let state = schedule.state();
            if let Some((_, n)) = counts.iter_mut().find(|(s, _)| *s == state) {
                *n += 1;
            }
        }
        counts
    }

    /// How many schedules the timer waits for.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) fn armed_count(&self) -> usize {
        lock(&self.inner.state).due.len()
    }

    /// Records a new schedule and arms it.
    pub(crate) async fn create(&self, new: NewSchedule) -> Result<Schedule, ScheduleError> {
        let compiled = new.cadence.compile()?;
        let _w = self.inner.writer.lock().await;
        let now = self.now();
        let id = {
            let mut t = lock(&self.inner.state);
            t.next_id += 1;
            ScheduleId(t.next_id)
        };
        let next_run_at = match &new.cadence {
            Cadence::Once { at } => Some(*at),
            _ => compiled.next_after(now),
        };
        let schedule = Schedule {
            version: store::VERSION,
            id,
            created_at: now,
            updated_at: now,
            created_by: new.created_by,
            title: new.title,
            target: new.target,
            prompt: new.prompt,
            cadence: new.cadence,
            paused: false,
            next_run_at,
            pending: None,
            runs: Vec::new(),
            unknown: serde_json::Map::new(),
        };
        self.write(&schedule).await?;
        self.apply(schedule.clone());
        Ok(schedule)
    }

    /// Pauses (or resumes) a schedule. A resumed recurring schedule runs next at its next
    /// occurrence from now (what it missed while paused is skipped); a resumed `once` schedule
    /// whose time passed runs at once.
    pub(crate) async fn set_paused(
        &self,
        id: ScheduleId,
        paused: bool,
    ) -> Result<Schedule, ScheduleError> {
        let _w = self.inner.writer.lock().await;
        let mut s = self
            .get(id)
            .ok_or_else(|| ScheduleError::Unknown(id.to_string()))?;
        if s.paused == paused {
            return Ok(s);
        }
        s.paused = paused;
        s.updated_at = self.now();
        if !paused
            && s.cadence.recurs()
            && let Ok(c) = s.cadence.compile()
        {
            s.next_run_at = c.next_after(s.updated_at);
        }
        self.write(&s).await?;
        self.apply(s.clone());
        Ok(s)
    }

    /// Deletes a schedule: its file, then its place in the timer.
    pub(crate) async fn delete(&self, id: ScheduleId) -> Result<Schedule, ScheduleError> {
        let _w = self.inner.writer.lock().await;
        let s = self
            .get(id)
            .ok_or_else(|| ScheduleError::Unknown(id.to_string()))?;
        let home = self.inner.home.clone();
        // The highest id given so far outlives the files: a deleted schedule's id is never
        // given again, not after a restart either.
        let last = lock(&self.inner.state).next_id;
        tokio::task::spawn_blocking(move || {
            store::write_last_id(&home, last)?;
            store::remove(&home, id)
        })
        .await
        .map_err(|_| ScheduleError::ShuttingDown)??;
        lock(&self.inner.state).remove(id);
        let _ = self.inner.events.send(ScheduleEvent { id, schedule: None });
        self.inner.wake.notify_one();
        Ok(s)
    }

    /// Writes the file on a blocking thread (fsync never stalls the async workers).
    async fn write(&self, s: &Schedule) -> Result<(), ScheduleError> {
        let home = self.inner.home.clone();
        let s = s.clone();
        tokio::task::spawn_blocking(move || store::write(&home, &s))
            .await
            .map_err(|_| ScheduleError::ShuttingDown)??;
        Ok(())
    }

    /// Applies a written schedule in memory, announces it and wakes the timer.
    fn apply(&self, s: Schedule) {
        let id = s.id;
        lock(&self.inner.state).put(s.clone());
        let _ = self.inner.events.send(ScheduleEvent {
            id,
            schedule: Some(s),
        });
        self.inner.wake.notify_one();
    }

    /// Settles the runs a crash interrupted, then fires schedules as they come due, until
    /// [`Schedules::shutdown`]. The sink lives in this task only, so the schedules and the
    /// operations do not keep each other alive.
    pub(crate) fn start(&self, sink: Arc<dyn Deliver>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let interrupted: Vec<Schedule> = this
                .list()
                .into_iter()
                .filter(|s| s.pending.is_some())
                .collect();
            for s in interrupted {
                this.recover(&sink, s).await;
            }
            this.timer(sink).await;
        })
    }

    /// Stops the timer (firings under way finish on their own).
    pub(crate) fn shutdown(&self) {
        let _ = self.inner.stop.send(true);
    }

    async fn timer(&self, sink: Arc<dyn Deliver>) {
        let permits = Arc::new(Semaphore::new(CONCURRENT_FIRINGS));
        let mut stop = self.inner.stop.subscribe();
        loop {
            if *stop.borrow() {
                return;
            }
            let now = self.now();
            let (due, next) = {
                let mut t = lock(&self.inner.state);
                let mut due = Vec::new();
                while let Some(&(at, id)) = t.due.first() {
                    if at > now {
                        break;
                    }
                    t.due.pop_first();
                    due.push((at, id));
                }
                (due, t.due.first().map(|(at, _)| *at))
            };
            for (at, id) in due {
                let this = self.clone();
                let sink = sink.clone();
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                tokio::spawn(async move {
                    this.fire(&sink, id, at).await;
                    drop(permit);
                });
            }
            let sleep = next.map_or(MAX_SLEEP, |at| {
                let wait = now.duration_until(at);
                Duration::try_from(wait).unwrap_or_default().min(MAX_SLEEP)
            });
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = self.inner.wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Fires one schedule for its occurrence `at` (taken off the timer's queue).
    async fn fire(&self, sink: &Arc<dyn Deliver>, id: ScheduleId, at: Timestamp) {
        let guard = self.inner.writer.lock().await;
        let Some(mut s) = self.get(id) else {
            return;
        };
        if armed(&s) != Some(at) {
            // Changed since it was taken off the queue (paused, deleted, re-armed).
            return;
        }
        let now = self.now();
        // After downtime (or a late wake) a recurring schedule runs its latest missed
        // occurrence, once.
        let due_at = match s.cadence.compile() {
            Ok(c) if s.cadence.recurs() => c.latest_at_or_before(now).map_or(at, |l| l.max(at)),
            _ => at,
        };
        if let Some(reason) = sink.blocked(&s) {
            s.paused = true;
            s.updated_at = now;
            s.push_run(Run {
                due_at,
                fired_at: now,
                message_id: None,
                agent_id: s.owner_agent(),
                error: Some(format!("not delivered, schedule paused: {reason}")),
                recovered: false,
            });
            self.commit(s).await;
            return;
        }
        let message_id = uuid::Uuid::now_v7().to_string();
        s.pending = Some(PendingRun {
            due_at,
            message_id: message_id.clone(),
            started_at: now,
        });
        s.updated_at = now;
        if let Err(e) = self.write(&s).await {
            // Nothing was queued: try again in a while.
            tracing::warn!(schedule = %id, error = %e, "cannot record a schedule's run; retrying in a minute");
            let mut retry = s.clone();
            retry.pending = None;
            retry.next_run_at = now.checked_add(jiff::SignedDuration::from_secs(60)).ok();
            lock(&self.inner.state).put(retry);
            self.inner.wake.notify_one();
            return;
        }
        lock(&self.inner.state).put(s.clone());
        drop(guard);
        let result = self.deliver(sink, &s, &message_id, None).await;
        self.finish(id, due_at, &message_id, result, false).await;
    }

    /// Queues the run's prompt (a crash-interrupted run passes the agent it created).
    async fn deliver(
        &self,
        sink: &Arc<dyn Deliver>,
        s: &Schedule,
        message_id: &str,
        existing: Option<AgentId>,
    ) -> Result<AgentId, String> {
        let mut message = InboxMessage::new(
            Delivery::Followup,
            s.prompt.clone(),
            format!("schedule:{}", s.id),
        );
        message.id = message_id.to_string();
        sink.deliver(s, message, existing).await
    }

    /// Records a run's outcome, clears the pending run and arms the next occurrence.
    async fn finish(
        &self,
        id: ScheduleId,
        due_at: Timestamp,
        message_id: &str,
        result: Result<AgentId, String>,
        recovered: bool,
    ) {
        let _w = self.inner.writer.lock().await;
        // Deleted while it fired (an archive's stop, a user): the delivery stands.
        let Some(mut s) = self.get(id) else {
            return;
        };
        let now = self.now();
        if let Err(e) = &result {
            tracing::warn!(schedule = %id, error = %e, "a schedule's run failed");
        }
        let (agent_id, error, message_id) = match result {
            Ok(agent) => (Some(agent), None, Some(message_id.to_string())),
            Err(e) => (s.owner_agent(), Some(e), None),
        };
        s.push_run(Run {
            due_at,
            fired_at: now,
            message_id,
            agent_id,
            error,
            recovered,
        });
        s.pending = None;
        s.updated_at = now;
        s.next_run_at = match s.cadence.compile() {
            Ok(c) if s.cadence.recurs() => c.next_after(now.max(due_at)),
            _ => None,
        };
        self.commit(s).await;
    }

    /// Writes and applies; a failed write is logged and retried by the next change.
    async fn commit(&self, s: Schedule) {
        if let Err(e) = self.write(&s).await {
            tracing::error!(schedule = %s.id, error = %e, "cannot record a schedule's run");
        }
        self.apply(s);
    }

    /// A run a crash interrupted: delivered already (its message id is in the inbox or the
    /// timeline, or its agent exists) is recorded; otherwise it is delivered now.
    async fn recover(&self, sink: &Arc<dyn Deliver>, s: Schedule) {
        let Some(pending) = s.pending.clone() else {
            return;
        };
        let id = s.id;
        let mid = pending.message_id.clone();
        // Reading the inbox and the timeline is file I/O: off the async workers.
        let reached = |agent: AgentId| {
            let (sink, mid) = (sink.clone(), mid.clone());
            async move {
                tokio::task::spawn_blocking(move || sink.reached(agent, &mid))
                    .await
                    .unwrap_or(false)
            }
        };
        let result = match &s.target {
            Target::Agent { agent_id } if reached(*agent_id).await => {
                tracing::info!(schedule = %id, "a run interrupted by a crash had been queued; recorded");
                Ok(*agent_id)
            }
            Target::NewAgent(_) => {
                let existing = sink.created_by_run(id, &mid);
                let found = match existing {
                    Some(agent) => reached(agent).await,
                    None => false,
                };
                match existing {
                    Some(agent) if found => Ok(agent),
                    _ => self.deliver(sink, &s, &mid, existing).await,
                }
            }
            Target::Agent { .. } => {
                if let Some(reason) = sink.blocked(&s) {
                    Err(format!("not delivered: {reason}"))
                } else {
                    tracing::info!(schedule = %id, "delivering a run a crash interrupted");
                    self.deliver(sink, &s, &mid, None).await
                }
            }
        };
        self.finish(id, pending.due_at, &mid, result, true).await;
    }

    /// The active schedules whose activity is `agent`'s.
    pub(crate) fn active_for(&self, agent: AgentId) -> Vec<Schedule> {
        lock(&self.inner.state)
            .all
            .values()
            .filter(|s| s.state() == State::Active && s.owner_agent() == Some(agent))
            .cloned()
            .collect()
    }
}

/// The `schedule` family of archive admission: an agent's active schedules are its
/// activity; a stop deletes the schedule (as the user's own delete would).
pub(crate) struct ScheduleFamily(pub(crate) Schedules);

impl ActivityFamily for ScheduleFamily {
    fn name(&self) -> &'static str {
        "schedule"
    }

    fn running(&self, _: &dyn drover_core::view::AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        self.0
            .active_for(agent.id)
            .into_iter()
            .map(|s| ActivityItem {
                id: s.id.to_string(),
                agent_id: Some(agent.id),
                title: s.title.clone(),
                detail: match s.next_run_at {
                    Some(at) => {
                        format!("schedule {} ({}), next at {at}", s.id, s.cadence.describe())
                    }
                    None => format!("schedule {} ({})", s.id, s.cadence.describe()),
                },
            })
            .collect()
    }

    fn stop(&self, _: AgentId, item: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        let schedules = self.0.clone();
        Box::pin(async move {
            let id: ScheduleId = item.id.parse()?;
            match schedules.delete(id).await {
                Ok(_) | Err(ScheduleError::Unknown(_)) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests;
