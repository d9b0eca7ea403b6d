//! Nothing acknowledged is lost: messages across SIGKILL (the claim window of a turn start
//! above all), archive racing queued messages, and a connection's requests bounded and ended
//! with it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use drover_core::AgentId;
use drover_core::inbox::Inbox;
use drover_core::timeline::{Page, Timeline};
use drover_testkit::KillOnDrop as Driver;
use drover_testkit::crash::XorShift;
use drover_testkit::daemon::TestDaemon;
use drover_testkit::msgdriver::MessageOp;
use drover_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;

/// The kill rounds stop at whichever comes first.
const ROUNDS: usize = 100;
const ROUNDS_BUDGET: Duration = Duration::from_secs(40);
/// `DROVER_SOAK_ROUNDS=N` runs N rounds instead, with no time budget: a local soak, never CI.
const SOAK_ROUNDS: &str = "DROVER_SOAK_ROUNDS";
/// A round kills the driver after this long even if fewer followups were acknowledged (a
/// loaded machine is slow, and some rounds have most agents archived).
const ROUND_CAP: Duration = Duration::from_secs(5);
/// How long one boot of the driver may take.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

fn spawn_driver(home: &Path, cwd: &Path, seed: u64, mode: &str, stderr: &Path) -> Driver {
    let stderr = fs::File::create(stderr).expect("stderr file");
    Driver(
        drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover-msgdriver"), home)
            .arg(home)
            .arg(cwd)
            .arg(env!("CARGO_BIN_EXE_drover-scripted-agent"))
            .arg(seed.to_string())
            .arg(mode)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn drover-msgdriver"),
    )
}

/// The driver's stdout, line by line, on a channel (closed when it exits).
fn lines_of(driver: &mut Driver) -> (mpsc::Receiver<String>, thread::JoinHandle<()>) {
    let stdout = driver.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (rx, reader)
}

/// Runs the driver until `followups` followups were acknowledged, then SIGKILLs it 0–15 ms
/// later: the window between `message_queued` and the turn start. Returns what it printed.
fn run_until_killed(
    home: &Path,
    cwd: &Path,
    seed: u64,
    stderr: &Path,
    rng: &mut XorShift,
) -> Vec<String> {
    let followups = rng.range(1, 8);
    let delay = Duration::from_micros(rng.range(0, 15_000));
    let mut driver = spawn_driver(home, cwd, seed, "run", stderr);
    let (rx, reader) = lines_of(&mut driver);
    let started = Instant::now();
    let mut lines = Vec::new();
    let mut seen = 0;
    let mut kill_at: Option<Instant> = None;
    let mut booted: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if kill_at.is_some_and(|at| now >= at) {
            break;
        }
        match booted {
            // Boot fsyncs its reconciliation: slow when other builds load the disk.
            None => assert!(
                now - started < BOOT_TIMEOUT,
                "the driver did not boot within {BOOT_TIMEOUT:?}; stderr: {}",
                fs::read_to_string(stderr).unwrap_or_default()
            ),
            Some(at) if kill_at.is_none() && now - at >= ROUND_CAP => kill_at = Some(now + delay),
            Some(_) => {}
        }
        let wait = kill_at.map_or(Duration::from_millis(50), |at| at - now);
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if line.starts_with("boot ") {
                    booted = Some(Instant::now());
                }
                if line.starts_with("ack ") && line.contains(r#""kind":"followup""#) {
                    seen += 1;
                    if seen == followups {
                        kill_at = Some(Instant::now() + delay);
                    }
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                "drover-msgdriver exited on its own ({:?}); stderr: {}",
                driver.0.wait(),
                fs::read_to_string(stderr).unwrap_or_default()
            ),
        }
    }
    driver.kill_and_drain(reader, &rx, &mut lines);
    lines
}

/// Lets every queued message run and every agent settle, in a clean run of the driver.
fn settle(home: &Path, cwd: &Path, stderr: &Path) {
    let mut driver = spawn_driver(home, cwd, 0, "settle", stderr);
    let (rx, reader) = lines_of(&mut driver);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut settled = false;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        settled |= line.starts_with("settled");
    }
    let status = driver.0.wait().expect("reap the driver");
    reader.join().expect("reader thread");
    assert!(
        settled && status.success(),
        "the settle run failed ({status:?}); stderr: {}",
        fs::read_to_string(stderr).unwrap_or_default()
    );
}

