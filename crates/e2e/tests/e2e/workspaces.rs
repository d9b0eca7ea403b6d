//! Workspaces and worktrees for every client, through the real daemon: the protocol's
//! `list_workspaces`, `create_worktree`, `get_worktree_status`, `archive_workspace` and
//! `create_agent` with `worktree`; and a failed creation (over MCP or the protocol) that
//! leaves no worktree, branch or workspace record behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, string_at};
use drover_testkit::wait::eventually;
use drover_testkit::{git, git_lines, git_repository};
use serde_json::{Value, json};

/// A git repository with one commit, in the daemon's cwd.
fn repository(daemon: &TestDaemon) -> PathBuf {
    let repo = daemon.cwd();
    git_repository(&repo, &[("README", "hello\n")]);
    repo
}

fn branches(repo: &Path) -> Vec<String> {
    git_lines(repo, &["branch", "--list", "--format=%(refname:short)"])
}

/// The paths `git worktree list` shows.
fn worktrees(repo: &Path) -> Vec<String> {
    git_lines(repo, &["worktree", "list", "--porcelain"])
        .iter()
        .filter_map(|l| l.strip_prefix("worktree "))
        .map(str::to_string)
        .collect()
}

/// The workspace records on disk.
fn workspace_files(daemon: &TestDaemon) -> usize {
    std::fs::read_dir(daemon.home.join("workspaces")).map_or(0, |d| d.flatten().count())
}

