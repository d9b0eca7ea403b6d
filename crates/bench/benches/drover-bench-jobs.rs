//! `drover-bench-jobs`: a job writing 100 MB of output as fast as it can.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. The
//! daemon is the real `drover daemon` process on 127.0.0.1 with the scripted agent as the jobs'
//! owner; the clients are plain WebSocket clients, as a user's would be.
//!
//! - **baseline**: the same command with its output sent by the shell to a file (`… > file`),
//!   which is what `cat` to a file costs: the disk and the pipe, nothing else.
//! - **to disk**: `start_job` of the command; the time until the job ended (its `job_update`)
//!   over the 100 MB it wrote to its log.
//! - **to a follower**: one more client following the job's output from offset 0 with
//!   `follow_job`, the daemon pushing `job_output_update`s as the job writes, until the one
//!   with `eof`; the time from `start_job` to the last byte, and a check that every byte
//!   arrived once, in order.
//! - **memory**: the daemon's RSS, read every 20 ms while the job runs, against its RSS before.
//!
//! Targets: to disk and to the follower each at least 0.8× the baseline's throughput; the
//! daemon's RSS grows by at most 8 MB (its ring holds the last 1 MiB of output; the rest goes
//! to disk).
//!
//! Binaries, scratch and `DROVER_BENCH_KEEP` as in the other benches (`scripts/bench`).

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::fs;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use drover_bench::{self as bench, Row, ScriptedHome, Ws, fmt_kb, recv_json, request, ws_connect};
use serde_json::{Value, json};

/// 100 MiB.
const BYTES: u64 = 100 * 1024 * 1024;
/// What the job writes: the same line again and again, cut at `BYTES`.
const LINE: &str = "drover-bench-jobs: a line of output from a job that writes as fast as it can";
const TARGET_RATIO: f64 = 0.8;
const TARGET_RSS_KB: u64 = 8 * 1024;
const WAIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    bench::block_on("drover-bench-jobs", Some(2), run())
}

fn command(out: Option<&str>) -> String {
    let to = out.map(|o| format!(" > {o}")).unwrap_or_default();
    format!("yes '{LINE}' | head -c {BYTES}{to}")
}

fn mb_per_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64()
}

/// Follows the job's output from offset 0 to its end; returns the bytes read and when the
/// last arrived.
async fn follow(url: String, job: String) -> Result<(u64, Instant)> {
    let mut ws = ws_connect(&url).await?;
    bench::hello(&mut ws, "drover-bench-jobs-follower").await?;
    let followed = request(
        &mut ws,
        json!({"type": "follow_job", "jobId": job, "offset": 0}),
        "f".to_string(),
    )
    .await?;
    ensure!(
        followed["type"] == "job_followed",
        "not followed: {followed}"
    );
    let mut offset = 0u64;
    let mut read = 0u64;
    loop {
        let update = recv_json(&mut ws).await?;
        if update["type"] != "job_output_update" || update["payload"]["jobId"] != job {
            continue;
        }
        let p = &update["payload"];
        ensure!(p["skipped"] == 0, "the follower missed bytes: {p}");
        ensure!(p["offset"] == offset, "a push from another offset: {p}");
        let next = p["nextOffset"].as_u64().context("no nextOffset")?;
        let text = p["text"].as_str().context("no text")?;
        ensure!(
            text.len() as u64 == next - offset,
            "{} bytes of text for {} bytes of offsets",
            text.len(),
            next - offset
        );
        read += text.len() as u64;
        offset = next;
        if p["eof"] == true {
            return Ok((read, Instant::now()));
        }
    }
}

/// The `job_update` that says `job` ended.
async fn ended(ws: &mut Ws, job: &str) -> Result<Value> {
    loop {
        let m = tokio::time::timeout(WAIT, recv_json(ws))
            .await
            .context("the job did not end in time")??;
        if m["type"] == "job_update"
            && m["payload"]["job"]["id"] == job
            && m["payload"]["job"]["status"] != "running"
        {
            return Ok(m["payload"]["job"].clone());
        }
    }
}

