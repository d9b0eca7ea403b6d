//! The issue-13 cases of `drover-bench-protocol`: fleets streaming to clients that parse every
//! message, and how fast a create is answered and its agent ready.
//!
//! Each case: `A` scripted agents each streaming `stream-stamped N 40` (a chunk every 40 ms,
//! stamped with the wall clock when the agent wrote it) to `C` clients that initialized every
//! agent and parse every frame as JSON. A chunk is delivered when a client finds its stamp in
//! an `item` or `append` (a joined `append` carries several). Per case: chunks delivered of
//! offered, end-to-end delay (arrival − stamp) p50/p95/p99 over every delivered chunk, the
//! daemon's CPU per delivered chunk, its `VmRSS`, and resyncs. `DROVER_BENCH_CASE_SECS` (default
//! 20) is how long each agent streams.
//!
//! The 50 × 50 case is made like the side-by-side run against Paseo (issue 27): light clients,
//! which find the stamps in each frame's text and parse one frame in 8 as JSON, and it runs
//! twice, with the daemon as it ships (a client that is behind gets what waits for it joined)
//! and with every kind of joining off (`DROVER_STREAM_WINDOW_MS=0`, `DROVER_STREAM_JOIN=0`).
//! Targets: ≥ 99 % of the chunks delivered with no resync, p99 ≤ 25 ms, and p99 at least 1.5×
//! better than with joining off. The runs alternate (on, off, three times each) and the p99s
//! compared are medians. The case runs at the machine's load, then with two busy processes
//! per CPU beside it (`DROVER_BENCH_BURN` sets how many; 0 runs only the first): joining can
//! only join what waits for a client, and at light load a client rarely has two chunks of one
//! agent waiting (they are 40 ms apart), so both modes send nearly the same messages; "chunks
//! per message" shows how much was joined, and the messages carrying text and all frames per
//! client show whether the two modes sent the same. The window stays in the daemon's
//! environment as the caller's shell says unless a run sets it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use drover_bench::{
    DaemonProc, Row, Ws, fmt_bytes, fmt_dur, fmt_kb, hello, median, now_ns, proc_cpu_time,
    quantile, recv_json, request, send_json, ws_connect,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;

const CHUNK_MS: u64 = 40;
/// Clients that parse every message.
const CASES: [(usize, usize); 3] = [(10, 1), (10, 10), (10, 50)];
/// Light clients (see the module's doc), with joining and without.
const LIGHT: (usize, usize) = (50, 50);
/// Runs of the light case with joining on, then off, in turn.
const LIGHT_PASSES: usize = 3;
/// A light client parses one message in this many as JSON.
const PARSE_ONE_IN: usize = 8;
const DELIVERED_TARGET: f64 = 0.99;
const P99_TARGET: Duration = Duration::from_millis(25);
/// p99 with joining off ÷ p99 as the daemon ships, at least.
const JOIN_GAIN_TARGET: f64 = 1.5;
/// The daemon's environment with every kind of joining off.
const JOINING_OFF: [(&str, &str); 2] = [
    ("DROVER_STREAM_WINDOW_MS", "0"),
    ("DROVER_STREAM_JOIN", "0"),
];
/// The daemon as it ships, whatever the caller's shell says.
const JOINING_ON: [(&str, &str); 1] = [("DROVER_STREAM_JOIN", "1")];
/// Clients on a slow link (see `Reader::Slow`), with joining and without.
const SLOW: (usize, usize) = (50, 10);
/// The slow link's rate, bytes a second, unless `DROVER_BENCH_LINK_KIB` says (KiB a second).
const SLOW_LINK_RATE: u64 = 128 * 1024;
/// A slow client's receive buffer.
const SLOW_LINK_RCVBUF: usize = 16 * 1024;
/// Runs of the slow-link case with joining on, then off, in turn.
const SLOW_PASSES: usize = 2;
const CREATES: usize = 20;
const CREATED_TARGET: Duration = Duration::from_millis(5);
/// The longest one case may take beyond its streaming time.
const SLACK: Duration = Duration::from_secs(60);