async fn workspaces(client: &mut Client, all: bool) -> Vec<Value> {
    let answer = client
        .request(json!({"type": "list_workspaces", "includeArchived": all}))
        .await;
    assert_eq!(answer["type"], "workspaces", "{answer}");
    answer["payload"]["workspaces"]
        .as_array()
        .expect("workspaces")
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_makes_inspects_and_archives_a_worktree() {
    let daemon = TestDaemon::start().await;
    let repo = repository(&daemon);
    let (mut client, _) = daemon.client().await;
    assert!(workspaces(&mut client, false).await.is_empty());

    let made = client
        .request(json!({"type": "create_worktree", "repository": repo, "name": "feature", "base": "main"}))
        .await;
    assert_eq!(made["type"], "worktree_created", "{made}");
    let ws = made["payload"]["workspace"].clone();
    assert_eq!(ws["kind"], "worktree");
    assert_eq!(ws["worktree"]["branch"], "drover/feature");
    assert_eq!(ws["worktree"]["base"], "main");
    let id = ws["id"].as_str().expect("id").to_string();
    let path = PathBuf::from(ws["path"].as_str().expect("path"));
    assert!(
        path.join("README").exists(),
        "the worktree holds the checkout"
    );
    assert!(branches(&repo).contains(&"drover/feature".to_string()));

    // Listed, with its activity; clean.
    let listed = workspaces(&mut client, false).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["worktree"]["source"], repo.display().to_string());
    let status = client
        .request(json!({"type": "get_worktree_status", "workspaceId": id}))
        .await;
    assert_eq!(status["type"], "worktree_status", "{status}");
    assert_eq!(status["payload"]["status"]["uncommittedCount"], 0);
    assert_eq!(status["payload"]["status"]["unpushedCount"], 0);

    // Work in it: an uncommitted file, then a commit nobody else has.
    std::fs::write(path.join("notes.txt"), "wip\n").expect("write");
    let status = client
        .request(json!({"type": "get_worktree_status", "workspaceId": id}))
        .await;
    assert_eq!(
        status["payload"]["status"]["uncommitted"],
        json!(["?? notes.txt"]),
        "{status}"
    );
    git(&path, &["add", "notes.txt"]);
    git(&path, &["commit", "-q", "-m", "notes"]);
    let status = client
        .request(json!({"type": "get_worktree_status", "workspaceId": id}))
        .await;
    assert_eq!(status["payload"]["status"]["unpushedCount"], 1, "{status}");

    // Archiving is refused with what would be lost; nothing changes.
    let refused = client
        .request(json!({"type": "archive_workspace", "workspaceId": id}))
        .await;
    assert_eq!(refused["type"], "request_error", "{refused}");
    assert_eq!(refused["payload"]["code"], "worktree_dirty");
    let unpushed = refused["payload"]["details"]["unpushed"][0]
        .as_str()
        .unwrap_or_default();
    assert!(unpushed.ends_with(" notes"), "{refused}");
    assert!(path.exists());
    assert!(workspaces(&mut client, false).await.len() == 1);

    // Forced: removed; the branch with its unmerged commit is kept.
    let archived = client
        .request(json!({"type": "archive_workspace", "workspaceId": id, "force": true}))
        .await;
    assert_eq!(archived["type"], "workspace_archived", "{archived}");
    assert_eq!(archived["payload"]["alreadyArchived"], false);
    assert_eq!(archived["payload"]["worktree"]["removed"], true);
    assert_eq!(archived["payload"]["worktree"]["branchDeleted"], false);
    assert!(!path.exists(), "the worktree is removed");
    assert!(branches(&repo).contains(&"drover/feature".to_string()));
    assert!(workspaces(&mut client, false).await.is_empty());
    let all = workspaces(&mut client, true).await;
    assert!(all[0]["archivedAt"].is_string(), "{all:?}");

    // Again: nothing to do, and it says so.
    let again = client
        .request(json!({"type": "archive_workspace", "workspaceId": id}))
        .await;
    assert_eq!(again["payload"]["alreadyArchived"], true, "{again}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_requests_name_what_is_wrong() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let not_a_repo = client
        .request(json!({"type": "create_worktree", "repository": daemon.cwd()}))
        .await;
    assert_eq!(
        not_a_repo["payload"]["code"], "not_a_git_repository",
        "{not_a_repo}"
    );
    for (request, code) in [
        (
            json!({"type": "get_worktree_status", "workspaceId": "nope"}),
            "unknown_workspace",
        ),
        (
            json!({"type": "get_worktree_status", "workspaceId": "0193b1c2-7d40-7000-8000-00000000abcd"}),
            "unknown_workspace",
        ),
        (
            json!({"type": "archive_workspace", "workspaceId": "nope"}),
            "unknown_workspace",
        ),
        (json!({"type": "create_worktree"}), "invalid_message"),
    ] {
        let answer = client.request(request.clone()).await;
        assert_eq!(answer["payload"]["code"], code, "{request} → {answer}");
    }
    // A plain directory's workspace is not a worktree.
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    let ws = created["payload"]["agent"]["workspaceId"].clone();
    let answer = client
        .request(json!({"type": "get_worktree_status", "workspaceId": ws}))
        .await;
    assert_eq!(answer["payload"]["code"], "not_a_worktree", "{answer}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_in_a_new_worktree_from_the_protocol() {
    let daemon = TestDaemon::start().await;
    let repo = repository(&daemon);
    let (mut client, _) = daemon.client().await;
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": repo, "prompt": "cwd", "worktree": {"name": "task"}, "autoArchive": true}))
        .await;
    assert_eq!(created["type"], "agent_created", "{created}");
    let agent = created["payload"]["agent"].clone();
    let id = agent["id"].as_str().expect("id").to_string();
    let cwd = PathBuf::from(agent["cwd"].as_str().expect("cwd"));
    assert!(cwd.starts_with(daemon.home.join("worktrees")), "{cwd:?}");
    assert_eq!(
        agent["labels"]["drover.created-workspace"], agent["workspaceId"],
        "{agent}"
    );
    // The agent ran in the worktree, then autoArchive took the worktree with it.
    client.wait_idle(&id).await;
    let said = client.replies(&id).await;
    assert_eq!(said, [cwd.display().to_string()]);
    eventually(
        "the worktree removed with its autoArchived agent",
        Duration::from_secs(20),
        async || !cwd.exists(),
    )
    .await;
    // A worktree with `workspaceId` is refused.
    let refused = client
        .request(json!({"type": "create_agent", "provider": "scripted", "workspaceId": agent["workspaceId"], "worktree": {}}))
        .await;
    assert_eq!(refused["payload"]["code"], "invalid_message", "{refused}");
    daemon.stop().await;
}

/// NEWCOMER.md item 1: a `create_agent` in a new worktree that fails leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_in_a_new_worktree_leaves_nothing_behind() {
    let daemon = TestDaemon::start().await;
    let repo = repository(&daemon);
    let (mut client, _) = daemon.client().await;
    let before = (branches(&repo), worktrees(&repo));

    // Over MCP: an agent asks for a worktree and a provider that does not exist.
    let call = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "create", "source": {"kind": "worktree", "name": "orphan"}}, "provider": "nope"}"#;
    let lead = client
        .request(
            json!({"type": "create_agent", "provider": "scripted", "cwd": repo, "prompt": call}),
        )
        .await;
    let lead = string_at(&lead["payload"]["agent"]["id"]);
    client.wait_idle(&lead).await;
    let said = client.replies(&lead).await.concat();
    assert!(
        said.contains("mcp create_agent error: unknown provider `nope`")
            && said.contains("code: unknown_provider"),
        "the agent reads the message and the code: {said}"
    );
    let records = workspace_files(&daemon);
    assert_eq!(records, 1, "only the lead's workspace is recorded");

    // Over the protocol: an unknown provider, an unknown parent, a reserved label.
    for request in [
        json!({"type": "create_agent", "provider": "nope", "cwd": repo, "worktree": {"name": "orphan"}}),
        json!({"type": "create_agent", "provider": "scripted", "cwd": repo, "worktree": {"name": "orphan"}, "parentAgentId": "0193b1c2-7d40-7000-8000-00000000abcd"}),
        json!({"type": "create_agent", "provider": "scripted", "cwd": repo, "worktree": {"name": "orphan"}, "labels": {"drover.created-workspace": "x"}}),
    ] {
        let answer = client.request(request.clone()).await;
        assert_eq!(answer["type"], "request_error", "{request} → {answer}");
    }
    assert_eq!(
        (branches(&repo), worktrees(&repo)),
        before,
        "no branch, no worktree"
    );
    assert!(
        !daemon.home.join("worktrees").exists()
            || std::fs::read_dir(daemon.home.join("worktrees"))
                .expect("dir")
                .flatten()
                .all(|project| std::fs::read_dir(project.path())
                    .map_or(true, |mut d| d.next().is_none())),
        "no worktree folder"
    );
    assert_eq!(workspace_files(&daemon), records, "no workspace record");
    assert_eq!(workspaces(&mut client, true).await.len(), records);
    daemon.stop().await;
}

