//! Properties of the registry over random agent forests and random operation sequences: the
//! archive cascade, detach, and workspace activity kept incrementally. Every mutation goes
//! through the registry (real files on a temp home), so the case counts stay modest.

// Each property drives its operations and checks every invariant in one place, as one story.
#![expect(clippy::too_many_lines)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

use common::{Fixture, WAIT, expected_activity, rebuilt_index, reported_activity};
use drover_core::{
    ActivityBucket, Agent, AgentId, AgentStatus, ArchiveOptions, AttentionReason, NewAgent,
    Registry, TurnOutcome, WorkspaceId,
};
use drover_testkit::RuntimeCall;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

const STOP: ArchiveOptions = ArchiveOptions {
    stop_activity: true,
};

/// One runtime for every case (each case still gets its own home and registry).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    }
}

// ---- random forests -------------------------------------------------------------------------

/// One agent of a forest: its parent among the agents made before it, its cwd, its status.
#[derive(Debug, Clone)]
struct Node {
    parent: Option<Index>,
    dir: usize,
    /// 0 initializing, 1 idle, 2 running.
    status: u8,
}

/// What happens to the forest before the property is checked.
#[derive(Debug, Clone)]
enum Pre {
    Archive(Index),
    Unarchive(Index),
    Detach(Index),
}

fn node() -> impl Strategy<Value = Node> {
    (
        proptest::option::weighted(0.75, any::<Index>()),
        0..2usize,
        0..3u8,
    )
        .prop_map(|(parent, dir, status)| Node {
            parent,
            dir,
            status,
        })
}

fn pre() -> impl Strategy<Value = Pre> {
    prop_oneof![
        any::<Index>().prop_map(Pre::Archive),
        any::<Index>().prop_map(Pre::Unarchive),
        any::<Index>().prop_map(Pre::Detach),
    ]
}

/// Creates the forest through the registry, sets the statuses, then applies `pre`.
async fn build_forest(fx: &Fixture, nodes: &[Node], pre: &[Pre]) -> Vec<AgentId> {
    let reg = &fx.registry;
    let mut ids: Vec<AgentId> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let parent = match (i, &n.parent) {
            (0, _) | (_, None) => None,
            (_, Some(ix)) => Some(ids[ix.index(i)]),
        };
        ids.push(common::create(reg, &fx.cwd(n.dir), parent).await.id);
    }
    for (id, n) in ids.iter().zip(nodes) {
        match n.status {
            0 => {}
            1 => {
                common::idle(reg, *id).await;
            }
            _ => {
                common::running(reg, *id).await;
            }
        }
    }
    let mut calls = 0;
    for p in pre {
        match p {
            Pre::Archive(ix) => {
                let outcome = reg
                    .archive(ids[ix.index(ids.len())], STOP)
                    .await
                    .expect("archive with stopActivity");
                // One close per archived agent, one cancel per stopped turn or subagent; wait
                // for them so that later checks see only their own calls.
                calls += outcome.archived.len()
                    + outcome
                        .stopped
                        .families
                        .values()
                        .map(Vec::len)
                        .sum::<usize>();
                let seen = fx.runtime.wait_for(WAIT, |c| c.len() >= calls).await;
                assert_eq!(seen.len(), calls, "{seen:?}");
            }
            Pre::Unarchive(ix) => {
                let id = ids[ix.index(ids.len())];
                // Unarchiving an archived agent closes its runtime again first.
                calls += usize::from(reg.get(id).is_some_and(|a| a.is_archived()));
                reg.unarchive(id).await.expect("unarchive");
            }
            Pre::Detach(ix) => {
                reg.detach(ids[ix.index(ids.len())]).await.expect("detach");
            }
        }
    }
    ids
}

/// Every agent below `id` through parent labels, found independently of the core.
fn descendants_of(agents: &[Agent], id: AgentId) -> BTreeSet<AgentId> {
    let mut children: HashMap<AgentId, Vec<AgentId>> = HashMap::new();
    for a in agents {
        if let Some(p) = a.parent_id() {
            children.entry(p).or_default().push(a.id);
        }
    }
    let mut out = BTreeSet::new();
    let mut stack = vec![id];
    while let Some(current) = stack.pop() {
        for c in children.get(&current).into_iter().flatten() {
            if *c != id && out.insert(*c) {
                stack.push(*c);
            }
        }
    }
    out
}

