//! The `drover` client commands as a user runs them, against a real daemon process with the
//! scripted provider: output (insta snapshots, ids, paths and times redacted) and exit codes.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);
const DROVER: &str = env!("CARGO_BIN_EXE_drover");

/// What one `drover` invocation did.
#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    /// `exit`, stdout and stderr, as a snapshot shows them.
    fn transcript(&self) -> String {
        format!(
            "exit: {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{}", self.transcript());
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

/// A data directory with the scripted provider, a working directory, and (once started) a
/// daemon process serving them.
struct Fixture {
    home: TempDir,
    state: TempDir,
    cwd: TempDir,
    /// `HOME` of the daemon and its agents.
    user: TempDir,
    daemon: Option<Child>,
}

impl Fixture {
    /// A home with no daemon.
    fn new() -> Fixture {
        let fixture = Fixture {
            home: TempDir::new().expect("home"),
            state: TempDir::new().expect("state"),
            cwd: TempDir::new().expect("cwd"),
            user: TempDir::new().expect("user home"),
            daemon: None,
        };
        drover_testkit::daemon::write_scripted_config(fixture.home(), fixture.state.path());
        // And a provider whose agent exits at once.
        let config = fixture.home().join("config.toml");
        let mut text = std::fs::read_to_string(&config).expect("config");
        text.push_str("\n[providers.broken]\ncommand = [\"/bin/sh\", \"-c\", \"exit 3\"]\n");
        std::fs::write(&config, text).expect("config");
        fixture
    }

    /// A home with a daemon running (`drover daemon --listen 127.0.0.1:0`).
    fn start() -> Fixture {
        Fixture::start_with(&[])
    }

    /// Same, with more `drover daemon` arguments.
    fn start_with(args: &[&str]) -> Fixture {
        Fixture::new().serve(Command::new(DROVER), args)
    }

    /// A daemon started under this umask (by a shell), as a user's login shell would.
    fn start_under_umask(umask: &str, prepare: impl FnOnce(&Fixture)) -> Fixture {
        let fixture = Fixture::new();
        prepare(&fixture);
        let mut shell = Command::new("/bin/sh");
        shell
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(DROVER);
        fixture.serve(shell, &[])
    }

    /// Runs `command daemon --home HOME --listen 127.0.0.1:0 ARGS` and waits until it serves.
    fn serve(mut self, mut command: Command, args: &[&str]) -> Fixture {
        let child = drover_testkit::hermetic::apply(&mut command, self.user.path())
            .args(["daemon", "--home"])
            .arg(self.home())
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn drover daemon");
        self.daemon = Some(child);
        let deadline = Instant::now() + WAIT;
        while !self.home().join("daemon.json").exists() {
            assert!(Instant::now() < deadline, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        self
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    /// Adds provider `name` to config.toml: the scripted provider's entry with `env` (TOML
    /// `KEY = "value"` pairs) added to its environment.
    fn add_scripted_provider(&self, name: &str, env: &str) {
        let config = self.home().join("config.toml");
        let text = std::fs::read_to_string(&config).expect("config");
        let entry = text
            .split("\n[providers.broken]")
            .next()
            .unwrap_or_default()
            .replace("[providers.scripted]", &format!("[providers.{name}]"))
            .replace(" }", &format!(", {env} }}"));
        std::fs::write(&config, format!("{text}\n{entry}")).expect("config");
    }

    fn cwd(&self) -> PathBuf {
        std::fs::canonicalize(self.cwd.path()).expect("cwd")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = drover_testkit::hermetic::command(DROVER, Path::new("/nonexistent"));
        command
            .args(args)
            .current_dir(self.cwd())
            .env("DROVER_HOME", self.home())
            .env("DROVER_PROVIDER", "scripted");
        command
    }

    /// Runs `drover ARGS` to the end.
    fn drover(&self, args: &[&str]) -> Out {
        let out = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run drover");
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `drover run -d ...`: the new agent's id.
    fn spawn_agent(&self, extra: &[&str], prompt: &str) -> String {
        let mut args = vec!["run", "-d"];
        args.extend_from_slice(extra);
        args.push(prompt);
        let out = self.drover(&args).ok();
        out.stdout.trim().to_string()
    }

    fn info(&self, id: &str) -> Value {
        self.drover(&["inspect", id, "--json"]).ok().json()
    }

    /// Polls until the agent's status is `status`.
    fn wait_status(&self, id: &str, status: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let info = self.info(id);
            if info["status"] == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{id} never became {status}: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Paths of this fixture replaced by placeholders.
    fn redact(&self, text: &str) -> String {
        let agent = drover_testkit::scripted_agent_bin();
        let mut text = text.to_string();
        for (path, name) in [
            (self.cwd(), "[CWD]"),
            (self.home().to_path_buf(), "[HOME]"),
            (self.state.path().to_path_buf(), "[STATE]"),
            (agent, "[SCRIPTED_AGENT]"),
        ] {
            text = text.replace(&path.display().to_string(), name);
        }
        // The workspace is named after the directory.
        let cwd = self.cwd();
        let cwd_name = cwd.file_name().expect("a name").to_string_lossy();
        text.replace(cwd_name.as_ref(), "[CWD_NAME]")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: signalling our own child.
                #[expect(unsafe_code)]
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let deadline = Instant::now() + WAIT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Insta settings that redact ids, times, durations, pids and ports.
fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    for (pattern, replacement) in [
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[ID]",
        ),
        // Short ids pad their table column: the padding goes with them.
        (r"\b[0-9a-f]{8}(?:-[0-9a-f]{1,12})* {2,}", "[ID]  "),
        (r"\b[0-9a-f]{8}(?:-[0-9a-f]{1,12})*\b", "[ID]"),
        (r"(?m)^ID +", "ID  "),
        (r"\d{4}-\d{2}-\d{2}T[0-9:.]+Z", "[TS]"),
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", "[DATE]"),
        (r"\b\d{2}:\d{2}:\d{2}\b", "[TIME]"),
        (r"\b\d+\.\d+s\b", "[ELAPSED]"),
        (r"\(\d+[smhd] ago\)", "([AGE] ago)"),
        // "in 5h" and "in 15h" pad their column differently.
        (r"\(in \d+[smhd]\) {2,}", "(in [LEFT])  "),
        (r"\(in \d+[smhd]\)", "(in [LEFT])"),
        (r"\b\d+[smhd] ago, failed", "[AGE] ago, failed"),
        (r"\b\d+[smhd] ago  ", "[AGE] ago  "),
        (r"  \d{1,2}[smhd] {2,3}", "  [AGE]  "),
        (r"pid \d+", "pid [PID]"),
        (r"\b\d+ process(es)?, \d+\.\d MB", "[PROCESSES], [RSS]"),
        (r"\(in \d+[smhd]\)", "(in [AGE])"),
        (r"#token=[0-9a-f]+", "#token=[TOKEN]"),
        (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
        (r"scripted-\d+-\d+-\d+", "scripted-[SESSION]"),
    ] {
        settings.add_filter(pattern, replacement);
    }
    settings
}

macro_rules! snapshot {
    ($name:expr, $value:expr) => {
        settings().bind(|| insta::assert_snapshot!($name, $value))
    };
}

/// A `drover` process still running, its stdout read line by line.
struct Live {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Live {
    fn spawn(fixture: &Fixture, args: &[&str]) -> Live {
        let mut child = fixture
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn drover");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Live {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads stdout until a line contains `text`.
    fn expect_line(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.seen.iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with `{text}` in:\n{}", self.seen.join("\n")));
            self.seen.push(line);
        }
    }

    fn interrupt(&self) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: signalling our own child.
        #[expect(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
    }

    /// Waits for the exit and collects the rest of the output.
    fn finish(mut self) -> Out {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll") {
                break status;
            }
            assert!(Instant::now() < deadline, "drover did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        let mut stdout = self.seen.join("\n");
        if !stdout.is_empty() {
            stdout.push('\n');
        }
        Out {
            code: status.code().unwrap_or(-1),
            stdout,
            stderr,
        }
    }
}

// ---- run --------------------------------------------------------------------------------------

#[test]
fn run_streams_the_reply_and_tool_calls_then_summarizes() {
    let fx = Fixture::start();
    let out = fx.drover(&[
        "run",
        "--title",
        "greeter",
        "say hello there\ntool build\nstream 3 20",
    ]);
    snapshot!("run_streams", out.transcript());
    assert_eq!(out.code, 0);

    let failed = fx.drover(&["run", "--title", "doomed", "say trying\nfail boom"]);
    snapshot!("run_failed_turn", failed.transcript());
    assert_eq!(failed.code, 1);
}

#[test]
fn run_says_when_the_agent_is_quiet_during_its_turn_but_not_while_it_asks() {
    let fx = Fixture::start();
    let out = fx
        .command(&[
            "run",
            "--title",
            "quiet",
            "say before\nsleep 1800\nsay after",
        ])
        .env("DROVER_QUIET_SECS", "0.5")
        .stdin(Stdio::null())
        .output()
        .expect("run drover");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "before\nafter\n", "{stderr}");
    let quiet: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("-- nothing from the agent for "))
        .collect();
    // At 0.5 s, then 1 s (then 2 s, after the turn ended).
    assert!((1..=3).contains(&quiet.len()), "{stderr}");
    let handle = fx.info("quiet")["id"]
        .as_str()
        .map(|id| id.replace('-', "")[24..].to_string())
        .unwrap_or_default();
    assert!(
        quiet[0].ends_with(&format!(
            "its turn still runs (an agent retrying its model API, after a refused key or a \
             rate limit, says nothing meanwhile): `drover stop {handle}` cancels it"
        )),
        "{stderr}"
    );
    // Waiting for your answer is not the agent being quiet. The threshold is well above the
    // time from the turn's start to the question on a loaded machine, and the wait for the
    // answer well above the threshold: a note about the wait would be printed in it.
    let mut asking = fx
        .command(&["run", "--title", "asking", "permission deploy"])
        .env("DROVER_QUIET_SECS", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn drover");
    let deadline = Instant::now() + WAIT;
    loop {
        // The agent may not be made yet: `inspect` fails until it is.
        let inspected = fx.drover(&["inspect", "asking", "--json"]);
        if inspected.code == 0 && inspected.json()["attentionReason"] == "permission" {
            break;
        }
        assert!(Instant::now() < deadline, "never asked");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(3500));
    fx.drover(&["permit", "asking", "allow"]).ok();
    let mut stderr = String::new();
    asking
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert!(asking.wait().expect("exit").success(), "{stderr}");
    assert!(!stderr.contains("nothing from the agent"), "{stderr}");
}

#[test]
fn run_reports_an_agent_that_cannot_start() {
    let fx = Fixture::start();
    let out = fx.drover(&["run", "--provider", "broken", "say hi"]);
    assert_eq!(out.code, 1, "{}", out.transcript());
    assert!(
        out.stderr
            .contains("closed before it answered `initialize`"),
        "{}",
        out.stderr
    );
    // A preset that is not installed: how to install it, and how to try drover without it.
    let missing = fx.drover(&["run", "--provider", "codex", "hi"]);
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    assert!(
        missing
            .stderr
            .contains("npm install -g @zed-industries/codex-acp")
            && missing
                .stderr
                .contains("`drover run --provider demo hello`"),
        "{}",
        missing.stderr
    );
    let unknown = fx.drover(&["run", "--provider", "nope", "say hi"]);
    snapshot!("run_unknown_provider", unknown.transcript());
    assert_eq!(unknown.code, 4);
}

#[test]
fn run_detached_prints_the_id_and_wait_and_logs_follow_it() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "bg"], "stream 2 50");
    assert_eq!(id.len(), 36, "{id}");
    let waited = fx.drover(&["wait", &id]);
    assert_eq!(waited.code, 0, "{}", waited.transcript());
    let logs = fx.drover(&["logs", "bg"]).ok();
    snapshot!("logs_all", fx.redact(&logs.transcript()));
    let tail = fx.drover(&["logs", &id[..13], "--tail", "2"]).ok();
    snapshot!("logs_tail", tail.transcript());
    let json = fx.drover(&["logs", "bg", "--json"]).ok();
    let kinds: Vec<String> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .map(|v| v["item"]["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "user_message",
            "turn_started",
            "agent_message",
            "turn_ended"
        ]
    );

    let json = fx
        .drover(&["run", "-d", "--json", "--title", "bg2", "say x"])
        .ok();
    assert_eq!(json.json()["title"], "bg2");
    assert_eq!(json.json()["cwd"], fx.cwd().display().to_string());
}

#[test]
fn run_shows_permission_requests_and_permit_answers_them() {
    let fx = Fixture::start();
    let mut run = Live::spawn(&fx, &["run", "--title", "deployer", "permission deploy"]);
    run.expect_line("answer with");
    let permit = fx.drover(&["permit", "deployer", "allow"]);
    snapshot!("permit_allow", permit.transcript());
    assert_eq!(permit.code, 0);
    let out = run.finish();
    snapshot!("run_with_permission", out.transcript());
    assert_eq!(out.code, 0);

    // Nothing left to answer: refused.
    let again = fx.drover(&["permit", "deployer", "deny", "--always"]);
    assert_eq!(again.code, 5, "{}", again.transcript());
    assert!(
        again.stderr.contains("no pending permission"),
        "{}",
        again.stderr
    );
    // Named by its handle, as every other line names it, not by the daemon's full id.
    let deployer = fx.info("deployer")["id"].as_str().expect("id").to_string();
    assert!(
        again.stderr.starts_with(&format!(
            "drover: agent {} has no pending permission",
            &deployer[deployer.len() - 8..]
        )) && !again.stderr.contains(&deployer),
        "{}",
        again.stderr
    );

    // Denied once: the agent says so.
    let id = fx.spawn_agent(&["--title", "denied"], "permission rm -rf");
    fx.wait_status(&id, "running");
    let deadline = Instant::now() + WAIT;
    while fx.info(&id)["attentionReason"] != "permission" {
        assert!(Instant::now() < deadline, "no permission request");
        std::thread::sleep(Duration::from_millis(20));
    }
    fx.drover(&["permit", &id, "deny"]).ok();
    fx.drover(&["wait", &id]).ok();
    let logs = fx.drover(&["logs", &id, "--tail", "4"]).ok();
    snapshot!("permit_deny_logs", logs.transcript());

    // --allow-all never asks.
    let out = fx.drover(&["run", "--allow-all", "permission deploy"]).ok();
    assert!(out.stdout.contains("permission granted"), "{}", out.stdout);
}

// ---- ls ---------------------------------------------------------------------------------------

#[test]
fn ls_shows_a_table_a_tree_and_json() {
    let fx = Fixture::start();
    let empty = fx.drover(&["ls"]);
    snapshot!("ls_empty", empty.transcript());
    let parent = fx.spawn_agent(&["--title", "parent"], "say p");
    let child = fx.spawn_agent(&["--title", "child", "--parent", "parent"], "say c");
    let grandchild = fx.spawn_agent(&["--title", "grandchild", "--parent", &child], "say g");
    let second = fx.spawn_agent(&["--title", "second child", "--parent", &parent], "say s");
    let solo = fx.spawn_agent(&["--title", "solo"], "say alone");
    for id in [&parent, &child, &grandchild, &second, &solo] {
        fx.drover(&["wait", id]).ok();
    }
    let table = fx.drover(&["ls"]).ok();
    snapshot!("ls_table", fx.redact(&table.transcript()));
    let tree = fx.drover(&["ls", "--tree"]).ok();
    snapshot!("ls_tree", fx.redact(&tree.transcript()));
    let json = fx.drover(&["ls", "--json"]).ok().json();
    let agents = json.as_array().expect("an array");
    assert_eq!(agents.len(), 5);
    assert_eq!(agents[1]["id"], child.as_str());
    assert_eq!(agents[1]["parentAgentId"], parent.as_str());
    assert_eq!(agents[1]["status"], "idle");
    assert_eq!(agents[1]["type"], "scripted");
}

#[test]
fn ls_narrows_a_fleet_to_what_needs_me_what_runs_and_what_failed() {
    let fx = Fixture::start();
    let done = fx.spawn_agent(&["--title", "done"], "say finished");
    let asking = fx.spawn_agent(&["--title", "asking"], "permission deploy");
    let busy = fx.spawn_agent(&["--title", "busy"], "sleep 20000");
    let broken = fx.spawn_agent(&["--title", "broken"], "fail it broke");
    let waited = fx.drover(&["wait", &done, &broken, "--timeout", "20"]);
    assert_eq!(waited.code, 1, "{}", waited.stderr);
    fx.wait_status(&busy, "running");
    let deadline = Instant::now() + WAIT;
    while fx.info(&asking)["attentionReason"] != "permission" {
        assert!(Instant::now() < deadline, "{}", fx.info(&asking));
        std::thread::sleep(Duration::from_millis(20));
    }
    let titles = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["ls"];
        all.extend_from_slice(args);
        let out = fx.drover(&all).ok();
        let mut titles: Vec<String> = out
            .stdout
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect();
        titles.sort();
        titles
    };
    assert_eq!(titles(&[]), ["asking", "broken", "busy", "done"]);
    // A finished turn is no need; a permission and a failure are.
    assert_eq!(titles(&["--needs-me"]), ["asking", "broken"]);
    assert_eq!(titles(&["--running"]), ["asking", "busy"]);
    assert_eq!(titles(&["--errors"]), ["broken"]);
    assert_eq!(titles(&["--errors", "--tree"]), ["broken"]);
    let json = fx.drover(&["ls", "--needs-me", "--json"]).ok().json();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    // Filters are one at a time, as in the web UI.
    let both = fx.drover(&["ls", "--running", "--errors"]);
    assert_eq!(both.code, 2, "{}", both.stderr);
    // Nothing left: said on stderr, with how many there are.
    fx.drover(&["stop", &busy]).ok();
    fx.drover(&["permit", "asking", "allow"]).ok();
    fx.drover(&["wait", &busy, &asking, "--timeout", "20"]).ok();
    let none = fx.drover(&["ls", "--running"]).ok();
    assert_eq!(none.stdout, "");
    assert_eq!(
        none.stderr,
        "drover: no agent is running (4 agents in all)\n"
    );
}

// ---- send, wait, stop -------------------------------------------------------------------------

#[test]
fn send_queues_followups_steers_and_injects() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "talker"], "say first");
    fx.drover(&["wait", &id]).ok();

    let sent = fx.drover(&["send", "talker", "say second"]);
    snapshot!("send_followup", sent.transcript());
    fx.drover(&["wait", &id]).ok();

    // A steer cancels the running turn and goes first.
    fx.drover(&["send", &id, "sleep 20000"]).ok();
    fx.wait_status(&id, "running");
    let steer = fx.drover(&["send", &id, "--steer", "say steered"]).ok();
    assert!(
        steer.stdout.starts_with("queued steer for "),
        "{}",
        steer.stdout
    );

    // Context for the next prompt: it does not wake the agent.
    fx.drover(&["wait", &id, "--timeout", "20"]).ok();
    let inject = fx
        .drover(&["send", &id, "--inject", "the build is green", "--json"])
        .ok();
    assert_eq!(inject.json()["delivery"], "inject");
    fx.drover(&["wait", &id]).ok();
    assert_eq!(fx.info(&id)["status"], "idle");
    fx.drover(&["send", &id, "echo-prompt"]).ok();
    fx.drover(&["wait", &id]).ok();

    let logs = fx.drover(&["logs", &id]).ok();
    snapshot!("send_logs", logs.transcript());
}

