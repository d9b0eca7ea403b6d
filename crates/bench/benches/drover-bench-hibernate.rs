//! `drover-bench-hibernate`: what idle agents cost, and what waking them costs.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target.
//!
//! 1. Idle fleet: 100 scripted agents each run one turn through one [`RuntimeManager`] (in
//!    this process, as the daemon runs it) with `[runtimes] idle_timeout` at 3 s. Their
//!    processes (found by their `DROVER_AGENT_ID` in `/proc`) and the summed `VmRSS` of their
//!    trees are read once all are idle, and again once every runtime is cold. Target: 0
//!    processes and 0 MB after.
//! 2. Resume latency: from a message to the first streamed chunk, for an agent whose runtime
//!    hibernated after a turn (spawn, `initialize`, `session/load` of its history, prompt)
//!    against an agent that never ran (spawn, `initialize`, `session/new`, prompt); interleaved,
//!    medians. With codex-acp against the scripted model when it is installed (`scripts/
//!    install-agents`; `DROVER_AGENTS_DIR` names another folder), and with the scripted agent.
//!    Target ≤ 1.2× for codex-acp (for the scripted agent the figure is shown for information).
//! 3. Daemon memory: `drover daemon` (a process of its own) on a home of 10,000 agent records
//!    (`fleet_gen`: every agent cold, as hibernated ones are, with resume handles), after 20
//!    more agents ran a turn and hibernated. Its `VmRSS` once settled. Target ≤ 60 MB.
//!
//! Binaries, scratch and `DROVER_BENCH_KEEP` as in the other benches (`scripts/bench`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use drover_acp::{
    Provider, Providers, RuntimeManager, RuntimeSettings, RuntimeState, TimelineUpdate,
    no_mcp_servers,
};
use drover_bench::{self as bench, DaemonProc, Row, fmt_dur, fmt_kb, median};
use drover_core::inbox::Delivery;
use drover_core::{AgentId, NewAgent, Registry};
use drover_fakes::model;
use drover_fakes::procs;
use drover_fakes::real_agents::{self, RealAgent};
use serde_json::json;
use tokio::task::JoinSet;

const FLEET: usize = 100;
const FLEET_TIMEOUT: Duration = Duration::from_secs(3);
const RESUME_ROUNDS: usize = 8;
const RESUME_TIMEOUT: Duration = Duration::from_millis(400);
const RESUME_TARGET: f64 = 1.2;
const RECORDS_WORKSPACES: usize = 100;
const RECORDS_PER_WORKSPACE: usize = 100;
const RECORDS_RAN: usize = 20;
const DAEMON_TARGET_KB: u64 = 60 * 1024;
/// The longest any one wait may take.
const WAIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    bench::block_on("drover-bench-hibernate", Some(2), run())
}

async fn run() -> Result<()> {
    let scripted = bench::scripted_agent_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-hibernate-")?;
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    println!("drover-bench-hibernate");
    println!("  scripted agent: {}", scripted.display());
    println!("  scratch:        {}", root.display());
    println!(
        "  machine:        {} CPUs, {}; load {}",
        bench::cpus(),
        bench::kernel(),
        bench::load_average()
    );
    println!();
    let mut rows = Vec::new();
    let started = Instant::now();
    fleet_bench(&scripted, &root, &mut rows).await?;
    resume_bench(&scripted, &root, &mut rows).await?;
    daemon_bench(&scripted, &root, &mut rows).await?;
    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the stores in {}", root.display());
    }
    Ok(())
}

fn scripted_provider(scripted: &Path, state: &Path) -> Provider {
    Provider {
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
    }
}

/// A manager and registry over `home` with these providers and idle timeout.
async fn open(
    home: &Path,
    extra: Vec<Provider>,
    idle_timeout: Duration,
) -> Result<(RuntimeManager, Registry)> {
    std::fs::create_dir_all(home)?;
    let mut providers = Providers::presets();
    for p in extra {
        providers.insert(p);
    }
    providers.set_runtime_settings(RuntimeSettings {
        idle_timeout: Some(idle_timeout),
        max_live: None,
    });
    let (manager, registry, _) = RuntimeManager::open(home, providers, no_mcp_servers())
        .await
        .map_err(|e| anyhow!("RuntimeManager::open: {e}"))?;
    Ok((manager, registry))
}

