//! `drover-bench`: prints how drover performs at fleet scale, against its targets.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target.
//!
//! 1. Boot: 10,000 agent records over 500 workspaces, written in the store's exact file format.
//!    The real `drover daemon` is timed from spawn until `GET /health` reports every agent,
//!    against a plain loop that reads and parses every file to `serde_json::Value`.
//!    Target: boot ≤ 2× that loop; resident memory after boot < 50 MB.
//! 2. Archive: a durable cascade over a root and 1,000 descendants, against 1,000 plain atomic
//!    writes (temp file, write, fsync, rename, fsync folder) of the same files. Target ≤ 1.5×.
//! 3. Workspace activity: what one status change costs the activity index, at 1,000, 10,000 and
//!    100,000 agents (20 per workspace). Target: evaluations per change independent of fleet
//!    size.
//!
//! The `drover` binary is `$DROVER_BIN`, else the one in this benchmark's build folder: build it
//! with `scripts/bench` (or `cargo build --release -p drover`). The stores go to a
//! scratch folder under `$TMPDIR` (the archive figures are fsync-bound: they say as much about
//! that disk as about drover); `DROVER_BENCH_KEEP=1` keeps it, e.g. to profile a boot. A missed
//! target is reported, not an error: the exit status is non-zero only when the bench could not
//! run.

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use drover_bench::fleet_gen::{Rng, generate_fleet};
use drover_bench::{self as bench, DaemonProc, Row, fmt_dur, fmt_kb};
use drover_core::store::Store;
use drover_core::view::AgentsView;
use drover_core::{
    ActivityIndex, Agent, AgentId, AgentStatus, ArchiveOptions, NewAgent, NoRuntimes, PARENT_LABEL,
    ProviderConfig, Registry, WorkspaceId,
};

const BOOT_AGENTS: usize = 10_000;
const BOOT_WORKSPACES: usize = 500;
const AGENTS_PER_WORKSPACE: usize = BOOT_AGENTS / BOOT_WORKSPACES;
const CASCADE_DESCENDANTS: usize = 1_000;
const ROUNDS: usize = 3;
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
const ACTIVITY_CHANGES: usize = 200_000;

fn main() -> ExitCode {
    bench::exit("drover-bench", run())
}

fn run() -> Result<()> {
    let drover = bench::drover_binary()?;
    // DROVER_BENCH_KEEP=1 leaves the generated stores behind, e.g. to profile a boot.
    let (scratch, keep) = bench::scratch("drover-bench-")?;
    println!("drover-bench");
    println!("  drover binary: {}", drover.display());
    println!("  scratch:       {}", scratch.path().display());
    println!(
        "  machine:       {} CPUs, {}",
        bench::cpus(),
        bench::kernel()
    );
    println!();

    let mut rows = Vec::new();
    let started = Instant::now();
    let home = scratch.path().join("boot-home");
    boot_bench(&drover, &home, scratch.path(), &mut rows)?;
    archive_bench(scratch.path(), keep, &mut rows)?;
    activity_bench(&home, &mut rows)?;

    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the stores in {}", scratch.path().display());
    }
    Ok(())
}

// ---- 1. boot --------------------------------------------------------------------------------