fn case_secs() -> u64 {
    std::env::var("DROVER_BENCH_CASE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(20)
}

/// How a case's clients read.
#[derive(Clone, Copy, PartialEq)]
enum Reader {
    /// Parses every message as JSON.
    Full,
    /// Finds the stamps in each message's text and parses one in `PARSE_ONE_IN` as JSON.
    Light,
    /// Reads as `Light` does, over a link of at most this many bytes a second with a
    /// `SLOW_LINK_RCVBUF` receive buffer: a phone on a mobile network.
    Slow(u64),
}

/// What one client read.
#[derive(Default)]
struct Read {
    delays: Vec<u64>,
    frames: usize,
    /// `agent_update` frames.
    updates: usize,
    /// Frames that carried at least one chunk.
    stamped: usize,
    resyncs: usize,
    /// Bytes of the frames' payloads.
    bytes: u64,
}

pub(crate) async fn fleet_bench(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    rows: &mut Vec<Row>,
    part: fn(&str) -> bool,
) -> Result<()> {
    let secs = case_secs();
    let chunks = usize::try_from(secs * 1000 / CHUNK_MS).unwrap_or(usize::MAX);
    if part("fleet") {
        println!(
            "== 4. fleets: agents × clients, each agent `stream-stamped {chunks} {CHUNK_MS}` ({secs} s), \
         clients parse every message =="
        );
    }
    for (agents, clients) in CASES.into_iter().filter(|_| part("fleet")) {
        let (f, rss) = run_case(
            drover,
            scripted,
            root,
            agents,
            clients,
            chunks,
            Reader::Full,
            &JOINING_ON,
            "",
        )
        .await?;
        let line = f.line(agents * chunks * clients, rss);
        println!("  {agents} × {clients}: {line}");
        rows.push(Row::info(
            format!("fleet {agents} agents × {clients} clients"),
            line,
        ));
    }
    if part("light") {
        println!(
            "== 4b. {} × {} light clients, joining on and off in turn ({LIGHT_PASSES} runs each), \
             at the machine's load, then with {} busy processes beside it ==",
            LIGHT.0,
            LIGHT.1,
            burners()
        );
        light_bench(drover, scripted, root, rows, chunks, 0).await?;
        if burners() > 0 {
            light_bench(drover, scripted, root, rows, chunks, burners()).await?;
        }
    }
    if part("slow") {
        slow_link_bench(drover, scripted, root, rows, chunks).await?;
    }
    println!();
    if part("creates") {
        create_bench(drover, scripted, root, rows).await?;
    }
    Ok(())
}

/// How many busy processes the loaded light case runs beside the daemon:
/// `DROVER_BENCH_BURN`, else two per CPU; 0 leaves the loaded case out.
fn burners() -> usize {
    std::env::var("DROVER_BENCH_BURN")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2 * drover_bench::cpus())
}

/// Processes that spin (`sh -c 'while :; do :; done'`) until dropped: the machine under load.
struct Burners(Vec<std::process::Child>);

