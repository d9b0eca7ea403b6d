//! Workspaces and their activity (seed 000): registration and kinds, one bucket per workspace
//! id, the urgency order, what roots and subagents contribute, and what a change costs.

mod common;

use std::collections::BTreeMap;

use common::{Fixture, create, expected_activity, idle, reported_activity, running, set};
use drover_core::{
    ActivityBucket, AgentId, AgentStatus, ArchiveOptions, AttentionReason, TurnOutcome,
    WorkspaceId, WorkspaceKind,
};

const PLAIN: ArchiveOptions = ArchiveOptions {
    stop_activity: false,
};

/// The registry's answer for every workspace equals the seed's rule recomputed from scratch.
fn assert_matches_the_rule(fx: &Fixture) {
    let agents = fx.registry.agents();
    assert_eq!(reported_activity(&fx.registry), expected_activity(&agents));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_kind_comes_from_dot_git() {
    let fx = Fixture::with_dirs(3);
    std::fs::create_dir(fx.cwd(1).join(".git")).expect("a .git folder");
    std::fs::write(
        fx.cwd(2).join(".git"),
        "gitdir: /elsewhere/.git/worktrees/x\n",
    )
    .expect("a .git file");

    let mut kinds = Vec::new();
    for dir in 0..3 {
        let agent = fx.create(dir, None).await;
        let ws = fx
            .registry
            .workspace(agent.workspace_id)
            .expect("registered with the agent");
        assert_eq!(ws.path, fx.cwd(dir));
        assert!(
            fx.home
                .path()
                .join("workspaces")
                .join(format!("{}.json", ws.id))
                .is_file(),
            "the workspace is on disk"
        );
        kinds.push(ws.kind);
    }
    assert_eq!(
        kinds,
        [
            WorkspaceKind::Directory,
            WorkspaceKind::LocalCheckout,
            WorkspaceKind::Worktree
        ]
    );
    let explicit = fx
        .registry
        .register_workspace(fx.cwd(1), None)
        .await
        .expect("register");
    assert_eq!(explicit.kind, WorkspaceKind::LocalCheckout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_one_cwd_join_one_workspace() {
    let fx = Fixture::with_dirs(2);
    let a = fx.create(0, None).await;
    let b = fx.create(0, None).await;
    let c = fx.create(1, None).await;
    assert_eq!(a.workspace_id, b.workspace_id);
    assert_ne!(a.workspace_id, c.workspace_id);
    assert_eq!(fx.registry.workspaces().len(), 2);

    // A relative or missing cwd is refused, and registers nothing.
    let err = fx
        .registry
        .create_agent(common::new_agent(std::path::Path::new("relative/dir")))
        .await
        .expect_err("relative");
    assert_eq!(err.code(), "invalid_input");
    let err = fx
        .try_create(|a| a.workspace_id = Some(WorkspaceId::new()))
        .await
        .expect_err("unknown workspace");
    assert_eq!(err.code(), "unknown_workspace");
    assert_eq!(fx.registry.workspaces().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_belongs_to_the_workspace_id_never_to_the_cwd() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let first = fx.create(0, None).await;
    let second_ws = reg
        .register_workspace(fx.cwd(0), None)
        .await
        .expect("a second workspace on the same folder");
    assert_ne!(second_ws.id, first.workspace_id);
    assert_eq!(second_ws.path, fx.cwd(0));
    assert_eq!(
        reg.workspace_activity(second_ws.id),
        None,
        "nobody there yet"
    );

    let other = fx
        .try_create(|a| a.workspace_id = Some(second_ws.id))
        .await
        .expect("create in the second workspace");
    assert_eq!(other.workspace_id, second_ws.id);
    let later = fx.create(0, None).await;
    assert_eq!(
        later.workspace_id, first.workspace_id,
        "without a workspace id an agent joins the folder's first workspace"
    );

    idle(reg, first.id).await;
    idle(reg, later.id).await;
    running(reg, other.id).await;
    assert_eq!(
        reg.workspace_activity(first.workspace_id),
        Some(ActivityBucket::Idle)
    );
    assert_eq!(
        reg.workspace_activity(second_ws.id),
        Some(ActivityBucket::Running)
    );

    reg.record_turn_end(other.id, TurnOutcome::Completed)
        .await
        .expect("done");
    reg.clear_attention(other.id).await.expect("seen");
    set(reg, first.id, AgentStatus::Running).await;
    assert_eq!(
        reg.workspace_activity(first.workspace_id),
        Some(ActivityBucket::Running)
    );
    assert_eq!(
        reg.workspace_activity(second_ws.id),
        Some(ActivityBucket::Idle)
    );
    assert_matches_the_rule(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_follow_the_urgency_order() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let ws = fx.workspace(0).await;
    assert_eq!(reg.workspace_activity(ws), None);
    let mut agents: Vec<AgentId> = Vec::new();
    for _ in 0..5 {
        let a = fx.create(0, None).await;
        assert_eq!(a.workspace_id, ws);
        idle(reg, a.id).await;
        agents.push(a.id);
    }
    let [calm, done, busy, broken, asking] = agents[..] else {
        unreachable!()
    };
    let at = |expected| {
        assert_eq!(reg.workspace_activity(ws), Some(expected));
        assert_matches_the_rule(&fx);
    };
    at(ActivityBucket::Idle);

    // Escalate one level at a time ...
    reg.set_attention(done, AttentionReason::Finished)
        .await
        .expect("attention");
    at(ActivityBucket::Attention);
    set(reg, busy, AgentStatus::Running).await;
    at(ActivityBucket::Running);
    set(reg, broken, AgentStatus::Error).await;
    at(ActivityBucket::Error);
    set(reg, asking, AgentStatus::Running).await;
    reg.set_attention(asking, AttentionReason::Permission)
        .await
        .expect("permission");
    at(ActivityBucket::Permission);

    // ... and come down the same way.
    reg.record_turn_end(asking, TurnOutcome::Canceled)
        .await
        .expect("canceled");
    at(ActivityBucket::Error);
    set(reg, broken, AgentStatus::Idle).await;
    at(ActivityBucket::Error); // the error attention still stands
    reg.clear_attention(broken).await.expect("seen");
    at(ActivityBucket::Running);
    set(reg, busy, AgentStatus::Idle).await;
    at(ActivityBucket::Attention);
    reg.clear_attention(done).await.expect("seen");
    at(ActivityBucket::Idle);

    for id in [calm, done, busy, broken, asking] {
        reg.archive(id, PLAIN).await.expect("archive");
    }
    assert_eq!(
        reg.workspace_activity(ws),
        None,
        "only archived agents left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_contributes_the_bucket_of_its_own_state() {
    let fx = Fixture::with_dirs(6);
    let reg = &fx.registry;
    let mut want = BTreeMap::new();

    let starting = fx.create(0, None).await;
    want.insert(starting.workspace_id, ActivityBucket::Running);
    let calm = fx.create(1, None).await;
    idle(reg, calm.id).await;
    want.insert(calm.workspace_id, ActivityBucket::Idle);
    let busy = fx.create(2, None).await;
    running(reg, busy.id).await;
    want.insert(busy.workspace_id, ActivityBucket::Running);
    let finished = fx.create(3, None).await;
    running(reg, finished.id).await;
    reg.record_turn_end(finished.id, TurnOutcome::Completed)
        .await
        .expect("done");
    want.insert(finished.workspace_id, ActivityBucket::Attention);
    let failed = fx.create(4, None).await;
    running(reg, failed.id).await;
    reg.record_turn_end(
        failed.id,
        TurnOutcome::Failed {
            error: "x".to_string(),
        },
    )
    .await
    .expect("failed");
    want.insert(failed.workspace_id, ActivityBucket::Error);
    let asking = fx.create(5, None).await;
    running(reg, asking.id).await;
    reg.set_attention(asking.id, AttentionReason::Permission)
        .await
        .expect("permission");
    want.insert(asking.workspace_id, ActivityBucket::Permission);

    assert_eq!(reported_activity(reg), want);
    assert_matches_the_rule(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_subagent_counts_in_its_root_parents_workspace() {
    let fx = Fixture::with_dirs(3);
    let reg = &fx.registry;
    let root = fx.create(0, None).await;
    let child = fx.create(1, Some(root.id)).await;
    let grandchild = fx.create(2, Some(child.id)).await;
    let (w_root, w_child, w_grand) = (
        root.workspace_id,
        child.workspace_id,
        grandchild.workspace_id,
    );
    assert!(w_root != w_child && w_child != w_grand && w_root != w_grand);
    idle(reg, root.id).await;
    idle(reg, child.id).await;
    idle(reg, grandchild.id).await;
    let snapshot = |r, c, g| {
        assert_eq!(
            (
                reg.workspace_activity(w_root),
                reg.workspace_activity(w_child),
                reg.workspace_activity(w_grand)
            ),
            (r, c, g)
        );
        assert_matches_the_rule(&fx);
    };
    snapshot(Some(ActivityBucket::Idle), None, None);

    set(reg, grandchild.id, AgentStatus::Running).await;
    snapshot(Some(ActivityBucket::Running), None, None);
    set(reg, grandchild.id, AgentStatus::Idle).await;
    snapshot(Some(ActivityBucket::Idle), None, None);
    set(reg, child.id, AgentStatus::Running).await;
    snapshot(Some(ActivityBucket::Running), None, None);
    set(reg, child.id, AgentStatus::Idle).await;

    // Even where the root itself is more urgent, the root's workspace is the one told.
    set(reg, root.id, AgentStatus::Error).await;
    set(reg, grandchild.id, AgentStatus::Running).await;
    snapshot(Some(ActivityBucket::Error), None, None);

    // Detached, the grandchild's middle parent becomes the root of the running work.
    reg.detach(child.id).await.expect("detach");
    snapshot(
        Some(ActivityBucket::Error),
        Some(ActivityBucket::Running),
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagent_attention_error_and_permission_do_not_escalate() {
    let fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let root = fx.create(0, None).await;
    idle(reg, root.id).await;
    let finished = fx.create(1, Some(root.id)).await;
    running(reg, finished.id).await;
    reg.record_turn_end(finished.id, TurnOutcome::Completed)
        .await
        .expect("done");
    let failed = fx.create(1, Some(root.id)).await;
    running(reg, failed.id).await;
    reg.record_turn_end(
        failed.id,
        TurnOutcome::Failed {
            error: "x".to_string(),
        },
    )
    .await
    .expect("failed");
    let asking = fx.create(1, Some(root.id)).await;
    idle(reg, asking.id).await;
    reg.set_attention(asking.id, AttentionReason::Permission)
        .await
        .expect("permission");
    let broken = fx.create(1, Some(root.id)).await;
    set(reg, broken.id, AgentStatus::Error).await;

    assert_eq!(
        reg.workspace_activity(root.workspace_id),
        Some(ActivityBucket::Idle)
    );
    assert_eq!(reg.workspace_activity(finished.workspace_id), None);
    assert_matches_the_rule(&fx);

    // A subagent waiting on a permission mid-turn is running work, nothing more.
    set(reg, asking.id, AgentStatus::Running).await;
    reg.set_attention(asking.id, AttentionReason::Permission)
        .await
        .expect("permission");
    assert_eq!(
        reg.workspace_activity(root.workspace_id),
        Some(ActivityBucket::Running)
    );
    assert_eq!(reg.workspace_activity(finished.workspace_id), None);
    assert_matches_the_rule(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_agents_contribute_nothing() {
    let fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let root = fx.create(0, None).await;
    idle(reg, root.id).await;
    let child = fx.create(1, Some(root.id)).await;
    running(reg, child.id).await;
    let loner = fx.create(1, None).await;
    set(reg, loner.id, AgentStatus::Error).await;
    assert_eq!(
        reg.workspace_activity(root.workspace_id),
        Some(ActivityBucket::Running)
    );
    assert_eq!(
        reg.workspace_activity(loner.workspace_id),
        Some(ActivityBucket::Error)
    );

    reg.archive(
        child.id,
        ArchiveOptions {
            stop_activity: true,
        },
    )
    .await
    .expect("archive the child");
    assert_eq!(
        reg.workspace_activity(root.workspace_id),
        Some(ActivityBucket::Idle)
    );
    reg.archive(loner.id, PLAIN).await.expect("archive");
    assert_eq!(reg.workspace_activity(loner.workspace_id), None);
    reg.archive(root.id, PLAIN).await.expect("archive");
    assert_eq!(reg.workspace_activity(root.workspace_id), None);
    assert_matches_the_rule(&fx);

    // Unarchived, the root counts again; its archived child still does not.
    reg.unarchive(root.id).await.expect("unarchive");
    assert_eq!(
        reg.workspace_activity(root.workspace_id),
        Some(ActivityBucket::Idle)
    );
    assert_matches_the_rule(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_survives_a_restart() {
    let mut fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let root = fx.create(0, None).await;
    idle(reg, root.id).await;
    let child = fx.create(1, Some(root.id)).await;
    running(reg, child.id).await;
    let other = fx.create(1, None).await;
    set(reg, other.id, AgentStatus::Error).await;
    fx.restart();
    let again = &fx.registry;
    let mut want = BTreeMap::new();
    // The interrupted subagent is idle now, so the root's workspace is idle again.
    want.insert(root.workspace_id, ActivityBucket::Idle);
    want.insert(other.workspace_id, ActivityBucket::Error);
    assert_eq!(reported_activity(again), want);
    assert_eq!(want, expected_activity(&again.agents()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_change_costs_a_few_evaluations_not_the_fleet() {
    const ROOTS: usize = 30;
    const CHILDREN: usize = 9; // 300 agents in all
    let fx = Fixture::with_dirs(3);
    let reg = &fx.registry;
    let mut roots = Vec::new();
    let mut children = Vec::new();
    for r in 0..ROOTS {
        let root = create(reg, &fx.cwd(r % 3), None).await;
        for c in 0..CHILDREN {
            children.push(create(reg, &fx.cwd((r + c) % 3), Some(root.id)).await);
        }
        roots.push(root);
    }
    assert_eq!(reg.agent_count(), ROOTS * (CHILDREN + 1));

    let cost = |before: u64| reg.activity_evaluations() - before;
    let before = reg.activity_evaluations();
    idle(reg, children[0].id).await;
    assert!(cost(before) <= 3, "a subagent's status: {}", cost(before));
    let before = reg.activity_evaluations();
    idle(reg, roots[7].id).await;
    assert!(cost(before) <= 3, "a root's status: {}", cost(before));
    let before = reg.activity_evaluations();
    reg.set_attention(roots[8].id, AttentionReason::Finished)
        .await
        .expect("attention");
    assert!(cost(before) <= 3, "attention: {}", cost(before));
    let before = reg.activity_evaluations();
    reg.detach(children[5].id).await.expect("detach");
    assert!(cost(before) <= 3, "a leaf's detach: {}", cost(before));
    let before = reg.activity_evaluations();
    fx.create(0, Some(roots[3].id)).await;
    assert!(cost(before) <= 3, "a new subagent: {}", cost(before));
    assert_matches_the_rule(&fx);
}
