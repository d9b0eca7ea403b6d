//! The web UI in headless Chromium against the release daemon: with 2,000 agents in 50
//! workspaces and 10 agents streaming 25 chunks/s each, the time from navigation to the
//! sidebar rendered (target ≤ 500 ms), the longest main-thread task while streaming into an
//! open tab for 20 s (target < 50 ms), and the page's JS heap while the streaming goes on
//! (target: flat). `DROVER_UI_BENCH_MEMORY_SECS` sets how long the heap is watched (default
//! 60; 600 for the ten minutes). Needs Debian's `chromium` and
//! `scripts/install-ui-tests`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use drover_bench::fleet_gen::generate_fleet;
use drover_bench::{
    DaemonProc, Row, drover_binary, fmt_bytes, load_average, print_summary, recv_json, request,
    scratch, scripted_agent_binary, send_json, ws_connect,
};
use serde_json::{Value, json};

const WORKSPACES: usize = 50;
const PER_WORKSPACE: usize = 40;
const STREAMING: usize = 10;
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
        .unwrap_or(60);
    println!(
        "== drover-bench-ui: {} agents in {WORKSPACES} workspaces, {STREAMING} streaming 25 chunks/s; load {} ==",
        WORKSPACES * PER_WORKSPACE,
        load_average()
    );
    let node_modules = repo().join(".ui-tests/node_modules");
    ensure!(
        node_modules.join("playwright-core").exists(),
        "run scripts/install-ui-tests first"
    );
    ensure!(
        Path::new("/usr/bin/chromium").exists(),
        "install Debian's chromium (apt-get install -y chromium)"
    );
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
    send_json(
        &mut ws,
        &json!({"type": "hello", "client": "drover-bench-ui", "protocolVersion": 1, "token": token}),
    )
    .await?;
    let state_msg = loop {
        let m = recv_json(&mut ws).await?;
        if m["type"] == "session_state" {
            break m;
        }
        ensure!(m["type"] != "request_error", "hello refused: {m}");
    };
    let roots = state_msg["payload"]["agents"].as_array().map_or(0, |a| {
        a.iter().filter(|a| a["parentAgentId"].is_null()).count()
    });
    // The streaming agents: one chunk every 40 ms for the whole run.
    let chunks = (STREAM_SECS + memory_secs + 30) * 1000 / CHUNK_MS;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let mut streaming = Vec::new();
    for i in 0..STREAMING {
        let answer = request(
            &mut ws,
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "title": format!("streamer {i}"),
                   "prompt": format!("stream {chunks} {CHUNK_MS}")}),
            format!("c{i}"),
        )
        .await?;
        streaming.push(
            answer["payload"]["agent"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let args = json!({
        "url": url, "token": token, "rows": roots + STREAMING, "open": streaming[0],
        "streamMs": STREAM_SECS * 1000, "memoryMs": memory_secs * 1000,
    });
    let out = Command::new("node")
        .arg(repo().join("crates/bench/ui/bench.mjs"))
        .env("DROVER_UI_ARGS", args.to_string())
        .env("DROVER_UI_NODE_MODULES", &node_modules)
        .output()
        .context("cannot run node")?;
    ensure!(
        out.status.success(),
        "the browser half failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Value = serde_json::from_slice(&out.stdout).context("the browser's figures")?;
    drop(ws);
    daemon.stop()?;
    println!();
    print_summary(&rows(&figures, stats.agents, memory_secs), started);
    Ok(())
}

/// The summary's rows from the browser's figures.
fn rows(figures: &Value, agents: usize, memory_secs: u64) -> Vec<Row> {
    let ms = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let sidebar = ms(&figures["sidebarMs"]);
    let longest = ms(&figures["longest"]);
    let samples: Vec<f64> = figures["samples"]
        .as_array()
        .map(|s| s.iter().map(ms).collect())
        .unwrap_or_default();
    let first = samples.first().copied().unwrap_or(f64::NAN);
    let last = samples.last().copied().unwrap_or(f64::NAN);
    // Flat: the heap after GC grows by less than a fifth (and 2 MB) over the window.
    let flat = last <= first * 1.2 + 2e6;
    let fmt_heap = |b: f64| {
        // Byte counts of a browser heap fit u64 and are never negative.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        fmt_bytes(b as u64)
    };
    vec![
        Row::info(
            "agents (roots in the sidebar)",
            format!("{} ({} rows shown)", agents + STREAMING, figures["rows"]),
        ),
        Row::target(
            "navigation to sidebar rendered",
            format!("{sidebar:.0} ms"),
            "≤ 500 ms",
            sidebar <= 500.0,
        ),
        Row::info(
            "of which the page: session_state to sidebar drawn",
            format!("{:.0} ms", ms(&figures["renderMs"])),
        ),
        Row::info(
            "daemon messages in 3 s of streaming (a second socket)",
            figures["traffic"].to_string(),
        ),
        Row::target(
            format!("longest main-thread task, {STREAM_SECS} s streaming into a tab"),
            if longest > 0.0 {
                format!("{longest:.0} ms ({} long tasks)", figures["longTasks"])
            } else {
                "no task ≥ 50 ms".to_string()
            },
            "< 50 ms",
            longest < 50.0,
        ),
        Row::info(
            "longest gap between frames while streaming",
            format!("{:.0} ms", ms(&figures["gap"])),
        ),
        Row::target(
            format!("JS heap after GC over {memory_secs} s of streaming"),
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
            "flat (< +20 %)",
            flat,
        ),
        Row::info("DOM elements at the end", figures["dom"].to_string()),
    ]
}