impl Burners {
    fn start(n: usize) -> Result<Burners> {
        let mut burners = Burners(Vec::with_capacity(n));
        for _ in 0..n {
            burners.0.push(
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(std::process::Stdio::null())
                    .spawn()?,
            );
        }
        Ok(burners)
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The light case with joining on and off in turn (`LIGHT_PASSES` each), with `burn` busy
/// processes beside it; its rows.
async fn light_bench(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    rows: &mut Vec<Row>,
    chunks: usize,
    burn: usize,
) -> Result<()> {
    let load = if burn == 0 {
        "no added load".to_string()
    } else {
        format!("{burn} busy processes")
    };
    let _burners = Burners::start(burn)?;
    let (agents, clients) = LIGHT;
    let offered = agents * chunks * clients;
    // Interleaved, so that a change in the machine's load falls on both alike.
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for pass in 1..=LIGHT_PASSES {
        for (joining, env, runs) in [
            ("on ", &JOINING_ON[..], &mut on),
            ("off", &JOINING_OFF[..], &mut off),
        ] {
            let tag = format!("-light-{}-{burn}-{pass}", joining.trim());
            let (f, rss) = run_case(
                drover,
                scripted,
                root,
                agents,
                clients,
                chunks,
                Reader::Light,
                env,
                &tag,
            )
            .await?;
            println!(
                "  {agents} × {clients}, {load}, joining {joining} #{pass}: {}; load average {}",
                f.line(offered, rss),
                drover_bench::load_average()
            );
            runs.push(f);
        }
    }
    let p99 = |runs: &[CaseFigures]| median(&runs.iter().map(|f| f.p99).collect::<Vec<_>>());
    let (on_p99, off_p99) = (p99(&on), p99(&off));
    let what = format!("fleet {agents} × {clients}, light clients, {load}");
    let delivered = on.iter().map(|f| f.delivered).min().unwrap_or(0);
    let resyncs: usize = on.iter().map(|f| f.resyncs).sum();
    let share = delivered as f64 / offered.max(1) as f64;
    rows.push(Row::target(
        format!("{what}: delivered (least of {LIGHT_PASSES}), no resync"),
        format!("{:.1} %, {resyncs} resyncs", share * 100.0),
        format!("≥ {:.0} %, 0", DELIVERED_TARGET * 100.0),
        share >= DELIVERED_TARGET && resyncs == 0,
    ));
    rows.push(Row::target(
        format!("{what}: end-to-end p99 (median of {LIGHT_PASSES})"),
        fmt_dur(on_p99),
        format!("≤ {}", fmt_dur(P99_TARGET)),
        on_p99 <= P99_TARGET,
    ));
    let gain = off_p99.as_secs_f64() / on_p99.as_secs_f64().max(1e-9);
    rows.push(Row::target(
        format!("{what}: p99 joining off ÷ on"),
        format!("{} ÷ {} = {gain:.2}×", fmt_dur(off_p99), fmt_dur(on_p99)),
        format!("≥ {JOIN_GAIN_TARGET:.1}×"),
        gain >= JOIN_GAIN_TARGET,
    ));
    let per_message = |runs: &[CaseFigures]| {
        runs.iter().map(|f| f.delivered).sum::<usize>() as f64
            / runs.iter().map(|f| f.stamped).sum::<usize>().max(1) as f64
    };
    rows.push(Row::info(
        format!("{what}: chunks per message carrying text, on / off"),
        format!("{:.2} / {:.2}", per_message(&on), per_message(&off)),
    ));
    // What joining changed: when every client keeps up both modes send the same messages,
    // and the p99s differ only by the machine's noise.
    let per_client = |runs: &[CaseFigures]| {
        runs.iter().map(|f| f.stamped).sum::<usize>() / (runs.len() * clients).max(1)
    };
    let frames = |runs: &[CaseFigures]| {
        runs.iter().map(|f| f.frames).sum::<usize>() / (runs.len() * clients).max(1)
    };
    rows.push(Row::info(
        format!("{what}: per client, messages carrying text / all frames, on / off"),
        format!(
            "{} / {}, {} / {}",
            per_client(&on),
            frames(&on),
            per_client(&off),
            frames(&off)
        ),
    ));
    Ok(())
}

fn slow_link_rate() -> u64 {
    std::env::var("DROVER_BENCH_LINK_KIB")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&k| k > 0)
        .map_or(SLOW_LINK_RATE, |k| k * 1024)
}

/// Clients on a slow link, with joining on and off in turn (`SLOW_PASSES` each): what joining
/// is for. Such a client cannot take every message as it comes, so what waits for it is joined
/// (on) or sent one message at a time (off).
async fn slow_link_bench(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    rows: &mut Vec<Row>,
    chunks: usize,
) -> Result<()> {
    let (agents, clients) = SLOW;
    let rate = slow_link_rate();
    println!(
        "== 4c. {agents} × {clients} light clients on a slow link ({} a second, {} receive \
         buffer), joining on and off in turn ({SLOW_PASSES} runs each) ==",
        fmt_bytes(rate),
        fmt_bytes(SLOW_LINK_RCVBUF as u64)
    );
    let offered = agents * chunks * clients;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for pass in 1..=SLOW_PASSES {
        for (joining, env, runs) in [
            ("on ", &JOINING_ON[..], &mut on),
            ("off", &JOINING_OFF[..], &mut off),
        ] {
            let tag = format!("-slow-{}-{pass}", joining.trim());
            let (f, rss) = run_case(
                drover,
                scripted,
                root,
                agents,
                clients,
                chunks,
                Reader::Slow(rate),
                env,
                &tag,
            )
            .await?;
            println!(
                "  {agents} × {clients} on a slow link, joining {joining} #{pass}: {}; {} a client; \
                 load average {}",
                f.line(offered, rss),
                fmt_bytes(f.bytes / clients.max(1) as u64),
                drover_bench::load_average()
            );
            runs.push(f);
        }
    }
    let what = format!("fleet {agents} × {clients}, clients on a slow link");
    let least = |runs: &[CaseFigures]| runs.iter().map(|f| f.delivered).min().unwrap_or(0);
    let resyncs = |runs: &[CaseFigures]| runs.iter().map(|f| f.resyncs).sum::<usize>();
    let share = |n: usize| n as f64 * 100.0 / offered.max(1) as f64;
    rows.push(Row::target(
        format!("{what}: delivered (least of {SLOW_PASSES}), no resync"),
        format!(
            "{:.1} %, {} resyncs (off: {:.1} %, {} resyncs)",
            share(least(&on)),
            resyncs(&on),
            share(least(&off)),
            resyncs(&off)
        ),
        format!("≥ {:.0} %, 0", DELIVERED_TARGET * 100.0),
        share(least(&on)) >= DELIVERED_TARGET * 100.0 && resyncs(&on) == 0,
    ));
    let p99 = |runs: &[CaseFigures]| median(&runs.iter().map(|f| f.p99).collect::<Vec<_>>());
    let (on_p99, off_p99) = (p99(&on), p99(&off));
    let gain = off_p99.as_secs_f64() / on_p99.as_secs_f64().max(1e-9);
    rows.push(Row::target(
        format!("{what}: p99 joining off ÷ on (of what arrived)"),
        format!("{} ÷ {} = {gain:.1}×", fmt_dur(off_p99), fmt_dur(on_p99)),
        format!("≥ {JOIN_GAIN_TARGET:.1}×"),
        gain >= JOIN_GAIN_TARGET,
    ));
    let per_message = |runs: &[CaseFigures]| {
        runs.iter().map(|f| f.delivered).sum::<usize>() as f64
            / runs.iter().map(|f| f.stamped).sum::<usize>().max(1) as f64
    };
    rows.push(Row::info(
        format!("{what}: chunks per message carrying text, on / off"),
        format!("{:.2} / {:.2}", per_message(&on), per_message(&off)),
    ));
    Ok(())
}

/// A WebSocket to the daemon over a socket with a `SLOW_LINK_RCVBUF` receive buffer.
async fn slow_connect(addr: std::net::SocketAddr) -> Result<Ws> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(u32::try_from(SLOW_LINK_RCVBUF)?)?;
    let stream = socket.connect(addr).await?;
    let (ws, _) = tokio::time::timeout(
        drover_bench::WS_WAIT,
        tokio_tungstenite::client_async(
            format!("ws://{addr}/ws"),
            tokio_tungstenite::MaybeTlsStream::Plain(stream),
        ),
    )
    .await
    .map_err(|_| anyhow!("connecting to {addr} timed out"))??;
    Ok(ws)
}

