//! `drover-bench-mcp`: what `create_agent` over MCP costs beyond the new agent's own start-up.
//!
//! Not a timed test: it measures and prints figures, with PASS/MISS beside each target. The
//! daemon is the real `drover daemon` process on 127.0.0.1, with the scripted agent as provider.
//!
//! A parent (the scripted agent, created over the client protocol) says the `mcpServers` it got
//! in `session/new`: its own MCP URL, `/mcp/<token>`. Each round then, back to back and taking
//! turns at going first:
//!
//! - **through drover**: this process calls `tools/call create_agent` at that URL (HTTP
//!   POST, as the agent's MCP client would: a subagent in the parent's workspace, provider
//!   `scripted`, prompt `say first`, `notifyOnFinish: false`), from a wall-clock instant `t0`.
//!   Once the child is idle its timeline is fetched over the protocol: every item carries the
//!   instant the daemon recorded it (`at`, `CLOCK_REALTIME` of this host), so the figures are
//!   `at - t0` exactly: to the child's first timeline item, whatever it is, and to its first
//!   `agent_message` (the agent's first update). The MCP call's own round trip is shown too.
//!   The child is archived afterwards (untimed), so every round starts from one live agent.
//! - **the agent alone**: the same scripted agent binary, spawned directly with
//!   `drover_fakes::acp_client` (same cwd, no MCP servers): spawn → `initialize` →
//!   `session/new` is its start-up; then `session/prompt` `say first` until its first
//!   `session/update` arrives.
//!
//! Daemon overhead = (MCP call → child's first `agent_message`) − (start-up + first update),
//! paired within each round; the median over the rounds is held to the target, < 20 ms. The
//! same for the first timeline item against the start-up alone is shown beside it.
//! 20 rounds after 3 warm-up rounds that are not counted (`DROVER_BENCH_ROUNDS=N` for N).
//!
//! Binaries: `drover` is `$DROVER_BIN`, else the one of this build; the scripted
//! agent is `$DROVER_SCRIPTED_AGENT`, else `drover-scripted-agent` of this build
//! (`scripts/bench` builds all of them in release). The scratch home goes under `$TMPDIR`;
//! `DROVER_BENCH_KEEP=1` keeps it (with the daemon's log). A missed target is reported, not an
//! error: the exit status is non-zero only when the bench could not run.

// A benchmark reads as one measurement, set up, run and reported in order.
#![expect(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use drover_bench::{
    self as bench, DaemonProc, Row, Ws, fmt_dur, hello, median, now_ns, request, ws_connect,
};
use drover_fakes::acp_client::{AcpClient, AgentCommand, ClientOptions};
use serde_json::{Value, json};

const ROUNDS: usize = 20;
const WARM_UP: usize = 3;
const TARGET: Duration = Duration::from_millis(20);
/// The longest any one wait (a boot, a request, a turn) may take.
const WAIT: Duration = Duration::from_secs(60);
const CHILD_PROMPT: &str = "say first";

fn main() -> ExitCode {
    bench::block_on("drover-bench-mcp", Some(2), run())
}

/// One round through drover.
struct ViaDrover {
    /// `tools/call` sent → its answer read.
    mcp_round_trip: Duration,
    /// `tools/call` sent → the child's first timeline item recorded.
    first_item: Duration,
    first_item_kind: String,
    /// `tools/call` sent → the child's first `agent_message` recorded.
    first_message: Duration,
}

/// One round of the agent alone.
struct Alone {
    /// spawn → `initialize` → `session/new` answered.
    start_up: Duration,
    /// spawn → the first `session/update` of the prompt received.
    first_update: Duration,
}

