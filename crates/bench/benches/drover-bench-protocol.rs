//! `drover-bench-protocol`: prints how drover's client protocol performs, against its targets.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. The
//! daemon is the real `drover daemon` process; the clients are WebSocket connections from this
//! process; everything runs on 127.0.0.1.
//!
//! 1. Fan-out: 50 scripted agents stream a turn at once (`stream-stamped 200 10` each) to 20
//!    clients that each initialized every agent, so each client gets every `agent_update`
//!    (200,000 deliveries a round). Each chunk carries the wall clock at which the agent wrote
//!    it (`chunk <i> @<ns>`, `CLOCK_REALTIME` of this host), so the delay of every delivery is
//!    its arrival time at the client minus that stamp: agent stdout → daemon → socket → client,
//!    exactly, with no schedule to estimate. The baseline is a bare broadcast in a second
//!    process (this executable, `--bare-server`: axum's WebSocket over the tokio-tungstenite
//!    the daemon drives itself, which writes its fan-out messages, all under 64 KiB, alike; one tokio
//!    broadcast channel of the hub's capacity, nothing else) that replays the round: the same
//!    agents' chunks, `agent_update`-shaped and of the same size, each sent at the offset the
//!    agent sent it, stamped at send, to 20 fresh clients reading with the same code. It runs
//!    twice a round: with the daemon's socket options (Nagle's algorithm on, as `axum::serve`
//!    leaves it) and with `TCP_NODELAY`. Figures: deliveries per second (all clients, first
//!    stamp to last arrival) and the p50/p99 delay; 3 rounds (the same clients and agents, a
//!    new turn each), medians. Target: daemon p99 ≤ 1.5× the bare broadcast's p99 (same
//!    socket options), with every update delivered in order and no `resync_required`.
//!    For one client, each `append` update's own `timestamp` (taken when the daemon's hub
//!    serializes it) splits the daemon's delay into agent → hub and hub → client.
//!    The server's CPU time (`/proc/PID/stat`; the agents' own excluded) per delivery is shown
//!    for the daemon and the bare broadcast.
//! 2. `session_state` with 10,000 agents (500 workspaces, written in the store's format by
//!    `drover_bench::fleet_gen`, as `drover-bench` does): a raw WebSocket sends `hello`;
//!    from that moment, the time to the first byte of `welcome`, to the first and the last
//!    byte of `session_state`, and its size. Best and median of 60 connections, each closed
//!    (and its session over) before the next; targets: the last byte's median ≤ 30 ms, `VmRSS`
//!    after the 60th no more than 4 MB above the first, and no more than 1 MB above the 20th
//!    (the growth stops). The daemon's `VmRSS` is shown after each, and with 5 connections kept
//!    open after their `session_state`: what each holds, target ≤ 512 KiB (the daemon writes
//!    a big message in fragments of 64 KiB, so a connection's write buffer stays under
//!    192 KiB; it once kept the size of the largest message). The raw client reassembles
//!    fragmented messages; a message's first byte is its first frame's. Then a client that
//!    reads slowly (a 16 KiB receive buffer, 4 KiB a read; the daemon writes in small
//!    pieces), 5 times: the time to the last byte and the daemon's CPU time (all its threads,
//!    `schedstat`), shown. Then `list_agents` on 10 connections that read their
//!    `session_state`: from the request's write to the last byte of the answer, median ≤ 30 ms
//!    for the same agents as `session_state` (it is answered from the same cached encodings);
//!    with the archived ones too, shown.
//! 3. `drover ls` with those 10,000 agents: the real CLI (`--json`, and the default table)
//!    against that daemon (`DROVER_HOME`), output to a pipe, wall clock, best of 5. Target
//!    < 150 ms. SKIP, saying why, while the CLI has no `ls`.
//!
//! 4. Fleets and creates (`protocol/fleet.rs`): 10 agents × {1, 10, 50} clients that parse
//!    every message, and 50 × 50 light clients (one message in 8 parsed) with joining on and
//!    off, each agent streaming a chunk every 40 ms for 20 s, at the machine's load and with
//!    busy processes beside it; 50 × 10 light clients on a slow link (128 KiB a second, 16 KiB
//!    receive buffer: they cannot take every message as it comes) with joining on and off;
//!    create → `agent_created` and create → ready.
//!
//! `DROVER_BENCH_ONLY` (a comma-separated list of `fanout`, `state`, `fleet`, `light`, `slow`,
//! `creates`) runs only those parts; `DROVER_BENCH_STATE_ROUNDS` changes the 60 snapshots.
//!
//! Binaries: `drover` is `$DROVER_BIN`, else the one of this build; the scripted
//! agent is `$DROVER_SCRIPTED_AGENT`, else `drover-scripted-agent` of this build
//! (`scripts/bench` builds all of them in release). Scratch homes go under `$TMPDIR`;
//! `DROVER_BENCH_KEEP=1` keeps them (with the daemons' logs). A missed target is reported, not
//! an error: the exit status is non-zero only when the bench could not run.

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