/// Runs one case on a fresh daemon with `env`; its figures and the daemon's `VmRSS` at the end.
#[expect(clippy::too_many_arguments)] // one case, all of whose settings are printed
async fn run_case(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    agents: usize,
    clients: usize,
    chunks: usize,
    reader: Reader,
    env: &[(&str, &str)],
    tag: &str,
) -> Result<(CaseFigures, u64)> {
    let home = root.join(format!("fleet-{agents}x{clients}{tag}"));
    let cwd = home.join("work");
    std::fs::create_dir_all(&cwd)?;
    std::fs::write(
        home.join("config.toml"),
        drover_fakes::scripted_agent::provider_config(scripted, &home.join("agent-state")),
    )?;
    let daemon = DaemonProc::spawn_env(
        drover,
        &home,
        &root.join(format!("daemon-fleet-{agents}x{clients}{tag}.stderr")),
        None,
        SLACK,
        env,
    )?;
    let figures = fleet_case(&daemon, &cwd, agents, clients, chunks, reader).await;
    let (rss, _) = daemon.mem()?;
    daemon.stop()?;
    Ok((figures?, rss))
}

impl CaseFigures {
    fn line(&self, offered: usize, rss: u64) -> String {
        format!(
            "{} of {offered} ({:.1} %), {} frames, {} agent_updates ({:.2} chunks per message carrying text); p50 {} p95 {} p99 {}; \
             {:.1} µs CPU/chunk; VmRSS {}; {} resyncs",
            self.delivered,
            self.delivered as f64 * 100.0 / offered.max(1) as f64,
            self.frames,
            self.updates,
            self.delivered as f64 / self.stamped.max(1) as f64,
            fmt_dur(self.p50),
            fmt_dur(self.p95),
            fmt_dur(self.p99),
            self.cpu.as_secs_f64() * 1e6 / self.delivered.max(1) as f64,
            fmt_kb(rss),
            self.resyncs
        )
    }
}

