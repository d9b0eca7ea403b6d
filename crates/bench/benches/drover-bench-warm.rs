//! `drover-bench-warm`: create → first streamed chunk, with and without a warm spare
//! (`[providers.X] warm = 1`), for the scripted agent and for codex-acp against the scripted
//! model (its npm launcher, as users install it; skipped, saying so, when
//! `scripts/install-agents` has not run).
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. Two
//! [`RuntimeManager`]s run in this process as the daemon runs its runtimes, one whose provider
//! keeps a spare and one whose provider does not. Each round creates an agent with a prompt
//! that streams (`stream 5 20`) on each, alternately, and times `create_agent` → the first
//! `agent_message` item of that agent on `subscribe()`; before a warm round it waits until the
//! spare is ready again (as a user's next create after a pause would find it). The agent is
//! archived after its turn. Medians over the rounds (`DROVER_BENCH_ROUNDS`, default 10).
//! Target: a warm create's first chunk at least 2× sooner than a cold one's for codex. The
//! scripted agent's start (spawn and `initialize`) is a few milliseconds, within the noise of
//! a loaded machine: its figures are reported, not judged.

#![expect(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use drover_acp::{Provider, Providers, RuntimeManager, TimelineUpdate, no_mcp_servers};
use drover_bench::{self as bench, Row, fmt_dur, median};
use drover_core::{AgentId, ArchiveOptions, NewAgent, Registry};
use drover_fakes::model;
use drover_fakes::real_agents::{self, RealAgent};
use tokio::sync::broadcast;

const WORKER_THREADS: usize = 2;
const WAIT: Duration = Duration::from_secs(120);
const CODEX_TARGET: f64 = 2.0;

fn main() -> ExitCode {
    bench::block_on("drover-bench-warm", Some(WORKER_THREADS), run())
}

async fn run() -> Result<()> {
    let scripted = bench::scripted_agent_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-warm-")?;
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    let rounds = bench::rounds(10);
    println!("drover-bench-warm");
    println!("  scratch: {}", root.display());
    println!(
        "  machine: {} CPUs, {}; load average {}; {rounds} rounds each",
        bench::cpus(),
        bench::kernel(),
        bench::load_average()
    );
    println!();
    let mut rows = Vec::new();
    let started = Instant::now();

    println!("== 1. the scripted agent: create → first streamed chunk ==");
    let provider = |warm| Provider {
        label: "Scripted".to_string(),
        install_hint: "built with the workspace (scripts/bench)".to_string(),
        warm,
        ..Provider::command(
            "scripted",
            vec![scripted.display().to_string()],
            BTreeMap::from([(
                "SCRIPTED_AGENT_STATE_DIR".to_string(),
                root.join("scripted-state").display().to_string(),
            )]),
        )
    };
    let cwd = root.join("scripted-cwd");
    std::fs::create_dir_all(&cwd)?;
    let (cold, warm) = compare(
        &root.join("scripted"),
        provider(0),
        provider(1),
        &cwd,
        rounds,
    )
    .await?;
    rows.push(Row::info(
        "scripted: create → first chunk, cold / warm (median)",
        format!("{} / {}", fmt_dur(cold), fmt_dur(warm)),
    ));
    // Its spawn and `initialize` take a few milliseconds: what a spare saves is within the
    // noise of a loaded machine, so it is reported, not judged.
    rows.push(Row::info(
        "scripted: cold / warm",
        format!("{:.2}×", ratio(cold, warm)),
    ));
    println!();

    println!(
        "== 2. codex-acp (npm launcher) against the scripted model: create → first streamed chunk =="
    );
    let agents = real_agents::agents_dir();
    let launcher = agents.join("node_modules/.bin/codex-acp");
    if let Err(e) = RealAgent::Codex.require_installed(&agents) {
        println!("  SKIP: {e}");
        rows.push(Row::skip(
            "codex: warm create's first chunk sooner",
            "not run: codex-acp is not installed (run scripts/install-agents)".to_string(),
            format!("≥ {CODEX_TARGET}×"),
        ));
    } else {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the model server")?;
        let model = model::serve(listener);
        let cwd = root.join("codex-cwd");
        std::fs::create_dir_all(&cwd)?;
        let mut command = real_agents::codex(&agents, &model.url(), &root.join("codex"), &cwd)?;
        // As users install it: the Node launcher, which starts the native binary.
        command.program = launcher;
        command.args.clear();
        let path = command.env.get("PATH").cloned().unwrap_or_default();
        command.env.insert(
            "PATH".into(),
            format!("{}:{path}", agents.join("node_modules/.bin").display()),
        );
        let provider = |warm| Provider {
            label: "codex-acp against the scripted model".to_string(),
            install_hint: "run scripts/install-agents".to_string(),
            warm,
            ..Provider::command(
                "codex-bench",
                std::iter::once(command.program.display().to_string())
                    .chain(command.args.iter().cloned())
                    .collect(),
                command.env.clone(),
            )
        };
        let (cold, warm) = compare(
            &root.join("codex-homes"),
            provider(0),
            provider(1),
            &cwd,
            rounds,
        )
        .await?;
        let r = ratio(cold, warm);
        rows.push(Row::info(
            "codex: create → first chunk, cold / warm (median)",
            format!("{} / {}", fmt_dur(cold), fmt_dur(warm)),
        ));
        rows.push(Row::target(
            "codex: warm create's first chunk sooner",
            format!("{r:.2}× sooner"),
            format!("≥ {CODEX_TARGET}×"),
            r >= CODEX_TARGET,
        ));
        drop(model);
    }
    println!();
    println!("  load average after: {}", bench::load_average());
    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the stores in {}", root.display());
    }
    Ok(())
}