/// Every line of every `.jsonl` under `dir` is whole JSON.
fn assert_logs_parse(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let text = fs::read_to_string(&path).expect("read a log");
        for (n, line) in text.lines().enumerate() {
            assert!(
                serde_json::from_str::<Value>(line).is_ok(),
                "{}:{}: not a whole record: {line:?}",
                path.display(),
                n + 1
            );
        }
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{} ends in a torn line",
            path.display()
        );
    }
}

/// Per message id, the times its `user_message` items were recorded (messageId or contextIds).
fn deliveries(home: &Path, agent: AgentId) -> HashMap<String, Vec<jiff::Timestamp>> {
    let page = Timeline::read_page(home, agent, Page::Tail { limit: usize::MAX }).expect("read");
    let mut out: HashMap<String, Vec<jiff::Timestamp>> = HashMap::new();
    for item in page.items.iter().filter(|i| i.kind == "user_message") {
        let context = item.data.get("contextIds").and_then(Value::as_array);
        for id in item
            .data
            .get("messageId")
            .into_iter()
            .chain(context.into_iter().flatten())
            .filter_map(Value::as_str)
        {
            out.entry(id.to_string()).or_default().push(item.at);
        }
    }
    out
}

#[test]
fn sigkill_after_message_queued_loses_no_message_and_runs_none_twice_or_after_archive() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let logs = TempDir::new().expect("driver logs");
    let mut rng = XorShift::new(0x000d_0e11);
    let started = Instant::now();
    // Every acknowledged operation, in the order they happened.
    let mut acks: Vec<MessageOp> = Vec::new();
    let mut agents: HashSet<AgentId> = HashSet::new();
    let soak: Option<usize> = std::env::var(SOAK_ROUNDS).ok().and_then(|n| n.parse().ok());
    let (max_rounds, budget) = soak.map_or((ROUNDS, ROUNDS_BUDGET), |n| (n, Duration::MAX));
    let mut rounds = 0;
    while rounds < max_rounds && started.elapsed() < budget {
        let stderr = logs.path().join(format!("round-{rounds}.log"));
        for line in run_until_killed(home.path(), cwd.path(), rounds as u64, &stderr, &mut rng) {
            if let Some(json) = line.strip_prefix("ack ") {
                let op: MessageOp = serde_json::from_str(json).expect("an ack line");
                agents.insert(op.agent);
                acks.push(op);
            }
        }
        rounds += 1;
    }
    let stderr = logs.path().join("settle.log");
    settle(home.path(), cwd.path(), &stderr);

    assert_logs_parse(&home.path().join("timelines"));
    assert_logs_parse(&home.path().join("inbox"));
    for entry in fs::read_dir(logs.path()).expect("logs").flatten() {
        let log = fs::read_to_string(entry.path()).expect("a driver log");
        assert!(
            !log.contains("cannot go from"),
            "a lifecycle race reached the log ({}):\n{log}",
            entry.path().display()
        );
    }

    let delivered: HashMap<AgentId, HashMap<String, Vec<jiff::Timestamp>>> = agents
        .iter()
        .map(|a| (*a, deliveries(home.path(), *a)))
        .collect();
    let mut messages = 0;
    let mut excused = 0;
    for (i, op) in acks.iter().enumerate() {
        let Some(id) = &op.message else { continue };
        messages += 1;
        let runs = delivered[&op.agent].get(id).cloned().unwrap_or_default();
        assert!(
            runs.len() <= 1,
            "message {id} ({op:?}) ran {} times",
            runs.len()
        );
        // The first archive of the agent acknowledged after the message: it may discard the
        // message, and the message must not run after it.
        let archive = acks[i + 1..]
            .iter()
            .find(|a| a.agent == op.agent && a.kind == "archive" && a.archived_at.is_some());
        match (archive, runs.first()) {
            (Some(archive), Some(ran)) => {
                let at = archive.archived_at.expect("filtered");
                assert!(
                    *ran <= at,
                    "message {id} ({op:?}) ran at {ran}, after the archive at {at} (then: {:?}); timeline:\n{}",
                    &acks[i..(i + 8).min(acks.len())],
                    Timeline::read_page(home.path(), op.agent, Page::Tail { limit: usize::MAX })
                        .expect("read")
                        .items
                        .iter()
                        .map(|i| format!("{} {} {}", i.at, i.kind, Value::Object(i.data.clone())))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            (Some(_), None) => excused += 1,
            (None, Some(_)) => {}
            (None, None) if op.kind == "inject" => {
                // Context waits for the next message that wakes the agent.
                let pending = Inbox::open(home.path(), op.agent).expect("inbox");
                assert!(
                    pending.pending().any(|m| &m.id == id),
                    "inject {id} ({op:?}) was neither delivered nor kept"
                );
            }
            (None, None) => panic!("acknowledged message {id} ({op:?}) never ran"),
        }
    }
    // An archived agent keeps no inbox: what it held can never run.
    let registry =
        drover_core::Registry::open(home.path(), std::sync::Arc::new(drover_core::NoRuntimes))
            .expect("open the registry")
            .0;
    for agent in &agents {
        if registry.get(*agent).is_some_and(|a| a.is_archived()) {
            let inbox = Inbox::path_for(home.path(), *agent);
            assert!(!inbox.exists(), "archived agent {agent} kept its inbox");
        }
    }
    eprintln!(
        "durability: {rounds} SIGKILLs, {messages} acknowledged messages, {excused} discarded by a later archive, 0 lost"
    );
    assert!(
        rounds >= 5 && messages >= rounds,
        "too little was exercised: {rounds} rounds, {messages} messages"
    );
}

/// `wait_idle` for an agent in a long turn, many times over on one connection: past the bound
/// the daemon answers `too_many_requests`, and once the connection closes its requests are
/// gone (the runtime's task count is back where it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connections_requests_are_bounded_and_end_with_it() {
    const SENT: usize = 300;
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": "sleep 60000"}))
        .await;
    client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == id.as_str()
                && m["payload"]["agent"]["status"] == "running"
        })
        .await;

    let (mut waiter, _) = daemon.client().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    for n in 0..SENT {
        waiter
            .send(json!({"type": "wait_idle", "requestId": format!("w{n}"), "agentId": id, "timeoutMs": 3_600_000}))
            .await;
    }
    let mut refused = 0;
    while refused < SENT - 256 {
        let answer = waiter
            .recv_where(|m| m["type"] == "request_error" || m["type"] == "idle")
            .await;
        assert_eq!(answer["payload"]["code"], "too_many_requests", "{answer}");
        refused += 1;
    }
    let during = metrics.num_alive_tasks();
    assert!(
        during >= baseline + 256,
        "the bounded requests do not run: {during} tasks, {baseline} before"
    );
    drop(waiter);
    eventually(
        format!("the task count back to its {baseline} before the requests"),
        Duration::from_secs(20),
        async || metrics.num_alive_tasks() <= baseline,
    )
    .await;
    // The daemon still answers (the agent still runs its turn).
    let answer = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 10}))
        .await;
    assert_eq!(answer["payload"]["idle"], false, "{answer}");
}

