//! No agent process outlives its daemon: SIGKILL of a daemon running in a process of its own
//! (`drover-daemon-proc`) with agents idle, streaming, hung, with a child in their group, with
//! a tool in a group of its own, and ignoring stdin's end; then the next boot on the same home.
//! The daemon's guard is killed first (as with a kill of both, or of their cgroup) and the
//! daemons use no cgroups, so the next boot's sweep is what ends the rest (`orphans.rs` tests
//! the guard and the cgroups).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use drover_fakes::procs;
use drover_testkit::daemon::{Client, string_at};
use drover_testkit::wait::{eventually, poll_until};
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);
/// No cgroups: a daemon sweeps a dead daemon's cgroups when it starts, before the boot's own
/// sweep, which these tests are about.
const MARKER_ONLY: &[(&str, &str)] = &[("DROVER_NO_CGROUPS", "1")];

/// A daemon in a process of its own on `home` (`drover-daemon-proc`), for tests that kill it.
pub(crate) struct DaemonProcess {
    child: Child,
    ws_url: String,
    home: PathBuf,
}

impl DaemonProcess {
    pub(crate) async fn start(home: &Path) -> DaemonProcess {
        DaemonProcess::start_with(home, &[]).await
    }

    /// As [`DaemonProcess::start`], with `env` added to the daemon's environment.
    pub(crate) async fn start_with(home: &Path, env: &[(&str, &str)]) -> DaemonProcess {
        let _ = std::fs::remove_file(home.join("daemon.json"));
        let child =
            drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover-daemon-proc"), home)
                .arg(home)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn drover-daemon-proc");
        let info = home.join("daemon.json");
        let url = eventually("daemon.json", WAIT, async || {
            let bytes = std::fs::read(&info).ok()?;
            let info: Value = serde_json::from_slice(&bytes).ok()?;
            info["url"].as_str().map(str::to_string)
        })
        .await;
        DaemonProcess {
            child,
            ws_url: format!("{}/ws", url.replacen("http://", "ws://", 1)),
            home: home.to_path_buf(),
        }
    }

    pub(crate) async fn client(&self) -> Client {
        let mut client = Client::connect(&self.ws_url).await;
        let token = std::fs::read_to_string(self.home.join("token")).ok();
        let hello = client.hello(token.as_deref().map(str::trim)).await;
        assert!(hello["agents"].is_array(), "{hello}");
        client
    }

    /// `ws://127.0.0.1:PORT/ws`.
    pub(crate) fn ws_url(&self) -> &str {
        &self.ws_url
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the daemon and waits for it to die (a signal it does not handle).
    pub(crate) fn die_by(&mut self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
        let _ = self.child.wait();
    }

    /// SIGKILLs the daemon's guard (`drover_core::guard`) and waits for it to be gone: what
    /// the daemon started then outlives a killed daemon until the next boot.
    pub(crate) fn kill_guard(&self) {
        let guard = crate::orphans::guard_of(self.pid()).expect("the daemon's guard");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(guard),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL the guard");
        let dead = std::time::Instant::now() + WAIT;
        while alive(guard) && std::time::Instant::now() < dead {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(guard), "the guard outlived SIGKILL");
    }

    pub(crate) fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        let _ = self.child.wait();
    }

