//! What the `drover-bench*` benchmarks (`[[bench]] harness = false` targets, run by
//! `scripts/bench`) share: the summary table, the scratch folder, finding the release
//! binaries, `drover daemon` as a child process, the client protocol over a WebSocket, `/proc`
//! readings, medians and the formats of the printed figures.

pub mod fleet_gen;

use std::fs::{self, File};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

// ---- running a bench ------------------------------------------------------------------------

/// The exit status of a bench named `name`: failure, with the error on stderr, only when the
/// bench could not run (a missed target is not an error).
pub fn exit(name: &str, result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Creates an agent on `manager` with the steps of the daemon's `create_agent` operation (the
/// provider checked and its defaults filled in, the record written, the runtime started with
/// `prompt` queued from the user).
pub async fn create_agent(
    manager: &drover_acp::RuntimeManager,
    mut new: drover_core::NewAgent,
    prompt: Option<String>,
    notify: Option<drover_core::AgentId>,
) -> Result<drover_core::Agent, drover_acp::AcpError> {
    manager.prepare(&mut new)?;
    let agent = manager.registry().create_agent(new).await?;
    let source = notify.map_or_else(|| "user".to_string(), |a| format!("agent:{a}"));
    manager.start_new(&agent, prompt, source, notify).await?;
    Ok(agent)
}

/// Runs `run` on a multi-threaded tokio runtime (`workers` threads, else tokio's default).
pub fn block_on(
    name: &str,
    workers: Option<usize>,
    run: impl Future<Output = Result<()>>,
) -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    match builder.enable_all().build() {
        Ok(rt) => exit(name, rt.block_on(run)),
        Err(e) => {
            eprintln!("{name}: cannot start tokio: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A scratch folder under `$TMPDIR` named `prefix…`, and whether `DROVER_BENCH_KEEP=1` asks to
/// keep it (then it is not removed on drop).
pub fn scratch(prefix: &str) -> Result<(tempfile::TempDir, bool)> {
    let mut scratch = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("cannot make a scratch folder")?;
    let keep = std::env::var_os("DROVER_BENCH_KEEP").is_some_and(|v| !v.is_empty() && v != "0");
    scratch.disable_cleanup(keep);
    Ok((scratch, keep))
}

/// Where most daemon benches run: a scratch folder (kept with `DROVER_BENCH_KEEP=1`) holding a
/// daemon home whose `config.toml` has the scripted agent's provider, and a working directory
/// for the agents. Made by [`ScriptedHome::new`], which prints the bench's header.
#[derive(Debug)]
pub struct ScriptedHome {
    /// The `drover` binary benched.
    pub drover: PathBuf,
    /// The scratch folder, canonical.
    pub root: PathBuf,
    /// `$DROVER_HOME`.
    pub home: PathBuf,
    /// The agents' working directory.
    pub cwd: PathBuf,
    /// When the bench began (for the summary).
    pub started: Instant,
    _scratch: tempfile::TempDir,
}

impl ScriptedHome {
    /// Finds the binaries, makes the folders and prints `name`, the binary and the machine.
    pub fn new(name: &str) -> Result<ScriptedHome> {
        let drover = drover_binary()?;
        let scripted = scripted_agent_binary()?;
        let (scratch, _keep) = self::scratch(&format!("{name}-"))?;
        let root = scratch
            .path()
            .canonicalize()
            .context("cannot resolve the scratch folder")?;
        let started = Instant::now();
        println!("{name}");
        println!("  drover binary:  {}", drover.display());
        println!(
            "  machine:        {} CPUs, load average {}",
            cpus(),
            load_average()
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
        Ok(ScriptedHome {
            drover,
            root,
            home,
            cwd,
            started,
            _scratch: scratch,
        })
    }

    /// `drover daemon` on the home (its stderr in `daemon.log`), answering within `timeout`.
    pub fn spawn_daemon(&self, timeout: Duration) -> Result<DaemonProc> {
        DaemonProc::spawn(
            &self.drover,
            &self.home,
            &self.root.join("daemon.log"),
            None,
            timeout,
        )
    }
}

/// `$DROVER_BENCH_ROUNDS` if a positive number, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("DROVER_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(default)
}

/// `$var` if set, else `name` in this executable's build folder (`target/release`, the parent
/// of the `deps/` where `cargo bench` puts a benchmark); `package` is what builds it (`-p x`).
pub fn binary_next_to_me(var: &str, name: &str, package: &str) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(var).filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        ensure!(bin.is_file(), "{var}=`{}` is not a file", bin.display());
        return Ok(bin);
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("`{}` has no folder", exe.display()))?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().unwrap_or(dir);
    }
    let bin = dir.join(name);
    ensure!(
        bin.is_file(),
        "no `{name}` at `{}`: build it with `cargo build --release {package}` (or run \
         scripts/bench), or point {var} at one",
        bin.display()
    );
    Ok(bin)
}

/// The `drover` binary: `$DROVER_BIN`, else the one of this build.
pub fn drover_binary() -> Result<PathBuf> {
    binary_next_to_me("DROVER_BIN", "drover", "-p drover")
}

/// The scripted agent: `$DROVER_SCRIPTED_AGENT`, else the one of this build (a bin of
/// drover-e2e, whose tests spawn it).
pub fn scripted_agent_binary() -> Result<PathBuf> {
    binary_next_to_me(
        "DROVER_SCRIPTED_AGENT",
        "drover-scripted-agent",
        "-p drover-e2e",
    )
}

// ---- the machine ----------------------------------------------------------------------------

/// The CPUs this process may use.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `Linux 6.1.0-…`, else the OS's name.
pub fn kernel() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
        |_| std::env::consts::OS.to_string(),
        |s| format!("Linux {}", s.trim()),
    )
}