async fn run() -> Result<()> {
    let setup = ScriptedHome::new("drover-bench-jobs")?;
    let (root, cwd, started) = (&setup.root, &setup.cwd, setup.started);

    // The baseline: the shell writes the output to a file itself (best of 3).
    let mut baseline = Duration::MAX;
    for _ in 0..3 {
        let out = root.join("baseline.out");
        let t = Instant::now();
        let status = Command::new("sh")
            .arg("-c")
            .arg(command(Some(&out.display().to_string())))
            .status()?;
        let took = t.elapsed();
        ensure!(status.success(), "the baseline failed: {status}");
        ensure!(
            fs::metadata(&out)?.len() == BYTES,
            "the baseline wrote less"
        );
        fs::remove_file(&out)?;
        baseline = baseline.min(took);
    }

    let daemon = setup.spawn_daemon(WAIT)?;
    let url = format!("ws://{}/ws", daemon.addr);
    let mut ws = daemon.connect("drover-bench-jobs").await?;
    let created = request(
        &mut ws,
        json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "title": "owner"}),
        "c".to_string(),
    )
    .await?;
    let agent = created["payload"]["agent"]["id"]
        .as_str()
        .context("no agent id")?
        .to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = daemon.mem()?.0;

    // Memory, sampled while the jobs run.
    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling, pid) = (peak.clone(), sampling.clone(), daemon.pid);
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                if let Ok((rss, _)) = bench::proc_mem_kb(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // To disk, with nobody reading (best of 3).
    let mut to_disk = Duration::MAX;
    for n in 0..3 {
        let t = Instant::now();
        let job = request(
            &mut ws,
            json!({"type": "start_job", "agentId": agent, "command": command(None), "notifyOnExit": false}),
            format!("s{n}"),
        )
        .await?;
        let id = job["payload"]["job"]["id"]
            .as_str()
            .context("no job id")?
            .to_string();
        let end = ended(&mut ws, &id).await?;
        let took = t.elapsed();
        ensure!(end["status"] == "exited", "the job did not exit: {end}");
        ensure!(
            end["outputBytes"] == BYTES,
            "the job's output is not {BYTES} bytes: {end}"
        );
        to_disk = to_disk.min(took);
    }

    // To one following client.
    let t = Instant::now();
    let job = request(
        &mut ws,
        json!({"type": "start_job", "agentId": agent, "command": command(None), "notifyOnExit": false}),
        "f".to_string(),
    )
    .await?;
    let id = job["payload"]["job"]["id"]
        .as_str()
        .context("no job id")?
        .to_string();
    let (read, last) = tokio::time::timeout(WAIT, follow(url.clone(), id.clone()))
        .await
        .context("the follower did not reach the end in time")??;
    let to_follower = last - t;
    if read != BYTES {
        bail!("the follower read {read} bytes of {BYTES}");
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let grown = peak.load(Ordering::Relaxed).saturating_sub(rss_before);
    daemon.stop()?;

    let base = mb_per_s(BYTES, baseline);
    let disk = mb_per_s(BYTES, to_disk);
    let follower = mb_per_s(BYTES, to_follower);
    println!(
        "  baseline (sh to a file): {base:.0} MB/s; job to disk {disk:.0} MB/s; job to a follower {follower:.0} MB/s"
    );
    let rows = [
        Row::info(
            "baseline: the command's output to a file",
            format!("{base:.0} MB/s"),
        ),
        Row::target(
            "a 100 MB job to disk",
            format!("{disk:.0} MB/s ({:.2}×)", disk / base),
            format!("≥ {TARGET_RATIO}× baseline"),
            disk / base >= TARGET_RATIO,
        ),
        Row::target(
            "a 100 MB job to one following client",
            format!(
                "{follower:.0} MB/s ({:.2}×), every byte once",
                follower / base
            ),
            format!("≥ {TARGET_RATIO}× baseline"),
            follower / base >= TARGET_RATIO,
        ),
        Row::target(
            "daemon RSS growth while jobs write",
            fmt_kb(grown),
            format!("≤ {} (ring 1 MiB)", fmt_kb(TARGET_RSS_KB)),
            grown <= TARGET_RSS_KB,
        ),
    ];
    println!();
    bench::print_summary(&rows, started);
    Ok(())
}