fn boot_bench(drover: &Path, home: &Path, scratch: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 1. boot with {BOOT_AGENTS} agents in {BOOT_WORKSPACES} workspaces (best of {ROUNDS}) =="
    );
    let t = Instant::now();
    let stats = generate_fleet(home, BOOT_WORKSPACES, AGENTS_PER_WORKSPACE, 0x5eed)?;
    // The generated files go to disk now, so their writeback does not land in a timing.
    let _ = Command::new("sync").status();
    println!(
        "  generated {} agent files ({} subagents, {} archived, avg {} B) + {} workspace files in {}",
        stats.agents,
        stats.subagents,
        stats.archived,
        stats.agent_bytes / stats.agents.max(1),
        stats.workspaces,
        fmt_dur(t.elapsed())
    );

    // The files are what the store writes: the registry loads every one of them, cleanly.
    let mut open_best = Duration::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let (registry, report) = Registry::open(home, Arc::new(NoRuntimes))
            .map_err(|e| anyhow!("Registry::open on the generated store: {e}"))?;
        open_best = open_best.min(t.elapsed());
        ensure!(
            report.agents == BOOT_AGENTS
                && report.workspaces == BOOT_WORKSPACES
                && report.quarantined.is_empty()
                && report.skipped_newer.is_empty()
                && report.interrupted.is_empty()
                && report.workspaces_restored == 0,
            "the generated store does not load cleanly: {report:?}"
        );
        drop(registry);
    }
    let mut load_best = Duration::MAX;
    let store = Store::open(home)?;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let loaded = store.load_agents()?;
        load_best = load_best.min(t.elapsed());
        ensure!(loaded.records.len() == BOOT_AGENTS && loaded.quarantined.is_empty());
    }
    println!(
        "  verified: Registry::open loads all {BOOT_AGENTS} agents and {BOOT_WORKSPACES} workspaces, 0 quarantined"
    );

    // (a) the floor: read and parse every file, nothing else.
    let files = parse_all(home)?; // warm-up
    ensure!(
        files == BOOT_AGENTS + BOOT_WORKSPACES,
        "expected {} files, read {files}",
        BOOT_AGENTS + BOOT_WORKSPACES
    );
    let mut baseline = Duration::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        black_box(parse_all(home)?);
        baseline = baseline.min(t.elapsed());
    }

    // (b) the real daemon.
    let mut boots = Vec::new();
    for round in 0..ROUNDS {
        let log = scratch.join(format!("daemon-boot-{round}.stderr"));
        boots.push(boot_daemon(drover, home, &log, BOOT_AGENTS)?);
    }
    let best = boots
        .iter()
        .min_by_key(|b| b.elapsed)
        .ok_or_else(|| anyhow!("no boot"))?;
    let max_rss = boots.iter().map(|b| b.rss_kb).max().unwrap_or(0);
    let max_hwm = boots.iter().map(|b| b.hwm_kb).max().unwrap_or(0);

    println!(
        "  baseline: read + parse {files} files to serde_json::Value, one thread   {}",
        fmt_dur(baseline)
    );
    for (i, b) in boots.iter().enumerate() {
        println!(
            "  daemon boot #{}: spawn → /health agents={BOOT_AGENTS}  {}  (registry open in daemon: {}; VmRSS {}, VmHWM {})",
            i + 1,
            fmt_dur(b.elapsed),
            b.store_loaded_ms
                .map_or_else(|| "?".to_string(), |ms| format!("{ms} ms")),
            fmt_kb(b.rss_kb),
            fmt_kb(b.hwm_kb)
        );
    }
    println!(
        "  in-process for contrast: Registry::open {}, Store::load_agents {}",
        fmt_dur(open_best),
        fmt_dur(load_best)
    );
    let ratio = best.elapsed.as_secs_f64() / baseline.as_secs_f64();
    println!(
        "  boot / baseline = {:.2}×; process, runtime, listener and HTTP poll outside the registry: ~{}",
        ratio,
        best.store_loaded_ms.map_or_else(
            || "?".to_string(),
            |ms| fmt_dur(best.elapsed.saturating_sub(Duration::from_millis(ms)))
        )
    );
    println!();
    rows.push(Row::target(
        format!(
            "boot, {}k agents (vs parse-all baseline)",
            BOOT_AGENTS / 1000
        ),
        format!(
            "{} vs {} = {:.2}×",
            fmt_dur(best.elapsed),
            fmt_dur(baseline),
            ratio
        ),
        "≤ 2.00×",
        ratio <= 2.0,
    ));
    rows.push(Row::target(
        "daemon VmRSS after boot (worst of 3)",
        format!("{} (VmHWM {})", fmt_kb(max_rss), fmt_kb(max_hwm)),
        "< 50 MB",
        max_rss < 50 * 1024,
    ));
    Ok(())
}

/// The floor for boot: read every record file and parse it to a `Value`.
fn parse_all(home: &Path) -> Result<usize> {
    let mut count = 0;
    let mut parse_dir = |dir: &Path| -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            let bytes = fs::read(&path)?;
            let value: serde_json::Value = serde_json::from_slice(&bytes)?;
            black_box(&value);
            count += 1;
        }
        Ok(())
    };
    for entry in fs::read_dir(home.join("agents"))? {
        parse_dir(&entry?.path())?;
    }
    parse_dir(&home.join("workspaces"))?;
    Ok(count)
}

struct Boot {
    elapsed: Duration,
    rss_kb: u64,
    hwm_kb: u64,
    /// The daemon's own `store loaded elapsed_ms` log field.
    store_loaded_ms: Option<u64>,
}