#[path = "protocol/fleet.rs"]
mod fleet;

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use axum::extract::State;
use axum::extract::ws::{Message as AxumMessage, Utf8Bytes, WebSocket, WebSocketUpgrade};
use drover_bench::fleet_gen::generate_fleet;
use drover_bench::{
    self as bench, DaemonProc, Reaper, Row, Ws, fmt_bytes, fmt_dur, fmt_kb, hello, median,
    median_f64, now_ns, proc_cpu_time, quantile, recv_json, request, send_json, ws_connect,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;

const FAN_AGENTS: usize = 50;
const FAN_CLIENTS: usize = 20;
const FAN_CHUNKS: usize = 200;
const FAN_CHUNK_MS: u64 = 10;
const FAN_TARGET: f64 = 1.5;
/// Rounds of (daemon turn, bare replay); the figures compared are the medians.
const FAN_ROUNDS: usize = 3;
/// The daemon's hub holds 4096 events per session; the bare broadcast gets the same.
const BARE_CAPACITY: usize = 4096;

const STATE_AGENTS: usize = 10_000;
const STATE_WORKSPACES: usize = 500;
const STATE_ROUNDS: usize = 60;
/// The snapshot after which the growth must have stopped (see `STATE_PLATEAU_SLACK_KB`).
const STATE_SETTLED: usize = 20;
/// `VmRSS` may grow this much from the `STATE_SETTLED`th snapshot to the last.
const STATE_PLATEAU_SLACK_KB: u64 = 1024;
/// How long after a connection closed its memory is read.
const STATE_SETTLE: Duration = Duration::from_millis(200);
/// Connections kept open after their `session_state`, to show what an open one holds.
const STATE_HELD: usize = 5;
/// What one of them may hold (its write buffer is at most 128 KiB and a 64 KiB fragment).
const STATE_HELD_TARGET_KB: u64 = 512;
/// Connections that read their `session_state` slowly: a receive buffer of `SLOW_RCVBUF`
/// bytes, `SLOW_READ` bytes a read.
const SLOW_ROUNDS: usize = 5;
const SLOW_RCVBUF: usize = 16 * 1024;
const SLOW_READ: usize = 4 * 1024;
const STATE_TARGET: Duration = Duration::from_millis(30);
/// `VmRSS` may grow this much from the first snapshot to the last (allocator slack).
const STATE_RSS_SLACK_KB: u64 = 4096;
/// `list_agents` answers timed (each on a connection that read its `session_state`).
const LIST_ROUNDS: usize = 10;

const LS_ROUNDS: usize = 5;
const LS_TARGET: Duration = Duration::from_millis(150);

/// The longest any one wait (a boot, a setup step, a whole fan-out run) may take.
const WAIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--bare-server") {
        return match bare_server_main(&args[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("drover-bench-protocol --bare-server: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    bench::block_on("drover-bench-protocol", None, run())
}

async fn run() -> Result<()> {
    let drover = bench::drover_binary()?;
    let scripted = bench::scripted_agent_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-protocol-")?;
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    println!("drover-bench-protocol");
    println!("  drover binary:  {}", drover.display());
    println!("  scripted agent: {}", scripted.display());
    println!("  scratch:        {}", root.display());
    println!(
        "  machine:        {} CPUs, {}, load average {}; the daemon, the bare server, the \
         agents and this process (the clients) share them",
        bench::cpus(),
        bench::kernel(),
        bench::load_average()
    );
    println!();

    let mut rows = Vec::new();
    let started = Instant::now();
    if part("fanout") {
        fanout_bench(&drover, &scripted, &root, &mut rows).await?;
    }
    if part("state") {
        let home = root.join("state-home");
        let daemon = state_bench(&drover, &home, &root, &mut rows)?;
        ls_bench(&drover, &home, &mut rows)?;
        daemon.stop()?;
    }
    fleet::fleet_bench(&drover, &scripted, &root, &mut rows, part).await?;

    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the homes and logs in {}", root.display());
    }
    // Removing the 10,000-agent home can take seconds on a busy disk.
    drop(scratch);
    Ok(())
}

/// `DROVER_BENCH_STATE_ROUNDS`, else `STATE_ROUNDS`.
fn state_rounds() -> usize {
    std::env::var("DROVER_BENCH_STATE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(STATE_ROUNDS)
}

/// Whether the part `name` runs: `DROVER_BENCH_ONLY` (a comma-separated list of `fanout`,
/// `state`, `fleet`, `light`, `slow`, `creates`) when set, else every part.
fn part(name: &str) -> bool {
    std::env::var("DROVER_BENCH_ONLY")
        .map_or(true, |only| only.split(',').any(|p| p.trim() == name))
}

// ---- 1. fan-out -----------------------------------------------------------------------------

/// What one client read during a fan-out run.
#[derive(Default)]
struct Reading {
    /// Arrival minus stamp, one per stamped `agent_update`, in nanoseconds.
    delays: Vec<u64>,
    bytes: u64,
    first_stamp: u64,
    last_arrival: u64,
    resyncs: usize,
    /// `(agent id, chunk index)` went backwards for some agent.
    out_of_order: usize,
    /// Every stamped message as `(stamp, agent id, chunk index)`, if asked for.
    schedule: Vec<(u64, String, u64)>,
    /// For the daemon's `append` updates, if asked for: `(hub − stamp, arrival − hub)` in
    /// nanoseconds, where `hub` is the update's `timestamp`, taken when the daemon's hub
    /// serializes it.
    split: Vec<(u64, u64)>,
}

/// All clients of one run together.
struct Figures {
    delivered: usize,
    expected: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    max: Duration,
    mean_bytes: f64,
    span: Duration,
    resyncs: usize,
    out_of_order: usize,
    /// CPU time (user + system) the server process spent on the run.
    cpu: Duration,
}

impl Figures {
    fn of(readings: Vec<Reading>, expected: usize) -> Figures {
        let resyncs = readings.iter().map(|r| r.resyncs).sum();
        let out_of_order = readings.iter().map(|r| r.out_of_order).sum();
        let bytes: u64 = readings.iter().map(|r| r.bytes).sum();
        let first = readings
            .iter()
            .map(|r| r.first_stamp)
            .filter(|&s| s > 0)
            .min()
            .unwrap_or(0);
        let last = readings.iter().map(|r| r.last_arrival).max().unwrap_or(0);
        let mut delays: Vec<u64> = readings.into_iter().flat_map(|r| r.delays).collect();
        delays.sort_unstable();
        let at = |q: f64| quantile(&delays, q);
        let span = Duration::from_nanos(last.saturating_sub(first));
        Figures {
            delivered: delays.len(),
            expected,
            per_second: delays.len() as f64 / span.as_secs_f64().max(1e-9),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: Duration::from_nanos(delays.last().copied().unwrap_or(0)),
            mean_bytes: bytes as f64 / delays.len().max(1) as f64,
            span,
            resyncs,
            out_of_order,
            cpu: Duration::ZERO,
        }
    }

    fn print(&self, label: &str) {
        println!(
            "  {label}: {} of {} deliveries in {} = {:.0}/s; delay p50 {}, p99 {}, p99.9 {}, max {}; \
             {:.0} B per message; {} resync_required, {} out of order; server CPU {} ({:.1} µs per \
             delivery)",
            self.delivered,
            self.expected,
            fmt_dur(self.span),
            self.per_second,
            fmt_dur(self.p50),
            fmt_dur(self.p99),
            fmt_dur(self.p999),
            fmt_dur(self.max),
            self.mean_bytes,
            self.resyncs,
            self.out_of_order,
            fmt_dur(self.cpu),
            self.cpu.as_secs_f64() * 1e6 / self.delivered.max(1) as f64
        );
    }
}

async fn fanout_bench(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    println!(
        "== 1. fan-out: {FAN_AGENTS} scripted agents (`stream-stamped {FAN_CHUNKS} {FAN_CHUNK_MS}` \
         each) to {FAN_CLIENTS} clients that initialized every agent; {FAN_ROUNDS} rounds, each \
         a daemon turn then its bare replays =="
    );
    println!(
        "  method: each chunk carries the wall clock at which the agent wrote it; delay = arrival \
         at the client − that stamp (same host, CLOCK_REALTIME). Baseline: a bare tokio broadcast \
         (axum WebSocket, as the daemon's) in a second process replays the round's messages \
         (same agents, chunk numbers and ~size) at the times the agents sent them, stamped at \
         send, to {FAN_CLIENTS} clients reading with the same code: `bare` with the daemon's \
         socket options (Nagle on), `bare nodelay` with TCP_NODELAY on its sockets."
    );
    let expected = FAN_AGENTS * FAN_CHUNKS * FAN_CLIENTS;
    let mut fleet = Fleet::start(drover, scripted, root).await?;
    let mut daemon_runs = Vec::with_capacity(FAN_ROUNDS);
    let mut bare_runs = Vec::with_capacity(FAN_ROUNDS);
    let mut nodelay_runs = Vec::with_capacity(FAN_ROUNDS);
    for round in 1..=FAN_ROUNDS {
        let (daemon, schedule) = fleet.round(round).await?;
        daemon.print(&format!("#{round} daemon      "));
        let bare = fanout_bare(root, &schedule, expected, false).await?;
        bare.print(&format!("#{round} bare        "));
        let nodelay = fanout_bare(root, &schedule, expected, true).await?;
        nodelay.print(&format!("#{round} bare nodelay"));
        daemon_runs.push(daemon);
        bare_runs.push(bare);
        nodelay_runs.push(nodelay);
    }
    let (rss, hwm) = fleet.daemon.mem()?;
    println!(
        "  daemon VmRSS after the rounds {} (VmHWM {}), {FAN_AGENTS} agents and {} sessions open",
        fmt_kb(rss),
        fmt_kb(hwm),
        FAN_CLIENTS + 1
    );
    fleet.daemon.stop()?;

    let (d, b, n) = (
        Medians::of(&daemon_runs),
        Medians::of(&bare_runs),
        Medians::of(&nodelay_runs),
    );
    let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64().max(1e-9);
    println!(
        "  medians of {FAN_ROUNDS} rounds: p50 {} / {} / {}, p99 {} / {} / {}, {:.0}/s / {:.0}/s / \
         {:.0}/s (daemon / bare / bare nodelay)",
        fmt_dur(d.p50),
        fmt_dur(b.p50),
        fmt_dur(n.p50),
        fmt_dur(d.p99),
        fmt_dur(b.p99),
        fmt_dur(n.p99),
        d.per_second,
        b.per_second,
        n.per_second,
    );
    println!();
    let delivered: usize = daemon_runs.iter().map(|f| f.delivered).sum();
    let resyncs: usize = daemon_runs.iter().map(|f| f.resyncs).sum();
    let out_of_order: usize = daemon_runs.iter().map(|f| f.out_of_order).sum();
    let complete = delivered == expected * FAN_ROUNDS && resyncs == 0 && out_of_order == 0;
    let p99_ratio = ratio(d.p99, b.p99);
    rows.push(Row::target(
        format!("fan-out {FAN_AGENTS}×{FAN_CLIENTS}: p99 delay vs bare (median of {FAN_ROUNDS})"),
        format!("{} vs {} = {p99_ratio:.2}×", fmt_dur(d.p99), fmt_dur(b.p99)),
        format!("≤ {FAN_TARGET:.2}×"),
        p99_ratio <= FAN_TARGET && complete,
    ));
    rows.push(Row::info(
        "fan-out: p50 delay vs bare",
        format!(
            "{} vs {} = {:.2}×",
            fmt_dur(d.p50),
            fmt_dur(b.p50),
            ratio(d.p50, b.p50)
        ),
    ));
    rows.push(Row::info(
        "fan-out: p99 / p50 vs bare with TCP_NODELAY",
        format!(
            "{} vs {} = {:.2}× / {} vs {} = {:.2}×",
            fmt_dur(d.p99),
            fmt_dur(n.p99),
            ratio(d.p99, n.p99),
            fmt_dur(d.p50),
            fmt_dur(n.p50),
            ratio(d.p50, n.p50)
        ),
    ));
    rows.push(Row::info(
        "fan-out: server CPU per delivery (daemon vs bare)",
        format!(
            "{:.1} µs vs {:.1} µs = {:.1}×",
            d.cpu_us,
            b.cpu_us,
            d.cpu_us / b.cpu_us.max(1e-9)
        ),
    ));
    rows.push(Row::info(
        "fan-out: deliveries/s (daemon vs bare)",
        format!(
            "{:.0}/s vs {:.0}/s; daemon delivered {delivered} of {}{}",
            d.per_second,
            b.per_second,
            expected * FAN_ROUNDS,
            if resyncs + out_of_order > 0 {
                format!(", {resyncs} resyncs, {out_of_order} out of order")
            } else {
                String::new()
            }
        ),
    ));
    Ok(())
}

/// Medians over the rounds of one kind of run.
struct Medians {
    p50: Duration,
    p99: Duration,
    per_second: f64,
    /// Server CPU per delivery, in microseconds.
    cpu_us: f64,
}

impl Medians {
    fn of(runs: &[Figures]) -> Medians {
        let pick = |f: fn(&Figures) -> Duration| median(&runs.iter().map(f).collect::<Vec<_>>());
        Medians {
            p50: pick(|f| f.p50),
            p99: pick(|f| f.p99),
            per_second: median_f64(&runs.iter().map(|f| f.per_second).collect::<Vec<_>>()),
            cpu_us: median_f64(
                &runs
                    .iter()
                    .map(|f| f.cpu.as_secs_f64() * 1e6 / f.delivered.max(1) as f64)
                    .collect::<Vec<_>>(),
            ),
        }
    }
}

/// The fan-out daemon with its agents created and every client subscribed to every agent.
struct Fleet {
    daemon: DaemonProc,
    /// Creates the agents and sends the prompts; initializes nothing, so gets statuses only.
    driver: Option<Ws>,
    clients: Vec<Ws>,
    agents: Vec<String>,
}

impl Fleet {
    async fn start(drover: &Path, scripted: &Path, root: &Path) -> Result<Fleet> {
        let home = root.join("fanout-home");
        let cwd = root.join("fanout-cwd");
        fs::create_dir_all(&home)?;
        fs::create_dir_all(&cwd)?;
        fs::write(
            home.join("config.toml"),
            drover_fakes::scripted_agent::provider_config(
                scripted,
                &root.join("fanout-agent-state"),
            ),
        )?;
        let daemon = DaemonProc::spawn(
            drover,
            &home,
            &root.join("daemon-fanout.stderr"),
            None,
            WAIT,
        )?;
        let url = format!("ws://{}/ws", daemon.addr);
        let t = Instant::now();
        let mut driver = ws_connect(&url).await?;
        hello(&mut driver, "drover-bench-protocol").await?;
        let mut agents = Vec::with_capacity(FAN_AGENTS);
        for i in 0..FAN_AGENTS {
            let answer = request(
                &mut driver,
                json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "title": format!("fan-out {i}")}),
                format!("create-{i}"),
            )
            .await?;
            let id = answer["payload"]["agent"]["id"]
                .as_str()
                .ok_or_else(|| anyhow!("agent_created without an id: {answer}"))?;
            agents.push(id.to_string());
        }
        let mut setup = JoinSet::new();
        for _ in 0..FAN_CLIENTS {
            let (url, agents) = (url.clone(), agents.clone());
            setup.spawn(async move {
                let mut ws = ws_connect(&url).await?;
                hello(&mut ws, "drover-bench-protocol").await?;
                initialize_all(&mut ws, &agents).await?;
                anyhow::Ok(ws)
            });
        }
        let mut clients = Vec::with_capacity(FAN_CLIENTS);
        while let Some(joined) = setup.join_next().await {
            clients.push(joined??);
        }
        println!(
            "  daemon: {FAN_AGENTS} agents created and initialized by {FAN_CLIENTS} clients in {}",
            fmt_dur(t.elapsed())
        );
        Ok(Fleet {
            daemon,
            driver: Some(driver),
            clients,
            agents,
        })
    }

    /// One turn of every agent, read by every client; returns the figures and what the agents
    /// sent when, as `(stamp, agent id, chunk index)` in stamp order.
    async fn round(&mut self, round: usize) -> Result<(Figures, Vec<(u64, String, u64)>)> {
        let per_client = FAN_AGENTS * FAN_CHUNKS;
        let cpu_before = proc_cpu_time(self.daemon.pid)?;
        let mut readers = JoinSet::new();
        for (i, ws) in self.clients.drain(..).enumerate() {
            readers.spawn(read_stamped(ws, Source::Daemon, per_client, i == 0));
        }
        let mut driver = self.driver.take().ok_or_else(|| anyhow!("no driver"))?;
        for (i, id) in self.agents.iter().enumerate() {
            send_json(
                &mut driver,
                &json!({"type": "send_message", "agentId": id, "requestId": format!("go-{round}-{i}"),
                        "text": format!("stream-stamped {FAN_CHUNKS} {FAN_CHUNK_MS}")}),
            )
            .await?;
        }
        // The answers, and the statuses, so that the driver's session never backs up.
        let agents = self.agents.len();
        let answers = tokio::spawn(async move {
            let mut queued = 0;
            while queued < agents {
                let message = recv_json(&mut driver).await?;
                match message["type"].as_str() {
                    Some("message_queued") => queued += 1,
                    Some("request_error") => bail!("send_message failed: {message}"),
                    _ => {}
                }
            }
            anyhow::Ok(driver)
        });
        let mut readings = Vec::new();
        let mut resynced = Vec::new();
        while let Some(joined) = readers.join_next().await {
            let (ws, reading) = joined??;
            if reading.resyncs > 0 {
                resynced.push(ws);
            } else {
                self.clients.push(ws);
            }
            readings.push(reading);
        }
        let cpu = proc_cpu_time(self.daemon.pid)?.saturating_sub(cpu_before);
        // Every turn over before the next round.
        let mut driver = answers.await??;
        for (i, id) in self.agents.iter().enumerate() {
            send_json(
                &mut driver,
                &json!({"type": "wait_idle", "agentId": id, "requestId": format!("idle-{round}-{i}"),
                        "timeoutMs": u64::try_from(WAIT.as_millis()).unwrap_or(u64::MAX)}),
            )
            .await?;
        }
        let mut idle = 0;
        while idle < self.agents.len() {
            let message = recv_json(&mut driver).await?;
            match message["type"].as_str() {
                Some("idle") => idle += 1,
                Some("request_error") => bail!("wait_idle failed: {message}"),
                _ => {}
            }
        }
        self.driver = Some(driver);
        // A client told to resync subscribes again, as a real one would.
        for mut ws in resynced {
            initialize_all(&mut ws, &self.agents).await?;
            self.clients.push(ws);
        }
        let mut schedule = Vec::new();
        let mut split = Vec::new();
        for reading in &mut readings {
            if !reading.schedule.is_empty() {
                schedule = std::mem::take(&mut reading.schedule);
                split = std::mem::take(&mut reading.split);
            }
        }
        schedule.sort_unstable();
        if !split.is_empty() {
            let mut to_hub: Vec<u64> = split.iter().map(|s| s.0).collect();
            let mut to_client: Vec<u64> = split.iter().map(|s| s.1).collect();
            to_hub.sort_unstable();
            to_client.sort_unstable();
            println!(
                "  #{round} daemon, one client's {} appends: agent → hub p50 {}, p99 {}; hub → client \
                 p50 {}, p99 {}",
                split.len(),
                fmt_dur(quantile(&to_hub, 0.50)),
                fmt_dur(quantile(&to_hub, 0.99)),
                fmt_dur(quantile(&to_client, 0.50)),
                fmt_dur(quantile(&to_client, 0.99)),
            );
        }
        let mut figures = Figures::of(readings, per_client * FAN_CLIENTS);
        figures.cpu = cpu;
        Ok((figures, schedule))
    }
}

async fn fanout_bare(
    root: &Path,
    schedule: &[(u64, String, u64)],
    expected: usize,
    nodelay: bool,
) -> Result<Figures> {
    let first = schedule.first().map_or(0, |s| s.0);
    let mut plan = String::new();
    for (stamp, agent, chunk) in schedule {
        // Writing to a `String` cannot fail.
        let _ = writeln!(plan, "{} {agent} {chunk}", stamp - first);
    }
    let path = root.join("fanout-schedule.txt");
    fs::write(&path, plan)?;
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut child = Command::new(&exe)
        .arg("--bare-server")
        .arg(&path)
        .arg(FAN_CLIENTS.to_string())
        .arg(if nodelay { "nodelay" } else { "nagle" })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot run `{} --bare-server`", exe.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let pid = child.id();
    let guard = Reaper(Some(child));
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .ok_or_else(|| anyhow!("the bare server said {line:?}"))?
        .to_string();
    let url = format!("ws://{addr}/ws");
    let per_client = FAN_AGENTS * FAN_CHUNKS;
    let mut readers = JoinSet::new();
    for _ in 0..FAN_CLIENTS {
        let ws = ws_connect(&url).await?;
        readers.spawn(read_stamped(ws, Source::Bare, per_client, false));
    }
    let mut readings = Vec::new();
    while let Some(joined) = readers.join_next().await {
        let (mut ws, reading) = joined??;
        let _ = ws.close(None).await;
        readings.push(reading);
    }
    let cpu = proc_cpu_time(pid)?;
    drop(guard);
    let mut figures = Figures::of(readings, expected);
    figures.cpu = cpu;
    Ok(figures)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Daemon,
    /// The bare server: the client says `ready` first.
    Bare,
}

/// Reads until `expected` stamped chunks arrived (or the run's deadline), noting each delay.
async fn read_stamped(
    mut ws: Ws,
    source: Source,
    expected: usize,
    record: bool,
) -> Result<(Ws, Reading)> {
    if source == Source::Bare {
        ws.send(Message::Text("ready".into())).await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut reading = Reading {
        delays: Vec::with_capacity(expected),
        ..Reading::default()
    };
    let mut last_chunk: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    while reading.delays.len() < expected {
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => bail!("a client's connection failed: {e}"),
            Ok(None) | Err(_) => break,
        };
        let arrival = now_ns();
        let Message::Text(text) = frame else { continue };
        let stamped = stamps_of(&text);
        if let Some(&(stamp, chunk)) = stamped.last() {
            // A joined `append` delivers several chunks: each counts, with its own delay.
            for (stamp, _) in &stamped {
                reading.delays.push(arrival.saturating_sub(*stamp));
            }
            reading.bytes += text.len() as u64;
            if reading.first_stamp == 0 || stamp < reading.first_stamp {
                reading.first_stamp = stamp;
            }
            reading.last_arrival = arrival;
            if let Some(agent) = agent_of(&text) {
                let last = last_chunk.entry(agent.to_string()).or_insert(0);
                if chunk <= *last {
                    reading.out_of_order += 1;
                }
                *last = chunk;
                if record {
                    reading.schedule.push((stamp, agent.to_string(), chunk));
                    if source == Source::Daemon
                        && text.contains("\"op\":\"append\"")
                        && let Some(hub) = hub_time(&text)
                    {
                        reading
                            .split
                            .push((hub.saturating_sub(stamp), arrival.saturating_sub(hub)));
                    }
                }
            }
        } else if text.contains("\"type\":\"resync_required\"") {
            reading.resyncs += 1;
            if source == Source::Daemon {
                // The daemon dropped this session's subscriptions: nothing more will come.
                break;
            }
        }
    }
    Ok((ws, reading))
}

/// `(stamp, chunk index)` of every `chunk <i> @<ns>` in an `agent_update` (one, or several
/// in an `append` the daemon joined), in order.
fn stamps_of(text: &str) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    if !text.starts_with("{\"type\":\"agent_update\"") {
        return found;
    }
    let mut rest = text;
    while let Some(at) = rest.find(" @") {
        let before = &rest[..at];
        if let (Some(stamp), Some(chunk)) = (
            digits(&rest[at + 2..]),
            before
                .rfind("chunk ")
                .and_then(|c| digits(&before[c + 6..])),
        ) {
            found.push((stamp, chunk));
        }
        rest = &rest[at + 2..];
    }
    found
}

