//! Test doubles and harnesses for drover.
//!
//! [`TestRuntime`] stands in for the agent runtimes where the registry, not a runtime, is under
//! test: it records what the registry asked of it and fails on request. [`TestFamily`] is an
//! activity family (think `job`) whose running work a test scripts. [`daemon`] runs the real
//! daemon in the test's process with a protocol client. [`crash`] is the line protocol of
//! `drover-crashdriver` ([`crashdriver`]), the process the crash test kills. [`wait::eventually`]
//! is how a test waits for something to become true. [`scripted_agent_bin`] finds the scripted
//! agent's binary for tests outside drover-e2e, which declares it. [`hermetic`] gives every
//! process a test starts an environment of its own (the system's `PATH`, the test's `HOME`).
//!
//! The fakes of external programs (the scripted agent, the model server, the real agents'
//! setup) are in drover-fakes; the end-to-end tests are in drover-e2e.

// A test harness: its helpers panic on purpose, to fail the test that called them.
#![expect(clippy::missing_panics_doc)]

pub mod crash;
pub mod crashdriver;
pub mod daemon;
pub mod daemonproc;
pub mod disk;
pub mod hermetic;
pub mod msgdriver;
pub mod netns;
pub mod wait;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub use drover_fakes::procs;

use drover_core::{
    ActivityFamily, ActivityItem, Agent, AgentId, BoxFuture, CancelCause, RuntimeControl,
    RuntimeError, view::AgentsView,
};

/// Creates an agent on `manager` with the steps of the daemon's `create_agent` operation for
/// an existing workspace, in its order: the provider checked and its defaults filled in
/// (`prepare`), the record written, then the runtime started with `prompt` queued, from the
/// user, or from agent `notify`, which is told how that first turn goes. For tests of the
/// runtimes without a daemon; a daemon's tests create agents through its protocol or MCP.
pub async fn create_agent(
    manager: &drover_acp::RuntimeManager,
    mut new: drover_core::NewAgent,
    prompt: Option<String>,
    notify: Option<AgentId>,
) -> Result<Agent, drover_acp::AcpError> {
    manager.prepare(&mut new)?;
    let agent = manager.registry().create_agent(new).await?;
    let source = notify.map_or_else(|| "user".to_string(), |a| format!("agent:{a}"));
    manager.start_new(&agent, prompt, source, notify).await?;
    Ok(agent)
}

/// What the registry asked a runtime to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeCall {
    Cancel {
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    },
    Close {
        agent: AgentId,
        cause: CancelCause,
    },
    Shutdown,
}

#[derive(Debug, Default)]
struct RuntimeState {
    calls: Vec<RuntimeCall>,
    fail_cancel: HashSet<AgentId>,
    fail_close: HashSet<AgentId>,
}

/// Records every call; cancels or closes fail for the agents a test names.
#[derive(Debug, Default, Clone)]
pub struct TestRuntime {
    state: Arc<Mutex<RuntimeState>>,
}

impl TestRuntime {
    pub fn new() -> Arc<TestRuntime> {
        Arc::new(TestRuntime::default())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RuntimeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn fail_cancel(&self, agent: AgentId) {
        self.state().fail_cancel.insert(agent);
    }

    pub fn fail_close(&self, agent: AgentId) {
        self.state().fail_close.insert(agent);
    }

    pub fn calls(&self) -> Vec<RuntimeCall> {
        self.state().calls.clone()
    }

    pub fn cancels(&self) -> Vec<(AgentId, CancelCause)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                RuntimeCall::Cancel { agent, cause, .. } => Some((agent, cause)),
                _ => None,
            })
            .collect()
    }

    pub fn closes(&self) -> Vec<AgentId> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                RuntimeCall::Close { agent, .. } => Some(agent),
                _ => None,
            })
            .collect()
    }

    /// Waits (at most `timeout`) until `done` holds for the calls so far; returns the calls
    /// either way, for the caller's assertion.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[RuntimeCall]) -> bool,
    ) -> Vec<RuntimeCall> {
        wait::poll_until(timeout, async || {
            let calls = self.calls();
            done(&calls).then_some(calls)
        })
        .await
        .unwrap_or_else(|| self.calls())
    }
}

