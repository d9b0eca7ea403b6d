//! The file store as the registry uses it: damaged, foreign and half-written files at boot,
//! atomic writes, a full disk, and the archive journal.
//!
//! Each test writes through the real `Registry`, then changes the files by hand the way a
//! crash, a newer drover or a user would, and opens the registry again.

// Each test is one story about the store, told start to finish; cutting it would scatter it.
#![expect(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use drover_core::store::{StoreError, cwd_dir_name};
use drover_core::{
    Agent, AgentId, AgentStatus, ArchiveOptions, BootReport, NewAgent, ProviderConfig, Registry,
    RegistryError, ResumeHandle, TurnOutcome,
};
use drover_testkit::TestRuntime;
use proptest::prelude::*;
use serde_json::{Value, json};
use tempfile::TempDir;

// ---- helpers ----------------------------------------------------------------------------------

/// Opens the registry the way the daemon does: on a blocking thread.
async fn open(home: &Path) -> (Registry, BootReport) {
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || Registry::open(&home, TestRuntime::new()))
        .await
        .expect("open task")
        .expect("Registry::open")
}

/// An agent made in `registry` (which must take it) from [`new_agent`].
async fn created(registry: &Registry, cwd: &Path, title: &str, parent: Option<AgentId>) -> Agent {
    registry
        .create_agent(new_agent(cwd, title, parent))
        .await
        .unwrap_or_else(|e| panic!("create {title}: {e}"))
}

fn new_agent(cwd: &Path, title: &str, parent: Option<AgentId>) -> NewAgent {
    NewAgent {
        provider: "claude".to_string(),
        cwd: cwd.to_path_buf(),
        title: Some(title.to_string()),
        parent,
        ..NewAgent::default()
    }
}

/// Records agent `title` (under `parent`, if any) in `cwd`.
async fn create(registry: &Registry, cwd: &Path, title: &str, parent: Option<AgentId>) -> Agent {
    registry
        .create_agent(new_agent(cwd, title, parent))
        .await
        .expect(title)
}

/// `agents/{cwd-with-dashes}/{id}.json`, computed independently of the store.
fn agent_path(home: &Path, agent: &Agent) -> PathBuf {
    home.join("agents")
        .join(cwd_dir_name(&agent.cwd))
        .join(format!("{}.json", agent.id))
}

fn journal_path(home: &Path, root: AgentId) -> PathBuf {
    home.join("journal").join(format!("archive-{root}.json"))
}

fn read_json(path: &Path) -> Value {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn write_json(path: &Path, value: &Value) {
    fs::write(path, serde_json::to_vec_pretty(value).expect("encode")).expect("write json");
}

/// Every file under `dir`, recursively, with its bytes.
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = fs::read(&path).expect("read file");
                out.insert(path, bytes);
            }
        }
    }
    out
}

/// The store's files: what a failed mutation must leave byte-identical.
fn store_files(home: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = BTreeMap::new();
    for dir in ["agents", "workspaces", "journal", "quarantine"] {
        all.extend(files_under(&home.join(dir)));
    }
    all
}

/// Asserts two snapshots hold the same files with the same bytes, naming those that differ.
fn assert_same_files(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
    what: &str,
) {
    let added: Vec<&PathBuf> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    let removed: Vec<&PathBuf> = before.keys().filter(|p| !after.contains_key(*p)).collect();
    let changed: Vec<&PathBuf> = before
        .iter()
        .filter(|(p, bytes)| after.get(*p).is_some_and(|b| b != *bytes))
        .map(|(p, _)| p)
        .collect();
    assert!(
        added.is_empty() && removed.is_empty() && changed.is_empty(),
        "{what}: the disk changed\n  added: {added:?}\n  removed: {removed:?}\n  changed: {changed:?}"
    );
}

fn temp_files(home: &Path) -> Vec<PathBuf> {
    files_under(home)
        .into_keys()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(".tmp-"))
        })
        .collect()
}

fn store_error(result: Result<impl std::fmt::Debug, RegistryError>, what: &str) -> StoreError {
    match result {
        Err(RegistryError::Store(e)) => e,
        other => panic!("{what}: expected a store error, got {other:?}"),
    }
}

