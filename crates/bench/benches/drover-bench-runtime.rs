//! `drover-bench-runtime`: prints how drover's agent runtimes perform, against their targets.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. Every
//! part drives a [`RuntimeManager`] inside this process, as the daemon does, so "this process"
//! below is the daemon minus its HTTP/WebSocket front; the agents are child processes.
//!
//! 1. Fleet: 100 scripted agents run a turn at once (`stream 200 5` each, so they overlap)
//!    through one manager on a 2-worker runtime. `VmRSS` is sampled every 20 ms from
//!    `/proc/self/status`, and `VmHWM` (reset through `/proc/self/clear_refs` first) read at the
//!    end: the daemon's memory, the agents' own processes excluded. Target < 100 MB. Runs
//!    first, so that nothing of the other parts is in its memory figures.
//! 2. Streaming: one scripted turn of 20,000 chunks (`stream 20000`). Every chunk must be in
//!    the `agent_message` item read back from disk; this process's CPU time (user + sys,
//!    `getrusage(RUSAGE_SELF)`, from `deliver` to idle) per chunk. Target < 25 µs per chunk.
//! 3. Daemon overhead on a real turn: codex-acp (from `scripts/install-agents`) against the
//!    scripted model served in this process, one plain turn through the manager (`deliver` →
//!    `turn_ended` seen on `subscribe()`) against the same turn driven directly over ACP
//!    (`session/prompt` → its answer), interleaved, 10 turns each after a warm-up, medians.
//!    Both agents get the same environment (what drover gives its agents). Target ≤ 1.05×.
//!    Skipped, saying so, when the agents are not installed.
//!
//! The scripted agent is `$DROVER_SCRIPTED_AGENT`, else `drover-scripted-agent` of this
//! build (`scripts/bench` builds both). Scratch stores go under `$TMPDIR`;
//! `DROVER_BENCH_KEEP=1` keeps them. A missed target is reported, not an error: the exit status
//! is non-zero only when the bench could not run.

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use drover_acp::{Provider, Providers, RuntimeManager, TimelineUpdate, no_mcp_servers};
use drover_bench::{self as bench, Row, fmt_bytes, fmt_dur, fmt_kb, median, median_f64};
use drover_core::inbox::Delivery;
use drover_core::timeline::{Page, TimelineItem};
use drover_core::{AgentId, NewAgent, Registry};
use drover_fakes::acp_client::{AcpClient, ClientOptions};
use drover_fakes::model;
use drover_fakes::real_agents::{self, RealAgent};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

const WORKER_THREADS: usize = 2;

const FLEET_AGENTS: usize = 100;
const FLEET_CHUNKS: usize = 200;
const FLEET_CHUNK_MS: u64 = 5;
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
const FLEET_RSS_TARGET_MB: f64 = 100.0;

const STREAM_CHUNKS: usize = 20_000;
const STREAM_TARGET_US: f64 = 25.0;

const OVERHEAD_TURNS: usize = 10;
const OVERHEAD_WARMUP: usize = 2;
const OVERHEAD_TARGET: f64 = 1.05;
const OVERHEAD_PROMPT: &str = "reply hello from the scripted model";

/// The longest any one wait (a start, a turn, all turns) may take.
const WAIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    bench::block_on("drover-bench-runtime", Some(WORKER_THREADS), run())
}

async fn run() -> Result<()> {
    let scripted = bench::scripted_agent_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-runtime-")?;
    // Canonical, so the cwd codex is told to trust is the one it sees.
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    println!("drover-bench-runtime");
    println!("  scripted agent: {}", scripted.display());
    println!("  scratch:        {}", root.display());
    println!(
        "  machine:        {} CPUs, {}; tokio runtime with {WORKER_THREADS} workers",
        bench::cpus(),
        bench::kernel()
    );
    println!(
        "  memory and CPU figures are this process's: the RuntimeManager (the daemon's runtimes) \
         runs here; the agents are child processes and are not counted"
    );
    println!();

    let mut rows = Vec::new();
    let started = Instant::now();
    fleet_bench(&scripted, &root, &mut rows).await?;
    stream_bench(&scripted, &root, &mut rows).await?;
    overhead_bench(&root, &mut rows).await?;

    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the stores in {}", root.display());
    }
    Ok(())
}

// ---- the fleet under one manager ------------------------------------------------------------

