//! The timer and its records under tokio's paused clock: every N, cron across a DST change,
//! catch-up after downtime, a `once` schedule in the past at boot, a run a crash cut off.
//! The sink records what the operations layer would have been asked to deliver.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::AgentId;
use drover_core::inbox::InboxMessage;
use drover_core::runtime::BoxFuture;
use jiff::Timestamp;

use super::*;

#[derive(Default)]
struct Recorder {
    delivered: Mutex<Vec<(AgentId, InboxMessage)>>,
    reached: Mutex<HashSet<String>>,
    blocked: Mutex<Option<String>>,
}

impl Recorder {
    fn delivered(&self) -> Vec<(AgentId, InboxMessage)> {
        self.delivered.lock().expect("lock").clone()
    }
}

impl Deliver for Recorder {
    fn blocked(&self, _: &Schedule) -> Option<String> {
        self.blocked.lock().expect("lock").clone()
    }

    fn deliver(
        &self,
        s: &Schedule,
        message: InboxMessage,
        existing: Option<AgentId>,
    ) -> BoxFuture<'static, Result<AgentId, String>> {
        let agent = match &s.target {
            Target::Agent { agent_id } => *agent_id,
            Target::NewAgent(_) => existing.unwrap_or_default(),
        };
        self.reached
            .lock()
            .expect("lock")
            .insert(message.id.clone());
        self.delivered.lock().expect("lock").push((agent, message));
        Box::pin(async move { Ok(agent) })
    }

    fn reached(&self, _: AgentId, message_id: &str) -> bool {
        self.reached.lock().expect("lock").contains(message_id)
    }

    fn created_by_run(&self, _: ScheduleId, _: &str) -> Option<AgentId> {
        None
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn secs(n: i64) -> jiff::SignedDuration {
    jiff::SignedDuration::from_secs(n)
}

fn followup(agent: AgentId, cadence: Cadence) -> NewSchedule {
    NewSchedule {
        created_by: None,
        title: None,
        target: Target::Agent { agent_id: agent },
        prompt: "check the deploy".into(),
        cadence,
    }
}

/// Every `n` seconds, the first time `n` seconds after `base`.
fn every(base: Timestamp, n: u64) -> Cadence {
    Cadence::Every {
        every_secs: n,
        from: base + secs(n.cast_signed()),
    }
}

/// Sleeps on tokio's paused clock in steps, so the timer task runs in between.
async fn pass(d: Duration) {
    let step = Duration::from_millis(500);
    let mut left = d;
    while !left.is_zero() {
        let s = left.min(step);
        tokio::time::sleep(s).await;
        left -= s;
    }
}

/// The schedules kept in `home`, their clock at `now` (moving with tokio's), and their timer
/// started, firing into `sink`.
fn start(
    home: &Path,
    now: Timestamp,
    sink: Recorder,
) -> (Schedules, Arc<Recorder>, tokio::task::JoinHandle<()>) {
    let schedules = Schedules::open(home, Clock::tokio_from(now));
    let sink = Arc::new(sink);
    let task = schedules.start(sink.clone());
    (schedules, sink, task)
}

fn due_times(s: &Schedules, id: ScheduleId) -> Vec<Timestamp> {
    s.get(id)
        .expect("schedule")
        .runs
        .iter()
        .map(|r| r.due_at)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_n_fires_on_its_grid() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let (schedules, sink, task) = start(home.path(), base, Recorder::default());
    let agent = AgentId::new();
    let s = schedules
        .create(followup(agent, every(base, 10)))
        .await
        .expect("create");
    pass(Duration::from_secs(35)).await;
    assert_eq!(
        due_times(&schedules, s.id),
        vec![base + secs(10), base + secs(20), base + secs(30)]
    );
    let delivered = sink.delivered();
    assert_eq!(delivered.len(), 3);
    assert!(delivered.iter().all(|(a, m)| *a == agent
        && m.text == "check the deploy"
        && m.source == format!("schedule:{}", s.id)));
    // Each run names the message it queued.
    let runs = schedules.get(s.id).expect("schedule").runs;
    for (run, (_, m)) in runs.iter().zip(&delivered) {
        assert_eq!(run.message_id.as_deref(), Some(m.id.as_str()));
    }
    assert_eq!(
        schedules.get(s.id).expect("schedule").next_run_at,
        Some(base + secs(40))
    );
    schedules.shutdown();
    task.await.expect("timer ends");
}

#[tokio::test(start_paused = true)]
async fn a_daily_cron_follows_the_local_clock_across_dst() {
    let home = tempfile::tempdir().expect("tempdir");
    // Paris leaves summer time in the night of 2026-10-24 to 25.
    let base = ts("2026-10-24T06:00:00Z");
    let (schedules, sink, _task) = start(home.path(), base, Recorder::default());
    let s = schedules
        .create(followup(
            AgentId::new(),
            Cadence::Cron {
                expr: "0 9 * * *".into(),
                time_zone: "Europe/Paris".into(),
            },
        ))
        .await
        .expect("create");
    tokio::time::sleep(Duration::from_secs(2 * 86_400)).await;
    pass(Duration::from_secs(1)).await;
    assert_eq!(
        due_times(&schedules, s.id),
        vec![ts("2026-10-24T07:00:00Z"), ts("2026-10-25T08:00:00Z")],
        "09:00 in Paris on both days, an hour apart in UTC"
    );
    // Fired on time, not a tick later.
    for run in schedules.get(s.id).expect("schedule").runs {
        assert!(run.fired_at.duration_since(run.due_at) < secs(1), "{run:?}");
    }
    assert_eq!(sink.delivered().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn after_downtime_a_recurring_schedule_catches_up_once() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let agent = AgentId::new();
    let id = {
        let schedules = Schedules::open(home.path(), Clock::tokio_from(base));
        let s = schedules
            .create(followup(agent, every(base, 60)))
            .await
            .expect("create");
        s.id
        // The daemon goes down before it ever fired.
    };
    // It comes back 1 h 0 m 30 s later: 60 occurrences were missed.
    let later = base + secs(3630);
    let (schedules, sink, _task) = start(home.path(), later, Recorder::default());
    pass(Duration::from_secs(5)).await;
    assert_eq!(
        due_times(&schedules, id),
        vec![base + secs(3600)],
        "only the latest missed occurrence runs"
    );
    assert_eq!(sink.delivered().len(), 1);
    assert_eq!(
        schedules.get(id).expect("schedule").next_run_at,
        Some(base + secs(3660))
    );
    pass(Duration::from_secs(30)).await;
    assert_eq!(sink.delivered().len(), 2, "then back on its grid");
}

#[tokio::test(start_paused = true)]
async fn a_once_schedule_whose_time_passed_runs_at_boot() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let id = {
        let schedules = Schedules::open(home.path(), Clock::tokio_from(base));
        schedules
            .create(followup(
                AgentId::new(),
                Cadence::Once {
                    at: base + secs(600),
                },
            ))
            .await
            .expect("create")
            .id
    };
    let (schedules, sink, _task) = start(home.path(), base + secs(7200), Recorder::default());
    pass(Duration::from_secs(1)).await;
    let s = schedules.get(id).expect("schedule");
    assert_eq!(due_times(&schedules, id), vec![base + secs(600)]);
    assert_eq!(s.state(), State::Finished);
    assert_eq!(s.next_run_at, None);
    pass(Duration::from_secs(3600)).await;
    assert_eq!(sink.delivered().len(), 1, "a once schedule runs once");
}

#[tokio::test(start_paused = true)]
async fn a_run_a_crash_cut_off_is_delivered_exactly_once() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let agent = AgentId::new();
    // Two schedules whose runs were begun (pending written) when the daemon died: one whose
    // prompt had reached the inbox, one whose had not.
    let (reached, lost) = {
        let schedules = Schedules::open(home.path(), Clock::tokio_from(base));
        let mut ids = Vec::new();
        for _ in 0..2 {
            let mut s = schedules
                .create(followup(
                    agent,
                    Cadence::Every {
                        every_secs: 3600,
                        from: base,
                    },
                ))
                .await
                .expect("create");
            s.pending = Some(PendingRun {
                due_at: base,
                message_id: uuid::Uuid::now_v7().to_string(),
                started_at: base,
            });
            store::write(home.path(), &s).expect("write");
            ids.push(s);
        }
        (ids[0].clone(), ids[1].clone())
    };
    let reached_id = reached.pending.clone().expect("pending").message_id;
    let lost_id = lost.pending.clone().expect("pending").message_id;
    let sink = Recorder::default();
    sink.reached
        .lock()
        .expect("lock")
        .insert(reached_id.clone());
    let (schedules, sink, _task) = start(home.path(), base + secs(5), sink);
    pass(Duration::from_secs(2)).await;
    let delivered = sink.delivered();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].1.id, lost_id, "the lost one, under its own id");
    for (s, mid) in [(&reached, &reached_id), (&lost, &lost_id)] {
        let now = schedules.get(s.id).expect("schedule");
        assert_eq!(now.pending, None);
        assert_eq!(now.runs.len(), 1);
        assert!(now.runs[0].recovered);
        assert_eq!(now.runs[0].message_id.as_deref(), Some(mid.as_str()));
        assert_eq!(now.next_run_at, Some(base + secs(3600)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_schedule_for_an_archived_agent_never_fires() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let sink = Recorder::default();
    *sink.blocked.lock().expect("lock") = Some("agent `x` is archived".into());
    let (schedules, sink, _task) = start(home.path(), base, sink);
    let s = schedules
        .create(followup(AgentId::new(), every(base, 10)))
        .await
        .expect("create");
    pass(Duration::from_secs(60)).await;
    assert!(sink.delivered().is_empty());
    let now = schedules.get(s.id).expect("schedule");
    assert_eq!(now.state(), State::Paused);
    assert_eq!(now.runs.len(), 1);
    assert!(
        now.runs[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("archived")),
        "{:?}",
        now.runs[0]
    );
}

#[tokio::test(start_paused = true)]
async fn pause_resume_and_delete_reach_the_timer_and_the_disk() {
    let home = tempfile::tempdir().expect("tempdir");
    let base = ts("2026-12-01T10:00:00Z");
    let (schedules, sink, _task) = start(home.path(), base, Recorder::default());
    let s = schedules
        .create(followup(AgentId::new(), every(base, 10)))
        .await
        .expect("create");
    let mut events = schedules.subscribe();
    schedules.set_paused(s.id, true).await.expect("pause");
    pass(Duration::from_secs(30)).await;
    assert!(sink.delivered().is_empty(), "paused: nothing fires");
    let resumed = schedules.set_paused(s.id, false).await.expect("resume");
    assert_eq!(
        resumed.next_run_at,
        Some(base + secs(40)),
        "missed ones skipped"
    );
    pass(Duration::from_secs(11)).await;
    assert_eq!(sink.delivered().len(), 1);
    schedules.delete(s.id).await.expect("delete");
    assert!(!store::path(home.path(), s.id).exists());
    pass(Duration::from_secs(30)).await;
    assert_eq!(sink.delivered().len(), 1, "deleted: nothing more");
    assert_eq!(schedules.armed_count(), 0);
    let mut last = None;
    while let Ok(e) = events.try_recv() {
        last = Some(e);
    }
    assert!(last.is_some_and(|e| e.id == s.id && e.schedule.is_none()));
    // The files are private.
    let mode = std::fs::metadata(store::dir(home.path()))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn a_target_is_stored_by_its_kind_with_camel_case_fields() {
    let agent = AgentId::new();
    let stored = serde_json::to_value(Target::Agent { agent_id: agent }).expect("json");
    assert_eq!(
        stored,
        serde_json::json!({"kind": "agent", "agentId": agent.to_string()})
    );
    let read: Target = serde_json::from_value(stored).expect("read");
    assert_eq!(read, Target::Agent { agent_id: agent });
}
