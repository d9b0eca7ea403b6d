//! A full disk (a real one: a small tmpfs, filled) under the writes added after the first
//! durability tests: budgets, spend, labels and the hub's budgets, usage-limit waits, sign-in
//! waits, sign-ins kept in `config.toml`, hosts, schedules. Each is refused, naming the file it
//! could not write; nothing in memory or on disk changes; once space is back the same write
//! works and survives a restart.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_core::{
    AgentId, AgentStatus, AuthMethod, Budget, Limited, NewAgent, NoRuntimes, Registry,
    RegistryError,
};
use drover_testkit::crash::AgentState;
use drover_testkit::disk::{Tmpfs, fill};
use tempfile::TempDir;

/// Whether a process runs `sleep 31337` (the job the full disk refused).
fn sleeping_31337() -> bool {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| fs::read(e.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x0031337\x00"))
}

/// Every file under `dir` with its bytes.
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = fs::read(&path) {
                out.insert(path, bytes);
            }
        }
    }
    out
}

/// The files of `home` that changed, appeared or went between two snapshots.
fn changed(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = before
        .iter()
        .filter(|(p, b)| after.get(*p) != Some(*b))
        .map(|(p, _)| p.clone())
        .collect();
    out.extend(after.keys().filter(|p| !before.contains_key(*p)).cloned());
    out
}

async fn open(home: &Path) -> Registry {
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || Registry::open(&home, Arc::new(NoRuntimes)))
        .await
        .expect("the open task")
        .expect("open the registry")
        .0
}

fn limit() -> Limited {
    let now = jiff::Timestamp::now();
    Limited {
        at: now,
        reset_at: None,
        retry_at: now,
        count: 1,
        error: "usage limit".to_string(),
    }
}

fn key_method() -> Vec<AuthMethod> {
    vec![
        serde_json::from_value(serde_json::json!({"id": "key", "name": "a key"}))
            .expect("a method"),
    ]
}