#[test]
fn wait_times_out_and_stop_cancels_the_turn() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "sleeper"], "sleep 20000");
    fx.wait_status(&id, "running");
    let waited = fx.drover(&["wait", "sleeper", "--timeout", "0.3"]);
    snapshot!("wait_timeout", waited.transcript());
    assert_eq!(waited.code, 6);

    let stopped = fx.drover(&["stop", "sleeper"]);
    snapshot!("stop", stopped.transcript());
    fx.drover(&["wait", &id, "--timeout", "20"]).ok();
    let logs = fx.drover(&["logs", &id, "--tail", "1"]).ok();
    snapshot!("stop_logs", logs.transcript());

    // --drop-queue also discards what waits in the inbox.
    fx.drover(&["send", &id, "sleep 20000"]).ok();
    fx.wait_status(&id, "running");
    fx.drover(&["send", &id, "say never"]).ok();
    let dropped = fx.drover(&["stop", &id, "--drop-queue"]).ok();
    assert!(dropped.stdout.contains("discarded"), "{}", dropped.stdout);
    fx.drover(&["wait", &id, "--timeout", "20"]).ok();
    let logs = fx.drover(&["logs", &id, "--tail", "2"]).ok();
    snapshot!("stop_drop_queue_logs", logs.transcript());
    assert!(!logs.stdout.contains("never"));
}

#[test]
fn wait_takes_several_agents_and_names_those_still_busy_or_failed() {
    let fx = Fixture::start();
    let quick = fx.spawn_agent(&["--title", "quick"], "say done");
    let slow = fx.spawn_agent(&["--title", "slow"], "sleep 1500\nsay later");
    let broken = fx.spawn_agent(&["--title", "broken"], "fail it broke");
    let sleeper = fx.spawn_agent(&["--title", "sleeper"], "sleep 20000");
    // All three that end: one wait, under one deadline.
    let started = Instant::now();
    let waited = fx.drover(&["wait", "quick", "slow", "broken", "--timeout", "20"]);
    // One failed: a script's `drover wait … && next` does not go on.
    assert_eq!(waited.code, 1, "{}", waited.stderr);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{}",
        waited.stderr
    );
    for handle in [&quick, &slow, &broken] {
        assert_ne!(fx.info(handle)["status"], "running", "{handle}");
    }
    let short = |id: &str| id.replace('-', "")[24..].to_string();
    assert!(
        waited
            .stderr
            .contains(&format!("{} is idle\n", short(&quick)))
            && waited
                .stderr
                .contains(&format!("{} is idle\n", short(&slow)))
            && waited.stderr.contains(&format!(
                "{} is idle; its last turn failed (`drover logs {}` says why)",
                short(&broken),
                short(&broken)
            )),
        "{}",
        waited.stderr
    );
    // None failed: 0.
    fx.drover(&["wait", "quick", "slow", "--timeout", "20"])
        .ok();
    // One still busy: the timeout names it, and only it.
    let timed_out = fx.drover(&["wait", "quick", "sleeper", "--timeout", "0.5"]);
    assert_eq!(timed_out.code, 6, "{}", timed_out.stderr);
    assert!(
        timed_out
            .stderr
            .contains(&format!("{} is still busy after 0.5s", short(&sleeper))),
        "{}",
        timed_out.stderr
    );
    assert!(
        !timed_out
            .stderr
            .contains(&format!("{} is still", short(&quick))),
        "{}",
        timed_out.stderr
    );
}

#[test]
fn inspect_says_messages_queued_behind_a_turn_wait_to_run() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "busy"], "sleep 20000");
    fx.wait_status(&id, "running");
    fx.drover(&["send", "busy", "say later"]).ok();
    let inspected = fx.drover(&["inspect", "busy"]).ok();
    let queued = inspected
        .stdout
        .lines()
        .find(|l| l.starts_with("queued "))
        .unwrap_or_default();
    assert!(
        queued.ends_with("1 waiting to run: \"say later\""),
        "{}",
        inspected.stdout
    );
    fx.drover(&["stop", "busy", "--drop-queue"]).ok();
}

#[test]
fn a_turn_the_model_refused_for_its_key_says_where_the_key_is() {
    let fx = Fixture::start();
    // codex-acp's words when its model API answers 401.
    let id = fx.spawn_agent(
        &["--title", "badkey"],
        "fail unexpected status 401 Unauthorized: Incorrect API key provided: sk-bad.",
    );
    // Its turn failed: exit 1.
    assert_eq!(fx.drover(&["wait", &id, "--timeout", "20"]).code, 1);
    let logs = fx.drover(&["logs", &id]).ok();
    let failed = logs
        .stdout
        .lines()
        .find(|l| l.contains("failed:"))
        .unwrap_or_default();
    assert!(
        failed.contains("Incorrect API key provided")
            && failed.contains("[providers.scripted] env in config.toml")
            && failed.contains("drover login scripted"),
        "{}",
        logs.stdout
    );
    // Any other failure gets no such hint.
    let other = fx.spawn_agent(&["--title", "other"], "fail the disk is full");
    // Its turn failed: exit 1.
    assert_eq!(fx.drover(&["wait", &other, "--timeout", "20"]).code, 1);
    let logs = fx.drover(&["logs", &other]).ok();
    assert!(!logs.stdout.contains("drover login"), "{}", logs.stdout);
}

#[test]
fn the_turn_after_a_key_is_replaced_in_config_toml_runs_with_the_new_key() {
    let fx = Fixture::start();
    fx.add_scripted_provider("keyed", "SCRIPTED_KEY = \"old-key\"");
    // Its model API refuses the key: the hint says to replace it in config.toml.
    let id = fx.spawn_agent(
        &["--title", "keyed", "--provider", "keyed"],
        "fail unexpected status 401 Unauthorized: Incorrect API key provided: old-key.",
    );
    // `wait` exits 1: the turn it waited for failed.
    assert_eq!(fx.drover(&["wait", &id, "--timeout", "20"]).code, 1);
    assert_eq!(fx.info(&id)["runtime"]["state"], "live");
    let config = fx.home().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, text.replace("\"old-key\"", "\"the-new-key\"")).expect("config");
    // The next message runs with the new key, in the same conversation.
    fx.drover(&["send", &id, "env SCRIPTED_KEY"]).ok();
    fx.drover(&["wait", &id, "--timeout", "20"]).ok();
    let logs = fx.drover(&["logs", &id]).ok();
    assert!(logs.stdout.contains("the-new-key"), "{}", logs.stdout);
    assert!(
        logs.stdout
            .contains("the settings of provider `keyed` changed"),
        "{}",
        logs.stdout
    );
    // Unchanged settings keep the process: the turn after runs in it.
    let pid = fx.info(&id)["runtime"]["pid"].clone();
    fx.drover(&["send", &id, "env SCRIPTED_KEY"]).ok();
    fx.drover(&["wait", &id, "--timeout", "20"]).ok();
    assert_eq!(fx.info(&id)["runtime"]["pid"], pid);
}

// ---- archive, unarchive, detach ---------------------------------------------------------------

