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

/// Agents of a store written before the daemon starts, each with a long title of multi-byte
/// characters: a `session_state` of several megabytes. Returns the titles by agent id.
fn big_store(home: &Path, cwd: &Path, agents: usize, title_len: usize) -> Vec<(String, String)> {
    let rt = runtime();
    rt.block_on(async {
        let (registry, _) = Registry::open(home, Arc::new(NoRuntimes)).expect("open");
        let mut made = Vec::with_capacity(agents);
        for n in 0..agents {
            let mut title = format!("agent {n}: ");
            let words = ["tâche", "Überprüfung", "задача", "任务", "🚀"];
            let mut w = n;
            while title.len() < title_len {
                title.push_str(words[w % words.len()]);
                title.push(' ');
                w += 1;
            }
            let agent = registry
                .create_agent(NewAgent {
                    provider: "codex".to_string(),
                    cwd: cwd.to_path_buf(),
                    title: Some(title),
                    ..NewAgent::default()
                })
                .await
                .expect("create");
            // As the registry keeps it (trimmed).
            made.push((agent.id.to_string(), agent.title.expect("a title")));
        }
        made
    })
}

/// A raw connection to `/ws` that has said `hello`: it reads the frames on the wire.
struct RawWs {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawWs {
    fn open(addr: &str, token: &str) -> RawWs {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(WAIT)).expect("timeout");
        write!(
            stream,
            "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .expect("upgrade");
        let mut ws = RawWs {
            stream,
            buf: Vec::new(),
        };
        let head_end = loop {
            if let Some(i) = ws.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            ws.fill();
        };
        let head = String::from_utf8_lossy(&ws.buf[..head_end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        // RFC 6455's example key and its answer.
        assert!(
            head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            "the accept key: {head}"
        );
        ws.buf.drain(..head_end);
        let hello = serde_json::json!({"type": "hello", "client": "raw", "protocolVersion": 1, "token": token})
            .to_string();
        ws.send(hello.as_bytes());
        ws
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).expect("read");
        assert!(n > 0, "the daemon closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// A masked text frame (of under 64 KiB).
    fn send(&mut self, payload: &[u8]) {
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut frame = vec![0x81];
        match u8::try_from(payload.len()) {
            Ok(len) if len < 0x7e => frame.push(0x80 | len),
            _ => {
                frame.push(0x80 | 0x7e);
                let len = u16::try_from(payload.len()).expect("under 64 KiB");
                frame.extend_from_slice(&len.to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        self.stream.write_all(&frame).expect("send");
    }

    /// The next frame: FIN, opcode, payload.
    fn frame(&mut self) -> (bool, u8, Vec<u8>) {
        loop {
            if self.buf.len() >= 2 {
                let (fin, opcode) = (self.buf[0] & 0x80 != 0, self.buf[0] & 0x0f);
                let header = match self.buf[1] & 0x7f {
                    126 if self.buf.len() >= 4 => Some((
                        4,
                        usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]])),
                    )),
                    127 if self.buf.len() >= 10 => Some((
                        10,
                        usize::try_from(u64::from_be_bytes(
                            self.buf[2..10].try_into().expect("8 bytes"),
                        ))
                        .expect("length"),
                    )),
                    126 | 127 => None,
                    n => Some((2, usize::from(n))),
                };
                if let Some((header, len)) = header
                    && self.buf.len() >= header + len
                {
                    let payload = self.buf[header..header + len].to_vec();
                    self.buf.drain(..header + len);
                    return (fin, opcode, payload);
                }
            }
            self.fill();
        }
    }

    /// The next message, and the sizes of the frames it came in.
    fn message(&mut self) -> (String, Vec<usize>) {
        let mut payload = Vec::new();
        let mut sizes = Vec::new();
        loop {
            let (fin, opcode, part) = self.frame();
            let expected = u8::from(sizes.is_empty());
            assert_eq!(opcode, expected, "frame {} of a message", sizes.len());
            sizes.push(part.len());
            payload.extend_from_slice(&part);
            if fin {
                return (String::from_utf8(payload).expect("UTF-8"), sizes);
            }
        }
    }

    /// Messages up to `session_state`'s.
    fn session_state(&mut self) -> (String, Vec<usize>) {
        loop {
            let (text, sizes) = self.message();
            if text.starts_with(r#"{"type":"session_state""#) {
                return (text, sizes);
            }
            assert!(text.starts_with(r#"{"type":"welcome""#), "{text:.200}");
        }
    }
}

/// `VmRSS` of a process, in KiB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A `session_state` of several megabytes reaches every client whole: on the wire it comes
/// in frames of at most 64 KiB (RFC 6455 fragments), a tungstenite client reads it as one
/// message byte for byte the same, and the CLI lists every agent with its title.
#[test]
fn a_big_session_state_arrives_whole_in_fragments() {
    const AGENTS: usize = 300;
    let home = tempfile::tempdir().expect("tempdir");
    let cwd = tempfile::tempdir().expect("cwd");
    let made = big_store(home.path(), cwd.path(), AGENTS, 12_000);
    let daemon = Daemon::start(home.path());
    let addr = daemon.url.trim_start_matches("http://").to_string();
    let token = std::fs::read_to_string(home.path().join("token")).expect("token");
    let token = token.trim();

    let (state, sizes) = RawWs::open(&addr, token).session_state();
    assert!(state.len() > 3_000_000, "{} bytes", state.len());
    assert!(
        sizes.len() > 1 && sizes.iter().all(|&n| n <= 64 * 1024),
        "{} bytes in frames of {sizes:?}",
        state.len()
    );
    let parsed: serde_json::Value = serde_json::from_str(&state).expect("session_state parses");
    let agents = parsed["payload"]["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), AGENTS);
    for (id, title) in &made {
        let agent = agents
            .iter()
            .find(|a| a["id"] == id.as_str())
            .expect("agent");
        assert!(agent["title"] == title.as_str(), "agent {id}'s title");
    }

    // The same message, whole, to a tungstenite client.
    let whole = runtime().block_on(async {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
            .await
            .expect("connect");
        let hello = serde_json::json!({"type": "hello", "client": "test", "protocolVersion": 1, "token": token});
        ws.send(Message::text(hello.to_string()))
            .await
            .expect("hello");
        loop {
            match tokio::time::timeout(WAIT, ws.next()).await {
                Ok(Some(Ok(Message::Text(text))))
                    if text.starts_with(r#"{"type":"session_state""#) =>
                {
                    return text.to_string();
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("no session_state: {other:?}"),
            }
        }
    });
    assert!(whole == state, "the tungstenite client read the same bytes");

    // The CLI.
    let out = drover(home.path())
        .env("DROVER_HOME", home.path())
        .args(["ls", "--json"])
        .output()
        .expect("drover ls");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ls --json");
    let listed = listed.as_array().expect("a list");
    assert_eq!(listed.len(), AGENTS);
    for (id, title) in &made {
        let agent = listed
            .iter()
            .find(|a| a["id"] == id.as_str())
            .expect("listed");
        assert!(
            agent["title"] == title.as_str(),
            "agent {id}'s title in `ls`"
        );
    }
}

/// A connection that stays open after a `session_state` of several megabytes does not keep
/// that much memory in the daemon (the WebSocket layer's write buffer once grew to the
/// largest message written and stayed so until the client left).
#[test]
fn open_connections_do_not_keep_a_big_session_states_memory() {
    const HELD: usize = 8;
    let home = tempfile::tempdir().expect("tempdir");
    let cwd = tempfile::tempdir().expect("cwd");
    big_store(home.path(), cwd.path(), 300, 12_000);
    let daemon = Daemon::start(home.path());
    let addr = daemon.url.trim_start_matches("http://").to_string();
    let token = std::fs::read_to_string(home.path().join("token")).expect("token");
    let token = token.trim();
    // One connection first, closed: what any snapshot costs once is not counted.
    let (state, _) = RawWs::open(&addr, token).session_state();
    assert!(state.len() > 3_000_000, "{} bytes", state.len());
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_kb(daemon.child.id());
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        let mut ws = RawWs::open(&addr, token);
        let (again, _) = ws.session_state();
        assert_eq!(again.len(), state.len());
        held.push(ws);
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_kb(daemon.child.id());
    let each = after.saturating_sub(before) * 1024 / HELD as u64;
    eprintln!(
        "session_state of {} bytes; {HELD} connections kept open: daemon VmRSS {before} → {after} KiB ({each} bytes each)",
        state.len()
    );
    assert!(
        each < state.len() as u64 / 4,
        "each open connection holds {each} bytes after a {}-byte session_state ({before} → {after} KiB)",
        state.len()
    );
    drop(held);
}
