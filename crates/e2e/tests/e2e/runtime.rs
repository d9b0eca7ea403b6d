//! Agent runtimes with a real agent process (the scripted ACP agent): turns, streaming,
//! permissions, the inbox (followup, steer, inject), cancel, crashes, restarts and resume,
//! the turn gate, and process-group cleanup.

use std::path::Path;
use std::time::Duration;

use drover_acp::{
    PermissionAnswer, PermissionChoice, Provider, Providers, RuntimeManager, no_mcp_servers,
    process,
};
use drover_core::inbox::Delivery;
use drover_core::timeline::{Page, TimelineItem};
use drover_core::{
    AgentId, AgentStatus, ArchiveOptions, AttentionReason, CancelCause, NewAgent, PermissionPolicy,
    ProviderConfig, Registry,
};
use drover_fakes::procs;
use drover_testkit::wait::{eventually, poll_until};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);

struct Fleet {
    home: TempDir,
    cwd: TempDir,
    state: TempDir,
    manager: RuntimeManager,
    registry: Registry,
}

fn providers(state: &Path, extra_env: &[(&str, &str)]) -> Providers {
    let mut providers = Providers::presets();
    // No preset is installed on the system's PATH, whatever the machine has elsewhere.
    providers.set_search_path(drover_testkit::hermetic::SYSTEM_PATH);
    let mut env: std::collections::BTreeMap<String, String> = extra_env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert(
        "SCRIPTED_AGENT_STATE_DIR".to_string(),
        state.display().to_string(),
    );
    env.insert(
        "SCRIPTED_PROVIDER_VAR".to_string(),
        "from-provider".to_string(),
    );
    providers.insert(Provider {
        label: "Scripted".to_string(),
        install_hint: "built with the workspace".to_string(),
        ..Provider::command(
            "scripted",
            vec![env!("CARGO_BIN_EXE_drover-scripted-agent").to_string()],
            env,
        )
    });
    providers
}

impl Fleet {
    async fn new() -> Fleet {
        Self::with_env(&[]).await
    }

    async fn with_env(env: &[(&str, &str)]) -> Fleet {
        drover_testkit::hermetic::in_process();
        let home = TempDir::new().expect("home");
        let cwd = TempDir::new().expect("cwd");
        let state = TempDir::new().expect("agent state");
        let (manager, registry, _) =
            RuntimeManager::open(home.path(), providers(state.path(), env), no_mcp_servers())
                .await
                .expect("open");
        Fleet {
            home,
            cwd,
            state,
            manager,
            registry,
        }
    }

    /// Stops the runtimes (as a daemon shutdown does) and opens everything again.
    async fn restart(self, env: &[(&str, &str)]) -> Fleet {
        self.manager.shutdown().await;
        self.registry.shutdown().await;
        let (manager, registry, _) = RuntimeManager::open(
            self.home.path(),
            providers(self.state.path(), env),
            no_mcp_servers(),
        )
        .await
        .expect("reopen");
        Fleet {
            manager,
            registry,
            ..self
        }
    }

    fn new_agent(&self) -> NewAgent {
        NewAgent {
            provider: "scripted".to_string(),
            cwd: self.cwd.path().to_path_buf(),
            title: Some("scripted".to_string()),
            ..NewAgent::default()
        }
    }

    async fn run(&self, prompt: &str) -> AgentId {
        let agent = drover_testkit::create_agent(
            &self.manager,
            self.new_agent(),
            Some(prompt.to_string()),
            None,
        )
        .await
        .expect("create");
        agent.id
    }

    /// Queues `text` for `id` as the user would, with `delivery`.
    async fn send(&self, id: AgentId, delivery: Delivery, text: &str) {
        self.manager
            .deliver(id, delivery, text.to_string(), "user".into())
            .await
            .unwrap_or_else(|e| panic!("{delivery:?} `{text}` to {id}: {e}"));
    }

    async fn idle(&self, id: AgentId) {
        assert!(
            self.manager.wait_idle(id, WAIT).await.expect("wait"),
            "agent did not become idle; timeline: {:#?}",
            self.items(id).await
        );
    }

    async fn items(&self, id: AgentId) -> Vec<TimelineItem> {
        self.manager
            .timeline(id, Page::Tail { limit: 10_000 })
            .await
            .expect("timeline")
            .items
    }

