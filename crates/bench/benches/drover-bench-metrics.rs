//! `drover-bench-metrics`: what a Prometheus scrape of `GET /metrics` costs a real `drover
//! daemon` process holding 10,000 agents (the fleet of `fleet_gen`, with attention, errors,
//! archived subtrees), 10 of them live (scripted agents whose process trees the scrape reads
//! in `/proc`).
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target.
//!
//! - **CPU per scrape**: the daemon's CPU time (user + system, all threads, `/proc/PID/stat`
//!   utime + stime) over 200 scrapes one after the other, divided by 200. Wall time is not
//!   the figure: it includes the client and the scheduler. Target ≤ 10 ms.
//! - For information: the wall time of a scrape (median, p99) and the exposition's size.
//!
//! Binaries, scratch and `DROVER_BENCH_KEEP` as in the other benches (`scripts/bench`);
//! `DROVER_BENCH_ROUNDS` changes the number of scrapes.

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use drover_bench::{self as bench, DaemonProc, Row, ScriptedHome, fmt_bytes, fmt_dur, quantile};
use serde_json::json;

const WORKSPACES: usize = 100;
const PER_WORKSPACE: usize = 100;
const LIVE: usize = 10;
const SCRAPES: usize = 200;
const WARMUP: usize = 10;
const TARGET: Duration = Duration::from_millis(10);
const WAIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    bench::block_on("drover-bench-metrics", Some(2), run())
}

/// One `GET /metrics` over a fresh connection, as Prometheus scrapes (HTTP/1.0, no keep-alive):
/// the body.
fn scrape(addr: SocketAddr) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8(response).context("the answer is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of the headers")?;
    ensure!(
        head.split_whitespace().nth(1) == Some("200"),
        "GET /metrics: {head}"
    );
    Ok(body.to_string())
}

async fn run() -> Result<()> {
    let setup = ScriptedHome::new("drover-bench-metrics")?;
    let started = setup.started;
    println!(
        "== /metrics with {} agents, {LIVE} live: {SCRAPES} scrapes ==",
        WORKSPACES * PER_WORKSPACE
    );
    let t = Instant::now();
    let stats =
        drover_bench::fleet_gen::generate_fleet(&setup.home, WORKSPACES, PER_WORKSPACE, 0x3e7c)?;
    println!(
        "  generated {} agents ({} archived) in {} workspaces in {}",
        stats.agents,
        stats.archived,
        stats.workspaces,
        fmt_dur(t.elapsed())
    );
    // The benches' daemon runs with `--no-token`, so the scrape needs no header; the token
    // check is one comparison, nothing a figure would show.
    let daemon = DaemonProc::spawn(
        &setup.drover,
        &setup.home,
        &setup.root.join("daemon.log"),
        Some(stats.agents),
        WAIT,
    )?;
    let mut ws = daemon.connect("drover-bench-metrics").await?;
    for n in 0..LIVE {
        let created = bench::request(
            &mut ws,
            json!({"type": "create_agent", "provider": "scripted", "cwd": setup.cwd, "prompt": "say ready"}),
            format!("c{n}"),
        )
        .await?;
        let id = created["payload"]["agent"]["id"]
            .as_str()
            .context("no agent id")?
            .to_string();
        let idle = bench::request(
            &mut ws,
            json!({"type": "wait_idle", "agentId": id, "timeoutMs": 60000}),
            format!("w{n}"),
        )
        .await?;
        ensure!(idle["payload"]["idle"] == true, "wait_idle: {idle}");
    }
    let first = scrape(daemon.addr)?;
    ensure!(
        first.contains(&format!("drover_runtimes{{state=\"live\"}} {LIVE}")),
        "the scrape does not count the {LIVE} live agents:\n{first}"
    );
    let agents: u64 = first
        .lines()
        .filter(|l| l.starts_with("drover_agents{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum::<u64>()
        + first
            .lines()
            .find_map(|l| l.strip_prefix("drover_agents_archived "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    ensure!(
        agents == (stats.agents + LIVE) as u64,
        "the scrape counts {agents} agents, not {}",
        stats.agents + LIVE
    );
    for _ in 0..WARMUP {
        scrape(daemon.addr)?;
    }
    // Let the agents' starts and the warm-up settle before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let rounds = bench::rounds(SCRAPES);
    let mut walls = Vec::with_capacity(rounds);
    let cpu_before = bench::proc_cpu_time(daemon.pid)?;
    let t = Instant::now();
    for _ in 0..rounds {
        let one = Instant::now();
        scrape(daemon.addr)?;
        walls.push(u64::try_from(one.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    let wall = t.elapsed();
    let cpu = bench::proc_cpu_time(daemon.pid)?.saturating_sub(cpu_before);
    let per_scrape = cpu / u32::try_from(rounds).unwrap_or(u32::MAX);
    walls.sort_unstable();
    println!(
        "  {rounds} scrapes in {}: daemon CPU {} in all, {} a scrape; wall median {}, p99 {}; {} each",
        fmt_dur(wall),
        fmt_dur(cpu),
        fmt_dur(per_scrape),
        fmt_dur(quantile(&walls, 0.5)),
        fmt_dur(quantile(&walls, 0.99)),
        fmt_bytes(first.len() as u64)
    );
    println!();
    drop(ws);
    daemon.stop()?;

    let rows = [
        Row::target(
            format!(
                "/metrics, {}k agents ({LIVE} live): daemon CPU per scrape",
                stats.agents / 1000
            ),
            fmt_dur(per_scrape),
            format!("≤ {}", fmt_dur(TARGET)),
            per_scrape <= TARGET,
        ),
        Row::info(
            "/metrics: wall time per scrape (median)",
            fmt_dur(quantile(&walls, 0.5)),
        ),
        Row::info("/metrics: exposition size", fmt_bytes(first.len() as u64)),
    ];
    bench::print_summary(&rows, started);
    Ok(())
}