/// The registry's writes added for budgets, spend, labels, the hub's budgets, usage limits and
/// sign-in waits, on a full disk: each refused with a store error naming the agent's record;
/// the agent in memory and every file as they were; with room again each works, and a reopen
/// finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines)] // one story: every write, refused, then made
async fn a_full_disk_refuses_budget_spend_label_limit_and_sign_in_writes_and_changes_nothing() {
    let disk = Tmpfs::mount("512k");
    let home = disk.path.join("home");
    fs::create_dir(&home).expect("home");
    let cwd = TempDir::new().expect("cwd");
    let registry = open(&home).await;
    let new = |title: &str, parent: Option<AgentId>| NewAgent {
        provider: "crash".to_string(),
        cwd: cwd.path().to_path_buf(),
        title: Some(title.to_string()),
        parent,
        ..NewAgent::default()
    };
    let root = registry
        .create_agent(new("root", None))
        .await
        .expect("root")
        .id;
    let kid = registry
        .create_agent(new("kid", Some(root)))
        .await
        .expect("kid")
        .id;
    // A running turn (for the usage limit), a budget and a spend to change.
    for id in [root, kid] {
        registry
            .set_status(id, AgentStatus::Idle, None)
            .await
            .expect("idle");
    }
    registry
        .set_status(kid, AgentStatus::Running, None)
        .await
        .expect("running");
    let budget = Budget {
        tokens: Some(1000),
        cost: None,
        hard: false,
    };
    registry
        .set_budget(root, Some(budget.clone()))
        .await
        .expect("a budget");
    registry
        .add_spend(kid, Some(100), Some((0.5, "USD".to_string())))
        .await
        .expect("a spend");
    let record = |id: AgentId| {
        files_under(&home.join("agents"))
            .into_keys()
            .find(|p| p.file_stem().is_some_and(|s| s == id.to_string().as_str()))
            .expect("the agent's record")
    };
    let paths = HashMap::from([(root, record(root)), (kid, record(kid))]);

    let filler = disk.path.join("filler");
    fill(&filler);
    let before = files_under(&home);
    let states = |r: &Registry| -> Vec<AgentState> {
        [root, kid]
            .iter()
            .map(|id| AgentState::of(&r.get(*id).expect("agent")))
            .collect()
    };
    let memory = states(&registry);

    // Each write, on the full disk.
    let mut refused = Vec::new();
    macro_rules! refused {
        ($what:expr, $id:expr, $call:expr) => {{
            let result = $call.await;
            match result {
                Err(RegistryError::Store(e)) => {
                    let path = &paths[&$id];
                    assert!(
                        e.to_string().contains(&path.display().to_string())
                            && e.to_string().contains("No space left"),
                        "{}: the error does not name {} and the full disk: {e}",
                        $what,
                        path.display()
                    );
                }
                other => panic!("{}: expected a store error, got {other:?}", $what),
            }
            assert_eq!(states(&registry), memory, "{}: memory changed", $what);
            let now = files_under(&home);
            assert!(
                changed(&before, &now).is_empty(),
                "{}: files changed: {:?}",
                $what,
                changed(&before, &now)
            );
            refused.push($what);
        }};
    }
    refused!(
        "set_budget",
        root,
        registry.set_budget(
            root,
            Some(Budget {
                tokens: Some(5),
                cost: Some(1.0),
                hard: true
            })
        )
    );
    refused!("clear the budget", root, registry.set_budget(root, None));
    refused!(
        "add_spend",
        kid,
        registry.add_spend(kid, Some(5000), Some((2.0, "USD".to_string())))
    );
    refused!(
        "update_labels",
        kid,
        registry.update_labels(
            kid,
            BTreeMap::from([("team".to_string(), "b".to_string())]),
            Vec::new()
        )
    );
    refused!(
        "set_upstream_budgets",
        kid,
        registry.set_upstream_budgets(kid, vec![budget.clone()])
    );
    refused!(
        "set_upstream_gate",
        kid,
        registry.set_upstream_gate(kid, Some(root))
    );
    refused!(
        "record_turn_limited",
        kid,
        registry.record_turn_limited(kid, limit())
    );
    refused!(
        "record_start_failure",
        root,
        registry.record_start_failure(root, "sign in first".to_string(), Some(key_method()))
    );
    // Nothing was refused because it was not allowed: each is taken once there is room.
    fs::remove_file(&filler).expect("free the disk");
    registry
        .set_budget(
            root,
            Some(Budget {
                tokens: Some(5),
                cost: Some(1.0),
                hard: true,
            }),
        )
        .await
        .expect("set_budget with room");
    registry
        .add_spend(kid, Some(5000), Some((2.0, "USD".to_string())))
        .await
        .expect("add_spend with room");
    registry
        .update_labels(
            kid,
            BTreeMap::from([("team".to_string(), "b".to_string())]),
            Vec::new(),
        )
        .await
        .expect("labels with room");
    registry
        .set_upstream_budgets(kid, vec![budget.clone()])
        .await
        .expect("upstream budgets with room");
    registry
        .record_turn_limited(kid, limit())
        .await
        .expect("limited with room");
    registry
        .record_start_failure(root, "sign in first".to_string(), Some(key_method()))
        .await
        .expect("start failure with room");
    let made = states(&registry);
    assert_eq!(made[1].spend_tokens, Some(5100), "{made:?}");
    assert!(
        made[1].limited && made[0].start_failure.is_some(),
        "{made:?}"
    );
    registry.shutdown().await;
    drop(registry);
    let reopened = open(&home).await;
    assert_eq!(
        states(&reopened),
        made,
        "what was acknowledged with room did not survive a reopen"
    );
    // The tree's spend is the sum of its records: the budget on the root sees the kid's.
    let tree = reopened.tree_spend(root).expect("the tree");
    assert_eq!(tree.spend.tokens, Some(5100));
    assert!(reopened.spent_budget(kid).is_some(), "the budget is spent");
    reopened.shutdown().await;
    eprintln!(
        "full disk: {} registry writes refused, then made",
        refused.len()
    );
}

