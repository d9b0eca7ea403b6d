//! The `drover daemon` process as a user runs it: start, health, the data-directory lock,
//! ordered shutdown on signals, and boot over an existing store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_core::{AgentStatus, AttentionReason, NewAgent, NoRuntimes, Registry};

const WAIT: Duration = Duration::from_secs(20);

/// `drover` with the test's own environment (the system's `PATH`, `HOME` = `home`, no
/// `DROVER_*` of the caller's).
fn drover(home: &Path) -> Command {
    drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover"), home)
}

struct Daemon {
    child: Child,
    home: PathBuf,
    url: String,
}

impl Daemon {
    fn start(home: &Path) -> Daemon {
        Self::start_with(home, &[])
    }

    /// `drover daemon` with these arguments too.
    fn start_with(home: &Path, args: &[&str]) -> Daemon {
        let child = drover(home)
            .args(["daemon", "--home"])
            .arg(home)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn drover daemon");
        let mut daemon = Daemon {
            child,
            home: home.to_path_buf(),
            url: String::new(),
        };
        daemon.url = daemon.wait_for_url();
        daemon
    }

    /// The url from `daemon.json`, once `/health` answers there.
    fn wait_for_url(&mut self) -> String {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("poll daemon") {
                panic!("daemon exited early with {status}: {}", self.stderr());
            }
            if let Ok(bytes) = std::fs::read(self.home.join("daemon.json")) {
                let info: serde_json::Value =
                    serde_json::from_slice(&bytes).expect("daemon.json parses");
                let url = info["url"].as_str().expect("url").to_string();
                if get(&url, "/health").is_some_and(|(status, _)| status == 200) {
                    return url;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon did not serve /health within {WAIT:?}");
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: sending a signal to our own child process.
        #[expect(unsafe_code)]
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll daemon") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&mut self) -> String {
        let mut out = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut out);
        }
        out
    }