#[test]
fn archive_refuses_running_work_and_stop_archives_anyway() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "busy"], "sleep 30000");
    fx.wait_status(&id, "running");
    let refused = fx.drover(&["archive", "busy"]);
    snapshot!("archive_refused", refused.transcript());
    assert_eq!(refused.code, 5);
    assert!(fx.info(&id)["archivedAt"].is_null());

    let archived = fx.drover(&["archive", "busy", "--stop"]);
    snapshot!("archive_stop", archived.transcript());
    assert_eq!(archived.code, 0);
    let ls = fx.drover(&["ls"]).ok();
    assert!(ls.stdout.is_empty(), "{}", ls.stdout);
    // The archive answers once it is written; the runtime it stops closes after (docs:
    // lifecycle.md), and `ls --all` shows it cold then.
    let deadline = Instant::now() + WAIT;
    while fx.info(&id)["runtime"]["state"] != "cold" {
        assert!(Instant::now() < deadline, "{id}'s runtime never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = fx.drover(&["ls", "--all"]).ok();
    snapshot!("ls_all_archived", fx.redact(&all.transcript()));

    let back = fx.drover(&["unarchive", "busy"]);
    snapshot!("unarchive", back.transcript());
    assert_eq!(back.code, 0);
    assert!(fx.info(&id)["archivedAt"].is_null());
    // Archived again when idle: no refusal.
    fx.drover(&["wait", &id]).ok();
    let json = fx.drover(&["archive", &id, "--json"]).ok().json();
    assert_eq!(json["archived"][0], id.as_str());
}

#[test]
fn detach_makes_a_subagent_top_level() {
    let fx = Fixture::start();
    let parent = fx.spawn_agent(&["--title", "boss"], "say b");
    let child = fx.spawn_agent(&["--title", "helper", "--parent", &parent], "say h");
    fx.drover(&["wait", &child]).ok();
    fx.drover(&["wait", &parent]).ok();
    let detached = fx.drover(&["detach", "helper"]);
    snapshot!("detach", detached.transcript());
    assert_eq!(detached.code, 0);
    assert!(fx.info(&child)["parentAgentId"].is_null());
    let tree = fx.drover(&["ls", "--tree"]).ok();
    assert!(!tree.stdout.contains("└─"), "{}", tree.stdout);
}

// ---- inspect, attach, logs --follow -----------------------------------------------------------

#[test]
fn inspect_shows_one_agent() {
    let fx = Fixture::start();
    let parent = fx.spawn_agent(&["--title", "lead"], "say l");
    let child = fx.spawn_agent(
        &[
            "--title",
            "worker",
            "--parent",
            "lead",
            "--mode",
            "plan",
            "--auto-archive",
        ],
        "say w",
    );
    fx.drover(&["wait", &parent]).ok();
    fx.drover(&["wait", &child]).ok();
    let out = fx.drover(&["inspect", "lead"]).ok();
    snapshot!("inspect", fx.redact(&out.transcript()));
    let json = fx.info("worker");
    assert_eq!(json["parentAgentId"], parent.as_str());
    assert_eq!(json["currentModeId"], "plan");
    assert_eq!(json["autoArchive"], true);
    // Archived with its first turn: no process.
    assert_eq!(json["runtime"]["state"], "cold", "{json}");
    assert_eq!(json["runtime"]["rssBytes"], Value::Null, "{json}");
    let lead = fx.info(&parent);
    assert_eq!(lead["children"][0], child.as_str());
    // The runtime, measured when asked: a live process with memory.
    assert_eq!(lead["runtime"]["state"], "live", "{lead}");
    assert!(lead["runtime"]["pid"].as_u64().is_some(), "{lead}");
    assert!(lead["runtime"]["rssBytes"].as_u64() > Some(0), "{lead}");
    assert!(lead["runtime"]["hibernateAt"].is_string(), "{lead}");
}

#[test]
fn set_changes_an_agents_reasoning_effort_and_inspect_shows_its_settings() {
    let fx = Fixture::new();
    // The scripted agent, offering its settings as ACP config options.
    fx.add_scripted_provider("tuned", "SCRIPTED_AGENT_CONFIG_OPTIONS = \"1\"");
    let fx = fx.serve(Command::new(DROVER), &[]);
    let id = fx.spawn_agent(
        &[
            "--provider",
            "tuned",
            "--title",
            "tuned",
            "--effort",
            "high",
        ],
        "say hi",
    );
    fx.drover(&["wait", &id]).ok();
    let row = |fx: &Fixture, name: &str| {
        let out = fx.drover(&["inspect", "tuned"]).ok().stdout;
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(row(&fx, "effort"), "effort        high");
    assert!(
        row(&fx, "settings").contains("effort=high (low, medium, high)"),
        "{}",
        row(&fx, "settings")
    );
    let out = fx.drover(&["set", "tuned", "effort", "low"]).ok();
    assert!(
        out.stdout.ends_with(": effort = low\n"),
        "{}",
        out.transcript()
    );
    assert!(row(&fx, "settings").contains("effort=low ("));
    assert_eq!(fx.info(&id)["effort"], "low");
    // A value the agent does not take: refused, saying which it takes.
    let out = fx.drover(&["set", "tuned", "effort", "extreme"]);
    assert_ne!(out.code, 0, "{}", out.transcript());
    assert!(
        out.stderr.contains("give one of: low, medium, high"),
        "{}",
        out.transcript()
    );
}

#[test]
fn a_usage_limit_shows_in_ls_inspect_and_send_and_retry_sends_the_prompt_now() {
    let fx = Fixture::start();
    // gemini's words: "… Please retry in 600s.": the prompt waits ten minutes.
    let id = fx.spawn_agent(&["--title", "quota"], "limit gemini 600\nsay went on");
    let deadline = Instant::now() + Duration::from_secs(20);
    while fx.info(&id)["attentionReason"] != "limited" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let ls = fx.drover(&["ls"]).ok();
    let row = ls
        .stdout
        .lines()
        .find(|l| l.contains("quota"))
        .unwrap_or_default();
    assert!(row.contains("limited until "), "{}", ls.stdout);
    let inspected = fx.drover(&["inspect", "quota"]).ok();
    let limited = inspected
        .stdout
        .lines()
        .find(|l| l.starts_with("limited "))
        .unwrap_or_default();
    assert!(
        limited.contains("the prompt goes again at") && limited.contains("drover retry"),
        "{}",
        inspected.stdout
    );
    // The timeline says the provider's words and when the prompt goes again.
    let logs = fx.drover(&["logs", "quota"]).ok();
    let limited = logs
        .stdout
        .lines()
        .find(|l| l.contains("limited"))
        .unwrap_or_default();
    assert!(
        limited.contains("limited: ")
            && limited.contains("Please retry in")
            && limited.contains("the prompt goes again at ")
            && limited.contains("`drover retry` sends it now"),
        "{}",
        logs.stdout
    );
    let sent = fx.drover(&["send", "quota", "say later"]).ok();
    assert!(
        sent.stderr.contains("waits for its provider's usage limit"),
        "{}",
        sent.stderr
    );
    // `retry` sends it now (the scripted limit is still on: it waits again, a second time).
    fx.drover(&["retry", "quota"]).ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    let sent_twice = loop {
        let messages = fx
            .drover(&["logs", &id])
            .ok()
            .stdout
            .matches("limit gemini 600")
            .count();
        if messages >= 2 || Instant::now() > deadline {
            break messages;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(sent_twice, 2);
}

#[test]
fn login_with_the_agents_own_method_runs_it_here_and_leaves_no_process() {
    let fx = Fixture::new();
    // The scripted agent asking for a sign-in, as codex-acp does; its own method signs in. It
    // starts a worker that leaves its process group (a session of its own), as a launcher's
    // real agent may.
    fx.add_scripted_provider(
        "locked",
        "SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_HELPER = \"session\", \
         DROVER_LOGIN_PROBE = \"cli-login\"",
    );
    let fx = fx.serve(Command::new(DROVER), &[]);
    let out = fx.drover(&["login", "locked", "--method", "scripted-login"]);
    assert_eq!(out.code, 0, "{}", out.transcript());
    // The agent it ran here is gone, with its process group.
    let deadline = Instant::now() + WAIT;
    let left = loop {
        let left: Vec<i32> = drover_testkit::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_LOGIN_PROBE", "cli-login"))
            .map(|p| p.pid)
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(left.is_empty(), "left running: {left:?}");
}

// The agent's own sign-in opened a browser (`xdg-open`'s: a session of its own, no longer
// the agent's descendant, carrying what the agent carried): a login that succeeds leaves it
// running, out of the login's cgroups, while the agent's own worker ends with the agent.
#[test]
fn a_successful_login_leaves_the_browser_it_opened_and_ends_the_agents_worker() {
    let fx = Fixture::new();
    let pid_file = fx.home().join("browser.pid");
    fx.add_scripted_provider(
        "locked",
        &format!(
            "SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_HELPER = \"session\", \
             SCRIPTED_AGENT_LOGIN_BROWSER = {:?}, DROVER_LOGIN_PROBE = \"cli-browser\"",
            pid_file.display().to_string()
        ),
    );
    let fx = fx.serve(Command::new(DROVER), &[]);
    let out = fx.drover(&["login", "locked", "--method", "scripted-login"]);
    assert_eq!(out.code, 0, "{}", out.transcript());
    let browser: i32 = std::fs::read_to_string(&pid_file)
        .expect("the browser's pid")
        .trim()
        .parse()
        .expect("a pid");
    let alive = |pid: i32| drover_testkit::procs::Process::read(pid).is_some_and(|p| !p.zombie());
    // The agent and its worker are gone; the browser alone is left.
    let deadline = Instant::now() + WAIT;
    let left = loop {
        let left: Vec<i32> = drover_testkit::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_LOGIN_PROBE", "cli-browser"))
            .map(|p| p.pid)
            .collect();
        if left == [browser] || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(500));
    let survived = alive(browser);
    let cgroup = std::fs::read_to_string(format!("/proc/{browser}/cgroup")).unwrap_or_default();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(browser),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(left, [browser], "only the browser is left");
    assert!(survived, "the browser the sign-in opened was killed");
    // Left in a cgroup of the login, the next daemon's sweep of what dead ones left would
    // end it.
    assert!(!cgroup.contains("/drover-"), "{cgroup}");
}

/// The first `drover login` of a provider none of whose agents started: its agent is started
/// once to tell its methods (by the daemon, which remembers them), not once by the CLI to ask
/// and again by the daemon to check the method chosen.
#[test]
fn the_first_login_of_a_provider_starts_its_agent_once() {
    let fx = Fixture::new();
    // The scripted agent asking for a sign-in, behind a script that counts its starts.
    let starts = fx.home().join("starts");
    let script = fx.home().join("counted-agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"start $*\" >> '{}'\nexec '{}' \"$@\"\n",
            starts.display(),
            drover_testkit::scripted_agent_bin().display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let config = fx.home().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    let text = format!(
        "{text}\n[providers.counted]\ncommand = [{:?}]\nenv = {{ SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_STATE_DIR = {:?} }}\n",
        script.display().to_string(),
        fx.state.path().display().to_string()
    );
    std::fs::write(&config, text).expect("config");
    let fx = fx.serve(Command::new(DROVER), &[]);
    let mut login = fx
        .command(&["login", "counted", "--method", "scripted-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover login");
    std::io::Write::write_all(&mut login.stdin.take().expect("stdin"), b"the key\n")
        .expect("the key");
    let out = login.wait_with_output().expect("drover login");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("signed in with scripted-key"), "{said}");
    let started = std::fs::read_to_string(&starts).unwrap_or_default();
    assert_eq!(started.lines().count(), 1, "the agent's starts:\n{started}");
}

/// An agent answering `initialize` in an ACP version drover does not speak offers no method
/// drover reads: asked how it signs in, it is refused in a launch's words, and nothing is kept.
#[test]
fn a_login_to_an_agent_of_another_acp_version_is_refused_as_its_start_is() {
    let fx = Fixture::new();
    fx.add_scripted_provider(
        "newer",
        "SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_PROTOCOL_VERSION = \"2\"",
    );
    let config = std::fs::read_to_string(fx.home().join("config.toml")).expect("config");
    let fx = fx.serve(Command::new(DROVER), &[]);
    let mut login = fx
        .command(&["login", "newer", "--method", "scripted-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover login");
    std::io::Write::write_all(&mut login.stdin.take().expect("stdin"), b"the key\n")
        .expect("the key");
    let out = login.wait_with_output().expect("drover login");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "the agent speaks ACP version 2 and drover speaks version 1: install a version of \
             the agent that speaks ACP 1"
        ),
        "{said}"
    );
    let kept = std::fs::read_to_string(fx.home().join("config.toml")).expect("config");
    assert_eq!(kept, config, "the login kept something");
}

/// An interactive bash with job control on a terminal of its own (a pty), in the fixture's
/// environment with `drover` on its `PATH`: what it wrote, and a way to type.
struct Terminal {
    master: std::fs::File,
    shell: Child,
    said: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Terminal {
    #[expect(unsafe_code)] // a pty's calls are plain system calls; the shell's `pre_exec`.
    fn shell(fx: &Fixture) -> Terminal {
        use std::os::fd::FromRawFd as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        use std::os::unix::process::CommandExt as _;
        // SAFETY: plain system calls on the new descriptor; the name is read into our buffer.
        let (master, slave) = unsafe {
            let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(fd >= 0, "posix_openpt");
            assert_eq!(libc::grantpt(fd), 0, "grantpt");
            assert_eq!(libc::unlockpt(fd), 0, "unlockpt");
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            (std::fs::File::from_raw_fd(fd), name)
        };
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(slave)
            .expect("the pty's terminal");
        let bin = Path::new(DROVER)
            .parent()
            .expect("bin dir")
            .display()
            .to_string();
        let mut command = drover_testkit::hermetic::command("bash", fx.user.path());
        command
            .args(["--norc", "--noprofile", "-i"])
            .current_dir(fx.cwd())
            .env(
                "PATH",
                format!("{bin}:{}", drover_testkit::hermetic::SYSTEM_PATH),
            )
            .env("DROVER_HOME", fx.home())
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .stdin(slave.try_clone().expect("slave"))
            .stdout(slave.try_clone().expect("slave"))
            .stderr(slave);
        // SAFETY: only async-signal-safe calls between fork and exec: a session of its own,
        // whose controlling terminal is the pty, as a terminal emulator starts a shell.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let shell = command.spawn().expect("bash");
        drop(command);
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("master");
        let into = said.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock().expect("said").extend_from_slice(&buf[..n]);
            }
        });
        Terminal {
            master,
            shell,
            said,
        }
    }

    fn said(&self) -> String {
        String::from_utf8_lossy(&self.said.lock().expect("said")).into_owned()
    }

    /// Types `keys`; where what the terminal shows after them starts (for [`Self::wait_for`]).
    fn type_in(&mut self, keys: &str) -> usize {
        let from = self.said.lock().expect("said").len();
        std::io::Write::write_all(&mut self.master, keys.as_bytes()).expect("typing");
        from
    }

    /// Waits until the terminal shows `text` after what it showed at `from`; panics with what
    /// it shows otherwise.
    fn wait_for(&self, text: &str, from: usize) {
        let deadline = Instant::now() + WAIT;
        loop {
            let said = self.said.lock().expect("said")[from..].to_vec();
            if String::from_utf8_lossy(&said).contains(text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {text:?}:\n{}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Terminal {
    /// Ends the shell and every process of its session (a job it left stopped included).
    #[expect(unsafe_code)] // `getsid` and `kill` are plain system calls on pids.
    fn drop(&mut self) {
        if let Ok(session) = i32::try_from(self.shell.id()) {
            for process in drover_testkit::procs::live() {
                // SAFETY: reading a session id and signalling processes of the test's pty.
                unsafe {
                    if process.pid != session && libc::getsid(process.pid) == session {
                        libc::kill(process.pid, libc::SIGKILL);
                    }
                }
            }
        }
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

// `drover login`'s terminal method in a shell's terminal: Ctrl-Z stops the login as a job
// (the shell has the terminal back, `fg` goes on), and a login started in the background
// (`&`) signs in once brought to the foreground.
#[test]
fn a_terminal_login_is_a_job_of_the_users_shell() {
    let fx = Fixture::new();
    fx.add_scripted_provider("locked", "SCRIPTED_AGENT_AUTH = \"1\"");
    let fx = fx.serve(Command::new(DROVER), &[]);
    let mut terminal = Terminal::shell(&fx);
    let login = "drover login locked --method scripted-terminal";
    let at = terminal.type_in(&format!("{login}\n"));
    terminal.wait_for("type anything to sign in", at);
    let at = terminal.type_in("\x1a");
    terminal.wait_for("Stopped", at);
    // The shell reads what is typed: it has the terminal.
    let at = terminal.type_in("echo back-$((40 + 2))\n");
    terminal.wait_for("back-42", at);
    let at = terminal.type_in("fg\n");
    terminal.wait_for(&format!("fg\r\n{login}"), at);
    let at = terminal.type_in("yes\n");
    terminal.wait_for("with scripted-terminal", at);
    let at = terminal.type_in("echo exit-$((0 + $?))\n");
    terminal.wait_for("exit-0", at);

    std::fs::remove_file(fx.state.path().join("signed-in")).expect("signed in");
    let at = terminal.type_in(&format!("{login} &\n"));
    terminal.wait_for("type anything to sign in", at);
    let at = terminal.type_in("fg\n");
    terminal.wait_for(&format!("fg\r\n{login}"), at);
    let at = terminal.type_in("yes\n");
    terminal.wait_for("with scripted-terminal", at);
    let at = terminal.type_in("echo exit-$((1 + $?))\n");
    terminal.wait_for("exit-1", at);
}

// A `terminal` method's command that leaves a process running in its group (a server it
// started for the sign-in, not ended) and opened a browser: a login that succeeds ends the
// first, as it ends its agent's, and leaves the browser.
#[test]
fn a_terminal_login_ends_what_its_command_left_but_the_browser() {
    let fx = Fixture::new();
    let pid_file = fx.home().join("browser.pid");
    fx.add_scripted_provider(
        "locked",
        &format!(
            "SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_HELPER = \"1\", \
             SCRIPTED_AGENT_LOGIN_BROWSER = {:?}, DROVER_LOGIN_PROBE = \"cli-terminal\"",
            pid_file.display().to_string()
        ),
    );
    let fx = fx.serve(Command::new(DROVER), &[]);
    let mut login = fx
        .command(&["login", "locked", "--method", "scripted-terminal"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover login");
    std::io::Write::write_all(&mut login.stdin.take().expect("stdin"), b"yes\n")
        .expect("the answer");
    let out = login.wait_with_output().expect("drover login");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("signed in with scripted-terminal"), "{said}");
    let browser: i32 = std::fs::read_to_string(&pid_file)
        .expect("the browser's pid")
        .trim()
        .parse()
        .expect("a pid");
    let deadline = Instant::now() + WAIT;
    let left = loop {
        let left: Vec<i32> = drover_testkit::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_LOGIN_PROBE", "cli-terminal"))
            .map(|p| p.pid)
            .collect();
        if left == [browser] || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Each one left: pid, parent, group, command line (for a failure to say what it was).
    let described: Vec<String> = left
        .iter()
        .filter_map(|&pid| drover_testkit::procs::Process::read(pid))
        .map(|p| {
            format!(
                "{} (ppid {}, pgrp {}) {}",
                p.pid,
                p.ppid,
                p.pgrp,
                p.command_line()
            )
        })
        .collect();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(browser),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(
        left,
        [browser],
        "only the browser ({browser}) is left: {described:?}"
    );
}

/// The processes carrying `DROVER_LOGIN_PROBE=<probe>`, once none is left or after `WAIT`.
fn probes_left(probe: &str) -> Vec<i32> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left: Vec<i32> = drover_testkit::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_LOGIN_PROBE", probe))
            .map(|p| p.pid)
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_login_killed_midway_leaves_no_process_of_its_agent() {
    let fx = Fixture::new();
    // The agent's own sign-in takes a minute (a browser round trip); its worker left its group.
    fx.add_scripted_provider(
        "locked",
        "SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_HELPER = \"session\", \
         SCRIPTED_AGENT_LOGIN_MS = \"60000\", DROVER_LOGIN_PROBE = \"cli-killed\"",
    );
    let fx = fx.serve(Command::new(DROVER), &[]);
    let mut login = fx
        .command(&["login", "locked", "--method", "scripted-login"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover login");
    // Signing in: the agent, its session's shell and that shell's sleep run.
    let deadline = Instant::now() + WAIT;
    loop {
        let running = drover_testkit::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_LOGIN_PROBE", "cli-killed"))
            .count();
        if running >= 3 {
            break;
        }
        if Instant::now() > deadline {
            let _ = login.kill();
            let mut said = String::new();
            if let Some(mut stderr) = login.stderr.take() {
                let _ = stderr.read_to_string(&mut said);
            }
            panic!("the login's agent did not start ({running} processes): {said}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Killed as hard as can be: nothing of the CLI runs after this.
    login.kill().expect("kill drover login");
    login.wait().expect("reap");
    let left = probes_left("cli-killed");
    assert!(left.is_empty(), "left running after the CLI died: {left:?}");
}

#[test]
fn inspect_says_what_keeps_an_idle_runtime_live() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "server"], "say starting\nspawn-tool");
    fx.drover(&["wait", &id]).ok();
    // The runtime looks for background work as its turn ends: bounded polling for that.
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let inspected = fx.drover(&["inspect", "server"]).ok();
        let row = inspected
            .stdout
            .lines()
            .find(|l| l.starts_with("hibernates "))
            .unwrap_or_default()
            .to_string();
        if row.ends_with("kept live: 1 background process") || Instant::now() > deadline {
            break row;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(row, "hibernates    kept live: 1 background process");
    assert_eq!(fx.info(&id)["runtime"]["backgroundProcesses"], 1);
}

#[test]
fn attach_streams_live_and_ctrl_c_leaves_the_agent_running() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "watched"], "say before");
    fx.drover(&["wait", &id]).ok();
    let mut attach = Live::spawn(&fx, &["attach", "watched"]);
    attach.expect_line("turn completed");
    fx.drover(&["send", &id, "say live\ntool probe\nsleep 30000"])
        .ok();
    attach.expect_line("tool: probe (completed)");
    attach.interrupt();
    let out = attach.finish();
    snapshot!("attach", out.transcript());
    assert_eq!(out.code, 0);
    assert_eq!(fx.info(&id)["status"], "running", "still running");

    let mut follow = Live::spawn(&fx, &["logs", "watched", "--follow", "--tail", "2"]);
    follow.expect_line("probe (completed)");
    fx.drover(&["send", &id, "--steer", "say followed"]).ok();
    follow.expect_line("turn     completed");
    follow.interrupt();
    let out = follow.finish();
    snapshot!("logs_follow", out.transcript());
    assert_eq!(out.code, 0);
}

// ---- naming agents, errors --------------------------------------------------------------------

#[test]
fn ambiguous_and_unknown_ids_are_errors() {
    let fx = Fixture::start();
    let a = fx.spawn_agent(&["--title", "twin"], "say a");
    let b = fx.spawn_agent(&["--title", "twin"], "say b");
    fx.drover(&["wait", &a]).ok();
    fx.drover(&["wait", &b]).ok();
    let ambiguous = fx.drover(&["inspect", "twin"]);
    snapshot!("ambiguous_title", ambiguous.transcript());
    assert_eq!(ambiguous.code, 4);
    let unknown = fx.drover(&["stop", "nope"]);
    snapshot!("unknown_id", unknown.transcript());
    assert_eq!(unknown.code, 4);
    // The full id and a unique prefix (with or without hyphens) work.
    assert_eq!(fx.info(&a)["id"], a.as_str());
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    assert_eq!(fx.info(&b[..=common])["id"], b.as_str());
    let simple: String = b.replace('-', "");
    assert_eq!(
        fx.info(&simple[..simple.len() - 2])["id"],
        b.as_str(),
        "a prefix without hyphens"
    );
}

#[test]
fn without_a_daemon_commands_say_how_to_start_one() {
    let fx = Fixture::new();
    let out = fx.drover(&["ls"]);
    snapshot!("not_running", fx.redact(&out.transcript()));
    assert_eq!(out.code, 3);
    let run = fx.drover(&["run", "say hi"]);
    assert_eq!(run.code, 3, "{}", run.transcript());
    // A daemon.json left by a crash does not fool it.
    std::fs::write(
        fx.home().join("daemon.json"),
        r#"{"version":1,"pid":1,"url":"http://127.0.0.1:9","daemonVersion":"0","startedAt":"2025-01-01T00:00:00Z"}"#,
    )
    .expect("write");
    let stale = fx.drover(&["ls"]);
    assert_eq!(stale.code, 3, "{}", stale.transcript());
    // An explicit url that nobody serves.
    let url = fx.drover(&["--url", "http://127.0.0.1:9", "ls"]);
    assert_eq!(url.code, 3, "{}", url.transcript());
    assert!(url.stderr.contains("127.0.0.1:9"), "{}", url.stderr);
    // Usage errors are clap's 2.
    assert_eq!(fx.drover(&["send"]).code, 2);
}

#[test]
fn the_token_goes_with_the_handshake_when_the_home_has_one() {
    let fx = Fixture::start();
    let deadline = Instant::now() + WAIT;
    while !fx.home().join("token").exists() {
        assert!(Instant::now() < deadline, "no token file");
        std::thread::sleep(Duration::from_millis(10));
    }
    fx.drover(&["ls"]).ok();
    let token = std::fs::read(fx.home().join("token")).expect("token");
    std::fs::remove_file(fx.home().join("token")).expect("remove");
    let refused = fx.drover(&["ls"]);
    assert_eq!(refused.code, 1, "{}", refused.transcript());
    assert!(refused.stderr.contains("token"), "{}", refused.stderr);
    std::fs::write(fx.home().join("token"), token).expect("restore");
}

#[test]
fn run_with_the_demo_provider_needs_no_key() {
    let fx = Fixture::start();
    // A plain hello: a welcome, streamed, saying what to type.
    let hello = fx.drover(&["run", "--provider", "demo", "hello"]).ok();
    assert!(
        hello.stdout.contains("drover's **demo agent**") && hello.stdout.contains("`tour`"),
        "{}",
        hello.stdout
    );
    // A permission (allowed from the command line), a subagent and a job, the last two made
    // through drover's MCP server.
    let run = fx
        .drover(&[
            "run",
            "--provider",
            "demo",
            "--allow-all",
            "--title",
            "showcase",
            "permission Edit README.md\nsubagent say hello from below\njob echo from-the-job",
        ])
        .ok();
    for said in [
        "permission granted",
        "started subagent ",
        "started job job-1: echo from-the-job",
    ] {
        assert!(run.stdout.contains(said), "no `{said}` in:\n{}", run.stdout);
    }
    let lead = fx.info("showcase");
    assert_eq!(lead["type"], "demo", "{lead}");
    let child = lead["children"][0]
        .as_str()
        .expect("a subagent")
        .to_string();
    fx.wait_status(&child, "idle");
    let below = fx.drover(&["logs", &child]).ok();
    assert!(
        below.stdout.contains("hello from below"),
        "{}",
        below.stdout
    );
    // The job's end and the subagent's reach the demo agent, which takes note of each.
    let deadline = Instant::now() + WAIT;
    let logs = loop {
        let logs = fx.drover(&["logs", "showcase"]).ok().stdout;
        // The demo agent's own notes, not the notices it got (which come first).
        let noted = logs.contains("Noted: [drover] Job job-1 exited")
            && logs.contains("Noted: [drover] Agent");
        if noted || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        logs.contains("Noted: [drover] Job job-1 exited") && logs.contains("Noted: [drover] Agent"),
        "{logs}"
    );
}

#[test]
fn providers_asks_the_running_daemon() {
    let fx = Fixture::start();
    let out = fx.drover(&["providers"]).ok();
    snapshot!("providers", fx.redact(&out.transcript()));
    let json = fx.drover(&["providers", "--json"]).ok().json();
    let scripted = json
        .as_array()
        .expect("array")
        .iter()
        .find(|p| p["provider"]["name"] == "scripted")
        .expect("scripted")
        .clone();
    assert_eq!(scripted["availability"]["state"], "available");
}

#[test]
fn providers_shows_warm_spares() {
    let fx = Fixture::new();
    let config = fx.home().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    let warmed = format!(
        "\n[providers.warmed]\ncommand = [{:?}]\nwarm = 1\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {:?} }}\n",
        drover_testkit::scripted_agent_bin().display().to_string(),
        fx.state.path().display().to_string(),
    );
    std::fs::write(&config, text + &warmed).expect("config");
    let fx = fx.serve(Command::new(DROVER), &[]);
    // The spare starts in the background: bounded polling until it is ready.
    let deadline = Instant::now() + WAIT;
    let out = loop {
        let out = fx.drover(&["providers"]).ok();
        if out.stdout.contains("warm 1/1") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<&str> = out.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("warmed "))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(
        lines[at + 1..]
            .first()
            .is_some_and(|l| l.trim() == "warm 1/1"),
        "{}",
        out.stdout
    );
    let json = fx.drover(&["providers", "--json"]).ok().json();
    let list = json.as_array().expect("array");
    let warmed = list
        .iter()
        .find(|p| p["provider"]["name"] == "warmed")
        .expect("warmed");
    assert_eq!(warmed["warm"], serde_json::json!({"ready": 1, "wanted": 1}));
    // Providers without spares say nothing of them.
    let scripted = list
        .iter()
        .find(|p| p["provider"]["name"] == "scripted")
        .expect("scripted");
    assert!(scripted.get("warm").is_none(), "{scripted}");
}

#[test]
fn completions_are_generated() {
    let fx = Fixture::new();
    let out = fx.drover(&["completions", "bash"]).ok();
    assert!(out.stdout.contains("_drover"), "{}", out.stdout);
    assert!(out.stdout.contains("permit"));
    let zsh = fx.drover(&["completions", "zsh"]).ok();
    assert!(zsh.stdout.contains("#compdef drover"));
}

// ---- workspaces and worktrees -----------------------------------------------------------------

/// A git repository with one commit (and a `drover.toml` whose setup says something), in the
/// fixture's working directory.
fn repository(fx: &Fixture) -> PathBuf {
    let repo = fx.cwd().join("repo");
    std::fs::create_dir(&repo).expect("repo");
    drover_testkit::git_repository(
        &repo,
        &[
            ("README", "hello\n"),
            (
                "drover.toml",
                "[worktree]\nsetup = [\"echo prepared $DROVER_BRANCH\"]\n",
            ),
        ],
    );
    repo
}

/// The paths `git worktree list` shows for `repo`.
fn git_worktrees(repo: &Path) -> Vec<String> {
    drover_testkit::git_lines(repo, &["worktree", "list", "--porcelain"])
        .iter()
        .filter_map(|l| l.strip_prefix("worktree "))
        .map(str::to_string)
        .collect()
}

/// Commit hashes (`abc1234 subject`) redacted too.
macro_rules! snapshot_git {
    ($name:expr, $value:expr) => {{
        let mut settings = settings();
        settings.add_filter(r"\b[0-9a-f]{7,12} ", "[COMMIT] ");
        settings.bind(|| insta::assert_snapshot!($name, $value))
    }};
}

#[test]
fn worktrees_are_made_listed_checked_and_removed() {
    let fx = Fixture::start();
    let repo = repository(&fx);
    let repo_arg = repo.display().to_string();
    let made = fx.drover(&["worktree", "new", "parser", "--repo", &repo_arg]);
    snapshot!("worktree_new", fx.redact(&made.transcript()));
    assert_eq!(made.code, 0);
    let path = made.stdout.trim().to_string();
    assert_eq!(
        path,
        fx.home()
            .join("worktrees/repo/parser")
            .display()
            .to_string()
    );
    assert!(git_worktrees(&repo).contains(&path));

    // An agent in the working directory: a directory workspace beside the worktree.
    fx.drover(&["run", "say here"]).ok();
    let ls = fx.drover(&["worktree", "ls"]).ok();
    snapshot!("worktree_ls", fx.redact(&ls.transcript()));
    let all = fx.drover(&["workspaces"]).ok();
    snapshot!("workspaces", fx.redact(&all.transcript()));
    let json = fx.drover(&["workspaces", "--json"]).ok().json();
    let listed = json.as_array().expect("an array");
    assert_eq!(listed.len(), 2, "{json}");
    let tree = listed
        .iter()
        .find(|w| w["kind"] == "worktree")
        .expect("the worktree");
    assert_eq!(tree["worktree"]["branch"], "drover/parser");
    assert_eq!(tree["agentCount"], 0);
    let dir = listed
        .iter()
        .find(|w| w["kind"] != "worktree")
        .expect("the directory");
    assert_eq!(dir["agentCount"], 1);

    let clean = fx.drover(&["worktree", "status", "parser"]);
    snapshot!("worktree_status_clean", fx.redact(&clean.transcript()));
    assert_eq!(clean.code, 0);

    // A commit found nowhere else, and a file not committed.
    let tree = PathBuf::from(&path);
    std::fs::write(tree.join("notes.txt"), "notes\n").expect("notes");
    drover_testkit::git(&tree, &["add", "notes.txt"]);
    drover_testkit::git(&tree, &["commit", "-q", "-m", "parser notes"]);
    std::fs::write(tree.join("draft.txt"), "draft\n").expect("draft");
    // Named by its path this time.
    let dirty = fx.drover(&["worktree", "status", &path]);
    snapshot_git!("worktree_status_dirty", fx.redact(&dirty.transcript()));
    assert_eq!(dirty.code, 1);
    let json = fx.drover(&["worktree", "status", "parser", "--json"]);
    assert_eq!(json.code, 1);
    assert_eq!(json.json()["uncommittedCount"], 1);
    assert_eq!(json.json()["unpushedCount"], 1);

    let refused = fx.drover(&["worktree", "rm", "parser"]);
    snapshot_git!("worktree_rm_refused", fx.redact(&refused.transcript()));
    assert_eq!(refused.code, 5);
    assert!(tree.exists(), "nothing removed");
    // The command it says to run is the one that works.
    let anyway = refused
        .stderr
        .lines()
        .last()
        .and_then(|l| l.split(": ").nth(1))
        .expect("the --force command")
        .to_string();
    let args: Vec<&str> = anyway.split(' ').skip(1).collect();
    assert_eq!(args[..2], ["worktree", "rm"], "{anyway}");
    let forced = fx.drover(&args);
    snapshot_git!("worktree_rm_force", fx.redact(&forced.transcript()));
    assert_eq!(forced.code, 0);
    assert!(!tree.exists());
    assert!(!git_worktrees(&repo).contains(&path));

    let ls = fx.drover(&["worktree", "ls"]).ok();
    assert!(ls.stdout.is_empty(), "{}", ls.stdout);
    let all = fx.drover(&["worktree", "ls", "--all"]).ok();
    assert!(all.stdout.contains("archived"), "{}", all.stdout);
    let again = fx.drover(&["worktree", "rm", "parser"]).ok();
    assert!(
        again.stdout.contains("was already removed"),
        "{}",
        again.stdout
    );
}

#[test]
fn run_in_a_new_worktree() {
    let fx = Fixture::start();
    let repo = repository(&fx);
    // A branch with a commit of its own to start one worktree from.
    drover_testkit::git(&repo, &["checkout", "-q", "-b", "other"]);
    std::fs::write(repo.join("other.txt"), "other\n").expect("other");
    drover_testkit::git(&repo, &["add", "other.txt"]);
    drover_testkit::git(&repo, &["commit", "-q", "-m", "other"]);
    drover_testkit::git(&repo, &["checkout", "-q", "main"]);
    let repo_arg = repo.display().to_string();

    let out = fx.drover(&["run", "--cwd", &repo_arg, "--worktree", "feature", "cwd"]);
    snapshot!("run_worktree", fx.redact(&out.transcript()));
    assert_eq!(out.code, 0);
    let path = fx.home().join("worktrees/repo/feature");
    assert_eq!(out.stdout.trim(), path.display().to_string());
    assert!(git_worktrees(&repo).contains(&path.display().to_string()));

    let id = fx.spawn_agent(
        &["--cwd", &repo_arg, "--worktree", "based", "--base", "other"],
        "say based",
    );
    fx.drover(&["wait", &id]).ok();
    let cwd = fx.info(&id)["cwd"].as_str().expect("cwd").to_string();
    assert!(Path::new(&cwd).join("other.txt").exists(), "{cwd}");
    let ls = fx.drover(&["worktree", "ls", "--json"]).ok().json();
    let based = ls
        .as_array()
        .expect("array")
        .iter()
        .find(|w| w["name"] == "based")
        .expect("based")
        .clone();
    assert_eq!(based["worktree"]["base"], "other");
    assert_eq!(based["agentCount"], 1);

    // Removing the worktree archives its agent.
    let removed = fx.drover(&["worktree", "rm", "based"]).ok();
    assert!(
        removed.stdout.contains("archived 1 agent"),
        "{}",
        removed.stdout
    );
    assert!(!fx.info(&id)["archivedAt"].is_null());
    assert!(!Path::new(&cwd).exists());

    // --base needs --worktree.
    assert_eq!(fx.drover(&["run", "--base", "main", "say x"]).code, 2);
}

// `--worktree NAME` when the project's worktree NAME exists: held by a live agent it is
// refused, naming that agent and what to do; free (its agent archived, its work left in it) it
// is the new agent's, as it is; never a second worktree `NAME-2`.
#[test]
fn run_in_a_worktree_that_exists_refuses_it_while_held_and_reuses_it_when_free() {
    let fx = Fixture::start();
    let repo = repository(&fx);
    let repo_arg = repo.display().to_string();
    let first = fx.spawn_agent(
        &["--cwd", &repo_arg, "--worktree", "fix", "--title", "fixer"],
        "say first",
    );
    fx.drover(&["wait", &first]).ok();
    let path = fx.home().join("worktrees/repo/fix");
    let second_folder = fx.home().join("worktrees/repo/fix-2");

    let refused = fx.drover(&["run", "--cwd", &repo_arg, "--worktree", "fix", "say second"]);
    assert_eq!(refused.code, 5, "{}", refused.transcript());
    assert!(
        refused.stderr.contains("worktree `fix` is in use by agent")
            && refused.stderr.contains("(`fixer`)")
            && refused.stderr.contains("name another worktree"),
        "{}",
        refused.transcript()
    );
    assert!(!second_folder.exists());

    // The first agent leaves work it did not commit, and is archived; the worktree stays.
    std::fs::write(path.join("wip.txt"), "not committed\n").expect("wip");
    fx.drover(&["archive", &first]).ok();
    let reused = fx.drover(&["run", "--cwd", &repo_arg, "--worktree", "fix", "cwd"]);
    assert_eq!(reused.code, 0, "{}", reused.transcript());
    assert_eq!(reused.stdout.trim(), path.display().to_string());
    assert!(
        reused
            .stderr
            .contains("reused as it is, with its branch and uncommitted work"),
        "{}",
        reused.transcript()
    );
    assert!(path.join("wip.txt").exists());
    assert!(!second_folder.exists());
    let ls = fx.drover(&["worktree", "ls", "--json"]).ok().json();
    let listed = ls.as_array().expect("array");
    assert_eq!(listed.len(), 1, "{ls}");
    assert_eq!(listed[0]["worktree"]["branch"], "drover/fix", "{ls}");
}

#[test]
fn worktree_commands_refuse_other_workspaces() {
    let fx = Fixture::start();
    fx.drover(&["run", "say here"]).ok();
    let cwd = fx.cwd().display().to_string();
    let status = fx.drover(&["worktree", "status", &cwd]);
    assert_eq!(status.code, 5, "{}", status.transcript());
    let rm = fx.drover(&["worktree", "rm", &cwd]);
    snapshot!("worktree_rm_not_a_worktree", fx.redact(&rm.transcript()));
    assert_eq!(rm.code, 5);
    let unknown = fx.drover(&["worktree", "rm", "nope"]);
    assert_eq!(unknown.code, 4, "{}", unknown.transcript());
    // Not a git checkout.
    let made = fx.drover(&["worktree", "new", "x"]);
    assert_eq!(made.code, 5, "{}", made.transcript());
    let missing = fx.drover(&["worktree", "new", "x", "--repo", "/nonexistent/repo"]);
    assert_eq!(missing.code, 2, "{}", missing.transcript());
}

// ---- what a newcomer met ---------------------------------------------------------------------

#[test]
fn the_handle_a_command_prints_keeps_naming_the_agent() {
    let fx = Fixture::start();
    let out = fx.drover(&["run", "--title", "first", "say one"]).ok();
    let handle = out
        .stderr
        .trim()
        .rsplit(' ')
        .next()
        .expect("the summary ends with the agent")
        .to_string();
    assert_eq!(handle.len(), 8, "{}", out.stderr);
    let first = fx.info(&handle)["id"].as_str().expect("id").to_string();
    assert!(first.ends_with(&handle), "{first} {handle}");
    // Agents made in the same moment share their leading digits, not their handles.
    let mut ids = vec![first.clone()];
    for i in 0..6 {
        ids.push(fx.spawn_agent(&["--title", &format!("more {i}")], "say more"));
    }
    assert_eq!(
        fx.info(&handle)["id"],
        first.as_str(),
        "the first handle still works"
    );
    let ls = fx.drover(&["ls"]).ok();
    for id in &ids {
        let shown = &id[id.len() - 8..];
        assert!(ls.stdout.contains(shown), "{shown} in\n{}", ls.stdout);
        assert_eq!(fx.info(shown)["id"], id.as_str());
        fx.drover(&["wait", shown]).ok();
    }
    let sent = fx.drover(&["send", &handle, "say again"]).ok();
    assert!(
        sent.stdout
            .starts_with(&format!("queued followup for {handle} ")),
        "{}",
        sent.stdout
    );
}

#[test]
fn empty_prompts_and_bad_directories_are_bad_arguments() {
    let fx = Fixture::start();
    for prompt in ["", "   ", "\n\t"] {
        let out = fx.drover(&["run", prompt]);
        assert_eq!(out.code, 2, "{:?}: {}", prompt, out.transcript());
        assert!(out.stderr.contains("empty"), "{}", out.stderr);
    }
    let ls = fx.drover(&["ls", "--json"]).ok().json();
    assert_eq!(ls.as_array().map(Vec::len), Some(0), "no agent was made");

    let id = fx.spawn_agent(&["--title", "listener"], "say hi");
    let empty = fx.drover(&["send", &id, ""]);
    assert_eq!(empty.code, 2, "{}", empty.transcript());

    let missing = fx.cwd().join("nowhere");
    let missing = fx.drover(&["run", "--cwd", &missing.display().to_string(), "say hi"]);
    let file = fx.cwd().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let file = fx.drover(&["run", "--cwd", &file.display().to_string(), "say hi"]);
    assert_eq!(missing.code, 2, "{}", missing.transcript());
    assert_eq!(file.code, 2, "{}", file.transcript());
    assert!(file.stderr.contains("not a directory"), "{}", file.stderr);
}

/// `drover ARGS` with `input` on its stdin.
fn drover_with_stdin(fx: &Fixture, args: &[&str], input: &[u8]) -> Out {
    use std::io::Write as _;
    let mut child = fx
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn drover");
    let mut stdin = child.stdin.take().expect("stdin");
    // A refused message may be refused before all of it is read: a broken pipe is fine.
    let _ = stdin.write_all(input);
    drop(stdin);
    let out = child.wait_with_output().expect("drover");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `-` as the prompt (`run`) or the message (`send`) reads it from stdin, past what one
/// command-line argument may hold (128 KiB on Linux); an empty stdin, or a message longer than
/// the daemon takes, is a bad argument saying so, and makes nothing.
#[test]
fn a_prompt_or_message_of_dash_comes_from_stdin_and_a_too_long_one_is_refused() {
    let fx = Fixture::start();
    let long = "x".repeat(300 * 1024);
    let run = drover_with_stdin(
        &fx,
        &["run", "--title", "piped", "-"],
        format!("say from stdin\n{long}\n").as_bytes(),
    )
    .ok();
    assert!(run.stdout.contains("from stdin"), "{}", run.transcript());
    let logs = fx.drover(&["logs", "piped", "--json"]).ok();
    assert!(
        logs.stdout.contains(&long),
        "the whole prompt reached the agent"
    );
    let send = drover_with_stdin(&fx, &["send", "piped", "-"], b"say sent through a pipe\n").ok();
    assert!(
        send.stdout.contains("queued followup"),
        "{}",
        send.transcript()
    );
    fx.drover(&["wait", "piped", "--timeout", "20"]).ok();
    let logs = fx.drover(&["logs", "piped"]).ok();
    assert!(
        logs.stdout.contains("sent through a pipe"),
        "{}",
        logs.stdout
    );

    let empty = drover_with_stdin(&fx, &["run", "-"], b"  \n");
    assert_eq!(empty.code, 2, "{}", empty.transcript());
    assert!(empty.stderr.contains("stdin is empty"), "{}", empty.stderr);
    let huge = "say ".to_string() + &"y".repeat(2 * 1024 * 1024);
    let too_long = drover_with_stdin(&fx, &["run", "-"], huge.as_bytes());
    assert_eq!(too_long.code, 2, "{}", too_long.transcript());
    assert!(
        too_long.stderr.contains("too long") && too_long.stderr.contains("read it"),
        "{}",
        too_long.stderr
    );
    let ls = fx.drover(&["ls", "--json"]).ok().json();
    assert_eq!(ls.as_array().map(Vec::len), Some(1), "{ls}");
}

/// `drover retry` of an agent whose start did not fail does nothing and says so; for one whose
/// turn a daemon stop cut off, it says how to go on (and so does `inspect`). It said
/// "starting … again" and only started the runtime.
#[test]
fn retry_of_an_agent_that_did_not_fail_says_so_and_what_it_waits_for() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "calm"], "say hi");
    fx.drover(&["wait", &id]).ok();
    let out = fx.drover(&["retry", "calm"]).ok();
    let handle = &id.replace('-', "")[24..];
    assert!(
        out.stderr
            .contains(&format!("{handle} has no failed start to retry (idle)"))
            && !out.stderr.contains("starting"),
        "{}",
        out.transcript()
    );

    // A turn cut off by a daemon stop: retry names the way on.
    fx.drover(&["send", "calm", "sleep 20000"]).ok();
    fx.wait_status(&id, "running");
    fx.drover(&["daemon", "stop"]).ok();
    fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"])
        .ok();
    let out = fx.drover(&["retry", "calm"]);
    // inspect says it too, on its attention's line.
    let inspect = fx.drover(&["inspect", "calm"]);
    fx.drover(&["daemon", "stop"]).ok();
    assert!(
        inspect.stdout.lines().any(|l| l.starts_with("attention")
            && l.contains("interrupted since")
            && l.contains(&format!("drover send {handle} \"continue\""))),
        "{}",
        inspect.transcript()
    );
    assert_eq!(out.code, 0, "{}", out.transcript());
    assert!(
        out.stderr.contains("cut off when the daemon stopped")
            && out
                .stderr
                .contains(&format!("drover send {handle} \"continue\"")),
        "{}",
        out.transcript()
    );
}

#[test]
fn logs_tail_counts_the_items_it_prints() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "counted"], "say one\nusage\nusage\nusage");
    fx.drover(&["wait", &id]).ok();
    let tail = fx.drover(&["logs", &id, "--tail", "3"]).ok();
    assert_eq!(tail.stdout.lines().count(), 3, "{}", tail.stdout);
    assert!(tail.stdout.contains("one"), "{}", tail.stdout);
    // In JSON every item counts, the hidden ones too.
    let json = fx.drover(&["logs", &id, "--tail", "3", "--json"]).ok();
    let kinds: Vec<String> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .map(|v| v["item"]["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "usage"), "{kinds:?}");
    // Following, too.
    let mut follow = Live::spawn(&fx, &["logs", &id, "--follow", "--tail", "3"]);
    follow.expect_line("turn     completed");
    follow.interrupt();
    let out = follow.finish();
    assert_eq!(out.stdout.lines().count(), 3, "{}", out.stdout);
    assert!(out.stdout.contains("one"), "{}", out.stdout);
}

#[test]
fn repeated_archives_and_detaches_say_nothing_changed() {
    let fx = Fixture::start();
    let lone = fx.spawn_agent(&["--title", "lone"], "say l");
    fx.drover(&["wait", &lone]).ok();
    let detached = fx.drover(&["detach", "lone"]).ok();
    assert!(
        detached.stdout.contains("is a top-level agent already"),
        "{}",
        detached.stdout
    );
    let archived = fx.drover(&["archive", "lone"]).ok();
    assert!(
        archived.stdout.starts_with("archived "),
        "{}",
        archived.stdout
    );
    let again = fx.drover(&["archive", &lone]).ok();
    assert_eq!(
        again.stdout,
        format!("{} was already archived\n", &lone[lone.len() - 8..])
    );
    let back = fx.drover(&["unarchive", &lone]).ok();
    assert_eq!(
        back.stdout,
        format!("unarchived {}\n", &lone[lone.len() - 8..])
    );
    // Unarchiving an agent that is not archived says so (it said "unarchived").
    let again = fx.drover(&["unarchive", &lone]).ok();
    assert_eq!(
        again.stdout,
        format!("{} was not archived\n", &lone[lone.len() - 8..])
    );
}

#[test]
fn completions_into_a_closed_pipe_exit_quietly() {
    let fx = Fixture::new();
    let mut child = fx
        .command(&["completions", "bash"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The reader goes away before anything is written (`| head -0`).
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

// ---- the background daemon --------------------------------------------------------------------

/// Stops a daemon `drover daemon start` left behind, should the test fail.
struct StopOnDrop<'a>(&'a Fixture);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.drover(&["daemon", "stop"]);
    }
}

#[test]
fn daemon_start_status_stop() {
    let fx = Fixture::new();
    let status = fx.drover(&["daemon", "status"]);
    snapshot!("daemon_status_not_running", status.transcript());
    assert_eq!(status.code, 3);
    let stop = fx.drover(&["daemon", "stop"]);
    assert_eq!(stop.code, 3, "{}", stop.transcript());

    let started = fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"]);
    let _guard = StopOnDrop(&fx);
    snapshot!("daemon_start", fx.redact(&started.transcript()));
    assert_eq!(started.code, 0);
    let token = std::fs::read_to_string(fx.home().join("token")).expect("token");
    assert!(
        started.stderr.contains(&format!("#token={}", token.trim())),
        "the page's address logs in: {}",
        started.stderr
    );
    let again = fx
        .drover(&["daemon", "start", "--listen", "127.0.0.1:0"])
        .ok();
    assert!(again.stderr.contains("already runs"), "{}", again.stderr);
    assert_eq!(again.stdout, started.stdout);
    let status = fx.drover(&["daemon", "status"]);
    snapshot!("daemon_status_running", status.transcript());
    assert_eq!(status.code, 0);
    let health = fx.drover(&["daemon", "status", "--json"]).ok().json();
    assert_eq!(health["status"], "ok");

    // The background daemon serves clients.
    let run = fx.drover(&["run", "say from the background"]).ok();
    assert_eq!(run.stdout, "from the background\n");

    let stopped = fx.drover(&["daemon", "stop"]);
    snapshot!("daemon_stop", stopped.transcript());
    assert_eq!(stopped.code, 0);
    assert!(!fx.home().join("daemon.json").exists());
    assert_eq!(fx.drover(&["daemon", "status"]).code, 3);
    assert!(fx.home().join("daemon.out").exists());
}

#[test]
fn daemon_stop_names_the_turns_it_cuts_off_and_the_permissions_they_asked() {
    let fx = Fixture::new();
    let started = fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"]);
    let _guard = StopOnDrop(&fx);
    assert_eq!(started.code, 0, "{}", started.transcript());
    let busy = fx.spawn_agent(&["--title", "busy"], "sleep 20000");
    let asking = fx.spawn_agent(&["--title", "asking"], "permission deploy");
    let going_on = fx.spawn_agent(
        &["--title", "going-on", "--on-interrupt", "continue"],
        "sleep 20000",
    );
    let idle = fx.spawn_agent(&["--title", "resting"], "say done");
    fx.drover(&["wait", &idle, "--timeout", "20"]).ok();
    fx.wait_status(&busy, "running");
    fx.wait_status(&going_on, "running");
    let deadline = Instant::now() + WAIT;
    while fx.info(&asking)["attentionReason"] != "permission" {
        assert!(Instant::now() < deadline, "{}", fx.info(&asking));
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = fx.drover(&["daemon", "stop"]).ok();
    let short = |id: &str| id.replace('-', "")[24..].to_string();
    // The agent the next boot continues by itself is not told to be sent "continue" (that
    // would queue a second turn), and `drover send` needs the daemon started again first.
    let mut waiting = [
        (&busy, format!("    {}  busy", short(&busy))),
        (
            &asking,
            format!(
                "    {}  asking (waiting for your permission)",
                short(&asking)
            ),
        ),
    ];
    waiting.sort();
    let waiting: Vec<String> = waiting.into_iter().map(|(_, line)| line).collect();
    let expected = [
        "drover: it cut off 3 turn(s); a permission one of them asked is cancelled".to_string(),
        "  these wait with attention `interrupted` until they are sent something:".to_string(),
        waiting.join("\n"),
        "  these continue by themselves once the daemon runs again (on_interrupt = continue):"
            .to_string(),
        format!("    {}  going-on", short(&going_on)),
        "  to go on with one that waits: drover daemon start, then drover send ID \"continue\"\n"
            .to_string(),
    ]
    .join("\n");
    assert!(stopped.stderr.ends_with(&expected), "{}", stopped.stderr);
    assert!(!stopped.stderr.contains("resting"), "{}", stopped.stderr);

    // Started again, the agent whose policy is `continue` goes on with no message sent.
    fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"])
        .ok();
    let deadline = Instant::now() + WAIT;
    while fx.info(&going_on)["attentionReason"] != "finished" {
        assert!(Instant::now() < deadline, "{}", fx.info(&going_on));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fx.info(&busy)["attentionReason"], "interrupted");
}

#[test]
fn daemon_start_keeps_the_log_format_for_the_daemon_it_detaches() {
    let fx = Fixture::new();
    let started = fx.drover(&[
        "daemon",
        "start",
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]);
    let _guard = StopOnDrop(&fx);
    assert_eq!(started.code, 0, "{}", started.transcript());
    fx.drover(&["run", "say logged"]).ok();
    assert_eq!(fx.drover(&["daemon", "stop"]).code, 0);
    let log = std::fs::read_to_string(fx.home().join("daemon.log")).expect("daemon.log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "turn ended" && l["outcome"] == "completed"),
        "{log}"
    );
}

// ---- who may drive the daemon -----------------------------------------------------------------

/// Every folder and file under `dir` with its mode, but inside the worktrees (the user's
/// checkouts, made by git with the user's umask behind a private folder).
fn modes_under(dir: &Path, home: &Path, out: &mut Vec<(PathBuf, u32, bool)>) {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        out.push((path.clone(), meta.mode() & 0o777, meta.is_dir()));
        let in_worktrees = path
            .strip_prefix(home.join("worktrees"))
            .is_ok_and(|rest| rest.components().count() >= 2);
        if meta.is_dir() && !in_worktrees {
            modes_under(&path, home, out);
        }
    }
}

#[test]
fn everything_the_daemon_keeps_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    // A home others could open (as one made before drover kept it private), a umask of 022.
    let fx = Fixture::start_under_umask("022", |fx| {
        std::fs::set_permissions(fx.home(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    });
    let repo = repository(&fx);
    let repo_arg = repo.display().to_string();
    let id = fx.spawn_agent(&["--cwd", &repo_arg], "say hello");
    fx.drover(&["wait", &id]).ok();
    fx.drover(&["send", &id, "say again"]).ok();
    fx.drover(&["wait", &id]).ok();
    let worker = fx.spawn_agent(
        &["--cwd", &repo_arg, "--worktree", "private"],
        "say in a worktree",
    );
    fx.drover(&["wait", &worker]).ok();
    fx.drover(&["archive", &id]).ok();
    let mut found = Vec::new();
    modes_under(fx.home(), fx.home(), &mut found);
    let home_mode = std::fs::metadata(fx.home())
        .expect("home")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(home_mode, 0o700, "the home was narrowed");
    let open: Vec<String> = found
        .iter()
        // The test wrote config.toml itself, as a user would.
        .filter(|(path, _, _)| path.file_name().is_none_or(|n| n != "config.toml"))
        .filter(|(_, mode, dir)| *mode != if *dir { 0o700 } else { 0o600 })
        .map(|(path, mode, _)| format!("{:o} {}", mode, path.display()))
        .collect();
    assert!(
        found.iter().any(|(p, _, _)| p.ends_with("token")),
        "the walk saw the home: {found:?}"
    );
    assert!(
        found
            .iter()
            .any(|(p, _, _)| p.to_string_lossy().contains("timeline")),
        "the walk saw the timelines: {found:?}"
    );
    assert!(open.is_empty(), "readable by others:\n{}", open.join("\n"));
}

#[test]
fn another_user_of_the_machine_cannot_drive_the_daemon() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let me = std::fs::metadata("/proc/self").expect("self").uid();
    assert_eq!(
        me, 0,
        "this test switches to user `nobody` with setpriv, which needs root (scripts/test runs as root)"
    );
    let fx = Fixture::start();
    let info: Value =
        serde_json::from_slice(&std::fs::read(fx.home().join("daemon.json")).expect("daemon.json"))
            .expect("JSON");
    let url = info["url"].as_str().expect("url").to_string();
    // The drover binary, where `nobody` can run it.
    let bin = TempDir::new().expect("bin");
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let drover = bin.path().join("drover");
    std::fs::copy(DROVER, &drover).expect("copy drover");
    let as_nobody = |args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/nonexistent")
            .env("DROVER_HOME", fx.home())
            .env("NO_COLOR", "1")
            .current_dir("/")
            .output()
            .expect("setpriv");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // The home, and the token in it, are out of reach.
    let token = fx.home().join("token").display().to_string();
    let (code, out) = as_nobody(&["cat", &token]);
    assert_ne!(code, 0, "nobody read the token: {out}");
    // Through the port, without the token: refused, nothing made.
    let drover_path = drover.display().to_string();
    let (code, out) = as_nobody(&[
        &drover_path,
        "--url",
        &url,
        "run",
        "-d",
        "--provider",
        "scripted",
        "say pwned",
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("token"), "the refusal names the token: {out}");
    let (code, out) = as_nobody(&[&drover_path, "--url", &url, "ls"]);
    assert_ne!(code, 0, "{out}");
    // Without --url: the home it cannot read is not "no daemon is running".
    for command in [&["ls"][..], &["daemon", "status"], &["ui", "--print"]] {
        let mut line = vec![drover_path.as_str()];
        line.extend_from_slice(command);
        let (code, out) = as_nobody(&line);
        assert_eq!(code, 1, "{command:?}: {out}");
        assert!(
            out.contains("Permission denied")
                && out.contains("daemon.json")
                && !out.contains("not running")
                && !out.contains("no drover daemon is running"),
            "{command:?}: {out}"
        );
    }
    let listed = fx.drover(&["ls", "--json"]).ok().json();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
}

#[test]
fn a_failed_daemon_start_shows_only_what_this_start_wrote() {
    let fx = Fixture::new();
    let config = fx.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[providers.typo]\ncomand = [\"x\"]\n");
    std::fs::write(&config, text).expect("config");
    for round in 1..=2 {
        let out = fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"]);
        assert_ne!(out.code, 0, "round {round}: {}", out.transcript());
        let mentions = out.stderr.matches("comand").count();
        assert!(
            mentions >= 1 && out.stderr.matches("exited at start").count() == 1,
            "round {round}: {}",
            out.transcript()
        );
        assert!(
            !out.stderr.contains("web UI"),
            "a daemon that never served was announced: {}",
            out.stderr
        );
        // The first run's lines are in daemon.out but not shown again.
        let log = std::fs::read_to_string(fx.home().join("daemon.out")).expect("daemon.out");
        assert!(log.matches("comand").count() >= round, "{log}");
        if round == 2 {
            assert!(
                mentions < log.matches("comand").count(),
                "the second start repeated the first one's lines:\n{}",
                out.stderr
            );
        }
    }
}

/// A port in use (here by a plain listener) stops the start saying so and how to pick
/// another port, in the foreground and through `daemon start`.
#[test]
fn a_port_in_use_says_how_to_choose_another() {
    let fx = Fixture::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    for args in [
        vec!["daemon", "--listen", addr.as_str()],
        vec!["daemon", "start", "--listen", addr.as_str()],
    ] {
        let out = fx.drover(&args);
        assert_ne!(out.code, 0, "{args:?}: {}", out.transcript());
        assert!(
            out.stderr.contains(&format!("cannot listen on {addr}"))
                && out.stderr.contains("in use")
                && out.stderr.contains("--listen 127.0.0.1:0"),
            "{args:?}: {}",
            out.stderr
        );
    }
    drop(taken);
}

/// A token file the daemon refuses (readable by others): the start fails saying why, and no
/// web UI address is given for a daemon that never served.
#[test]
fn a_daemon_refusing_its_token_file_is_not_announced() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let token = fx.home().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = fx.drover(&["daemon", "start", "--listen", "127.0.0.1:0"]);
    assert_ne!(out.code, 0, "{}", out.transcript());
    assert!(out.stderr.contains("token"), "{}", out.transcript());
    assert!(!out.stderr.contains("web UI"), "{}", out.transcript());
}

// ---- schedules --------------------------------------------------------------------------------

/// The entry `id` of what `drover <what> ls --json` lists (`schedule`, `job`), or null.
fn listed_json(fx: &Fixture, what: &str, id: &str) -> Value {
    let all = fx.drover(&[what, "ls", "--json"]).ok().json();
    all.as_array()
        .and_then(|a| a.iter().find(|s| s["id"] == id).cloned())
        .unwrap_or(Value::Null)
}

/// `drover schedule ls --json`, the schedule `id`.
fn schedule_json(fx: &Fixture, id: &str) -> Value {
    listed_json(fx, "schedule", id)
}

#[test]
fn schedules_are_added_listed_paused_resumed_and_removed() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "worker"], "say ready");
    fx.wait_status(&id, "idle");
    let hourly = fx.drover(&[
        "schedule", "add", "--agent", "worker", "--every", "1h", "--title", "hourly", "say tick",
    ]);
    snapshot!("schedule_add_every", hourly.transcript());
    assert_eq!(hourly.code, 0);
    let cron = fx.drover(&[
        "schedule",
        "add",
        "--agent",
        "worker",
        "--cron",
        "0 9 * * 1-5",
        "--tz",
        "Europe/Paris",
        "say triage the new issues",
    ]);
    snapshot!("schedule_add_cron", cron.transcript());
    let made = fx.drover(&[
        "schedule", "add", "--new", "scripted", "--in", "1s", "say made",
    ]);
    assert_eq!(made.code, 0, "{}", made.transcript());
    // The once schedule fires, creating its agent.
    let deadline = Instant::now() + WAIT;
    let fired = loop {
        let s = schedule_json(&fx, "sched-3");
        if s["state"] == "finished" {
            break s;
        }
        assert!(Instant::now() < deadline, "sched-3 never fired: {s}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let child = fired["runs"][0]["agentId"]
        .as_str()
        .expect("agent")
        .to_string();
    fx.wait_status(&child, "idle");
    let ls = fx.drover(&["schedule", "ls"]).ok();
    snapshot!("schedule_ls", ls.transcript());
    let mine = fx
        .drover(&["schedule", "ls", "--agent", "worker", "--json"])
        .ok()
        .json();
    assert_eq!(mine.as_array().map(Vec::len), Some(2), "{mine}");
    let inspected = fx.drover(&["inspect", "worker"]).ok();
    let row = inspected
        .stdout
        .lines()
        .find(|l| l.starts_with("schedules "))
        .unwrap_or_default();
    assert!(
        row.contains("sched-1 every 1h, next ")
            && row.contains("; sched-2 cron 0 9 * * 1-5 (Europe/Paris), next "),
        "{}",
        inspected.stdout
    );

    // An agent with an active schedule is not archived behind its back.
    let refused = fx.drover(&["archive", "worker"]);
    snapshot!("schedule_archive_refused", refused.transcript());
    assert_eq!(refused.code, 5);

    let paused = fx.drover(&["schedule", "pause", "1"]).ok();
    snapshot!("schedule_pause", paused.transcript());
    assert_eq!(schedule_json(&fx, "sched-1")["state"], "paused");
    let resumed = fx.drover(&["schedule", "resume", "sched-1"]).ok();
    snapshot!("schedule_resume", resumed.transcript());
    let removed = fx.drover(&["schedule", "rm", "1"]).ok();
    snapshot!("schedule_rm", removed.transcript());
    let again = fx.drover(&["schedule", "rm", "1"]);
    snapshot!("schedule_rm_unknown", again.transcript());
    assert_eq!(again.code, 4);
    assert!(schedule_json(&fx, "sched-1").is_null());
}

#[test]
fn schedule_arguments_are_checked_before_anything_is_made() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "worker"], "say ready");
    fx.wait_status(&id, "idle");
    let duration = fx.drover(&[
        "schedule", "add", "--agent", "worker", "--every", "soon", "x",
    ]);
    snapshot!("schedule_bad_duration", duration.transcript());
    assert_eq!(duration.code, 2);
    let cron = fx.drover(&[
        "schedule",
        "add",
        "--agent",
        "worker",
        "--cron",
        "61 * * * *",
        "x",
    ]);
    snapshot!("schedule_bad_cron", fx.redact(&cron.transcript()));
    assert_eq!(cron.code, 2);
    // What only the daemon can check is a bad argument too.
    for (args, names) in [
        (
            &["--cron", "0 9 * * *", "--tz", "Mars/Olympus"][..],
            "Mars/Olympus",
        ),
        (&["--at", "2020-01-01T00:00:00Z"][..], "in the past"),
    ] {
        let mut line = vec!["schedule", "add", "--agent", "worker"];
        line.extend_from_slice(args);
        line.push("x");
        let out = fx.drover(&line);
        assert_eq!(out.code, 2, "{args:?}: {}", out.transcript());
        assert!(out.stderr.contains(names), "{args:?}: {}", out.stderr);
    }
    let none = fx.drover(&["schedule", "add", "--agent", "worker", "x"]);
    assert_eq!(none.code, 2, "{}", none.transcript());
    assert!(none.stderr.contains("--every"), "{}", none.stderr);
    let nobody = fx.drover(&["schedule", "add", "--agent", "nobody", "--in", "1m", "x"]);
    assert_eq!(nobody.code, 4, "{}", nobody.transcript());
    let listed = fx.drover(&["schedule", "ls"]).ok();
    assert!(listed.stdout.is_empty(), "{}", listed.stdout);
    assert!(listed.stderr.contains("no schedules"), "{}", listed.stderr);
}

/// `drover job ls --json`'s record of job `id`.
fn job_json(fx: &Fixture, id: &str) -> Value {
    listed_json(fx, "job", id)
}

#[test]
fn jobs_are_started_followed_listed_and_killed() {
    let fx = Fixture::start();
    let id = fx.spawn_agent(&["--title", "worker"], "say ready");
    fx.wait_status(&id, "idle");
    // Several words are quoted and joined; stderr comes with stdout, in order.
    let started = fx
        .drover(&[
            "job",
            "start",
            "worker",
            "--no-notify",
            "--",
            "sh",
            "-c",
            "echo one; sleep 0.2; echo two >&2; exit 3",
        ])
        .ok();
    assert_eq!(started.stdout, "job-1\n", "{}", started.transcript());
    assert!(
        started.stderr.contains("started job-1 for ")
            && started
                .stderr
                .contains("sh -c 'echo one; sleep 0.2; echo two >&2; exit 3'"),
        "{}",
        started.stderr
    );
    let followed = fx.drover(&["job", "logs", "-f", "job-1"]).ok();
    assert_eq!(followed.stdout, "one\ntwo\n", "{}", followed.transcript());
    let job = job_json(&fx, "job-1");
    assert_eq!(job["status"], "exited", "{job}");
    assert_eq!(job["exitCode"], 3, "{job}");
    let tail = fx.drover(&["job", "logs", "--tail", "4", "job-1"]).ok();
    assert_eq!(tail.stdout, "two\n");

    // A running job keeps its agent from a plain archive, and is killed by `job kill`.
    let sleeper = fx
        .drover(&["job", "start", "worker", "--", "exec sleep 1000"])
        .ok();
    assert_eq!(sleeper.stdout, "job-2\n", "{}", sleeper.transcript());
    let ls = fx.drover(&["job", "ls", "worker"]).ok();
    let rows: Vec<&str> = ls.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{}", ls.stdout);
    assert!(
        rows.iter()
            .any(|r| r.starts_with("job-2") && r.contains("running")),
        "{}",
        ls.stdout
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with("job-1") && r.contains("exited   3")),
        "{}",
        ls.stdout
    );
    let inspected = fx.drover(&["inspect", "worker"]).ok();
    assert!(
        inspected
            .stdout
            .contains("jobs          job-2 running `exec sleep 1000`, 1 ended\n"),
        "{}",
        inspected.stdout
    );
    let refused = fx.drover(&["archive", "worker"]);
    assert_eq!(refused.code, 5, "{}", refused.transcript());
    assert!(
        refused
            .stderr
            .contains("job-2 `exec sleep 1000` is running"),
        "{}",
        refused.stderr
    );
    let killed = fx.drover(&["job", "kill", "job-2"]).ok();
    // How it ended, without parentheses in parentheses ("killed (signal 15 (request))").
    assert!(
        killed.stdout.starts_with("job-2 killed: signal ") && !killed.stdout.contains("))"),
        "{}",
        killed.transcript()
    );
    let job = job_json(&fx, "job-2");
    assert_eq!(job["killedBy"], "request", "{job}");

    // Bad input is named.
    let unknown = fx.drover(&["job", "logs", "job-99"]);
    assert_eq!(unknown.code, 4, "{}", unknown.transcript());
    assert!(unknown.stderr.contains("job-99"), "{}", unknown.stderr);
    let env = fx.drover(&["job", "start", "worker", "--env", "NOVALUE", "--", "true"]);
    assert_eq!(env.code, 2, "{}", env.transcript());
    assert!(env.stderr.contains("NOVALUE"), "{}", env.stderr);
    let cwd = fx.drover(&["job", "start", "worker", "--cwd", "/no/such", "--", "true"]);
    assert_eq!(cwd.code, 2, "{}", cwd.transcript());
    assert!(cwd.stderr.contains("/no/such"), "{}", cwd.stderr);
    let timeout = fx.drover(&["job", "start", "worker", "--timeout", "0", "--", "true"]);
    assert_eq!(timeout.code, 2, "{}", timeout.transcript());
    assert!(timeout.stderr.contains("--timeout"), "{}", timeout.stderr);
    // None of them started a job.
    let listed = fx.drover(&["job", "ls", "--json"]).ok().json();
    assert!(
        listed
            .as_array()
            .is_some_and(|jobs| jobs.iter().all(|j| j["command"] != "true")),
        "{listed}"
    );
    // The kill's exit notice runs a turn in the worker: archive once it is done.
    fx.drover(&["wait", "worker"]).ok();
    fx.drover(&["archive", "worker"]).ok();
}

// ---- job ----------------------------------------------------------------------------------------

#[test]
fn job_logs_follow_prints_the_output_as_it_comes_until_the_job_ends() {
    let fx = Fixture::start();
    let agent = fx.spawn_agent(&["--title", "owner"], "say ready");
    fx.wait_status(&agent, "idle");
    // 1.3 MB (more than the daemon's ring), then it waits for the test at its gate.
    let started = fx
        .drover(&[
            "job",
            "start",
            "owner",
            "--",
            "mkfifo gate; seq 1 200000; cat gate",
        ])
        .ok();
    let job = started.stdout.trim().to_string();
    assert!(job.starts_with("job-"), "{}", started.transcript());
    let mut live = Live::spawn(&fx, &["job", "logs", &job, "-f"]);
    // The output so far arrives while the job still runs (line by line: `expect_line`
    // would search every line seen for each new one).
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = live.lines.recv_timeout(left).expect("the output so far");
        let last = line == "200000";
        live.seen.push(line);
        if last {
            break;
        }
    }
    std::fs::write(fx.cwd().join("gate"), "the end\n").expect("open the job's gate");
    let out = live.finish();
    assert_eq!(out.code, 0, "{}", out.transcript());
    let mut expected = String::new();
    for i in 1..=200_000 {
        expected.push_str(&i.to_string());
        expected.push('\n');
    }
    expected.push_str("the end\n");
    assert_eq!(out.stdout.len(), expected.len(), "every byte once");
    assert!(out.stdout == expected, "in order");
    // Without -f: what there is, at once; with --tail, the last bytes.
    let tail = fx.drover(&["job", "logs", &job, "--tail", "15"]).ok();
    assert_eq!(tail.stdout, "200000\nthe end\n");
}

/// Every file under `dir` with its bytes.
fn files_under(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                files.insert(path, bytes);
            }
        }
    }
    files
}