fn by_id(agents: Vec<Agent>) -> BTreeMap<AgentId, Agent> {
    agents.into_iter().map(|a| (a.id, a)).collect()
}

/// `before` archived as `after` says, and nothing else about it changed.
fn archived_version(before: &Agent, after: &Agent) -> Agent {
    let mut want = before.clone();
    want.archived_at = after.archived_at;
    want.updated_at = after.updated_at;
    want.status = AgentStatus::Closed;
    if want.attention.map(|a| a.reason) == Some(AttentionReason::Permission) {
        want.attention = None;
    }
    want
}

/// Every record in memory is the one on disk.
fn assert_disk_matches(fx: &Fixture) -> Result<(), TestCaseError> {
    for agent in fx.registry.agents() {
        let stored = fx.on_disk(agent.id);
        prop_assert_eq!(stored.as_ref(), Some(&agent));
    }
    Ok(())
}

async fn archive_archives_exactly_the_unarchived_subtree(
    nodes: Vec<Node>,
    pre: Vec<Pre>,
    target: Index,
) -> Result<(), TestCaseError> {
    let fx = Fixture::with_dirs(2);
    let ids = build_forest(&fx, &nodes, &pre).await;
    let reg = &fx.registry;
    let target = ids[target.index(ids.len())];
    let before = reg.agents();
    let was_archived = before.iter().any(|a| a.id == target && a.is_archived());
    let expected: BTreeSet<AgentId> = if was_archived {
        BTreeSet::new()
    } else {
        descendants_of(&before, target)
            .into_iter()
            .chain([target])
            .filter(|id| before.iter().any(|a| a.id == *id && !a.is_archived()))
            .collect()
    };

    let outcome = reg.archive(target, STOP).await.expect("archive");
    prop_assert_eq!(
        outcome.archived.iter().copied().collect::<BTreeSet<_>>(),
        expected.clone()
    );
    prop_assert_eq!(outcome.archived.len(), expected.len(), "each agent once");
    if !was_archived {
        prop_assert_eq!(outcome.archived.first(), Some(&target));
    }

    let after = by_id(reg.agents());
    prop_assert_eq!(after.len(), before.len());
    for old in &before {
        let new = &after[&old.id];
        if expected.contains(&old.id) {
            prop_assert!(new.is_archived());
            prop_assert_eq!(new, &archived_version(old, new));
        } else {
            prop_assert_eq!(new, old, "an agent outside the cascade changed");
        }
    }
    assert_disk_matches(&fx)?;
    prop_assert_eq!(reported_activity(reg), expected_activity(&reg.agents()));
    let closes = fx
        .runtime
        .wait_for(WAIT, |calls| expected.iter().all(|id| closed(calls, *id)))
        .await;
    for id in &expected {
        prop_assert!(closed(&closes, *id), "no close for {}", id);
    }
    Ok(())
}

