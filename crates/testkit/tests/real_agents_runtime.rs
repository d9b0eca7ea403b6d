//! Real coding agents (codex-acp, claude-agent-acp, gemini-cli) run through drover's runtime
//! manager against the scripted model on 127.0.0.1: a plain turn, a shell command allowed and
//! one rejected, a cancel during a streaming reply, three turns in one session, and a restart
//! followed by another turn on the same agent. Needs `scripts/install-agents`.

use std::path::Path;
use std::time::{Duration, Instant};

use drover_acp::{PermissionAnswer, PermissionChoice, Provider, Providers, RuntimeManager};
use drover_core::inbox::Delivery;
use drover_core::timeline::{Page, TimelineItem};
use drover_core::{AgentId, AgentStatus, CancelCause, NewAgent, Registry, RuntimeControl};
use drover_testkit::model::{self, ModelServer};
use drover_testkit::real_agents::{RealAgent, agents_dir};
use tempfile::TempDir;

/// Generous: claude's `session/new` alone takes a second or two on 2 cores.
const TURN: Duration = Duration::from_secs(90);

struct Bench {
    agent: RealAgent,
    home: TempDir,
    cwd: TempDir,
    scratch: TempDir,
    model: ModelServer,
    manager: RuntimeManager,
    registry: Registry,
}

fn providers(agent: RealAgent, model: &ModelServer, scratch: &Path, cwd: &Path) -> Providers {
    let command = agent
        .command(&agents_dir(), &model.url(), scratch, cwd)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut providers = Providers::presets();
    let mut argv = vec![command.program.display().to_string()];
    argv.extend(command.args);
    providers.insert(Provider {
        name: agent.name().to_string(),
        label: agent.name().to_string(),
        command: argv,
        env: command.env,
        default_model: None,
        default_mode: None,
        install_hint: "run scripts/install-agents".to_string(),
        builtin: true,
    });
    providers
}

impl Bench {
    async fn new(agent: RealAgent) -> Bench {
        let home = TempDir::new().expect("home");
        let cwd = TempDir::new().expect("cwd");
        let scratch = TempDir::new().expect("scratch");
        let cwd_path = std::fs::canonicalize(cwd.path()).expect("cwd");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let model = model::serve(listener).await;
        let (manager, registry, _) = RuntimeManager::open(
            home.path(),
            providers(agent, &model, scratch.path(), &cwd_path),
        )
        .await
        .expect("open");
        Bench {
            agent,
            home,
            cwd,
            scratch,
            model,
            manager,
            registry,
        }
    }

    async fn restart(self) -> Bench {
        self.manager.shutdown().await;
        self.registry.shutdown().await;
        let cwd = std::fs::canonicalize(self.cwd.path()).expect("cwd");
        let (manager, registry, _) = RuntimeManager::open(
            self.home.path(),
            providers(self.agent, &self.model, self.scratch.path(), &cwd),
        )
        .await
        .expect("reopen");
        Bench {
            manager,
            registry,
            ..self
        }
    }