/// A full disk under a live agent that streams and takes messages: what could not be written
/// was refused or stays queued, no log is torn or glued, and once space returns (and after a
/// restart) every acknowledged message has run exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines)] // one story, told in the order it happens
async fn a_full_disk_during_streaming_and_messages_loses_nothing_acknowledged() {
    use drover_acp::{RuntimeManager, no_mcp_servers};
    use drover_core::NewAgent;
    use drover_core::inbox::Delivery;
    use drover_testkit::disk::{Tmpfs, fill};
    use drover_testkit::msgdriver::providers;

    const WAIT: Duration = Duration::from_secs(20);
    let disk = Tmpfs::mount("1m");
    let home = disk.path.join("home");
    fs::create_dir(&home).expect("home");
    let cwd = TempDir::new().expect("cwd");
    let state = TempDir::new().expect("agent state");
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_drover-scripted-agent"));
    let open = async || {
        RuntimeManager::open(&home, providers(state.path(), agent_bin), no_mcp_servers())
            .await
            .expect("open the runtimes")
    };
    let (manager, registry, _) = open().await;
    let agent = drover_testkit::create_agent(
        &manager,
        NewAgent {
            provider: "scripted".to_string(),
            cwd: cwd.path().to_path_buf(),
            title: Some("disk".to_string()),
            ..NewAgent::default()
        },
        Some("stream 20".to_string()),
        None,
    )
    .await
    .expect("create")
    .id;
    assert!(
        manager.wait_idle(agent, WAIT).await.expect("wait"),
        "the first turn did not end"
    );

    // The disk fills in the middle of a streamed turn.
    let mut acked = vec![
        manager
            .deliver(
                agent,
                Delivery::Followup,
                "stream 300 5".to_string(),
                "user".to_string(),
            )
            .await
            .expect("a streamed turn"),
    ];
    eventually("the streamed turn to run", WAIT, async || {
        registry
            .get(agent)
            .is_some_and(|a| a.status == drover_core::AgentStatus::Running)
    })
    .await;
    let mut refused = 0;
    let filler = disk.path.join("filler");
    fill(&filler);
    for n in 0..12 {
        let delivery = if n % 4 == 3 {
            Delivery::Inject
        } else {
            Delivery::Followup
        };
        match manager
            .deliver(
                agent,
                delivery,
                format!("stream 200\nsay full {n}"),
                "user".to_string(),
            )
            .await
        {
            Ok(id) => acked.push(id),
            Err(_) => refused += 1,
        }
        // Settled: the turn ran, or could not start and its message stays queued.
        assert!(
            manager.wait_idle(agent, WAIT).await.expect("wait"),
            "a turn hung on the full disk"
        );
    }
    // The disk was full for real: some acknowledged message could not start its turn.
    let ran = deliveries(&home, agent);
    let waiting = acked.iter().filter(|id| !ran.contains_key(*id)).count();
    assert!(
        waiting > 0,
        "every message ran on the \"full\" disk; it was not full"
    );
    fs::remove_file(&filler).expect("free the disk");
    let last = manager
        .deliver(
            agent,
            Delivery::Followup,
            "say space again".to_string(),
            "user".to_string(),
        )
        .await
        .expect("a message once space returned");
    acked.push(last);
    assert!(
        manager.wait_idle(agent, WAIT).await.expect("wait"),
        "the queued messages did not run"
    );
    manager.shutdown().await;
    registry.shutdown().await;
    drop((manager, registry));

    // Restart: what stayed queued runs now.
    let (manager, registry, _) = open().await;
    assert!(
        manager.wait_idle(agent, WAIT).await.expect("wait"),
        "the queued messages did not run after the restart"
    );
    manager.shutdown().await;
    registry.shutdown().await;

    assert_logs_parse(&home.join("timelines"));
    assert_logs_parse(&home.join("inbox"));
    let runs = deliveries(&home, agent);
    for id in &acked {
        let n = runs.get(id).map_or(0, Vec::len);
        assert_eq!(
            n, 1,
            "acknowledged message {id} ran {n} times ({refused} refused on the full disk)"
        );
    }
    eprintln!(
        "full disk: {} acknowledged, {refused} refused, {waiting} waited for space, all ran once",
        acked.len()
    );
}

