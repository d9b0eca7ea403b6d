//! The program `drover-crashdriver HOME CWD SEED` (a bin of drover-e2e, whose crash test kills
//! it; this is its code): opens the registry under HOME the way the daemon does,
//! then mutates it forever in bursts, announcing each mutation before it starts and
//! acknowledging it once it returned, so a test can SIGKILL it anywhere and hold the disk to
//! the acknowledgements. The line protocol is in [`crate::crash`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::crash::{Ack, AgentState, Begin, Boot, Failed, Op, SIGN_IN_PROVIDER, XorShift};
use anyhow::{Context, bail};
use drover_core::{
    AgentId, AgentStatus, ArchiveOptions, AuthMethod, Budget, Limited, NewAgent, NoRuntimes,
    Registry, RegistryError, TurnOutcome, UPSTREAM_ARCHIVED_LABEL, UPSTREAM_BUDGET_LABEL,
    UPSTREAM_LABEL,
};
use serde::Serialize;

/// Past this many agents, creating becomes rare: the store grows across many crash rounds.
const CREATE_SLOWLY_ABOVE: usize = 250;

/// The program's `main`: reads HOME CWD SEED from the arguments.
pub fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [home, cwd, seed] = args.as_slice() else {
        bail!("usage: drover-crashdriver HOME CWD SEED");
    };
    let seed: u64 = seed.parse().context("SEED must be an unsigned integer")?;
    let (home, cwd) = (PathBuf::from(home), PathBuf::from(cwd));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    runtime.block_on(run(home, cwd, seed))
}

async fn run(home: PathBuf, cwd: PathBuf, seed: u64) -> anyhow::Result<()> {
    // Exactly as the daemon opens it: on a blocking thread, with no agent runtimes.
    let (registry, boot) = {
        let home = home.clone();
        tokio::task::spawn_blocking(move || Registry::open(&home, Arc::new(NoRuntimes)))
    }
    .await
    .context("the open task")?
    .with_context(|| format!("open the registry under {}", home.display()))?;
    emit(
        "boot",
        &Boot {
            agents: boot.agents,
            interrupted: boot.interrupted.len(),
            cascades_completed: boot.cascades_completed,
            quarantined: boot.quarantined.len(),
        },
    );
    // A few cwds, so records land in several folders and some creates register a workspace.
    let mut cwds = vec![cwd.clone()];
    for sub in ["a", "b"] {
        let dir = cwd.join(sub);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        cwds.push(dir);
    }
    let model = registry
        .agents()
        .iter()
        .map(|a| (a.id, AgentState::of(a)))
        .collect();
    let mut driver = Driver {
        home,
        registry,
        rng: XorShift::new(seed),
        model,
        cwds,
        seed,
        seq: 0,
    };
    loop {
        let burst = driver.rng.range(1, 24);
        for _ in 0..burst {
            driver.step().await;
        }
        let pause = driver.rng.range(0, 3000);
        tokio::time::sleep(Duration::from_micros(pause)).await;
    }
}

