//! A new drover against the daemon of another drover still running for the same home (after an
//! upgrade): every command says which is older and how to restart the daemon, and `drover
//! daemon stop` still stops it. The other daemon is a real process holding the home as a
//! daemon does (the lock, `daemon.json`, `/health`, `/ws`), speaking only its own protocol.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(20);

/// Set when this test binary runs as [`another_drovers_daemon`]: the home it holds.
const FAKE_HOME: &str = "DROVER_TEST_OTHER_DAEMON_HOME";
/// The protocol that daemon speaks.
const FAKE_PROTOCOL: &str = "DROVER_TEST_OTHER_DAEMON_PROTOCOL";

/// Not a test of its own: with [`FAKE_HOME`] set (this binary started by [`OtherDaemon`]), it
/// is the daemon of a drover of protocol [`FAKE_PROTOCOL`], as a drover of that protocol
/// holds a home and answers: `daemon.lock` locked, `daemon.json` published, `/health` naming
/// its protocol, and a `hello` of any other protocol refused with `unsupported_version`: below
/// 3 in the words alone ("this daemon speaks protocol N, not M"), as drovers before its
/// `details` did; from 3 in other words, the protocols in `details`. SIGTERM stops it, as it
/// stops a daemon. Without the variable it returns at once.
#[test]
fn another_drovers_daemon() {
    let Some(home) = std::env::var_os(FAKE_HOME).map(PathBuf::from) else {
        return;
    };
    let protocol: u64 = std::env::var(FAKE_PROTOCOL)
        .expect("protocol")
        .parse()
        .expect("a number");
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(home.join("daemon.lock"))
        .expect("daemon.lock");
    lock.try_lock().expect("the home is free");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let info = json!({"version": 1, "pid": std::process::id(), "url": url,
            "daemonVersion": "0.0.1", "startedAt": "2026-01-01T00:00:00Z"});
        std::fs::write(home.join("daemon.json"), info.to_string()).expect("daemon.json");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM");
        loop {
            tokio::select! {
                _ = term.recv() => break,
                accepted = listener.accept() => {
                    let (stream, _) = accepted.expect("accept");
                    tokio::spawn(serve(stream, protocol));
                }
            }
        }
        let _ = std::fs::remove_file(home.join("daemon.json"));
    });
    drop(lock);
}

/// One connection to [`another_drovers_daemon`]: `/health`, or `/ws` up to `hello`.
async fn serve(mut stream: tokio::net::TcpStream, protocol: u64) {
    let mut head = vec![0u8; 4096];
    let Ok(n) = stream.peek(&mut head).await else {
        return;
    };
    let head = String::from_utf8_lossy(&head[..n]).to_ascii_lowercase();
    if !head.contains("upgrade: websocket") {
        let mut request = vec![0u8; 4096];
        let _ = stream.read(&mut request).await;
        let body = json!({"status": "ok", "version": "0.0.1", "protocolVersion": protocol,
            "pid": std::process::id(), "agents": 0});
        let body = body.to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        return;
    }
    let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let Some(Ok(Message::Text(hello))) = socket.next().await else {
        return;
    };
    let hello: Value = serde_json::from_str(&hello).unwrap_or_default();
    let theirs = &hello["protocolVersion"];
    let answers = if theirs.as_u64() == Some(protocol) {
        vec![
            json!({"type": "welcome", "payload": {"daemonVersion": "0.0.1",
                "protocolVersion": protocol, "sessionId": "s"}}),
            json!({"type": "session_state", "payload": {"agents": [], "workspaces": [], "hosts": []}}),
        ]
    } else if protocol < 3 {
        vec![
            json!({"type": "request_error", "payload": {"code": "unsupported_version",
            "message": format!("this daemon speaks protocol {protocol}, not {theirs}")}}),
        ]
    } else {
        // A drover from after the refusal said its protocols in `details`: its words may
        // change, and the CLI reads the details.
        vec![
            json!({"type": "request_error", "payload": {"code": "unsupported_version",
            "message": format!("protocol {theirs} is not served here"),
            "details": {"protocolVersion": protocol, "oldestProtocolVersion": protocol}}}),
        ]
    };
    for answer in answers {
        let _ = socket.send(Message::Text(answer.to_string().into())).await;
    }
    // Open until the client goes.
    while let Some(Ok(_)) = socket.next().await {}
}

/// [`another_drovers_daemon`] running for a home.
struct OtherDaemon {
    child: Child,
}

impl OtherDaemon {
    fn start(home: &Path, protocol: u32) -> OtherDaemon {
        let child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["another_drovers_daemon", "--exact", "--nocapture"])
            .env(FAKE_HOME, home)
            .env(FAKE_PROTOCOL, protocol.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the other daemon");
        let mut daemon = OtherDaemon { child };
        let deadline = Instant::now() + WAIT;
        while !home.join("daemon.json").exists() {
            assert!(daemon.running(), "the other daemon exited at start");
            assert!(Instant::now() < deadline, "the other daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("poll").is_none()
    }
}

impl Drop for OtherDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn drover(home: &Path, args: &[&str]) -> Output {
    drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover"), home)
        .env("DROVER_HOME", home)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run drover")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The advice every command gives against a daemon of an older drover.
fn says_how_to_upgrade(out: &Output) {
    says_how_to_upgrade_it(out, "the running drover daemon");
}

/// The same, naming the daemon `which`.
fn says_how_to_upgrade_it(out: &Output, which: &str) {
    let err = stderr(out);
    assert!(
        err.contains(&format!("{which} is older than this drover"))
            && err.contains("protocol 1, this drover speaks 2")
            && err.contains("stop it with `drover daemon stop`, then start this drover's with `drover daemon start`"),
        "{err}"
    );
}

#[test]
fn a_daemon_of_an_older_drover_is_named_with_how_to_restart_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let mut old = OtherDaemon::start(&home, 1);

    // Any command: an error (1) saying what to do, not the daemon's bare refusal.
    for args in [
        &["ls"][..],
        &["run", "--detach", "--provider", "demo", "say hi"],
    ] {
        let out = drover(&home, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        says_how_to_upgrade(&out);
    }
    // `daemon start` does not call the old daemon a running one and stop there.
    let out = drover(&home, &["daemon", "start", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    says_how_to_upgrade(&out);
    // Nor does `drover daemon` in the foreground: it names the holder, and what to do.
    let out = drover(&home, &["daemon", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    says_how_to_upgrade_it(&out, &format!("is already using `{}`: it", home.display()));
    // `daemon status`: running, and older.
    let out = drover(&home, &["daemon", "status"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    says_how_to_upgrade(&out);
    assert!(old.running());

    // The way out works: `daemon stop` stops the old daemon, `daemon start` starts this one.
    let out = drover(&home, &["daemon", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // `stop` answers once the home is free; the process ends just after.
    let deadline = Instant::now() + WAIT;
    while old.running() {
        assert!(
            Instant::now() < deadline,
            "the old daemon still runs after `daemon stop`"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = drover(&home, &["daemon", "start", "--listen", "127.0.0.1:0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = drover(&home, &["ls"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = drover(&home, &["daemon", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_daemon_of_a_newer_drover_is_named_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let _newer = OtherDaemon::start(&home, 3);
    let out = drover(&home, &["ls"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the running drover daemon is newer than this drover")
            && err.contains("protocol 3, this drover speaks 2")
            && err.contains("use the drover that started it, or stop it with `drover daemon stop`"),
        "{err}"
    );
}