/// A manager and registry over `home`, as `drover daemon` opens them.
struct Daemon {
    manager: RuntimeManager,
    registry: Registry,
}

impl Daemon {
    async fn open(home: &Path, providers: Providers) -> Result<Daemon> {
        std::fs::create_dir_all(home)?;
        let (manager, registry, _) = RuntimeManager::open(home, providers, no_mcp_servers())
            .await
            .map_err(|e| anyhow!("RuntimeManager::open: {e}"))?;
        Ok(Daemon { manager, registry })
    }

    /// Creates an agent and starts its runtime (process, handshake, session), no turn yet.
    async fn start_agent(&self, provider: &str, cwd: &Path) -> Result<AgentId> {
        start_agent(&self.manager, provider, cwd).await
    }

    async fn items(&self, id: AgentId) -> Result<Vec<TimelineItem>> {
        items(&self.manager, id).await
    }

    async fn close(self) {
        self.manager.shutdown().await;
        self.registry.shutdown().await;
    }
}

async fn start_agent(manager: &RuntimeManager, provider: &str, cwd: &Path) -> Result<AgentId> {
    let agent = drover_bench::create_agent(
        manager,
        NewAgent {
            provider: provider.to_string(),
            cwd: cwd.to_path_buf(),
            title: Some(format!("bench {provider}")),
            ..NewAgent::default()
        },
        None,
        None,
    )
    .await
    .map_err(|e| anyhow!("create_agent ({provider}): {e}"))?;
    // The start command is handled before wait_idle's ping is answered.
    ensure!(
        manager
            .wait_idle(agent.id, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?,
        "agent {} ({provider}) did not start within {WAIT:?}",
        agent.id
    );
    if manager.runtime_pid(agent.id).await.is_none() {
        let notices: Vec<String> = items(manager, agent.id)
            .await?
            .into_iter()
            .filter(|i| i.kind == "notice")
            .map(|i| text_of(&i))
            .collect();
        bail!(
            "agent {} ({provider}) has no runtime after starting: {notices:?}",
            agent.id
        );
    }
    Ok(agent.id)
}

async fn items(manager: &RuntimeManager, id: AgentId) -> Result<Vec<TimelineItem>> {
    Ok(manager
        .timeline(id, Page::Tail { limit: 100_000 })
        .await
        .map_err(|e| anyhow!("timeline of {id}: {e}"))?
        .items)
}

fn text_of(item: &TimelineItem) -> String {
    item.data
        .get("text")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_string()
}

/// The timeline of the last turn: its agent message text and its `turn_ended` event.
fn last_turn(items: &[TimelineItem]) -> (String, String) {
    let start = items
        .iter()
        .rposition(|i| i.kind == "turn_started")
        .unwrap_or(0);
    let turn = &items[start..];
    let message = turn
        .iter()
        .filter(|i| i.kind == "agent_message")
        .map(text_of)
        .collect::<String>();
    let event = turn
        .iter()
        .rev()
        .find(|i| i.kind == "turn_ended")
        .and_then(|i| i.data.get("event").and_then(|e| e.as_str()))
        .unwrap_or("(no turn_ended)")
        .to_string();
    (message, event)
}

/// What `stream n` says, as the scripted agent streams it.
fn streamed(n: usize) -> String {
    let mut text = String::new();
    for i in 1..=n {
        // Writing to a `String` cannot fail.
        let _ = writeln!(text, "chunk {i}");
    }
    text
}

fn scripted_providers(scripted: &Path, state: &Path) -> Providers {
    let mut providers = Providers::presets();
    providers.insert(Provider {
        label: "Scripted".to_string(),
        install_hint: "built with the workspace (scripts/bench)".to_string(),
        ..Provider::command(
            "scripted",
            vec![scripted.display().to_string()],
            BTreeMap::from([(
                "SCRIPTED_AGENT_STATE_DIR".to_string(),
                state.display().to_string(),
            )]),
        )
    });
    providers
}

async fn fleet_bench(scripted: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 1. {FLEET_AGENTS} scripted agents running a turn at once (`stream {FLEET_CHUNKS} {FLEET_CHUNK_MS}` each), one RuntimeManager =="
    );
    let base = root.join("fleet");
    let cwd = base.join("cwd");
    std::fs::create_dir_all(&cwd)?;
    let before = mem_status()?;
    let hwm_reset = reset_hwm();
    let daemon = Arc::new(
        Daemon::open(
            &base.join("home"),
            scripted_providers(scripted, &base.join("agent-state")),
        )
        .await?,
    );
    let sampler = Sampler::start();

    let t = Instant::now();
    let mut starting = JoinSet::new();
    for _ in 0..FLEET_AGENTS {
        let daemon = daemon.clone();
        let cwd = cwd.clone();
        starting.spawn(async move { daemon.start_agent("scripted", &cwd).await });
    }
    let mut ids = Vec::with_capacity(FLEET_AGENTS);
    while let Some(joined) = starting.join_next().await {
        ids.push(joined.context("start task")??);
    }
    let start_time = t.elapsed();
    let after_start = mem_status()?;
    let start_peak = sampler.peak_rss_kb();
    println!(
        "  started {FLEET_AGENTS} agent processes (create, spawn, initialize, session/new) in {}; VmRSS now {} (was {} before the manager)",
        fmt_dur(start_time),
        fmt_kb(after_start.rss_kb),
        fmt_kb(before.rss_kb),
    );

    sampler.reset_peak();
    let prompt = format!("stream {FLEET_CHUNKS} {FLEET_CHUNK_MS}");
    let t = Instant::now();
    let t_wall = jiff::Timestamp::now();
    let mut turns = JoinSet::new();
    for &id in &ids {
        let daemon = daemon.clone();
        let prompt = prompt.clone();
        turns.spawn(async move {
            daemon
                .manager
                .deliver(id, Delivery::Followup, prompt, "bench".to_string())
                .await
                .map_err(|e| anyhow!("deliver to {id}: {e}"))?;
            let idle = daemon
                .manager
                .wait_idle(id, WAIT)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            Ok::<_, anyhow::Error>((id, idle, t.elapsed()))
        });
    }
    let mut finished = Vec::new();
    while let Some(joined) = turns.join_next().await {
        finished.push(joined.context("turn task")??);
    }
    let wall = t.elapsed();
    let turn_peak = sampler.peak_rss_kb();
    let samples = sampler.samples();
    let overall_peak = start_peak.max(turn_peak);
    let end = mem_status()?;
    sampler.stop();

    let expected = streamed(FLEET_CHUNKS);
    let mut completed = 0;
    let mut problems = Vec::new();
    // When each prompt went out and each turn ended, from the items' own timestamps.
    let (mut prompts_out, mut turns_ended) = (Vec::new(), Vec::new());
    let since = |item: Option<&TimelineItem>| {
        item.and_then(|i| Duration::try_from(i.at.duration_since(t_wall)).ok())
    };
    for &(id, idle, _) in &finished {
        let items = daemon.items(id).await?;
        prompts_out.extend(since(items.iter().rfind(|i| i.kind == "turn_started")));
        turns_ended.extend(since(items.iter().rfind(|i| i.kind == "turn_ended")));
        let (message, event) = last_turn(&items);
        if idle && event == "turn_completed" && message == expected {
            completed += 1;
        } else if problems.len() < 3 {
            problems.push(format!(
                "{id}: idle={idle} event={event} chunks={}",
                message.matches("chunk ").count()
            ));
        }
    }
    let mut ends: Vec<Duration> = finished.iter().map(|f| f.2).collect();
    ends.sort();
    println!(
        "  all turns: {completed} of {FLEET_AGENTS} completed with all {FLEET_CHUNKS} chunks on disk; wall {} from the first deliver to the last idle (first idle after {}, median {})",
        fmt_dur(wall),
        fmt_dur(ends[0]),
        fmt_dur(median(&ends)),
    );
    if !problems.is_empty() {
        println!("  incomplete: {}", problems.join("; "));
    }
    let spread = |v: &mut Vec<Duration>| {
        v.sort();
        format!(
            "first {}, median {}, last {}",
            fmt_dur(v.first().copied().unwrap_or_default()),
            fmt_dur(median(v)),
            fmt_dur(v.last().copied().unwrap_or_default())
        )
    };
    println!(
        "  after the first deliver, prompts went out (turn_started): {}; turns ended: {}",
        spread(&mut prompts_out),
        spread(&mut turns_ended)
    );
    println!(
        "  this process (the daemon's runtimes, agent processes excluded), sampled every {} ms ({samples} samples):",
        SAMPLE_EVERY.as_millis()
    );
    println!(
        "    peak VmRSS while the turns ran {}, while starting {}; VmHWM {} ({}); VmRSS after {}",
        fmt_kb(turn_peak),
        fmt_kb(start_peak),
        fmt_kb(end.hwm_kb),
        if hwm_reset {
            "since a reset through /proc/self/clear_refs before the manager opened"
        } else {
            "over the whole process: /proc/self/clear_refs could not reset it"
        },
        fmt_kb(end.rss_kb),
    );
    println!(
        "    per agent: ~{} of VmRSS over the pre-manager {}",
        fmt_kb(overall_peak.saturating_sub(before.rss_kb) / FLEET_AGENTS as u64),
        fmt_kb(before.rss_kb)
    );
    println!();

    let peak = overall_peak.max(end.hwm_kb);
    rows.push(Row::target(
        format!("{FLEET_AGENTS} agents: daemon RSS at peak (excl. agents)"),
        format!(
            "VmRSS {} / VmHWM {}",
            fmt_kb(overall_peak),
            fmt_kb(end.hwm_kb)
        ),
        "< 100 MB",
        (peak as f64) / 1024.0 < FLEET_RSS_TARGET_MB,
    ));
    rows.push(Row::target(
        format!("{FLEET_AGENTS} agents: turns completed"),
        format!("{completed} of {FLEET_AGENTS}"),
        format!("{FLEET_AGENTS} of {FLEET_AGENTS}"),
        completed == FLEET_AGENTS,
    ));
    rows.push(Row::info(
        format!("{FLEET_AGENTS} agents: wall, deliver → all idle"),
        format!(
            "{} (one turn alone ≥ {} of streaming)",
            fmt_dur(wall),
            fmt_dur(Duration::from_millis(
                FLEET_CHUNK_MS * (FLEET_CHUNKS as u64 - 1)
            ))
        ),
    ));
    match Arc::try_unwrap(daemon) {
        Ok(daemon) => daemon.close().await,
        Err(daemon) => {
            daemon.manager.shutdown().await;
            daemon.registry.shutdown().await;
        }
    }
    Ok(())
}