/// The one-minute load average, `?` if unknown.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

// ---- the summary table ----------------------------------------------------------------------

/// One line of the final table.
#[derive(Debug, Clone)]
pub struct Row {
    pub what: String,
    pub measured: String,
    pub target: String,
    /// `None`: a figure shown for information, with no target to meet.
    pub pass: Option<bool>,
    /// Shown instead of PASS/MISS/info (a part that could not run).
    pub skip: bool,
}

impl Row {
    /// A figure against a target.
    pub fn target(
        what: impl Into<String>,
        measured: String,
        target: impl Into<String>,
        pass: bool,
    ) -> Row {
        Row {
            what: what.into(),
            measured,
            target: target.into(),
            pass: Some(pass),
            skip: false,
        }
    }

    /// A figure for information.
    pub fn info(what: impl Into<String>, measured: String) -> Row {
        Row {
            what: what.into(),
            measured,
            target: "-".to_string(),
            pass: None,
            skip: false,
        }
    }

    /// A part that could not run, and why.
    pub fn skip(what: impl Into<String>, why: String, target: impl Into<String>) -> Row {
        Row {
            what: what.into(),
            measured: why,
            target: target.into(),
            pass: None,
            skip: true,
        }
    }
}

/// Prints `== summary ==`, the table, and how many targets were met in a bench that began at
/// `started`.
pub fn print_summary(rows: &[Row], started: Instant) {
    println!("== summary ==");
    // Widths in chars, as `format!` pads (`≤`, `µ` are wider in bytes).
    let width = |f: fn(&Row) -> &str| rows.iter().map(|r| f(r).chars().count()).max();
    let w0 = width(|r| &r.what).unwrap_or(0);
    let w1 = width(|r| &r.measured).unwrap_or(0);
    let w2 = width(|r| &r.target).unwrap_or(0);
    println!(
        "  {:<w0$}  {:<w1$}  {:<w2$}  result",
        "measure", "measured", "target"
    );
    println!("  {}", "-".repeat(w0 + w1 + w2 + 12));
    for row in rows {
        println!(
            "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
            row.what,
            row.measured,
            row.target,
            match (row.skip, row.pass) {
                (true, _) => "SKIP",
                (false, Some(true)) => "PASS",
                (false, Some(false)) => "MISS",
                (false, None) => "info",
            }
        );
    }
    let targets = rows.iter().filter(|r| r.pass.is_some()).count();
    let passed = rows.iter().filter(|r| r.pass == Some(true)).count();
    let skipped = rows.iter().filter(|r| r.skip).count();
    print!("\n  {passed} of {targets} targets met");
    if skipped > 0 {
        print!(", {skipped} skipped");
    }
    println!("; bench ran {:.1} s", started.elapsed().as_secs_f64());
}