/// The update's `timestamp` in nanoseconds since the epoch.
fn hub_time(text: &str) -> Option<u64> {
    let key = "\"timestamp\":\"";
    let start = text.find(key)? + key.len();
    let len = text[start..].find('"')?;
    let at: jiff::Timestamp = text[start..start + len].parse().ok()?;
    u64::try_from(at.as_nanosecond()).ok()
}

fn agent_of(text: &str) -> Option<&str> {
    let key = "\"agentId\":\"";
    let start = text.find(key)? + key.len();
    let len = text[start..].find('"')?;
    Some(&text[start..start + len])
}

fn digits(s: &str) -> Option<u64> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// Pipelines `initialize_agent_request` for every agent and waits for every answer.
async fn initialize_all(ws: &mut Ws, agents: &[String]) -> Result<()> {
    for (i, id) in agents.iter().enumerate() {
        send_json(
            ws,
            &json!({"type": "initialize_agent_request", "agentId": id, "requestId": format!("init-{i}")}),
        )
        .await?;
    }
    let mut answered = 0;
    while answered < agents.len() {
        let message = recv_json(ws).await?;
        match message["type"].as_str() {
            Some("agent_initialized") => answered += 1,
            Some("request_error") => bail!("initialize_agent_request failed: {message}"),
            _ => {}
        }
    }
    Ok(())
}

