//! The web UI in headless Chromium against the release daemon, with 10,000 agents in 50
//! workspaces and 10 agents streaming 25 chunks/s each: the time from navigation to the
//! sidebar drawn (target ≤ 500 ms); then, with 25 more agents taking a short turn each second
//! (50 status changes a second, the storm), the filter's keystroke to paint (p95 ≤ 50 ms), the
//! longest main-thread task while a streaming tab is open (target < 50 ms), and the page's JS
//! heap over the streaming (target: flat within 10 %). `DROVER_UI_BENCH_MEMORY_SECS` sets how
//! long the heap is watched (default 600, the ten minutes); with
//! `DROVER_UI_BENCH_HEAP_DIFF=1` it also prints what grew over that time, by constructor;
//! `DROVER_UI_BENCH_PROFILE=1` prints the functions that took the page's time until its first
//! sidebar, and `DROVER_UI_BENCH_TRACE=FILE` writes a Chromium trace of it (for a trace
//! viewer). Needs Debian's `chromium` and `scripts/install-ui-tests`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use drover_bench::fleet_gen::generate_fleet;
use drover_bench::{
    DaemonProc, Row, drover_binary, fmt_bytes, load_average, print_summary, recv_json, request,
    scratch, scripted_agent_binary, send_json, ws_connect,
};
use serde_json::{Value, json};

const WORKSPACES: usize = 50;
const PER_WORKSPACE: usize = 200;
const STREAMING: usize = 10;
/// Agents sent a short prompt each second: a turn's start and end, two status changes each.
const STORMING: usize = 25;
/// 25 chunks a second: one every 40 ms.
const CHUNK_MS: u64 = 40;
const STREAM_SECS: u64 = 20;

fn main() -> ExitCode {
    drover_bench::block_on("drover-bench-ui", None, run())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn run() -> Result<()> {
    let started = Instant::now();
    let memory_secs: u64 = std::env::var("DROVER_UI_BENCH_MEMORY_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    println!(
        "== drover-bench-ui: {} agents in {WORKSPACES} workspaces, {STREAMING} streaming 25 chunks/s, {STORMING} taking a turn each second; load {} ==",
        WORKSPACES * PER_WORKSPACE,
        load_average()
    );
    let node_modules = browser_tools()?;
    let (dir, _keep) = scratch("drover-bench-ui-")?;
    let home = dir.path().join("home");
    let stats = generate_fleet(&home, WORKSPACES, PER_WORKSPACE, 0x0b5e)?;
    let state = dir.path().join("agent-state");
    std::fs::create_dir_all(&state)?;
    std::fs::write(
        home.join("config.toml"),
        drover_fakes::scripted_agent::provider_config(&scripted_agent_binary()?, &state),
    )?;
    let daemon = DaemonProc::spawn(
        &drover_binary()?,
        &home,
        &dir.path().join("daemon.stderr"),
        Some(stats.agents),
        Duration::from_secs(60),
    )?;
    let token = std::fs::read_to_string(home.join("token"))
        .ok()
        .map(|t| t.trim().to_string());
    let url = format!("http://{}/", daemon.addr);
    let mut ws = ws_connect(&format!("ws://{}/ws", daemon.addr)).await?;
    let (state_msg, state_ms) = session_state(&mut ws, token.as_deref()).await?;
    let state_bytes = state_msg.to_string().len();
    let roots = state_msg["payload"]["agents"].as_array().map_or(0, |a| {
        a.iter().filter(|a| a["parentAgentId"].is_null()).count()
    });
    // The streaming agents: one chunk every 40 ms for the whole run.
    let chunks = (STREAM_SECS + memory_secs + 30) * 1000 / CHUNK_MS;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let streaming = create_agents(
        &mut ws,
        &cwd,
        "streamer",
        &format!("stream {chunks} {CHUNK_MS}"),
        STREAMING,
    )
    .await?;
    let storming = create_agents(&mut ws, &cwd, "stormer", "say ready", STORMING).await?;
    // The storm starts once the page has drawn its first sidebar (the browser half says
    // `storm`), and goes on until the browser half ends.
    let (phase, phases) = tokio::sync::watch::channel(Phase::Calm);
    let storm = tokio::spawn(storm(
        format!("ws://{}/ws", daemon.addr),
        token.clone(),
        storming,
        phases,
    ));
    let args = json!({
        "url": url, "token": token, "rows": roots + STREAMING + STORMING, "open": streaming[0],
        "streamMs": STREAM_SECS * 1000, "memoryMs": memory_secs * 1000,
    });
    let browser = browser_half(&args, &node_modules, &phase).await;
    let _ = phase.send(Phase::Over);
    let turns = storm.await.context("the storm")??;
    let figures = browser?;
    drop(ws);
    daemon.stop()?;
    println!();
    let mut summary = rows(&figures, stats.agents, memory_secs, turns);
    summary.insert(
        3,
        Row::info(
            "session_state: its size, hello to its end read (a Rust client)",
            format!("{}, {state_ms:.0} ms", fmt_bytes(state_bytes as u64)),
        ),
    );
    print_summary(&summary, started);
    Ok(())
}

/// The test tooling's node modules, once it and Debian's chromium are there.
fn browser_tools() -> Result<PathBuf> {
    let node_modules = repo().join(".ui-tests/node_modules");
    ensure!(
        node_modules.join("playwright-core").exists(),
        "run scripts/install-ui-tests first"
    );
    ensure!(
        Path::new("/usr/bin/chromium").exists(),
        "install Debian's chromium (apt-get install -y chromium)"
    );
    Ok(node_modules)
}

/// Says `hello`: the `session_state` that answers it, and the milliseconds until it was read.
async fn session_state(ws: &mut drover_bench::Ws, token: Option<&str>) -> Result<(Value, f64)> {
    let hello_at = Instant::now();
    send_json(
        ws,
        &json!({"type": "hello", "client": "drover-bench-ui", "protocolVersion": 1, "token": token}),
    )
    .await?;
    loop {
        let m = recv_json(ws).await?;
        if m["type"] == "session_state" {
            return Ok((m, hello_at.elapsed().as_secs_f64() * 1000.0));
        }
        ensure!(m["type"] != "request_error", "hello refused: {m}");
    }
}

/// Creates `n` scripted agents in `cwd` titled `{title} {i}`, each with `prompt`; their ids.
async fn create_agents(
    ws: &mut drover_bench::Ws,
    cwd: &Path,
    title: &str,
    prompt: &str,
    n: usize,
) -> Result<Vec<String>> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let answer = request(
            ws,
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "title": format!("{title} {i}"), "prompt": prompt}),
            format!("{title}-{i}"),
        )
        .await?;
        ids.push(
            answer["payload"]["agent"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    Ok(ids)
}

/// Where the run is, for the storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Calm,
    Storm,
    Over,
}

