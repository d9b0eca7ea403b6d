//! `drover daemon`: the daemon in the foreground, and `start` / `stop` / `status` for one in
//! the background.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use drover_daemon::http_client::HttpClient;
use drover_daemon::{DaemonConfig, DaemonInfo, DataDirLock};
use drover_protocol::PROTOCOL_VERSION;
use serde_json::Value;

use crate::args::{DaemonAction, DaemonArgs, ServeArgs};
use crate::client::{not_published, read_info, read_token};
use crate::error::{CliError, exit, its_other_protocol, other_protocol};

/// How long `/health` may take to answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// `drover daemon` and its actions.
pub fn run(home: &Path, daemon: DaemonArgs) -> anyhow::Result<()> {
    match daemon.action {
        None => foreground(home, &daemon.serve),
        Some(DaemonAction::Start { serve, timeout }) => start(home, &serve, seconds(timeout)?),
        Some(DaemonAction::Stop { timeout }) => stop(home, seconds(timeout)?),
        Some(DaemonAction::Status { json }) => status(home, json),
    }
}

/// A `--timeout` in seconds.
fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| anyhow::anyhow!("{s} is not a number of seconds"))
}

/// `drover daemon`: serves until Ctrl-C or SIGTERM.
fn foreground(home: &Path, serve: &ServeArgs) -> anyhow::Result<()> {
    let mut config = DaemonConfig::new(home, serve.listen)?;
    config.no_token = serve.no_token;
    config.allowed_hosts.clone_from(&serve.allow_hosts);
    // The lock comes before the port, so a second daemon on this home names the first one
    // instead of failing on a busy port.
    let lock = DataDirLock::acquire(&config.home).map_err(|e| held_by_an_older(&config.home, e))?;
    drover_daemon::logging::init(&config.home, serve.log_format.format())
        .with_context(|| format!("cannot open the log in `{}`", config.home.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| cannot_listen(config.listen, &e))?;
        // Said once it serves: a bad token file or config stops it before.
        drover_daemon::run_locked_then(lock, listener, config, shutdown_signal(), |info| {
            eprintln!(
                "drover: web UI at {}/ (`drover ui` opens it logged in)",
                info.url
            );
        })
        .await?;
        Ok(())
    })
}

/// A home held by a daemon of an older drover: the lock's error and what to do about it.
fn held_by_an_older(home: &Path, error: drover_daemon::LockError) -> anyhow::Error {
    match running(home).and_then(|(_, health)| older(&health)) {
        Some(theirs) => anyhow::anyhow!("{error}: {}", its_other_protocol(theirs)),
        None => error.into(),
    }
}

/// The protocol of a daemon older than this drover, from its `/health`: one that cannot serve
/// this drover's commands. (A newer one may still serve them: `hello` tells.)
fn older(health: &Value) -> Option<u32> {
    health
        .get("protocolVersion")
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&theirs| theirs < PROTOCOL_VERSION)
}

/// Why the daemon cannot listen on `addr`, and, for a port in use, what to do about it.
fn cannot_listen(addr: std::net::SocketAddr, e: &std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "cannot listen on {addr}: the port is in use (by another program, or the daemon of \
             another data directory); give this one another port with `--listen {ip}:PORT` \
             (`--listen {ip}:0` for any free one) or `$DROVER_LISTEN`; the CLI finds it by itself",
            ip = addr.ip(),
        )
    } else {
        anyhow::anyhow!("cannot listen on {addr}: {e}")
    }
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The daemon serving `home`, if one answers `/health` at the url it published.
pub fn running(home: &Path) -> Option<(DaemonInfo, Value)> {
    let info = read_info(home)?;
    let health = health(&info.url, home)?;
    Some((info, health))
}

/// `drover daemon start`: spawns `drover daemon` in its own process group, detached from this
/// terminal, and waits until it answers.
fn start(home: &Path, serve: &ServeArgs, timeout: Duration) -> anyhow::Result<()> {
    if let Some((info, health)) = running(home) {
        // Left running, it would refuse every command of this drover.
        if let Some(theirs) = older(&health) {
            return Err(CliError::OtherProtocol {
                theirs: Some(theirs),
                url: None,
            }
            .into());
        }
        eprintln!("drover: a daemon already runs for {}", home.display());
        outln!("{}  pid {}", info.url, info.pid);
        return Ok(());
    }
    let info = launch(home, serve, timeout)?;
    outln!("{}  pid {}", info.url, info.pid);
    eprintln!(
        "drover: daemon started for {} (output in {})",
        home.display(),
        home.join("daemon.out").display()
    );
    eprintln!(
        "drover: web UI at {} (`drover ui` opens it)",
        crate::ui::address(&info.url, home)
    );
    Ok(())
}