/// A followup sent to a cold agent while it is being archived: archive wins. The followup ran
/// before the archive or never: not after unarchive, not at the next boot; and the archived
/// agent keeps no inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followup_racing_the_archive_of_a_cold_agent_never_runs_later() {
    use drover_acp::{RuntimeManager, no_mcp_servers};
    use drover_core::inbox::Delivery;
    use drover_core::{ArchiveOptions, NewAgent};
    use drover_testkit::msgdriver::providers;

    const ROUNDS: usize = 12;
    const WAIT: Duration = Duration::from_secs(20);
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let state = TempDir::new().expect("agent state");
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_drover-scripted-agent"));
    let open = async || {
        RuntimeManager::open(
            home.path(),
            providers(state.path(), agent_bin),
            no_mcp_servers(),
        )
        .await
        .expect("open the runtimes")
    };
    let (manager, registry, _) = open().await;
    let mut raced = Vec::new();
    for round in 0..ROUNDS {
        let agent = registry
            .create_agent(NewAgent {
                provider: "scripted".to_string(),
                cwd: cwd.path().to_path_buf(),
                title: Some(format!("cold {round}")),
                ..NewAgent::default()
            })
            .await
            .expect("a cold agent")
            .id;
        registry
            .set_status(agent, drover_core::AgentStatus::Idle, None)
            .await
            .expect("idle");
        let send = manager.deliver(
            agent,
            Delivery::Followup,
            format!("say raced {round}"),
            "user".to_string(),
        );
        let archive = registry.archive(
            agent,
            ArchiveOptions {
                stop_activity: true,
            },
        );
        let (sent, archived) = tokio::join!(send, archive);
        archived.expect("archive");
        let archived_at = registry
            .get(agent)
            .and_then(|a| a.archived_at)
            .expect("archived");
        registry.unarchive(agent).await.expect("unarchive");
        assert!(manager.wait_idle(agent, WAIT).await.expect("wait"));
        raced.push((agent, sent.ok(), archived_at));
    }
    manager.shutdown().await;
    registry.shutdown().await;
    drop((manager, registry));
    // The next boot runs nothing the archive discarded.
    let (manager, registry, _) = open().await;
    for (agent, _, _) in &raced {
        assert!(manager.wait_idle(*agent, WAIT).await.expect("wait"));
    }
    manager.shutdown().await;
    registry.shutdown().await;
    for (agent, message, archived_at) in &raced {
        let runs = deliveries(home.path(), *agent);
        if let Some(id) = message
            && let Some(ran) = runs.get(id)
        {
            assert_eq!(ran.len(), 1, "{id} ran {} times", ran.len());
            assert!(
                ran[0] <= *archived_at,
                "{id} ran at {}, after the archive at {archived_at}",
                ran[0]
            );
        }
        let inbox = Inbox::path_for(home.path(), *agent);
        let kept = fs::read_to_string(&inbox).unwrap_or_default();
        assert!(
            kept.is_empty(),
            "agent {agent} kept queued messages: {kept}"
        );
    }
}