// ---- one long stream ------------------------------------------------------------------------

async fn stream_bench(scripted: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!("== 2. one turn streaming {STREAM_CHUNKS} chunks (`stream {STREAM_CHUNKS}`) ==");
    let base = root.join("stream");
    let cwd = base.join("cwd");
    std::fs::create_dir_all(&cwd)?;
    let daemon = Daemon::open(
        &base.join("home"),
        scripted_providers(scripted, &base.join("agent-state")),
    )
    .await?;
    let id = daemon.start_agent("scripted", &cwd).await?;

    let cpu_before = cpu_time()?;
    let t = Instant::now();
    daemon
        .manager
        .deliver(
            id,
            Delivery::Followup,
            format!("stream {STREAM_CHUNKS}"),
            "bench".to_string(),
        )
        .await
        .map_err(|e| anyhow!("deliver: {e}"))?;
    let idle = daemon
        .manager
        .wait_idle(id, WAIT)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let wall = t.elapsed();
    let cpu = cpu_time()?.saturating_sub(cpu_before);
    ensure!(
        idle,
        "the {STREAM_CHUNKS}-chunk turn did not end within {WAIT:?}"
    );

    let t = Instant::now();
    let items = daemon.items(id).await?;
    let read_back = t.elapsed();
    let (message, event) = last_turn(&items);
    let expected = streamed(STREAM_CHUNKS);
    let chunks_found = message.matches("chunk ").count();
    let all_there = message == expected;
    let timeline_bytes = std::fs::metadata(
        base.join("home")
            .join("timelines")
            .join(format!("{id}.jsonl")),
    )
    .map_or(0, |m| m.len());
    let per_chunk_us = cpu.as_secs_f64() * 1e6 / STREAM_CHUNKS as f64;
    println!(
        "  turn ({event}): wall {} from deliver to idle ({:.0} chunks/s)",
        fmt_dur(wall),
        STREAM_CHUNKS as f64 / wall.as_secs_f64()
    );
    println!(
        "  persisted: {chunks_found} chunks in the agent_message read back from disk ({} of text, exact: {all_there}); timeline file {} (read back in {})",
        fmt_bytes(message.len() as u64),
        fmt_bytes(timeline_bytes),
        fmt_dur(read_back),
    );
    println!(
        "  this process's CPU (user+sys, getrusage RUSAGE_SELF; the agent process excluded): {} = {per_chunk_us:.1} µs per chunk, {:.0}% of a core during the turn",
        fmt_dur(cpu),
        cpu.as_secs_f64() * 100.0 / wall.as_secs_f64()
    );
    println!();
    daemon.close().await;

    rows.push(Row::target(
        format!("stream: chunks persisted ({}k)", STREAM_CHUNKS / 1000),
        format!("{chunks_found} of {STREAM_CHUNKS}, exact text: {all_there}"),
        "all",
        all_there && event == "turn_completed",
    ));
    rows.push(Row::target(
        "stream: daemon CPU per chunk",
        format!("{per_chunk_us:.1} µs ({} CPU)", fmt_dur(cpu)),
        "< 25 µs",
        per_chunk_us < STREAM_TARGET_US,
    ));
    rows.push(Row::info(
        format!("stream: wall, {}k chunks", STREAM_CHUNKS / 1000),
        format!(
            "{} ({:.0} chunks/s)",
            fmt_dur(wall),
            STREAM_CHUNKS as f64 / wall.as_secs_f64()
        ),
    ));
    Ok(())
}