fn boot_daemon(drover: &Path, home: &Path, log: &Path, expect: usize) -> Result<Boot> {
    let daemon = DaemonProc::spawn(drover, home, log, Some(expect), BOOT_TIMEOUT)?;
    let elapsed = daemon.started.elapsed();
    let (rss_kb, hwm_kb) = daemon.mem()?;
    let exit = daemon.stop()?;
    ensure!(
        exit.success(),
        "the daemon stopped with {exit}: {}",
        log.display()
    );
    let store_loaded_ms = fs::read_to_string(log).ok().and_then(|text| {
        let line = text.lines().find(|l| l.contains("store loaded"))?;
        let rest = &line[line.find("elapsed_ms=")? + "elapsed_ms=".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    });
    Ok(Boot {
        elapsed,
        rss_kb,
        hwm_kb,
        store_loaded_ms,
    })
}

// ---- 2. archive -----------------------------------------------------------------------------

fn archive_bench(scratch: &Path, keep: bool, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 2. archive cascade: root + {CASCADE_DESCENDANTS} descendants, durable (best of {ROUNDS}, fresh tree each) =="
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut best_archive = Duration::MAX;
    let mut best_baseline = Duration::MAX;
    for round in 0..ROUNDS {
        let home = scratch.join(format!("archive-home-{round}"));
        let project = scratch.join(format!("archive-project-{round}"));
        fs::create_dir_all(&project)?;
        let (archive, baseline, record_bytes, build) =
            runtime.block_on(archive_round(&home, &project, round as u64))?;
        println!(
            "  round {}: tree built in {} | baseline {} plain atomic writes ({} B avg): {} | archive: {}  ({:.2}×)",
            round + 1,
            fmt_dur(build),
            CASCADE_DESCENDANTS,
            record_bytes,
            fmt_dur(baseline),
            fmt_dur(archive),
            archive.as_secs_f64() / baseline.as_secs_f64()
        );
        best_archive = best_archive.min(archive);
        best_baseline = best_baseline.min(baseline);
        // Keep the scratch folder small for the rounds that follow.
        if !keep {
            let _ = fs::remove_dir_all(&home);
        }
    }
    let ratio = best_archive.as_secs_f64() / best_baseline.as_secs_f64();
    println!(
        "  best: archive {} ({:.0} µs per record), baseline {} ({:.0} µs per write): {:.2}×",
        fmt_dur(best_archive),
        best_archive.as_secs_f64() * 1e6 / (CASCADE_DESCENDANTS + 1) as f64,
        fmt_dur(best_baseline),
        best_baseline.as_secs_f64() * 1e6 / CASCADE_DESCENDANTS as f64,
        ratio
    );
    println!();
    rows.push(Row::target(
        format!("archive cascade, 1+{CASCADE_DESCENDANTS} (vs atomic writes)"),
        format!(
            "{} vs {} = {:.2}×",
            fmt_dur(best_archive),
            fmt_dur(best_baseline),
            ratio
        ),
        "≤ 1.50×",
        ratio <= 1.5,
    ));
    Ok(())
}

/// Builds a fresh tree through the registry, times the baseline writes in its folder, then the
/// archive. Returns (archive, baseline, average record size, tree build time).
async fn archive_round(
    home: &Path,
    project: &Path,
    seed: u64,
) -> Result<(Duration, Duration, usize, Duration)> {
    let mut rng = Rng(0xa5c4_de00 ^ seed);
    let (registry, _) = Registry::open(home, Arc::new(NoRuntimes))?;
    let t = Instant::now();
    let new_agent = |parent: Option<AgentId>, i: usize| NewAgent {
        provider: "codex".to_string(),
        cwd: project.to_path_buf(),
        title: Some(format!(
            "Subtask {i} of the migration of the billing schema"
        )),
        labels: BTreeMap::from([
            ("team".to_string(), "platform".to_string()),
            ("ticket".to_string(), format!("ENG-{}", 1000 + i)),
        ]),
        parent,
        config: ProviderConfig {
            model: Some("gpt-5.3-codex".to_string()),
            mode: Some("default".to_string()),
            ..ProviderConfig::default()
        },
        ..NewAgent::default()
    };
    let root = registry.create_agent(new_agent(None, 0)).await?;
    let mut tree = vec![root.clone()];
    for i in 1..=CASCADE_DESCENDANTS {
        let parent = tree[rng.below(tree.len())].id;
        tree.push(registry.create_agent(new_agent(Some(parent), i)).await?);
    }
    // A settled fleet: every agent idle, a few subagents in a turn (their stops are issued).
    for (i, agent) in tree.iter().enumerate() {
        registry
            .set_status(agent.id, AgentStatus::Idle, None)
            .await?;
        if i % 100 == 50 {
            registry
                .set_status(agent.id, AgentStatus::Running, None)
                .await?;
        }
    }
    let build = t.elapsed();
    let _ = Command::new("sync").status();

    // Baseline: the descendants' own files, rewritten as they are, one durable write each.
    let store = Store::open(home)?;
    let mut files = Vec::with_capacity(CASCADE_DESCENDANTS);
    for agent in &tree[1..] {
        let path = store.agent_path(agent.id, &agent.cwd);
        let bytes = fs::read(&path)?;
        files.push((path, bytes));
    }
    let record_bytes = files.iter().map(|(_, b)| b.len()).sum::<usize>() / files.len();
    let baseline_writes = || -> Result<Duration> {
        let t = Instant::now();
        for (i, (path, bytes)) in files.iter().enumerate() {
            plain_atomic_write(path, bytes, i)?;
        }
        Ok(t.elapsed())
    };
    // Alternate which goes first, so neither always meets the other's writeback. (The
    // baseline rewrites the files as they were before the archive: harmless, the store is
    // thrown away after the round.)
    let mut baseline = Duration::ZERO;
    if seed.is_multiple_of(2) {
        baseline = baseline_writes()?;
    }
    let t = Instant::now();
    let outcome = registry
        .archive(
            root.id,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await?;
    let archive = t.elapsed();
    if !seed.is_multiple_of(2) {
        let _ = Command::new("sync").status();
        baseline = baseline_writes()?;
    }
    ensure!(
        outcome.archived.len() == CASCADE_DESCENDANTS + 1,
        "the cascade archived {} agents, expected {}",
        outcome.archived.len(),
        CASCADE_DESCENDANTS + 1
    );
    Ok((archive, baseline, record_bytes, build))
}

/// Temp file beside `path`, write, fsync, rename over `path`, fsync the folder.
fn plain_atomic_write(path: &Path, bytes: &[u8], n: usize) -> Result<()> {
    let dir = path.parent().ok_or_else(|| anyhow!("no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("no file name"))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-bench-{n}"));
    let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

// ---- 3. workspace activity ------------------------------------------------------------------

/// The fleet as the activity index sees it.
struct Fleet {
    agents: HashMap<AgentId, Agent>,
    children: HashMap<AgentId, Vec<AgentId>>,
}

impl Fleet {
    fn new(agents: Vec<Agent>) -> Fleet {
        let mut children: HashMap<AgentId, Vec<AgentId>> = HashMap::new();
        for a in &agents {
            if let Some(p) = a.parent_id() {
                children.entry(p).or_default().push(a.id);
            }
        }
        for list in children.values_mut() {
            list.sort();
        }
        Fleet {
            agents: agents.into_iter().map(|a| (a.id, a)).collect(),
            children,
        }
    }
}

impl AgentsView for Fleet {
    fn agent(&self, id: AgentId) -> Option<&Agent> {
        self.agents.get(&id)
    }

    fn children(&self, id: AgentId) -> Vec<AgentId> {
        self.children.get(&id).cloned().unwrap_or_default()
    }
}

fn activity_bench(home: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 3. workspace activity after one status change ({AGENTS_PER_WORKSPACE} agents per workspace; {ACTIVITY_CHANGES} changes, best of {ROUNDS}) =="
    );
    let loaded = Store::open(home)?.load_agents()?;
    ensure!(loaded.records.len() == BOOT_AGENTS);
    let template = loaded.records;

    let mut lines = Vec::new();
    let mut evals_per_change = Vec::new();
    for fleet_size in [1_000, 10_000, 100_000] {
        let fleet = Fleet::new(scale_fleet(&template, fleet_size));
        ensure!(fleet.agents.len() == fleet_size);
        let m = measure_activity(fleet)?;
        evals_per_change.push((fleet_size, m.root_evals, m.sub_evals));
        lines.push((fleet_size, m));
    }
    println!(
        "  {:>8}  {:>10}  {:>13}  {:>10}  {:>13}  {:>13}  {:>13}",
        "agents",
        "root: evals",
        "root: ns/chg",
        "sub: evals",
        "sub: ns/chg",
        "rebuild",
        "rebuild evals"
    );
    for (n, m) in &lines {
        println!(
            "  {:>8}  {:>11.2}  {:>13.0}  {:>10.2}  {:>13.0}  {:>13}  {:>13}",
            n,
            m.root_evals,
            m.root_ns,
            m.sub_evals,
            m.sub_ns,
            fmt_dur(m.rebuild),
            m.rebuild_evals
        );
    }
    let (first, last) = (&lines[0].1, &lines[lines.len() - 1].1);
    println!(
        "  100× the fleet: per-change time ×{:.2} (root), ×{:.2} (subagent); full rebuild ×{:.1}",
        last.root_ns / first.root_ns,
        last.sub_ns / first.sub_ns,
        last.rebuild.as_secs_f64() / first.rebuild.as_secs_f64()
    );
    let (to_running, to_idle) = registry_evaluations(home)?;
    println!(
        "  cross-check through the registry ({BOOT_AGENTS} agents, durable Registry::set_status on a root): \
         idle→running {to_running} evaluation(s), running→idle {to_idle}"
    );
    println!();
    // The figures are counts (means of whole numbers), compared exactly on purpose.
    #[expect(clippy::float_cmp)]
    let flat = evals_per_change
        .iter()
        .all(|(_, r, s)| *r == evals_per_change[0].1 && *s == evals_per_change[0].2)
        && [to_running, to_idle]
            .iter()
            .all(|e| *e as f64 == evals_per_change[0].1);
    let mut measured = String::new();
    for (n, r, _) in &evals_per_change {
        if !measured.is_empty() {
            measured.push_str(" / ");
        }
        let _ = write!(measured, "{}k: {r:.2}", n / 1000);
    }
    let _ = write!(measured, " (registry: {to_running})");
    rows.push(Row::target(
        "activity: evaluations per status change",
        measured,
        "same at 1k / 10k / 100k",
        flat,
    ));
    let mut measured = String::new();
    for (n, m) in &lines {
        if !measured.is_empty() {
            measured.push_str(" / ");
        }
        let _ = write!(measured, "{}k: {:.0} ns", n / 1000, m.root_ns);
    }
    rows.push(Row::info(
        "activity: time per status change (info)",
        measured,
    ));
    Ok(())
}

/// What one status change costs the real registry's activity index: `activity_evaluations`
/// deltas for idle → running and back on an idle root of the boot store.
fn registry_evaluations(home: &Path) -> Result<(u64, u64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (registry, _) = Registry::open(home, Arc::new(NoRuntimes))?;
    let root = registry
        .agents()
        .into_iter()
        .find(|a| {
            a.parent_id().is_none()
                && !a.is_archived()
                && a.status == AgentStatus::Idle
                && a.attention.is_none()
                // A workspace not already showing something as urgent as `running`.
                && registry.workspace_activity(a.workspace_id)
                    < Some(drover_core::ActivityBucket::Running)
        })
        .ok_or_else(|| anyhow!("no idle root in a quiet workspace in the boot store"))?;
    let before = registry.activity_evaluations();
    runtime.block_on(registry.set_status(root.id, AgentStatus::Running, None))?;
    let running = registry.activity_evaluations();
    ensure!(
        registry.workspace_activity(root.workspace_id)
            == Some(drover_core::ActivityBucket::Running),
        "the registry's workspace activity missed a change"
    );
    runtime.block_on(registry.set_status(root.id, AgentStatus::Idle, None))?;
    let idle = registry.activity_evaluations();
    Ok((running - before, idle - running))
}

/// `n` agents with the template's shape: the first `n / 20` workspaces of the 10k fleet, or
/// copies of it under fresh ids.
fn scale_fleet(template: &[Agent], n: usize) -> Vec<Agent> {
    let mut by_ws: BTreeMap<WorkspaceId, Vec<&Agent>> = BTreeMap::new();
    for a in template {
        by_ws.entry(a.workspace_id).or_default().push(a);
    }
    if n <= template.len() {
        return by_ws
            .values()
            .take(n / AGENTS_PER_WORKSPACE)
            .flatten()
            .map(|a| (*a).clone())
            .collect();
    }
    let copies = n.div_ceil(template.len());
    let mut out = Vec::with_capacity(copies * template.len());
    for _ in 0..copies {
        let ids: HashMap<AgentId, AgentId> =
            template.iter().map(|a| (a.id, AgentId::new())).collect();
        let workspaces: HashMap<WorkspaceId, WorkspaceId> =
            by_ws.keys().map(|w| (*w, WorkspaceId::new())).collect();
        for a in template {
            let mut b = a.clone();
            b.id = ids[&a.id];
            b.workspace_id = workspaces[&a.workspace_id];
            if let Some(p) = a.parent_id() {
                b.labels
                    .insert(PARENT_LABEL.to_string(), ids[&p].to_string());
            }
            out.push(b);
        }
    }
    out.truncate(n);
    out
}

struct ActivityFigures {
    root_evals: f64,
    root_ns: f64,
    sub_evals: f64,
    sub_ns: f64,
    rebuild: Duration,
    rebuild_evals: u64,
}

fn measure_activity(mut fleet: Fleet) -> Result<ActivityFigures> {
    let mut rebuild = Duration::MAX;
    let mut index = ActivityIndex::default();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        index = ActivityIndex::build(&fleet, fleet.agents.values());
        rebuild = rebuild.min(t.elapsed());
    }
    let rebuild_evals = index.evaluated();

    // Changes rotate over every idle root (or subagent) of the fleet, as a real fleet's do, so
    // the per-change figure includes the cache misses a large fleet brings.
    let idle =
        |a: &Agent| !a.is_archived() && a.status == AgentStatus::Idle && a.attention.is_none();
    let mut roots: Vec<AgentId> = fleet
        .agents
        .values()
        .filter(|a| idle(a) && a.parent_id().is_none())
        .map(|a| a.id)
        .collect();
    let mut subs: Vec<AgentId> = fleet
        .agents
        .values()
        .filter(|a| idle(a) && a.parent_id().is_some_and(|p| fleet.agents.contains_key(&p)))
        .map(|a| a.id)
        .collect();
    ensure!(
        !roots.is_empty() && !subs.is_empty(),
        "no idle agents to flip"
    );
    let mut rng = Rng(0xac71);
    rng.shuffle(&mut roots);
    rng.shuffle(&mut subs);

    // The index answers right: a root flipped to running makes its workspace `running`.
    // (In a workspace not already showing something as urgent, such as an error.)
    let probe = *roots
        .iter()
        .find(|id| {
            index.workspace(fleet.agents[*id].workspace_id)
                < Some(drover_core::ActivityBucket::Running)
        })
        .ok_or_else(|| anyhow!("no idle root in a quiet workspace"))?;
    flip(&mut fleet, probe);
    index.update(&fleet, [probe]);
    let ws = fleet.agents[&probe].workspace_id;
    ensure!(
        index.workspace(ws) == Some(drover_core::ActivityBucket::Running),
        "the activity index missed a change"
    );
    flip(&mut fleet, probe);
    index.update(&fleet, [probe]);

    let (root_evals, root_ns) = time_changes(&mut fleet, &mut index, &roots);
    let (sub_evals, sub_ns) = time_changes(&mut fleet, &mut index, &subs);
    Ok(ActivityFigures {
        root_evals,
        root_ns,
        sub_evals,
        sub_ns,
        rebuild,
        rebuild_evals,
    })
}

/// idle ↔ running.
fn flip(fleet: &mut Fleet, id: AgentId) {
    if let Some(a) = fleet.agents.get_mut(&id) {
        a.status = if a.status == AgentStatus::Idle {
            AgentStatus::Running
        } else {
            AgentStatus::Idle
        };
    }
}

/// Flips agents in turn and updates the index for each, as the registry's commit does for a
/// status change. Returns (evaluations per change, ns per change), best of `ROUNDS`.
fn time_changes(fleet: &mut Fleet, index: &mut ActivityIndex, ids: &[AgentId]) -> (f64, f64) {
    let mut best = f64::MAX;
    let mut evals = 0.0;
    for _ in 0..ROUNDS {
        let before = index.evaluated();
        let t = Instant::now();
        for i in 0..ACTIVITY_CHANGES {
            // Each agent goes idle → running on one pass over the list, back on the next.
            let id = ids[i % ids.len()];
            flip(fleet, id);
            black_box(index.update(fleet, [id]));
        }
        let ns = t.elapsed().as_nanos() as f64 / ACTIVITY_CHANGES as f64;
        best = best.min(ns);
        evals = (index.evaluated() - before) as f64 / ACTIVITY_CHANGES as f64;
    }
    (evals, best)
}