/// An unarchive that comes while the archive's close is still ending the agent's process (it
/// ignores SIGTERM, so the close waits its grace): archive still wins. The context injected
/// before the archive never rides along with a later prompt, and the next message runs alone,
/// in the one task the agent has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unarchive_during_the_archives_close_finds_the_queue_discarded() {
    use drover_acp::{RuntimeManager, no_mcp_servers};
    use drover_core::inbox::Delivery;
    use drover_core::{ArchiveOptions, NewAgent};
    use drover_testkit::msgdriver::providers;

    const WAIT: Duration = Duration::from_secs(20);
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let state = TempDir::new().expect("agent state");
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_drover-scripted-agent"));
    let mut providers = providers(state.path(), agent_bin);
    let mut slow = providers.get("scripted").expect("scripted").clone();
    slow.env
        .insert("SCRIPTED_AGENT_IGNORE_TERM".to_string(), "1".to_string());
    providers.insert(slow);
    let (manager, registry, _) = RuntimeManager::open(home.path(), providers, no_mcp_servers())
        .await
        .expect("open the runtimes");
    let agent = drover_testkit::create_agent(
        &manager,
        NewAgent {
            provider: "scripted".to_string(),
            cwd: cwd.path().to_path_buf(),
            title: Some("slow to end".to_string()),
            ..NewAgent::default()
        },
        Some("say hello".to_string()),
        None,
    )
    .await
    .expect("an agent")
    .id;
    assert!(manager.wait_idle(agent, WAIT).await.expect("wait"));
    let pid = manager.runtime_pid(agent).await.expect("a live runtime");
    // Context for the next prompt: it waits in the inbox.
    let injected = manager
        .deliver(
            agent,
            Delivery::Inject,
            "injected before the archive".to_string(),
            "user".to_string(),
        )
        .await
        .expect("queued");
    registry
        .archive(
            agent,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await
        .expect("archive");
    // The close has begun (the task takes no more commands) and waits for the process.
    eventually("the archive's close to begin", WAIT, async || {
        manager.runtime_pid(agent).await.is_none()
    })
    .await;
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the agent's process ended before the unarchive: the race was not reached"
    );
    registry.unarchive(agent).await.expect("unarchive");
    let after = manager
        .deliver(
            agent,
            Delivery::Followup,
            "say after the unarchive".to_string(),
            "user".to_string(),
        )
        .await
        .expect("a message after the unarchive");
    assert!(manager.wait_idle(agent, WAIT).await.expect("wait"));
    manager.shutdown().await;
    registry.shutdown().await;

    let runs = deliveries(home.path(), agent);
    assert!(
        !runs.contains_key(&injected),
        "the context the archive discarded rode along after the unarchive: {runs:?}"
    );
    assert_eq!(runs.get(&after).map(Vec::len), Some(1), "{runs:?}");
    assert!(
        !Inbox::path_for(home.path(), agent).exists()
            || Inbox::open(home.path(), agent)
                .expect("inbox")
                .pending()
                .next()
                .is_none(),
        "the inbox still holds a message"
    );
}