async fn detach_leaves_the_former_parents_cascade_and_activity(
    nodes: Vec<Node>,
    pre: Vec<Pre>,
    pick: Index,
) -> Result<(), TestCaseError> {
    let fx = Fixture::with_dirs(2);
    build_forest(&fx, &nodes, &pre).await;
    let reg = &fx.registry;
    let forest = reg.agents();
    let candidates: Vec<&Agent> = forest
        .iter()
        .filter(|a| a.parent_id().is_some() && !a.is_archived())
        .collect();
    if candidates.is_empty() {
        return Ok(());
    }
    let picked = candidates[pick.index(candidates.len())].id;
    // Give the subtree below the agent work to move: every unarchived descendant is starting
    // (a legal move from any cold status, and not gated by an archived lineage).
    for a in &forest {
        if descendants_of(&forest, picked).contains(&a.id)
            && !a.is_archived()
            && !a.status.is_busy()
        {
            common::set(reg, a.id, AgentStatus::Initializing).await;
        }
    }
    let before = reg.agents();
    let agent = before
        .iter()
        .find(|a| a.id == picked)
        .expect("picked")
        .clone();
    let parent = agent.parent_id().expect("a subagent");
    let subtree: BTreeSet<AgentId> = descendants_of(&before, agent.id)
        .into_iter()
        .chain([agent.id])
        .collect();

    let calls_before_detach = fx.runtime.calls().len();
    let detached = reg.detach(agent.id).await.expect("detach");
    let mut want = agent.clone();
    want.labels.remove(drover_core::PARENT_LABEL);
    want.updated_at = detached.updated_at;
    prop_assert_eq!(&detached, &want, "only the parent label went");
    let after = by_id(reg.agents());
    for old in before.iter().filter(|a| a.id != agent.id) {
        prop_assert_eq!(&after[&old.id], old);
    }
    prop_assert!(!reg.subagents(parent).iter().any(|a| a.id == agent.id));
    prop_assert_eq!(reported_activity(reg), expected_activity(&reg.agents()));
    if subtree
        .iter()
        .any(|id| after[id].status.is_busy() && !after[id].is_archived())
    {
        prop_assert!(
            reg.workspace_activity(agent.workspace_id) >= Some(ActivityBucket::Running),
            "its running work now shows in its own workspace"
        );
    }
    // Quiet everything outside the subtree: what is left running is the subtree's work alone,
    // so a contribution left behind in the former root's workspace would show.
    for a in before
        .iter()
        .filter(|a| !subtree.contains(&a.id) && !a.is_archived())
    {
        if a.status.is_busy() || a.status == AgentStatus::Error {
            common::set(reg, a.id, AgentStatus::Idle).await;
        }
        if a.attention.is_some() {
            reg.clear_attention(a.id).await.expect("clear");
        }
    }
    prop_assert_eq!(reported_activity(reg), expected_activity(&reg.agents()));
    let after = by_id(reg.agents());
    prop_assert_eq!(
        fx.runtime.calls().len(),
        calls_before_detach,
        "detach stops nothing"
    );

    // The former lineage's archive no longer reaches the detached subtree.
    let mut lineage = vec![parent];
    while let Some(up) = after
        .get(lineage.last().expect("not empty"))
        .and_then(Agent::parent_id)
    {
        if lineage.contains(&up) {
            break;
        }
        lineage.push(up);
    }
    let Some(ancestor) = lineage
        .into_iter()
        .find(|id| after.get(id).is_some_and(|a| !a.is_archived()))
    else {
        return Ok(());
    };
    let calls_before = fx.runtime.calls().len();
    let outcome = reg.archive(ancestor, STOP).await.expect("archive");
    prop_assert!(!outcome.archived.is_empty());
    prop_assert!(outcome.archived.iter().all(|id| !subtree.contains(id)));
    let stopped_agents: Vec<AgentId> = outcome
        .stopped
        .families
        .values()
        .flatten()
        .filter_map(|item| item.agent_id)
        .collect();
    prop_assert!(stopped_agents.iter().all(|id| !subtree.contains(id)));
    let now = by_id(reg.agents());
    for id in &subtree {
        prop_assert_eq!(&now[id], &after[id], "the detached subtree is untouched");
    }
    let expected_calls = outcome.archived.len() + stopped_agents.len();
    let calls = fx
        .runtime
        .wait_for(WAIT, |calls| calls.len() >= calls_before + expected_calls)
        .await;
    for call in &calls[calls_before..] {
        match call {
            RuntimeCall::Cancel { agent: a, .. } | RuntimeCall::Close { agent: a, .. } => {
                prop_assert!(!subtree.contains(a), "{:?}", call);
            }
            RuntimeCall::Shutdown => prop_assert!(false, "shutdown"),
        }
    }
    Ok(())
}

// ---- random operation sequences -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Create {
        parent: Option<Index>,
        dir: usize,
        /// Join the second workspace registered on folder 0 instead of the folder's first.
        second_workspace: bool,
        auto_archive: bool,
    },
    Status {
        agent: Index,
        to: usize,
    },
    TurnEnd {
        agent: Index,
        outcome: u8,
    },
    Attention {
        agent: Index,
        reason: usize,
    },
    ClearAttention(Index),
    Detach(Index),
    Archive(Index),
    Unarchive(Index),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            proptest::option::weighted(0.6, any::<Index>()),
            0..2usize,
            any::<bool>(),
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(parent, dir, second_workspace, auto_archive)| Op::Create {
                parent,
                dir,
                second_workspace,
                auto_archive,
            }),
        4 => (any::<Index>(), 0..AgentStatus::ALL.len())
            .prop_map(|(agent, to)| Op::Status { agent, to }),
        2 => (any::<Index>(), 0..3u8).prop_map(|(agent, outcome)| Op::TurnEnd { agent, outcome }),
        1 => (any::<Index>(), 0..4usize).prop_map(|(agent, reason)| Op::Attention { agent, reason }),
        1 => any::<Index>().prop_map(Op::ClearAttention),
        1 => any::<Index>().prop_map(Op::Detach),
        2 => any::<Index>().prop_map(Op::Archive),
        1 => any::<Index>().prop_map(Op::Unarchive),
    ]
}

