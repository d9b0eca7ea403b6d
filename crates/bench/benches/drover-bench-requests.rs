//! `drover-bench-requests`: what 100,000 `wait_idle` requests leave in the daemon's memory.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. The
//! daemon is the real `drover daemon` process on 127.0.0.1, with the scripted agent as provider;
//! one agent runs a turn that never ends, so no `wait_idle` for it answers by itself.
//!
//! - **one connection**: 100,000 `wait_idle` sent back to back on one connection; the daemon
//!   holds at most its bound (256) and answers the rest `too_many_requests`. RSS is read while
//!   they are in flight and after the connection closed.
//! - **many connections**: 400 connections, each sending 250 `wait_idle` (under the bound) and
//!   closing without waiting: another 100,000, every one cancelled by its connection's end.
//!
//! Target: the daemon's RSS once the clients left is within 10 MB of what it was before them.
//!
//! Binaries, scratch and `DROVER_BENCH_KEEP` as in the other benches (`scripts/bench`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use drover_bench::{self as bench, DaemonProc, Row, ScriptedHome, fmt_kb, recv_json, send_json};
use serde_json::json;

const REQUESTS: usize = 100_000;
const CONNECTIONS: usize = 400;
const BOUND: usize = 256;
const TARGET_KB: u64 = 10 * 1024;
const WAIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    bench::block_on("drover-bench-requests", Some(2), run())
}

/// How the bench's clients name themselves in `hello`.
const CLIENT: &str = "drover-bench-requests";

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

async fn run() -> Result<()> {
    let setup = ScriptedHome::new("drover-bench-requests")?;
    let (cwd, started) = (&setup.cwd, setup.started);
    let daemon = setup.spawn_daemon(WAIT)?;
    let mut ws = daemon.connect(CLIENT).await?;
    send_json(
        &mut ws,
        &json!({"type": "create_agent", "requestId": "c", "provider": "scripted", "cwd": cwd, "prompt": "sleep 3600000"}),
    )
    .await?;
    let agent = loop {
        let m = recv_json(&mut ws).await?;
        if m["type"] == "agent_created" {
            break m["payload"]["agent"]["id"]
                .as_str()
                .context("no agent id")?
                .to_string();
        }
        if m["type"] == "request_error" {
            bail!("create_agent failed: {m}");
        }
    };
    let wait_idle = |n: usize| json!({"type": "wait_idle", "requestId": format!("w{n}"), "agentId": agent, "timeoutMs": 3_600_000});
    let before = settled_rss(&daemon).await?;

    // One connection, 100,000 requests.
    let mut one = daemon.connect(CLIENT).await?;
    // In batches, reading the refusals between them: a client that never reads would stall
    // its own socket.
    let mut refused = 0;
    for batch in 0..REQUESTS / 1000 {
        for n in 0..1000 {
            send_json(&mut one, &wait_idle(batch * 1000 + n)).await?;
        }
        while refused < (batch + 1) * 1000 - BOUND {
            let m = recv_json(&mut one).await?;
            if m["type"] == "request_error" && m["payload"]["code"] == "too_many_requests" {
                refused += 1;
            } else if m["type"] == "request_error" || m["type"] == "idle" {
                bail!("unexpected answer: {m}");
            }
        }
    }
    let during = daemon.mem()?.0;
    drop(one);
    let after_one = settled_rss(&daemon).await?;

    // Many connections, 250 requests each, closed with them in flight.
    for c in 0..CONNECTIONS {
        let mut conn = daemon.connect(CLIENT).await?;
        for n in 0..REQUESTS / CONNECTIONS {
            send_json(&mut conn, &wait_idle(c * 1000 + n)).await?;
        }
        drop(conn);
    }
    let after_many = settled_rss(&daemon).await?;

    let rows = vec![
        Row::info("RSS before", fmt_kb(before)),
        Row::info(
            format!("RSS with {BOUND} in flight, {refused} refused (one connection)"),
            fmt_kb(during),
        ),
        Row::target(
            format!("RSS after {REQUESTS} wait_idle on one connection, closed"),
            fmt_kb(after_one),
            format!("< before + {}", fmt_kb(TARGET_KB)),
            after_one <= before + TARGET_KB,
        ),
        Row::target(
            format!("RSS after {REQUESTS} wait_idle on {CONNECTIONS} connections, closed"),
            fmt_kb(after_many),
            format!("< before + {}", fmt_kb(TARGET_KB)),
            after_many <= before + TARGET_KB,
        ),
    ];
    drop(ws);
    daemon.stop()?;
    bench::print_summary(&rows, started);
    Ok(())
}