/// A sign-in kept in `config.toml` on a full disk: refused, naming `config.toml`; the file as
/// it was, no temp file left; with room again the same sign-in is kept.
#[test]
fn a_sign_in_on_a_full_disk_is_refused_naming_config_toml_and_keeps_the_file() {
    use drover_acp::providers::{SignInEntry, store_sign_in};
    let disk = Tmpfs::mount("256k");
    let home = disk.path.join("home");
    fs::create_dir(&home).expect("home");
    let config = home.join("config.toml");
    let original = "# mine\n[providers.codex]\nenv = { OTHER = \"1\" }\n";
    fs::write(&config, original).expect("config.toml");
    let entry = SignInEntry::Env(BTreeMap::from([(
        "OPENAI_API_KEY".to_string(),
        "sk-full-disk".to_string(),
    )]));
    let filler = disk.path.join("filler");
    fill(&filler);
    // The writers' turn lock is made empty on the first sign-in: it holds nothing.
    let before = files_under(&home);
    let e = store_sign_in(&home, "codex", &entry).expect_err("a sign-in on a full disk");
    let message = e.to_string();
    assert!(
        message.contains(&config.display().to_string()) && message.contains("No space left"),
        "the refusal does not name config.toml and the full disk: {message}"
    );
    assert!(
        !message.contains("sk-full-disk"),
        "the refusal shows the key: {message}"
    );
    let mut after = files_under(&home);
    after.retain(|p, bytes| !(p.ends_with("config.toml.lock") && bytes.is_empty()));
    assert!(
        changed(&before, &after).is_empty(),
        "files changed: {:?}",
        changed(&before, &after)
    );
    fs::remove_file(&filler).expect("free the disk");
    store_sign_in(&home, "codex", &entry).expect("the sign-in with room");
    let kept = fs::read_to_string(&config).expect("config.toml");
    assert!(
        kept.starts_with("# mine") && kept.contains("OTHER") && kept.contains("sk-full-disk"),
        "{kept}"
    );
}