const REASONS: [AttentionReason; 4] = [
    AttentionReason::Finished,
    AttentionReason::Error,
    AttentionReason::Permission,
    AttentionReason::Interrupted,
];

/// Whether the registry must accept `agent` going to `to`, by the seeds' rules.
fn may_become(agents: &BTreeMap<AgentId, Agent>, agent: &Agent, to: AgentStatus) -> bool {
    let archived_lineage = {
        let mut current = agent.parent_id();
        let mut found = false;
        let mut steps = 0;
        while let Some(p) = current.and_then(|p| agents.get(&p)) {
            found |= p.is_archived();
            current = p.parent_id();
            steps += 1;
            if steps > agents.len() {
                break;
            }
        }
        found
    };
    // A runtime's late report that an archived agent left a busy state the archive already
    // ended is accepted and changes nothing.
    let moot = agent.is_archived() && agent.status == AgentStatus::Closed && !to.is_busy();
    moot || (agent.status.can_become(to)
        && !(to.is_busy() && agent.is_archived())
        && !(to == AgentStatus::Running && archived_lineage))
}

/// Activity as reported equals the core's index rebuilt from scratch and the seed's rule.
fn check_activity(reg: &Registry, agents: &[Agent]) -> Result<(), TestCaseError> {
    let rebuilt = rebuilt_index(agents);
    let reported = reported_activity(reg);
    let rebuilt: BTreeMap<WorkspaceId, ActivityBucket> = reg
        .workspaces()
        .into_iter()
        .filter_map(|w| rebuilt.workspace(w.id).map(|b| (w.id, b)))
        .collect();
    prop_assert_eq!(&reported, &rebuilt, "incremental vs rebuilt index");
    prop_assert_eq!(&reported, &expected_activity(agents), "vs the seed's rule");
    Ok(())
}