impl RuntimeControl for TestRuntime {
    fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let mut state = self.state();
        state.calls.push(RuntimeCall::Cancel {
            agent,
            cause,
            keep_inbox,
        });
        let fail = state.fail_cancel.contains(&agent);
        Box::pin(async move {
            if fail {
                Err(RuntimeError {
                    agent,
                    message: "test runtime refuses to cancel".to_string(),
                })
            } else {
                Ok(())
            }
        })
    }

    fn close(
        &self,
        agent: AgentId,
        cause: CancelCause,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let mut state = self.state();
        state.calls.push(RuntimeCall::Close { agent, cause });
        let fail = state.fail_close.contains(&agent);
        Box::pin(async move {
            if fail {
                Err(RuntimeError {
                    agent,
                    message: "test runtime refuses to close".to_string(),
                })
            } else {
                Ok(())
            }
        })
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        self.state().calls.push(RuntimeCall::Shutdown);
        Box::pin(async {})
    }
}

/// How a scripted item's stop behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopBehaviour {
    #[default]
    Succeed,
    Fail,
    Panic,
    /// Never resolves: the registry must not wait for it.
    Hang,
}

#[derive(Debug, Default)]
struct FamilyState {
    running: HashMap<AgentId, Vec<(ActivityItem, StopBehaviour)>>,
    stops: Vec<(AgentId, String)>,
    /// Whether the owner was already archived on disk when its stop was issued.
    archived_when_stopped: Vec<bool>,
}

/// An activity family whose running work the test scripts, e.g. `job`.
#[derive(Debug, Clone)]
pub struct TestFamily {
    name: &'static str,
    state: Arc<Mutex<FamilyState>>,
    /// The store folder, to check that the archive was on disk before a stop was issued.
    home: Option<PathBuf>,
}

impl TestFamily {
    pub fn new(name: &'static str) -> Arc<TestFamily> {
        Arc::new(TestFamily {
            name,
            state: Arc::default(),
            home: None,
        })
    }

    /// Like `new`, and on each stop reads the owner's record under `home` to tell whether the
    /// archive was written before the stop was issued.
    pub fn watching_disk(name: &'static str, home: &Path) -> Arc<TestFamily> {
        Arc::new(TestFamily {
            name,
            state: Arc::default(),
            home: Some(home.to_path_buf()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FamilyState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Scripts one running item for `agent`.
    pub fn add(&self, agent: AgentId, id: &str, stop: StopBehaviour) {
        self.state().running.entry(agent).or_default().push((
            ActivityItem {
                id: id.to_string(),
                agent_id: None,
                title: None,
                detail: format!("{} {id} is running", self.name),
            },
            stop,
        ));
    }

    /// Stops issued so far: (owner, item id).
    pub fn stops(&self) -> Vec<(AgentId, String)> {
        self.state().stops.clone()
    }

    pub fn archived_when_stopped(&self) -> Vec<bool> {
        self.state().archived_when_stopped.clone()
    }

    fn archived_on_disk(&self, owner: AgentId) -> Option<bool> {
        let home = self.home.as_ref()?;
        let name = format!("{owner}.json");
        for dir in std::fs::read_dir(home.join("agents")).ok()?.flatten() {
            let path = dir.path().join(&name);
            if let Ok(bytes) = std::fs::read(&path) {
                let doc: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
                return Some(!doc["archivedAt"].is_null());
            }
        }
        None
    }
}

impl ActivityFamily for TestFamily {
    fn name(&self) -> &'static str {
        self.name
    }

    fn running(&self, _: &dyn AgentsView, agent: &Agent) -> Vec<ActivityItem> {
        self.state()
            .running
            .get(&agent.id)
            .map(|items| items.iter().map(|(i, _)| i.clone()).collect())
            .unwrap_or_default()
    }

    fn stop(&self, owner: AgentId, item: ActivityItem) -> BoxFuture<'static, Result<(), String>> {
        let archived = self.archived_on_disk(owner);
        let behaviour = {
            let mut state = self.state();
            state.stops.push((owner, item.id.clone()));
            if let Some(a) = archived {
                state.archived_when_stopped.push(a);
            }
            let behaviour = state
                .running
                .get(&owner)
                .and_then(|items| items.iter().find(|(i, _)| i.id == item.id))
                .map(|(_, b)| *b)
                .unwrap_or_default();
            if behaviour != StopBehaviour::Hang
                && let Some(items) = state.running.get_mut(&owner)
            {
                items.retain(|(i, _)| i.id != item.id);
            }
            behaviour
        };
        match behaviour {
            StopBehaviour::Succeed => Box::pin(async { Ok(()) }),
            StopBehaviour::Fail => {
                Box::pin(async move { Err(format!("{} refuses to stop", item.id)) })
            }
            StopBehaviour::Panic => panic!("test family panics while stopping {}", item.id),
            StopBehaviour::Hang => Box::pin(std::future::pending()),
        }
    }
}

/// Waits (at most `timeout`) until no live process is left in process group `pgid`.
pub async fn wait_process_group_gone(pgid: u32, timeout: Duration) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return true;
    };
    wait::poll_until(timeout, async || procs::group_gone(pgid))
        .await
        .is_some()
}