// ---- daemon overhead on a real turn ---------------------------------------------------------

async fn overhead_bench(root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 3. daemon overhead: a plain codex turn through RuntimeManager vs direct ACP ({OVERHEAD_TURNS} each, interleaved, after {OVERHEAD_WARMUP} warm-up) =="
    );
    let agents = real_agents::agents_dir();
    if let Err(e) = RealAgent::Codex.require_installed(&agents) {
        println!("  SKIP: {e}");
        println!();
        rows.push(Row::skip(
            "overhead: codex turn, drover / direct ACP",
            "not run: codex-acp is not installed (run scripts/install-agents)".to_string(),
            "≤ 1.05×",
        ));
        return Ok(());
    }
    let base = root.join("overhead");
    let cwd = base.join("workspace");
    std::fs::create_dir_all(&cwd)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the model server")?;
    let model = model::serve(listener);
    println!(
        "  codex-acp: {}",
        RealAgent::Codex.entry_point(&agents).display()
    );
    println!(
        "  scripted model (in this process): {}; prompt {OVERHEAD_PROMPT:?}",
        model.url()
    );

    // Each side gets its own CODEX_HOME; the same workspace, model and prompt.
    let via_drover = real_agents::codex(&agents, &model.url(), &base.join("scratch-drover"), &cwd)?;
    let mut direct_cmd =
        real_agents::codex(&agents, &model.url(), &base.join("scratch-direct"), &cwd)?;
    // And the same environment: what drover gives its agents (the allowlisted part of this
    // process's environment, the provider's variables, DROVER_AGENT_ID). It matters: without
    // SSL_CERT_FILE / SSL_CERT_DIR codex spends ~30-40 ms more on every turn (loading the
    // system's CA certificates), which would flatter drover.
    let mut env: BTreeMap<String, String> = drover_acp::process::ENV_ALLOWLIST
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    env.extend(direct_cmd.env.clone());
    env.insert("DROVER_AGENT_ID".to_string(), AgentId::new().to_string());
    direct_cmd.env = env;
    let mut providers = Providers::presets();
    providers.insert(Provider {
        label: "codex-acp against the scripted model".to_string(),
        install_hint: "run scripts/install-agents".to_string(),
        ..Provider::command(
            "codex-bench",
            std::iter::once(via_drover.program.display().to_string())
                .chain(via_drover.args.iter().cloned())
                .collect(),
            via_drover.env.clone(),
        )
    });
    let daemon = Daemon::open(&base.join("home"), providers).await?;
    let t = Instant::now();
    let id = daemon.start_agent("codex-bench", &cwd).await?;
    let drover_start = t.elapsed();

    // drover's `initialize` offers no fs capabilities; the direct client says the same.
    let client = AcpClient::spawn(
        &direct_cmd,
        ClientOptions {
            fs: false,
            timeout: WAIT,
        },
    )?;
    let t = Instant::now();
    client.initialize().await?;
    let session = client.new_session(&cwd).await?;
    let direct_start = t.elapsed();
    println!(
        "  both codex processes get drover's agent environment (allowlist + provider env), each its own CODEX_HOME"
    );
    println!(
        "  started: through drover {} (create + spawn + initialize + session/new), direct {} (initialize + session/new)",
        fmt_dur(drover_start),
        fmt_dur(direct_start)
    );

    let mut updates = daemon.manager.subscribe();
    let mut via_drover = Vec::new();
    let mut direct_turns = Vec::new();
    for round in 0..OVERHEAD_WARMUP + OVERHEAD_TURNS {
        // Alternate who goes first, so neither always follows the other.
        let (mut via, mut direct) = (None, None);
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                via = Some(drover_turn(&daemon, id, &mut updates).await?);
            } else {
                direct = Some(direct_turn(&client, &session).await?);
            }
        }
        let (Some(via), Some(direct)) = (via, direct) else {
            bail!("a turn was not run");
        };
        if round >= OVERHEAD_WARMUP {
            via_drover.push(via);
            direct_turns.push(direct);
        }
    }
    let _ = client.shutdown(Duration::from_secs(3)).await;
    daemon.close().await;
    model.shutdown().await;

    let phase = |f: fn(&DroverTurn) -> Duration| via_drover.iter().map(f).collect::<Vec<_>>();
    let drover_turns = phase(|t| t.ended);
    let list = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:6.1}", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("  per turn, ms, in order:");
    println!(
        "    drover: deliver → turn_ended      {}",
        list(&drover_turns)
    );
    println!(
        "    direct: session/prompt → answer   {}",
        list(&direct_turns)
    );
    println!(
        "    drover: deliver → idle            {}",
        list(&phase(|t| t.idle))
    );
    println!(
        "    drover: deliver() returned        {}",
        list(&phase(|t| t.queued))
    );
    println!(
        "    drover: deliver → turn_started    {}",
        list(&phase(|t| t.started))
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (drover_med, direct_med) = (median(&drover_turns), median(&direct_turns));
    let ratio = drover_med.as_secs_f64() / direct_med.as_secs_f64();
    let paired: Vec<f64> = drover_turns
        .iter()
        .zip(&direct_turns)
        .map(|(a, b)| ms(*a) - ms(*b))
        .collect();
    let paired_med = median_f64(&paired);
    let queued = median(&phase(|t| t.queued));
    let started = median(&phase(|t| t.started));
    let agent_part = median(&phase(|t| t.ended.saturating_sub(t.started)));
    let idle_med = median(&phase(|t| t.idle));
    println!(
        "  medians: drover {} vs direct {} = {ratio:.3}× ({:+.1} ms); per round, drover − direct: median {paired_med:+.1} ms",
        fmt_dur(drover_med),
        fmt_dur(direct_med),
        ms(drover_med) - ms(direct_med),
    );
    println!(
        "  drover's turn, medians: deliver() returns (message durable) after {}, the prompt goes out (turn_started) after {}, then {} until turn_ended; idle {} after turn_ended",
        fmt_dur(queued),
        fmt_dur(started),
        fmt_dur(agent_part),
        fmt_dur(idle_med.saturating_sub(drover_med)),
    );
    println!();
    rows.push(Row::target(
        "overhead: codex turn, drover / direct ACP",
        format!(
            "{} vs {} = {ratio:.3}× (medians of {OVERHEAD_TURNS})",
            fmt_dur(drover_med),
            fmt_dur(direct_med)
        ),
        "≤ 1.05×",
        ratio <= OVERHEAD_TARGET,
    ));
    rows.push(Row::info(
        "overhead: drover before the prompt (median)",
        format!(
            "{} (deliver → turn_started; deliver() itself {})",
            fmt_dur(started),
            fmt_dur(queued)
        ),
    ));
    rows.push(Row::info(
        "overhead: drover deliver → idle (median)",
        format!(
            "{} ({:+.1} ms after turn_ended)",
            fmt_dur(idle_med),
            ms(idle_med) - ms(drover_med)
        ),
    ));
    Ok(())
}