    fn what(&self) -> &'static str {
        self.agent.name()
    }

    async fn items(&self, id: AgentId) -> Vec<TimelineItem> {
        self.manager
            .timeline(id, Page::Tail { limit: 100_000 })
            .await
            .expect("timeline")
            .items
    }

    async fn turn_events(&self, id: AgentId) -> Vec<String> {
        self.items(id)
            .await
            .iter()
            .filter(|i| i.kind == "turn_ended")
            .map(|i| i.data["event"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The agent's message text of the last turn.
    async fn last_reply(&self, id: AgentId) -> String {
        let items = self.items(id).await;
        let start = items
            .iter()
            .rposition(|i| i.kind == "turn_started")
            .unwrap_or(0);
        items[start..]
            .iter()
            .filter(|i| i.kind == "agent_message")
            .filter_map(|i| i.data.get("text").and_then(|t| t.as_str()))
            .collect()
    }

    async fn send(&self, id: AgentId, text: &str) {
        self.manager
            .deliver(id, Delivery::Followup, text.to_string(), "user".to_string())
            .await
            .expect("deliver");
    }

    async fn settle(&self, id: AgentId, turns: usize) {
        let done = self.manager.wait_idle(id, TURN).await.expect("wait");
        let items = self.items(id).await;
        assert!(
            done,
            "{}: turn did not end within {TURN:?}: {items:#?}",
            self.what()
        );
        assert_eq!(
            self.turn_events(id).await.len(),
            turns,
            "{}: {items:#?}",
            self.what()
        );
    }

    async fn answer_next_permission(&self, id: AgentId, kind: &str) {
        let deadline = Instant::now() + TURN;
        loop {
            let pending = self.manager.pending_permissions(id).await.expect("pending");
            if !pending.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no permission request: {:#?}",
                self.what(),
                self.items(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            self.registry
                .get(id)
                .and_then(|a| a.attention)
                .map(|a| a.reason),
            Some(drover_core::AttentionReason::Permission)
        );
        self.manager
            .answer_permission(
                id,
                PermissionAnswer {
                    request: None,
                    choice: PermissionChoice::Kind(kind.to_string()),
                },
            )
            .await
            .expect("answer");
    }
}

async fn run_everything(agent: RealAgent) {
    let bench = Bench::new(agent).await;
    let name = bench.what();
    let cwd = std::fs::canonicalize(bench.cwd.path()).expect("cwd");

    // 1. A plain turn.
    let id = bench
        .manager
        .create_agent(
            NewAgent {
                provider: name.to_string(),
                cwd: cwd.clone(),
                title: Some(format!("{name} end to end")),
                ..NewAgent::default()
            },
            Some("reply hello from the scripted model".to_string()),
        )
        .await
        .expect("create")
        .id;
    bench.settle(id, 1).await;
    assert_eq!(bench.turn_events(id).await, ["turn_completed"], "{name}");
    assert!(
        bench
            .last_reply(id)
            .await
            .contains("hello from the scripted model"),
        "{name}: {}",
        bench.last_reply(id).await
    );

    // 2. A shell command whose permission is allowed runs for real.
    bench.send(id, "shell touch allowed.txt").await;
    bench.answer_next_permission(id, "allow_once").await;
    bench.settle(id, 2).await;
    assert!(
        cwd.join("allowed.txt").exists(),
        "{name}: the allowed command did not run"
    );
    let items = bench.items(id).await;
    assert!(
        items.iter().any(|i| i.kind == "tool_call"),
        "{name}: no tool call item"
    );

    // 3. One that is rejected does not run.
    bench.send(id, "shell touch rejected.txt").await;
    bench.answer_next_permission(id, "reject_once").await;
    bench.settle(id, 3).await;
    assert!(
        !cwd.join("rejected.txt").exists(),
        "{name}: the rejected command ran"
    );

    // 4. Three more turns in the same session.
    for n in 1..=3 {
        bench.send(id, &format!("reply turn number {n}")).await;
        bench.settle(id, 3 + n).await;
        assert!(
            bench
                .last_reply(id)
                .await
                .contains(&format!("turn number {n}")),
            "{name}: {}",
            bench.last_reply(id).await
        );
    }
    // 5. A cancel during a streaming reply ends the turn as cancelled. Last in this session:
    //    claude-agent-acp 0.23 answers the next prompt after a cancel at once with an empty
    //    `end_turn` (it stays one reply behind); the restart below starts a fresh process.
    bench.send(id, "stream 400 25").await;
    let deadline = Instant::now() + TURN;
    while !bench.last_reply(id).await.contains('1') {
        assert!(
            Instant::now() < deadline,
            "{name}: no streaming: {:#?}",
            bench.items(id).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bench
        .manager
        .cancel_turn(id, CancelCause::User, true)
        .await
        .expect("cancel");
    bench.settle(id, 7).await;
    assert_eq!(bench.turn_events(id).await[6], "turn_canceled", "{name}");

    let session = bench
        .registry
        .get(id)
        .and_then(|a| a.resume)
        .expect("session");
    let agent_pid = bench.manager.runtime_pid(id).await.expect("live");

    // 6. A daemon restart, then another turn on the same agent.
    let bench = bench.restart().await;
    assert!(
        drover_testkit::wait_process_group_gone(agent_pid, Duration::from_secs(10)).await,
        "{name}: the agent's process group outlived the shutdown"
    );
    bench.send(id, "reply after the restart").await;
    bench.settle(id, 8).await;
    assert!(
        bench.last_reply(id).await.contains("after the restart"),
        "{name}"
    );
    let notices: Vec<String> = bench
        .items(id)
        .await
        .iter()
        .filter(|i| i.kind == "notice")
        .filter_map(|i| {
            i.data
                .get("text")
                .and_then(|t| t.as_str())
                .map(str::to_string)
        })
        .collect();
    assert!(
        notices.iter().any(
            |n| n == "resumed the agent's session" || n.starts_with("context was not restored")
        ),
        "{name}: the timeline says whether context was restored: {notices:?}"
    );
    let agent = bench.registry.get(id).expect("agent");
    assert_eq!(agent.status, AgentStatus::Idle, "{name}");
    let _ = session;

    // Everything the agent asked the model went to our loopback server.
    assert!(!bench.model.requests().is_empty());
    let pid = bench.manager.runtime_pid(id).await.expect("live");
    bench.manager.shutdown().await;
    assert!(
        drover_testkit::wait_process_group_gone(pid, Duration::from_secs(10)).await,
        "{name}: process left after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_end_to_end() {
    run_everything(RealAgent::Codex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_end_to_end() {
    run_everything(RealAgent::Claude).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_end_to_end() {
    run_everything(RealAgent::Gemini).await;
}