/// The agents `import paseo --apply` (its JSON answer `applied`) brought in from
/// `scripts/paseo-home`'s records, each as its record says; returns the root's id.
fn imported_agents_keep_their_records(fx: &Fixture, applied: &Value) -> String {
    let imported = applied["imported"].as_array().expect("imported");
    let new_id = |paseo_id: &str| {
        imported
            .iter()
            .find(|i| {
                i["sourceId"]
                    .as_str()
                    .is_some_and(|s| s.ends_with(paseo_id))
            })
            .and_then(|i| i["agentId"].as_str())
            .unwrap_or_else(|| panic!("{paseo_id} not imported: {applied}"))
            .to_string()
    };
    let (root, child, archived, loose, orphan) = (
        new_id("001"),
        new_id("002"),
        new_id("003"),
        new_id("004"),
        new_id("008"),
    );
    let agents = fx.drover(&["ls", "--all", "--json"]).ok().json();
    let agent = |id: &str| {
        agents
            .as_array()
            .and_then(|all| all.iter().find(|a| a["id"] == id))
            .unwrap_or_else(|| panic!("{id} not listed: {agents}"))
            .clone()
    };
    let root_agent = agent(&root);
    assert_eq!(root_agent["title"], "fix the flaky test");
    assert_eq!(root_agent["status"], "idle");
    assert_eq!(root_agent["attentionReason"], "finished");
    assert_eq!(root_agent["createdAt"], "2026-11-02T09:00:00Z");
    assert_eq!(root_agent["labels"]["team"], "infra");
    assert!(root_agent["labels"]["paseo.agent-id"].is_string());
    let child_agent = agent(&child);
    assert_eq!(child_agent["parentAgentId"], root.as_str(), "{child_agent}");
    assert_eq!(
        child_agent["status"], "idle",
        "cut off mid-turn: {child_agent}"
    );
    assert_eq!(child_agent["attentionReason"], "interrupted");
    assert_eq!(child_agent["workspaceId"], root_agent["workspaceId"]);
    let archived_agent = agent(&archived);
    assert!(archived_agent["archivedAt"].is_string(), "{archived_agent}");
    assert_eq!(archived_agent["status"], "closed");
    assert_ne!(archived_agent["workspaceId"], root_agent["workspaceId"]);
    assert_eq!(agent(&loose)["status"], "closed");
    assert_eq!(agent(&loose)["workspaceId"], root_agent["workspaceId"]);
    let orphan_agent = agent(&orphan);
    assert!(orphan_agent["parentAgentId"].is_null(), "{orphan_agent}");
    assert!(
        imported.iter().any(|i| i["note"]
            .as_str()
            .is_some_and(|n| n.contains("parent was skipped"))),
        "{applied}"
    );

    root
}