/// When each step of a turn through drover happened, after `deliver` was called.
#[derive(Debug, Clone, Copy)]
struct DroverTurn {
    /// `deliver` returned: the message is durable in the inbox.
    queued: Duration,
    /// `turn_started` was announced: the prompt is on its way to the agent.
    started: Duration,
    /// `turn_ended` was announced.
    ended: Duration,
    /// `wait_idle` returned: the turn's end is recorded.
    idle: Duration,
}

/// One turn through the manager: `deliver` → `turn_ended` on the live updates, and its steps.
async fn drover_turn(
    daemon: &Daemon,
    id: AgentId,
    updates: &mut broadcast::Receiver<drover_acp::TimelineEvent>,
) -> Result<DroverTurn> {
    // What earlier turns left behind is not this turn's.
    while updates.try_recv().is_ok() {}
    let t = Instant::now();
    daemon
        .manager
        .deliver(
            id,
            Delivery::Followup,
            OVERHEAD_PROMPT.to_string(),
            "bench".to_string(),
        )
        .await
        .map_err(|e| anyhow!("deliver: {e}"))?;
    let queued = t.elapsed();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut started = None;
    let event = loop {
        match tokio::time::timeout_at(deadline, updates.recv()).await {
            Ok(Ok(ev)) if ev.agent_id == id => {
                if let TimelineUpdate::Item { item } = ev.update {
                    if item.kind == "turn_started" {
                        started = Some(t.elapsed());
                    } else if item.kind == "turn_ended" {
                        break item
                            .data
                            .get("event")
                            .and_then(|e| e.as_str())
                            .unwrap_or_default()
                            .to_string();
                    }
                }
            }
            Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => bail!("the updates channel closed"),
            Err(_) => bail!("no turn_ended within {WAIT:?}"),
        }
    };
    let ended = t.elapsed();
    ensure!(
        daemon
            .manager
            .wait_idle(id, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?,
        "the codex agent did not become idle"
    );
    let idle = t.elapsed();
    let (message, _) = last_turn(&daemon.items(id).await?);
    ensure!(
        event == "turn_completed" && message == "hello from the scripted model",
        "the turn through drover went wrong: {event}, said {message:?}"
    );
    Ok(DroverTurn {
        queued,
        started: started.ok_or_else(|| anyhow!("no turn_started before turn_ended"))?,
        ended,
        idle,
    })
}

/// The same turn over ACP directly: `session/prompt` → its answer.
async fn direct_turn(client: &AcpClient, session: &str) -> Result<Duration> {
    let t = Instant::now();
    let turn = client.prompt(session, OVERHEAD_PROMPT).await?;
    let elapsed = t.elapsed();
    ensure!(
        turn.stop_reason == "end_turn" && turn.text() == "hello from the scripted model",
        "the direct turn went wrong: {} {:?}",
        turn.stop_reason,
        turn.text()
    );
    Ok(elapsed)
}

// ---- measuring this process -----------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct MemStatus {
    rss_kb: u64,
    hwm_kb: u64,
}