struct CaseFigures {
    delivered: usize,
    updates: usize,
    stamped: usize,
    frames: usize,
    resyncs: usize,
    bytes: u64,
    p50: Duration,
    p95: Duration,
    p99: Duration,
    cpu: Duration,
}

async fn fleet_case(
    daemon: &DaemonProc,
    cwd: &Path,
    agents: usize,
    clients: usize,
    chunks: usize,
    reader: Reader,
) -> Result<CaseFigures> {
    let url = format!("ws://{}/ws", daemon.addr);
    let mut driver = ws_connect(&url).await?;
    hello(&mut driver, "drover-bench-fleet").await?;
    let mut ids = Vec::with_capacity(agents);
    for i in 0..agents {
        let answer = request(
            &mut driver,
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd}),
            format!("create-{i}"),
        )
        .await?;
        ids.push(id_of(&answer)?);
    }
    for (i, id) in ids.iter().enumerate() {
        request(
            &mut driver,
            json!({"type": "wait_idle", "agentId": id, "timeoutMs": 60_000}),
            format!("idle-{i}"),
        )
        .await?;
    }
    let mut sockets = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut ws = match reader {
            Reader::Slow(_) => slow_connect(daemon.addr).await?,
            Reader::Full | Reader::Light => ws_connect(&url).await?,
        };
        hello(&mut ws, "drover-bench-fleet").await?;
        for (i, id) in ids.iter().enumerate() {
            request(
                &mut ws,
                json!({"type": "initialize_agent_request", "agentId": id}),
                format!("init-{i}"),
            )
            .await?;
        }
        sockets.push(ws);
    }
    let per_client = agents * chunks;
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(u64::try_from(chunks).unwrap_or(u64::MAX) * CHUNK_MS)
        + SLACK;
    let cpu_before = proc_cpu_time(daemon.pid)?;
    let mut readers = JoinSet::new();
    for ws in sockets {
        readers.spawn(read_client(ws, per_client, deadline, reader));
    }
    for (i, id) in ids.iter().enumerate() {
        send_json(
            &mut driver,
            &json!({"type": "send_message", "agentId": id, "requestId": format!("go-{i}"),
                    "text": format!("stream-stamped {chunks} {CHUNK_MS}")}),
        )
        .await?;
    }
    // The driver reads too, so that its own session never backs up.
    let drain = tokio::spawn(async move {
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, driver.next()).await {
                Ok(Some(Ok(_))) => {}
                _ => break,
            }
        }
    });
    let mut delays = Vec::new();
    let (mut frames, mut updates, mut stamped, mut resyncs, mut bytes) = (0, 0, 0, 0, 0);
    while let Some(joined) = readers.join_next().await {
        let read = joined??;
        delays.extend(read.delays);
        frames += read.frames;
        updates += read.updates;
        stamped += read.stamped;
        resyncs += read.resyncs;
        bytes += read.bytes;
    }
    let cpu = proc_cpu_time(daemon.pid)?.saturating_sub(cpu_before);
    drain.abort();
    delays.sort_unstable();
    Ok(CaseFigures {
        delivered: delays.len(),
        updates,
        stamped,
        frames,
        resyncs,
        bytes,
        p50: quantile(&delays, 0.50),
        p95: quantile(&delays, 0.95),
        p99: quantile(&delays, 0.99),
        cpu,
    })
}