// ---- the bare broadcast (a second process) --------------------------------------------------

struct Bare {
    tx: broadcast::Sender<Utf8Bytes>,
    clients: usize,
    ready: AtomicUsize,
    go: Notify,
}

/// `--bare-server SCHEDULE CLIENTS nagle|nodelay`: prints `listening ADDR`, waits for CLIENTS
/// WebSocket clients to send a first message, then sends one stamped `agent_update` per line of
/// SCHEDULE (`<offset ns> <agent id> <chunk index>`) at that offset from the start, and exits.
/// `nagle` leaves the accepted sockets as the daemon does (Nagle's algorithm on); `nodelay`
/// sets `TCP_NODELAY` on them.
fn bare_server_main(args: &[String]) -> Result<()> {
    let usage = || anyhow!("usage: --bare-server SCHEDULE CLIENTS nagle|nodelay");
    let plan = fs::read_to_string(args.first().ok_or_else(usage)?)?;
    let clients: usize = args.get(1).ok_or_else(usage)?.parse()?;
    let nodelay = match args.get(2).map(String::as_str) {
        Some("nagle") => false,
        Some("nodelay") => true,
        _ => return Err(usage()),
    };
    let mut schedule = Vec::new();
    for line in plan.lines() {
        let mut fields = line.split_whitespace();
        let (Some(offset), Some(agent), Some(chunk)) =
            (fields.next(), fields.next(), fields.next())
        else {
            bail!("a bad schedule line: {line:?}");
        };
        schedule.push((
            Duration::from_nanos(offset.parse()?),
            agent.to_string(),
            chunk.parse::<u64>()?,
        ));
    }
    // The daemon's runtime: multi-threaded, one worker per CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        use axum::serve::ListenerExt;
        let (tx, _) = broadcast::channel(BARE_CAPACITY);
        let bare = Arc::new(Bare {
            tx,
            clients,
            ready: AtomicUsize::new(0),
            go: Notify::new(),
        });
        let app = axum::Router::new()
            .route("/ws", axum::routing::get(bare_upgrade))
            .with_state(bare.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        let listener = listener.tap_io(move |tcp| {
            if nodelay {
                let _ = tcp.set_nodelay(true);
            }
        });
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        bare.go.notified().await;
        // Paced by a thread of its own: `std::thread::sleep` keeps each send within tens of
        // microseconds of its offset, where tokio's millisecond timer would bunch the sends
        // of each millisecond together (the agents, 50 processes, are not bunched so).
        let tx = bare.tx.clone();
        let producer = std::thread::spawn(move || {
            let start = Instant::now();
            for (offset, agent, chunk) in schedule {
                if let Some(wait) = offset.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                // The shape and size of the daemon's `append` update, serialized once.
                let message = json!({"type": "agent_update", "payload": {
                    "agentId": agent,
                    "timestamp": jiff::Timestamp::now().to_string(),
                    "notification": {"op": "append", "seq": 3, "field": "text",
                                     "text": format!("chunk {chunk} @{}\n", now_ns())},
                }});
                let _ = tx.send(Utf8Bytes::from(message.to_string()));
            }
        });
        tokio::task::spawn_blocking(move || producer.join())
            .await?
            .map_err(|_| anyhow!("the producer thread panicked"))?;
        // The clients leave once they have everything; give them the time to.
        tokio::time::sleep(WAIT).await;
        server.abort();
        anyhow::Ok(())
    })
}

