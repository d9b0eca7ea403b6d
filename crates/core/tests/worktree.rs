//! Git worktrees through the registry, against real git repositories in temp folders: creation
//! (branch, folder, base, copied files, setup and its failure), agents in a worktree, archive
//! refused for uncommitted or unpushed work, forced archive with teardown, a worktree that
//! vanished outside drover, and concurrent creations.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Fixture, WAIT, idle, new_agent, read_json, running, write_json};
use drover_core::{
    AgentStatus, ArchiveOptions, CreatedWorktree, NewAgent, Registry, RegistryError, Workspace,
    WorkspaceKind, WorktreeError, WorktreeOptions,
};
use drover_testkit::RuntimeCall;
use tempfile::TempDir;

/// A git repository in a temp folder named `my repo` (a name that needs sanitizing), with one
/// commit on `main`.
struct Repo {
    _tmp: TempDir,
    root: PathBuf,
}

impl Repo {
    fn new() -> Repo {
        Repo::with_project_file(None)
    }

    fn with_project_file(toml: Option<&str>) -> Repo {
        let tmp = tempfile::tempdir().expect("temp repo");
        let root = tmp.path().join("my repo");
        std::fs::create_dir(&root).expect("repo folder");
        git(&root, &["init", "-q", "-b", "main"]);
        write(&root, "README.md", "hello\n");
        write(&root, ".gitignore", ".env\nsetup-ran.txt\n");
        if let Some(toml) = toml {
            write(&root, "drover.toml", toml);
        }
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-q", "-m", "init"]);
        let root = std::fs::canonicalize(&root).expect("canonical repo");
        Repo { _tmp: tmp, root }
    }

    fn git(&self, args: &[&str]) -> String {
        git(&self.root, args)
    }

    fn head(&self) -> String {
        self.git(&["rev-parse", "HEAD"]).trim().to_string()
    }