/// The `drover-scripted-agent` binary of this build, for tests outside drover-e2e (which
/// declares it, and whose own tests use `CARGO_BIN_EXE_drover-scripted-agent`): in the running
/// test's target folder, else built there once with a nested `cargo build` in the same profile.
pub fn scripted_agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| e2e_bin("drover-scripted-agent")).clone()
}

/// The `drover` binary of this build (the CLI, for tests outside its own crate: a host's
/// `drover connect --stdio`), built once per test process with `cargo build -p drover` so
/// that a stale one is never used.
pub fn drover_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| package_bin("drover", "drover", true))
        .clone()
}

/// The binary `name` of drover-e2e in this build's target folder (`target/<profile>`, the
/// parent of the `deps/` a test runs from), built with `cargo build -p drover-e2e` if missing.
fn e2e_bin(name: &str) -> PathBuf {
    package_bin("drover-e2e", name, false)
}

/// The binary `name` of `package` in this build's target folder, built with `cargo build` if
/// missing (or always, with `fresh`).
fn package_bin(package: &str, name: &str, fresh: bool) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    if fresh || !bin.is_file() {
        // `target/debug` is the `dev` profile; any other folder is named after its profile.
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(other) => other.to_string(),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let args = ["build", "-p", package, "--profile", &profile, "--bin", name];
        let status = std::process::Command::new(&cargo)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "cannot build {name} ({cargo} {})",
            args.join(" ")
        );
    }
    assert!(bin.is_file(), "{} is missing", bin.display());
    bin
}

/// A `config.toml` with the scripted agent as provider `scripted`.
pub fn scripted_config(agent_bin: &Path, state_dir: &Path) -> String {
    drover_fakes::scripted_agent::provider_config(agent_bin, state_dir)
}

/// Live processes started for agent `agent` (by the `DROVER_AGENT_ID` drover puts in every
/// agent's environment), as (pid, command line) for a failure message.
pub fn agent_processes(agent: &str) -> Vec<(i32, String)> {
    procs::of_agent(agent)
        .into_iter()
        .map(|p| (p.pid, p.command_line()))
        .collect()
}

/// Waits (at most 10 s) until no process of agent `agent` is left.
pub async fn no_agent_processes_left(agent: &str) -> bool {
    wait::poll_until(Duration::from_secs(10), async || {
        procs::of_agent(agent).is_empty()
    })
    .await
    .is_some()
}

/// Makes `dir` a git repository on `main` whose one commit holds `files` (path, contents).
pub fn git_repository(dir: &Path, files: &[(&str, &str)]) {
    git(dir, &["init", "-q", "-b", "main"]);
    for (path, contents) in files {
        std::fs::write(dir.join(path), contents).expect("write a file of the repository");
        git(dir, &["add", path]);
    }
    git(dir, &["commit", "-q", "-m", "first"]);
}

