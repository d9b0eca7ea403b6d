//! The real agents as `npm install -g` installs them leave nothing behind a killed daemon:
//! codex-acp's Node launcher (which starts the native `codex-acp`) and claude-agent-acp (a Node
//! agent that starts a `claude` child), run from `node_modules/.bin` against the scripted model,
//! one agent idle, one streaming a reply and one waiting on a shell tool it runs (`sleep`); the
//! daemon gets SIGKILL and, without any new daemon, no process of their trees (found by the
//! daemon's marker in `/proc/*/environ` and by descent from each agent) is alive 2 s later.
//! With the daemon's cgroups and with `DROVER_NO_CGROUPS=1`. Needs `scripts/install-agents`.

use std::path::Path;
use std::time::Duration;

use drover_fakes::procs;
use drover_fakes::real_agents::{RealAgent, agents_dir, provider_toml};
use drover_testkit::RealGround;
use drover_testkit::daemon::Client;
use drover_testkit::wait::eventually;
use nix::sys::signal::Signal;
use serde_json::json;
use tempfile::TempDir;

use crate::orphans::{assert_all_gone_within, cgroup_dir, cgroups_env, cgroups_here, guard_of};
use crate::processes::{DaemonProcess, said};

/// Generous: claude's `session/new` alone takes a second or two on 2 cores.
const TURN: Duration = Duration::from_secs(90);

/// The agent's provider as a user installs it: the npm launcher on `PATH` (`codex-acp`, a Node
/// script that starts the native binary; `claude-agent-acp`), with the scripted model's
/// settings.
pub(crate) fn config(agent: RealAgent, ground: &RealGround) -> String {
    let mut command = ground.command(agent);
    let bin = agents_dir().join("node_modules/.bin");
    let launcher = match agent {
        RealAgent::Codex => "codex-acp",
        RealAgent::Claude => "claude-agent-acp",
        RealAgent::Gemini => "gemini",
    };
    command.program = bin.join(launcher);
    assert!(
        command.program.exists(),
        "{} is missing: run scripts/install-agents",
        command.program.display()
    );
    command.args.clear();
    let path = command.env.get("PATH").cloned().unwrap_or_default();
    command
        .env
        .insert("PATH".into(), format!("{}:{path}", bin.display()));
    provider_toml(agent.name(), &command)
}

async fn create(client: &mut Client, name: &str, cwd: &Path, prompt: &str) -> String {
    client
        .create_agent(json!({"provider": name, "cwd": cwd, "prompt": prompt}))
        .await
}

/// Every live process of the agent's tree: descendants of each of its marked processes.
fn tree_of(agent: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = Vec::new();
    for p in procs::of_agent(agent) {
        for q in procs::tree(p.pid) {
            if !pids.contains(&q.pid) {
                pids.push(q.pid);
            }
        }
    }
    pids
}

async fn nothing_of_a_wrapped_agent_outlives_the_daemon(agent: RealAgent, cgroups: bool) {
    let name = agent.name();
    let home = TempDir::new().expect("home");
    let ground = RealGround::new().await;
    let cwd = &ground.cwd;
    std::fs::write(home.path().join("config.toml"), config(agent, &ground)).expect("config");
    let env = cgroups_env(cgroups);
    let mut daemon = DaemonProcess::start_with(home.path(), env).await;
    let mut client = daemon.client().await;

    let idle = create(&mut client, name, cwd, "reply idle now").await;
    let idle_done = client
        .request(json!({"type": "wait_idle", "agentId": idle, "timeoutMs": TURN.as_millis()}))
        .await;
    assert_eq!(idle_done["payload"]["idle"], true, "{name}: {idle_done}");

    // Waiting on a tool: a shell command, allowed (if the agent asks), that runs until it is
    // killed.
    let on_tool = create(&mut client, name, cwd, "shell sleep 1000").await;
    let tool = eventually("the tool's `sleep 1000`", TURN, async || {
        let found = tree_of(&on_tool)
            .into_iter()
            .find(|pid| procs::Process::read(*pid).is_some_and(|p| p.argv() == ["sleep", "1000"]));
        if found.is_none() {
            // Refused with an error while no question is pending.
            client
                .request(
                    json!({"type": "answer_permission", "agentId": on_tool, "kind": "allow_once"}),
                )
                .await;
        }
        found
    })
    .await;

    // Streaming a long reply.
    let streaming = create(&mut client, name, cwd, "stream 4000 25").await;
    eventually("the agent to stream", TURN, async || {
        said(&mut client, &streaming).await.contains("chunk")
    })
    .await;

    let mut watched: Vec<i32> = Vec::new();
    for agent_id in [&idle, &on_tool, &streaming] {
        let tree = tree_of(agent_id);
        // The launcher and what it started: two processes at least.
        assert!(
            tree.len() >= 2,
            "{name}: agent {agent_id} runs {tree:?}, not a wrapper and its agent"
        );
        watched.extend(tree);
    }
    watched.push(tool);
    for p in procs::of_daemon(daemon.pid()) {
        if !watched.contains(&p.pid) {
            watched.push(p.pid);
        }
    }
    assert!(guard_of(daemon.pid()).is_some(), "{name}: no guard runs");
    // With cgroups, every one of them (the tool too) is in a cgroup of the daemon's.
    let cgroups = cgroups && cgroups_here();
    let daemon_cgroup = format!("drover-{}", daemon.pid());
    for pid in &watched {
        let in_ours = cgroup_dir(*pid)
            .and_then(|c| c.parent().map(Path::to_path_buf))
            .is_some_and(|c| c.ends_with(&daemon_cgroup));
        assert_eq!(in_ours, cgroups, "{name}: the cgroup of {pid}");
    }

    assert_all_gone_within(&mut daemon, Signal::SIGKILL, &watched, name).await;
    drop(ground);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_orphans_codex_launcher_with_cgroups() {
    nothing_of_a_wrapped_agent_outlives_the_daemon(RealAgent::Codex, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_orphans_codex_launcher_without_cgroups() {
    nothing_of_a_wrapped_agent_outlives_the_daemon(RealAgent::Codex, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_orphans_claude_with_cgroups() {
    nothing_of_a_wrapped_agent_outlives_the_daemon(RealAgent::Claude, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agents_orphans_claude_without_cgroups() {
    nothing_of_a_wrapped_agent_outlives_the_daemon(RealAgent::Claude, false).await;
}