/// Reads as `reader` says until `expected` chunks arrived, the client is told to resync, or
/// the deadline.
async fn read_client(
    mut ws: Ws,
    expected: usize,
    deadline: tokio::time::Instant,
    reader: Reader,
) -> Result<Read> {
    let mut read = Read {
        delays: Vec::with_capacity(expected),
        ..Read::default()
    };
    let start = tokio::time::Instant::now();
    while read.delays.len() < expected {
        if let Reader::Slow(rate) = reader {
            // The link has carried `read.bytes` since the start: the next frame comes no
            // sooner than that many bytes take at `rate`.
            let busy = Duration::from_secs_f64(read.bytes as f64 / rate as f64);
            tokio::time::sleep_until((start + busy).min(deadline)).await;
        }
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => bail!("a client's connection failed: {e}"),
            Ok(None) | Err(_) => break,
        };
        let arrival = now_ns();
        let Message::Text(text) = frame else { continue };
        read.frames += 1;
        read.bytes += text.len() as u64;
        if reader != Reader::Full {
            if read.frames.is_multiple_of(PARSE_ONE_IN) {
                let _: Value = serde_json::from_str(&text)?;
            }
            // The daemon writes `type` first.
            if text.starts_with(r#"{"type":"agent_update""#) {
                read.updates += 1;
                let before = read.delays.len();
                for stamp in raw_stamps(&text) {
                    read.delays.push(arrival.saturating_sub(stamp));
                }
                read.stamped += usize::from(read.delays.len() > before);
            } else if text.starts_with(r#"{"type":"resync_required""#) {
                read.resyncs += 1;
                break;
            }
            continue;
        }
        let message: Value = serde_json::from_str(&text)?;
        match message["type"].as_str() {
            Some("agent_update") => {
                read.updates += 1;
                let n = &message["payload"]["notification"];
                let text = match n["op"].as_str() {
                    Some("append") => n["text"].as_str(),
                    Some("item") => n["item"]["data"]["text"].as_str(),
                    _ => None,
                };
                let before = read.delays.len();
                for stamp in text.into_iter().flat_map(stamps) {
                    read.delays.push(arrival.saturating_sub(stamp));
                }
                read.stamped += usize::from(read.delays.len() > before);
            }
            Some("resync_required") => {
                read.resyncs += 1;
                break;
            }
            _ => {}
        }
    }
    Ok(read)
}

/// The stamps of every `chunk <i> @<ns>` in a message as it came (JSON, not decoded).
fn raw_stamps(json: &str) -> impl Iterator<Item = u64> + '_ {
    json.split(" @").skip(1).filter_map(|rest| {
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    })
}

/// The stamps of every `chunk <i> @<ns>` line in a text.
fn stamps(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.lines().filter_map(|line| {
        let (_, ns) = line.rsplit_once(" @")?;
        ns.trim().parse().ok()
    })
}

fn id_of(answer: &Value) -> Result<String> {
    answer["payload"]["agent"]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("agent_created without an id: {answer}"))
}

/// `create_agent` → `agent_created`, and → the agent `idle` (process up, session open),
/// `CREATES` times one after the other on one session.
async fn create_bench(
    drover: &Path,
    scripted: &Path,
    root: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    println!("== 5. creates: {CREATES} scripted agents one after the other ==");
    let home = root.join("creates");
    let cwd = home.join("work");
    std::fs::create_dir_all(&cwd)?;
    std::fs::write(
        home.join("config.toml"),
        drover_fakes::scripted_agent::provider_config(scripted, &home.join("agent-state")),
    )?;
    let daemon = DaemonProc::spawn(
        drover,
        &home,
        &root.join("daemon-creates.stderr"),
        None,
        SLACK,
    )?;
    let url = format!("ws://{}/ws", daemon.addr);
    let mut ws = ws_connect(&url).await?;
    hello(&mut ws, "drover-bench-creates").await?;
    let mut created = Vec::with_capacity(CREATES);
    let mut ready = Vec::with_capacity(CREATES);
    for i in 0..CREATES {
        let t = Instant::now();
        let answer = request(
            &mut ws,
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd}),
            format!("create-{i}"),
        )
        .await?;
        created.push(t.elapsed());
        let id = id_of(&answer)?;
        loop {
            let message = recv_json(&mut ws).await?;
            if message["type"] == "agent_status"
                && message["payload"]["agent"]["id"] == id.as_str()
                && message["payload"]["agent"]["status"] == "idle"
            {
                break;
            }
            if t.elapsed() > SLACK {
                bail!("agent {id} never became idle");
            }
        }
        ready.push(t.elapsed());
    }
    daemon.stop()?;
    let (c, r) = (median(&created), median(&ready));
    println!(
        "  create → agent_created median {}, best {}; create → idle median {}, best {}",
        fmt_dur(c),
        fmt_dur(created.iter().copied().min().unwrap_or_default()),
        fmt_dur(r),
        fmt_dur(ready.iter().copied().min().unwrap_or_default())
    );
    println!();
    rows.push(Row::target(
        "create → agent_created (median)",
        fmt_dur(c),
        format!("≤ {}", fmt_dur(CREATED_TARGET)),
        c <= CREATED_TARGET,
    ));
    rows.push(Row::info(
        "create → agent ready: idle, process up and session open (median)",
        fmt_dur(r),
    ));
    Ok(())
}