/// What a daemon acknowledges over its protocol and keeps in its own files (`hosts.json`,
/// `schedules/`, the agent's record for `set_budget`, a job's record), on a full disk: each
/// request is refused with an error naming the file; the hosts, schedules, budget and jobs
/// listed are as before, no file changed and the refused job does not run; with room again
/// each request works, and a restarted daemon has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines)] // one story: every request, refused, then made
async fn a_full_disk_refuses_host_schedule_and_budget_requests_and_keeps_every_file() {
    use drover_testkit::daemon::{Client, TestDaemon};
    use serde_json::{Value, json};

    async fn hosts(client: &mut Client) -> Vec<String> {
        let answer = client.request(json!({"type": "list_hosts"})).await;
        assert_eq!(answer["type"], "hosts", "{answer}");
        answer["payload"]["hosts"]
            .as_array()
            .expect("hosts")
            .iter()
            .map(|h| h["name"].as_str().unwrap_or_default().to_string())
            .collect()
    }
    async fn schedules(client: &mut Client) -> Vec<(String, bool)> {
        let answer = client.request(json!({"type": "list_schedules"})).await;
        assert_eq!(answer["type"], "schedules", "{answer}");
        answer["payload"]["schedules"]
            .as_array()
            .expect("schedules")
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().unwrap_or_default().to_string(),
                    s["state"] == "paused",
                )
            })
            .collect()
    }
    let host = |name: &str| json!({"name": name, "command": ["sleep", "600"]});

    let disk = Tmpfs::mount("16m");
    let home = disk.path.join("home");
    fs::create_dir(&home).expect("home");
    let daemon = TestDaemon::start_in(home.clone(), None, false).await;
    let (mut client, _) = daemon.client().await;
    let agent = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    let added = client
        .request(json!({"type": "add_host", "host": host("a")}))
        .await;
    assert_eq!(added["type"], "hosts", "{added}");
    let made = client
        .request(json!({"type": "create_schedule", "agentId": agent,
            "prompt": "say hourly", "when": {"everySeconds": 3600}}))
        .await;
    assert_eq!(made["type"], "schedule", "{made}");
    let schedule = made["payload"]["schedule"]["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let record = files_under(&home.join("agents"))
        .into_keys()
        .find(|p| p.file_stem().is_some_and(|s| s == agent.as_str()))
        .expect("the agent's record");

    let filler = disk.path.join("filler");
    fill(&filler);
    // The files that hold what was acknowledged (logs and runtimes may change meanwhile).
    let kept = || {
        let mut all = files_under(&home.join("agents"));
        all.extend(files_under(&home.join("schedules")));
        all.extend(
            ["hosts.json", "host-parents.json"]
                .iter()
                .filter_map(|f| fs::read(home.join(f)).ok().map(|b| (home.join(f), b))),
        );
        all
    };
    let before = kept();
    let cases: Vec<(&str, Value, PathBuf)> = vec![
        (
            "add_host",
            json!({"type": "add_host", "host": host("b")}),
            home.join("hosts.json"),
        ),
        (
            "remove_host",
            json!({"type": "remove_host", "name": "a"}),
            home.join("hosts.json"),
        ),
        (
            "set_budget",
            json!({"type": "set_budget", "agentId": agent, "budget": {"tokens": 10}}),
            record.clone(),
        ),
        (
            "create_schedule",
            json!({"type": "create_schedule", "agentId": agent,
                "prompt": "say never", "when": {"everySeconds": 60}}),
            home.join("schedules"),
        ),
        (
            "pause_schedule",
            json!({"type": "pause_schedule", "scheduleId": schedule}),
            home.join("schedules").join(format!("{schedule}.json")),
        ),
        (
            "delete_schedule",
            json!({"type": "delete_schedule", "scheduleId": schedule}),
            home.join("schedules"),
        ),
        (
            "start_job",
            json!({"type": "start_job", "agentId": agent, "command": "sleep 31337",
                "cwd": daemon.cwd()}),
            home.join("jobs").join(&agent),
        ),
    ];
    for (what, request, file) in &cases {
        let answer = client.request(request.clone()).await;
        assert_eq!(
            answer["type"], "request_error",
            "{what} on a full disk: {answer}"
        );
        let text = answer["payload"].to_string();
        assert!(
            text.contains(&file.display().to_string()) && text.contains("No space left"),
            "{what}: the refusal does not name {} and the full disk: {answer}",
            file.display()
        );
        assert!(
            changed(&before, &kept()).is_empty(),
            "{what}: files changed: {:?}",
            changed(&before, &kept())
        );
        assert_eq!(hosts(&mut client).await, ["a"], "{what}");
        assert_eq!(
            schedules(&mut client).await,
            [(schedule.clone(), false)],
            "{what}"
        );
        assert!(
            client.get_agent(&agent).await["budget"].is_null(),
            "{what}: a budget shows"
        );
        let jobs = client.request(json!({"type": "list_jobs"})).await;
        assert_eq!(
            jobs["payload"]["jobs"].as_array().map(Vec::len),
            Some(0),
            "{what}: {jobs}"
        );
    }
    // The job whose start could not be recorded does not run.
    assert!(
        !sleeping_31337(),
        "the refused job's process runs on the full disk"
    );

    // With room again, the same requests are taken, and a restarted daemon has them.
    fs::remove_file(&filler).expect("free the disk");
    for (what, request, _) in &cases[..5] {
        let answer = client.request(request.clone()).await;
        assert_ne!(
            answer["type"], "request_error",
            "{what} with room: {answer}"
        );
    }
    drop(client);
    let (home, _) = daemon.stop().await;
    let daemon = TestDaemon::start_in(home, None, false).await;
    let (mut client, _) = daemon.client().await;
    assert_eq!(hosts(&mut client).await, ["b"]);
    assert_eq!(
        client.get_agent(&agent).await["budget"],
        json!({"tokens": 10})
    );
    let now = schedules(&mut client).await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.contains(&(schedule.clone(), true)), "{now:?}");
    drop(client);
    daemon.stop().await;
}