async fn create(manager: &RuntimeManager, provider: &str, cwd: &Path) -> Result<AgentId> {
    let agent = manager
        .registry()
        .create_agent(NewAgent {
            provider: provider.to_string(),
            cwd: cwd.to_path_buf(),
            ..NewAgent::default()
        })
        .await
        .map_err(|e| anyhow!("create_agent: {e}"))?;
    Ok(agent.id)
}

async fn turn(manager: &RuntimeManager, id: AgentId, prompt: &str) -> Result<()> {
    manager
        .deliver(id, Delivery::Followup, prompt.to_string(), "bench".into())
        .await
        .map_err(|e| anyhow!("deliver to {id}: {e}"))?;
    ensure!(
        manager
            .wait_idle(id, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?,
        "agent {id}: the turn did not end within {WAIT:?}"
    );
    Ok(())
}

/// Waits (bounded) until every agent's runtime is cold.
async fn all_cold(manager: &RuntimeManager, ids: &[AgentId], within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let warm = ids
            .iter()
            .filter(|id| manager.runtime(**id).state != RuntimeState::Cold)
            .count();
        if warm == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{warm} runtimes still not cold after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The processes carrying one of `ids` as `DROVER_AGENT_ID`, and their summed `VmRSS` in KB.
fn marked(ids: &[AgentId]) -> (usize, u64) {
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let found: Vec<procs::Process> = procs::live()
        .into_iter()
        .filter(|p| ids.iter().any(|id| p.has_env("DROVER_AGENT_ID", id)))
        .collect();
    let rss = found
        .iter()
        .filter_map(|p| bench::proc_mem_kb(u32::try_from(p.pid).ok()?).ok())
        .map(|(rss, _)| rss)
        .sum();
    (found.len(), rss)
}

// ---- 1. an idle fleet -----------------------------------------------------------------------

async fn fleet_bench(scripted: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 1. {FLEET} scripted agents run one turn each and go idle (idle_timeout {FLEET_TIMEOUT:?}) =="
    );
    let base = root.join("fleet");
    let cwd = base.join("cwd");
    std::fs::create_dir_all(&cwd)?;
    let (manager, registry) = open(
        &base.join("home"),
        vec![scripted_provider(scripted, &base.join("state"))],
        FLEET_TIMEOUT,
    )
    .await?;
    let mut ids = Vec::new();
    for _ in 0..FLEET {
        ids.push(create(&manager, "scripted", &cwd).await?);
    }
    let t = Instant::now();
    let mut turns = JoinSet::new();
    for &id in &ids {
        let manager = manager.clone();
        turns.spawn(async move { turn(&manager, id, "say hello\nstream 20").await });
    }
    while let Some(joined) = turns.join_next().await {
        joined.context("turn task")??;
    }
    let ran = t.elapsed();
    let (before_procs, before_kb) = marked(&ids);
    let mut via_manager = 0u64;
    for &id in &ids {
        if let Some(m) = manager.runtime_memory(id).await {
            via_manager += m.rss_bytes;
        }
    }
    println!(
        "  {FLEET} turns in {}; idle: {before_procs} processes, {} resident in all (get_agent's sum: {})",
        fmt_dur(ran),
        fmt_kb(before_kb),
        fmt_kb(via_manager / 1024)
    );
    let t = Instant::now();
    all_cold(&manager, &ids, FLEET_TIMEOUT + Duration::from_secs(60)).await?;
    let cold_after = t.elapsed();
    // What the kernel still shows of them (bounded: processes end as their group is killed).
    let mut after = marked(&ids);
    for _ in 0..50 {
        if after.0 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = marked(&ids);
    }
    println!(
        "  all {FLEET} cold {} after the last turn ended (timeout {FLEET_TIMEOUT:?}): {} processes, {} resident",
        fmt_dur(cold_after),
        after.0,
        fmt_kb(after.1)
    );
    println!();
    rows.push(Row::info(
        format!("idle fleet: {FLEET} agents before the timeout"),
        format!("{before_procs} processes, {}", fmt_kb(before_kb)),
    ));
    rows.push(Row::target(
        format!("idle fleet: {FLEET} agents after the timeout"),
        format!("{} processes, {}", after.0, fmt_kb(after.1)),
        "0 processes, 0 MB",
        after == (0, 0),
    ));
    manager.shutdown().await;
    registry.shutdown().await;
    Ok(())
}

// ---- 2. resume latency ----------------------------------------------------------------------

/// From a message to the agent's first streamed chunk (its first `agent_message` item).
async fn first_chunk(manager: &RuntimeManager, id: AgentId, prompt: &str) -> Result<Duration> {
    let mut updates = manager.subscribe();
    let t = Instant::now();
    manager
        .deliver(id, Delivery::Followup, prompt.to_string(), "bench".into())
        .await
        .map_err(|e| anyhow!("deliver to {id}: {e}"))?;
    let first = tokio::time::timeout(WAIT, async {
        loop {
            match updates.recv().await {
                Ok(event)
                    if event.agent_id == id
                        && matches!(&event.update, TimelineUpdate::Item { item } if item.kind == "agent_message") =>
                {
                    return Ok(t.elapsed());
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => return Err(anyhow!("updates: {e}")),
            }
        }
    })
    .await
    .map_err(|_| anyhow!("agent {id}: no chunk within {WAIT:?}"))??;
    ensure!(
        manager
            .wait_idle(id, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?,
        "agent {id}: the turn did not end"
    );
    Ok(first)
}

/// Resume against fresh start for one provider: medians in ms and their ratio.
async fn resume_vs_fresh(
    manager: &RuntimeManager,
    provider: &str,
    cwd: &Path,
    prompt: &str,
) -> Result<(Duration, Duration)> {
    // Agents that ran a turn each, then hibernated.
    let mut hibernated = Vec::new();
    for _ in 0..=RESUME_ROUNDS {
        let id = create(manager, provider, cwd).await?;
        turn(manager, id, prompt).await?;
        hibernated.push(id);
    }
    all_cold(manager, &hibernated, RESUME_TIMEOUT + WAIT).await?;
    let (mut resumed, mut fresh) = (Vec::new(), Vec::new());
    for (round, &id) in hibernated.iter().enumerate() {
        let new = create(manager, provider, cwd).await?;
        // Alternate which goes first; the first round warms up and is not counted.
        let (r, f) = if round % 2 == 0 {
            let r = first_chunk(manager, id, prompt).await?;
            (r, first_chunk(manager, new, prompt).await?)
        } else {
            let f = first_chunk(manager, new, prompt).await?;
            (first_chunk(manager, id, prompt).await?, f)
        };
        let loaded = manager
            .timeline(id, drover_core::timeline::Page::Tail { limit: 50 })
            .await
            .map_err(|e| anyhow!("{e}"))?
            .items
            .iter()
            .any(|i| {
                i.kind == "notice"
                    && i.data.get("text").and_then(|t| t.as_str())
                        == Some("resumed the agent's session")
            });
        if !loaded {
            bail!("{provider}: agent {id} did not resume through session/load");
        }
        if round > 0 {
            resumed.push(r);
            fresh.push(f);
        }
    }
    Ok((median(&resumed), median(&fresh)))
}

async fn resume_bench(scripted: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 2. resume latency: message → first streamed chunk, hibernated (session/load) vs never started (session/new), {RESUME_ROUNDS} rounds each, interleaved =="
    );
    let base = root.join("resume");
    let cwd = base.join("workspace");
    std::fs::create_dir_all(&cwd)?;
    let agents = real_agents::agents_dir();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the model server")?;
    let model = model::serve(listener);
    let mut providers = vec![scripted_provider(scripted, &base.join("state"))];
    let codex = RealAgent::Codex.require_installed(&agents);
    if codex.is_ok() {
        let command = real_agents::codex(&agents, &model.url(), &base.join("codex"), &cwd)?;
        providers.push(Provider {
            label: "codex-acp against the scripted model".to_string(),
            install_hint: "run scripts/install-agents".to_string(),
            ..Provider::command(
                "codex-bench",
                std::iter::once(command.program.display().to_string())
                    .chain(command.args.iter().cloned())
                    .collect(),
                command.env.clone(),
            )
        });
    }
    let (manager, registry) = open(&base.join("home"), providers, RESUME_TIMEOUT).await?;
    match codex {
        Ok(_) => {
            let (resumed, fresh) = resume_vs_fresh(
                &manager,
                "codex-bench",
                &cwd,
                "reply hello from the scripted model",
            )
            .await?;
            let ratio = resumed.as_secs_f64() / fresh.as_secs_f64();
            println!(
                "  codex-acp + scripted model: resumed {} vs fresh {} (median): {ratio:.2}×",
                fmt_dur(resumed),
                fmt_dur(fresh)
            );
            rows.push(Row::target(
                "resume: codex-acp hibernated / fresh, to first chunk",
                format!("{ratio:.2}× ({} vs {})", fmt_dur(resumed), fmt_dur(fresh)),
                format!("≤ {RESUME_TARGET}×"),
                ratio <= RESUME_TARGET,
            ));
        }
        Err(e) => {
            println!("  codex-acp: SKIP ({e})");
            rows.push(Row::skip(
                "resume: codex-acp hibernated / fresh, to first chunk",
                "not run: codex-acp is not installed (run scripts/install-agents)".to_string(),
                format!("≤ {RESUME_TARGET}×"),
            ));
        }
    }
    let (resumed, fresh) =
        resume_vs_fresh(&manager, "scripted", &cwd, "say hello\nstream 50").await?;
    let ratio = resumed.as_secs_f64() / fresh.as_secs_f64();
    println!(
        "  scripted agent: resumed {} vs fresh {} (median): {ratio:.2}×",
        fmt_dur(resumed),
        fmt_dur(fresh)
    );
    println!();
    rows.push(Row::info(
        "resume: scripted agent hibernated / fresh, to first chunk",
        format!("{ratio:.2}× ({} vs {})", fmt_dur(resumed), fmt_dur(fresh)),
    ));
    manager.shutdown().await;
    registry.shutdown().await;
    Ok(())
}

// ---- 3. the daemon with 10,000 hibernated agents ---------------------------------------------

/// The daemon's RSS once it stopped moving (read every 100 ms, at most 10 s).
async fn settled_rss(daemon: &DaemonProc) -> Result<u64> {
    let mut last = daemon.mem()?.0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = daemon.mem()?.0;
        if now.abs_diff(last) < 64 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

async fn daemon_bench(scripted: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    let records = RECORDS_WORKSPACES * RECORDS_PER_WORKSPACE;
    println!(
        "== 3. drover daemon with {records} hibernated agents ({RECORDS_RAN} of them ran a turn and hibernated here) =="
    );
    let drover = bench::drover_binary()?;
    let base = root.join("daemon");
    let home = base.join("home");
    let stats = drover_bench::fleet_gen::generate_fleet(
        &home,
        RECORDS_WORKSPACES,
        RECORDS_PER_WORKSPACE,
        7,
    )?;
    let state: PathBuf = base.join("state");
    let config = format!(
        "{}\n[runtimes]\nidle_timeout = \"1s\"\n",
        drover_fakes::scripted_agent::provider_config(scripted, &state)
    );
    std::fs::write(home.join("config.toml"), config)?;
    let cwd = base.join("cwd");
    std::fs::create_dir_all(&cwd)?;
    let daemon = DaemonProc::spawn(
        &drover,
        &home,
        &base.join("daemon.log"),
        Some(stats.agents),
        WAIT,
    )?;
    let url = format!("ws://{}/ws", daemon.addr);
    let mut ws = bench::ws_connect(&url).await?;
    bench::hello(&mut ws, "drover-bench-hibernate").await?;
    let mut ids = Vec::new();
    for n in 0..RECORDS_RAN {
        let created = bench::request(
            &mut ws,
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "prompt": "say hello"}),
            format!("c{n}"),
        )
        .await?;
        let id = created["payload"]["agent"]["id"]
            .as_str()
            .ok_or_else(|| anyhow!("create_agent: {created}"))?
            .to_string();
        ids.push(id);
    }
    for (n, id) in ids.iter().enumerate() {
        let idle = bench::request(
            &mut ws,
            json!({"type": "wait_idle", "agentId": id, "timeoutMs": 60000}),
            format!("w{n}"),
        )
        .await?;
        ensure!(idle["payload"]["idle"] == true, "wait_idle: {idle}");
    }
    // Every runtime hibernates: /health counts none live.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = bench::get_health(daemon.addr).unwrap_or_default();
        if health["liveRuntimes"] == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "runtimes still live 30 s after their turns: {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(ws);
    let rss = settled_rss(&daemon).await?;
    let (_, hwm) = daemon.mem()?;
    println!(
        "  {} agents ({} bytes of records), none live: daemon VmRSS {} (peak {})",
        stats.agents + RECORDS_RAN,
        stats.agent_bytes,
        fmt_kb(rss),
        fmt_kb(hwm)
    );
    println!();
    rows.push(Row::target(
        format!(
            "daemon RSS with {} hibernated agents",
            stats.agents + RECORDS_RAN
        ),
        fmt_kb(rss),
        "≤ 60 MB",
        rss <= DAEMON_TARGET_KB,
    ));
    daemon.stop()?;
    Ok(())
}