async fn activity_stays_equal_to_a_recomputation(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut fx = Fixture::with_dirs(2);
    let reg = &fx.registry;
    let second = fx.workspace(0).await;
    let mut ids: Vec<AgentId> = Vec::new();
    for op in &ops {
        let pick = |ix: &Index| ids[ix.index(ids.len())];
        if ids.is_empty() && !matches!(op, Op::Create { .. }) {
            continue;
        }
        match op {
            Op::Create {
                parent,
                dir,
                second_workspace,
                auto_archive,
            } => {
                let parent = parent.as_ref().filter(|_| !ids.is_empty()).map(&pick);
                let parent_archived =
                    parent.is_some_and(|p| reg.get(p).is_some_and(|a| a.is_archived()));
                let created = reg
                    .create_agent(NewAgent {
                        parent,
                        auto_archive: *auto_archive,
                        workspace_id: second_workspace.then_some(second),
                        ..common::new_agent(&fx.cwd(if *second_workspace { 0 } else { *dir }))
                    })
                    .await;
                match created {
                    Ok(agent) => {
                        prop_assert!(!parent_archived);
                        ids.push(agent.id);
                    }
                    Err(e) => {
                        prop_assert!(parent_archived, "{}", e);
                        prop_assert_eq!(e.code(), "agent_archived");
                    }
                }
            }
            Op::Status { agent, to } => {
                let id = pick(agent);
                let to = AgentStatus::ALL[*to];
                let all = by_id(reg.agents());
                let allowed = may_become(&all, &all[&id], to);
                let result = reg.set_status(id, to, None).await;
                match &result {
                    // A late report to an archived (so `closed`) agent changes nothing.
                    Ok(a) if a.is_archived() => prop_assert_eq!(a.status, AgentStatus::Closed),
                    Ok(a) => prop_assert_eq!(a.status, to),
                    Err(e) => prop_assert!(
                        ["illegal_transition", "agent_archived", "turn_blocked"]
                            .contains(&e.code().as_str()),
                        "{}",
                        e
                    ),
                }
                prop_assert_eq!(result.is_ok(), allowed, "{:?} -> {}", all[&id].status, to);
            }
            Op::TurnEnd { agent, outcome } => {
                let id = pick(agent);
                let was_running = reg
                    .get(id)
                    .is_some_and(|a| a.status == AgentStatus::Running);
                // The archive ended it already: the late report is accepted, changing nothing.
                let moot = reg
                    .get(id)
                    .is_some_and(|a| a.is_archived() && a.status != AgentStatus::Running);
                let outcome = match outcome {
                    0 => TurnOutcome::Completed,
                    1 => TurnOutcome::Failed {
                        error: "x".to_string(),
                    },
                    _ => TurnOutcome::Canceled,
                };
                let result = reg.record_turn_end(id, outcome).await;
                prop_assert_eq!(result.is_ok(), was_running || moot);
                if let Ok(a) = result
                    && was_running
                {
                    prop_assert_eq!(a.is_archived(), a.auto_archive);
                }
            }
            Op::Attention { agent, reason } => {
                reg.set_attention(pick(agent), REASONS[*reason])
                    .await
                    .expect("attention");
            }
            Op::ClearAttention(agent) => {
                reg.clear_attention(pick(agent)).await.expect("clear");
            }
            Op::Detach(agent) => {
                let a = reg.detach(pick(agent)).await.expect("detach");
                prop_assert_eq!(a.parent_id(), None);
            }
            Op::Archive(agent) => {
                let id = pick(agent);
                reg.archive(id, STOP).await.expect("archive");
                prop_assert!(reg.get(id).is_some_and(|a| a.is_archived()));
            }
            Op::Unarchive(agent) => {
                let a = reg.unarchive(pick(agent)).await.expect("unarchive");
                prop_assert!(!a.is_archived());
            }
        }
        check_activity(reg, &reg.agents())?;
    }
    assert_disk_matches(&fx)?;

    // A restart reconciles busy agents; the reopened registry agrees with a recomputation
    // over what it loaded, and loaded what was there.
    let before = by_id(reg.agents());
    let report = fx.restart();
    let (again, runtime) = (&fx.registry, &fx.runtime);
    let loaded = again.agents();
    prop_assert_eq!(loaded.len(), before.len());
    let interrupted: BTreeSet<AgentId> = report.interrupted.iter().copied().collect();
    for agent in &loaded {
        let old = &before[&agent.id];
        let mut want = old.clone();
        if old.status.is_busy() {
            prop_assert!(interrupted.contains(&agent.id));
            want.status = AgentStatus::Idle;
            want.attention = agent
                .attention
                .filter(|a| a.reason == AttentionReason::Interrupted);
            prop_assert!(want.attention.is_some());
            want.updated_at = agent.updated_at;
        } else {
            prop_assert!(!interrupted.contains(&agent.id));
        }
        prop_assert_eq!(agent, &want);
    }
    check_activity(again, &loaded)?;
    prop_assert!(runtime.calls().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn archive_cascades_to_exactly_the_unarchived_subtree(
        nodes in prop::collection::vec(node(), 1..9),
        pre in prop::collection::vec(pre(), 0..5),
        target in any::<Index>(),
    ) {
        rt().block_on(archive_archives_exactly_the_unarchived_subtree(nodes, pre, target))?;
    }

    #[test]
    fn detach_takes_an_agent_out_of_its_former_lineage(
        nodes in prop::collection::vec(node(), 2..9),
        pre in prop::collection::vec(pre(), 0..4),
        pick in any::<Index>(),
    ) {
        rt().block_on(detach_leaves_the_former_parents_cascade_and_activity(nodes, pre, pick))?;
    }

    #[test]
    fn workspace_activity_equals_a_recomputation(ops in prop::collection::vec(op(), 1..28)) {
        rt().block_on(activity_stays_equal_to_a_recomputation(ops))?;
    }
}

/// Whether `calls` closed `agent`'s runtime.
fn closed(calls: &[RuntimeCall], agent: AgentId) -> bool {
    calls
        .iter()
        .any(|c| matches!(c, RuntimeCall::Close { agent: a, .. } if *a == agent))
}