    /// SIGTERM: the daemon's ordered shutdown, waited for (at most [`WAIT`]).
    pub(crate) async fn stop(mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: sending a signal to our own child process.
        #[expect(unsafe_code)]
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM the daemon");
        let exited = poll_until(WAIT, async || self.child.try_wait().ok().flatten()).await;
        assert!(exited.is_some(), "the daemon did not stop within {WAIT:?}");
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon home of its own whose `config.toml` is what `config` makes of the scripted agent's
/// state directory (one of its own), and a working directory.
pub(crate) struct Home {
    dir: TempDir,
    _state: TempDir,
    _cwd: TempDir,
    /// The working directory, canonical.
    pub(crate) cwd: PathBuf,
}

impl Home {
    pub(crate) fn new(config: fn(&Path) -> String) -> Home {
        let home = TempDir::new().expect("home");
        let state = TempDir::new().expect("agent state");
        let work = TempDir::new().expect("cwd");
        let cwd = std::fs::canonicalize(work.path()).expect("cwd");
        std::fs::write(home.path().join("config.toml"), config(state.path())).expect("config");
        Home {
            dir: home,
            _state: state,
            _cwd: work,
            cwd,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

pub(crate) fn config(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_drover-scripted-agent");
    let scripted = drover_fakes::scripted_agent::provider_config(Path::new(bin), state);
    // An agent that ignores its stdin's end, as codex-acp and claude-agent-acp 0.23 do.
    format!(
        "{scripted}[providers.stubborn]\nlabel = \"Stubborn\"\ncommand = [{bin:?}]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, SCRIPTED_AGENT_IGNORE_EOF = \"1\" }}\n",
        state = state.display().to_string(),
    )
}

pub(crate) async fn create(
    client: &mut Client,
    provider: &str,
    cwd: &Path,
    prompt: &str,
) -> String {
    client
        .create_agent(json!({"provider": provider, "cwd": cwd, "prompt": prompt}))
        .await
}

/// One agent for each (provider, prompt), in order, all in `cwd`: their ids.
pub(crate) async fn create_each<const N: usize>(
    client: &mut Client,
    cwd: &Path,
    agents: [(&str, &str); N],
) -> [String; N] {
    let mut ids = Vec::with_capacity(N);
    for (provider, prompt) in agents {
        ids.push(create(client, provider, cwd, prompt).await);
    }
    ids.try_into().expect("one id for each agent")
}

/// The text of every agent message in the agent's timeline, joined.
pub(crate) async fn said(client: &mut Client, agent: &str) -> String {
    client
        .timeline(agent)
        .await
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str().map(str::to_string))
        .collect::<String>()
}

/// The pid after `word ` in what the agent said (`child 123`, `tool 456`).
pub(crate) async fn said_pid(client: &mut Client, agent: &str, word: &str) -> i32 {
    let text = said(client, agent).await;
    text.split(&format!("{word} "))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no `{word} <pid>` in {text:?}"))
}

pub(crate) fn alive(pid: i32) -> bool {
    procs::Process::read(pid).is_some_and(|p| !p.zombie())
}

/// The recorded leader pid of every live runtime under `home`.
fn recorded_leaders(home: &Path) -> Vec<(String, i32)> {
    let Ok(dir) = std::fs::read_dir(home.join("runtimes")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let record: Value = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some((
                record["agentId"].as_str()?.to_string(),
                i32::try_from(record["pid"].as_u64()?).ok()?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_nothing_survives_a_sigkilled_daemon_and_boot_spares_a_reused_pid() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let mut daemon = DaemonProcess::start_with(home.path(), MARKER_ONLY).await;
    let mut client = daemon.client().await;

    let [idle, streaming, hung, with_child, with_tool, stubborn] = create_each(
        &mut client,
        &cwd,
        [
            ("scripted", "say hi"),
            ("scripted", "stream 1000000 20"),
            ("scripted", "hang"),
            ("scripted", "spawn-child"),
            ("scripted", "spawn-tool"),
            ("stubborn", "say hi"),
        ],
    )
    .await;
    let agents = [&idle, &streaming, &hung, &with_child, &with_tool, &stubborn];
    for agent in [&idle, &with_child, &with_tool, &stubborn] {
        let idle = client
            .request(json!({"type": "wait_idle", "agentId": agent, "timeoutMs": 15000}))
            .await;
        assert_eq!(idle["payload"]["idle"], true, "{idle}");
    }
    eventually("the streaming agent to stream", WAIT, async || {
        said(&mut client, &streaming).await.contains("chunk ")
    })
    .await;
    let child = said_pid(&mut client, &with_child, "child").await;
    let tool = said_pid(&mut client, &with_tool, "tool").await;
    let leaders = eventually("a runtime record per agent", WAIT, async || {
        let leaders = recorded_leaders(home.path());
        (leaders.len() == agents.len()).then_some(leaders)
    })
    .await;
    assert!(alive(child) && alive(tool));

    daemon.kill_guard();
    daemon.sigkill();
    // The agents themselves die with the daemon, within a bounded time.
    let gone = poll_until(Duration::from_secs(5), async || {
        leaders.iter().all(|(_, pid)| !alive(*pid))
    })
    .await;
    let left: Vec<_> = leaders.iter().filter(|(_, pid)| alive(*pid)).collect();
    assert!(
        gone.is_some(),
        "agent processes alive 5 s after SIGKILL: {left:?}"
    );

    // An unrelated process that got a recorded pid (a record whose start time is not its own)
    // must be left alone.
    let mut bystander = Command::new("sleep")
        .arg("1000")
        .process_group(0)
        .spawn()
        .expect("spawn a bystander");
    let pid = bystander.id();
    let start: u64 = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .expect("stat")
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19)?.parse().ok())
        .expect("start time");
    let ghost = drover_core::AgentId::new().to_string();
    std::fs::write(
        home.path().join("runtimes").join(format!("{ghost}.json")),
        json!({"version": 1, "agentId": ghost, "pid": pid, "pgid": pid,
               "startTime": start + 7, "daemonPid": 1})
        .to_string(),
    )
    .expect("a record of a reused pid");

    // What the agents started (a child in the group, a tool in its own) is gone once the
    // next daemon serves, before any runtime starts.
    let daemon = DaemonProcess::start_with(home.path(), MARKER_ONLY).await;
    for agent in agents {
        assert_eq!(
            drover_testkit::agent_processes(agent),
            Vec::new(),
            "a process of agent {agent} outlived the boot"
        );
    }
    assert!(!alive(child) && !alive(tool));
    assert!(
        alive(i32::try_from(pid).expect("pid")),
        "the boot killed a process that reused a recorded pid"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();

    // The streaming agent's turn, cut off by the kill, ended `interrupted` in its history.
    let mut client = daemon.client().await;
    assert_cut_off(&mut client, &streaming).await;

    // Never two runtimes for one agent: started again, it has exactly one process.
    client.initialize_agent(&stubborn).await;
    let ran = client
        .request(json!({"type": "send_message", "agentId": stubborn, "text": "say again"}))
        .await;
    assert_ne!(ran["type"], "rpc_error", "{ran}");
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": stubborn, "timeoutMs": 15000}))
        .await;
    assert_eq!(idle["payload"]["idle"], true, "{idle}");
    assert_eq!(drover_testkit::agent_processes(&stubborn).len(), 1);
}

/// The agent's turn was cut off by a killed daemon: the boot ended it `interrupted` (cause
/// `crash`) in its timeline, and the agent is idle with attention `interrupted`.
async fn assert_cut_off(client: &mut Client, agent: &str) {
    let items = client.timeline(agent).await;
    let last = items.last().expect("a timeline");
    assert_eq!(last["kind"], "turn_ended", "{last}");
    assert_eq!(last["data"]["event"], "turn_interrupted", "{last}");
    assert_eq!(last["data"]["cause"], "crash", "{last}");
    let listed = client
        .agents(false)
        .await
        .into_iter()
        .find(|a| a["id"] == agent)
        .expect("the agent");
    assert_eq!(listed["status"], "idle", "{listed}");
    assert_eq!(listed["attentionReason"], "interrupted", "{listed}");
}

/// The pids a job printed as `pid=<n>`.
pub(crate) fn printed_pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("pid="))
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_a_sigkilled_daemon_leaves_no_job_running_and_the_next_boot_marks_it_lost() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let mut daemon = DaemonProcess::start_with(home.path(), MARKER_ONLY).await;
    let mut client = daemon.client().await;
    let agent = create(&mut client, "scripted", &cwd, "say hi").await;
    // A child in the job's group, and one that left it for a session of its own.
    let started = client
        .request(json!({"type": "start_job", "agentId": agent,
            "command": "sleep 1000 & echo pid=$!; setsid sleep 1000 & echo pid=$!; wait"}))
        .await;
    assert_eq!(started["type"], "job", "{started}");
    let id = string_at(&started["payload"]["job"]["id"]);
    let leader =
        i32::try_from(started["payload"]["job"]["pid"].as_u64().expect("pid")).expect("pid");
    let children = eventually("the job's children", WAIT, async || {
        let out = client
            .request(json!({"type": "job_output", "jobId": id, "offset": 0}))
            .await;
        let found = printed_pids(out["payload"]["text"].as_str().unwrap_or_default());
        (found.len() == 2 && found.iter().all(|p| alive(*p))).then_some(found)
    })
    .await;

    daemon.kill_guard();
    daemon.sigkill();
    // The job's own process dies with the daemon.
    let gone = poll_until(Duration::from_secs(5), async || !alive(leader)).await;
    assert!(gone.is_some(), "the job's shell outlived the daemon by 5 s");

    // What it started is ended by the next boot, before it serves; the job is `lost`.
    let daemon = DaemonProcess::start_with(home.path(), MARKER_ONLY).await;
    let left: Vec<&i32> = children.iter().filter(|p| alive(**p)).collect();
    assert!(left.is_empty(), "job processes outlived the boot: {left:?}");
    let mut client = daemon.client().await;
    let listed = client.request(json!({"type": "list_jobs"})).await;
    let job = &listed["payload"]["jobs"][0];
    assert_eq!(job["id"], id.as_str(), "{listed}");
    assert_eq!(job["status"], "lost", "{listed}");
    // What it wrote before the kill is still there.
    let out = client
        .request(json!({"type": "job_output", "jobId": id, "offset": 0}))
        .await;
    assert_eq!(
        printed_pids(out["payload"]["text"].as_str().unwrap_or_default()),
        children,
        "{out}"
    );
    assert_eq!(out["payload"]["eof"], true, "{out}");

    // Its owner asked to hear how it ends (notifyOnExit): told once, at this boot, that it was
    // lost, with what it wrote.
    let notices = |items: Vec<Value>| -> Vec<String> {
        items
            .into_iter()
            .filter(|i| i["kind"] == "user_message" && i["data"]["source"] == format!("job:{id}"))
            .map(|i| i["data"]["text"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let told = eventually("the lost job's notice", WAIT, async || {
        let told = notices(client.timeline(&agent).await);
        (!told.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains(&format!("Job {id} was lost")) && told[0].contains("> pid="),
        "{}",
        told[0]
    );
    // Not again at the next boot.
    client.wait_idle(&agent).await;
    drop(client);
    daemon.stop().await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    client.wait_idle(&agent).await;
    assert_eq!(notices(client.timeline(&agent).await).len(), 1);
}