async fn run() -> Result<()> {
    let drover = bench::drover_binary()?;
    let scripted = bench::scripted_agent_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-mcp-")?;
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    let rounds = bench::rounds(ROUNDS);
    println!("drover-bench-mcp");
    println!("  drover binary:  {}", drover.display());
    println!("  scripted agent: {}", scripted.display());
    println!("  scratch:        {}", root.display());
    println!(
        "  machine:        {} CPUs, load average {}; the daemon, the agents and this process \
         share them",
        bench::cpus(),
        bench::load_average()
    );
    println!();

    let home = root.join("home");
    let cwd = root.join("work");
    let state = root.join("scripted-state");
    for dir in [&home, &cwd, &state] {
        fs::create_dir_all(dir)?;
    }
    fs::write(
        home.join("config.toml"),
        drover_fakes::scripted_agent::provider_config(&scripted, &state),
    )?;
    let daemon = DaemonProc::spawn(&drover, &home, &root.join("daemon.log"), None, WAIT)?;
    let started = Instant::now();

    let mut ws = ws_connect(&format!("ws://{}/ws", daemon.addr)).await?;
    hello(&mut ws, "drover-bench-mcp").await?;
    let mut requests = 0u64;
    let mut next_id = || {
        requests += 1;
        format!("r{requests}")
    };

    // The parent says its MCP URL.
    let created = request(
        &mut ws,
        json!({"type": "create_agent", "provider": "scripted", "cwd": cwd, "title": "bench parent", "prompt": "mcp-servers"}),
        next_id(),
    )
    .await?;
    let parent = created["payload"]["agent"]["id"]
        .as_str()
        .context("no parent id")?
        .to_string();
    wait_idle(&mut ws, &parent, next_id()).await?;
    let said = agent_messages(&mut ws, &parent, next_id()).await?;
    let servers: Value = serde_json::from_str(said.trim())
        .with_context(|| format!("the parent did not say its mcpServers: {said:?}"))?;
    let url = servers
        .as_array()
        .and_then(|s| s.iter().find(|s| s["type"] == "http"))
        .and_then(|s| s["url"].as_str())
        .with_context(|| format!("no http MCP server among {servers}"))?
        .to_string();
    println!("  parent's MCP server: {}", redact(&url));

    let alone_cmd = AgentCommand {
        program: scripted.clone(),
        args: Vec::new(),
        env: BTreeMap::from([
            (
                "PATH".to_string(),
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            ),
            (
                "SCRIPTED_AGENT_STATE_DIR".to_string(),
                state.display().to_string(),
            ),
        ]),
        cwd: cwd.clone(),
    };

    println!(
        "== create_agent over MCP → the child's first timeline item ({rounds} rounds after {WARM_UP} warm-up, taking turns) =="
    );
    let mut via = Vec::with_capacity(rounds);
    let mut alone = Vec::with_capacity(rounds);
    for round in 0..WARM_UP + rounds {
        let (d, a) = if round % 2 == 0 {
            let d = via_drover(&mut ws, &url, &cwd, round, &mut next_id).await?;
            (d, agent_alone(&alone_cmd).await?)
        } else {
            let a = agent_alone(&alone_cmd).await?;
            (
                via_drover(&mut ws, &url, &cwd, round, &mut next_id).await?,
                a,
            )
        };
        if round < WARM_UP {
            continue;
        }
        println!(
            "  round {:>2}: drover: MCP answer {}, first item ({}) {}, first message {} | alone: start-up {}, first update {} | overhead {}",
            round - WARM_UP + 1,
            fmt_dur(d.mcp_round_trip),
            d.first_item_kind,
            fmt_dur(d.first_item),
            fmt_dur(d.first_message),
            fmt_dur(a.start_up),
            fmt_dur(a.first_update),
            fmt_signed(signed(d.first_message) - signed(a.first_update)),
        );
        via.push(d);
        alone.push(a);
    }
    daemon.stop()?;

    let med = |v: Vec<Duration>| median(&v);
    let mcp_rtt = med(via.iter().map(|d| d.mcp_round_trip).collect());
    let first_item = med(via.iter().map(|d| d.first_item).collect());
    let first_message = med(via.iter().map(|d| d.first_message).collect());
    let start_up = med(alone.iter().map(|a| a.start_up).collect());
    let first_update = med(alone.iter().map(|a| a.first_update).collect());
    let overhead = median_signed(
        via.iter()
            .zip(&alone)
            .map(|(d, a)| signed(d.first_message) - signed(a.first_update))
            .collect(),
    );
    let item_overhead = median_signed(
        via.iter()
            .zip(&alone)
            .map(|(d, a)| signed(d.first_item) - signed(a.start_up))
            .collect(),
    );
    let mut kinds: Vec<&str> = via.iter().map(|d| d.first_item_kind.as_str()).collect();
    kinds.dedup();
    println!(
        "  medians: drover: MCP answer {}, first item {}, first message {}; alone: start-up {}, first update {}",
        fmt_dur(mcp_rtt),
        fmt_dur(first_item),
        fmt_dur(first_message),
        fmt_dur(start_up),
        fmt_dur(first_update),
    );
    println!();

    let target = format!("< {}", fmt_dur(TARGET));
    let rows = [
        Row::target(
            "create_agent (MCP) → child's first agent_message, minus the agent's start-up + first update",
            format!(
                "median {} ({} vs {})",
                fmt_signed(overhead),
                fmt_dur(first_message),
                fmt_dur(first_update)
            ),
            target.clone(),
            overhead < signed(TARGET),
        ),
        Row::target(
            format!(
                "create_agent (MCP) → child's first timeline item ({}), minus the agent's start-up",
                kinds.join("/")
            ),
            format!(
                "median {} ({} vs {})",
                fmt_signed(item_overhead),
                fmt_dur(first_item),
                fmt_dur(start_up)
            ),
            target,
            item_overhead < signed(TARGET),
        ),
        Row::info(
            "create_agent MCP round trip (the new id back)",
            format!("median {}", fmt_dur(mcp_rtt)),
        ),
    ];

    bench::print_summary(&rows, started);
    if keep {
        println!("  kept the home and the daemon's log in {}", root.display());
    }
    Ok(())
}