    async fn texts(&self, id: AgentId, kind: &str) -> Vec<String> {
        self.items(id)
            .await
            .into_iter()
            .filter(|i| i.kind == kind)
            .map(|i| {
                i.data
                    .get("text")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    async fn turn_events(&self, id: AgentId) -> Vec<String> {
        self.items(id)
            .await
            .into_iter()
            .filter(|i| i.kind == "turn_ended")
            .map(|i| i.data["event"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Polls until `check` holds for the agent's timeline.
    async fn until(&self, id: AgentId, what: &str, check: impl Fn(&[TimelineItem]) -> bool) {
        if poll_until(WAIT, async || check(&self.items(id).await))
            .await
            .is_none()
        {
            let items = self.items(id).await;
            panic!("timed out waiting for {what}: {items:#?}");
        }
    }

    /// Waits until the agent's timeline holds an item of `kind`.
    async fn until_item(&self, id: AgentId, what: &str, kind: &str) {
        self.until(id, what, |i| i.iter().any(|i| i.kind == kind))
            .await;
    }

    /// Waits until the agent's status is `status`.
    async fn until_status(&self, id: AgentId, status: AgentStatus, what: &str) {
        eventually(what, WAIT, async || {
            self.registry.get(id).map(|a| a.status) == Some(status)
        })
        .await;
    }
}

fn group_gone(pid: u32) -> bool {
    procs::group_gone(i32::try_from(pid).expect("pid"))
}

async fn wait_group_gone(pid: u32) {
    assert!(
        drover_testkit::wait_process_group_gone(pid, WAIT).await,
        "process group {pid} is still alive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_turn_streams_into_one_message_and_finishes() {
    let fleet = Fleet::new().await;
    let id = fleet.run("think about it\nstream 40\nsay done").await;
    fleet.idle(id).await;
    let items = fleet.items(id).await;
    let kinds: Vec<&str> = items.iter().map(|i| i.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "user_message",
            "turn_started",
            "agent_thought",
            "agent_message",
            "turn_ended"
        ],
        "{items:#?}"
    );
    let message = fleet.texts(id, "agent_message").await.remove(0);
    assert!(
        message.starts_with("chunk 1\n") && message.contains("chunk 40\n"),
        "{message}"
    );
    assert!(message.ends_with("done"), "{message}");
    assert_eq!(fleet.turn_events(id).await, ["turn_completed"]);
    let agent = fleet.registry.get(id).expect("agent");
    assert_eq!(agent.status, AgentStatus::Idle);
    assert_eq!(
        agent.attention.map(|a| a.reason),
        Some(AttentionReason::Finished)
    );
    assert!(
        agent.resume.is_some(),
        "the ACP session id is kept for resume"
    );
    // seq increases by one per item.
    let seqs: Vec<u64> = items.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, (1..=items.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_wait_for_an_answer_by_kind() {
    let fleet = Fleet::new().await;
    for (kind, reply) in [
        ("allow_once", "permission granted"),
        ("reject_once", "permission denied"),
    ] {
        let id = fleet.run("permission run the tests").await;
        eventually("the permission attention", WAIT, async || {
            fleet
                .registry
                .get(id)
                .and_then(|a| a.attention)
                .map(|a| a.reason)
                == Some(AttentionReason::Permission)
        })
        .await;
        let pending = fleet
            .manager
            .pending_permissions(id)
            .await
            .expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].title.as_deref(), Some("run the tests"));
        assert_eq!(pending[0].options.len(), 4);
        assert_eq!(
            fleet.registry.get(id).map(|a| a.status),
            Some(AgentStatus::Running)
        );
        fleet
            .manager
            .answer_permission(
                id,
                PermissionAnswer {
                    request: None,
                    choice: PermissionChoice::Kind(kind.to_string()),
                },
            )
            .await
            .expect("answer");
        fleet.idle(id).await;
        assert!(
            fleet
                .texts(id, "agent_message")
                .await
                .iter()
                .any(|t| t == reply)
        );
        let items = fleet.items(id).await;
        let tools: Vec<&TimelineItem> = items.iter().filter(|i| i.kind == "tool_call").collect();
        assert_eq!(tools.len(), 1, "tool call merged by id: {items:#?}");
        let permission = items
            .iter()
            .find(|i| i.kind == "permission")
            .expect("permission item");
        assert_eq!(permission.data["status"], "answered");
        assert_eq!(permission.data["kind"], kind);
        assert!(
            fleet
                .manager
                .pending_permissions(id)
                .await
                .expect("pending")
                .is_empty()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_policy_answers_by_itself() {
    let fleet = Fleet::new().await;
    let mut new = fleet.new_agent();
    new.config = ProviderConfig {
        permission_policy: PermissionPolicy::Allow,
        ..ProviderConfig::default()
    };
    let id = drover_testkit::create_agent(
        &fleet.manager,
        new,
        Some("permission-first deploy".to_string()),
        None,
    )
    .await
    .expect("create")
    .id;
    fleet.idle(id).await;
    assert!(
        fleet
            .texts(id, "agent_message")
            .await
            .iter()
            .any(|t| t == "permission granted")
    );
    assert_eq!(fleet.turn_events(id).await, ["turn_completed"]);
}

/// claude-agent-acp 0.23 ends the first prompt after a cancel at once with an empty
/// `end_turn` (the scripted agent does too, with `SCRIPTED_AGENT_STALE_CANCEL`): the steer is
/// sent again, once, and its reply is not lost; a cancel without a steer changes nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_to_an_agent_that_keeps_a_stale_cancel_gets_its_reply() {
    let fleet = Fleet::with_env(&[("SCRIPTED_AGENT_STALE_CANCEL", "1")]).await;
    let id = fleet.run("say working\nsleep 100000").await;
    // The agent is in its prompt (not only `running` in the record).
    fleet
        .until(id, "the long turn", |items| {
            items.iter().any(|i| i.kind == "agent_message")
        })
        .await;
    fleet.send(id, Delivery::Steer, "say steered").await;
    fleet.idle(id).await;
    assert_eq!(
        fleet.turn_events(id).await,
        ["turn_canceled", "turn_completed"]
    );
    assert_eq!(
        fleet.texts(id, "agent_message").await,
        ["working", "steered"]
    );
    // One user message for the steer: the resend is not a second delivery.
    assert_eq!(fleet.texts(id, "user_message").await.len(), 2);

    // The next prompt has no cancel before it: sent once, as any other.
    fleet.send(id, Delivery::Followup, "say later").await;
    fleet.idle(id).await;
    assert_eq!(
        fleet.texts(id, "agent_message").await,
        ["working", "steered", "later"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followups_queue_behind_a_busy_turn_and_steer_cuts_in() {
    let fleet = Fleet::new().await;
    let id = fleet.run("sleep 400\nsay first").await;
    fleet.until_item(id, "the first turn", "turn_started").await;
    fleet.send(id, Delivery::Followup, "say second").await;
    fleet.idle(id).await;
    assert_eq!(
        fleet.turn_events(id).await,
        ["turn_completed", "turn_completed"],
        "a followup never interrupts"
    );
    assert_eq!(fleet.texts(id, "agent_message").await, ["first", "second"]);

    fleet
        .send(id, Delivery::Followup, "sleep 10000\nsay never")
        .await;
    fleet
        .until(id, "the long turn", |i| {
            i.iter().filter(|i| i.kind == "turn_started").count() == 3
        })
        .await;
    fleet.send(id, Delivery::Followup, "say after").await;
    fleet.send(id, Delivery::Steer, "say steered").await;
    fleet.idle(id).await;
    assert_eq!(
        fleet.turn_events(id).await,
        [
            "turn_completed",
            "turn_completed",
            "turn_canceled",
            "turn_completed",
            "turn_completed"
        ]
    );
    let texts = fleet.texts(id, "agent_message").await;
    assert_eq!(
        texts[2..],
        ["steered", "after"],
        "steer first, the inbox kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_rides_with_the_next_prompt_without_waking() {
    let fleet = Fleet::new().await;
    let id = fleet.run("say hi").await;
    fleet.idle(id).await;
    fleet
        .send(id, Delivery::Inject, "CONTEXT: the build is red")
        .await;
    assert!(
        fleet
            .manager
            .wait_idle(id, Duration::from_millis(300))
            .await
            .expect("wait")
    );
    assert_eq!(
        fleet.turn_events(id).await.len(),
        1,
        "inject does not wake the agent"
    );
    fleet.send(id, Delivery::Followup, "echo-prompt").await;
    fleet.idle(id).await;
    let texts = fleet.texts(id, "agent_message").await;
    // The scripted agent answers the context line, then echoes the whole prompt.
    assert!(
        texts[1].ends_with("CONTEXT: the build is red\n\necho-prompt"),
        "{texts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_streaming_turn_and_can_drop_the_inbox() {
    let fleet = Fleet::new().await;
    let id = fleet.run("stream 100000 1").await;
    fleet.until_item(id, "streaming", "agent_message").await;
    fleet.send(id, Delivery::Followup, "say queued").await;
    fleet
        .manager
        .cancel_turn(id, CancelCause::User, false)
        .await
        .expect("cancel");
    fleet.idle(id).await;
    assert_eq!(fleet.turn_events(id).await, ["turn_canceled"]);
    assert!(
        !fleet
            .texts(id, "agent_message")
            .await
            .iter()
            .any(|t| t == "queued"),
        "the inbox was dropped"
    );
    let agent = fleet.registry.get(id).expect("agent");
    assert_eq!(agent.status, AgentStatus::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_puts_the_agent_in_error_with_its_stderr_and_the_next_message_restarts_it() {
    let fleet = Fleet::new().await;
    let id = fleet.run("say before\ncrash 7").await;
    fleet
        .until_status(id, AgentStatus::Error, "the agent in error")
        .await;
    let agent = fleet.registry.get(id).expect("agent");
    let error = agent.last_error.expect("error");
    assert!(
        error.contains("exit status 7") && error.contains("scripted agent crashing"),
        "{error}"
    );
    assert_eq!(
        agent.attention.map(|a| a.reason),
        Some(AttentionReason::Error)
    );
    assert_eq!(fleet.turn_events(id).await, ["turn_failed"]);
    assert!(fleet.manager.runtime_pid(id).await.is_none());

    fleet.send(id, Delivery::Followup, "say after").await;
    fleet.idle(id).await;
    assert_eq!(
        fleet
            .texts(id, "agent_message")
            .await
            .last()
            .map(String::as_str),
        Some("after")
    );
    assert_eq!(
        fleet.registry.get(id).map(|a| a.status),
        Some(AgentStatus::Idle)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_unknown_updates_never_break_a_session() {
    let fleet = Fleet::new().await;
    let id = fleet.run("garbage\nunknown\nusage\nsay still fine").await;
    fleet.idle(id).await;
    assert_eq!(fleet.turn_events(id).await, ["turn_completed"]);
    assert_eq!(fleet.texts(id, "agent_message").await, ["still fine"]);
    let kinds: Vec<String> = fleet.items(id).await.into_iter().map(|i| i.kind).collect();
    assert!(
        kinds.contains(&"raw".to_string()) && kinds.contains(&"usage".to_string()),
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_an_explicit_environment() {
    assert!(
        std::env::var("CARGO_MANIFEST_DIR").is_ok(),
        "the test process has it"
    );
    let fleet = Fleet::new().await;
    let id = fleet
        .run("env CARGO_MANIFEST_DIR\nenv SCRIPTED_PROVIDER_VAR\nenv DROVER_AGENT_ID\ncwd")
        .await;
    fleet.idle(id).await;
    let texts = fleet.texts(id, "agent_message").await;
    let cwd = std::fs::canonicalize(fleet.cwd.path()).expect("cwd");
    assert_eq!(
        texts.concat(),
        format!("<unset>from-provider{id}{}", cwd.display())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_the_session_and_delivers_what_was_queued_once() {
    let fleet = Fleet::new().await;
    let id = fleet.run("say one").await;
    fleet.idle(id).await;
    // A turn that never ends, and a message queued behind it, when the daemon stops.
    fleet.send(id, Delivery::Followup, "hang").await;
    fleet
        .until(id, "the hanging turn", |i| {
            i.iter().filter(|i| i.kind == "turn_started").count() == 2
        })
        .await;
    fleet
        .send(id, Delivery::Followup, "say after restart")
        .await;
    let pid = fleet.manager.runtime_pid(id).await.expect("live");
    let fleet = fleet.restart(&[]).await;
    assert!(group_gone(pid), "shutdown ended the agent's process group");
    fleet
        .until(id, "the queued message", |i| {
            i.iter()
                .any(|i| i.kind == "agent_message" && i.data["text"] == "after restart")
        })
        .await;
    fleet.idle(id).await;
    let users: Vec<String> = fleet.texts(id, "user_message").await;
    assert_eq!(
        users,
        ["say one", "hang", "say after restart"],
        "delivered once"
    );
    let notices = fleet.texts(id, "notice").await;
    assert!(
        notices.iter().any(|n| n == "resumed the agent's session"),
        "{notices:?}"
    );
    // The replayed history is not stored twice.
    assert_eq!(
        fleet.texts(id, "agent_message").await,
        ["one", "after restart"]
    );

    // An agent that cannot load sessions starts a new one and says so.
    let fleet = fleet
        .restart(&[
            ("SCRIPTED_AGENT_NO_LOAD", "1"),
            ("SCRIPTED_AGENT_NO_RESUME", "1"),
        ])
        .await;
    fleet.send(id, Delivery::Followup, "say fresh").await;
    fleet.idle(id).await;
    let notices = fleet.texts(id, "notice").await;
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("context was not restored")),
        "{notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_ends_the_whole_process_group() {
    let fleet = Fleet::new().await;
    let id = fleet.run("spawn-child\nsleep 60000").await;
    fleet.until_item(id, "the child", "agent_message").await;
    let pid = fleet.manager.runtime_pid(id).await.expect("live");
    assert!(!group_gone(pid));
    let refused = fleet.registry.archive(id, ArchiveOptions::default()).await;
    assert_eq!(
        refused.map_err(|e| e.code().as_str()).err(),
        Some("agent_active")
    );
    fleet
        .registry
        .archive(
            id,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await
        .expect("archive");
    wait_group_gone(pid).await;
    let agent = fleet.registry.get(id).expect("agent");
    assert!(agent.is_archived());
    assert_ne!(agent.status, AgentStatus::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_blocks_turns_under_an_archived_parent_without_prompting() {
    let fleet = Fleet::new().await;
    let parent = fleet.run("say parent").await;
    fleet.idle(parent).await;
    let mut new = fleet.new_agent();
    new.parent = Some(parent);
    let child = drover_testkit::create_agent(&fleet.manager, new, None, None)
        .await
        .expect("child")
        .id;
    fleet.idle(child).await;
    fleet
        .registry
        .archive(parent, ArchiveOptions::default())
        .await
        .expect("archive");
    fleet.registry.unarchive(child).await.expect("unarchive");
    fleet
        .send(child, Delivery::Followup, "say should not run")
        .await;
    fleet.idle(child).await;
    assert_eq!(fleet.turn_events(child).await, ["turn_blocked"]);
    assert!(
        fleet.texts(child, "agent_message").await.is_empty(),
        "no prompt reached the agent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_unavailable_providers_are_refused_with_a_hint() {
    let fleet = Fleet::new().await;
    let mut new = fleet.new_agent();
    new.provider = "nope".to_string();
    let err = drover_testkit::create_agent(&fleet.manager, new, None, None)
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), "unknown_provider");
    let mut new = fleet.new_agent();
    new.provider = "copilot".to_string();
    let err = drover_testkit::create_agent(&fleet.manager, new, None, None)
        .await
        .expect_err("copilot is not on the system's PATH");
    assert_eq!(err.code(), "provider_unavailable");
    assert!(
        err.to_string().contains("npm install -g @github/copilot"),
        "{err}"
    );
    assert!(fleet.registry.agents().is_empty(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_process_behind() {
    let fleet = Fleet::new().await;
    let a = fleet.run("spawn-child\nhang").await;
    let b = fleet.run("say idle").await;
    fleet.until_item(a, "the child", "agent_message").await;
    fleet.idle(b).await;
    let pids = [
        fleet.manager.runtime_pid(a).await.expect("a live"),
        fleet.manager.runtime_pid(b).await.expect("b live"),
    ];
    fleet.manager.shutdown().await;
    for pid in pids {
        wait_group_gone(pid).await;
    }
    let _ = process::group_alive(pids[0]);
}

/// Whether process `pid` is alive (not a zombie).
fn alive(pid: u32) -> bool {
    procs::Process::read(i32::try_from(pid).expect("pid")).is_some_and(|p| !p.zombie())
}

async fn wait_dead(pid: u32, what: &str) {
    eventually(format!("the end of {what} (pid {pid})"), WAIT, async || {
        !alive(pid)
    })
    .await;
}

fn said_pid(items: &[TimelineItem], prefix: &str) -> u32 {
    items
        .iter()
        .filter(|i| i.kind == "agent_message")
        .filter_map(|i| i.data.get("text").and_then(|t| t.as_str()))
        .find_map(|t| {
            t.split(prefix)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no `{prefix}<pid>` in {items:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_in_their_own_process_group_end_with_the_agent() {
    let fleet = Fleet::new().await;
    // Closed by archive.
    let a = fleet.run("spawn-tool\nsleep 60000").await;
    fleet.until_item(a, "the tool", "agent_message").await;
    let tool = said_pid(&fleet.items(a).await, "tool ");
    assert!(alive(tool));
    fleet
        .registry
        .archive(
            a,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await
        .expect("archive");
    wait_dead(tool, "a tool of an archived agent").await;

    // Left behind by a crash.
    let b = fleet.run("spawn-tool\ncrash 1").await;
    fleet
        .until_status(b, AgentStatus::Error, "the agent's crash")
        .await;
    let tool = said_pid(&fleet.items(b).await, "tool ");
    wait_dead(tool, "a tool of a crashed agent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_request_ids_and_answers_by_option_id() {
    let fleet = Fleet::with_env(&[("SCRIPTED_AGENT_STRING_IDS", "1")]).await;
    let id = fleet.run("permission-only format the disk").await;
    let pending = eventually("a permission request", WAIT, async || {
        let pending = fleet
            .manager
            .pending_permissions(id)
            .await
            .expect("pending");
        (!pending.is_empty()).then_some(pending)
    })
    .await;
    let wrong = fleet
        .manager
        .answer_permission(
            id,
            PermissionAnswer {
                request: Some(pending[0].seq),
                choice: PermissionChoice::OptionId("no-such-option".to_string()),
            },
        )
        .await
        .expect_err("unknown option");
    assert!(wrong.to_string().contains("no-such-option"), "{wrong}");
    fleet
        .manager
        .answer_permission(
            id,
            PermissionAnswer {
                request: Some(pending[0].seq),
                choice: PermissionChoice::OptionId("reject-once".to_string()),
            },
        )
        .await
        .expect("answer");
    fleet.idle(id).await;
    assert!(
        fleet
            .texts(id, "agent_message")
            .await
            .iter()
            .any(|t| t == "permission denied")
    );
    // The tool call only ever came as updates (gemini's order): still one item.
    let tools = fleet
        .items(id)
        .await
        .into_iter()
        .filter(|i| i.kind == "tool_call")
        .count();
    assert_eq!(tools, 1);
    let none = fleet
        .manager
        .answer_permission(
            id,
            PermissionAnswer {
                request: None,
                choice: PermissionChoice::Kind("allow_once".to_string()),
            },
        )
        .await
        .expect_err("nothing pending");
    assert_eq!(none.code(), "no_such_permission");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_and_model_reach_a_live_agent_and_the_record() {
    let fleet = Fleet::new().await;
    let mut new = fleet.new_agent();
    new.config.mode = Some("plan".to_string());
    let id = drover_testkit::create_agent(&fleet.manager, new, Some("say hi".to_string()), None)
        .await
        .expect("create")
        .id;
    fleet.idle(id).await;
    // The configured mode was applied when the session opened.
    let modes: Vec<String> = fleet
        .items(id)
        .await
        .into_iter()
        .filter(|i| i.kind == "mode")
        .filter_map(|i| {
            i.data
                .get("modeId")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(modes, ["plan"]);
    fleet
        .manager
        .set_mode(id, "default".to_string())
        .await
        .expect("mode");
    fleet
        .manager
        .set_model(id, "scripted-large".to_string())
        .await
        .expect("model");
    let agent = fleet.registry.get(id).expect("agent");
    assert_eq!(agent.config.mode.as_deref(), Some("default"));
    assert_eq!(agent.config.model.as_deref(), Some("scripted-large"));
    let err = fleet
        .manager
        .set_mode(id, "no-such-mode".to_string())
        .await
        .expect_err("unknown mode");
    // Refused before it reaches the agent, naming the modes it has.
    assert_eq!(err.code(), "invalid_input");
    assert!(err.to_string().contains("give one of: "), "{err}");
    assert_eq!(
        fleet
            .registry
            .get(id)
            .and_then(|a| a.config.mode)
            .as_deref(),
        Some("default")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_notifies_its_parent_with_a_queued_followup() {
    let fleet = Fleet::new().await;
    let parent = fleet.run("sleep 300\nsay parent busy").await;
    let mut new = fleet.new_agent();
    new.parent = Some(parent);
    new.title = Some("child".to_string());
    let child = drover_testkit::create_agent(
        &fleet.manager,
        new,
        Some("say the tests pass".to_string()),
        Some(parent),
    )
    .await
    .expect("child")
    .id;
    fleet.idle(child).await;
    fleet.idle(parent).await;
    // The parent's own turn was not interrupted, and the notice ran as its next turn.
    assert_eq!(
        fleet.turn_events(parent).await,
        ["turn_completed", "turn_completed"]
    );
    let items = fleet.items(parent).await;
    let notice = items
        .iter()
        .filter(|i| i.kind == "user_message")
        .nth(1)
        .expect("the notice");
    assert_eq!(notice.data["source"], format!("agent:{child}"));
    let text = notice.data["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("\"child\"")
            && text.contains("finished its turn")
            && text.contains("the tests pass"),
        "{text}"
    );

    // A permission request is reported too; the answer comes from the parent (here: us).
    fleet
        .manager
        .deliver_message(
            child,
            drover_core::inbox::InboxMessage::new(Delivery::Followup, "permission deploy", "user")
                .notifying(Some(parent)),
        )
        .await
        .expect("deliver");
    fleet
        .until(parent, "the permission notice", |i| {
            i.iter().any(|i| {
                i.kind == "user_message"
                    && i.data["text"]
                        .as_str()
                        .is_some_and(|t| t.contains("needs a permission: deploy"))
            })
        })
        .await;
    fleet
        .manager
        .answer_permission(
            child,
            PermissionAnswer {
                request: None,
                choice: PermissionChoice::Kind("allow_once".into()),
            },
        )
        .await
        .expect("answer");
    fleet.idle(child).await;

    // An archived parent hears nothing.
    fleet.idle(parent).await;
    let before = fleet.items(parent).await.len();
    fleet.registry.detach(child).await.expect("detach");
    fleet
        .registry
        .archive(parent, ArchiveOptions::default())
        .await
        .expect("archive parent");
    fleet
        .manager
        .deliver_message(
            child,
            drover_core::inbox::InboxMessage::new(Delivery::Followup, "say again", "user")
                .notifying(Some(parent)),
        )
        .await
        .expect("deliver");
    fleet.idle(child).await;
    assert_eq!(
        fleet.items(parent).await.len(),
        before,
        "an archived parent got a notice"
    );
}

/// A job started for an agent archived since the caller looked (the window between the
/// operation's check and the job's start) is refused: it never shows, no process of it is left
/// and no file of it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_agent_was_archived_while_it_started_is_refused_and_leaves_nothing() {
    use drover_acp::jobs::{JobCommand, JobSpec, record};
    let fleet = Fleet::new().await;
    let id = fleet.run("say hi").await;
    fleet.idle(id).await;
    fleet
        .registry
        .archive(
            id,
            ArchiveOptions {
                stop_activity: false,
            },
        )
        .await
        .expect("archive");
    // Straight to the jobs, as a start that looked before the archive would reach them.
    let refused = fleet
        .manager
        .jobs()
        .start(JobSpec {
            owner: id,
            command: JobCommand::Shell("exec sleep 1000".into()),
            cwd: fleet.cwd.path().to_path_buf(),
            env: std::collections::BTreeMap::new(),
            timeout: None,
            notify_on_exit: false,
            started_by: "user".into(),
            terminal: false,
        })
        .await
        .expect_err("a job for an archived agent");
    assert_eq!(
        refused.code(),
        drover_core::error::ErrorCode::AgentArchived,
        "{refused}"
    );
    assert!(fleet.manager.jobs().list().is_empty());
    let left: Vec<String> = procs::live()
        .iter()
        .filter(|p| p.has_env(record::MARKER_VAR, &format!("{id}/job-1")))
        .map(procs::Process::command_line)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let dir = fleet.home.path().join("jobs").join(id.to_string());
    let files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "{files:?}");
}