/// The client token is made at a daemon's first start: a SIGKILL between the file's creation
/// and its write leaves it empty. The next start makes a new one instead of refusing to start
/// (an empty file was never a token anyone could know).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_left_empty_by_a_killed_first_start_is_made_again() {
    use std::os::unix::fs::OpenOptionsExt;
    let home = TempDir::new().expect("home");
    let path = home.path().join("token");
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("an empty token file");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), Some(home), false).await;
    let token = daemon.token().expect("a token");
    assert!(token.len() >= 32, "{token:?}");
    let (mut client, _) = daemon.client().await;
    let answer = client.request(json!({"type": "ping"})).await;
    assert_ne!(answer["type"], "request_error", "{answer}");
    daemon.stop().await;
}

/// A job whose owner asked for its exit notice ended and its record says so, but the daemon
/// was killed before the notice was queued (the state a SIGKILL in that moment leaves: the
/// record ended, its notice still pending). The next boot queues the notice; the boot after
/// that does not queue it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_exit_notice_cut_off_by_a_kill_is_queued_at_the_next_boot_once() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("the agent's cwd, outliving each daemon");
    let path = home.path().to_path_buf();
    let daemon = TestDaemon::start_in(path.clone(), None, false).await;
    let (mut client, _) = daemon.client().await;
    let agent = client
        .create_scripted(cwd.path(), json!({"title": "owner"}))
        .await;
    client.wait_status(&agent, "idle").await;
    let started = client
        .request(
            json!({"type": "start_job", "agentId": agent, "command": "echo built",
            "notifyOnExit": false}),
        )
        .await;
    assert_eq!(started["type"], "job", "{started}");
    let job = started["payload"]["job"]["id"]
        .as_str()
        .expect("a job id")
        .to_string();
    let waited = client
        .request(json!({"type": "wait_job", "jobId": job, "timeoutMs": 15000}))
        .await;
    assert_eq!(waited["payload"]["ended"], true, "{waited}");
    drop(client);
    daemon.stop().await;

    // The record as the kill left it: ended, with its owner's notice not queued yet.
    let record = path.join("jobs").join(&agent).join(format!("{job}.json"));
    let mut doc: Value =
        serde_json::from_slice(&fs::read(&record).expect("the job record")).expect("a JSON record");
    doc["notifyOnExit"] = json!(true);
    doc["noticePending"] = json!(true);
    fs::write(&record, serde_json::to_vec_pretty(&doc).expect("encode")).expect("write");

    // The owner's notices of the job: run (in its timeline) or queued for its next turn.
    let source = format!("job:{job}");
    let notices = async |client: &mut drover_testkit::daemon::Client| {
        let prefix = format!("[drover] Job {job} ");
        let queued = client.get_agent(&agent).await["queued"]
            .as_array()
            .map_or(0, |q| {
                q.iter()
                    .filter(|m| m["text"].as_str().is_some_and(|t| t.starts_with(&prefix)))
                    .count()
            });
        queued + client.messages_from(&agent, &source).await.len()
    };
    let daemon = TestDaemon::start_in(path.clone(), None, false).await;
    let (mut client, _) = daemon.client().await;
    for _ in 0..200 {
        if notices(&mut client).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        notices(&mut client).await,
        1,
        "the exit notice the kill cut off was not sent at the next boot"
    );
    client.wait_idle(&agent).await;
    drop(client);
    daemon.stop().await;
    let kept: Value =
        serde_json::from_slice(&fs::read(&record).expect("the job record")).expect("a JSON record");
    assert!(
        kept.get("noticePending").is_none_or(|p| p == false),
        "the notice is still pending once queued: {kept}"
    );

    // Once more: the notice is not queued twice.
    let daemon = TestDaemon::start_in(path, Some(home), false).await;
    let (mut client, _) = daemon.client().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    client.wait_idle(&agent).await;
    assert_eq!(notices(&mut client).await, 1, "the exit notice ran twice");
    drop(client);
    daemon.stop().await;
}