async fn bare_upgrade(
    ws: WebSocketUpgrade,
    State(bare): State<Arc<Bare>>,
) -> axum::response::Response {
    ws.on_upgrade(move |socket| bare_session(socket, bare))
}

async fn bare_session(mut socket: WebSocket, bare: Arc<Bare>) {
    let mut events = bare.tx.subscribe();
    // The client's first message says it reads.
    match socket.recv().await {
        Some(Ok(_)) => {}
        _ => return,
    }
    if bare.ready.fetch_add(1, Ordering::SeqCst) + 1 == bare.clients {
        bare.go.notify_one();
    }
    loop {
        tokio::select! {
            event = events.recv() => {
                let text = match event {
                    Ok(text) => text,
                    Err(broadcast::error::RecvError::Lagged(n)) => Utf8Bytes::from(
                        json!({"type": "resync_required", "payload": {"reason": format!("fell {n} behind")}}).to_string(),
                    ),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if socket.send(AxumMessage::Text(text)).await.is_err() { return; }
            }
            frame = socket.recv() => match frame {
                Some(Ok(AxumMessage::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

// ---- 2. session_state -----------------------------------------------------------------------

/// Times from sending `hello`.
struct StateRound {
    welcome: Duration,
    first_byte: Duration,
    last_byte: Duration,
    bytes: usize,
}

fn state_bench(drover: &Path, home: &Path, root: &Path, rows: &mut Vec<Row>) -> Result<DaemonProc> {
    println!(
        "== 2. session_state with {STATE_AGENTS} agents in {STATE_WORKSPACES} workspaces \
         (raw WebSocket, {} connections, each closed before the next) ==",
        state_rounds()
    );
    let t = Instant::now();
    let stats = generate_fleet(
        home,
        STATE_WORKSPACES,
        STATE_AGENTS / STATE_WORKSPACES,
        0x5eed,
    )?;
    let _ = Command::new("sync").status();
    let live = stats.agents - stats.archived;
    println!(
        "  generated {} agents ({} archived, so {live} in session_state) + {} workspaces in {}",
        stats.agents,
        stats.archived,
        stats.workspaces,
        fmt_dur(t.elapsed())
    );
    let t = Instant::now();
    let daemon = DaemonProc::spawn(
        drover,
        home,
        &root.join("daemon-state.stderr"),
        Some(STATE_AGENTS),
        WAIT,
    )?;
    let booted = t.elapsed();
    let (rss_boot, _) = daemon.mem()?;
    println!(
        "  daemon booted in {} (VmRSS {})",
        fmt_dur(booted),
        fmt_kb(rss_boot)
    );
    let mut rounds = Vec::with_capacity(STATE_ROUNDS);
    let (mut rss_first, mut rss_settled) = (0, 0);
    for round in 0..state_rounds() {
        let (r, payload) = session_state_round(daemon.addr)?;
        if round == 0 {
            let state: Value = serde_json::from_slice(&payload)?;
            let agents = state["payload"]["agents"].as_array().map_or(0, Vec::len);
            let workspaces = state["payload"]["workspaces"]
                .as_array()
                .map_or(0, Vec::len);
            ensure!(
                agents == live && workspaces == STATE_WORKSPACES,
                "session_state lists {agents} agents and {workspaces} workspaces, expected {live} and {STATE_WORKSPACES}"
            );
        }
        // The daemon closes the socket before it frees what the session held (a write
        // buffer the size of the snapshot): read at the close, `VmRSS` would catch it half
        // the time.
        std::thread::sleep(STATE_SETTLE);
        let (rss_now, _) = daemon.mem()?;
        println!(
            "  #{}: welcome {}, session_state first byte {}, last byte {}, {}; daemon VmRSS {}",
            round + 1,
            fmt_dur(r.welcome),
            fmt_dur(r.first_byte),
            fmt_dur(r.last_byte),
            fmt_bytes(r.bytes as u64),
            fmt_kb(rss_now)
        );
        rounds.push(r);
        if round == 0 {
            rss_first = rss_now;
        }
        if round + 1 == STATE_SETTLED {
            rss_settled = rss_now;
        }
    }
    let (rss, hwm) = daemon.mem()?;
    println!(
        "  daemon VmRSS after the connections {} (VmHWM {})",
        fmt_kb(rss),
        fmt_kb(hwm)
    );
    // What a connection that stays open holds after its `session_state`.
    let mut held = Vec::with_capacity(STATE_HELD);
    for _ in 0..STATE_HELD {
        let (_, _, socket, _) = session_state_connection(daemon.addr)?;
        held.push(socket);
    }
    std::thread::sleep(Duration::from_millis(200));
    let (rss_held, _) = daemon.mem()?;
    let per_held = rss_held.saturating_sub(rss) / STATE_HELD as u64;
    println!(
        "  {STATE_HELD} connections kept open after their session_state: daemon VmRSS {} ({} each)",
        fmt_kb(rss_held),
        fmt_kb(per_held)
    );
    for socket in held {
        close_and_wait(socket)?;
    }
    std::thread::sleep(STATE_SETTLE);
    println!(
        "  … and once they are closed: daemon VmRSS {}",
        fmt_kb(daemon.mem()?.0)
    );
    // A reader that takes a little at a time (a phone): the daemon writes the message in
    // many small pieces.
    let (mut slow, mut slow_cpu) = (Vec::new(), Vec::new());
    for _ in 0..SLOW_ROUNDS {
        let cpu_before = threads_cpu_time(daemon.pid)?;
        slow.push(slow_session_state(daemon.addr)?);
        slow_cpu.push(threads_cpu_time(daemon.pid)?.saturating_sub(cpu_before));
    }
    println!(
        "  session_state to a slow reader ({} receive buffer, {} reads): last byte median {}, \
         daemon CPU median {} ({SLOW_ROUNDS} connections)",
        fmt_bytes(SLOW_RCVBUF as u64),
        fmt_bytes(SLOW_READ as u64),
        fmt_dur(median(&slow)),
        fmt_dur(median(&slow_cpu))
    );
    // The same agents as `session_state` (the target), and with archived ones too.
    let (mut listed, mut listed_all) = (Vec::new(), Vec::new());
    let (mut listed_bytes, mut all_bytes) = (0, 0);
    for _ in 0..LIST_ROUNDS {
        let (took, bytes) = list_agents_round(daemon.addr, false)?;
        listed.push(took);
        listed_bytes = bytes;
        let (took, bytes) = list_agents_round(daemon.addr, true)?;
        listed_all.push(took);
        all_bytes = bytes;
    }
    println!(
        "  list_agents of {live} agents ({}): to the last byte best {}, median {}; with the \
         archived ones ({STATE_AGENTS}, {}): best {}, median {} ({LIST_ROUNDS} connections each)",
        fmt_bytes(listed_bytes as u64),
        fmt_dur(listed.iter().copied().min().unwrap_or_default()),
        fmt_dur(median(&listed)),
        fmt_bytes(all_bytes as u64),
        fmt_dur(listed_all.iter().copied().min().unwrap_or_default()),
        fmt_dur(median(&listed_all))
    );
    let first: Vec<Duration> = rounds.iter().map(|r| r.first_byte).collect();
    let last: Vec<Duration> = rounds.iter().map(|r| r.last_byte).collect();
    let bytes = rounds.first().map_or(0, |r| r.bytes);
    println!();
    rows.push(Row::target(
        format!(
            "session_state, {}k agents: last byte (median)",
            STATE_AGENTS / 1000
        ),
        fmt_dur(median(&last)),
        format!("≤ {}", fmt_dur(STATE_TARGET)),
        median(&last) <= STATE_TARGET,
    ));
    let n = rounds.len();
    rows.push(Row::target(
        format!(
            "session_state, {}k agents: VmRSS growth over {n} snapshots (each connection closed)",
            STATE_AGENTS / 1000
        ),
        format!("{} → {}", fmt_kb(rss_first), fmt_kb(rss)),
        format!("≤ +{}", fmt_kb(STATE_RSS_SLACK_KB)),
        rss <= rss_first + STATE_RSS_SLACK_KB,
    ));
    rows.push(Row::target(
        format!(
            "session_state, {}k agents: VmRSS growth from snapshot #{STATE_SETTLED} to #{n} (it stops)",
            STATE_AGENTS / 1000
        ),
        format!("{} → {}", fmt_kb(rss_settled), fmt_kb(rss)),
        format!("≤ +{}", fmt_kb(STATE_PLATEAU_SLACK_KB)),
        rss <= rss_settled + STATE_PLATEAU_SLACK_KB,
    ));
    rows.push(Row::target(
        format!(
            "session_state, {}k agents: what an open connection holds after it",
            STATE_AGENTS / 1000
        ),
        format!("{} each ({STATE_HELD} open)", fmt_kb(per_held)),
        format!("≤ {}", fmt_kb(STATE_HELD_TARGET_KB)),
        per_held <= STATE_HELD_TARGET_KB,
    ));
    rows.push(Row::info(
        format!(
            "session_state, {}k agents: to a slow reader",
            STATE_AGENTS / 1000
        ),
        format!(
            "last byte {}, daemon CPU {} (medians of {SLOW_ROUNDS}; {} receive buffer, {} reads)",
            fmt_dur(median(&slow)),
            fmt_dur(median(&slow_cpu)),
            fmt_bytes(SLOW_RCVBUF as u64),
            fmt_bytes(SLOW_READ as u64)
        ),
    ));
    rows.push(Row::info(
        format!(
            "session_state, {}k agents: time to first byte",
            STATE_AGENTS / 1000
        ),
        format!(
            "best {}, median {} (last byte: median {})",
            fmt_dur(first.iter().copied().min().unwrap_or_default()),
            fmt_dur(median(&first)),
            fmt_dur(median(&last))
        ),
    ));
    rows.push(Row::target(
        format!(
            "list_agents, {}k agents (as session_state's): last byte (median)",
            STATE_AGENTS / 1000
        ),
        fmt_dur(median(&listed)),
        format!("≤ {}", fmt_dur(STATE_TARGET)),
        median(&listed) <= STATE_TARGET,
    ));
    rows.push(Row::info(
        format!(
            "list_agents, {}k agents with archived: last byte (median)",
            STATE_AGENTS / 1000
        ),
        format!(
            "{} ({})",
            fmt_dur(median(&listed_all)),
            fmt_bytes(all_bytes as u64)
        ),
    ));
    rows.push(Row::info(
        format!("session_state, {}k agents: size", STATE_AGENTS / 1000),
        format!(
            "{} ({live} agents, {:.0} B each)",
            fmt_bytes(bytes as u64),
            bytes as f64 / live.max(1) as f64
        ),
    ));
    rows.push(Row::info(
        format!("daemon VmRSS, {}k agents", STATE_AGENTS / 1000),
        format!(
            "{} after boot, {} after {n} session_states (VmHWM {})",
            fmt_kb(rss_boot),
            fmt_kb(rss),
            fmt_kb(hwm)
        ),
    ));
    Ok(daemon)
}

/// One connection: upgrade, `hello`, and the frames up to the end of `session_state`, over a
/// plain socket so that the first byte can be timed. Returns the figures and the payload.
/// The connection is closed, and the daemon has ended its session, when this returns.
fn session_state_round(addr: SocketAddr) -> Result<(StateRound, Vec<u8>)> {
    let (round, payload, socket, _) = session_state_connection(addr)?;
    close_and_wait(socket)?;
    Ok((round, payload))
}

/// Sends a close frame and reads until the daemon closes the connection: its session has
/// ended (and dropped what it held) when this returns.
fn close_and_wait(mut socket: TcpStream) -> Result<()> {
    // Close, code 1000, masked.
    let mask = [0x0fu8, 0x1e, 0x2d, 0x3c];
    let mut frame = vec![0x88, 0x82];
    frame.extend_from_slice(&mask);
    frame.extend([0x03u8, 0xe8].iter().enumerate().map(|(i, b)| b ^ mask[i]));
    socket.write_all(&frame)?;
    let mut chunk = vec![0u8; 1 << 16];
    let deadline = Instant::now() + WAIT;
    while socket.read(&mut chunk)? > 0 {
        ensure!(
            Instant::now() < deadline,
            "the daemon did not close the connection"
        );
    }
    Ok(())
}

/// On a connection that has read its `session_state`, `list_agents` (with archived agents if
/// asked): the time from the request's write to the last byte
/// of the answer, and its size.
fn list_agents_round(addr: SocketAddr, include_archived: bool) -> Result<(Duration, usize)> {
    let (_, _, mut socket, mut buf) = session_state_connection(addr)?;
    let request = if include_archived {
        &br#"{"type":"list_agents","requestId":"l","includeArchived":true}"#[..]
    } else {
        &br#"{"type":"list_agents","requestId":"l","includeArchived":false}"#[..]
    };
    let mask = [0x9au8, 0xbc, 0xde, 0xf0];
    #[expect(clippy::cast_possible_truncation)] // under 126 bytes: the one length byte
    let mut frame = vec![0x81, 0x80 | request.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(request.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    let start = Instant::now();
    socket.write_all(&frame)?;
    let mut chunk = vec![0u8; 1 << 18];
    let mut pos = 0;
    loop {
        while let Some(message) = message_at(&buf, pos)? {
            if message.payload.starts_with(b"{\"type\":\"agents\"") {
                return Ok((start.elapsed(), message.payload.len()));
            }
            pos = message.end;
        }
        let n = socket.read(&mut chunk)?;
        ensure!(n > 0, "the daemon closed the connection before `agents`");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// As [`session_state_round`], also handing back the socket and what was read after the
/// `session_state` frame.
fn session_state_connection(addr: SocketAddr) -> Result<(StateRound, Vec<u8>, TcpStream, Vec<u8>)> {
    let mut socket = TcpStream::connect(addr)?;
    socket.set_nodelay(true)?;
    socket.set_read_timeout(Some(WAIT))?;
    write!(
        socket,
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut buf = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 1 << 18];
    let head_end = loop {
        let n = socket.read(&mut chunk)?;
        ensure!(n > 0, "the daemon closed the connection during the upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    ensure!(
        head.starts_with("HTTP/1.1 101"),
        "the upgrade was refused: {head}"
    );
    buf.drain(..head_end);

    let hello = br#"{"type":"hello","client":"drover-bench-protocol","protocolVersion":1}"#;
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    // The hello is under 126 bytes, so its length is the one length byte.
    #[expect(clippy::cast_possible_truncation)]
    let mut frame = vec![0x81, 0x80 | hello.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(hello.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    let start = Instant::now();
    socket.write_all(&frame)?;

    // (when, bytes received so far) after each read.
    let mut reads: Vec<(Duration, usize)> = vec![(Duration::ZERO, buf.len())];
    let mut pos = 0;
    let mut welcome = None;
    loop {
        // Complete messages at `pos`?
        while let Some(Whole { payload, end }) = message_at(&buf, pos)? {
            let arrived = |offset: usize| {
                reads
                    .iter()
                    .find(|(_, total)| *total > offset)
                    .map_or(Duration::ZERO, |(at, _)| *at)
            };
            if payload.starts_with(b"{\"type\":\"welcome\"") {
                welcome = Some(arrived(pos));
            } else if payload.starts_with(b"{\"type\":\"session_state\"") {
                let round = StateRound {
                    welcome: welcome.ok_or_else(|| anyhow!("session_state before welcome"))?,
                    first_byte: arrived(pos),
                    last_byte: arrived(end - 1),
                    bytes: payload.len(),
                };
                let rest = buf[end..].to_vec();
                return Ok((round, payload, socket, rest));
            } else if payload.starts_with(b"{\"type\":\"request_error\"") {
                bail!("hello refused: {}", String::from_utf8_lossy(&payload));
            }
            pos = end;
        }
        let n = socket.read(&mut chunk)?;
        ensure!(
            n > 0,
            "the daemon closed the connection before session_state"
        );
        buf.extend_from_slice(&chunk[..n]);
        reads.push((start.elapsed(), buf.len()));
    }
}

/// The CPU time of all of a process's threads, to the nanosecond (`/proc/PID/task/*/schedstat`;
/// `/proc/PID/stat` counts 10 ms ticks).
fn threads_cpu_time(pid: u32) -> Result<Duration> {
    let mut total = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = fs::read_to_string(task?.path().join("schedstat")) else {
            continue; // a thread that ended
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .ok_or_else(|| anyhow!("odd schedstat: {stat}"))?;
    }
    Ok(Duration::from_nanos(total))
}

/// Upgrade, `hello`, and `session_state` read `SLOW_READ` bytes at a time through a receive
/// buffer of `SLOW_RCVBUF`: the time from the `hello` to its last byte.
fn slow_session_state(addr: SocketAddr) -> Result<Duration> {
    use std::os::fd::AsRawFd as _;
    let mut socket = TcpStream::connect(addr)?;
    let size = libc::c_int::try_from(SLOW_RCVBUF)?;
    // SAFETY: setsockopt on a socket this function owns, with a c_int the size it says.
    #[expect(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            std::ptr::from_ref(&size).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())?,
        )
    };
    ensure!(
        rc == 0,
        "cannot set SO_RCVBUF: {}",
        std::io::Error::last_os_error()
    );
    socket.set_read_timeout(Some(WAIT))?;
    write!(
        socket,
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; SLOW_READ];
    let head_end = loop {
        let n = socket.read(&mut chunk)?;
        ensure!(n > 0, "the daemon closed the connection during the upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    ensure!(buf.starts_with(b"HTTP/1.1 101"), "the upgrade was refused");
    buf.drain(..head_end);
    let hello = br#"{"type":"hello","client":"drover-bench-protocol","protocolVersion":1}"#;
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81, 0x80 | u8::try_from(hello.len())?];
    frame.extend_from_slice(&mask);
    frame.extend(hello.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    let start = Instant::now();
    socket.write_all(&frame)?;
    // Frames are joined as they come: the message is read once.
    let (mut pos, mut message) = (0, Vec::new());
    loop {
        while let Some((header, len, _)) = frame_at(&buf[pos..]) {
            if buf.len() < pos + header + len {
                break;
            }
            let fin = buf[pos] & 0x80 != 0;
            message.extend_from_slice(&buf[pos + header..pos + header + len]);
            pos += header + len;
            if fin {
                if message.starts_with(b"{\"type\":\"session_state\"") {
                    let took = start.elapsed();
                    close_and_wait(socket)?;
                    return Ok(took);
                }
                message.clear();
            }
        }
        let n = socket.read(&mut chunk)?;
        ensure!(
            n > 0,
            "the daemon closed the connection before session_state"
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A text message the daemon sent, whole: its payload (its fragments joined) and where in the
/// buffer its last frame ends.
struct Whole {
    payload: Vec<u8>,
    end: usize,
}

/// The text message whose first frame is at `pos` in `buf`, once all its frames are in
/// (RFC 6455 §5.4: a text frame without FIN, continuation frames, the last with FIN). Only the
/// headers are read until then, so a caller may ask after every read.
fn message_at(buf: &[u8], mut pos: usize) -> Result<Option<Whole>> {
    let mut parts = Vec::new();
    loop {
        let Some((header, len, opcode)) = frame_at(&buf[pos..]) else {
            return Ok(None);
        };
        if buf.len() < pos + header + len {
            return Ok(None);
        }
        let expected = u8::from(parts.is_empty());
        ensure!(
            opcode == expected,
            "unexpected frame with opcode {opcode} (expected {expected})"
        );
        let fin = buf[pos] & 0x80 != 0;
        parts.push(pos + header..pos + header + len);
        pos += header + len;
        if fin {
            let mut payload = Vec::with_capacity(parts.iter().map(ExactSizeIterator::len).sum());
            for part in parts {
                payload.extend_from_slice(&buf[part]);
            }
            return Ok(Some(Whole { payload, end: pos }));
        }
    }
}

/// `(header length, payload length, opcode)` of an unmasked server frame, once its header is in.
fn frame_at(buf: &[u8]) -> Option<(usize, usize, u8)> {
    let (&b0, &b1) = (buf.first()?, buf.get(1)?);
    let opcode = b0 & 0x0f;
    match b1 & 0x7f {
        126 => Some((
            4,
            u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize,
            opcode,
        )),
        127 => {
            let bytes: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            Some((10, usize::try_from(u64::from_be_bytes(bytes)).ok()?, opcode))
        }
        n => Some((2, n as usize, opcode)),
    }
}

// ---- 3. drover ls ---------------------------------------------------------------------------

// Counting the newlines of a few KB of output needs no bytecount dependency.
#[expect(clippy::naive_bytecount)]
fn ls_bench(drover: &Path, home: &Path, rows: &mut Vec<Row>) -> Result<()> {
    println!(
        "== 3. `drover ls` with {STATE_AGENTS} agents (best of {LS_ROUNDS}, output to a pipe) =="
    );
    let target = format!("< {}", fmt_dur(LS_TARGET));
    let probe = Command::new(drover)
        .args(["ls", "--help"])
        .env("DROVER_HOME", home)
        .output()
        .with_context(|| format!("cannot run `{}`", drover.display()))?;
    if !probe.status.success() {
        let why = String::from_utf8_lossy(&probe.stderr)
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string();
        println!(
            "  SKIP: `drover ls --help` failed ({}): {why}",
            probe.status
        );
        println!();
        for variant in ["--json", "(table)"] {
            rows.push(Row::skip(
                format!("drover ls {variant}, {}k agents", STATE_AGENTS / 1000),
                "this drover has no `ls` yet".to_string(),
                &target,
            ));
        }
        return Ok(());
    }
    for (variant, args) in [("--json", &["ls", "--json"][..]), ("(table)", &["ls"][..])] {
        let mut times = Vec::with_capacity(LS_ROUNDS);
        let mut out_bytes = 0;
        let mut lines = 0;
        for _ in 0..LS_ROUNDS {
            let t = Instant::now();
            let out = Command::new(drover)
                .args(args)
                .env("DROVER_HOME", home)
                .stdin(Stdio::null())
                .output()?;
            times.push(t.elapsed());
            ensure!(
                out.status.success(),
                "`drover {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            out_bytes = out.stdout.len();
            lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
        }
        let best = times.iter().copied().min().unwrap_or_default();
        println!(
            "  drover {}: best {}, median {}; {} on stdout, {lines} lines",
            args.join(" "),
            fmt_dur(best),
            fmt_dur(median(&times)),
            fmt_bytes(out_bytes as u64)
        );
        rows.push(Row::target(
            format!("drover ls {variant}, {}k agents", STATE_AGENTS / 1000),
            format!("{} (median {})", fmt_dur(best), fmt_dur(median(&times))),
            &target,
            best < LS_TARGET,
        ));
    }
    println!();
    Ok(())
}
