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
//!   `drover_testkit::acp_client` (same cwd, no MCP servers): spawn → `initialize` →
//!   `session/new` is its start-up; then `session/prompt` `say first` until its first
//!   `session/update` arrives.
//!
//! Daemon overhead = (MCP call → child's first `agent_message`) − (start-up + first update),
//! paired within each round; the median over the rounds is held to the target, < 20 ms. The
//! same for the first timeline item against the start-up alone is shown beside it.
//! 20 rounds after 3 warm-up rounds that are not counted (`DROVER_BENCH_ROUNDS=N` for N).
//!
//! Binaries: `drover` is `$DROVER_BIN`, else the one next to this executable; the scripted
//! agent is `$DROVER_SCRIPTED_AGENT`, else `drover-scripted-agent` next to this executable
//! (`scripts/bench` builds all of them in release). The scratch home goes under `$TMPDIR`;
//! `DROVER_BENCH_KEEP=1` keeps it (with the daemon's log). A missed target is reported, not an
//! error: the exit status is non-zero only when the bench could not run.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use drover_testkit::acp_client::{AcpClient, AgentCommand, ClientOptions};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const ROUNDS: usize = 20;
const WARM_UP: usize = 3;
const TARGET: Duration = Duration::from_millis(20);
/// The longest any one wait (a boot, a request, a turn) may take.
const WAIT: Duration = Duration::from_secs(60);
const CHILD_PROMPT: &str = "say first";

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-bench-mcp: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drover-bench-mcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One line of the final table.
struct Row {
    what: String,
    measured: String,
    target: String,
    pass: Option<bool>,
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
    let drover = binary_next_to_me("DROVER_BIN", "drover", "-p drover")?;
    let scripted = binary_next_to_me(
        "DROVER_SCRIPTED_AGENT",
        "drover-scripted-agent",
        "-p drover-testkit",
    )?;
    let mut scratch = tempfile::Builder::new()
        .prefix("drover-bench-mcp-")
        .tempdir()
        .context("cannot make a scratch folder")?;
    let keep = std::env::var_os("DROVER_BENCH_KEEP").is_some_and(|v| !v.is_empty() && v != "0");
    scratch.disable_cleanup(keep);
    let root = scratch
        .path()
        .canonicalize()
        .context("cannot resolve the scratch folder")?;
    let rounds = std::env::var("DROVER_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(ROUNDS);
    println!("drover-bench-mcp");
    println!("  drover binary:  {}", drover.display());
    println!("  scripted agent: {}", scripted.display());
    println!("  scratch:        {}", root.display());
    println!(
        "  machine:        {} CPUs, load average {}; the daemon, the agents and this process \
         share them",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| "?".to_string())
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
        drover_testkit::scripted_config(&scripted, &state),
    )?;
    let daemon = DaemonProc::spawn(&drover, &home, &root.join("daemon.log"))?;
    let started = Instant::now();

    let mut ws = ws_connect(&format!("ws://{}/ws", daemon.addr)).await?;
    hello(&mut ws).await?;
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
        Row {
            what: "create_agent (MCP) → child's first agent_message, minus the agent's start-up + first update".to_string(),
            measured: format!(
                "median {} ({} vs {})",
                fmt_signed(overhead),
                fmt_dur(first_message),
                fmt_dur(first_update)
            ),
            target: target.clone(),
            pass: Some(overhead < signed(TARGET)),
        },
        Row {
            what: format!(
                "create_agent (MCP) → child's first timeline item ({}), minus the agent's start-up",
                kinds.join("/")
            ),
            measured: format!(
                "median {} ({} vs {})",
                fmt_signed(item_overhead),
                fmt_dur(first_item),
                fmt_dur(start_up)
            ),
            target,
            pass: Some(item_overhead < signed(TARGET)),
        },
        Row {
            what: "create_agent MCP round trip (the new id back)".to_string(),
            measured: format!("median {}", fmt_dur(mcp_rtt)),
            target: "-".to_string(),
            pass: None,
        },
    ];

    println!("== summary ==");
    let width = |f: fn(&Row) -> &str| rows.iter().map(|r| f(r).chars().count()).max();
    let w0 = width(|r| &r.what).unwrap_or(0);
    let w1 = width(|r| &r.measured).unwrap_or(0);
    let w2 = width(|r| &r.target).unwrap_or(0);
    println!(
        "  {:<w0$}  {:<w1$}  {:<w2$}  result",
        "measure", "measured", "target"
    );
    println!("  {}", "-".repeat(w0 + w1 + w2 + 12));
    for row in &rows {
        println!(
            "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
            row.what,
            row.measured,
            row.target,
            match row.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None => "info",
            }
        );
    }
    let targets = rows.iter().filter(|r| r.pass.is_some()).count();
    let passed = rows.iter().filter(|r| r.pass == Some(true)).count();
    println!(
        "\n  {passed} of {targets} targets met; bench ran {:.1} s",
        started.elapsed().as_secs_f64()
    );
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
        let result = mcp_call(&url, "create_agent", arguments);
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
fn mcp_call(url: &str, tool: &str, arguments: Value) -> Result<Value> {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    })
    .to_string();
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("only http:// MCP urls"))?;
    let (authority, path) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap_or((rest, "/".to_string()));
    let mut stream = TcpStream::connect(authority)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(WAIT))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP body: {response}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let message: Value =
        serde_json::from_str(body.trim()).with_context(|| format!("not JSON: {body}"))?;
    if let Some(error) = message.get("error") {
        bail!("MCP error: {error}");
    }
    let result = &message["result"];
    let text: String = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect();
    ensure!(result["isError"] != json!(true), "{tool} failed: {text}");
    serde_json::from_str(&text).with_context(|| format!("{tool} answered {text}"))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// The URL without its token.