fn ratio(cold: Duration, warm: Duration) -> f64 {
    cold.as_secs_f64() / warm.as_secs_f64().max(1e-9)
}

struct Daemon {
    manager: RuntimeManager,
    registry: Registry,
    updates: broadcast::Receiver<drover_acp::TimelineEvent>,
    provider: Provider,
}

impl Daemon {
    async fn open(home: &Path, provider: Provider) -> Result<Daemon> {
        std::fs::create_dir_all(home)?;
        let mut providers = Providers::presets();
        providers.insert(provider.clone());
        let (manager, registry, _) = RuntimeManager::open(home, providers, no_mcp_servers())
            .await
            .map_err(|e| anyhow!("RuntimeManager::open: {e}"))?;
        let updates = manager.subscribe();
        Ok(Daemon {
            manager,
            registry,
            updates,
            provider,
        })
    }

    /// Waits until the provider's spare is ready (nothing to wait for without `warm`).
    async fn spare_ready(&self) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while self.manager.warm(&self.provider).ready < self.provider.warm {
            if Instant::now() > deadline {
                bail!("no spare ready within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Creates an agent whose prompt streams, and times create → its first chunk.
    async fn first_chunk(&mut self, cwd: &Path) -> Result<Duration> {
        while self.updates.try_recv().is_ok() {}
        let t = Instant::now();
        let agent = drover_bench::create_agent(
            &self.manager,
            NewAgent {
                provider: self.provider.name.clone(),
                cwd: cwd.to_path_buf(),
                ..NewAgent::default()
            },
            Some("stream 5 20".to_string()),
            None,
        )
        .await
        .map_err(|e| anyhow!("create_agent: {e}"))?;
        let deadline = tokio::time::Instant::now() + WAIT;
        let took = loop {
            match tokio::time::timeout_at(deadline, self.updates.recv()).await {
                Ok(Ok(ev)) if ev.agent_id == agent.id => {
                    if let TimelineUpdate::Item { item } = &ev.update
                        && item.kind == "agent_message"
                    {
                        break t.elapsed();
                    }
                }
                Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) => bail!("the updates closed"),
                Err(_) => bail!("no chunk within {WAIT:?}"),
            }
        };
        self.finish(agent.id).await?;
        Ok(took)
    }

    async fn finish(&self, id: AgentId) -> Result<()> {
        self.manager
            .wait_idle(id, WAIT)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        self.registry
            .archive(
                id,
                ArchiveOptions {
                    stop_activity: true,
                },
            )
            .await
            .map_err(|e| anyhow!("archive: {e}"))?;
        Ok(())
    }

    async fn close(self) {
        self.manager.shutdown().await;
        self.registry.shutdown().await;
    }
}

/// Medians of create → first chunk: (cold, warm).
async fn compare(
    base: &Path,
    cold: Provider,
    warm: Provider,
    cwd: &Path,
    rounds: usize,
) -> Result<(Duration, Duration)> {
    let mut cold_daemon = Daemon::open(&base.join("cold"), cold).await?;
    let mut warm_daemon = Daemon::open(&base.join("warm"), warm).await?;
    // One of each first, not counted (the binaries' pages come into the cache).
    warm_daemon.spare_ready().await?;
    cold_daemon.first_chunk(cwd).await?;
    warm_daemon.first_chunk(cwd).await?;
    let (mut colds, mut warms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        warm_daemon.spare_ready().await?;
        // Alternate which goes first, so neither always runs after the other's agent.
        if round % 2 == 0 {
            colds.push(cold_daemon.first_chunk(cwd).await?);
            warm_daemon.spare_ready().await?;
            warms.push(warm_daemon.first_chunk(cwd).await?);
        } else {
            warms.push(warm_daemon.first_chunk(cwd).await?);
            colds.push(cold_daemon.first_chunk(cwd).await?);
        }
    }
    cold_daemon.close().await;
    warm_daemon.close().await;
    let (cold, warm) = (median(&colds), median(&warms));
    let fmt = |v: &[Duration]| v.iter().map(|d| fmt_dur(*d)).collect::<Vec<_>>().join(" ");
    println!("  cold: median {} ({})", fmt_dur(cold), fmt(&colds));
    println!("  warm: median {} ({})", fmt_dur(warm), fmt(&warms));
    Ok((cold, warm))
}