    /// `/health` with the token: the daemon's details.
    fn health(&self) -> serde_json::Value {
        let token = std::fs::read_to_string(self.home.join("token")).expect("token");
        let bearer = format!("Authorization: Bearer {}", token.trim());
        let (status, body) = get_with(&self.url, "/health", &bearer).expect("health answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("health is JSON")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET: (status, body), or None if nothing answers.
fn get(url: &str, path: &str) -> Option<(u16, String)> {
    get_with(url, path, "X-Nothing: 0")
}

/// The same with one more header line.
fn get_with(url: &str, path: &str, header: &str) -> Option<(u16, String)> {
    let addr = url.strip_prefix("http://")?;
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{header}\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn serves_health_and_publishes_its_address() {
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(home.path());
    let health = daemon.health();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["agents"], 0);
    assert_eq!(health["pid"], daemon.child.id());
    let (status, body) = get(&daemon.url, "/no-such-thing").expect("answers");
    assert_eq!(status, 404);
    assert!(body.contains("no route for GET /no-such-thing"), "{body}");
    for dir in ["agents", "workspaces", "quarantine"] {
        assert!(home.path().join(dir).is_dir(), "{dir}/ exists");
    }
}

#[test]
fn a_second_daemon_on_the_same_home_exits_at_once_naming_the_first() {
    let home = tempfile::tempdir().expect("tempdir");
    let first = Daemon::start(home.path());
    let started = Instant::now();
    let second = drover(home.path())
        .args(["daemon", "--home"])
        .arg(home.path())
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("run second daemon");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "second daemon did not exit at once"
    );
    assert!(!second.status.success());
    let message = String::from_utf8_lossy(&second.stderr);
    assert!(message.contains("another drover daemon"), "{message}");
    assert!(
        message.contains(&format!("pid {}", first.child.id())),
        "{message}"
    );
    assert!(message.contains(&first.url), "{message}");
    // The first one is unharmed.
    assert_eq!(first.health()["status"], "ok");
}

#[test]
fn sigterm_and_sigint_shut_down_in_order_and_release_the_home() {
    let home = tempfile::tempdir().expect("tempdir");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut daemon = Daemon::start(home.path());
        daemon.signal(signal);
        let status = daemon.wait();
        assert!(
            status.success(),
            "exit status after signal {signal}: {status}"
        );
        assert!(
            !home.path().join("daemon.json").exists(),
            "daemon.json removed at a clean stop"
        );
        // Nobody answers any more.
        assert!(get(&daemon.url, "/health").is_none());
    }
    let log = std::fs::read_to_string(home.path().join("daemon.log")).expect("daemon.log");
    let order = [
        "drover daemon listening",
        "no longer accepting connections",
        "closing runtimes",
        "store flushed",
        "drover daemon stopped",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|line| {
            log.find(line)
                .unwrap_or_else(|| panic!("`{line}` missing from the log:\n{log}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "shutdown out of order:\n{log}"
    );
    assert_eq!(log.matches("drover daemon stopped").count(), 2);
    // The home is free again.
    let daemon = Daemon::start(home.path());
    assert_eq!(daemon.health()["status"], "ok");
}

#[test]
fn boots_an_existing_store_reconciling_and_quarantining() {
    let home = tempfile::tempdir().expect("tempdir");
    let cwd = tempfile::tempdir().expect("cwd");
    let rt = runtime();
    let (running, idle) = rt.block_on(async {
        let (registry, _) = Registry::open(home.path(), Arc::new(NoRuntimes)).expect("open");
        let new = || NewAgent {
            provider: "codex".to_string(),
            cwd: cwd.path().to_path_buf(),
            ..NewAgent::default()
        };
        let running = registry.create_agent(new()).await.expect("create");
        registry
            .set_status(running.id, AgentStatus::Idle, None)
            .await
            .expect("idle");
        registry
            .set_status(running.id, AgentStatus::Running, None)
            .await
            .expect("running");
        let idle = registry.create_agent(new()).await.expect("create");
        registry
            .set_status(idle.id, AgentStatus::Idle, None)
            .await
            .expect("idle");
        (running.id, idle.id)
    });
    // Damage: a file that is not a record, beside the good ones.
    let folder = home
        .path()
        .join("agents")
        .join(drover_core::store::cwd_dir_name(
            &std::fs::canonicalize(cwd.path()).expect("canonical cwd"),
        ));
    let bad = folder.join(format!("{}.json", drover_core::AgentId::new()));
    std::fs::write(&bad, b"{ this is not json").expect("write damaged file");

    let mut daemon = Daemon::start(home.path());
    assert_eq!(daemon.health()["agents"], 2, "both good records load");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().success());

    assert!(!bad.exists(), "damaged file moved out of agents/");
    let quarantined: Vec<_> = std::fs::read_dir(home.path().join("quarantine"))
        .expect("quarantine")
        .flatten()
        .collect();
    assert_eq!(quarantined.len(), 1);
    let log = std::fs::read_to_string(home.path().join("daemon.log")).expect("log");
    assert!(
        log.contains(&bad.display().to_string()),
        "the log names the damaged file:\n{log}"
    );

    rt.block_on(async {
        let (registry, report) = Registry::open(home.path(), Arc::new(NoRuntimes)).expect("reopen");
        assert!(
            report.interrupted.is_empty(),
            "the daemon already reconciled"
        );
        let agent = registry.get(running).expect("running agent");
        assert_eq!(agent.status, AgentStatus::Idle);
        assert_eq!(
            agent.attention.map(|a| a.reason),
            Some(AttentionReason::Interrupted)
        );
        let agent = registry.get(idle).expect("idle agent");
        assert_eq!(agent.status, AgentStatus::Idle);
        assert_eq!(agent.attention, None);
    });
}

#[test]
fn a_token_is_created_with_owner_only_access_at_first_start() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().expect("tempdir");
    let child = drover(home.path())
        .args(["daemon", "--listen", "127.0.0.1:0", "--home"])
        .arg(home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut daemon = Daemon {
        child,
        home: home.path().to_path_buf(),
        url: String::new(),
    };
    daemon.url = daemon.wait_for_url();
    let token = home.path().join("token");
    let meta = std::fs::metadata(&token).expect("token file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(std::fs::read_to_string(&token).expect("read").trim().len() >= 32);
}

#[test]
fn home_defaults_to_drover_home_then_dot_drover() {
    let home = tempfile::tempdir().expect("tempdir");
    let user = tempfile::tempdir().expect("user home");
    for (drover_home, expected) in [
        (Some(home.path()), home.path().to_path_buf()),
        (None, user.path().join(".drover")),
    ] {
        let mut cmd = drover(user.path());
        cmd.args(["daemon", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(h) = drover_home {
            cmd.env("DROVER_HOME", h);
        }
        let child = cmd.spawn().expect("spawn");
        let mut daemon = Daemon {
            child,
            home: expected.clone(),
            url: String::new(),
        };
        daemon.url = daemon.wait_for_url();
        assert_eq!(
            daemon.health()["home"],
            expected
                .canonicalize()
                .expect("canonical")
                .display()
                .to_string()
        );
    }
}

/// Requests any web page could send (a foreign `Host`, a WebSocket from a foreign `Origin`),
/// thousands of them: all refused, and `daemon.log` grows by a line or so, not a line each.
#[test]
fn foreign_hosts_and_origins_are_refused_without_growing_the_log() {
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(home.path());
    let addr = daemon.url.trim_start_matches("http://").to_string();
    let log = home.path().join("daemon.log");
    let before = std::fs::metadata(&log).expect("daemon.log").len();
    let send = |request: &str| -> u16 {
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.write_all(request.as_bytes()).expect("write");
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let port = addr.rsplit_once(':').expect("port").1;
    let started = Instant::now();
    for n in 0..1500 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "too slow at {n}"
        );
        let host = format!("GET /health HTTP/1.0\r\nHost: evil{n}.test:{port}\r\n\r\n");
        assert_eq!(send(&host), 421, "request {n}");
        let origin = format!(
            "GET /ws HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://evil.test\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        assert_eq!(send(&origin), 403, "request {n}");
    }
    let text = std::fs::read_to_string(&log).expect("daemon.log");
    let grew = text.len() as u64 - before;
    let refusals = text
        .lines()
        .filter(|l| l.contains("refused requests"))
        .count();
    assert!(
        grew < 2_000 && refusals == 1,
        "3,000 refusals wrote {grew} bytes, {refusals} lines:\n{text}"
    );
}

#[test]
fn log_format_json_writes_one_object_a_line_and_a_line_per_turn_end() {
    let dir = tempfile::TempDir::new().expect("home");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let state = tempfile::TempDir::new().expect("agent state");
    let cwd = tempfile::TempDir::new().expect("cwd");
    drover_testkit::daemon::write_scripted_config(&home, state.path());
    let mut daemon = Daemon::start_with(&home, &["--log-format", "json"]);
    let out = drover(&home)
        .args(["run", "--home"])
        .arg(&home)
        .args(["--provider", "scripted", "--cwd"])
        .arg(cwd.path())
        .arg("say hello\nsleep 50")
        .output()
        .expect("drover run");
    drover_testkit::assert_succeeded(&out, "drover run");
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().success());

    let log = std::fs::read_to_string(home.join("daemon.log")).expect("daemon.log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for line in &lines {
        for field in ["timestamp", "level", "message", "target"] {
            assert!(line.get(field).is_some(), "no `{field}`: {line}");
        }
    }
    let ended: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["message"] == "turn ended")
        .collect();
    let [ended] = ended.as_slice() else {
        panic!("one `turn ended` line, not {}: {log}", ended.len());
    };
    assert_eq!(ended["outcome"], "completed", "{ended}");
    let agent = ended["agent"].as_str().expect("the agent id");
    assert!(agent.parse::<drover_core::AgentId>().is_ok(), "{ended}");
    // The turn ran the 50 ms the prompt asked for, and is named by its `turn_started`.
    let ms = ended["duration_ms"].as_u64().expect("duration_ms");
    assert!((50..20_000).contains(&ms), "{ended}");
    assert!(ended["turn"].as_u64().is_some(), "{ended}");
    let started = lines
        .iter()
        .find(|l| l["message"] == "turn started")
        .expect("a `turn started` line");
    assert_eq!(started["turn"], ended["turn"], "{started}");
    // The client's request that created the agent is named on what it logged.
    let created = lines
        .iter()
        .find(|l| l["message"] == "agent created")
        .expect("an `agent created` line");
    assert_eq!(created["agent"], agent, "{created}");
    let request = created["spans"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "request"))
        .expect("the request's span");
    assert!(
        request["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{created}"
    );
    // Every line the agent's task writes carries its id (its span's field).
    let in_agent: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["name"] == "agent"))
        })
        .collect();
    assert!(in_agent.len() >= 2, "{log}");
    for line in in_agent {
        let span = line["spans"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "agent"))
            .expect("the agent span");
        assert_eq!(span["agent"], agent, "{line}");
    }
}