/// Runs bench.mjs: tells `phase` when the page asks for the storm, and returns the figures of
/// its last line.
async fn browser_half(
    args: &Value,
    node_modules: &Path,
    phase: &tokio::sync::watch::Sender<Phase>,
) -> Result<Value> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let mut child = tokio::process::Command::new("node")
        .arg(repo().join("crates/bench/ui/bench.mjs"))
        .env("DROVER_UI_ARGS", args.to_string())
        .env("DROVER_UI_NODE_MODULES", node_modules)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run node")?;
    let mut stderr = child.stderr.take().context("node's stderr")?;
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().context("node's stdout")?).lines();
    let mut last = String::new();
    while let Some(line) = lines.next_line().await? {
        if line == "storm" {
            let _ = phase.send(Phase::Storm);
        } else {
            last = line;
        }
    }
    let status = child.wait().await?;
    let errors = errors.await.unwrap_or_default();
    ensure!(status.success(), "the browser half failed: {errors}");
    for line in errors
        .lines()
        .filter(|l| l.starts_with("heap grew") || l.starts_with("profile:"))
    {
        eprintln!("{line}");
    }
    serde_json::from_str(&last).context("the browser's figures")
}

/// Once `phase` says so, sends each of `agents` a short prompt every second until it says it
/// is over, over a socket of its own (its events read and dropped); returns how many prompts
/// it sent.
async fn storm(
    url: String,
    token: Option<String>,
    agents: Vec<String>,
    mut phase: tokio::sync::watch::Receiver<Phase>,
) -> Result<usize> {
    use futures_util::StreamExt;
    if *phase.wait_for(|p| *p >= Phase::Storm).await? == Phase::Over {
        return Ok(0);
    }
    let mut ws = ws_connect(&url).await?;
    send_json(
        &mut ws,
        &json!({"type": "hello", "client": "drover-bench-ui-storm", "protocolVersion": 1, "token": token}),
    )
    .await?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut sent = 0;
    // Bounded: the run's own length, and at most an hour of ticks.
    for _ in 0..3_600 {
        tokio::select! {
            changed = phase.changed() => if changed.is_err() || *phase.borrow() == Phase::Over { break },
            _ = tick.tick() => {
                for id in &agents {
                    sent += 1;
                    send_json(&mut ws, &json!({"type": "send_message", "agentId": id, "text": "say hi", "requestId": format!("m{sent}")})).await?;
                }
            }
            frame = ws.next() => if frame.is_none() { break },
        }
    }
    Ok(sent)
}