/// Spawns `drover daemon` for `home` in its own process group, detached from this terminal,
/// and waits until it answers; says nothing on stdout (`drover connect --stdio` owns it).
pub fn launch(home: &Path, serve: &ServeArgs, timeout: Duration) -> anyhow::Result<DaemonInfo> {
    drover_core::private::create_dir_all(home)
        .with_context(|| format!("cannot create the data directory `{}`", home.display()))?;
    let out_path = home.join("daemon.out");
    let out = drover_core::private::open_options()
        .create(true)
        .append(true)
        .open(&out_path)
        .with_context(|| format!("cannot open `{}`", out_path.display()))?;
    // `daemon.out` is kept across runs: a failed start shows only what this run wrote.
    let run_starts_at = out.metadata().map_or(0, |m| m.len());
    let err = out
        .try_clone()
        .with_context(|| format!("cannot open `{}`", out_path.display()))?;
    let exe = std::env::current_exe().context("cannot find the drover executable")?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("daemon")
        .arg("--home")
        .arg(home)
        .arg("--listen")
        .arg(serve.listen.to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    if serve.no_token {
        command.arg("--no-token");
    }
    for host in &serve.allow_hosts {
        command.arg("--allow-host").arg(host);
    }
    command.arg("--log-format").arg(serve.log_format.as_str());
    // A group of its own: Ctrl-C and the hangup of this terminal do not reach it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("cannot start `drover daemon`")?;
    let pid = child.id();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().context("cannot watch the daemon")? {
            let tail = tail_of(&out_path, run_starts_at, 20);
            anyhow::bail!(
                "the daemon exited at start ({status}); what it said in {}:\n{tail}",
                out_path.display()
            );
        }
        if let Some((info, _)) = running(home)
            && info.pid == pid
        {
            return Ok(info);
        }
        if Instant::now() >= deadline {
            return Err(CliError::Timeout(format!(
                "the daemon (pid {pid}) did not answer within {timeout:?}; see {}",
                out_path.display()
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// `drover daemon stop`: SIGTERM, then wait (bounded) until the data directory is free.
fn stop(home: &Path, timeout: Duration) -> anyhow::Result<()> {
    let Some(info) = read_info(home).filter(|_| lock_held(home)) else {
        return Err(CliError::NotRunning {
            home: home.to_path_buf(),
        }
        .into());
    };
    let raw = i32::try_from(info.pid).context("the pid in daemon.json is out of range")?;
    let pid = nix::unistd::Pid::from_raw(raw);
    let cut_off = turns_running(home);
    match nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
        Ok(()) => {}
        Err(nix::errno::Errno::ESRCH) => {
            return Err(CliError::NotRunning {
                home: home.to_path_buf(),
            }
            .into());
        }
        Err(e) => return Err(anyhow::anyhow!("cannot signal pid {}: {e}", info.pid)),
    }
    let deadline = Instant::now() + timeout;
    // The lock goes when the process does: a zombie or a reused pid cannot fool this.
    while lock_held(home) {
        if Instant::now() >= deadline {
            return Err(CliError::Timeout(format!(
                "the daemon (pid {}) is still running after {timeout:?}",
                info.pid
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    eprintln!("drover: daemon stopped (pid {})", info.pid);
    if let Some(advice) = cut_off.advice() {
        eprint!("{advice}");
    }
    Ok(())
}

/// The turns a stop cuts off: this daemon's own agents running one (a host's agents keep
/// running on their own daemon), as one line each (`  1a2b3c4d  fixer (waiting for your
/// permission)`), apart by what the next boot does with them.
#[derive(Debug, Default)]
struct CutOff {
    /// Those whose policy is `notify`: they wait with attention `interrupted`.
    waiting: Vec<String>,
    /// Those whose policy is `continue`: the next boot continues them by itself.
    continuing: Vec<String>,
}

impl CutOff {
    /// What to tell the user, once the daemon stopped; `None` when it cut off nothing.
    fn advice(&self) -> Option<String> {
        let count = self.waiting.len() + self.continuing.len();
        if count == 0 {
            return None;
        }
        let mut out = format!(
            "drover: it cut off {count} turn(s); a permission one of them asked is cancelled\n"
        );
        if !self.waiting.is_empty() {
            out.push_str(
                "  these wait with attention `interrupted` until they are sent something:\n",
            );
            for line in &self.waiting {
                out.push_str(line);
                out.push('\n');
            }
        }
        if !self.continuing.is_empty() {
            out.push_str(
                "  these continue by themselves once the daemon runs again (on_interrupt = \
                 continue):\n",
            );
            for line in &self.continuing {
                out.push_str(line);
                out.push('\n');
            }
        }
        if self.waiting.is_empty() {
            out.push_str("  to go on: drover daemon start\n");
        } else {
            out.push_str(
                "  to go on with one that waits: drover daemon start, then drover send ID \
                 \"continue\"\n",
            );
        }
        Some(out)
    }
}

/// The turns the daemon is running (see [`CutOff`]), as it lists them; none when it does not
/// answer within 2 s. What the next boot does with each is its own `on_interrupt`, else its
/// provider's in `config.toml` (the next boot reads the file then, as this does now), else
/// `notify`.
fn turns_running(home: &Path) -> CutOff {
    let endpoint = crate::client::Endpoint {
        home: home.to_path_buf(),
        url: None,
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return CutOff::default();
    };
    let agents = runtime.block_on(async {
        let opened = tokio::time::timeout(
            Duration::from_secs(2),
            crate::client::Connection::open(&endpoint, false),
        )
        .await;
        match opened {
            Ok(Ok((connection, state))) => {
                connection.close().await;
                state.agents
            }
            _ => Vec::new(),
        }
    });
    let providers = drover_acp::Providers::load(home).ok();
    let policy = |a: &drover_protocol::AgentInfo| {
        a.on_interrupt
            .or_else(|| providers.as_ref()?.get(&a.provider)?.on_interrupt)
            .unwrap_or_default()
    };
    let short = crate::resolve::ShortIds::new(&agents);
    let mut lines: Vec<(String, bool, String)> = agents
        .iter()
        .filter(|a| a.status == drover_protocol::AgentStatus::Running && a.host.is_none())
        .map(|a| {
            let mut line = format!("    {}", short.get(&a.id));
            if let Some(title) = &a.title {
                line.push_str("  ");
                line.push_str(title);
            }
            if a.attention_reason == Some(drover_protocol::AttentionReason::Permission) {
                line.push_str(" (waiting for your permission)");
            }
            let continues = policy(a) == drover_protocol::OnInterrupt::Continue;
            (a.id.clone(), continues, line)
        })
        .collect();
    lines.sort();
    let mut cut_off = CutOff::default();
    for (_, continues, line) in lines {
        if continues {
            cut_off.continuing.push(line);
        } else {
            cut_off.waiting.push(line);
        }
    }
    cut_off
}

/// `drover daemon status`: exit code 0 when running, 3 when not.
fn status(home: &Path, json: bool) -> anyhow::Result<()> {
    if let Some((info, health)) = running(home) {
        if json {
            outln!("{}", serde_json::to_string_pretty(&health)?);
        } else {
            let agents = health.get("agents").and_then(Value::as_u64).unwrap_or(0);
            outln!(
                "running  {}  pid {}  version {}  agents {agents}",
                info.url,
                info.pid,
                info.daemon_version
            );
        }
        if let Some(theirs) = older(&health) {
            eprintln!("drover: {}", other_protocol(Some(theirs), None));
        }
        Ok(())
    } else {
        // Another user's home: say so rather than "not running".
        if let error @ CliError::Unreadable { .. } = not_published(home) {
            return Err(error.into());
        }
        if json {
            outln!("{}", serde_json::json!({"status": "not_running"}));
        } else {
            outln!("not running");
        }
        Err(CliError::Reported {
            code: exit::NOT_RUNNING,
            message: format!("no drover daemon is running for {}", home.display()),
        }
        .into())
    }
}

/// Whether some process holds the data directory's lock.
fn lock_held(home: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(home.join("daemon.lock"))
    else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// `GET /health` with the token (the details need it): the JSON body, if it answers 200 in
/// time.
fn health(url: &str, home: &Path) -> Option<Value> {
    let url = format!("{}/health", url.trim_end_matches('/'));
    let bearer = format!("Bearer {}", read_token(home).unwrap_or_default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let answer = runtime
        .block_on(HttpClient::new(HEALTH_TIMEOUT).get(&url, &[("authorization", &bearer)]))
        .ok()?;
    if answer.status != 200 {
        return None;
    }
    answer.json().ok()
}

/// The last `lines` lines written to `path` after byte `from`.
fn tail_of(path: &Path, from: u64, lines: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[from..]);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