/// A daemon (a process of its own) running a schedule every second and jobs that ask for their
/// exit notice is killed (SIGKILL) at random moments, over and over on the same home.
/// Afterwards no scheduled prompt ran twice, every job got exactly one exit notice (it ended,
/// or was found lost), and the budget is the last one acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines)] // one story: rounds of run and kill, then the account
async fn sigkill_of_a_daemon_with_schedules_and_jobs_runs_nothing_twice_and_drops_no_notice() {
    use crate::processes::{DaemonProcess, Home, config};
    use nix::sys::signal::Signal;
    const ROUNDS: u64 = 8;
    let budget_of_rounds = Duration::from_secs(25);
    let home = Home::new(config);
    let mut rng = XorShift::new(0x5c4e_d01e);
    let started = Instant::now();
    let mut agent = String::new();
    let mut jobs: Vec<String> = Vec::new();
    let mut budget: Option<u64> = None;
    let mut rounds = 0;
    while rounds < ROUNDS && started.elapsed() < budget_of_rounds {
        let mut daemon = DaemonProcess::start(home.path()).await;
        let mut client = daemon.client().await;
        if agent.is_empty() {
            agent = client
                .create_agent(json!({"provider": "scripted", "cwd": home.cwd, "title": "owner"}))
                .await;
            let made = client
                .request(json!({"type": "create_schedule", "agentId": agent,
                    "prompt": "say tick", "when": {"everySeconds": 1}}))
                .await;
            assert_eq!(made["type"], "schedule", "{made}");
        }
        // Jobs that end at once, soon, or after the kill.
        for _ in 0..rng.range(1, 4) {
            let command = format!("sleep 0.{}", rng.range(0, 9));
            let answer = client
                .request(
                    json!({"type": "start_job", "agentId": agent, "command": command,
                    "cwd": home.cwd}),
                )
                .await;
            assert_eq!(answer["type"], "job", "{answer}");
            jobs.push(
                answer["payload"]["job"]["id"]
                    .as_str()
                    .expect("id")
                    .to_string(),
            );
        }
        let tokens = 1_000_000 + rounds;
        let set = client
            .request(json!({"type": "set_budget", "agentId": agent, "budget": {"tokens": tokens}}))
            .await;
        assert_ne!(set["type"], "request_error", "{set}");
        budget = Some(tokens);
        tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
        daemon.die_by(Signal::SIGKILL);
        rounds += 1;
    }

    // The last boot: what was cut off settles; the schedule stops so the account holds still.
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let listed = client.request(json!({"type": "list_schedules"})).await;
    let schedule = listed["payload"]["schedules"][0]["id"]
        .as_str()
        .expect("the schedule")
        .to_string();
    let paused = client
        .request(json!({"type": "pause_schedule", "scheduleId": schedule}))
        .await;
    assert_eq!(paused["type"], "schedule", "{paused}");
    for job in &jobs {
        let waited = client
            .request(json!({"type": "wait_job", "jobId": job, "timeoutMs": 15000}))
            .await;
        assert_eq!(waited["payload"]["ended"], true, "{job}: {waited}");
    }
    // Every notice is queued (the last ones a moment after their job ends) and runs.
    let notices_of = async |client: &mut drover_testkit::daemon::Client| {
        let mut count: HashMap<String, usize> = HashMap::new();
        for item in client.messages_from(&agent, "job:").await {
            let source = item["data"]["source"].as_str().unwrap_or_default();
            *count
                .entry(source.trim_start_matches("job:").to_string())
                .or_default() += 1;
        }
        count
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut notices = notices_of(&mut client).await;
    while jobs.iter().any(|j| !notices.contains_key(j)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.wait_idle(&agent).await;
        notices = notices_of(&mut client).await;
    }
    client.wait_idle(&agent).await;
    let notices = notices_of(&mut client).await;
    for job in &jobs {
        assert_eq!(
            notices.get(job).copied().unwrap_or(0),
            1,
            "job {job}: its exit notice ran {} times (all: {notices:?})",
            notices.get(job).copied().unwrap_or(0)
        );
    }
    // Each scheduled prompt ran once at most, and each run the schedule recorded ran or waits.
    let mut runs: HashMap<String, usize> = HashMap::new();
    for item in client.messages_from(&agent, "schedule:").await {
        let id = item["data"]["messageId"].as_str().unwrap_or_default();
        *runs.entry(id.to_string()).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "scheduled prompts ran twice: {twice:?}");
    assert_eq!(
        client.get_agent(&agent).await["budget"],
        json!({"tokens": budget.expect("a budget")})
    );
    eprintln!(
        "daemon SIGKILLs: {rounds} rounds, {} jobs each told once, {} scheduled prompts each run once",
        jobs.len(),
        runs.len()
    );
    assert!(rounds >= 3, "too few rounds: {rounds}");
    daemon.stop().await;
}