// ---- boot: damaged, newer and leftover files --------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_agent_files_are_quarantined_and_the_rest_load() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = created(&registry, cwd.path(), "a", None).await;
    let b = created(&registry, cwd.path(), "b", Some(a.id)).await;
    // Idle, so boot has no reason to rewrite them.
    let a = registry
        .set_status(a.id, AgentStatus::Idle, None)
        .await
        .expect("a idle");
    let b = registry
        .set_status(b.id, AgentStatus::Idle, None)
        .await
        .expect("b idle");
    drop(registry);

    let dir = agent_path(home.path(), &a)
        .parent()
        .expect("folder")
        .to_path_buf();
    let good = read_json(&agent_path(home.path(), &a));
    let mut corrupt: Vec<(PathBuf, Vec<u8>)> = Vec::new();

    // Garbage bytes.
    corrupt.push((
        dir.join(format!("{}.json", AgentId::new())),
        b"\xff\xfe\x00{not json at all\n".to_vec(),
    ));
    // Valid JSON, but most fields missing.
    let id = AgentId::new();
    corrupt.push((
        dir.join(format!("{id}.json")),
        serde_json::to_vec(&json!({"version": 1, "id": id.to_string()})).expect("encode"),
    ));
    // A whole valid record under a file name that is not its id.
    corrupt.push((
        dir.join(format!("{}.json", AgentId::new())),
        serde_json::to_vec_pretty(&good).expect("encode"),
    ));
    // A record whose id is a UUID, but not v7 (file name and id agree).
    let v4 = "3f0c5f9e-8f1b-4c7a-9d2e-1a2b3c4d5e6f";
    let mut bad_id = good.clone();
    bad_id["id"] = json!(v4);
    corrupt.push((
        dir.join(format!("{v4}.json")),
        serde_json::to_vec_pretty(&bad_id).expect("encode"),
    ));
    // An empty file (a torn write by a tool that does not write atomically).
    corrupt.push((dir.join(format!("{}.json", AgentId::new())), Vec::new()));
    for (path, bytes) in &corrupt {
        fs::write(path, bytes).expect("write corrupt file");
    }

    let (registry, report) = open(home.path()).await;

    let mut reported: Vec<&Path> = report
        .quarantined
        .iter()
        .map(|q| q.original.as_path())
        .collect();
    reported.sort();
    let mut expected: Vec<&Path> = corrupt.iter().map(|(p, _)| p.as_path()).collect();
    expected.sort();
    assert_eq!(reported, expected, "BootReport.quarantined");
    for (path, bytes) in &corrupt {
        assert!(!path.exists(), "{} is still in agents/", path.display());
        let q = report
            .quarantined
            .iter()
            .find(|q| &q.original == path)
            .expect("reported");
        let moved = q.moved_to.as_ref().expect("moved to quarantine");
        assert_eq!(
            moved.parent(),
            Some(home.path().join("quarantine").as_path()),
            "{}",
            moved.display()
        );
        assert_eq!(
            &fs::read(moved).expect("read quarantined"),
            bytes,
            "{} kept its content",
            moved.display()
        );
        assert!(!q.reason.is_empty());
    }
    assert_eq!(
        fs::read_dir(home.path().join("quarantine"))
            .expect("quarantine")
            .count(),
        corrupt.len()
    );

    // The others load and can be changed.
    assert_eq!(report.agents, 2);
    assert_eq!(registry.get(a.id).expect("a loaded"), a);
    assert_eq!(registry.get(b.id).expect("b loaded"), b);
    registry
        .set_title(b.id, Some("renamed".to_string()))
        .await
        .expect("set_title after a quarantine");
    registry
        .archive(a.id, ArchiveOptions::default())
        .await
        .expect("archive after a quarantine");
    assert_eq!(
        read_json(&agent_path(home.path(), &b))["title"],
        json!("renamed")
    );
    drop(registry);

    // What went to quarantine stays there: the next boot is clean.
    let (registry, report) = open(home.path()).await;
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    assert_eq!(registry.agent_count(), 2);
    assert!(registry.get(b.id).expect("b").is_archived());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_survive_a_rewrite() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = created(&registry, cwd.path(), "a", None).await;
    registry
        .set_config(
            a.id,
            ProviderConfig {
                model: Some("opus".to_string()),
                mode: None,
                ..ProviderConfig::default()
            },
        )
        .await
        .expect("config");
    registry
        .set_resume_handle(
            a.id,
            Some(ResumeHandle {
                acp_session_id: "s-1".to_string(),
            }),
        )
        .await
        .expect("resume handle");
    drop(registry);

    // New keys at the top level (a scalar, and an object with nesting), and new keys inside
    // objects this version does know.
    let path = agent_path(home.path(), &a);
    let mut doc = read_json(&path);
    let future_scalar = json!("written by a newer drover");
    let future_nested =
        json!({"budget": {"tokens": 1200, "limits": [1, 2, {"deep": null}]}, "on": true});
    doc["futureScalar"] = future_scalar.clone();
    doc["futureNested"] = future_nested.clone();
    doc["config"]["reasoningEffort"] = json!("high");
    doc["resumeHandle"]["transcript"] = json!({"offset": 42});
    write_json(&path, &doc);

    let (registry, report) = open(home.path()).await;
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    registry
        .set_title(a.id, Some("rewritten".to_string()))
        .await
        .expect("set_title");
    // Boot brought it back `idle` (it was `initializing`), which rewrote it once already.
    assert_eq!(report.interrupted, vec![a.id]);
    registry
        .set_status(a.id, AgentStatus::Running, None)
        .await
        .expect("running");
    registry
        .record_turn_end(a.id, TurnOutcome::Completed)
        .await
        .expect("turn end");

    let doc = read_json(&path);
    assert_eq!(doc["title"], json!("rewritten"), "the rewrite happened");
    assert_eq!(doc["lastStatus"], json!("idle"));
    assert_eq!(doc["futureScalar"], future_scalar, "{doc:#}");
    assert_eq!(doc["futureNested"], future_nested, "{doc:#}");
    assert_eq!(doc["config"]["model"], json!("opus"));
    assert_eq!(doc["config"]["reasoningEffort"], json!("high"), "{doc:#}");
    assert_eq!(doc["resumeHandle"]["acpSessionId"], json!("s-1"));
    assert_eq!(
        doc["resumeHandle"]["transcript"],
        json!({"offset": 42}),
        "{doc:#}"
    );
    drop(registry);

    // And through one more boot (a restart must not lose them either).
    let (registry, _) = open(home.path()).await;
    registry
        .archive(a.id, ArchiveOptions::default())
        .await
        .expect("archive");
    let doc = read_json(&path);
    assert!(doc["archivedAt"].is_string());
    assert_eq!(doc["futureScalar"], future_scalar);
    assert_eq!(doc["futureNested"], future_nested);
    assert_eq!(doc["config"]["reasoningEffort"], json!("high"));
    assert_eq!(doc["resumeHandle"]["transcript"], json!({"offset": 42}));

    // A new config keeps the knobs this version does not know; a new session does not keep
    // what belonged to the old one.
    registry
        .set_config(
            a.id,
            ProviderConfig {
                model: Some("sonnet".to_string()),
                mode: Some("plan".to_string()),
                ..ProviderConfig::default()
            },
        )
        .await
        .expect("config");
    registry
        .set_resume_handle(
            a.id,
            Some(ResumeHandle {
                acp_session_id: "s-2".to_string(),
            }),
        )
        .await
        .expect("resume handle");
    let doc = read_json(&path);
    assert_eq!(
        doc["config"],
        json!({"model": "sonnet", "modeId": "plan", "permissionPolicy": "ask", "reasoningEffort": "high"})
    );
    assert_eq!(doc["resumeHandle"], json!({"acpSessionId": "s-2"}));
    assert_eq!(doc["futureNested"], future_nested);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_newer_version_are_left_alone() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = created(&registry, cwd.path(), "a", None).await;
    let b = created(&registry, cwd.path(), "b", None).await;
    let c = created(&registry, cwd.path(), "c", None).await;
    drop(registry);

    // `a`: version 99 that still fits today's schema; `b`: version 99 whose schema moved on
    // (a renamed required field), which must not be called damaged.
    let path_a = agent_path(home.path(), &a);
    let mut doc = read_json(&path_a);
    doc["version"] = json!(99);
    write_json(&path_a, &doc);
    let path_b = agent_path(home.path(), &b);
    let mut doc = read_json(&path_b);
    doc["version"] = json!(99);
    let status = doc.as_object_mut().expect("object").remove("lastStatus");
    doc["statusV99"] = json!({"was": status});
    write_json(&path_b, &doc);
    let before_a = fs::read(&path_a).expect("read a");
    let before_b = fs::read(&path_b).expect("read b");

    let (registry, report) = open(home.path()).await;
    let mut skipped = report.skipped_newer.clone();
    skipped.sort();
    let mut expected = vec![path_a.clone(), path_b.clone()];
    expected.sort();
    assert_eq!(skipped, expected, "BootReport.skipped_newer");
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    assert!(registry.get(a.id).is_none(), "a newer record is not loaded");
    assert!(registry.get(b.id).is_none(), "a newer record is not loaded");
    assert_eq!(report.agents, 1);

    // Writing the others does not touch them.
    registry
        .set_title(c.id, Some("c2".to_string()))
        .await
        .expect("set_title c");
    assert!(matches!(
        registry.set_title(a.id, Some("x".to_string())).await,
        Err(RegistryError::UnknownAgent(_))
    ));
    drop(registry);
    let (_, report) = open(home.path()).await;
    assert_eq!(report.skipped_newer.len(), 2);
    assert_eq!(fs::read(&path_a).expect("read a"), before_a);
    assert_eq!(fs::read(&path_b).expect("read b"), before_b);
    assert_eq!(
        fs::read_dir(home.path().join("quarantine"))
            .expect("quarantine")
            .count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_temp_files_are_removed_at_boot_and_never_loaded() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = created(&registry, cwd.path(), "a", None).await;
    let ws = registry.workspaces().pop().expect("workspace");
    drop(registry);

    let path_a = agent_path(home.path(), &a);
    let dir = path_a.parent().expect("folder");
    let before = fs::read(&path_a).expect("read a");

    // A finished temp of a rewrite of `a` (titled differently), a temp holding a whole other
    // agent, a torn one, and temps of a workspace and a journal: none was acknowledged.
    let mut rewrite = read_json(&path_a);
    rewrite["title"] = json!("never acknowledged");
    let mut other = read_json(&path_a);
    let other_id = AgentId::new();
    other["id"] = json!(other_id.to_string());
    let ws_path = home
        .path()
        .join("workspaces")
        .join(format!("{}.json", ws.id));
    let leftovers = [
        (
            dir.join(format!(".{}.json.tmp-123-4", a.id)),
            serde_json::to_vec(&rewrite).expect("encode"),
        ),
        (
            dir.join(format!(".{other_id}.json.tmp-123-5")),
            serde_json::to_vec(&other).expect("encode"),
        ),
        (
            dir.join(format!(".{}.json.tmp-99999-0", AgentId::new())),
            b"{\"version\": 1, \"id\": ".to_vec(),
        ),
        (
            home.path()
                .join("workspaces")
                .join(format!(".{}.json.tmp-123-6", ws.id)),
            fs::read(&ws_path).expect("read workspace"),
        ),
        (
            home.path()
                .join("journal")
                .join(format!(".archive-{}.json.tmp-123-7", a.id)),
            serde_json::to_vec(&json!({
                "version": 1,
                "root": a.id.to_string(),
                "archivedAt": "2025-01-02T03:04:05Z",
                "agents": [a.id.to_string()],
            }))
            .expect("encode"),
        ),
    ];
    for (path, bytes) in &leftovers {
        fs::write(path, bytes).expect("write leftover");
    }

    let (registry, report) = open(home.path()).await;
    for (path, _) in &leftovers {
        assert!(!path.exists(), "{} was not removed", path.display());
    }
    assert!(temp_files(home.path()).is_empty());
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    assert_eq!(report.cascades_completed, 0, "a temp journal was replayed");
    assert_eq!(report.agents, 1);
    assert!(registry.get(other_id).is_none());
    let loaded = registry.get(a.id).expect("a");
    assert_eq!(loaded.title.as_deref(), Some("a"));
    assert!(!loaded.is_archived());
    // `a` was busy (`initializing`) so boot rewrote it; apart from that it is as it was.
    let mut expected: Value = serde_json::from_slice(&before).expect("parse");
    let now = read_json(&path_a);
    for key in [
        "lastStatus",
        "updatedAt",
        "requiresAttention",
        "attentionReason",
        "attentionTimestamp",
    ] {
        expected[key] = now[key].clone();
    }
    assert_eq!(now, expected);
}

