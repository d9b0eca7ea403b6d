//! The program `drover-msgdriver HOME CWD AGENT SEED MODE` (a bin of drover-e2e, whose
//! durability test kills it; this is its code): opens the runtimes under HOME the way the
//! daemon does, with the scripted agent AGENT as provider `scripted`, and then, in `run` mode,
//! sends messages (followup, steer, inject) to a few agents and archives and unarchives them
//! forever, announcing each operation before it starts and acknowledging it once it returned,
//! so the test can SIGKILL it anywhere, the claim window of a turn start included, and hold the
//! timelines to the acknowledgements. In `settle` mode it lets every queued message run, waits
//! for every agent to be idle, prints `settled` and exits.
//!
//! ```text
//! boot {"agents":3}
//! agent {"id":"…"}                                         an agent it created
//! begin {"seq":7,"kind":"followup","agent":"…"}
//! ack {"seq":7,"kind":"followup","agent":"…","message":"…","archivedAt":null}
//! err {"seq":7,"error":"…"}
//! settled {}
//! ```

use std::path::PathBuf;
use std::time::Duration;

use crate::crash::XorShift;
use anyhow::{Context, bail};
use drover_acp::{Provider, Providers, RuntimeManager, no_mcp_servers};
use drover_core::inbox::Delivery;
use drover_core::{AgentId, ArchiveOptions, NewAgent};
use serde::{Deserialize, Serialize};

/// How many agents the driver keeps.
const AGENTS: usize = 3;
/// How long `settle` waits for one agent to be idle.
const SETTLE: Duration = Duration::from_secs(60);

/// One acknowledged (or announced) operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageOp {
    pub seq: u64,
    /// `followup`, `steer`, `inject`, `archive` or `unarchive`.
    pub kind: String,
    pub agent: AgentId,
    /// The queued message's id (in an `ack` of a message).
    #[serde(default)]
    pub message: Option<String>,
    /// The agent's `archivedAt` (in an `ack` of an archive).
    #[serde(default)]
    pub archived_at: Option<jiff::Timestamp>,
}

/// The program's `main`: reads HOME CWD AGENT SEED MODE from the arguments.
pub fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [home, cwd, agent, seed, mode] = args.as_slice() else {
        bail!("usage: drover-msgdriver HOME CWD AGENT SEED run|settle");
    };
    let seed: u64 = seed.parse().context("SEED must be an unsigned integer")?;
    let settle = match mode.as_str() {
        "run" => false,
        "settle" => true,
        other => bail!("MODE must be `run` or `settle`, not `{other}`"),
    };
    // The daemon's log, on stderr: the test reads it for errors.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let (home, cwd, agent) = (
        PathBuf::from(home),
        PathBuf::from(cwd),
        PathBuf::from(agent),
    );
    runtime.block_on(run(home, cwd, agent, seed, settle))
}

/// The presets and the scripted agent `agent` as provider `scripted`, keeping its sessions in
/// `state`.
pub fn providers(state: &std::path::Path, agent: &std::path::Path) -> Providers {
    let mut providers = Providers::presets();
    let env = [(
        "SCRIPTED_AGENT_STATE_DIR".to_string(),
        state.display().to_string(),
    )]
    .into_iter()
    .collect();
    providers.insert(Provider {
        label: "Scripted".to_string(),
        install_hint: "built with the workspace".to_string(),
        ..Provider::command("scripted", vec![agent.display().to_string()], env)
    });
    providers
}

async fn run(
    home: PathBuf,
    cwd: PathBuf,
    agent_bin: PathBuf,
    seed: u64,
    settle: bool,
) -> anyhow::Result<()> {
    let (manager, registry, _) = RuntimeManager::open(
        &home,
        providers(&home.join("agent-state"), &agent_bin),
        no_mcp_servers(),
    )
    .await
    .with_context(|| format!("open the runtimes under {}", home.display()))?;
    let mut agents: Vec<AgentId> = registry.agents().iter().map(|a| a.id).collect();
    crate::crashdriver::emit("boot", &serde_json::json!({"agents": agents.len()}));
    if settle {
        for id in agents.iter().copied() {
            if !manager
                .wait_idle(id, SETTLE)
                .await
                .with_context(|| format!("wait for {id}"))?
            {
                bail!("agent {id} did not settle within {SETTLE:?}");
            }
        }
        crate::crashdriver::emit("settled", &serde_json::json!({}));
        manager.shutdown().await;
        registry.shutdown().await;
        return Ok(());
    }
    while agents.len() < AGENTS {
        let agent = crate::create_agent(
            &manager,
            NewAgent {
                provider: "scripted".to_string(),
                cwd: cwd.clone(),
                title: Some(format!("msg {}", agents.len())),
                ..NewAgent::default()
            },
            None,
            None,
        )
        .await
        .context("create an agent")?;
        crate::crashdriver::emit("agent", &serde_json::json!({"id": agent.id}));
        agents.push(agent.id);
    }
    let mut rng = XorShift::new(seed);
    let mut seq = 0;
    loop {
        seq += 1;
        let Some(&agent) = rng.pick(&agents) else {
            bail!("no agents");
        };
        let kind = match rng.range(0, 100) {
            0..60 => "followup",
            60..70 => "steer",
            70..82 => "inject",
            82..91 => "archive",
            _ => "unarchive",
        };
        let mut op = MessageOp {
            seq,
            kind: kind.to_string(),
            agent,
            message: None,
            archived_at: None,
        };
        crate::crashdriver::emit("begin", &op);
        let done = apply(&manager, &mut op, &mut rng).await;
        match done {
            Ok(()) => crate::crashdriver::emit("ack", &op),
            Err(e) => crate::crashdriver::emit(
                "err",
                &serde_json::json!({"seq": seq, "error": e.to_string()}),
            ),
        }
        let pause = rng.range(0, 15);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Runs one operation; fills in what its `ack` reports.
async fn apply(
    manager: &RuntimeManager,
    op: &mut MessageOp,
    rng: &mut XorShift,
) -> anyhow::Result<()> {
    match op.kind.as_str() {
        "archive" => manager
            .registry()
            .archive(
                op.agent,
                ArchiveOptions {
                    stop_activity: true,
                },
            )
            .await
            .map(|_| {
                op.archived_at = manager.registry().get(op.agent).and_then(|a| a.archived_at);
            })
            .map_err(anyhow::Error::from),
        "unarchive" => manager
            .registry()
            .unarchive(op.agent)
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from),
        _ => {
            let delivery = match op.kind.as_str() {
                "steer" => Delivery::Steer,
                "inject" => Delivery::Inject,
                _ => Delivery::Followup,
            };
            // Short turns, some long enough for messages to queue behind them.
            let text = format!("sleep {}\nsay m{}", rng.range(0, 25), op.seq);
            manager
                .deliver(op.agent, delivery, text, "user".to_string())
                .await
                .map(|id| op.message = Some(id))
                .map_err(anyhow::Error::from)
        }
    }
}