fn mem_status() -> Result<MemStatus> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| anyhow!("/proc/self/status has no {name}"))
    };
    Ok(MemStatus {
        rss_kb: field("VmRSS:")?,
        hwm_kb: field("VmHWM:")?,
    })
}

/// Resets `VmHWM` to the current RSS (`5` to `/proc/self/clear_refs`, Linux ≥ 4.0).
fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// User + system CPU time of this process, every thread (children not included).
#[expect(unsafe_code)]
fn cpu_time() -> Result<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer it is given, which points at
    // enough zeroed memory for one.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    ensure!(
        rc == 0,
        "getrusage failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: getrusage returned 0, so it filled the struct (and it was zeroed before).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// Samples `VmRSS` every [`SAMPLE_EVERY`] on a thread of its own (so a busy runtime cannot
/// delay it) and keeps the peak.
struct Sampler {
    state: Arc<SamplerState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct SamplerState {
    stop: AtomicBool,
    peak_kb: std::sync::atomic::AtomicU64,
    samples: std::sync::atomic::AtomicU64,
}

impl Sampler {
    fn start() -> Sampler {
        let state = Arc::new(SamplerState::default());
        let s = state.clone();
        let thread = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                if let Ok(m) = mem_status() {
                    s.peak_kb.fetch_max(m.rss_kb, Ordering::Relaxed);
                    s.samples.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        Sampler {
            state,
            thread: Some(thread),
        }
    }

    fn peak_rss_kb(&self) -> u64 {
        let now = mem_status().map_or(0, |m| m.rss_kb);
        self.state.peak_kb.load(Ordering::Relaxed).max(now)
    }

    fn reset_peak(&self) {
        self.state.peak_kb.store(0, Ordering::Relaxed);
    }

    fn samples(&self) -> u64 {
        self.state.samples.load(Ordering::Relaxed)
    }

    fn stop(mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