/// An agent asks for a new agent in a directory of its own, and the agent cannot be recorded:
/// the new directory's workspace record goes with it; the directory, the user's, stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_in_a_new_directory_leaves_no_workspace_and_keeps_the_directory() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let dir = std::fs::canonicalize(elsewhere.path()).expect("canonical");
    std::fs::write(dir.join("notes.txt"), "mine\n").expect("write");
    // A file where the store keeps that directory's agents: writing the agent fails.
    let agents = daemon
        .home
        .join("agents")
        .join(drover_core::store::cwd_dir_name(&dir));
    std::fs::write(&agents, "in the way\n").expect("block");

    let call = format!(
        r#"mcp create_agent {{"relationship": {{"kind": "detached"}}, "workspace": {{"kind": "create", "source": {{"kind": "directory", "path": "{}"}}}}, "prompt": "say hi"}}"#,
        dir.display()
    );
    let lead = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": call}))
        .await;
    client.wait_idle(&lead).await;
    let said = client.replies(&lead).await.concat();
    assert!(said.contains("mcp create_agent error: "), "{said}");
    let records = workspace_files(&daemon);
    assert_eq!(records, 1, "only the lead's workspace is recorded");
    let listed = workspaces(&mut client, true).await;
    assert!(
        listed
            .iter()
            .all(|w| w["path"] != dir.display().to_string()),
        "no workspace for the directory: {listed:?}"
    );
    assert_eq!(client.agents(true).await.len(), 1, "only the lead");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).expect("the user's file"),
        "mine\n"
    );

    // Once the store can write there, the same call makes the agent and its workspace.
    std::fs::remove_file(&agents).expect("unblock");
    client
        .request(json!({"type": "send_message", "agentId": lead, "text": call}))
        .await;
    let made = eventually("the second create", Duration::from_secs(20), async || {
        let said = client.replies(&lead).await;
        said.last()
            .filter(|s| s.starts_with("mcp create_agent: "))
            .cloned()
    })
    .await;
    assert!(made.contains(&dir.display().to_string()), "{made}");
    assert_eq!(workspace_files(&daemon), 2);
    daemon.stop().await;
}

/// Neither `cwd` nor `workspaceId`: the operation's refusal, as the protocol answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_with_neither_cwd_nor_workspace_is_refused() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let refused = client
        .request(json!({"type": "create_agent", "provider": "scripted", "prompt": "say hi"}))
        .await;
    assert_eq!(refused["type"], "request_error", "{refused}");
    assert_eq!(refused["payload"]["code"], "invalid_message", "{refused}");
    let message = refused["payload"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("give `cwd` or `workspaceId`"), "{refused}");
    assert!(client.agents(true).await.is_empty());
    assert_eq!(workspace_files(&daemon), 0);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tool_errors_carry_the_protocol_codes() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let other = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    let other = string_at(&other["payload"]["agent"]["id"]);
    let script = format!(
        "mcp cancel_agent {{\"agentId\": \"{other}\"}}\nmcp get_agent {{\"agentId\": \"nope\"}}\nmcp archive_worktree {{\"workspaceId\": \"nope\"}}"
    );
    let caller = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": script}))
        .await;
    let caller = string_at(&caller["payload"]["agent"]["id"]);
    client.wait_idle(&caller).await;
    let said: String = client
        .timeline(&caller)
        .await
        .iter()
        .filter(|i| i["kind"] == "agent_message")
        .filter_map(|i| i["data"]["text"].as_str().map(str::to_string))
        .collect::<Vec<_>>()
        .join("\n");
    for code in [
        "code: not_permitted",
        "code: unknown_agent",
        "code: unknown_workspace",
    ] {
        assert!(said.contains(code), "{code} missing from: {said}");
    }
    daemon.stop().await;
}