#[test]
fn a_paseo_home_is_imported_once_after_a_dry_run_and_its_agents_run() {
    let fx = Fixture::start();
    let paseo = TempDir::new().expect("paseo home");
    drover_testkit::paseo_home(paseo.path(), &fx.cwd(), "scripted");
    let source = files_under(paseo.path());
    let home = paseo.path().display().to_string();

    // A dry run says what would come in and what not, and writes nothing.
    let dry = fx.drover(&["import", "paseo", &home]).ok();
    assert!(
        dry.stdout.starts_with("would import 5 agents from "),
        "{}",
        dry.stdout
    );
    for reason in [
        "one of Paseo's internal agents",
        "not a Paseo agent record",
        "removed-since` does not exist any more",
        "provider `aider` is not configured in drover: add [providers.aider] to config.toml",
    ] {
        assert!(dry.stdout.contains(reason), "{reason}: {}", dry.stdout);
    }
    let listed = fx.drover(&["ls", "--all", "--json"]).ok().json();
    assert_eq!(listed, serde_json::json!([]), "a dry run imports nothing");

    let applied = fx
        .drover(&["import", "paseo", &home, "--apply", "--json"])
        .ok()
        .json();
    assert_eq!(applied["dryRun"], false);
    assert_eq!(
        applied["imported"].as_array().map(Vec::len),
        Some(5),
        "{applied}"
    );
    assert_eq!(applied["skipped"].as_array().map(Vec::len), Some(4));
    let root = imported_agents_keep_their_records(&fx, &applied);

    // Again: nothing more comes in.
    let again = fx.drover(&["import", "paseo", &home, "--apply"]).ok();
    assert!(
        again.stdout.starts_with("imported 0 agents from "),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains("already imported as"),
        "{}",
        again.stdout
    );
    let after = fx.drover(&["ls", "--all", "--json"]).ok().json();
    assert_eq!(after.as_array().map(Vec::len), Some(5));
    assert_eq!(
        files_under(paseo.path()),
        source,
        "the Paseo home is only read"
    );

    // An imported agent takes work: its recorded session is tried, then it answers.
    fx.drover(&["send", &root, "say welcome to drover"]).ok();
    fx.drover(&["wait", &root]).ok();
    let logs = fx.drover(&["logs", &root]).ok();
    assert!(logs.stdout.contains("welcome to drover"), "{}", logs.stdout);

    // Not a Paseo home: said so.
    let wrong = fx.drover(&["import", "paseo", &fx.cwd().display().to_string()]);
    assert_eq!(wrong.code, 1, "{}", wrong.transcript());
    assert!(
        wrong.stderr.contains("holds no `agents` directory"),
        "{}",
        wrong.stderr
    );
}