    fn branches(&self) -> BTreeSet<String> {
        self.git(&["for-each-ref", "--format=%(refname:short)", "refs/heads"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every worktree git knows, the main checkout included.
    fn worktrees(&self) -> Vec<PathBuf> {
        self.git(&["worktree", "list", "--porcelain"])
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .map(PathBuf::from)
            .collect()
    }
}

/// `git -C dir args…` with a test identity and none of the user's configuration; panics with
/// git's output on failure.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = drover_testkit::hermetic::command("git", Path::new("/nonexistent"))
        .args([
            "-c",
            "user.name=drover test",
            "-c",
            "user.email=test@drover.invalid",
            "-c",
            "commit.gpgsign=false",
            "-C",
        ])
        .arg(dir)
        .args(args)
        .output()
        .expect("run git");
    drover_testkit::assert_succeeded(&out, &format!("git {args:?} in {}", dir.display()));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("parent folder");
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn named(name: &str) -> WorktreeOptions {
    WorktreeOptions {
        name: Some(name.to_string()),
        ..WorktreeOptions::default()
    }
}

async fn create(reg: &Registry, repo: &Repo, options: WorktreeOptions) -> CreatedWorktree {
    reg.create_worktree_workspace(repo.root.clone(), options)
        .await
        .unwrap_or_else(|e| panic!("create a worktree: {e}"))
}

fn worktrees_dir(fx: &Fixture) -> PathBuf {
    std::fs::canonicalize(fx.home.path())
        .expect("canonical home")
        .join("worktrees")
}

fn workspace_file(fx: &Fixture, ws: &Workspace) -> PathBuf {
    fx.home
        .path()
        .join("workspaces")
        .join(format!("{}.json", ws.id))
}

fn setup_error(err: RegistryError) -> drover_core::CommandRun {
    assert_eq!(err.code(), "worktree_setup_failed", "{err}");
    match err {
        RegistryError::Worktree(WorktreeError::SetupFailed { run }) => *run,
        other => panic!("not a setup failure: {other}"),
    }
}

/// Nothing of a failed creation is left: no folder, no branch, no git worktree, no record.
fn assert_nothing_left(fx: &Fixture, repo: &Repo) {
    let project = worktrees_dir(fx).join("my-repo");
    let leftovers: Vec<_> = std::fs::read_dir(&project)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    assert_eq!(repo.branches(), BTreeSet::from(["main".to_string()]));
    assert_eq!(repo.worktrees(), std::slice::from_ref(&repo.root));
    assert!(fx.registry.workspaces().is_empty());
    let records: Vec<_> = std::fs::read_dir(fx.home.path().join("workspaces"))
        .expect("workspaces folder")
        .flatten()
        .collect();
    assert!(records.is_empty(), "workspace records left: {records:?}");
}

// ---- create ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_a_worktree_with_its_branch_copied_files_and_setup() {
    let repo = Repo::with_project_file(Some(
        r#"
[worktree]
copy = [".env", "local", "absent.txt", "README.md"]
setup = [
  "echo setting up; echo a warning >&2",
  "printf '%s' \"$DROVER_BRANCH\" > setup-ran.txt",
]
"#,
    ));
    // Untracked in the source: `.env` is ignored, `local/` is not.
    write(&repo.root, ".env", "SECRET=1\n");
    write(&repo.root, "local/notes.txt", "mine\n");
    // The source's own uncommitted edit of a tracked file is not carried over.
    write(&repo.root, "README.md", "edited in the source\n");
    let fx = Fixture::new();
    let reg = &fx.registry;

    let created = create(reg, &repo, named("Fix the flaky test!")).await;
    let ws = &created.workspace;
    let info = ws.worktree.as_ref().expect("worktree info");
    assert_eq!(ws.kind, WorkspaceKind::Worktree);
    assert_eq!(ws.name, "Fix-the-flaky-test");
    assert_eq!(
        ws.path,
        worktrees_dir(&fx)
            .join("my-repo")
            .join("Fix-the-flaky-test")
    );
    assert_eq!(info.source, repo.root);
    assert_eq!(info.branch, "drover/Fix-the-flaky-test");
    assert_eq!(info.base, "main");
    assert_eq!(info.base_commit, repo.head());
    assert_eq!(git(&ws.path, &["rev-parse", "HEAD"]).trim(), repo.head());
    assert_eq!(
        git(&ws.path, &["symbolic-ref", "--short", "HEAD"]).trim(),
        "drover/Fix-the-flaky-test"
    );
    assert!(repo.worktrees().contains(&ws.path));

    // Copied: what the source has and the checkout does not; a tracked file stays as committed.
    assert_eq!(info.copied, [".env", "local"]);
    assert_eq!(
        std::fs::read_to_string(ws.path.join(".env"))
            .ok()
            .as_deref(),
        Some("SECRET=1\n")
    );
    assert!(ws.path.join("local/notes.txt").is_file());
    assert!(!ws.path.join("absent.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.path.join("README.md"))
            .ok()
            .as_deref(),
        Some("hello\n")
    );

    // Setup ran in order, in the worktree, with its output captured.
    assert_eq!(created.setup.len(), 2);
    assert!(created.setup.iter().all(drover_core::CommandRun::succeeded));
    assert!(created.setup[0].output.contains("setting up"));
    assert!(created.setup[0].output.contains("a warning"));
    assert_eq!(
        std::fs::read_to_string(ws.path.join("setup-ran.txt")).ok(),
        Some(info.branch.clone())
    );

    // Fresh: nothing uncommitted (the copied `local/` does not count) and nothing unpushed.
    let status = reg.worktree_status(ws.id).await.expect("status");
    assert!(status.is_clean(), "{}", status.summary());
    assert!(!status.missing);

    // The record carries the worktree, on disk and across a restart.
    let doc = read_json(&workspace_file(&fx, ws));
    assert_eq!(doc["kind"], "worktree");
    assert_eq!(doc["worktree"]["branch"], "drover/Fix-the-flaky-test");
    assert_eq!(doc["worktree"]["base"], "main");
    assert_eq!(doc["worktree"]["baseCommit"], repo.head().as_str());
    assert_eq!(doc["worktree"]["source"], repo.root.display().to_string());
    let (reopened, report, _) = fx.reopen();
    assert!(report.missing_worktrees.is_empty());
    assert_eq!(reopened.workspace(ws.id).as_ref(), Some(ws));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_from_a_chosen_base_and_names_one_when_asked() {
    let repo = Repo::new();
    repo.git(&["checkout", "-q", "-b", "feature"]);
    write(&repo.root, "feature.txt", "f\n");
    repo.git(&["add", "feature.txt"]);
    repo.git(&["commit", "-q", "-m", "feature work"]);
    let feature = repo.head();
    repo.git(&["checkout", "-q", "main"]);
    let fx = Fixture::new();

    let created = create(
        &fx.registry,
        &repo,
        WorktreeOptions {
            base: Some("feature".to_string()),
            branch: Some("agent/try-it".to_string()),
            ..WorktreeOptions::default()
        },
    )
    .await;
    let ws = &created.workspace;
    let info = ws.worktree.as_ref().expect("worktree info");
    assert!(ws.name.starts_with("wt-"), "generated name {}", ws.name);
    assert_eq!(info.branch, "agent/try-it");
    assert_eq!(info.base, "feature");
    assert_eq!(info.base_commit, feature);
    assert!(ws.path.join("feature.txt").is_file());
    // The base's own commits are not the worktree's work.
    let status = fx.registry.worktree_status(ws.id).await.expect("status");
    assert!(status.is_clean(), "{}", status.summary());

    // A detached source HEAD is its own base.
    repo.git(&["checkout", "-q", "--detach", "main"]);
    let detached = create(&fx.registry, &repo, named("detached")).await;
    let info = detached.workspace.worktree.expect("worktree info");
    assert_eq!(info.base, repo.head());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_setup_fails_the_creation_with_its_output_and_leaves_nothing() {
    let repo = Repo::with_project_file(Some(
        "[worktree]\ncopy = [\".env\"]\nsetup = [\"echo preparing\", \"echo boom >&2; exit 3\", \"echo never\"]\n",
    ));
    write(&repo.root, ".env", "SECRET=1\n");
    let fx = Fixture::new();

    let err = fx
        .registry
        .create_worktree_workspace(repo.root.clone(), named("doomed"))
        .await
        .expect_err("setup fails");
    let message = err.to_string();
    let run = setup_error(err);
    assert_eq!(run.command, "echo boom >&2; exit 3");
    assert_eq!(run.exit_code, Some(3));
    assert!(!run.timed_out);
    assert!(run.output.contains("boom"), "{run:?}");
    assert!(
        message.contains("boom") && message.contains("status 3"),
        "{message}"
    );
    assert_nothing_left(&fx, &repo);

    // The name is free again.
    let fixed = Repo::new();
    let again = create(&fx.registry, &fixed, named("doomed")).await;
    assert_eq!(again.workspace.name, "doomed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_that_runs_out_of_time_is_killed_and_leaves_nothing() {
    let repo = Repo::with_project_file(Some(
        "[worktree]\nsetup = [\"echo started; sleep 30 & sleep 30\"]\n",
    ));
    let fx = Fixture::new();
    let started = Instant::now();
    let err = fx
        .registry
        .create_worktree_workspace(
            repo.root.clone(),
            WorktreeOptions {
                name: Some("slow".to_string()),
                setup_timeout: Some(Duration::from_millis(300)),
                ..WorktreeOptions::default()
            },
        )
        .await
        .expect_err("setup times out");
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    let run = setup_error(err);
    assert!(run.timed_out);
    assert_eq!(run.exit_code, None);
    assert!(run.output.contains("started"), "{run:?}");
    assert_nothing_left(&fx, &repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sources_bases_branches_and_project_files_are_refused_by_name() {
    let fx = Fixture::new();
    let reg = &fx.registry;

    let plain = tempfile::tempdir().expect("plain folder");
    let err = reg
        .create_worktree_workspace(plain.path().to_path_buf(), WorktreeOptions::default())
        .await
        .expect_err("not a repository");
    assert_eq!(err.code(), "not_a_git_repository", "{err}");

    let empty = tempfile::tempdir().expect("empty repo");
    git(empty.path(), &["init", "-q"]);
    let err = reg
        .create_worktree_workspace(empty.path().to_path_buf(), WorktreeOptions::default())
        .await
        .expect_err("no commit");
    assert_eq!(err.code(), "not_a_git_repository", "{err}");

    let err = reg
        .create_worktree_workspace(PathBuf::from("relative/path"), WorktreeOptions::default())
        .await
        .expect_err("relative");
    assert!(
        matches!(
            err,
            RegistryError::InvalidInput {
                field: "source",
                ..
            }
        ),
        "{err}"
    );

    let repo = Repo::new();
    let refuse =
        |options: WorktreeOptions| reg.create_worktree_workspace(repo.root.clone(), options);
    let err = refuse(WorktreeOptions {
        base: Some("no-such-branch".to_string()),
        ..WorktreeOptions::default()
    })
    .await
    .expect_err("bad base");
    assert!(
        matches!(
            err,
            RegistryError::Worktree(WorktreeError::InvalidInput { field: "base", .. })
        ),
        "{err}"
    );
    let err = refuse(WorktreeOptions {
        branch: Some("--force".to_string()),
        ..WorktreeOptions::default()
    })
    .await
    .expect_err("option as branch");
    assert_eq!(err.code(), "invalid_input", "{err}");
    let err = refuse(named("///")).await.expect_err("empty name");
    assert_eq!(err.code(), "invalid_input", "{err}");
    let err = refuse(WorktreeOptions {
        branch: Some("main".to_string()),
        ..WorktreeOptions::default()
    })
    .await
    .expect_err("existing branch");
    assert!(
        matches!(
            err,
            RegistryError::Worktree(WorktreeError::InvalidInput {
                field: "branch",
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("main"), "{err}");

    write(
        &repo.root,
        "drover.toml",
        "[worktree]\ncopy = [\"../outside\"]\n",
    );
    let err = refuse(WorktreeOptions::default())
        .await
        .expect_err("bad project file");
    assert_eq!(err.code(), "invalid_project_file", "{err}");
    write(&repo.root, "drover.toml", "[worktree\n");
    let err = refuse(WorktreeOptions::default())
        .await
        .expect_err("unparsable project file");
    assert_eq!(err.code(), "invalid_project_file", "{err}");
    std::fs::remove_file(repo.root.join("drover.toml")).expect("remove");
    assert_nothing_left(&fx, &repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creations_get_unique_names_folders_and_branches_or_are_refused() {
    let repo = Repo::new();
    let fx = Fixture::new();
    let mut tasks = Vec::new();
    for i in 0..12 {
        let reg = fx.registry.clone();
        let root = repo.root.clone();
        // Eight ask for the same name, four for none.
        let options = if i < 8 {
            named("same")
        } else {
            WorktreeOptions::default()
        };
        tasks.push(tokio::spawn(async move {
            reg.create_worktree_workspace(root, options).await
        }));
    }
    let mut names = BTreeSet::new();
    let mut paths = BTreeSet::new();
    let mut branches = BTreeSet::new();
    let mut refused = Vec::new();
    for task in tasks {
        let ws = match task.await.expect("join") {
            Ok(created) => created.workspace,
            Err(e) => {
                refused.push(e);
                continue;
            }
        };
        names.insert(ws.name.clone());
        paths.insert(ws.path.clone());
        branches.insert(ws.worktree.expect("info").branch);
    }
    // One of the eight gets `same`; the others are refused (never `same-2`, a worktree they
    // did not name), saying the name is taken.
    assert_eq!((names.len(), paths.len(), branches.len()), (5, 5, 5));
    assert!(names.contains("same"));
    assert_eq!(refused.len(), 7, "{refused:?}");
    for e in &refused {
        assert_eq!(e.code(), "invalid_input", "{e}");
    }
    assert_eq!(repo.worktrees().len(), 6);
    assert_eq!(fx.registry.workspaces().len(), 5);
}

/// A free worktree that several agents ask for by name at once goes to one of them, as it is;
/// the others are refused as for a worktree in use, naming the agent that got it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_named_worktree_goes_to_one_of_the_agents_asking_for_it_at_once() {
    let repo = Repo::new();
    let fx = Fixture::new();
    let (first, made) = fx
        .registry
        .create_agent_in_worktree(new_agent(&repo.root), repo.root.clone(), named("shared"))
        .await
        .expect("first");
    assert!(!made.reused);
    fx.registry
        .archive(
            first.id,
            ArchiveOptions {
                stop_activity: true,
            },
        )
        .await
        .expect("archive");
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let reg = fx.registry.clone();
        let root = repo.root.clone();
        tasks.push(tokio::spawn(async move {
            reg.create_agent_in_worktree(new_agent(&root), root.clone(), named("shared"))
                .await
        }));
    }
    let mut reused = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        match task.await.expect("join") {
            Ok(created) => reused.push(created),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(reused.len(), 1, "{refused:?}");
    let (agent, worktree) = &reused[0];
    assert!(worktree.reused);
    assert_eq!(worktree.workspace.id, made.workspace.id);
    assert_eq!(agent.cwd, made.workspace.path);
    assert_eq!(refused.len(), 5);
    for e in &refused {
        assert!(
            e.to_string().contains(&format!(
                "worktree `shared` is in use by agent {}",
                agent.id
            )),
            "{e}"
        );
    }
    assert_eq!(repo.worktrees().len(), 2);
}

// ---- agents and archive ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_created_in_the_worktree_workspace() {
    let repo = Repo::new();
    let fx = Fixture::new();
    let ws = create(&fx.registry, &repo, named("agents")).await.workspace;

    let explicit = fx
        .registry
        .create_agent(NewAgent {
            workspace_id: Some(ws.id),
            ..new_agent(&ws.path)
        })
        .await
        .expect("agent in the worktree");
    assert_eq!(explicit.workspace_id, ws.id);
    assert_eq!(explicit.cwd, ws.path);
    // An agent started in the worktree's folder joins the workspace registered for it.
    let by_cwd = common::create(&fx.registry, &ws.path, Some(explicit.id)).await;
    assert_eq!(by_cwd.workspace_id, ws.id);
    assert_eq!(fx.registry.workspaces().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_is_refused_while_work_is_uncommitted_or_unpushed() {
    let repo = Repo::new();
    let fx = Fixture::new();
    let reg = &fx.registry;
    let ws = create(reg, &repo, named("careful")).await.workspace;
    let agent = common::create(reg, &ws.path, None).await;

    let refused = |expect: &'static [&'static str]| {
        let reg = reg.clone();
        async move {
            let err = reg
                .archive_workspace(ws.id, false)
                .await
                .expect_err("refused");
            assert_eq!(err.code(), "worktree_dirty", "{err}");
            let message = err.to_string();
            for needle in expect {
                assert!(message.contains(needle), "`{needle}` not in: {message}");
            }
        }
    };

    // Uncommitted: an untracked file and an edited tracked one.
    write(&ws.path, "new.txt", "draft\n");
    write(&ws.path, "README.md", "changed\n");
    refused(&["2 uncommitted changes", "new.txt", "README.md"]).await;
    let status = reg.worktree_status(ws.id).await.expect("status");
    assert_eq!(status.uncommitted_count, 2);
    assert_eq!(status.unpushed_count, 0);

    // Committed but found nowhere else.
    git(&ws.path, &["add", "-A"]);
    git(&ws.path, &["commit", "-q", "-m", "agent work"]);
    refused(&["1 unpushed commit", "drover/careful", "agent work"]).await;
    let status = reg.worktree_status(ws.id).await.expect("status");
    assert_eq!((status.uncommitted_count, status.unpushed_count), (0, 1));

    // A refusal changes nothing.
    assert!(ws.path.join("new.txt").is_file());
    assert!(repo.worktrees().contains(&ws.path));
    assert_eq!(reg.workspace(ws.id).and_then(|w| w.archived_at), None);
    assert_eq!(reg.get(agent.id).and_then(|a| a.archived_at), None);
    assert!(fx.runtime.calls().is_empty());
    assert!(read_json(&workspace_file(&fx, &ws))["archivedAt"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_work_archives_plainly_and_its_branch_goes() {
    let log = tempfile::tempdir().expect("log folder");
    let log_file = log.path().join("teardown.log");
    let repo = Repo::with_project_file(Some(&format!(
        "[worktree]\ncopy = [\".env\"]\nteardown = [\"echo \\\"$DROVER_BRANCH\\\" >> '{}'\"]\n",
        log_file.display()
    )));
    write(&repo.root, ".env", "SECRET=1\n");
    let fx = Fixture::new();
    let reg = &fx.registry;
    let ws = create(reg, &repo, named("merged")).await.workspace;
    let agent = common::create(reg, &ws.path, None).await;
    idle(reg, agent.id).await;
    write(&ws.path, "done.txt", "work\n");
    git(&ws.path, &["add", "done.txt"]);
    git(&ws.path, &["commit", "-q", "-m", "finished work"]);
    // The user merges it into the source checkout's branch.
    repo.git(&["merge", "-q", "--ff-only", "drover/merged"]);

    let outcome = reg.archive_workspace(ws.id, false).await.expect("archive");
    let removal = outcome.worktree.expect("a worktree removal");
    assert!(removal.status.is_clean(), "{}", removal.status.summary());
    assert!(removal.removed && removal.branch_deleted);
    assert_eq!(removal.teardown.len(), 1);
    assert_eq!(
        std::fs::read_to_string(&log_file).ok().as_deref(),
        Some("drover/merged\n")
    );
    assert!(!ws.path.exists());
    assert_eq!(repo.worktrees(), std::slice::from_ref(&repo.root));
    assert_eq!(repo.branches(), BTreeSet::from(["main".to_string()]));
    assert_eq!(outcome.agents, [agent.id]);
    assert!(reg.get(agent.id).is_some_and(|a| a.archived_at.is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_work_archives_plainly_and_its_branch_goes() {
    let repo = Repo::new();
    let remote = tempfile::tempdir().expect("remote");
    git(remote.path(), &["init", "-q", "--bare"]);
    repo.git(&[
        "remote",
        "add",
        "origin",
        remote.path().to_str().expect("utf-8 path"),
    ]);
    let fx = Fixture::new();
    let ws = create(&fx.registry, &repo, named("pushed")).await.workspace;
    write(&ws.path, "done.txt", "work\n");
    git(&ws.path, &["add", "done.txt"]);
    git(&ws.path, &["commit", "-q", "-m", "pushed work"]);
    git(&ws.path, &["push", "-q", "origin", "drover/pushed"]);

    let outcome = fx
        .registry
        .archive_workspace(ws.id, false)
        .await
        .expect("archive");
    let removal = outcome.worktree.expect("a worktree removal");
    assert!(removal.removed && removal.branch_deleted);
    assert!(!repo.branches().contains("drover/pushed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_archive_runs_teardown_removes_the_worktree_keeps_unmerged_commits_and_archives_agents()
 {
    let log = tempfile::tempdir().expect("log folder");
    let log_file = log.path().join("teardown.log");
    let repo = Repo::with_project_file(Some(&format!(
        "[worktree]\nteardown = [\"pwd >> '{0}'\", \"echo second >> '{0}'\"]\n",
        log_file.display()
    )));
    let fx = Fixture::with_dirs(1);
    let reg = &fx.registry;
    let ws = create(reg, &repo, named("forced")).await.workspace;
    let busy = common::create(reg, &ws.path, None).await;
    running(reg, busy.id).await;
    let quiet = common::create(reg, &ws.path, None).await;
    idle(reg, quiet.id).await;
    // A subagent elsewhere is archived with its parent; an agent of another workspace is not.
    let child = common::create(reg, &fx.cwd(0), Some(quiet.id)).await;
    let other = common::create(reg, &fx.cwd(0), None).await;
    let agents_before = reg.agent_count();

    write(&ws.path, "kept.txt", "work\n");
    git(&ws.path, &["add", "kept.txt"]);
    git(&ws.path, &["commit", "-q", "-m", "unmerged work"]);
    let work = git(&ws.path, &["rev-parse", "HEAD"]).trim().to_string();
    write(&ws.path, "scratch.txt", "lost on purpose\n");

    let outcome = reg.archive_workspace(ws.id, true).await.expect("forced");
    let removal = outcome.worktree.clone().expect("a worktree removal");
    assert_eq!(removal.status.uncommitted_count, 1);
    assert_eq!(removal.status.unpushed_count, 1);
    assert!(removal.removed);
    assert!(!removal.branch_deleted);
    // Teardown ran in the worktree, both commands, in order.
    assert_eq!(removal.teardown.len(), 2);
    assert_eq!(
        std::fs::read_to_string(&log_file).ok(),
        Some(format!("{}\nsecond\n", ws.path.display()))
    );
    // The worktree is gone; its branch and commit are not.
    assert!(!ws.path.exists());
    assert_eq!(repo.worktrees(), std::slice::from_ref(&repo.root));
    assert!(repo.branches().contains("drover/forced"));
    assert_eq!(repo.git(&["rev-parse", "drover/forced"]).trim(), work);

    // Every agent of the workspace is archived, with its cascade; records are kept.
    let archived: BTreeSet<_> = outcome.agents.iter().copied().collect();
    assert_eq!(archived, BTreeSet::from([busy.id, quiet.id, child.id]));
    for id in [busy.id, quiet.id, child.id] {
        let agent = reg.get(id).expect("kept");
        assert!(agent.archived_at.is_some());
        assert_ne!(agent.status, AgentStatus::Running);
        assert!(fx.on_disk(id).is_some_and(|a| a.archived_at.is_some()));
    }
    assert!(reg.get(other.id).is_some_and(|a| a.archived_at.is_none()));
    assert_eq!(reg.agent_count(), agents_before);
    // The running turn was stopped and every runtime closed.
    let calls = fx
        .runtime
        .wait_for(WAIT, |calls| {
            [busy.id, quiet.id, child.id].iter().all(|id| {
                calls
                    .iter()
                    .any(|c| matches!(c, RuntimeCall::Close { agent, .. } if agent == id))
            })
        })
        .await;
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, RuntimeCall::Cancel { agent, .. } if *agent == busy.id)),
        "{calls:?}"
    );

    // The workspace is archived, on disk too, and takes no new agent.
    let archived_ws = reg.workspace(ws.id).expect("kept");
    assert_eq!(archived_ws.archived_at, outcome.archived_at);
    assert!(outcome.archived_at.is_some());
    assert!(!read_json(&workspace_file(&fx, &ws))["archivedAt"].is_null());
    let err = reg
        .create_agent(NewAgent {
            workspace_id: Some(ws.id),
            ..new_agent(&repo.root)
        })
        .await
        .expect_err("archived workspace");
    assert_eq!(err.code(), "invalid_input");
    // Archiving again does nothing.
    let again = reg.archive_workspace(ws.id, false).await.expect("again");
    assert!(again.already_archived && again.agents.is_empty());

    // The folder is free again, but the kept branch is not reused, nor replaced by another
    // name: the name is refused, saying why.
    let err = reg
        .create_worktree_workspace(repo.root.clone(), named("forced"))
        .await
        .expect_err("its branch is kept");
    assert_eq!(err.code(), "invalid_input");
    assert!(
        err.to_string()
            .contains("branch `drover/forced` exists already"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_teardown_refuses_a_plain_archive_and_not_a_forced_one() {
    let repo = Repo::with_project_file(Some(
        "[worktree]\nteardown = [\"echo cannot stop the services >&2; exit 1\"]\n",
    ));
    let fx = Fixture::new();
    let reg = &fx.registry;
    let ws = create(reg, &repo, named("stubborn")).await.workspace;
    let agent = common::create(reg, &ws.path, None).await;

    let err = reg
        .archive_workspace(ws.id, false)
        .await
        .expect_err("teardown fails");
    assert_eq!(err.code(), "worktree_teardown_failed", "{err}");
    assert!(
        err.to_string().contains("cannot stop the services"),
        "{err}"
    );
    assert!(ws.path.is_dir());
    assert_eq!(reg.get(agent.id).and_then(|a| a.archived_at), None);
    assert_eq!(reg.workspace(ws.id).and_then(|w| w.archived_at), None);

    let outcome = reg.archive_workspace(ws.id, true).await.expect("forced");
    let removal = outcome.worktree.expect("a worktree removal");
    assert!(removal.removed);
    assert!(!removal.teardown[0].succeeded());
    assert!(!ws.path.exists());
    // Nothing was committed on it: the branch goes.
    assert!(removal.branch_deleted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_worktree_is_reported_once_and_archives_without_git_errors() {
    let repo = Repo::with_project_file(Some(
        "[worktree]\nteardown = [\"echo should not run; exit 1\"]\n",
    ));
    let mut fx = Fixture::new();
    let ws = create(&fx.registry, &repo, named("gone")).await.workspace;
    let kept = create(&fx.registry, &repo, named("kept")).await.workspace;
    let agent = common::create(&fx.registry, &ws.path, None).await;
    write(&ws.path, "unsaved.txt", "lost with the folder\n");
    std::fs::remove_dir_all(&ws.path).expect("remove the worktree behind drover's back");

    let checks = fx.registry.check_worktrees().await.expect("check");
    let missing: Vec<_> = checks.iter().filter(|c| c.missing).collect();
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].workspace_id, ws.id);
    assert!(
        checks
            .iter()
            .any(|c| c.workspace_id == kept.id && !c.missing)
    );
    let status = fx.registry.worktree_status(ws.id).await.expect("status");
    assert!(status.missing && status.is_clean());

    // At boot it is reported, not retried.
    let report = fx.restart();
    assert_eq!(report.missing_worktrees, [ws.id]);
    // Its folder stays its workspace's: a new worktree of that name is refused, naming it.
    let err = fx
        .registry
        .create_worktree_workspace(
            repo.root.clone(),
            WorktreeOptions {
                name: Some("gone".to_string()),
                branch: Some("other/gone".to_string()),
                ..WorktreeOptions::default()
            },
        )
        .await
        .expect_err("the name is its workspace's");
    assert!(
        err.to_string()
            .contains("worktree `gone` of this project exists already"),
        "{err}"
    );
    assert!(!ws.path.exists());

    // Archive prunes it from git: no teardown in a folder that is gone, no refusal.
    let outcome = fx
        .registry
        .archive_workspace(ws.id, false)
        .await
        .expect("archive a vanished worktree");
    let removal = outcome.worktree.expect("a worktree removal");
    assert!(removal.status.missing);
    assert!(!removal.removed);
    assert!(removal.teardown.is_empty());
    assert!(removal.branch_deleted, "nothing was committed on it");
    assert_eq!(outcome.agents, [agent.id]);
    assert!(!repo.worktrees().contains(&ws.path));
    assert!(repo.worktrees().contains(&kept.path));
    let checks = fx.registry.check_worktrees().await.expect("check");
    assert!(checks.iter().all(|c| c.workspace_id != ws.id && !c.missing));
    assert!(fx.restart().missing_worktrees.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_workspaces_archive_their_agents_without_git() {
    let fx = Fixture::new();
    let reg = &fx.registry;
    let agent = fx.create(0, None).await;
    let outcome = reg
        .archive_workspace(agent.workspace_id, false)
        .await
        .expect("archive");
    assert_eq!(outcome.agents, [agent.id]);
    assert!(outcome.worktree.is_none());
    assert!(fx.cwd(0).is_dir());
    let err = reg
        .worktree_status(agent.workspace_id)
        .await
        .expect_err("not a worktree");
    assert_eq!(err.code(), "invalid_input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_in_the_worktree_record_survive_a_rewrite() {
    let repo = Repo::new();
    let mut fx = Fixture::new();
    let ws = create(&fx.registry, &repo, named("future")).await.workspace;
    let file = workspace_file(&fx, &ws);
    let mut doc = read_json(&file);
    doc["worktree"]["fromTheFuture"] = serde_json::json!({"x": 1});
    write_json(&file, &doc);
    fx.restart();

    fx.registry
        .archive_workspace(ws.id, false)
        .await
        .expect("archive");
    let doc = read_json(&file);
    assert!(!doc["archivedAt"].is_null());
    assert_eq!(doc["worktree"]["fromTheFuture"]["x"], 1);
    assert_eq!(doc["worktree"]["branch"], "drover/future");
    assert!(doc.get("fromTheFuture").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_git_hook_fails_the_creation_and_leaves_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let repo = Repo::new();
    let hook = repo.root.join(".git/hooks/post-checkout");
    write(
        &repo.root,
        ".git/hooks/post-checkout",
        "#!/bin/sh\necho hook says no >&2\nexit 1\n",
    );
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let fx = Fixture::new();
    let err = fx
        .registry
        .create_worktree_workspace(repo.root.clone(), named("hooked"))
        .await
        .expect_err("the hook fails");
    assert_eq!(err.code(), "git_failed", "{err}");
    assert!(err.to_string().contains("hook says no"), "{err}");
    assert_nothing_left(&fx, &repo);
}

#[test]
fn a_bounded_git_read_cuts_its_output_at_the_limit_and_names_a_failure() {
    let repo = Repo::new();
    for i in 0..200 {
        write(&repo.root, &format!("file-{i:03}.txt"), "x\n");
    }
    let args = ["ls-files", "--others", "--exclude-standard"];
    let (whole, cut) =
        drover_core::worktree::read_bounded(&repo.root, &args, 1 << 20, Duration::from_secs(30))
            .expect("read");
    assert!(!cut);
    assert_eq!(whole.lines().count(), 200, "{whole}");
    let (part, cut) =
        drover_core::worktree::read_bounded(&repo.root, &args, 100, Duration::from_secs(30))
            .expect("read");
    assert!(cut);
    assert_eq!(part, whole[..100]);

    let elsewhere = tempfile::tempdir().expect("dir");
    let err = drover_core::worktree::read_bounded(
        elsewhere.path(),
        &["rev-parse", "--is-inside-work-tree"],
        64,
        Duration::from_secs(30),
    )
    .expect_err("not a checkout");
    assert!(err.to_string().contains("not a git repository"), "{err}");
}