/// The summary's rows from the browser's figures.
fn rows(figures: &Value, agents: usize, memory_secs: u64, turns: usize) -> Vec<Row> {
    let ms = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let sidebar = ms(&figures["sidebarMs"]);
    let longest = ms(&figures["longest"]);
    let keys: Vec<f64> = figures["keystrokes"]
        .as_array()
        .map(|s| s.iter().map(ms).collect())
        .unwrap_or_default();
    let key_p95 = percentile(&keys, 0.95);
    let samples: Vec<f64> = figures["samples"]
        .as_array()
        .map(|s| s.iter().map(ms).collect())
        .unwrap_or_default();
    let first = samples.first().copied().unwrap_or(f64::NAN);
    let last = samples.last().copied().unwrap_or(f64::NAN);
    let flat = last <= first * 1.1;
    let fmt_heap = |b: f64| {
        // Byte counts of a browser heap fit u64 and are never negative.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        fmt_bytes(b as u64)
    };
    let statuses = figures["traffic"]["agent_status"].as_f64().unwrap_or(0.0) / 3.0;
    let mut rows = vec![
        Row::info(
            "agents (root rows in the sidebar's model)",
            format!(
                "{} ({} rows)",
                agents + STREAMING + STORMING,
                figures["rows"]
            ),
        ),
        Row::info(
            "the storm: prompts sent, agent_status a second (a second socket, 3 s)",
            format!("{turns}, {statuses:.0}/s"),
        ),
        Row::target(
            "navigation to sidebar drawn (before the storm)",
            format!("{sidebar:.0} ms"),
            "≤ 500 ms",
            sidebar <= 500.0,
        ),
        Row::info(
            "the same seen by the test driver (its round trips included)",
            format!("{:.0} ms", ms(&figures["driverMs"])),
        ),
    ];
    // Where the first sidebar's time went, after the driver's view of it.
    rows.extend(first_sidebar(figures));
    rows.extend([
        Row::target(
            format!("filter keystroke to paint, p95 of {}", keys.len()),
            format!(
                "{key_p95:.0} ms (median {:.0} ms, max {:.0} ms)",
                percentile(&keys, 0.5),
                percentile(&keys, 1.0)
            ),
            "≤ 50 ms",
            key_p95 <= 50.0,
        ),
        Row::info(
            "daemon messages in 3 s of streaming (a second socket)",
            figures["traffic"].to_string(),
        ),
        Row::target(
            format!(
                "longest main-thread task, {STREAM_SECS} s of the storm with a streaming tab open"
            ),
            if longest > 0.0 {
                format!("{longest:.0} ms ({} long tasks)", figures["longTasks"])
            } else {
                "no task ≥ 50 ms".to_string()
            },
            "< 50 ms",
            longest < 50.0,
        ),
        Row::info(
            "longest gap between frames meanwhile",
            format!("{:.0} ms", ms(&figures["gap"])),
        ),
        Row::info(
            "rows in the page meanwhile (of all in the model)",
            figures["domRows"].to_string(),
        ),
        Row::target(
            format!("JS heap after GC over {memory_secs} s of streaming and the storm"),
            format!(
                "{} → {} ({})",
                fmt_heap(first),
                fmt_heap(last),
                samples
                    .iter()
                    .map(|s| fmt_heap(*s))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "flat (< +10 %)",
            flat,
        ),
        Row::info("DOM elements at the end", figures["dom"].to_string()),
    ]);
    rows
}

/// What the page did until its first sidebar: its phases from navigation, and the tasks,
/// messages and frames that took its time.
fn first_sidebar(figures: &Value) -> Vec<Row> {
    let ms = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let phases = &figures["phases"];
    vec![
        Row::info(
            "its phases from navigation: modules run, socket made, open, session_state in, parsed, drawn",
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0} ({:.1} MB) / {:.0} / {:.0} ms",
                ms(&phases["dcl"]),
                ms(&phases["createdAt"]),
                ms(&phases["openAt"]),
                ms(&phases["stateAt"]),
                ms(&phases["bytes"]) / 1e6,
                ms(&figures["parsedAt"]),
                ms(&figures["sidebarMs"]),
            ),
        ),
        Row::info(
            "tasks ≥ 50 ms until then (start, duration)",
            phases["longTasks"].to_string(),
        ),
        Row::info(
            "messages handled in ≥ 2 ms until then (start, duration, type)",
            phases["handled"].to_string(),
        ),
        Row::info(
            "frames until then (start, duration)",
            phases["frames"].to_string(),
        ),
    ]
}

/// The `q` quantile of `values` (nearest rank), NaN when there are none.
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    // A rank within 0..len: never negative, never past the end.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