// Imports at the same moment bring each agent in once (they take turns, each checking what
// came in before it writes); a record whose directory is relative (it would be read against
// the daemon's own) is skipped, saying so.
#[test]
fn paseo_imports_at_once_bring_each_agent_in_once_and_skip_a_relative_directory() {
    let fx = Fixture::start();
    let paseo = TempDir::new().expect("paseo home");
    drover_testkit::paseo_home(paseo.path(), &fx.cwd(), "scripted");
    let relative = paseo.path().join("agents/relative");
    std::fs::create_dir_all(&relative).expect("records");
    std::fs::write(
        relative.join("3f1c2a10-0000-4000-8000-000000000009.json"),
        r#"{"id": "3f1c2a10-0000-4000-8000-000000000009", "provider": "scripted", "cwd": ".",
            "createdAt": "2026-11-04T11:00:00.000Z", "lastStatus": "idle"}"#,
    )
    .expect("record");
    let home = paseo.path().display().to_string();
    let imports: Vec<Child> = (0..3)
        .map(|_| {
            fx.command(&["import", "paseo", &home, "--apply", "--json"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("drover import")
        })
        .collect();
    let mut imported = 0;
    for import in imports {
        let out = import.wait_with_output().expect("import");
        assert!(out.status.success(), "{out:?}");
        let applied: Value = serde_json::from_slice(&out.stdout).expect("json");
        imported += applied["imported"].as_array().map_or(0, Vec::len);
        let skipped = applied["skipped"].to_string();
        assert!(
            skipped.contains("its directory `.` is not an absolute path"),
            "{skipped}"
        );
    }
    assert_eq!(imported, 5, "each agent once");
    let listed = fx.drover(&["ls", "--all", "--json"]).ok().json();
    assert_eq!(listed.as_array().map(Vec::len), Some(5), "{listed}");
}

#[test]
fn a_providers_own_sessions_are_listed_then_imported_and_continue() {
    let fx = Fixture::start();
    let cwd = fx.cwd();
    let here = cwd.display().to_string();
    // Two sessions the user had with the scripted agent outside drover, as it keeps them.
    for (id, prompts) in [
        (
            "elsewhere-1",
            &["say fix the parser", "say and its tests"][..],
        ),
        ("elsewhere-2", &["say write the docs"][..]),
    ] {
        let mut history = serde_json::json!({"type": "session", "cwd": here}).to_string();
        for prompt in prompts {
            history.push('\n');
            history.push_str(&serde_json::json!({"type": "user", "text": prompt}).to_string());
        }
        history.push('\n');
        std::fs::write(fx.state.path().join(format!("{id}.jsonl")), history).expect("history");
    }

    let dry = fx
        .drover(&["import", "sessions", "scripted", "--cwd", &here])
        .ok();
    assert!(
        dry.stdout.starts_with(&format!(
            "would import 2 agents from scripted's sessions in {here} (a dry run"
        )),
        "{}",
        dry.stdout
    );
    for line in [
        format!("elsewhere-1  scripted  idle  say fix the parser  {here}  (continues its session)"),
        format!("elsewhere-2  scripted  idle  say write the docs  {here}  (continues its session)"),
    ] {
        assert!(dry.stdout.contains(&line), "{line}: {}", dry.stdout);
    }
    let listed = fx.drover(&["ls", "--all", "--json"]).ok().json();
    assert_eq!(listed, serde_json::json!([]), "a dry run imports nothing");

    let one = fx
        .drover(&[
            "import",
            "sessions",
            "scripted",
            "--session",
            "elsewhere-1",
            "--apply",
            "--json",
        ])
        .ok()
        .json();
    let agent = one["imported"][0]["agentId"]
        .as_str()
        .unwrap_or_else(|| panic!("imported: {one}"))
        .to_string();
    fx.drover(&["send", &agent, "recall"]).ok();
    fx.drover(&["wait", &agent]).ok();
    let logs = fx.drover(&["logs", &agent]).ok();
    assert!(
        logs.stdout
            .contains("recall: 2 earlier: say fix the parser / say and its tests"),
        "{}",
        logs.stdout
    );

    let rest = fx
        .drover(&["import", "sessions", "scripted", "--apply"])
        .ok();
    assert!(
        rest.stdout
            .starts_with("imported 1 agent from scripted's sessions"),
        "{}",
        rest.stdout
    );
    assert!(
        rest.stdout
            .contains(&format!("elsewhere-1: already imported as {agent}")),
        "{}",
        rest.stdout
    );

    // A provider whose agent exits before it lists: said so.
    let broken = fx.drover(&["import", "sessions", "broken"]);
    assert_ne!(broken.code, 0, "{}", broken.transcript());
    assert!(
        broken
            .stderr
            .contains("listing the sessions of provider `broken` failed"),
        "{}",
        broken.transcript()
    );
}

// ---- notifications -----------------------------------------------------------------------------

/// A tiny HTTP receiver on 127.0.0.1: every request's body, in order (each answered 200).
fn receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok()
                && let Ok(value) = serde_json::from_slice(&body)
            {
                record.lock().expect("lock").push(value);
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, bodies)
}