// ---- writes -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_atomic_and_land_where_the_layout_says() {
    let home = TempDir::new().expect("home");
    let cwd1 = TempDir::new().expect("cwd1");
    let cwd2 = TempDir::new().expect("cwd2");
    let (registry, _) = open(home.path()).await;

    let mut ids = Vec::new();
    for i in 0..12 {
        let cwd = if i % 2 == 0 { cwd1.path() } else { cwd2.path() };
        let parent = (i >= 3).then(|| ids[i % 3]);
        let agent = registry
            .create_agent(new_agent(cwd, &format!("agent {i}"), parent))
            .await
            .expect("create");
        ids.push(agent.id);
    }
    for round in 0..10 {
        for (i, id) in ids.iter().enumerate() {
            let id = *id;
            registry
                .set_title(id, Some(format!("title {round}/{i}")))
                .await
                .expect("set_title");
            let status = registry.get(id).expect("agent").status;
            let archived = registry.get(id).expect("agent").is_archived();
            match status {
                AgentStatus::Initializing => {
                    registry
                        .set_status(id, AgentStatus::Idle, None)
                        .await
                        .expect("idle");
                }
                AgentStatus::Idle if !archived && registry.check_turn_gate(id).is_ok() => {
                    registry
                        .set_status(id, AgentStatus::Running, None)
                        .await
                        .expect("running");
                }
                AgentStatus::Running => {
                    registry
                        .record_turn_end(id, TurnOutcome::Completed)
                        .await
                        .expect("turn end");
                }
                _ => {}
            }
        }
        let root = ids[round % 3];
        registry
            .archive(
                root,
                ArchiveOptions {
                    stop_activity: true,
                },
            )
            .await
            .expect("archive");
        for id in &ids {
            if registry.get(*id).expect("agent").is_archived() && round % 2 == 0 {
                registry.unarchive(*id).await.expect("unarchive");
            }
        }
        if round == 5 {
            registry.detach(ids[7]).await.expect("detach");
        }
    }

    assert!(
        temp_files(home.path()).is_empty(),
        "{:?}",
        temp_files(home.path())
    );
    let all = files_under(&home.path().join("agents"));
    assert_eq!(all.len(), ids.len(), "{:?}", all.keys());
    for agent in registry.agents() {
        let path = agent_path(home.path(), &agent);
        let bytes = all
            .get(&path)
            .unwrap_or_else(|| panic!("{} missing", path.display()));
        let doc: Value = serde_json::from_slice(bytes).expect("valid JSON");
        assert_eq!(doc["version"], json!(1), "{}", path.display());
        assert_eq!(doc["id"], json!(agent.id.to_string()));
        assert_eq!(doc["cwd"], json!(agent.cwd));
        assert_eq!(doc["title"], json!(agent.title));
        assert_eq!(doc["lastStatus"], json!(agent.status.as_str()));
        assert_eq!(doc["archivedAt"].is_string(), agent.is_archived());
    }
    assert!(
        fs::read_dir(home.path().join("journal"))
            .expect("journal")
            .next()
            .is_none(),
        "a finished cascade left its journal"
    );
    // What is in memory is what is on disk.
    let before = registry.agents();
    drop(registry);
    let (registry, report) = open(home.path()).await;
    assert!(
        report
            .interrupted
            .iter()
            .all(|id| before.iter().any(|a| a.id == *id && a.status.is_busy()))
    );
    for (old, new) in before.iter().zip(registry.agents()) {
        if report.interrupted.contains(&old.id) {
            continue;
        }
        assert_eq!(*old, new);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_workspace_record_is_restored_for_its_agents() {
    let home = TempDir::new().expect("home");
    let cwd1 = TempDir::new().expect("cwd1");
    let cwd2 = TempDir::new().expect("cwd2");
    let (registry, _) = open(home.path()).await;
    let a = create(&registry, cwd1.path(), "a", None).await;
    let b = create(&registry, cwd1.path(), "b", Some(a.id)).await;
    let c = create(&registry, cwd2.path(), "c", None).await;
    assert_eq!(a.workspace_id, b.workspace_id);
    assert_ne!(a.workspace_id, c.workspace_id);
    drop(registry);

    for path in files_under(&home.path().join("workspaces")).into_keys() {
        fs::remove_file(path).expect("remove workspace");
    }

    let (registry, report) = open(home.path()).await;
    assert_eq!(report.workspaces_restored, 2);
    assert_eq!(report.workspaces, 2);
    for agent in [&a, &c] {
        let ws = registry
            .workspace(agent.workspace_id)
            .expect("workspace restored under the same id");
        assert_eq!(ws.path, agent.cwd);
        let path = home
            .path()
            .join("workspaces")
            .join(format!("{}.json", agent.workspace_id));
        assert_eq!(
            read_json(&path)["id"],
            json!(agent.workspace_id.to_string())
        );
    }
    assert_eq!(registry.get(b.id).expect("b").workspace_id, a.workspace_id);
    // Agents still join it by cwd.
    let d = create(&registry, cwd1.path(), "d", None).await;
    assert_eq!(d.workspace_id, a.workspace_id);
    drop(registry);

    let (_, report) = open(home.path()).await;
    assert_eq!(report.workspaces_restored, 0);
}

// ---- the archive journal ----------------------------------------------------------------------

/// Which of a cut-short cascade's records reached the disk before the crash.
#[derive(Debug, Clone, Copy)]
enum Written {
    None,
    RootOnly,
    All,
}

async fn replay_case(written: Written) {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let parent = create(&registry, cwd.path(), "parent", None).await;
    let c1 = create(&registry, cwd.path(), "c1", Some(parent.id)).await;
    let c2 = create(&registry, cwd.path(), "c2", Some(parent.id)).await;
    let g = create(&registry, cwd.path(), "g", Some(c1.id)).await;
    let other = create(&registry, cwd.path(), "other", None).await;
    for id in [parent.id, c1.id, other.id] {
        registry
            .set_status(id, AgentStatus::Idle, None)
            .await
            .expect("idle");
    }
    registry
        .set_status(c1.id, AgentStatus::Running, None)
        .await
        .expect("c1 running");
    drop(registry);

    let archived_at = "2025-01-02T03:04:05.123Z";
    let cascade = [parent.id, c1.id, c2.id, g.id];
    write_json(
        &journal_path(home.path(), parent.id),
        &json!({
            "version": 1,
            "root": parent.id.to_string(),
            "archivedAt": archived_at,
            "agents": cascade.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
    );
    let by_hand: &[AgentId] = match written {
        Written::None => &[],
        Written::RootOnly => &cascade[..1],
        Written::All => &cascade,
    };
    for agent in [&parent, &c1, &c2, &g] {
        if by_hand.contains(&agent.id) {
            let path = agent_path(home.path(), agent);
            let mut doc = read_json(&path);
            doc["archivedAt"] = json!(archived_at);
            doc["updatedAt"] = json!(archived_at);
            if doc["lastStatus"] == json!("running") || doc["lastStatus"] == json!("initializing") {
                doc["lastStatus"] = json!("idle");
            }
            write_json(&path, &doc);
        }
    }

    let (registry, report) = open(home.path()).await;
    assert_eq!(report.cascades_completed, 1, "{written:?}");
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    assert!(
        !journal_path(home.path(), parent.id).exists(),
        "the journal was not removed"
    );
    let at: jiff::Timestamp = archived_at.parse().expect("timestamp");
    for id in cascade {
        let agent = registry.get(id).expect("agent");
        assert_eq!(agent.archived_at, Some(at), "{written:?}: {id}");
        assert!(
            !agent.status.is_busy(),
            "{written:?}: {id} is {}",
            agent.status
        );
        let doc = read_json(&agent_path(home.path(), &agent));
        assert_eq!(
            doc["archivedAt"]
                .as_str()
                .and_then(|s| s.parse::<jiff::Timestamp>().ok()),
            Some(at),
            "{written:?}: the file of {id}"
        );
    }
    let other_now = registry.get(other.id).expect("other");
    assert!(
        !other_now.is_archived(),
        "an agent outside the journal was archived"
    );
    // The turn gate sees the replayed archive.
    assert!(registry.check_turn_gate(g.id).is_err());
    drop(registry);

    let (_, report) = open(home.path()).await;
    assert_eq!(report.cascades_completed, 0, "{written:?}: replayed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_finishes_a_cascade_cut_short_before_any_record() {
    replay_case(Written::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_finishes_a_cascade_cut_short_after_the_root() {
    replay_case(Written::RootOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_removes_the_journal_of_a_cascade_that_was_fully_written() {
    replay_case(Written::All).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_naming_unknown_agents_is_finished_with_the_known_ones() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = create(&registry, cwd.path(), "a", None).await;
    drop(registry);
    let gone = AgentId::new();
    write_json(
        &journal_path(home.path(), a.id),
        &json!({
            "version": 1,
            "root": a.id.to_string(),
            "archivedAt": "2025-01-02T03:04:05Z",
            "agents": [a.id.to_string(), gone.to_string()],
        }),
    );
    let (registry, report) = open(home.path()).await;
    assert_eq!(report.cascades_completed, 1);
    assert!(registry.get(a.id).expect("a").is_archived());
    assert!(registry.get(gone).is_none());
    assert!(!journal_path(home.path(), a.id).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_left_behind_never_archives_an_agent_unarchived_since() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let parent = create(&registry, cwd.path(), "parent", None).await;
    let child = create(&registry, cwd.path(), "child", Some(parent.id)).await;
    let outcome = registry
        .archive(parent.id, ArchiveOptions::default())
        .await
        .expect("archive");
    assert_eq!(outcome.archived, vec![parent.id, child.id]);
    // As if removing the cascade's journal had failed.
    let archived_at = registry
        .get(parent.id)
        .expect("parent")
        .archived_at
        .expect("archived");
    write_json(
        &journal_path(home.path(), parent.id),
        &json!({
            "version": 1,
            "root": parent.id.to_string(),
            "archivedAt": archived_at.to_string(),
            "agents": [parent.id.to_string(), child.id.to_string()],
        }),
    );
    registry.unarchive(child.id).await.expect("unarchive");
    drop(registry);

    let (registry, _) = open(home.path()).await;
    assert!(
        !registry.get(child.id).expect("child").is_archived(),
        "the stale journal re-archived the child"
    );
    assert!(registry.get(parent.id).expect("parent").is_archived());
    assert!(!journal_path(home.path(), parent.id).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_newer_journals_are_reported_not_replayed() {
    let home = TempDir::new().expect("home");
    let cwd = TempDir::new().expect("cwd");
    let (registry, _) = open(home.path()).await;
    let a = create(&registry, cwd.path(), "a", None).await;
    drop(registry);
    let newer = journal_path(home.path(), a.id);
    write_json(
        &newer,
        &json!({ "version": 99, "root": a.id.to_string(), "agents": [a.id.to_string()] }),
    );
    let damaged = home
        .path()
        .join("journal")
        .join(format!("archive-{}.json", AgentId::new()));
    fs::write(&damaged, b"{ torn").expect("write damaged journal");

    let (registry, report) = open(home.path()).await;
    assert!(
        !registry.get(a.id).expect("a").is_archived(),
        "a newer journal was replayed"
    );
    assert_eq!(report.cascades_completed, 0);
    assert_eq!(report.skipped_newer, vec![newer.clone()]);
    assert!(newer.exists(), "a newer journal is left in place");
    assert_eq!(report.quarantined.len(), 1);
    assert_eq!(report.quarantined[0].original, damaged);
    assert!(!damaged.exists());
}

// ---- a full disk ------------------------------------------------------------------------------

use drover_testkit::disk::{PAGE, Tmpfs, fill};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_mutation_and_changes_nothing() {
    let disk = Tmpfs::mount("256k");
    let home = disk.path.join("home");
    fs::create_dir(&home).expect("home");
    let cwd = TempDir::new().expect("cwd");

    let (registry, _) = open(&home).await;
    let x = create(&registry, cwd.path(), "x", None).await;
    let parent = create(&registry, cwd.path(), "parent", None).await;
    let mut children = Vec::new();
    for i in 0..3 {
        let c = registry
            .create_agent(new_agent(
                cwd.path(),
                &format!("child {i}"),
                Some(parent.id),
            ))
            .await
            .expect("child");
        registry
            .set_status(c.id, AgentStatus::Idle, None)
            .await
            .expect("idle");
        children.push(c.id);
    }
    registry
        .set_status(children[0], AgentStatus::Running, None)
        .await
        .expect("running");
    let cascade: Vec<AgentId> = std::iter::once(parent.id).chain(children.clone()).collect();

    // One-page reserves, freed one at a time below so a cascade gets further each time.
    let reserves: Vec<PathBuf> = (0..cascade.len())
        .map(|i| disk.path.join(format!("reserve-{i}")))
        .collect();
    for r in &reserves {
        fs::write(r, vec![0_u8; PAGE]).expect("reserve");
    }
    let filler = disk.path.join("filler");
    fill(&filler);

    let mut events = registry.subscribe();
    let agents_before = registry.agents();
    let files_before = store_files(&home);
    let unchanged = |what: &str| {
        assert_eq!(registry.agents(), agents_before, "{what}: memory changed");
        assert!(
            temp_files(&home).is_empty(),
            "{what}: temp files left: {:?}",
            temp_files(&home)
        );
        assert_same_files(&files_before, &store_files(&home), what);
    };

    // A single record.
    let e = store_error(
        registry.set_title(x.id, Some("never".to_string())).await,
        "set_title on a full disk",
    );
    let x_path = agent_path(&home, &x);
    assert_eq!(e.path(), x_path);
    assert!(
        e.to_string().contains(&x_path.display().to_string()),
        "the message names the file: {e}"
    );
    assert!(e.to_string().contains("No space left"), "{e}");
    unchanged("set_title");

    // A new record (in a cwd whose workspace and folder exist).
    let e = store_error(
        registry
            .create_agent(new_agent(cwd.path(), "new", Some(parent.id)))
            .await,
        "create_agent on a full disk",
    );
    let folder = x_path.parent().expect("folder");
    assert_eq!(e.path().parent(), Some(folder), "{e}");
    let stem = e
        .path()
        .file_stem()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    let new_id: AgentId = stem
        .parse()
        .expect("the file is named by the new agent's id");
    assert!(registry.get(new_id).is_none());
    assert!(
        e.to_string().contains(&e.path().display().to_string()),
        "{e}"
    );
    unchanged("create_agent");

    // A cascade over a parent and its three children, with 0..=4 pages free: it needs one for
    // the journal and one per record, so it fails first on the journal, then on each record in
    // turn, and must roll back whatever it had staged.
    for free in 0..=cascade.len() {
        if free > 0 {
            fs::remove_file(&reserves[free - 1]).expect("free a page");
        }
        let e = store_error(
            registry
                .archive(
                    parent.id,
                    ArchiveOptions {
                        stop_activity: true,
                    },
                )
                .await,
            &format!("archive on a full disk ({free} pages free)"),
        );
        let expected = match free {
            0 => journal_path(&home, parent.id),
            n => agent_path(&home, &registry.get(cascade[n - 1]).expect("agent")),
        };
        assert_eq!(e.path(), expected, "{free} pages free: {e}");
        assert!(
            e.to_string().contains(&expected.display().to_string()),
            "the message names the file: {e}"
        );
        unchanged(&format!("archive with {free} pages free"));
        assert!(
            !journal_path(&home, parent.id).exists(),
            "a failed cascade left its journal"
        );
    }
    assert!(
        matches!(
            events.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "a failed mutation was announced"
    );

    // With room again, the same mutations succeed.
    fs::remove_file(&filler).expect("remove filler");
    let x2 = registry
        .set_title(x.id, Some("now".to_string()))
        .await
        .expect("set_title with room");
    assert_eq!(read_json(&x_path)["title"], json!("now"));
    assert_eq!(x2.title.as_deref(), Some("now"));
    let created = created(&registry, cwd.path(), "new", Some(parent.id)).await;
    assert!(agent_path(&home, &created).exists());
    let outcome = registry
        .archive(
            parent.id,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await
        .expect("archive with room");
    let mut expected: Vec<AgentId> = cascade.clone();
    expected.push(created.id);
    assert_eq!(outcome.archived, expected);
    for id in &expected {
        let agent = registry.get(*id).expect("agent");
        assert!(agent.is_archived());
        assert!(read_json(&agent_path(&home, &agent))["archivedAt"].is_string());
    }
    assert!(temp_files(&home).is_empty());
    assert!(!journal_path(&home, parent.id).exists());
    drop(registry);
    let (registry, report) = open(&home).await;
    assert!(report.quarantined.is_empty());
    assert_eq!(report.cascades_completed, 0);
    assert_eq!(registry.agent_count(), 6);
}

// ---- properties -------------------------------------------------------------------------------

proptest! {
    /// Any cwd becomes one safe, bounded folder name, the same every time.
    #[test]
    fn cwd_folder_names_are_single_safe_components(cwd in "/[^\u{0}]{0,300}") {
        let name = cwd_dir_name(Path::new(&cwd));
        prop_assert!(!name.is_empty());
        prop_assert!(name.len() <= 200, "{} bytes", name.len());
        prop_assert!(name != "." && name != "..");
        prop_assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
            "{name:?}"
        );
        prop_assert_eq!(Path::new(&name).components().count(), 1);
        prop_assert_eq!(name.clone(), cwd_dir_name(Path::new(&cwd)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever a title or a label holds, it reads back as written after a restart.
    #[test]
    fn titles_and_labels_survive_a_restart(
        title in "\\PC{1,40}",
        labels in proptest::collection::btree_map("[a-z][a-z0-9.-]{0,12}", "\\PC{0,20}", 0..4),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let home = TempDir::new().expect("home");
            let cwd = TempDir::new().expect("cwd");
            let (registry, _) = open(home.path()).await;
            let mut new = new_agent(cwd.path(), &title, None);
            new.labels = labels.clone();
            let a = registry.create_agent(new).await.expect("create");
            drop(registry);
            let (registry, report) = open(home.path()).await;
            assert!(report.quarantined.is_empty());
            let b = registry.get(a.id).expect("loaded");
            assert_eq!(b.title, a.title);
            assert_eq!(b.labels, labels);
        });
    }
}