fn redact(url: &str) -> String {
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/<token>"),
        None => url.to_string(),
    }
}

// ---- the client protocol ------------------------------------------------------------------

async fn ws_connect(url: &str) -> Result<Ws> {
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .map_err(|_| anyhow!("connecting to {url} timed out"))?
        .with_context(|| format!("cannot connect to {url}"))?;
    Ok(ws)
}

async fn send_json(ws: &mut Ws, message: &Value) -> Result<()> {
    ws.send(Message::Text(message.to_string().into())).await?;
    Ok(())
}

async fn recv_json(ws: &mut Ws) -> Result<Value> {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .map_err(|_| anyhow!("no message from the daemon in {WAIT:?}"))?
            .ok_or_else(|| anyhow!("the daemon closed the connection"))??;
        if let Message::Text(text) = frame {
            return Ok(serde_json::from_str(&text)?);
        }
    }
}

async fn hello(ws: &mut Ws) -> Result<Value> {
    send_json(
        ws,
        &json!({"type": "hello", "client": "drover-bench-mcp", "protocolVersion": 1}),
    )
    .await?;
    loop {
        let message = recv_json(ws).await?;
        match message["type"].as_str() {
            Some("session_state") => return Ok(message),
            Some("request_error") => bail!("hello refused: {message}"),
            _ => {}
        }
    }
}

/// Sends `message` with `requestId` and returns its answer (other messages are dropped).
async fn request(ws: &mut Ws, mut message: Value, id: String) -> Result<Value> {
    message["requestId"] = json!(id);
    send_json(ws, &message).await?;
    loop {
        let answer = recv_json(ws).await?;
        if answer["payload"]["requestId"] == json!(id) {
            ensure!(
                answer["type"] != "request_error",
                "{} failed: {answer}",
                message["type"]
            );
            return Ok(answer);
        }
    }
}

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

// ---- the daemon process ---------------------------------------------------------------------

/// `drover daemon` on a home, killed if the bench bails out while it runs.
struct DaemonProc {
    child: Child,
    pid: u32,
    addr: SocketAddr,
}

impl DaemonProc {
    /// Starts the daemon and waits until `/health` answers.
    fn spawn(drover: &Path, home: &Path, log: &Path) -> Result<DaemonProc> {
        let mut child = Command::new(drover)
            .arg("daemon")
            .arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("DROVER_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log)?)
            .spawn()
            .with_context(|| format!("cannot run `{}`", drover.display()))?;
        let pid = child.id();
        let start = Instant::now();
        loop {
            if start.elapsed() > WAIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the daemon did not come up within {WAIT:?}; its log: {}",
                    log.display()
                );
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the daemon exited during boot ({status}): {}",
                    fs::read_to_string(log).unwrap_or_default().trim()
                );
            }
            if let Some(addr) = daemon_addr(&home.join("daemon.json"), pid)
                && get_health(addr)
            {
                return Ok(DaemonProc { child, pid, addr });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, and waits for the ordered shutdown.
    fn stop(mut self) -> Result<()> {
        let killed = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .context("cannot run `kill`")?;
        ensure!(killed.success(), "`kill -TERM {}` failed", self.pid);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the daemon did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The address from `daemon.json`, once the daemon with this pid has written it.
fn daemon_addr(path: &Path, pid: u32) -> Option<SocketAddr> {
    let info: Value = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    if info["pid"].as_u64() != Some(u64::from(pid)) {
        return None;
    }
    info["url"].as_str()?.strip_prefix("http://")?.parse().ok()
}

/// Whether `GET /health` answers 200.
fn get_health(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).split_whitespace().nth(1) == Some("200")
}

// ---- helpers --------------------------------------------------------------------------------

fn binary_next_to_me(var: &str, name: &str, package: &str) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(var).filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        ensure!(bin.is_file(), "{var}=`{}` is not a file", bin.display());
        return Ok(bin);
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let bin = exe
        .parent()
        .map(|dir| dir.join(name))
        .ok_or_else(|| anyhow!("`{}` has no folder", exe.display()))?;
    ensure!(
        bin.is_file(),
        "no `{name}` at `{}`: build it with `cargo build --release {package}` (or run \
         scripts/bench), or point {var} at one",
        bin.display()
    );
    Ok(bin)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn signed(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// The median of signed nanoseconds.
fn median_signed(mut v: Vec<i128>) -> i128 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

fn fmt_dur(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Signed nanoseconds, as `+1.2 ms` or `-300.0 µs`.
fn fmt_signed(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let d = Duration::from_nanos(u64::try_from(ns.unsigned_abs()).unwrap_or(u64::MAX));
    format!("{sign}{}", fmt_dur(d))
}
