//! The registry as its callers see it: lifecycle, boot reconciliation, relationships, archive
//! and its admission (seeds 000 and 001), autoArchive, and the event stream.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{Fixture, WAIT, drain, eventually, idle, ids, running, set};
use drover_core::timeline::{Page, Timeline};
use drover_core::{
    ActivityBucket, ActivityReport, AgentId, AgentStatus, ArchiveOptions, AttentionReason,
    CancelCause, Change, NewAgent, PARENT_LABEL, Registry, RegistryError, TurnOutcome,
};
use drover_protocol::ItemKind;
use drover_testkit::{RuntimeCall, StopBehaviour, TestFamily};

/// A plain archive of `id` refused with `agent_active` (`why`: what runs): its report.
async fn refused_as_active(reg: &Registry, id: AgentId, why: &str) -> Box<ActivityReport> {
    let err = reg.archive(id, PLAIN).await.expect_err(why);
    assert_eq!(err.code(), "agent_active");
    let RegistryError::AgentActive(report) = err else {
        panic!("{err:?}");
    };
    report
}

const PLAIN: ArchiveOptions = ArchiveOptions {
    stop_activity: false,
};
const STOP: ArchiveOptions = ArchiveOptions {
    stop_activity: true,
};

fn set_of(ids: impl IntoIterator<Item = AgentId>) -> BTreeSet<AgentId> {
    ids.into_iter().collect()
}