// ---- the daemon process ---------------------------------------------------------------------

/// `drover daemon` on a home, killed if the bench bails out while it runs.
#[derive(Debug)]
pub struct DaemonProc {
    pub child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
    /// Just before the spawn: boot time is `started.elapsed()` when [`DaemonProc::spawn`]
    /// returns.
    pub started: Instant,
}

impl DaemonProc {
    /// Starts the daemon (stderr to `log`, on `127.0.0.1:0`) and waits, up to `timeout`, until
    /// `/health` answers (with `agents` agents, if given), polling every 2 ms.
    pub fn spawn(
        drover: &Path,
        home: &Path,
        log: &Path,
        agents: Option<usize>,
        timeout: Duration,
    ) -> Result<DaemonProc> {
        Self::spawn_env(drover, home, log, agents, timeout, &[])
    }

    /// As [`DaemonProc::spawn`], with these variables in the daemon's environment.
    pub fn spawn_env(
        drover: &Path,
        home: &Path,
        log: &Path,
        agents: Option<usize>,
        timeout: Duration,
        env: &[(&str, &str)],
    ) -> Result<DaemonProc> {
        let info_path = home.join("daemon.json");
        match fs::remove_file(&info_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("cannot remove a stale daemon.json"),
        }
        let stderr = File::create(log)?;
        let started = Instant::now();
        let child = Command::new(drover)
            .arg("daemon")
            .arg("--home")
            .arg(home)
            .args(["--listen", "127.0.0.1:0"])
            // The benches' clients are plain sockets that say `hello` without a token; the
            // token check is one comparison per connection, nothing a figure would show.
            .arg("--no-token")
            .env_remove("DROVER_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot run `{}`", drover.display()))?;
        let pid = child.id();
        let mut reaper = Reaper(Some(child));
        let mut addr = None;
        loop {
            ensure!(
                started.elapsed() < timeout,
                "the daemon did not come up within {timeout:?}; its stderr: {}",
                log.display()
            );
            if let Some(status) = reaper.child()?.try_wait()? {
                bail!(
                    "the daemon exited during boot ({status}): {}",
                    fs::read_to_string(log).unwrap_or_default().trim()
                );
            }
            if addr.is_none() {
                addr = daemon_addr(&info_path, pid);
            }
            if let Some(addr) = addr
                && let Some(health) = get_health(addr)
                && agents.is_none_or(|n| health["agents"].as_u64() == Some(n as u64))
            {
                let child = reaper.take()?;
                return Ok(DaemonProc {
                    child,
                    pid,
                    addr,
                    started,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A client of this daemon that said `hello` as `client`.
    pub async fn connect(&self, client: &str) -> Result<Ws> {
        let mut ws = ws_connect(&format!("ws://{}/ws", self.addr)).await?;
        hello(&mut ws, client).await?;
        Ok(ws)
    }

    /// `VmRSS` and `VmHWM` in KB.
    pub fn mem(&self) -> Result<(u64, u64)> {
        proc_mem_kb(self.pid)
    }

    /// SIGTERM, and waits (up to 20 s) for the ordered shutdown; its exit status.
    pub fn stop(mut self) -> Result<ExitStatus> {
        let killed = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .context("cannot run `kill`")?;
        ensure!(killed.success(), "`kill -TERM {}` failed", self.pid);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
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

/// A child killed on drop unless taken.
#[derive(Debug)]
pub struct Reaper(pub Option<Child>);

impl Reaper {
    pub fn child(&mut self) -> Result<&mut Child> {
        self.0
            .as_mut()
            .ok_or_else(|| anyhow!("the child was taken"))
    }

    pub fn take(mut self) -> Result<Child> {
        self.0.take().ok_or_else(|| anyhow!("the child was taken"))
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut()
            && let Ok(None) = child.try_wait()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The address from `daemon.json`, once the daemon with this pid has written it.
pub fn daemon_addr(path: &Path, pid: u32) -> Option<SocketAddr> {
    let info: Value = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    if info["pid"].as_u64() != Some(u64::from(pid)) {
        return None;
    }
    info["url"].as_str()?.strip_prefix("http://")?.parse().ok()
}

/// `GET /health` over a bare HTTP/1.0 connection: the JSON body of a 200, else `None`.
pub fn get_health(addr: SocketAddr) -> Option<Value> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    // The daemon answers only a `Host` that names it, port included (DNS rebinding).
    let get = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(get.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    if head.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

// ---- the client protocol --------------------------------------------------------------------

/// A client connection to the daemon's `/ws`.
pub type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// The longest a connect or one message may take.
pub const WS_WAIT: Duration = Duration::from_secs(60);

pub async fn ws_connect(url: &str) -> Result<Ws> {
    let (ws, _) = tokio::time::timeout(WS_WAIT, tokio_tungstenite::connect_async(url))
        .await
        .map_err(|_| anyhow!("connecting to {url} timed out"))?
        .with_context(|| format!("cannot connect to {url}"))?;
    Ok(ws)
}

pub async fn send_json(ws: &mut Ws, message: &Value) -> Result<()> {
    ws.send(Message::Text(message.to_string().into())).await?;
    Ok(())
}

/// The next text message, as JSON (other frames are skipped).
pub async fn recv_json(ws: &mut Ws) -> Result<Value> {
    loop {
        let frame = tokio::time::timeout(WS_WAIT, ws.next())
            .await
            .map_err(|_| anyhow!("no message from the daemon in {WS_WAIT:?}"))?
            .ok_or_else(|| anyhow!("the daemon closed the connection"))??;
        if let Message::Text(text) = frame {
            return Ok(serde_json::from_str(&text)?);
        }
    }
}

/// Says hello as `client` and returns the `session_state`.
pub async fn hello(ws: &mut Ws, client: &str) -> Result<Value> {
    send_json(
        ws,
        &json!({"type": "hello", "client": client, "protocolVersion": 1}),
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
pub async fn request(ws: &mut Ws, mut message: Value, id: String) -> Result<Value> {
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

// ---- /proc ----------------------------------------------------------------------------------

/// A `Field:   123 kB` line of `/proc/PID/status`, in KB.
pub fn proc_field_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// `VmRSS` and `VmHWM` of a process in KB (0 where missing).
pub fn proc_mem_kb(pid: u32) -> Result<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .context("cannot read the daemon's /proc status")?;
    Ok((
        proc_field_kb(&status, "VmRSS:").unwrap_or(0),
        proc_field_kb(&status, "VmHWM:").unwrap_or(0),
    ))
}

/// User + system CPU time of a process, all threads (`/proc/PID/stat`, in `USER_HZ` = 100 ticks).
pub fn proc_cpu_time(pid: u32) -> Result<Duration> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))
    };
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

// ---- statistics -----------------------------------------------------------------------------

/// Wall-clock nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The `q` quantile of sorted nanoseconds.
// `q` is in 0..=1, so the index is a non-negative number at most `len`: it fits a usize.
#[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn quantile(sorted: &[u64], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    Duration::from_nanos(sorted.get(i).copied().unwrap_or(0))
}

pub fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

pub fn median_f64(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

// ---- formats --------------------------------------------------------------------------------

/// `1.23 s`, `4.5 ms` or `67.8 µs`.
pub fn fmt_dur(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// KB as `12.3 MB`.
pub fn fmt_kb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

/// Bytes as `1.2 MB` or `34.5 KB`.
pub fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KB", b as f64 / 1024.0)
    }
}
