//! `drover-bench-schedules`: 10,000 armed schedules in a real `drover daemon` process.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target.
//!
//! - **idle CPU**: 10,000 schedules armed (every day, none due during the bench); the daemon's
//!   CPU time (user + system, all threads, `/proc/PID/stat`) over 10 s. Target ≈ 0 (≤ 1 %):
//!   the timer sleeps until the earliest due time, it does not tick over the schedules.
//! - **delay**: 200 `once` schedules due 25 ms apart, beside the 10,000; for each, the delay
//!   from its due time to its delivery (`firedAt` − `dueAt` of its run: `firedAt` is taken once
//!   the prompt is durably queued), and to the client hearing of it (`schedule_update`).
//!   Target p99 ≤ 50 ms (the first).
//!
//! Binaries, scratch and `DROVER_BENCH_KEEP` as in the other benches (`scripts/bench`).

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use drover_bench::{
    self as bench, Row, ScriptedHome, fmt_dur, fmt_kb, quantile, recv_json, send_json,
};
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

const ARMED: usize = 10_000;
const PROBES: usize = 200;
const PROBE_GAP_MS: i64 = 25;
const IDLE: Duration = Duration::from_secs(10);
const TARGET_CPU_PERCENT: f64 = 1.0;
const TARGET_P99: Duration = Duration::from_millis(50);
const WAIT: Duration = Duration::from_secs(60);
/// Requests in flight while arming.
const WINDOW: usize = 128;

fn main() -> ExitCode {
    bench::block_on("drover-bench-schedules", Some(2), run())
}

/// A non-negative duration in nanoseconds (what `quantile` sorts).
fn nanos(d: SignedDuration) -> u64 {
    u64::try_from(d.as_nanos().max(0)).unwrap_or(u64::MAX)
}

async fn run() -> Result<()> {
    let setup = ScriptedHome::new("drover-bench-schedules")?;
    let (cwd, started) = (&setup.cwd, setup.started);
    let daemon = setup.spawn_daemon(WAIT)?;
    let mut ws = daemon.connect("drover-bench-schedules").await?;
    let created = bench::request(
        &mut ws,
        json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "prompt": "say ready"}),
        "c".into(),
    )
    .await?;
    let agent = created["payload"]["agent"]["id"]
        .as_str()
        .context("no agent id")?
        .to_string();

    // Arm 10,000, a window of requests in flight.
    let arming = Instant::now();
    let mut sent = 0;
    let mut answered = 0;
    while answered < ARMED {
        while sent < ARMED && sent - answered < WINDOW {
            send_json(
                &mut ws,
                &json!({"type": "create_schedule", "requestId": format!("a{sent}"), "agentId": agent,
                        "prompt": "say daily", "when": {"everySeconds": 86_400}}),
            )
            .await?;
            sent += 1;
        }
        let m = recv_json(&mut ws).await?;
        match m["type"].as_str() {
            Some("schedule") => answered += 1,
            Some("request_error") => bail!("create_schedule failed: {m}"),
            _ => {}
        }
    }
    let armed_in = arming.elapsed();
    // Let the last events and writes settle before measuring the quiet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_armed = daemon.mem()?.0;

    // Idle: no schedule due; read the daemon's CPU over 10 s (the client reads nothing).
    let cpu_before = bench::proc_cpu_time(daemon.pid)?;
    let idle_start = Instant::now();
    tokio::time::sleep(IDLE).await;
    let cpu = bench::proc_cpu_time(daemon.pid)?.saturating_sub(cpu_before);
    let idle_wall = idle_start.elapsed();
    let cpu_percent = cpu.as_secs_f64() / idle_wall.as_secs_f64() * 100.0;

    // Probes: once schedules due 25 ms apart, starting 2 s from now.
    let first = Timestamp::now() + SignedDuration::from_secs(2);
    let mut probes: HashMap<String, Timestamp> = HashMap::new();
    for i in 0..PROBES {
        let due = first + SignedDuration::from_millis(PROBE_GAP_MS * i64::try_from(i)?);
        let answer = bench::request(
            &mut ws,
            json!({"type": "create_schedule", "agentId": agent, "prompt": "say probe",
                   "when": {"at": due.to_string()}}),
            format!("p{i}"),
        )
        .await?;
        let id = answer["payload"]["schedule"]["id"]
            .as_str()
            .context("no schedule id")?
            .to_string();
        probes.insert(id, due);
    }
    let mut delivered = Vec::new();
    let mut heard = Vec::new();
    let deadline = Instant::now() + WAIT;
    while delivered.len() < PROBES {
        if Instant::now() > deadline {
            bail!("only {} of {PROBES} probes fired", delivered.len());
        }
        let m = recv_json(&mut ws).await?;
        if m["type"] != "schedule_update" {
            continue;
        }
        let Some(due) = m["payload"]["scheduleId"]
            .as_str()
            .and_then(|id| probes.get(id).copied())
        else {
            continue;
        };
        let schedule = &m["payload"]["schedule"];
        if schedule["state"] != "finished" {
            continue;
        }
        let run = &schedule["runs"][0];
        if let Some(error) = run["error"].as_str() {
            bail!("a probe failed: {error}");
        }
        let fired: Timestamp = run["firedAt"]
            .as_str()
            .context("no firedAt")?
            .parse()
            .context("firedAt")?;
        delivered.push(nanos(fired.duration_since(due)));
        heard.push(nanos(Timestamp::now().duration_since(due)));
    }
    delivered.sort_unstable();
    heard.sort_unstable();
    let p50 = quantile(&delivered, 0.5);
    let p99 = quantile(&delivered, 0.99);
    let max = quantile(&delivered, 1.0);
    let heard_p99 = quantile(&heard, 0.99);
    let rss_after = daemon.mem()?.0;
    drop(ws);
    daemon.stop()?;

    let rows = vec![
        Row::info(
            format!("arm {ARMED} schedules (create_schedule, {WINDOW} in flight)"),
            format!(
                "{} ({:.0}/s)",
                fmt_dur(armed_in),
                f64::from(u32::try_from(ARMED)?) / armed_in.as_secs_f64()
            ),
        ),
        Row::info(format!("RSS with {ARMED} armed"), fmt_kb(rss_armed)),
        Row::target(
            format!(
                "daemon CPU over {}s, {ARMED} armed, none due",
                IDLE.as_secs()
            ),
            format!("{cpu_percent:.2} % ({})", fmt_dur(cpu)),
            format!("≤ {TARGET_CPU_PERCENT} %"),
            cpu_percent <= TARGET_CPU_PERCENT,
        ),
        Row::info(
            format!("due → durably queued, p50 ({PROBES} probes)"),
            fmt_dur(p50),
        ),
        Row::target(
            format!("due → durably queued, p99 ({PROBES} probes, {PROBE_GAP_MS} ms apart)"),
            fmt_dur(p99),
            format!("≤ {}", fmt_dur(TARGET_P99)),
            p99 <= TARGET_P99,
        ),
        Row::info("due → durably queued, max", fmt_dur(max)),
        Row::info(
            "due → client told (schedule_update), p99",
            fmt_dur(heard_p99),
        ),
        Row::info("RSS after the probes", fmt_kb(rss_after)),
    ];
    bench::print_summary(&rows, started);
    Ok(())
}