// ---- lifecycle ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_follows_the_seed_path() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let a = fx.create(0, None).await;
    assert_eq!(
        reg.get(a.id).map(|a| a.status),
        Some(AgentStatus::Initializing)
    );

    let mut seen = vec![a.status];
    for to in [AgentStatus::Idle, AgentStatus::Running, AgentStatus::Idle] {
        let after = set(reg, a.id, to).await;
        assert_eq!(
            reg.get(a.id),
            Some(after.clone()),
            "get() returns the new record"
        );
        seen.push(after.status);
    }
    assert_eq!(
        seen,
        [
            AgentStatus::Initializing,
            AgentStatus::Idle,
            AgentStatus::Running,
            AgentStatus::Idle
        ]
    );
    assert_eq!(
        fx.on_disk(a.id).map(|a| a.status),
        Some(AgentStatus::Idle),
        "the last transition is on disk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn illegal_transitions_are_refused_and_change_nothing() {
    let fx = Fixture::new();
    let reg = &fx.registry;

    // initializing → running skips the ready runtime.
    let starting = fx.create(0, None).await;
    let err = reg
        .set_status(starting.id, AgentStatus::Running, None)
        .await
        .expect_err("initializing → running is illegal");
    assert_eq!(err.code(), "illegal_transition");
    assert!(
        matches!(err, RegistryError::IllegalTransition { agent, from: AgentStatus::Initializing, to: AgentStatus::Running } if agent == starting.id),
        "{err:?}"
    );
    assert_eq!(reg.get(starting.id), Some(starting.clone()));
    assert_eq!(fx.on_disk(starting.id), Some(starting.clone()));

    // closed → running / idle / closed, and idle → idle.
    let closed = fx.create(0, None).await;
    idle(reg, closed.id).await;
    let closed = set(reg, closed.id, AgentStatus::Closed).await;
    for to in [AgentStatus::Running, AgentStatus::Idle, AgentStatus::Closed] {
        let err = reg
            .set_status(closed.id, to, None)
            .await
            .expect_err("illegal from closed");
        assert_eq!(err.code(), "illegal_transition", "closed → {to}: {err}");
        assert_eq!(reg.get(closed.id), Some(closed.clone()), "closed → {to}");
    }
    let still = fx.create(0, None).await;
    let still = idle(reg, still.id).await;
    let err = reg
        .set_status(still.id, AgentStatus::Idle, None)
        .await
        .expect_err("idle → idle is no transition");
    assert_eq!(err.code(), "illegal_transition");

    // A fresh registry reads the same records back.
    let (again, report, runtime) = fx.reopen();
    assert_eq!(again.get(closed.id), Some(closed));
    assert_eq!(again.get(still.id), Some(still));
    assert_eq!(report.interrupted, vec![starting.id], "only the busy one");
    assert!(runtime.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_end_outcomes_set_status_and_attention() {
    let fx = Fixture::new();
    let reg = &fx.registry;

    let done = fx.create(0, None).await;
    running(reg, done.id).await;
    let done = reg
        .record_turn_end(done.id, TurnOutcome::Completed)
        .await
        .expect("completed");
    assert_eq!(done.status, AgentStatus::Idle);
    assert_eq!(
        done.attention.map(|a| a.reason),
        Some(AttentionReason::Finished)
    );
    assert_eq!(done.last_error, None);

    let failed = fx.create(0, None).await;
    running(reg, failed.id).await;
    let failed = reg
        .record_turn_end(
            failed.id,
            TurnOutcome::Failed {
                error: "model said no".to_string(),
            },
        )
        .await
        .expect("failed");
    assert_eq!(failed.status, AgentStatus::Error);
    assert_eq!(failed.last_error.as_deref(), Some("model said no"));
    assert_eq!(
        failed.attention.map(|a| a.reason),
        Some(AttentionReason::Error)
    );

    let canceled = fx.create(0, None).await;
    running(reg, canceled.id).await;
    reg.set_attention(canceled.id, AttentionReason::Permission)
        .await
        .expect("permission asked");
    let canceled = reg
        .record_turn_end(canceled.id, TurnOutcome::Canceled)
        .await
        .expect("canceled");
    assert_eq!(canceled.status, AgentStatus::Idle);
    assert_eq!(canceled.attention, None, "a moot permission is dropped");

    for agent in [&done, &failed, &canceled] {
        assert_eq!(fx.on_disk(agent.id).as_ref(), Some(agent), "persisted");
        assert!(!agent.is_archived(), "no autoArchive asked");
    }
    assert!(fx.runtime.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_end_on_an_agent_that_is_not_running_is_illegal() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let starting = fx.create(0, None).await;
    let ready = fx.create(0, None).await;
    let ready = idle(reg, ready.id).await;
    let broken = fx.create(0, None).await;
    let broken = set(reg, broken.id, AgentStatus::Error).await;
    let closed = fx.create(0, None).await;
    idle(reg, closed.id).await;
    let closed = set(reg, closed.id, AgentStatus::Closed).await;

    for agent in [&starting, &ready, &broken, &closed] {
        for outcome in [
            TurnOutcome::Completed,
            TurnOutcome::Failed {
                error: "x".to_string(),
            },
            TurnOutcome::Canceled,
        ] {
            let name = outcome.event_name();
            let err = reg
                .record_turn_end(agent.id, outcome)
                .await
                .expect_err("no turn runs");
            assert_eq!(err.code(), "illegal_transition", "{} {name}", agent.status);
            assert_eq!(reg.get(agent.id).as_ref(), Some(agent));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_brings_busy_agents_back_idle_and_interrupted() {
    let mut fx = Fixture::new();
    let reg = &fx.registry;
    let run = fx.create(0, None).await;
    running(reg, run.id).await;
    let init = fx.create(0, None).await;
    let calm = fx.create(0, None).await;
    let calm = idle(reg, calm.id).await;
    let broken = fx.create(0, None).await;
    let broken = set(reg, broken.id, AgentStatus::Error).await;
    let old_runtime = fx.runtime.clone();
    // `run` was in a turn; `calm` finished its turn.
    let turn = |id, ended: bool| {
        let mut timeline = Timeline::open(fx.home.path(), id).expect("timeline");
        timeline
            .push(ItemKind::TurnStarted.as_str(), serde_json::Map::new())
            .expect("turn_started");
        if ended {
            let mut data = serde_json::Map::new();
            data.insert("event".to_string(), "turn_completed".into());
            timeline
                .push(ItemKind::TurnEnded.as_str(), data)
                .expect("turn_ended");
        }
        timeline.sync().expect("sync");
    };
    turn(run.id, false);
    turn(calm.id, true);

    // The daemon stops without a word and starts again.
    let report = fx.restart();
    let (reg, runtime) = (&fx.registry, &fx.runtime);
    assert_eq!(set_of(report.interrupted), set_of([run.id, init.id]));
    assert_eq!(report.agents, 4);
    for id in [run.id, init.id] {
        let a = reg.get(id).expect("still there");
        assert_eq!(a.status, AgentStatus::Idle, "{id}");
        assert_eq!(
            a.attention.map(|x| x.reason),
            Some(AttentionReason::Interrupted)
        );
        assert!(!a.is_archived());
    }
    assert_eq!(reg.get(calm.id), Some(calm.clone()));
    assert_eq!(reg.get(broken.id), Some(broken));
    // The cut-off turn ended `interrupted` in its timeline, once; the finished one is untouched.
    let home = fx.home.path().to_path_buf();
    let ends = |id| {
        let page = Timeline::read_page(&home, id, Page::Tail { limit: 100 }).expect("page");
        page.items
            .iter()
            .filter(|i| i.is(ItemKind::TurnEnded))
            .map(|i| i.data.clone())
            .collect::<Vec<_>>()
    };
    let cut = ends(run.id);
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0]["event"], "turn_interrupted");
    assert_eq!(cut[0]["cause"], "crash");
    assert_eq!(ends(calm.id).len(), 1);
    assert!(runtime.calls().is_empty(), "boot starts and stops nothing");
    assert!(old_runtime.calls().is_empty());
    assert_eq!(
        reg.workspace_activity(run.workspace_id),
        Some(ActivityBucket::Error)
    );

    // The reconciliation was written: the next boot finds nothing busy.
    let report = fx.restart();
    assert!(report.interrupted.is_empty());
    assert_eq!(ends(run.id).len(), 1, "ended once");
    assert_eq!(
        fx.registry.get(run.id).map(|a| a.status),
        Some(AgentStatus::Idle)
    );
}

// ---- relationships --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_carries_the_parent_label_and_joins_the_track() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    let first = fx.create(0, Some(parent.id)).await;
    let second = fx.create(0, Some(parent.id)).await;
    let grandchild = fx.create(0, Some(first.id)).await;
    let other = fx.create(0, None).await;

    assert_eq!(first.labels.get(PARENT_LABEL), Some(&parent.id.to_string()));
    assert_eq!(first.parent_id(), Some(parent.id));
    assert_eq!(grandchild.parent_id(), Some(first.id));
    assert_eq!(parent.parent_id(), None);
    assert_eq!(
        fx.on_disk(first.id).and_then(|a| a.parent_id()),
        Some(parent.id)
    );

    assert_eq!(ids(&reg.subagents(parent.id)), [first.id, second.id]);
    assert_eq!(ids(&reg.subagents(first.id)), [grandchild.id]);
    assert!(reg.subagents(other.id).is_empty());

    idle(reg, second.id).await;
    reg.archive(second.id, PLAIN).await.expect("archive");
    assert_eq!(
        ids(&reg.subagents(parent.id)),
        [first.id],
        "archived subagents leave the track"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_under_an_unknown_or_archived_parent_is_refused() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let ghost = AgentId::new();
    let err = fx
        .try_create(|a| a.parent = Some(ghost))
        .await
        .expect_err("no such parent");
    assert_eq!(err.code(), "unknown_agent");
    assert!(err.to_string().contains(&ghost.to_string()), "{err}");

    let parent = fx.create(0, None).await;
    idle(reg, parent.id).await;
    reg.archive(parent.id, PLAIN).await.expect("archive");
    let err = fx
        .try_create(|a| a.parent = Some(parent.id))
        .await
        .expect_err("archived parent");
    assert_eq!(err.code(), "agent_archived");
    assert_eq!(reg.agent_count(), 1, "nothing was created");
    let (again, _, _) = fx.reopen();
    assert_eq!(again.agent_count(), 1, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_label_is_not_a_plain_label() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    let child = fx.create(0, Some(parent.id)).await;
    let root = fx.create(0, None).await;

    let err = reg
        .update_labels(
            root.id,
            BTreeMap::from([(PARENT_LABEL.to_string(), parent.id.to_string())]),
            vec![],
        )
        .await
        .expect_err("cannot adopt by label");
    assert_eq!(err.code(), "invalid_input");
    let err = reg
        .update_labels(child.id, BTreeMap::new(), vec![PARENT_LABEL.to_string()])
        .await
        .expect_err("cannot detach by label");
    assert_eq!(err.code(), "invalid_input");
    let err = fx
        .try_create(|a| {
            a.labels = BTreeMap::from([(PARENT_LABEL.to_string(), parent.id.to_string())]);
        })
        .await
        .expect_err("parent comes from `parent`");
    assert_eq!(err.code(), "invalid_input");
    assert_eq!(reg.get(root.id), Some(root.clone()));
    assert_eq!(reg.get(child.id), Some(child.clone()));
    assert_eq!(ids(&reg.subagents(parent.id)), [child.id]);

    // Other labels are fine and leave the parent link alone.
    let child = reg
        .update_labels(
            child.id,
            BTreeMap::from([("team".to_string(), "blue".to_string())]),
            vec![],
        )
        .await
        .expect("plain label");
    assert_eq!(child.labels.get("team").map(String::as_str), Some("blue"));
    assert_eq!(child.parent_id(), Some(parent.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_removes_only_the_parent_label() {
    let fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    idle(reg, parent.id).await;
    let child = reg
        .create_agent(NewAgent {
            parent: Some(parent.id),
            labels: BTreeMap::from([("team".to_string(), "blue".to_string())]),
            ..common::new_agent(&fx.cwd(1))
        })
        .await
        .expect("child");
    let grandchild = fx.create(1, Some(child.id)).await;
    idle(reg, grandchild.id).await;
    let child = running(reg, child.id).await;
    assert_ne!(child.workspace_id, parent.workspace_id);
    assert_eq!(
        reg.workspace_activity(parent.workspace_id),
        Some(ActivityBucket::Running),
        "the running subagent shows in its root's workspace"
    );
    assert_eq!(reg.workspace_activity(child.workspace_id), None);

    let detached = reg.detach(child.id).await.expect("detach");
    assert_eq!(detached.parent_id(), None);
    assert!(!detached.labels.contains_key(PARENT_LABEL));
    assert_eq!(
        detached.labels.get("team").map(String::as_str),
        Some("blue")
    );
    assert_eq!(detached.status, AgentStatus::Running, "not stopped");
    assert_eq!(detached.cwd, child.cwd);
    assert_eq!(detached.workspace_id, child.workspace_id);
    assert!(!detached.is_archived());
    assert_eq!(fx.on_disk(child.id), Some(detached.clone()));
    assert!(reg.subagents(parent.id).is_empty(), "left the track");
    assert_eq!(
        ids(&reg.subagents(child.id)),
        [grandchild.id],
        "keeps its own subagents"
    );
    assert_eq!(
        reg.workspace_activity(parent.workspace_id),
        Some(ActivityBucket::Idle),
        "no longer counts in the former parent's workspace"
    );
    assert_eq!(
        reg.workspace_activity(child.workspace_id),
        Some(ActivityBucket::Running),
        "counts as a root in its own workspace"
    );
    assert!(reg.check_turn_gate(child.id).is_ok());

    // Archiving the former parent does not reach it, and asks nothing of its runtime.
    let outcome = reg.archive(parent.id, PLAIN).await.expect("nothing runs");
    assert_eq!(outcome.archived, [parent.id]);
    let closes = fx
        .runtime
        .wait_for(WAIT, |calls| {
            calls.contains(&RuntimeCall::Close {
                agent: parent.id,
                cause: CancelCause::Archive,
            })
        })
        .await;
    assert_eq!(
        closes,
        [RuntimeCall::Close {
            agent: parent.id,
            cause: CancelCause::Archive
        }]
    );
    assert_eq!(reg.get(child.id), Some(detached));
    assert!(reg.get(grandchild.id).is_some_and(|g| !g.is_archived()));
}

// ---- archive --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_is_a_soft_delete_that_closes_the_agent() {
    let mut fx = Fixture::new();
    let reg = &fx.registry;
    let run = fx.create(0, None).await;
    running(reg, run.id).await;
    let init = fx.create(0, None).await;
    let calm = fx.create(0, None).await;
    idle(reg, calm.id).await;

    for agent in [&run, &init, &calm] {
        let outcome = reg.archive(agent.id, STOP).await.expect("archive");
        assert_eq!(outcome.archived, [agent.id]);
        let got = reg.get(agent.id).expect("an archived agent is still there");
        assert!(got.archived_at.is_some());
        assert_eq!(got.status, AgentStatus::Closed, "closed by the archive");
        let doc = common::read_json(&fx.file(agent));
        assert!(doc["archivedAt"].is_string(), "{doc}");
        assert_eq!(doc["lastStatus"], "closed");
    }
    assert_eq!(reg.agents().len(), 3, "archived agents stay listed");
    assert_eq!(reg.workspace_activity(run.workspace_id), None);

    let report = fx.restart();
    assert!(report.interrupted.is_empty(), "nothing was left busy");
    assert_eq!(report.agents, 3);
    assert!(
        fx.registry
            .agents()
            .iter()
            .all(drover_core::Agent::is_archived)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_cascades_over_grandchildren_and_closes_their_runtimes() {
    let fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    let child = fx.create(1, Some(parent.id)).await;
    let grandchild = fx.create(0, Some(child.id)).await;
    let sibling = fx.create(0, None).await;
    for a in [&parent, &child, &grandchild, &sibling] {
        idle(reg, a.id).await;
    }

    let outcome = reg.archive(parent.id, PLAIN).await.expect("archive");
    assert_eq!(outcome.archived[0], parent.id, "the target first");
    assert_eq!(
        set_of(outcome.archived.iter().copied()),
        set_of([parent.id, child.id, grandchild.id])
    );
    assert!(outcome.stopped.is_empty());
    for id in [parent.id, child.id, grandchild.id] {
        assert!(reg.get(id).is_some_and(|a| a.is_archived()), "{id}");
        assert!(fx.on_disk(id).is_some_and(|a| a.is_archived()), "{id}");
    }
    assert!(reg.get(sibling.id).is_some_and(|a| !a.is_archived()));

    let calls = fx.runtime.wait_for(WAIT, |calls| calls.len() >= 3).await;
    assert_eq!(
        set_of(fx.runtime.closes()),
        set_of([parent.id, child.id, grandchild.id]),
        "{calls:?}"
    );
    // A turn the close cuts off ends with the archive as its cause for the target, and with
    // its parent for the cascade (docs/lifecycle.md).
    for call in &calls {
        if let RuntimeCall::Close { agent, cause } = call {
            let expected = if *agent == parent.id {
                CancelCause::Archive
            } else {
                CancelCause::Parent
            };
            assert_eq!(*cause, expected, "{calls:?}");
        }
    }
    assert!(fx.runtime.cancels().is_empty(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cascade_passes_through_an_archived_intermediate() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (parent, child, grandchild) = fx.idle_lineage().await;
    let outcome = reg.archive(child.id, PLAIN).await.expect("archive child");
    assert_eq!(set_of(outcome.archived), set_of([child.id, grandchild.id]));
    let back = reg.unarchive(grandchild.id).await.expect("unarchive");
    assert!(!back.is_archived());

    let outcome = reg.archive(parent.id, PLAIN).await.expect("archive parent");
    assert_eq!(
        set_of(outcome.archived),
        set_of([parent.id, grandchild.id]),
        "newly archived: the parent and the grandchild below the archived child"
    );
    assert!(reg.get(grandchild.id).is_some_and(|a| a.is_archived()));
    assert!(fx.on_disk(grandchild.id).is_some_and(|a| a.is_archived()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cascade_over_a_label_cycle_in_damaged_data_terminates() {
    let mut fx = Fixture::new();
    let a = fx.create(0, None).await;
    let b = fx.create(0, None).await;
    // Damage, while the daemon is down: each names the other as its parent.
    for (agent, parent) in [(&a, b.id), (&b, a.id)] {
        let path = fx.file(agent);
        let mut doc = common::read_json(&path);
        doc["labels"][PARENT_LABEL] = serde_json::Value::String(parent.to_string());
        common::write_json(&path, &doc);
    }
    let report = fx.restart();
    let (reg, runtime) = (&fx.registry, &fx.runtime);
    assert_eq!(report.agents, 2);
    assert!(report.quarantined.is_empty());
    assert_eq!(reg.get(a.id).and_then(|x| x.parent_id()), Some(b.id));

    let outcome = tokio::time::timeout(WAIT, reg.archive(a.id, PLAIN))
        .await
        .expect("the cascade ends")
        .expect("archive");
    assert_eq!(outcome.archived[0], a.id);
    assert_eq!(set_of(outcome.archived), set_of([a.id, b.id]));
    for id in [a.id, b.id] {
        assert!(fx.on_disk(id).is_some_and(|x| x.is_archived()), "{id}");
    }
    let calls = runtime.wait_for(WAIT, |c| c.len() >= 2).await;
    assert_eq!(set_of(runtime.closes()), set_of([a.id, b.id]), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_archive_of_a_running_turn_is_refused_and_writes_nothing() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let agent = fx
        .try_create(|a| a.title = Some("worker".to_string()))
        .await
        .expect("create");
    let agent = running(reg, agent.id).await;
    let bytes = std::fs::read(fx.file(&agent)).expect("record");
    let mut events = reg.subscribe();

    let err = reg
        .archive(agent.id, PLAIN)
        .await
        .expect_err("a turn is running");
    assert_eq!(err.code(), "agent_active");
    let RegistryError::AgentActive(report) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(report.agent_id, Some(agent.id));
    assert_eq!(report.families.keys().collect::<Vec<_>>(), ["turn"]);
    let turn = &report.families["turn"];
    assert_eq!(turn.len(), 1);
    assert_eq!(turn[0].agent_id, Some(agent.id));
    assert!(err.to_string().contains("1 turn"), "{err}");
    assert_eq!(reg.activity(agent.id).expect("activity"), **report);

    assert_eq!(reg.get(agent.id), Some(agent.clone()));
    assert_eq!(std::fs::read(fx.file(&agent)).expect("record"), bytes);
    assert!(drain(&mut events).is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(fx.runtime.calls().is_empty(), "nothing stopped or closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_grandchild_is_reported_as_a_subagent() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    let child = fx.create(0, Some(parent.id)).await;
    let grandchild = reg
        .create_agent(NewAgent {
            parent: Some(child.id),
            title: Some("digging".to_string()),
            ..common::new_agent(&fx.cwd(0))
        })
        .await
        .expect("grandchild");
    idle(reg, parent.id).await;
    idle(reg, child.id).await;
    running(reg, grandchild.id).await;
    let files: Vec<Vec<u8>> = [&parent, &child, &grandchild]
        .iter()
        .map(|a| std::fs::read(fx.file(a)).expect("record"))
        .collect();

    let report = refused_as_active(reg, parent.id, "a grandchild runs").await;
    assert_eq!(report.families.keys().collect::<Vec<_>>(), ["subagent"]);
    let items = &report.families["subagent"];
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].agent_id, Some(grandchild.id));
    assert_eq!(items[0].id, grandchild.id.to_string());
    assert_eq!(items[0].title.as_deref(), Some("digging"));

    for (a, before) in [&parent, &child, &grandchild].iter().zip(files) {
        assert_eq!(std::fs::read(fx.file(a)).expect("record"), before);
        assert!(reg.get(a.id).is_some_and(|x| !x.is_archived()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_family_takes_part_in_admission() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let jobs = TestFamily::new("job");
    reg.register_family(jobs.clone());
    let agent = fx.create(0, None).await;
    let agent = idle(reg, agent.id).await;
    jobs.add(agent.id, "build", StopBehaviour::Succeed);

    let report = reg.activity(agent.id).expect("activity");
    assert_eq!(report.families.keys().collect::<Vec<_>>(), ["job"]);
    let err = reg.archive(agent.id, PLAIN).await.expect_err("a job runs");
    assert_eq!(err.code(), "agent_active");
    assert!(err.to_string().contains("1 job"), "{err}");
    let RegistryError::AgentActive(refused) = err else {
        panic!("{err:?}");
    };
    assert_eq!(refused.families["job"][0].id, "build");
    assert_eq!(reg.get(agent.id), Some(agent.clone()));
    assert!(jobs.stops().is_empty(), "a refusal stops nothing");
    assert_eq!(fx.on_disk(agent.id), Some(agent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_owned_by_a_descendant_takes_part_in_admission() {
    // The cascade archives the grandchild too, so its running job would run on out of sight.
    let fx = Fixture::new();
    let reg = &fx.registry;
    let jobs = TestFamily::watching_disk("job", fx.home.path());
    reg.register_family(jobs.clone());
    let (parent, child, grandchild) = fx.idle_lineage().await;
    jobs.add(grandchild.id, "build", StopBehaviour::Succeed);

    let report = refused_as_active(reg, parent.id, "the grandchild's job runs").await;
    assert_eq!(report.agent_id, Some(parent.id));
    assert_eq!(report.families.keys().collect::<Vec<_>>(), ["job"]);
    let job = &report.families["job"][0];
    assert_eq!(job.id, "build");
    assert_eq!(job.agent_id, Some(grandchild.id), "names whose job it is");
    assert_eq!(reg.activity(parent.id).expect("activity"), *report);
    for a in [&parent, &child, &grandchild] {
        assert!(reg.get(a.id).is_some_and(|x| !x.is_archived()));
    }

    let outcome = reg.archive(parent.id, STOP).await.expect("archive");
    assert_eq!(outcome.archived.len(), 3);
    assert!(eventually(|| !jobs.stops().is_empty()).await);
    assert_eq!(
        jobs.stops(),
        [(grandchild.id, "build".to_string())],
        "stopped for its owner"
    );
    assert_eq!(jobs.archived_when_stopped(), [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_activity_writes_the_archive_then_stops_every_item() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let jobs = TestFamily::watching_disk("job", fx.home.path());
    reg.register_family(jobs.clone());
    let parent = fx.create(0, None).await;
    let child = fx.create(0, Some(parent.id)).await;
    let calm_child = fx.create(0, Some(parent.id)).await;
    running(reg, parent.id).await;
    running(reg, child.id).await;
    idle(reg, calm_child.id).await;
    jobs.add(parent.id, "build", StopBehaviour::Succeed);

    let outcome = reg.archive(parent.id, STOP).await.expect("archive");
    assert_eq!(outcome.archived[0], parent.id);
    assert_eq!(
        set_of(outcome.archived.iter().copied()),
        set_of([parent.id, child.id, calm_child.id])
    );
    assert_eq!(
        outcome.stopped.families.keys().collect::<Vec<_>>(),
        ["job", "subagent", "turn"]
    );
    assert_eq!(
        outcome.stopped.families["subagent"][0].agent_id,
        Some(child.id)
    );

    let calls = fx.runtime.wait_for(WAIT, |calls| calls.len() >= 5).await;
    assert!(
        calls.contains(&RuntimeCall::Cancel {
            agent: parent.id,
            cause: drover_core::CancelCause::Archive,
            keep_inbox: false
        }),
        "{calls:?}"
    );
    assert!(
        calls.contains(&RuntimeCall::Cancel {
            agent: child.id,
            cause: drover_core::CancelCause::Parent,
            keep_inbox: false
        }),
        "{calls:?}"
    );
    assert_eq!(fx.runtime.cancels().len(), 2, "{calls:?}");
    assert_eq!(
        set_of(fx.runtime.closes()),
        set_of([parent.id, child.id, calm_child.id])
    );
    assert!(eventually(|| !jobs.stops().is_empty()).await);
    assert_eq!(jobs.stops(), [(parent.id, "build".to_string())]);
    assert_eq!(
        jobs.archived_when_stopped(),
        [true],
        "the archive was on disk before the stop"
    );
    for id in [parent.id, child.id] {
        let a = reg.get(id).expect("agent");
        assert!(a.is_archived());
        assert_eq!(a.status, AgentStatus::Closed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_panicking_or_hanging_stops_neither_undo_the_archive_nor_block_the_others() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let jobs = TestFamily::watching_disk("job", fx.home.path());
    let schedules = TestFamily::watching_disk("schedule", fx.home.path());
    reg.register_family(jobs.clone());
    reg.register_family(schedules.clone());
    let (parent, child) = fx.pair().await;
    running(reg, parent.id).await;
    running(reg, child.id).await;
    jobs.add(parent.id, "hangs", StopBehaviour::Hang);
    jobs.add(parent.id, "fails", StopBehaviour::Fail);
    jobs.add(parent.id, "panics", StopBehaviour::Panic);
    schedules.add(parent.id, "reminder", StopBehaviour::Succeed);

    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(2), reg.archive(parent.id, STOP))
        .await
        .expect("archive does not wait for a hanging stop")
        .expect("archive");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(set_of(outcome.archived), set_of([parent.id, child.id]));

    assert!(
        eventually(|| jobs.stops().len() == 3 && schedules.stops().len() == 1).await,
        "jobs {:?}, schedules {:?}",
        jobs.stops(),
        schedules.stops()
    );
    assert!(
        jobs.archived_when_stopped()
            .into_iter()
            .chain(schedules.archived_when_stopped())
            .all(|a| a)
    );
    let calls = fx.runtime.wait_for(WAIT, |calls| calls.len() >= 4).await;
    assert_eq!(
        set_of(fx.runtime.cancels().into_iter().map(|(a, _)| a)),
        set_of([parent.id, child.id]),
        "{calls:?}"
    );
    assert_eq!(set_of(fx.runtime.closes()), set_of([parent.id, child.id]));

    // Still archived, in memory and on disk, once the stops have played out.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for id in [parent.id, child.id] {
        assert!(reg.get(id).is_some_and(|a| a.is_archived()), "{id}");
        assert!(fx.on_disk(id).is_some_and(|a| a.is_archived()), "{id}");
    }
    // And the registry keeps serving.
    let other = fx.create(0, None).await;
    idle(reg, other.id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_runtime_cancel_or_close_does_not_undo_the_archive() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (parent, child) = fx.pair().await;
    running(reg, parent.id).await;
    running(reg, child.id).await;
    fx.runtime.fail_cancel(parent.id);
    fx.runtime.fail_close(parent.id);

    let outcome = reg.archive(parent.id, STOP).await.expect("archive");
    assert_eq!(set_of(outcome.archived), set_of([parent.id, child.id]));
    let calls = fx.runtime.wait_for(WAIT, |calls| calls.len() >= 4).await;
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(reg.get(parent.id).is_some_and(|a| a.is_archived()));
    assert!(fx.on_disk(child.id).is_some_and(|a| a.is_archived()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unarchive_restarts_nothing_and_leaves_children_archived() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (parent, child) = fx.pair().await;
    idle(reg, parent.id).await;
    idle(reg, child.id).await;
    reg.archive(parent.id, PLAIN).await.expect("archive");
    let settled = fx.runtime.wait_for(WAIT, |calls| calls.len() >= 2).await;
    assert_eq!(settled.len(), 2, "{settled:?}");

    let back = reg.unarchive(parent.id).await.expect("unarchive");
    assert_eq!(back.archived_at, None);
    assert_eq!(
        back.status,
        AgentStatus::Closed,
        "closed until a start initializes it"
    );
    assert!(reg.get(child.id).is_some_and(|a| a.is_archived()));
    assert!(reg.subagents(parent.id).is_empty(), "the child stays out");
    assert_eq!(
        reg.workspace_activity(parent.workspace_id),
        Some(ActivityBucket::Idle)
    );
    assert!(reg.check_turn_gate(parent.id).is_ok());
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Only the archived runtime's close again, before the unarchive: what the archive discards
    // is gone before the agent can take a turn.
    let mut expected = settled.clone();
    expected.push(RuntimeCall::Close {
        agent: parent.id,
        cause: CancelCause::Archive,
    });
    assert_eq!(
        fx.runtime.calls(),
        expected,
        "no runtime was started or touched"
    );

    let (again, _, _) = fx.reopen();
    assert!(again.get(parent.id).is_some_and(|a| !a.is_archived()));
    assert!(again.get(child.id).is_some_and(|a| a.is_archived()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_gate_refuses_archived_lineage() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (parent, child, grandchild) = fx.idle_lineage().await;
    reg.archive(parent.id, PLAIN).await.expect("archive");

    let err = reg
        .set_status(parent.id, AgentStatus::Running, None)
        .await
        .expect_err("archived");
    assert_eq!(err.code(), "agent_archived");
    assert_eq!(
        reg.check_turn_gate(parent.id)
            .map_err(|e| e.code().as_str()),
        Err("agent_archived")
    );
    let err = reg
        .set_status(parent.id, AgentStatus::Initializing, None)
        .await
        .expect_err("no runtime for an archived agent");
    assert_eq!(err.code(), "agent_archived");

    let grandchild = reg.unarchive(grandchild.id).await.expect("unarchive");
    let err = reg
        .set_status(grandchild.id, AgentStatus::Running, None)
        .await
        .expect_err("lineage archived");
    assert_eq!(err.code(), "turn_blocked");
    assert!(
        matches!(err, RegistryError::TurnBlocked { agent, archived } if agent == grandchild.id && archived == child.id),
        "names the nearest archived ancestor: {err:?}"
    );
    let gate = reg.check_turn_gate(grandchild.id).expect_err("blocked");
    assert_eq!(gate.code(), "turn_blocked");
    assert_eq!(reg.get(grandchild.id), Some(grandchild.clone()));

    // The whole lineage must be back before a turn may start.
    reg.unarchive(child.id).await.expect("unarchive");
    let err = reg
        .check_turn_gate(grandchild.id)
        .expect_err("the parent is still archived");
    assert!(
        matches!(err, RegistryError::TurnBlocked { archived, .. } if archived == parent.id),
        "{err:?}"
    );
    reg.unarchive(parent.id).await.expect("unarchive");
    assert!(reg.check_turn_gate(grandchild.id).is_ok());
    // Still `closed` from the archive: its next turn starts its runtime first.
    set(reg, grandchild.id, AgentStatus::Initializing).await;
    idle(reg, grandchild.id).await;
    set(reg, grandchild.id, AgentStatus::Running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detaching_from_an_archived_lineage_opens_the_gate() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (parent, child) = fx.pair().await;
    idle(reg, parent.id).await;
    idle(reg, child.id).await;
    reg.archive(parent.id, PLAIN).await.expect("archive");
    reg.unarchive(child.id).await.expect("unarchive");
    assert_eq!(
        reg.check_turn_gate(child.id).map_err(|e| e.code().as_str()),
        Err("turn_blocked")
    );
    reg.detach(child.id).await.expect("detach");
    assert!(reg.check_turn_gate(child.id).is_ok());
    set(reg, child.id, AgentStatus::Initializing).await;
    idle(reg, child.id).await;
    set(reg, child.id, AgentStatus::Running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_idle_children_skips_busy_ones() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let jobs = TestFamily::new("job");
    reg.register_family(jobs.clone());
    let parent = fx.create(0, None).await;
    idle(reg, parent.id).await;
    let calm = fx.create(0, Some(parent.id)).await;
    idle(reg, calm.id).await;
    let broken = fx.create(0, Some(parent.id)).await;
    set(reg, broken.id, AgentStatus::Error).await;
    let busy = fx.create(0, Some(parent.id)).await;
    running(reg, busy.id).await;
    let starting = fx.create(0, Some(parent.id)).await;
    let with_runner = fx.create(0, Some(parent.id)).await;
    idle(reg, with_runner.id).await;
    let runner = fx.create(0, Some(with_runner.id)).await;
    running(reg, runner.id).await;
    let with_job = fx.create(0, Some(parent.id)).await;
    idle(reg, with_job.id).await;
    jobs.add(with_job.id, "build", StopBehaviour::Succeed);
    let with_calm = fx.create(0, Some(parent.id)).await;
    idle(reg, with_calm.id).await;
    let calm_grandchild = fx.create(0, Some(with_calm.id)).await;
    idle(reg, calm_grandchild.id).await;
    let gone = fx.create(0, Some(parent.id)).await;
    idle(reg, gone.id).await;
    reg.archive(gone.id, PLAIN).await.expect("archive");
    fx.runtime.wait_for(WAIT, |c| !c.is_empty()).await;

    let outcome = reg
        .archive_idle_children(parent.id)
        .await
        .expect("bulk archive");
    let archived = set_of([calm.id, broken.id, with_calm.id, calm_grandchild.id]);
    assert_eq!(set_of(outcome.archived.iter().copied()), archived);
    assert_eq!(
        outcome.archived.len(),
        4,
        "each once: {:?}",
        outcome.archived
    );
    let skipped: BTreeMap<AgentId, Vec<String>> = outcome
        .skipped
        .iter()
        .map(|r| {
            assert_eq!(
                r.activity.agent_id,
                Some(r.agent_id),
                "the report names the child"
            );
            (r.agent_id, r.activity.families.keys().cloned().collect())
        })
        .collect();
    assert_eq!(
        skipped,
        BTreeMap::from([
            (busy.id, vec!["turn".to_string()]),
            (starting.id, vec![]),
            (with_runner.id, vec!["subagent".to_string()]),
            (with_job.id, vec!["job".to_string()]),
        ])
    );
    for id in &archived {
        assert!(reg.get(*id).is_some_and(|a| a.is_archived()), "{id}");
    }
    for id in [
        parent.id,
        busy.id,
        starting.id,
        with_runner.id,
        runner.id,
        with_job.id,
    ] {
        assert!(reg.get(id).is_some_and(|a| !a.is_archived()), "{id}");
    }
    assert_eq!(
        reg.get(broken.id).map(|a| a.status),
        Some(AgentStatus::Closed)
    );
    let calls = fx.runtime.wait_for(WAIT, |c| c.len() >= 5).await;
    assert_eq!(
        set_of(fx.runtime.closes()),
        set_of(archived.iter().copied().chain([gone.id])),
        "{calls:?}"
    );
    assert!(
        fx.runtime.cancels().is_empty(),
        "a skipped child is not stopped"
    );
    assert!(jobs.stops().is_empty());
}

// ---- autoArchive ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_archive_follows_the_first_terminal_turn_event() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let outcomes = [
        TurnOutcome::Completed,
        TurnOutcome::Failed {
            error: "boom".to_string(),
        },
        TurnOutcome::Canceled,
    ];
    let mut archived = Vec::new();
    for outcome in outcomes {
        let name = outcome.event_name().as_str();
        let agent = fx
            .try_create(|a| a.auto_archive = true)
            .await
            .expect("create");
        let helper = fx.create(0, Some(agent.id)).await;
        idle(reg, helper.id).await;
        running(reg, agent.id).await;
        let after = reg.record_turn_end(agent.id, outcome).await.expect(name);
        assert!(after.is_archived(), "{name}");
        assert_eq!(after.status, AgentStatus::Closed, "{name}");
        assert!(
            fx.on_disk(agent.id).is_some_and(|a| a.is_archived()),
            "{name}"
        );
        assert!(
            reg.get(helper.id).is_some_and(|a| a.is_archived()),
            "{name}: the cascade too"
        );
        archived.extend([agent.id, helper.id]);
    }
    let plain = fx.create(0, None).await;
    running(reg, plain.id).await;
    let plain = reg
        .record_turn_end(plain.id, TurnOutcome::Completed)
        .await
        .expect("completed");
    assert!(!plain.is_archived(), "no autoArchive asked");

    let calls = fx
        .runtime
        .wait_for(WAIT, |c| c.len() >= archived.len())
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fx.runtime.closes().len(), archived.len(), "{calls:?}");
    assert_eq!(set_of(fx.runtime.closes()), set_of(archived));
    assert!(!fx.runtime.closes().contains(&plain.id));
}

// ---- events ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_the_mutations_in_order() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let mut rx = reg.subscribe();

    let agent = fx.create(0, None).await;
    let created = drain(&mut rx);
    let kinds: Vec<&str> = created.iter().map(|e| kind(&e.change)).collect();
    assert_eq!(
        kinds,
        [
            "workspace_registered",
            "agent_created",
            "workspace_activity"
        ]
    );
    match &created[1].change {
        Change::AgentCreated(a) => assert_eq!(**a, agent),
        other => panic!("{other:?}"),
    }
    match &created[0].change {
        Change::WorkspaceRegistered(w) => assert_eq!(w.id, agent.workspace_id),
        other => panic!("{other:?}"),
    }
    match &created[2].change {
        Change::WorkspaceActivity(c) => {
            assert_eq!(c.workspace_id, agent.workspace_id);
            assert_eq!(c.activity, Some(ActivityBucket::Running));
        }
        other => panic!("{other:?}"),
    }

    let ready = idle(reg, agent.id).await;
    let titled = reg
        .set_title(agent.id, Some("named".to_string()))
        .await
        .expect("title");
    let updated = drain(&mut rx);
    let kinds: Vec<&str> = updated.iter().map(|e| kind(&e.change)).collect();
    assert_eq!(
        kinds,
        ["agent_updated", "workspace_activity", "agent_updated"]
    );
    match (&updated[0].change, &updated[2].change) {
        (Change::AgentUpdated(first), Change::AgentUpdated(second)) => {
            assert_eq!(**first, ready, "the event carries the new record");
            assert_eq!(**second, titled);
        }
        other => panic!("{other:?}"),
    }

    let all: Vec<u64> = created.iter().chain(&updated).map(|e| e.seq).collect();
    assert!(
        all.windows(2).all(|w| w[1] == w[0] + 1),
        "seq increases by one: {all:?}"
    );

    let ws = reg
        .register_workspace(fx.cwd(0), None)
        .await
        .expect("register");
    let registered = drain(&mut rx);
    assert_eq!(registered.len(), 1);
    assert!(registered[0].seq > *all.last().expect("some"));
    assert!(matches!(&registered[0].change, Change::WorkspaceRegistered(w) if w.id == ws.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_mutation_emits_nothing() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let mut rx = reg.subscribe();
    let agent = fx.create(0, None).await;
    let agent = running(reg, agent.id).await;
    let last = drain(&mut rx).last().map(|e| e.seq).expect("events so far");

    assert!(
        reg.set_status(agent.id, AgentStatus::Initializing, None)
            .await
            .is_err()
    );
    assert!(reg.archive(agent.id, PLAIN).await.is_err());
    assert!(
        reg.update_labels(agent.id, BTreeMap::new(), vec![PARENT_LABEL.to_string()])
            .await
            .is_err()
    );
    assert!(
        reg.create_agent(NewAgent {
            parent: Some(AgentId::new()),
            ..common::new_agent(&fx.cwd(0))
        })
        .await
        .is_err()
    );
    assert!(
        reg.create_agent(common::new_agent(&fx.cwd(0).join("missing")))
            .await
            .is_err()
    );
    assert!(
        reg.set_status(AgentId::new(), AgentStatus::Idle, None)
            .await
            .is_err()
    );
    assert!(drain(&mut rx).is_empty());
    assert_eq!(reg.get(agent.id), Some(agent.clone()));
    assert_eq!(
        reg.workspaces().len(),
        1,
        "no workspace for a failed create"
    );

    // The failures used up no seq: the next change follows the last one directly.
    let done = reg
        .record_turn_end(agent.id, TurnOutcome::Completed)
        .await
        .expect("completed");
    let events = drain(&mut rx);
    assert_eq!(events[0].seq, last + 1);
    assert!(matches!(&events[0].change, Change::AgentUpdated(a) if **a == done));
}

fn kind(change: &Change) -> &'static str {
    match change {
        Change::AgentCreated(_) => "agent_created",
        Change::AgentUpdated(_) => "agent_updated",
        Change::WorkspaceRegistered(_) => "workspace_registered",
        Change::WorkspaceActivity(_) => "workspace_activity",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_runtime_is_no_turn_and_archives_plainly() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let parent = fx.create(0, None).await;
    idle(reg, parent.id).await;
    let starting = fx.create(0, Some(parent.id)).await;
    assert_eq!(starting.status, AgentStatus::Initializing);
    assert!(reg.activity(parent.id).expect("activity").is_empty());
    assert!(reg.activity(starting.id).expect("activity").is_empty());

    let outcome = reg.archive(parent.id, PLAIN).await.expect("plain archive");
    assert_eq!(outcome.archived, vec![parent.id, starting.id]);
    let archived = reg.get(starting.id).expect("child");
    assert_eq!(
        archived.status,
        AgentStatus::Closed,
        "closed by the archive"
    );
    fx.runtime.wait_for(WAIT, |c| c.len() >= 2).await;
    assert_eq!(
        set_of(fx.runtime.closes()),
        set_of([parent.id, starting.id])
    );
    assert!(fx.runtime.cancels().is_empty(), "nothing to stop");
}

// ---- budgets --------------------------------------------------------------------------------

// A host's subagents below the hub's agents count in their trees: the spend a host last
// reported is in `tree_spend`, `spend_by_agent` and the budgets' check, and leaves with the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_spend_counts_in_the_trees_of_the_agents_it_works_for() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let (root, child) = fx.pair().await;
    reg.set_budget(
        root.id,
        Some(drover_core::Budget {
            tokens: Some(1000),
            cost: None,
            hard: false,
        }),
    )
    .await
    .expect("root's budget");
    reg.add_spend(root.id, Some(300), None)
        .await
        .expect("spend");
    let (kid, grandkid) = (AgentId::new(), AgentId::new());
    let tokens = |n| drover_core::Spend {
        tokens: Some(n),
        ..Default::default()
    };
    let changed = reg.set_remote_spend(
        "b",
        BTreeMap::from([(
            child.id,
            vec![
                (kid, tokens(400)),
                (grandkid, drover_core::Spend::default()),
            ],
        )]),
    );
    assert_eq!(changed, [(child.id, 400, 0.0)]);
    let tree = reg.tree_spend(root.id).expect("root");
    assert_eq!(tree.spend.tokens, Some(700));
    assert_eq!(tree.agents, 4);
    assert_eq!(tree.unknown, [child.id, grandkid]);
    let by_agent: Vec<AgentId> = reg.spend_by_agent(root.id).iter().map(|a| a.0).collect();
    assert_eq!(by_agent, [root.id, child.id, kid, grandkid]);
    assert!(reg.spent_budget(child.id).is_none());
    // The same report again changes nothing; more spent there spends the root's budget.
    let again = BTreeMap::from([(child.id, vec![(kid, tokens(400))])]);
    assert_eq!(reg.set_remote_spend("b", again.clone()).len(), 1);
    assert!(reg.set_remote_spend("b", again).is_empty());
    let more = reg.set_remote_spend("b", BTreeMap::from([(child.id, vec![(kid, tokens(700))])]));
    assert_eq!(more, [(child.id, 300, 0.0)]);
    let spent = reg
        .spent_budget(child.id)
        .expect("the root's budget is spent");
    assert_eq!(spent.agent, root.id);
    assert_eq!(spent.tree.spend.tokens, Some(1000));
    // Told, the budget warns as for a local spend.
    reg.warn_budgets(child.id, 300, 0.0).await;
    let warned = reg.get(root.id).and_then(|a| a.attention).map(|a| a.reason);
    assert_eq!(warned, Some(AttentionReason::BudgetWarning));
    // The host removed: its spend goes.
    let gone = reg.set_remote_spend("b", BTreeMap::new());
    assert_eq!(gone, [(child.id, -700, 0.0)]);
    assert_eq!(
        reg.tree_spend(root.id).expect("root").spend.tokens,
        Some(300)
    );
    assert!(reg.spent_budget(child.id).is_none());
}

// On the host: the budgets the hub sets on a subagent it made here hold its tree, beside the
// subagent's own budget (the tightest holds); reserved to the hub, gone with a detach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_budgets_on_its_subagent_hold_its_tree_here() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let hub_parent = AgentId::new();
    let kid = fx
        .try_create(|new| {
            new.parent = Some(hub_parent);
            new.upstream = Some(hub_parent);
        })
        .await
        .expect("the hub's subagent");
    let grandkid = fx.create(0, Some(kid.id)).await;
    // Only a hub's subagent may be made with the hub's budgets, and only as budgets: the
    // label is drover's to write, for anyone.
    let ten = drover_core::Budget {
        tokens: Some(10),
        cost: None,
        hard: false,
    };
    let with_label = |new: &mut NewAgent| {
        new.labels.insert(
            drover_core::UPSTREAM_BUDGET_LABEL.to_string(),
            r#"[{"tokens": 10}]"#.to_string(),
        );
    };
    let refused = fx.try_create(with_label).await;
    assert!(refused.is_err(), "a label reserved to the hub was taken");
    let refused = fx
        .try_create(|new| {
            with_label(new);
            new.parent = Some(hub_parent);
            new.upstream = Some(hub_parent);
        })
        .await;
    assert!(
        refused.is_err(),
        "the hub's budgets were taken as a label for its subagent"
    );
    let refused = fx
        .try_create(|new| new.upstream_budgets = vec![ten.clone()])
        .await;
    assert!(
        refused.is_err(),
        "the hub's budgets on an agent of this daemon"
    );
    let made = fx
        .try_create(|new| {
            new.upstream_budgets = vec![ten.clone()];
            new.parent = Some(hub_parent);
            new.upstream = Some(hub_parent);
        })
        .await
        .expect("made with the hub's budgets");
    assert_eq!(made.upstream_budgets(), [ten]);
    reg.set_budget(
        kid.id,
        Some(drover_core::Budget {
            tokens: Some(5000),
            cost: None,
            hard: false,
        }),
    )
    .await
    .expect("its own budget, set here");
    let allowance = drover_core::Budget {
        tokens: Some(800),
        cost: None,
        hard: true,
    };
    reg.set_upstream_budgets(kid.id, vec![allowance.clone()])
        .await
        .expect("the hub's budget");
    reg.add_spend(grandkid.id, Some(900), None)
        .await
        .expect("spend");
    let spent = reg.spent_budgets(grandkid.id);
    assert_eq!(spent.len(), 1, "{spent:?}");
    assert_eq!((spent[0].agent, &spent[0].budget), (kid.id, &allowance));
    assert_lineage(reg, grandkid.id, &[(5000, false, 900), (800, true, 900)]);
    assert_eq!(
        reg.get(kid.id).expect("kid").budget.and_then(|b| b.tokens),
        Some(5000)
    );
    let refused = reg
        .update_labels(
            kid.id,
            BTreeMap::new(),
            vec![drover_core::UPSTREAM_BUDGET_LABEL.to_string()],
        )
        .await;
    assert!(refused.is_err(), "a user removed the hub's budget");
    reg.set_upstream_budgets(kid.id, Vec::new())
        .await
        .expect("cleared");
    assert!(reg.spent_budgets(grandkid.id).is_empty());
    reg.set_upstream_budgets(kid.id, vec![allowance])
        .await
        .expect("again");
    reg.detach(kid.id).await.expect("detach");
    assert!(
        reg.spent_budgets(grandkid.id).is_empty(),
        "detached: its own tree"
    );
}

/// Each budget on `id`'s lineage, spent or not, is `want`'s (its tokens, whether the hub's, its
/// tree's tokens): the hub's too, what this daemon passes on to subagents on its own hosts.
fn assert_lineage(
    reg: &drover_core::Registry,
    id: drover_core::AgentId,
    want: &[(u64, bool, u64)],
) {
    let tokens = |t: Option<u64>| t.unwrap_or(0);
    let all: Vec<(u64, bool, u64)> = reg
        .lineage_budgets(id)
        .iter()
        .map(|b| {
            (
                tokens(b.budget.tokens),
                b.upstream,
                tokens(b.tree.spend.tokens),
            )
        })
        .collect();
    assert_eq!(all, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_is_found_on_the_lineage_nearest_first() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let root = fx.create(0, None).await;
    let child = fx.create(0, Some(root.id)).await;
    let grandchild = fx.create(0, Some(child.id)).await;
    let budget = |tokens| drover_core::Budget {
        tokens: Some(tokens),
        cost: None,
        hard: false,
    };
    reg.set_budget(root.id, Some(budget(1000)))
        .await
        .expect("root's budget");
    reg.set_budget(child.id, Some(budget(500)))
        .await
        .expect("child's budget");
    // Nothing reported: unknown spend reaches no budget.
    assert!(reg.spent_budgets(grandchild.id).is_empty());
    reg.add_spend(grandchild.id, Some(600), None)
        .await
        .expect("spend");
    // The child's tree spent its 500; the root's 1000 is not spent.
    let spent: Vec<AgentId> = reg
        .spent_budgets(grandchild.id)
        .iter()
        .map(|s| s.agent)
        .collect();
    assert_eq!(spent, [child.id]);
    assert!(reg.spent_budget(root.id).is_none());
    reg.add_spend(root.id, Some(400), None)
        .await
        .expect("spend");
    // Both now, the nearest first; the root's tree counts the grandchild's spend.
    let spent = reg.spent_budgets(grandchild.id);
    let agents: Vec<AgentId> = spent.iter().map(|s| s.agent).collect();
    assert_eq!(agents, [child.id, root.id]);
    assert_eq!(spent[1].tree.spend.tokens, Some(1000));
    assert_eq!(reg.tree(root.id), [root.id, child.id, grandchild.id]);
    // Raised: the child's tree is free again, the root's still holds it.
    reg.set_budget(child.id, Some(budget(5000)))
        .await
        .expect("raised");
    let agents: Vec<AgentId> = reg
        .spent_budgets(grandchild.id)
        .iter()
        .map(|s| s.agent)
        .collect();
    assert_eq!(agents, [root.id]);
}