/// Prints one protocol line in a single write and flushes it. If nobody reads any more, the
/// test is gone: so are we.
pub(crate) fn emit(tag: &str, value: &impl Serialize) {
    let json = match serde_json::to_string(value) {
        Ok(json) => json,
        Err(e) => diverge(&format!("cannot encode a `{tag}` line: {e}")),
    };
    let line = format!("{tag} {json}\n");
    let mut out = std::io::stdout().lock();
    if out
        .write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// The registry did something the model did not predict: say so and stop.
fn diverge(message: &str) -> ! {
    emit_raw(&format!("diverge {message}\n"));
    eprintln!("drover-crashdriver: {message}");
    std::process::exit(3);
}

fn emit_raw(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
}

struct Driver {
    home: PathBuf,
    registry: Registry,
    rng: XorShift,
    /// What the registry holds, as far as the crash test follows it.
    model: HashMap<AgentId, AgentState>,
    cwds: Vec<PathBuf>,
    seed: u64,
    seq: u64,
}

impl Driver {
    async fn step(&mut self) {
        self.seq += 1;
        let (op, ok, expect) = self.choose();
        let begin = Begin {
            seq: self.seq,
            op: op.clone(),
            ok,
            expect,
        };
        emit("begin", &begin);
        match self.apply(&op).await {
            Ok(mut agents) => {
                if !ok {
                    diverge(&format!(
                        "seq {}: {op:?} was expected to fail but succeeded",
                        self.seq
                    ));
                }
                let mut expect = begin.expect;
                if let (Op::Create { .. }, [made], [predicted]) =
                    (&op, agents.as_slice(), expect.as_mut_slice())
                {
                    predicted.id = made.id;
                }
                agents.sort_by_key(|a| a.id);
                expect.sort_by_key(|a| a.id);
                if agents != expect {
                    diverge(&format!(
                        "seq {}: {op:?} produced {agents:?}, the model expected {expect:?}",
                        self.seq
                    ));
                }
                for agent in &agents {
                    if let Some(id) = agent.id {
                        self.model.insert(id, agent.clone());
                    }
                }
                emit(
                    "ack",
                    &Ack {
                        seq: self.seq,
                        agents,
                    },
                );
            }
            Err(e) => {
                if ok || matches!(e, RegistryError::Store(_)) {
                    diverge(&format!("seq {}: {op:?} failed: {e}", self.seq));
                }
                emit(
                    "err",
                    &Failed {
                        seq: self.seq,
                        error: e.to_string(),
                    },
                );
            }
        }
    }

    /// Calls the registry; returns the state of every agent the operation changed.
    async fn apply(&self, op: &Op) -> Result<Vec<AgentState>, RegistryError> {
        let r = &self.registry;
        let one = |a: drover_core::Agent| vec![AgentState::of(&a)];
        match op.clone() {
            Op::Create { title, parent, cwd } => r
                .create_agent(NewAgent {
                    provider: "crash".to_string(),
                    cwd,
                    title: Some(title),
                    parent,
                    ..NewAgent::default()
                })
                .await
                .map(one),
            Op::SetStatus { id, to } => r
                .set_status(id, to, Some("the crash driver says so".to_string()))
                .await
                .map(one),
            Op::TurnEnd { id, outcome } => {
                let outcome = match outcome.as_str() {
                    "failed" => TurnOutcome::Failed {
                        error: "the crash driver says so".to_string(),
                    },
                    "canceled" => TurnOutcome::Canceled,
                    _ => TurnOutcome::Completed,
                };
                r.record_turn_end(id, outcome).await.map(one)
            }
            Op::SetTitle { id, title } => r.set_title(id, title).await.map(one),
            Op::Detach { id } => r.detach(id).await.map(one),
            Op::Archive { id } => {
                let outcome = r
                    .archive(
                        id,
                        ArchiveOptions {
                            stop_activity: true,
                        },
                    )
                    .await?;
                // We are the only writer: what `get` says now is what the archive committed.
                Ok(outcome
                    .archived
                    .iter()
                    .filter_map(|id| r.get(*id))
                    .map(|a| AgentState::of(&a))
                    .collect())
            }
            Op::Unarchive { id } => r.unarchive(id).await.map(one),
            Op::SetBudget { id, budget } => r.set_budget(id, budget).await.map(one),
            Op::AddSpend { id, tokens, cost } => r
                .add_spend(id, tokens, cost.map(|c| (c, "USD".to_string())))
                .await
                .map(one),
            Op::Labels { id, set, remove } => r.update_labels(id, set, remove).await.map(one),
            Op::UpstreamBudgets { id, budgets } => {
                r.set_upstream_budgets(id, budgets).await.map(one)
            }
            Op::Limited { id } => {
                let now = jiff::Timestamp::now();
                r.record_turn_limited(
                    id,
                    Limited {
                        at: now,
                        reset_at: None,
                        retry_at: now,
                        count: 1,
                        error: "the crash driver hit a usage limit".to_string(),
                    },
                )
                .await
                .map(one)
            }
            Op::ClearLimited { id } => r.clear_limited(id).await.map(one),
            Op::SignIn { var, value } => Ok(self.sign_in(var, value).await),
            Op::StartFailure { id, sign_in } => {
                let methods = sign_in.then(|| {
                    let method = serde_json::json!({"id": "crash-key", "name": "a key"});
                    vec![
                        serde_json::from_value::<AuthMethod>(method)
                            .unwrap_or_else(|e| diverge(&format!("an auth method: {e}"))),
                    ]
                });
                r.record_start_failure(id, "the crash driver did not start".to_string(), methods)
                    .await
                    .map(one)
            }
        }
    }

    /// Keeps `var = value` in `config.toml` as a sign-in does; it changes no agent.
    async fn sign_in(&self, var: String, value: String) -> Vec<AgentState> {
        let home = self.home.clone();
        let entry =
            drover_acp::providers::SignInEntry::Env(std::iter::once((var, value)).collect());
        let kept = tokio::task::spawn_blocking(move || {
            drover_acp::providers::store_sign_in(&home, SIGN_IN_PROVIDER, &entry)
        })
        .await;
        match kept {
            Ok(Ok(())) => Vec::new(),
            Ok(Err(e)) => diverge(&format!("a sign-in was refused: {e}")),
            Err(e) => diverge(&format!("the sign-in task: {e}")),
        }
    }

    // ---- the model ------------------------------------------------------------------------

    fn ids(&self, keep: impl Fn(&AgentState) -> bool) -> Vec<AgentId> {
        let mut ids: Vec<AgentId> = self
            .model
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }

    fn state(&self, id: AgentId) -> AgentState {
        self.model.get(&id).cloned().unwrap_or_else(|| {
            diverge(&format!("agent {id} is not in the model"));
        })
    }

    /// The subtree below `id`, nearest first, through parent links (archived agents included,
    /// as the registry walks them), each agent once.
    fn descendants(&self, id: AgentId) -> Vec<AgentId> {
        let mut seen = HashSet::from([id]);
        let mut out = Vec::new();
        let mut next = 0;
        let mut current = id;
        loop {
            for child in self.ids(|s| s.parent == Some(current)) {
                if seen.insert(child) {
                    out.push(child);
                }
            }
            let Some(&n) = out.get(next) else {
                return out;
            };
            next += 1;
            current = n;
        }
    }

    /// Whether a turn may start: the agent and every ancestor are unarchived.
    fn gate_open(&self, id: AgentId) -> bool {
        let mut seen = HashSet::new();
        let mut current = Some(id);
        while let Some(c) = current {
            if !seen.insert(c) {
                break;
            }
            let Some(s) = self.model.get(&c) else {
                break;
            };
            if s.archived {
                return false;
            }
            current = s.parent;
        }
        true
    }

    fn status_ok(&self, id: AgentId, to: AgentStatus) -> bool {
        let s = self.state(id);
        // A late report that an archived agent left a busy state the archive ended: accepted,
        // nothing changes.
        (s.archived && s.status == AgentStatus::Closed && !to.is_busy())
            || s.status.can_become(to)
                && !(to.is_busy() && s.archived)
                && (to != AgentStatus::Running || self.gate_open(id))
    }

    /// Picks the next operation: what it is, whether it should succeed, and what it changes.
    fn choose(&mut self) -> (Op, bool, Vec<AgentState>) {
        let all = self.ids(|_| true);
        let create_weight = match all.len() {
            0..5 => 1000,
            n if n < CREATE_SLOWLY_ABOVE => 12,
            _ => 1,
        };
        // create, set_status, turn end, title, detach, archive, unarchive, budget, spend,
        // labels, upstream budgets, limited, clear limited, start failure, sign-in
        let weights = [create_weight, 35, 12, 15, 4, 9, 6, 8, 10, 8, 4, 6, 3, 4, 6];
        let total: u64 = weights.iter().sum();
        let mut roll = self.rng.range(0, total);
        let mut kind = 0;
        for (i, w) in weights.iter().enumerate() {
            if roll < *w {
                kind = i;
                break;
            }
            roll -= w;
        }
        let Some(&id) = self.rng.pick(&all) else {
            return self.choose_create();
        };
        match kind {
            1 => self.choose_status(id),
            2 => {
                let running = self.ids(|s| s.status == AgentStatus::Running);
                let id = match self.rng.pick(&running) {
                    Some(r) if !self.rng.chance(5) => *r,
                    _ => id,
                };
                let (outcome, to) = match self.rng.range(0, 4) {
                    0 => ("failed", AgentStatus::Error),
                    1 => ("canceled", AgentStatus::Idle),
                    _ => ("completed", AgentStatus::Idle),
                };
                let mut s = self.state(id);
                let op = Op::TurnEnd {
                    id,
                    outcome: outcome.to_string(),
                };
                if s.archived && s.status != AgentStatus::Running {
                    // The archive ended the turn already: accepted, nothing changes.
                    return (op, true, vec![s]);
                }
                let ok = s.status == AgentStatus::Running;
                s.status = to;
                (op, ok, if ok { vec![s] } else { Vec::new() })
            }
            7..=13 => self.choose_accounting(kind, id),
            14 => self.choose_sign_in(),
            4 => {
                let children = self.ids(|s| s.parent.is_some());
                match self.rng.pick(&children) {
                    Some(&id) => {
                        let mut s = self.state(id);
                        s.parent = None;
                        s.labels.remove(UPSTREAM_ARCHIVED_LABEL);
                        s.labels.remove(UPSTREAM_BUDGET_LABEL);
                        (Op::Detach { id }, true, vec![s])
                    }
                    None => self.choose_title(id),
                }
            }
            5 => {
                // Prefer agents with a subtree: cascades are what the journal is for.
                let parents = self.ids(|s| s.parent.is_some() && !s.archived);
                let id = match parents.len() {
                    0 => id,
                    _ if self.rng.chance(30) => id,
                    _ => {
                        let child = self.rng.pick(&parents).copied().unwrap_or(id);
                        self.state(child).parent.unwrap_or(id)
                    }
                };
                if self.state(id).archived {
                    return (Op::Archive { id }, true, Vec::new());
                }
                let expect = std::iter::once(id)
                    .chain(self.descendants(id))
                    .map(|a| self.state(a))
                    .filter(|s| !s.archived)
                    .map(|mut s| {
                        s.archived = true;
                        s.status = AgentStatus::Closed;
                        s.limited = false;
                        s
                    })
                    .collect();
                (Op::Archive { id }, true, expect)
            }
            6 => {
                let archived = self.ids(|s| s.archived);
                match self.rng.pick(&archived) {
                    Some(&id) => {
                        let mut s = self.state(id);
                        s.archived = false;
                        (Op::Unarchive { id }, true, vec![s])
                    }
                    None => self.choose_title(id),
                }
            }
            3 => self.choose_title(id),
            _ => self.choose_create(),
        }
    }

    fn choose_create(&mut self) -> (Op, bool, Vec<AgentState>) {
        let unarchived = self.ids(|s| !s.archived);
        let archived = self.ids(|s| s.archived);
        let parent = if self.rng.chance(4) {
            // Refused: a subagent cannot be born under an archived parent.
            self.rng.pick(&archived).copied()
        } else if self.rng.chance(55) {
            self.rng.pick(&unarchived).copied()
        } else {
            None
        };
        let ok = parent.is_none_or(|p| !self.state(p).archived);
        let title = format!("s{}-n{}", self.seed, self.seq);
        let cwd = self.rng.pick(&self.cwds).cloned().unwrap_or_default();
        let expect = AgentState {
            id: None,
            title: Some(title.clone()),
            archived: false,
            status: AgentStatus::Initializing,
            parent,
            labels: BTreeMap::new(),
            budget: None,
            spend_tokens: None,
            spend_cost: None,
            limited: false,
            start_failure: None,
        };
        let op = Op::Create { title, parent, cwd };
        (op, ok, if ok { vec![expect] } else { Vec::new() })
    }

    fn choose_status(&mut self, id: AgentId) -> (Op, bool, Vec<AgentState>) {
        let from = self.state(id).status;
        // The seed path first: initializing → idle → running.
        let mut legal: Vec<AgentStatus> = AgentStatus::ALL
            .into_iter()
            .filter(|to| self.status_ok(id, *to))
            .collect();
        for main in [AgentStatus::Idle, AgentStatus::Running] {
            if legal.contains(&main) {
                legal.extend([main, main, main]);
            }
        }
        let to = match self.rng.pick(&legal) {
            Some(to) if !self.rng.chance(8) => *to,
            // Now and then something the registry must refuse.
            _ => *self.rng.pick(&AgentStatus::ALL).unwrap_or(&from),
        };
        let ok = self.status_ok(id, to);
        let mut s = self.state(id);
        // A late report to an archived (so `closed`) agent changes nothing.
        if ok && !(s.archived && s.status == AgentStatus::Closed) {
            s.status = to;
            // A runtime that started is over what kept it from starting; a turn that runs is
            // over the usage limit it waited for.
            if matches!(to, AgentStatus::Idle | AgentStatus::Running) {
                s.start_failure = None;
            }
            if to == AgentStatus::Running {
                s.limited = false;
            }
        }
        (
            Op::SetStatus { id, to },
            ok,
            if ok { vec![s] } else { Vec::new() },
        )
    }

    /// What was added for budgets, usage limits and sign-ins: `kind` 7 to 13 of [`Self::choose`].
    fn choose_accounting(&mut self, kind: usize, id: AgentId) -> (Op, bool, Vec<AgentState>) {
        let mut s = self.state(id);
        match kind {
            7 => {
                let budget = (!self.rng.chance(20)).then(|| Budget {
                    tokens: self.rng.chance(70).then(|| self.rng.range(1, 100_000)),
                    cost: self.rng.chance(50).then(|| eighths(self.rng.range(1, 400))),
                    hard: self.rng.chance(30),
                });
                s.budget.clone_from(&budget);
                (Op::SetBudget { id, budget }, true, vec![s])
            }
            8 => {
                let tokens = self.rng.chance(80).then(|| self.rng.range(1, 5000));
                let cost = self.rng.chance(50).then(|| eighths(self.rng.range(0, 40)));
                if let Some(t) = tokens {
                    s.spend_tokens = Some(s.spend_tokens.unwrap_or(0) + t);
                }
                if let Some(c) = cost {
                    s.spend_cost = Some(s.spend_cost.unwrap_or(0.0) + c);
                }
                (Op::AddSpend { id, tokens, cost }, true, vec![s])
            }
            9 => self.choose_labels(id),
            10 => {
                let budgets: Vec<Budget> = (0..self.rng.range(0, 3))
                    .map(|_| Budget {
                        tokens: Some(self.rng.range(1, 50_000)),
                        cost: self.rng.chance(30).then(|| eighths(self.rng.range(1, 80))),
                        hard: self.rng.chance(20),
                    })
                    .collect();
                if budgets.is_empty() {
                    s.labels.remove(UPSTREAM_BUDGET_LABEL);
                } else {
                    let value = serde_json::to_string(&budgets)
                        .unwrap_or_else(|e| diverge(&format!("encode budgets: {e}")));
                    s.labels.insert(UPSTREAM_BUDGET_LABEL.to_string(), value);
                }
                (Op::UpstreamBudgets { id, budgets }, true, vec![s])
            }
            11 => {
                // Mostly a running agent's turn, as a runtime reports it.
                let running = self.ids(|s| s.status == AgentStatus::Running);
                let id = match self.rng.pick(&running) {
                    Some(r) if !self.rng.chance(10) => *r,
                    _ => id,
                };
                let mut s = self.state(id);
                let op = Op::Limited { id };
                if s.status == AgentStatus::Running {
                    s.status = AgentStatus::Idle;
                    s.limited = true;
                    (op, true, vec![s])
                } else if s.archived {
                    // The archive ended the turn already: accepted, nothing changes.
                    (op, true, vec![s])
                } else {
                    (op, false, Vec::new())
                }
            }
            12 => {
                let limited = self.ids(|s| s.limited);
                let id = self.rng.pick(&limited).copied().unwrap_or(id);
                let mut s = self.state(id);
                s.limited = false;
                (Op::ClearLimited { id }, true, vec![s])
            }
            _ => self.choose_start_failure(id),
        }
    }

    /// A sign-in kept in `config.toml`: one of a few variables, a value never used before.
    fn choose_sign_in(&mut self) -> (Op, bool, Vec<AgentState>) {
        let var = format!("CRASH_KEY_{}", self.rng.range(0, 3));
        let value = format!("s{}-k{}", self.seed, self.seq);
        (Op::SignIn { var, value }, true, Vec::new())
    }

    /// `update_labels`: the user's labels set and removed; now and then a reserved one.
    fn choose_labels(&mut self, id: AgentId) -> (Op, bool, Vec<AgentState>) {
        let mut s = self.state(id);
        let mut set = BTreeMap::new();
        for _ in 0..self.rng.range(0, 3) {
            let key = format!("team.k{}", self.rng.range(0, 6));
            set.insert(key, format!("v{}", self.seq));
        }
        let user: Vec<String> = s
            .labels
            .keys()
            .filter(|k| k.starts_with("team."))
            .cloned()
            .collect();
        let mut remove: Vec<String> = self.rng.pick(&user).cloned().into_iter().collect();
        // Now and then a label only the hub sets: refused, nothing changes.
        let reserved = [
            UPSTREAM_BUDGET_LABEL,
            UPSTREAM_LABEL,
            UPSTREAM_ARCHIVED_LABEL,
        ];
        let ok = !self.rng.chance(8);
        if !ok {
            let label = *self.rng.pick(&reserved).unwrap_or(&UPSTREAM_LABEL);
            if self.rng.chance(50) {
                set.insert(label.to_string(), "[]".to_string());
            } else {
                remove.push(label.to_string());
            }
        }
        for key in &remove {
            s.labels.remove(key);
        }
        s.labels.extend(set.clone());
        let op = Op::Labels { id, set, remove };
        (op, ok, if ok { vec![s] } else { Vec::new() })
    }

    /// `record_start_failure`, with or without a sign-in to wait for.
    fn choose_start_failure(&mut self, id: AgentId) -> (Op, bool, Vec<AgentState>) {
        let mut s = self.state(id);
        let sign_in = self.rng.chance(60);
        let op = Op::StartFailure { id, sign_in };
        if s.archived {
            // The archive closed the start it cut short: accepted, nothing changes.
            return (op, true, vec![s]);
        }
        let ok = s.status == AgentStatus::Error || s.status.can_become(AgentStatus::Error);
        s.status = AgentStatus::Error;
        s.start_failure = Some(if sign_in {
            "sign-in:crash-key".to_string()
        } else {
            "error".to_string()
        });
        (op, ok, if ok { vec![s] } else { Vec::new() })
    }

    fn choose_title(&mut self, id: AgentId) -> (Op, bool, Vec<AgentState>) {
        let title = (!self.rng.chance(10)).then(|| format!("s{}-t{}", self.seed, self.seq));
        let mut s = self.state(id);
        s.title.clone_from(&title);
        (Op::SetTitle { id, title }, true, vec![s])
    }
}

/// `n` eighths: costs the model adds exactly as the registry does.
#[expect(clippy::cast_precision_loss)] // small integers
fn eighths(n: u64) -> f64 {
    n as f64 / 8.0
}