/// Waits until `n` bodies came; all of them.
fn received(bodies: &std::sync::Mutex<Vec<Value>>, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let all = bodies.lock().expect("lock").clone();
        if all.len() >= n {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{n} notifications never came: {all:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn notify_attach_counts_as_watching_and_notify_status_and_test_report_the_sinks() {
    let (url, bodies) = receiver();
    let fx = Fixture::new();
    let config = fx.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    let sink =
        format!("\n[[notify.sink]]\nkind = \"webhook\"\nname = \"hook\"\nurl = \"{url}/\"\n");
    text.push_str(&sink);
    std::fs::write(&config, text).expect("config");
    let fx = fx.serve(Command::new(DROVER), &[]);
    let id = fx.spawn_agent(&["--title", "watched"], "say before");
    assert_eq!(received(&bodies, 1)[0]["agentId"], id.as_str());

    // While attached, its turn ends unannounced.
    let mut attach = Live::spawn(&fx, &["attach", "watched"]);
    attach.expect_line("turn completed");
    fx.drover(&["send", &id, "say while-attached"]).ok();
    attach.expect_line("while-attached");
    fx.drover(&["wait", &id]).ok();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(bodies.lock().expect("lock").len(), 1);
    attach.interrupt();
    assert_eq!(attach.finish().code, 0);

    // Detached: announced again.
    fx.drover(&["send", &id, "say after"]).ok();
    let after = received(&bodies, 2);
    assert_eq!(after[1]["event"], "finished");
    assert_eq!(after[1]["agentId"], id.as_str());

    let status = fx.drover(&["notify", "status", "--json"]).ok().json();
    assert_eq!(status[0]["name"], "hook");
    assert_eq!(status[0]["sent"], 2);
    let table = fx.drover(&["notify", "status"]).ok();
    assert!(table.stdout.starts_with("SINK"), "{}", table.stdout);
    assert!(
        table.stdout.contains("hook") && table.stdout.contains("webhook"),
        "{}",
        table.stdout
    );

    let tested = fx.drover(&["notify", "test", "hook"]).ok();
    assert_eq!(tested.stdout, "hook: delivered\n");
    assert_eq!(received(&bodies, 3)[2]["event"], "test");
    let unknown = fx.drover(&["notify", "test", "nope"]);
    assert_ne!(unknown.code, 0, "{}", unknown.transcript());
    assert!(
        unknown.stderr.contains("no sink named `nope`"),
        "{}",
        unknown.transcript()
    );
}

#[test]
fn a_spent_budget_warns_then_refuses_send_until_drover_budget_raises_it() {
    let fx = Fixture::start();
    let until = |what: &str, done: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + WAIT;
        loop {
            let info = fx.info("frugal");
            if done(&info) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {info}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // 2000 tokens of 2400: past 80 %, a warning.
    let id = fx.spawn_agent(
        &["--title", "frugal", "--budget-tokens", "2400"],
        "usage\nusage",
    );
    fx.drover(&["wait", &id]).ok();
    until("2000 spent", &|i| i["treeSpend"]["tokens"] == 2000);
    until("warned", &|i| i["attentionReason"] == "budget_warning");
    let inspect = fx.drover(&["inspect", &id]).ok().stdout;
    assert!(
        inspect.contains("budget        2400 tokens (for it and its subagents)"),
        "{inspect}"
    );
    // Under the budget a send is accepted; its turn takes the tree past it.
    fx.drover(&["send", &id, "usage"]).ok();
    fx.drover(&["wait", &id]).ok();
    until("3000 spent", &|i| i["treeSpend"]["tokens"] == 3000);
    let out = fx.drover(&["send", &id, "say more"]);
    assert_eq!(out.code, 5, "{}", out.transcript());
    assert!(
        out.stderr.contains("3000 of 2400 tokens"),
        "{}",
        out.transcript()
    );
    // It says what to type here, naming the agent as every command does; not the protocol's
    // request or the full id.
    let handle = &id.replace('-', "")[24..];
    assert!(
        out.stderr
            .contains(&format!("drover budget {handle} --tokens N"))
            && out
                .stderr
                .contains(&format!("drover budget {handle} --clear"))
            && !out.stderr.contains("set_budget")
            && !out.stderr.contains(&id),
        "{}",
        out.transcript()
    );
    let out = fx.drover(&["budget", &id, "--tokens", "10000"]).ok();
    assert!(
        out.stdout.ends_with(": budget 10000 tokens\n"),
        "{}",
        out.transcript()
    );
    fx.drover(&["send", &id, "say more"]).ok();
    fx.drover(&["wait", &id]).ok();
    assert_eq!(fx.info(&id)["budget"]["tokens"], 10000);
}

#[test]
fn ls_tree_shows_spend_per_agent_and_per_tree_against_its_budget() {
    let fx = Fixture::start();
    let until = |id: &str, tokens: u64| {
        let deadline = Instant::now() + WAIT;
        while fx.info(id)["treeSpend"]["tokens"] != tokens {
            assert!(Instant::now() < deadline, "{tokens} spent: {}", fx.info(id));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // A root spends 1000 of its 1500 tokens, one subagent 1000 more, the other reports
    // nothing; a second root has no budget.
    let root = fx.spawn_agent(&["--title", "frugal", "--budget-tokens", "1500"], "usage");
    fx.drover(&["wait", &root]).ok();
    let quiet = fx.spawn_agent(&["--title", "quiet", "--parent", &root], "say nothing");
    fx.drover(&["wait", &quiet]).ok();
    let spender = fx.spawn_agent(&["--title", "spender", "--parent", &root], "usage");
    fx.drover(&["wait", &spender]).ok();
    until(&root, 2000);
    let other = fx.spawn_agent(&["--title", "free"], "usage");
    fx.drover(&["wait", &other]).ok();
    until(&other, 1000);
    let tree = fx.drover(&["ls", "--tree"]).ok();
    snapshot!("ls_tree_budget", fx.redact(&tree.transcript()));
    // The plain list has no spend columns.
    let table = fx.drover(&["ls"]).ok();
    assert!(!table.stdout.contains("SPEND"), "{}", table.stdout);
}