/// One `create_agent` through drover's MCP server, timed to the child's timeline.
async fn via_drover(
    ws: &mut Ws,
    url: &str,
    cwd: &Path,
    round: usize,
    next_id: &mut impl FnMut() -> String,
) -> Result<ViaDrover> {
    let arguments = json!({
        "relationship": {"kind": "subagent"},
        "workspace": {"kind": "current", "cwd": cwd},
        "provider": "scripted",
        "prompt": CHILD_PROMPT,
        "title": format!("bench child {round}"),
        "notifyOnFinish": false,
    });
    let url = url.to_string();
    let (t0, result, mcp_round_trip) = tokio::task::spawn_blocking(move || {
        let t0 = now_ns();
        let clock = Instant::now();
        let result = mcp_call(&url, "create_agent", &arguments);
        (t0, result, clock.elapsed())
    })
    .await?;
    let result = result?;
    let child = result["agentId"]
        .as_str()
        .with_context(|| format!("create_agent answered {result}"))?
        .to_string();
    wait_idle(ws, &child, next_id()).await?;
    let items = timeline(ws, &child, next_id()).await?;
    let first = items
        .first()
        .with_context(|| format!("the child {child} has an empty timeline"))?;
    let message = items
        .iter()
        .find(|i| i["kind"] == "agent_message")
        .with_context(|| format!("the child said nothing: {items:?}"))?;
    let since = |item: &Value| -> Result<Duration> {
        let at: jiff::Timestamp = item["at"]
            .as_str()
            .context("an item without `at`")?
            .parse()
            .context("an odd `at`")?;
        let ns = u64::try_from(at.as_nanosecond() - i128::from(t0))
            .map_err(|_| anyhow!("an item recorded before the call: {item}"))?;
        Ok(Duration::from_nanos(ns))
    };
    let round = ViaDrover {
        mcp_round_trip,
        first_item: since(first)?,
        first_item_kind: first["kind"].as_str().unwrap_or("?").to_string(),
        first_message: since(message)?,
    };
    // Untimed: back to one live agent.
    request(
        ws,
        json!({"type": "archive", "agentId": child, "stopActivity": true}),
        next_id(),
    )
    .await?;
    Ok(round)
}

/// The scripted agent on its own: start-up, then its first update of the same prompt.
async fn agent_alone(cmd: &AgentCommand) -> Result<Alone> {
    let clock = Instant::now();
    let client = AcpClient::spawn(
        cmd,
        ClientOptions {
            fs: false,
            timeout: WAIT,
        },
    )?;
    client.initialize().await?;
    let session = client.new_session(&cmd.cwd).await?;
    let start_up = clock.elapsed();
    let (turn, first) = tokio::join!(client.prompt(&session, CHILD_PROMPT), async {
        let update = client.wait_for_update(0, WAIT, |_| true).await;
        (update, clock.elapsed())
    });
    turn?;
    let (update, first_update) = first;
    update?;
    client.shutdown(Duration::from_secs(5)).await;
    Ok(Alone {
        start_up,
        first_update,
    })
}

// ---- MCP over HTTP ------------------------------------------------------------------------

/// `tools/call` at an HTTP MCP URL (drover answers plain JSON, statelessly); the tool's JSON
/// result.
fn mcp_call(url: &str, tool: &str, arguments: &Value) -> Result<Value> {
    use drover_fakes::mcp_http::{CallError, tools_call};
    let text = match tools_call(url, tool, arguments, WAIT) {
        Ok(text) => text,
        Err(CallError::Protocol(e)) => bail!("MCP error: {e}"),
        Err(CallError::Tool(text)) => bail!("{tool} failed: {text}"),
    };
    serde_json::from_str(&text).with_context(|| format!("{tool} answered {text}"))
}

/// The URL without its token.
fn redact(url: &str) -> String {
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/<token>"),
        None => url.to_string(),
    }
}

// ---- the client protocol ------------------------------------------------------------------

async fn wait_idle(ws: &mut Ws, agent: &str, id: String) -> Result<()> {
    let idle = request(
        ws,
        json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 30_000}),
        id,
    )
    .await?;
    ensure!(
        idle["payload"]["idle"] == true,
        "{agent} is not idle: {idle}"
    );
    Ok(())
}

async fn timeline(ws: &mut Ws, agent: &str, id: String) -> Result<Vec<Value>> {
    let page = request(
        ws,
        json!({"type": "fetch_timeline", "agentId": agent, "limit": 1000}),
        id,
    )
    .await?;
    Ok(page["payload"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

async fn agent_messages(ws: &mut Ws, agent: &str, id: String) -> Result<String> {
    Ok(timeline(ws, agent, id)
        .await?
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str())
        .collect())
}

fn signed(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

/// The median of signed nanoseconds.
fn median_signed(mut v: Vec<i128>) -> i128 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => i128::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// Signed nanoseconds, as `+1.2 ms` or `-300.0 µs`.
fn fmt_signed(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let d = Duration::from_nanos(u64::try_from(ns.unsigned_abs()).unwrap_or(u64::MAX));
    format!("{sign}{}", fmt_dur(d))
}