/// The lines `git` prints in `dir` (for listings: branches, worktrees).
pub fn git_lines(dir: &Path, args: &[&str]) -> Vec<String> {
    let out = hermetic::command("git", Path::new("/nonexistent"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Runs `git` in `dir` with a fixed identity and none of the user's configuration (no
/// `~/.gitconfig`: signing, hooks, a default branch); panics with its stderr when it fails.
pub fn git(dir: &Path, args: &[&str]) {
    let out = hermetic::command("git", Path::new("/nonexistent"))
        .args([
            "-c",
            "user.name=drover",
            "-c",
            "user.email=drover@example.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert_succeeded(&out, &format!("git {args:?}"));
}

/// What a real agent runs against in a test: the scripted model server on 127.0.0.1 it is
/// pointed at, a working directory (canonical, so that paths the agent reports compare equal
/// to ours) and a scratch folder for its own files. The folders go with it.
#[derive(Debug)]
pub struct RealGround {
    pub model: drover_fakes::model::ModelServer,
    pub cwd: PathBuf,
    pub scratch: tempfile::TempDir,
    /// The folder `cwd` names, held so that it lasts as long as this.
    pub cwd_dir: tempfile::TempDir,
}

impl RealGround {
    pub async fn new() -> RealGround {
        let cwd_dir = tempfile::TempDir::new().expect("cwd");
        let scratch = tempfile::TempDir::new().expect("scratch");
        let cwd = std::fs::canonicalize(cwd_dir.path()).expect("cwd");
        RealGround {
            model: model_server().await,
            cwd,
            scratch,
            cwd_dir,
        }
    }

    /// How to run `agent` here: its config written under the scratch folder, in the working
    /// directory, against the model.
    pub fn command(
        &self,
        agent: drover_fakes::real_agents::RealAgent,
    ) -> drover_fakes::acp_client::AgentCommand {
        agent
            .command(
                &drover_fakes::real_agents::agents_dir(),
                &self.model.url(),
                self.scratch.path(),
                &self.cwd,
            )
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The scripted model, served on a fresh port of 127.0.0.1.
pub async fn model_server() -> drover_fakes::model::ModelServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the model server");
    drover_fakes::model::serve(listener)
}

/// The three records a boot must leave alone, made from `template` (a record as drover writes
/// it, whose `id` is `{prefix}-1`), each with what it is: one unreadable, one naming another
/// id (`{prefix}-4`) and one written by a newer drover (`version` 99).
pub fn records_boot_leaves_alone(
    template: &serde_json::Value,
    prefix: &str,
) -> [(&'static str, Vec<u8>); 3] {
    let mut other_id = template.clone();
    other_id["id"] = serde_json::json!(format!("{prefix}-4"));
    let mut newer = template.clone();
    newer["version"] = serde_json::json!(99);
    [
        (
            "unreadable",
            format!("{{\"version\": 1, \"id\": \"{prefix}-1\", torn").into_bytes(),
        ),
        (
            "naming another id",
            serde_json::to_vec_pretty(&other_id).expect("json"),
        ),
        (
            "written by a newer drover",
            serde_json::to_vec_pretty(&newer).expect("json"),
        ),
    ]
}

/// A child process a test kills: with SIGKILL when dropped (a failing assertion included), or
/// on purpose with [`KillOnDrop::kill_and_drain`].
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Kills the process with SIGKILL, fails the test if it had exited successfully by then,
    /// then adds to `lines` what it printed before dying (still in the pipe `reader` reads
    /// into `rx`), once `reader` has ended.
    pub fn kill_and_drain<T>(
        &mut self,
        reader: std::thread::JoinHandle<()>,
        rx: &std::sync::mpsc::Receiver<T>,
        lines: &mut Vec<T>,
    ) {
        self.0.kill().expect("SIGKILL the driver");
        let status = self.0.wait().expect("reap the driver");
        assert!(!status.success(), "the driver was not killed: {status:?}");
        reader.join().expect("reader thread");
        lines.extend(rx.try_iter());
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fails the test unless the process whose output is `out` exited successfully, naming it
/// `what` and showing what it printed.
pub fn assert_succeeded(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a Paseo home into `paseo` with `scripts/paseo-home`: agents of `provider` working
/// in `cwd`.
pub fn paseo_home(paseo: &Path, cwd: &Path, provider: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/paseo-home");
    let made = std::process::Command::new(script)
        .arg(paseo)
        .arg(cwd)
        .arg(provider)
        .output()
        .expect("run scripts/paseo-home");
    assert!(made.status.success(), "{made:?}");
}

/// `path`, a program or folder a test needs from the machine; fails the test, saying how to
/// install it (`how`), when it is not there.
pub fn installed(path: PathBuf, how: &str) -> PathBuf {
    assert!(path.exists(), "no {}: {how}", path.display());
    path
}
