//! The web UI, in a real headless Chromium (Debian's `chromium`, driven by `playwright-core`
//! from `scripts/install-ui-tests`) against the real daemon with the scripted agent: one test
//! per rule of the tabs, the subagents track, the archive dialogs, permissions, the composer,
//! sign-in and failed starts, reconnection and the phone layout. Each test sets the daemon up over the protocol, runs one
//! scenario of `crates/e2e/ui/driver.mjs`, and checks the daemon's side as a client would.
//! Screenshots of the main screens go to `target/ui-screenshots/`.
//!
//! The serving tests (headers, 404, entity tags) and the new requests (`set_title`,
//! `workspace_changes`) need no browser.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, WAIT, find_where, string_at};
use drover_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// One browser at a time: Chromium is heavy, and parallel ones on a loaded 2-core machine
/// turn every wait into a race.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// How long one scenario may run in all.
const SCENARIO: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn node_modules() -> PathBuf {
    let dir = std::env::var_os("DROVER_UI_TESTS_DIR")
        .map_or_else(|| repo().join(".ui-tests"), PathBuf::from)
        .join("node_modules");
    drover_testkit::installed(
        dir.join("playwright-core/package.json"),
        "playwright-core is not installed: run scripts/install-ui-tests (scripts/test does)",
    );
    dir
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("DROVER_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    drover_testkit::installed(
        path,
        "install Debian's Chromium with `apt-get install -y chromium` (scripts/test does)",
    )
}

/// `target/ui-screenshots`.
fn shots() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("../ui-screenshots")
}

/// A running scenario: its `@wait` steps are answered with [`Scenario::go`].
struct Scenario {
    name: String,
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    stdin: ChildStdin,
    _browser: tokio::sync::MutexGuard<'static, ()>,
}

impl Scenario {
    async fn start(name: &str, daemon: &TestDaemon, args: Value) -> Scenario {
        Scenario::start_holding(BROWSER.lock().await, name, daemon, args)
    }

    /// [`Scenario::start`] with the browser already taken: for a scenario whose set-up runs
    /// against a clock (waiting for another test's browser would eat its window).
    fn start_holding(
        guard: tokio::sync::MutexGuard<'static, ()>,
        name: &str,
        daemon: &TestDaemon,
        mut args: Value,
    ) -> Scenario {
        args["url"] = json!(format!("{}/", daemon.url));
        args["token"] = json!(daemon.token());
        args["shots"] = json!(shots());
        let mut child = tokio::process::Command::new("node")
            .arg(repo().join("crates/e2e/ui/driver.mjs"))
            .arg(name)
            .env("DROVER_UI_ARGS", args.to_string())
            .env("DROVER_UI_NODE_MODULES", node_modules())
            .env("DROVER_CHROMIUM", chromium())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (Node.js is installed by scripts/test)");
        let out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let stdin = child.stdin.take().expect("stdin");
        Scenario {
            name: name.to_string(),
            child,
            out,
            stdin,
            _browser: guard,
        }
    }

    /// The driver's next line: `Some(step)` for `@wait step`, `None` for `@done`.
    async fn next(&mut self) -> Option<String> {
        loop {
            let line = tokio::time::timeout(SCENARIO, self.out.next_line())
                .await
                .unwrap_or_else(|_| panic!("scenario {} is stuck", self.name))
                .expect("read the driver");
            let Some(line) = line else {
                self.failed().await;
            };
            if let Some(step) = line.strip_prefix("@wait ") {
                return Some(step.to_string());
            }
            if line == "@done" {
                return None;
            }
            eprintln!("[{}] {line}", self.name);
        }
    }

    async fn failed(&mut self) -> ! {
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = tokio::time::timeout(WAIT, stderr.read_to_string(&mut err)).await;
        }
        let status = tokio::time::timeout(WAIT, self.child.wait()).await;
        panic!("browser scenario {} failed ({status:?}):\n{err}", self.name);
    }

    /// Waits for `@wait want`.
    async fn step(&mut self, want: &str) {
        match self.next().await {
            Some(step) if step == want => {}
            other => panic!(
                "scenario {}: expected step {want}, got {other:?}",
                self.name
            ),
        }
    }

    /// Lets the driver go on after a step.
    async fn go(&mut self) {
        self.answer("go").await;
    }

    /// Lets the driver go on after a step, telling it `line`.
    async fn answer(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("answer the driver");
        self.stdin.flush().await.expect("answer the driver");
    }

    /// Waits for the scenario to pass.
    async fn done(mut self) {
        if let Some(step) = self.next().await {
            panic!("scenario {}: unexpected step {step}", self.name);
        }
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the driver exits")
            .expect("wait for the driver");
        if !status.success() {
            self.failed().await;
        }
    }

    async fn run(name: &str, daemon: &TestDaemon, args: Value) {
        Scenario::start(name, daemon, args).await.done().await;
    }
}

// ---- protocol helpers ---------------------------------------------------------------------

/// A scripted agent made with `fields` (those of `create_agent`); its id.
async fn create(client: &mut Client, mut fields: Value) -> String {
    fields["provider"] = json!("scripted");
    client.create_agent(fields).await
}

async fn wait_idle(client: &mut Client, id: &str) {
    let answer = client
        .request(json!({"type": "wait_idle", "agentId": id, "timeoutMs": 15_000}))
        .await;
    assert_eq!(
        answer["payload"]["idle"], true,
        "agent {id} did not settle: {answer}"
    );
}

async fn archived(client: &mut Client, id: &str) -> bool {
    !client.listed_agent(id).await["archivedAt"].is_null()
}

/// A root agent that waits (idle), created in the daemon's cwd.
async fn idle_agent(client: &mut Client, daemon: &TestDaemon, title: &str) -> String {
    let id = create(client, json!({"cwd": daemon.cwd(), "title": title})).await;
    wait_idle(client, &id).await;
    id
}

/// A subagent of `parent` that waits (idle), created in the daemon's cwd.
async fn idle_child(client: &mut Client, daemon: &TestDaemon, parent: &str, title: &str) -> String {
    let fields = json!({"cwd": daemon.cwd(), "title": title, "parentAgentId": parent});
    let id = create(client, fields).await;
    wait_idle(client, &id).await;
    id
}

/// A root agent `parent` and its subagent `child`, both idle.
async fn parent_and_child(client: &mut Client, daemon: &TestDaemon) -> (String, String) {
    let parent = idle_agent(client, daemon, "parent").await;
    let child = idle_child(client, daemon, &parent, "child").await;
    (parent, child)
}

/// Waits until agent `id` asks for a permission (`what` names the wait in a failure).
async fn wait_permission(client: &mut Client, id: &str, what: &str) {
    eventually(what, WAIT, async || {
        client.listed_agent(id).await["attentionReason"] == "permission"
    })
    .await;
}

/// The permission item of agent `id`'s timeline, which must have been answered.
async fn answered_permission(client: &mut Client, id: &str) -> Value {
    let items = client.timeline(id).await;
    let permission = items
        .iter()
        .find(|i| i["kind"] == "permission")
        .expect("the request")
        .clone();
    assert_eq!(permission["data"]["status"], "answered", "{permission}");
    permission
}

/// A turn that runs until it is cancelled.
const LONG_TURN: &str = "sleep 600000";

// ---- serving ------------------------------------------------------------------------------

/// `GET path` with extra header lines; the status code, the headers (lower-cased names) and
/// the body.
async fn http_get(
    daemon: &TestDaemon,
    path: &str,
    extra: &str,
) -> (u16, Vec<(String, String)>, String) {
    let addr = daemon.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn the_page_and_its_files_are_served_with_strict_headers() {
    let daemon = TestDaemon::start().await;
    let (status, headers, body) = http_get(&daemon, "/", "").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"<script type="module" src="/ui/app.js">"#),
        "{body}"
    );
    assert!(
        !body.contains("<script>"),
        "the page has an inline script: {body}"
    );
    let csp = header(&headers, "content-security-policy").expect("a CSP");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "the CSP lacks {part}: {csp}");
    }
    assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"));
    assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&headers, "cache-control"), Some("no-cache"));
    for (file, mime) in [
        ("app.js", "text/javascript"),
        ("conn.js", "text/javascript"),
        ("style.css", "text/css"),
    ] {
        let (status, headers, _) = http_get(&daemon, &format!("/ui/{file}"), "").await;
        assert_eq!(status, 200, "{file}");
        assert!(
            header(&headers, "content-type").is_some_and(|t| t.starts_with(mime)),
            "{file}: {headers:?}"
        );
        // Revalidation: the same entity tag answers 304 without a body.
        let tag = header(&headers, "etag").expect("an etag").to_string();
        let (status, _, body) = http_get(
            &daemon,
            &format!("/ui/{file}"),
            &format!("If-None-Match: {tag}\r\n"),
        )
        .await;
        assert_eq!((status, body.as_str()), (304, ""), "{file}");
    }
    let (status, _, body) = http_get(&daemon, "/ui/secrets.txt", "").await;
    assert_eq!(status, 404);
    assert!(body.contains("not_found"), "{body}");
}

// ---- the new requests ---------------------------------------------------------------------

/// The page's JavaScript (and the tests' driver) passes eslint with the rules in
/// scripts/ui-tests/eslint.config.js.
#[test]
fn the_pages_javascript_passes_eslint() {
    let tools = node_modules();
    let config = tools
        .parent()
        .expect("the tools' directory")
        .join("eslint.config.js");
    let mut files = page_scripts();
    assert!(files.len() >= 5, "{files:?}");
    files.push(repo().join("crates/e2e/ui/driver.mjs"));
    let mut eslint = std::process::Command::new("node");
    eslint
        .arg(tools.join("eslint/bin/eslint.js"))
        .arg("--max-warnings=0")
        .arg("-c")
        .arg(&config)
        .args(&files);
    passes("eslint", &mut eslint);
}

/// The page's JavaScript files (`crates/daemon/src/ui/assets/*.js`), sorted.
fn page_scripts() -> Vec<PathBuf> {
    let assets = repo().join("crates/daemon/src/ui/assets");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&assets)
        .expect("the assets")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "js"))
        .collect();
    files.sort();
    files
}

/// Runs `command` (a Node.js tool) in the repository; it must succeed, or what it said fails
/// the test.
fn passes(tool: &str, command: &mut std::process::Command) {
    let out = command
        .current_dir(repo())
        .output()
        .expect("node runs (Node.js is installed by scripts/test)");
    drover_testkit::assert_succeeded(&out, tool);
}

/// The page's JavaScript type-checks (`tsc --checkJs --strict`, typescript pinned in
/// scripts/ui-tests/) against the types generated from drover-protocol (`protocol.gen.js`): a
/// request whose `type` or fields the daemon would refuse, a misspelt constant, a value that may
/// be null used as if it were there, or a parameter without a type, fails here.
#[test]
fn the_pages_javascript_type_checks() {
    let tools = node_modules();
    let tsc = tools.join("typescript/bin/tsc");
    assert!(
        tsc.exists(),
        "typescript is not installed under {}: run scripts/install-ui-tests (scripts/test does)",
        tools.display()
    );
    let files = page_scripts();
    assert!(
        files.iter().any(|f| f.ends_with("protocol.gen.js")),
        "{files:?}"
    );
    let mut tsc_run = std::process::Command::new("node");
    tsc_run
        .arg(&tsc)
        .args(["--noEmit", "--allowJs", "--checkJs", "--skipLibCheck"])
        .arg("--strict")
        .args(["--target", "es2022", "--module", "es2022"])
        .args(["--moduleResolution", "bundler"])
        .args(["--lib", "es2023,dom,dom.iterable"])
        .args(["--pretty", "false"])
        .args(&files);
    passes("tsc", &mut tsc_run);
}

/// A `session_state` far over the 64 KiB the daemon sends a frame of reaches the page whole:
/// it comes in fragments, cut between multi-byte characters, and every agent's row carries
/// its whole title.
#[tokio::test]
async fn a_session_state_sent_in_fragments_reaches_the_page_whole() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let mut agents = Vec::new();
    for n in 0..4 {
        let title = format!(
            "big {n}: {} end {n}",
            "tâche 🚀 задача 任务 ".repeat(12_000)
        );
        let id = idle_agent(&mut client, &daemon, &title).await;
        agents.push(json!({"id": id, "start": format!("big {n}:"), "end": format!("end {n}")}));
    }
    let state = client
        .request(json!({"type": "list_agents", "includeArchived": false}))
        .await
        .to_string();
    assert!(state.len() > 1_000_000, "{} bytes", state.len());
    Scenario::run("bigState", &daemon, json!({"agents": agents})).await;
}

#[tokio::test]
async fn set_title_renames_an_agent_for_every_client() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (mut other, _) = daemon.client().await;
    let id = idle_agent(&mut client, &daemon, "before").await;
    let answer = client
        .request(json!({"type": "set_title", "agentId": id, "title": "  after  "}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    let status = other
        .recv_where(|m| m["type"] == "agent_status" && m["payload"]["agent"]["title"] == "after")
        .await;
    assert_eq!(status["payload"]["agent"]["id"], id.as_str());
    let answer = client
        .request(json!({"type": "set_title", "agentId": id, "title": null}))
        .await;
    assert_eq!(answer["type"], "ok", "{answer}");
    assert!(client.listed_agent(&id).await["title"].is_null());
    let answer = client
        .request(json!({"type": "set_title", "agentId": "0193b1c2-7d4e-7a10-8000-0123456789ab", "title": "x"}))
        .await;
    assert_eq!(answer["payload"]["code"], "unknown_agent", "{answer}");
}

#[tokio::test]
async fn workspace_changes_lists_files_and_diffs_against_the_base() {
    let (_daemon, mut client) = TestDaemon::start_with_client().await;
    let repo = TempDir::new().expect("repo");
    drover_testkit::git_repository(
        repo.path(),
        &[("README.md", "one\ntwo\n"), ("old.txt", "x\n")],
    );
    let made = client
        .request(json!({"type": "create_worktree", "repository": repo.path(), "name": "changes"}))
        .await;
    assert_eq!(made["type"], "worktree_created", "{made}");
    let ws = made["payload"]["workspace"].clone();
    let path = PathBuf::from(ws["path"].as_str().expect("path"));
    std::fs::write(path.join("README.md"), "one\n2\nthree\n").expect("edit");
    std::fs::remove_file(path.join("old.txt")).expect("delete");
    std::fs::write(path.join("notes.txt"), "new\n").expect("untracked");
    let answer = client
        .request(json!({"type": "workspace_changes", "workspaceId": ws["id"]}))
        .await;
    assert_eq!(answer["type"], "workspace_changes", "{answer}");
    let changes = &answer["payload"]["changes"];
    assert_eq!(changes["base"], ws["worktree"]["baseCommit"]);
    assert_eq!(changes["truncated"], false);
    let files = changes["files"].as_array().expect("files");
    let file = |p: &str| {
        files
            .iter()
            .find(|f| f["path"] == p)
            .unwrap_or_else(|| panic!("{p} is not listed: {files:?}"))
    };
    let readme = file("README.md");
    assert_eq!(
        (
            readme["status"].as_str(),
            readme["added"].as_u64(),
            readme["removed"].as_u64()
        ),
        (Some("modified"), Some(2), Some(1))
    );
    assert!(
        readme["diff"].as_str().expect("diff").contains("+three\n"),
        "{readme}"
    );
    assert_eq!(file("old.txt")["status"], "deleted");
    assert_eq!(file("notes.txt")["status"], "untracked");
    // A workspace that is no git checkout says so.
    let plain = TempDir::new().expect("plain");
    let id = create(&mut client, json!({"cwd": plain.path()})).await;
    let ws_id = client.listed_agent(&id).await["workspaceId"].clone();
    let answer = client
        .request(json!({"type": "workspace_changes", "workspaceId": ws_id}))
        .await;
    assert_eq!(
        answer["payload"]["code"], "not_a_git_repository",
        "{answer}"
    );
}

// ---- in the browser -----------------------------------------------------------------------

#[tokio::test]
async fn a_page_without_the_token_says_how_to_get_one_and_the_token_leaves_the_address_bar() {
    let home = TempDir::new().expect("home");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), Some(home), false).await;
    assert!(daemon.token().is_some(), "the daemon keeps a token");
    let (mut client, _) = daemon.client().await;
    idle_agent(&mut client, &daemon, "logged in").await;
    Scenario::run("login", &daemon, json!({})).await;
}

#[tokio::test]
async fn closing_a_root_tab_archives_it_and_asks_first_when_it_runs() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let idle = idle_agent(&mut client, &daemon, "idle root").await;
    let running = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "busy root", "prompt": LONG_TURN}),
    )
    .await;
    client.wait_status(&running, "running").await;
    let mut s = Scenario::start(
        "rootTabClose",
        &daemon,
        json!({"idle": idle, "running": running}),
    )
    .await;
    s.step("still-unarchived").await;
    assert!(
        archived(&mut client, &idle).await,
        "closing an idle root's tab archives it"
    );
    assert!(
        !archived(&mut client, &running).await,
        "Escape in the confirm dialog archived the agent"
    );
    s.go().await;
    s.done().await;
    assert!(archived(&mut client, &running).await);
    assert!(
        client
            .turn_events(&running)
            .await
            .contains(&"turn_canceled".to_string())
    );
}

#[tokio::test]
async fn closing_a_subagent_tab_is_layout_only_and_it_reopens_from_the_track() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (parent, child) = parent_and_child(&mut client, &daemon).await;
    let mut s = Scenario::start(
        "subagentTabClose",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    s.step("child-not-archived").await;
    assert!(
        !archived(&mut client, &child).await,
        "closing a subagent's tab archived it"
    );
    s.go().await;
    s.done().await;
    assert!(!archived(&mut client, &child).await);
}

#[tokio::test]
async fn the_track_x_archives_after_a_confirm_and_the_row_leaves_a_second_browser() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (parent, child) = parent_and_child(&mut client, &daemon).await;
    Scenario::run(
        "trackArchive",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    assert!(archived(&mut client, &child).await);
    assert!(!archived(&mut client, &parent).await);
}

#[tokio::test]
async fn detach_makes_the_subagent_a_root_on_both_browsers() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (parent, child) = parent_and_child(&mut client, &daemon).await;
    Scenario::run("detach", &daemon, json!({"parent": parent, "child": child})).await;
    let info = client.listed_agent(&child).await;
    assert!(info["parentAgentId"].is_null(), "{info}");
    assert!(info["archivedAt"].is_null(), "{info}");
}

#[tokio::test]
async fn stop_and_archive_lists_the_turn_and_a_running_subagent_then_archives_both() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "orchestrator", "prompt": LONG_TURN}),
    )
    .await;
    let child = create(&mut client, json!({"cwd": daemon.cwd(), "title": "sub-worker", "parentAgentId": parent, "prompt": LONG_TURN})).await;
    client.wait_status(&parent, "running").await;
    client.wait_status(&child, "running").await;
    Scenario::run(
        "stopAndArchive",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    assert!(archived(&mut client, &parent).await);
    assert!(archived(&mut client, &child).await);
    for id in [&parent, &child] {
        let events = client.turn_events(id).await;
        assert!(
            events.contains(&"turn_canceled".to_string()),
            "{id}: {events:?}"
        );
    }
}

#[tokio::test]
async fn archiving_the_parent_elsewhere_empties_the_track_and_closes_the_tabs() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = idle_agent(&mut client, &daemon, "parent").await;
    let child = idle_child(&mut client, &daemon, &parent, "first").await;
    idle_child(&mut client, &daemon, &parent, "second").await;
    let mut s = Scenario::start(
        "cascade",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    s.step("archive-parent").await;
    let answer = client
        .request(json!({"type": "archive", "agentId": parent}))
        .await;
    assert_eq!(answer["type"], "archived", "{answer}");
    assert_eq!(
        answer["payload"]["archived"].as_array().map(Vec::len),
        Some(3),
        "{answer}"
    );
    s.go().await;
    s.done().await;
}

#[tokio::test]
async fn the_settings_an_agent_offers_are_set_from_its_header_on_every_browser() {
    let state = TempDir::new().expect("agent state");
    let config =
        drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), state.path())
            .replace(" }", ", SCRIPTED_AGENT_CONFIG_OPTIONS = \"1\" }");
    let daemon = TestDaemon::start_fresh_with_config(config).await;
    let (mut client, _) = daemon.client().await;
    let id = create(
        &mut client,
        json!({
            "cwd": daemon.cwd(), "prompt": "say hi", "effort": "high",
            "title": "tuned: a title long enough to crowd the header of any pane",
        }),
    )
    .await;
    wait_idle(&mut client, &id).await;
    Scenario::run("settings", &daemon, json!({"agent": id})).await;
    eventually("the effort the page set", WAIT, async || {
        client.listed_agent(&id).await["effort"] == "low"
    })
    .await;
    let item = client.listed_agent(&id).await;
    let effort = item["configOptions"]
        .as_array()
        .and_then(|all| all.iter().find(|o| o["id"] == "effort"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(effort["currentValue"], "low", "{item}");
}

#[tokio::test]
async fn the_agents_own_subagents_are_in_its_track_read_only() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "lead", "prompt": "own-subagent Reviewer\nsay delegated"}),
    )
    .await;
    wait_idle(&mut client, &id).await;
    let mut scenario = Scenario::start("ownSubagents", &daemon, json!({"agent": id})).await;
    scenario.step("done").await;
    client
        .request(json!({"type": "send_message", "agentId": id, "text": "own-subagent-done"}))
        .await;
    scenario.go().await;
    scenario.done().await;
}

#[tokio::test]
async fn filters_find_subagents_and_archived_subagents_come_back_from_the_track() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let lead = idle_agent(&mut client, &daemon, "lead").await;
    let worker = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "worker", "parentAgentId": lead, "prompt": "permission run the tests"}),
    )
    .await;
    eventually("the worker's permission request", WAIT, async || {
        client.listed_agent(&worker).await["attentionReason"] == "permission"
    })
    .await;
    let archived_sub = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "done sub", "parentAgentId": lead}),
    )
    .await;
    wait_idle(&mut client, &archived_sub).await;
    let answer = client
        .request(json!({"type": "archive", "agentId": archived_sub}))
        .await;
    assert_ne!(answer["type"], "request_error", "{answer}");
    let quiet = idle_agent(&mut client, &daemon, "quiet").await;
    let broken = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "broken", "prompt": "fail it broke"}),
    )
    .await;
    client.wait_status(&broken, "error").await;
    let lead2 = idle_agent(&mut client, &daemon, "second lead").await;
    let archived_lead = idle_agent(&mut client, &daemon, "old lead").await;
    let kid = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "old kid", "parentAgentId": archived_lead}),
    )
    .await;
    wait_idle(&mut client, &kid).await;
    let answer = client
        .request(json!({"type": "archive", "agentId": archived_lead}))
        .await;
    assert_ne!(answer["type"], "request_error", "{answer}");
    let mut scenario = Scenario::start(
        "filters",
        &daemon,
        json!({
            "lead": lead, "worker": worker, "archivedSub": archived_sub, "quiet": quiet,
            "broken": broken, "lead2": lead2, "archivedLead": archived_lead,
        }),
    )
    .await;
    scenario.step("unarchived").await;
    eventually("the parent and its subagent back", WAIT, async || {
        !archived(&mut client, &archived_lead).await && !archived(&mut client, &kid).await
    })
    .await;
    scenario.go().await;
    scenario.done().await;
    assert!(!archived(&mut client, &archived_sub).await);
}

#[tokio::test]
async fn a_permission_answered_in_one_browser_settles_in_the_other() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "asks", "prompt": "permission run the tests"}),
    )
    .await;
    wait_permission(&mut client, &id, "the permission request").await;
    Scenario::run("permission", &daemon, json!({"agent": id})).await;
    let permission = answered_permission(&mut client, &id).await;
    assert_eq!(permission["data"]["kind"], "allow_once", "{permission}");
}

#[tokio::test]
async fn a_followup_waits_for_the_turn_and_a_steer_interrupts_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "worker", "prompt": LONG_TURN}),
    )
    .await;
    client.wait_status(&id, "running").await;
    let mut s = Scenario::start("followupAndSteer", &daemon, json!({"agent": id})).await;
    s.step("followup-queued").await;
    assert!(
        client.turn_events(&id).await.is_empty(),
        "a followup interrupted the turn"
    );
    assert_eq!(client.listed_agent(&id).await["status"], "running");
    s.go().await;
    s.done().await;
    let events = client.turn_events(&id).await;
    assert_eq!(
        events.first().map(String::as_str),
        Some("turn_canceled"),
        "{events:?}"
    );
    // The steer ran first, then the followup.
    let said = client.replies(&id).await;
    let steered = said.iter().position(|t| t.contains("steered"));
    let followed = said.iter().position(|t| t.contains("followed up"));
    assert!(steered.is_some() && steered < followed, "{said:?}");
}

#[tokio::test]
async fn the_page_reconnects_after_a_daemon_restart_and_keeps_what_was_typed() {
    let home = TempDir::new().expect("home");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), Some(home), false).await;
    let addr = daemon.url.trim_start_matches("http://").to_string();
    let (mut client, _) = daemon.client().await;
    // Its own directory: the daemon's goes with the first daemon.
    let cwd = TempDir::new().expect("cwd");
    let id = create(&mut client, json!({"cwd": cwd.path(), "title": "survivor"})).await;
    wait_idle(&mut client, &id).await;
    let mut s = Scenario::start("reconnect", &daemon, json!({"agent": id})).await;
    s.step("stop-daemon").await;
    drop(client);
    let (home, keep) = daemon.stop().await;
    s.go().await;
    s.step("start-daemon").await;
    let daemon = TestDaemon::start_at(home, keep, false, &addr).await;
    s.go().await;
    s.done().await;
    let (mut client, _) = daemon.client().await;
    let said = client.timeline(&id).await;
    assert!(
        said.iter().any(|i| i["data"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("back again"))),
        "{said:?}"
    );
}

#[tokio::test]
async fn at_390_pixels_the_sidebar_is_a_drawer_and_a_permission_takes_one_tap() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "phone", "prompt": "permission deploy"}),
    )
    .await;
    wait_permission(&mut client, &id, "the permission request").await;
    Scenario::run("phone", &daemon, json!({"agent": id})).await;
    answered_permission(&mut client, &id).await;
}

#[tokio::test]
async fn the_changes_view_shows_a_worktrees_files() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let repo = TempDir::new().expect("repo");
    drover_testkit::git_repository(repo.path(), &[("README.md", "hello\n")]);
    let id = create(
        &mut client,
        json!({"cwd": repo.path(), "title": "changer", "worktree": {"name": "ui-changes"}}),
    )
    .await;
    wait_idle(&mut client, &id).await;
    let info = client.listed_agent(&id).await;
    let path = PathBuf::from(info["cwd"].as_str().expect("cwd"));
    std::fs::write(path.join("README.md"), "hello\nworld\n").expect("edit");
    std::fs::write(path.join("notes.txt"), "new\n").expect("untracked");
    Scenario::run(
        "changes",
        &daemon,
        json!({"workspace": info["workspaceId"]}),
    )
    .await;
}

#[tokio::test]
async fn a_new_agent_made_in_the_browser_runs_and_can_be_renamed() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    idle_agent(&mut client, &daemon, "already here").await;
    Scenario::run("newAgent", &daemon, json!({})).await;
    let agents = client.agents(false).await;
    let made = agents
        .iter()
        .find(|a| a["title"] == "renamed in the browser")
        .unwrap_or_else(|| panic!("{agents:?}"));
    assert_eq!(
        made["budget"],
        json!({"tokens": 5000, "hard": true}),
        "{made}"
    );
}

#[tokio::test]
async fn the_new_agent_dialog_starts_in_the_projects_checkout_not_in_a_worktree() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = TempDir::new().expect("repo parent");
    let repo = parent.path().join("repo");
    std::fs::create_dir_all(&repo).expect("repo");
    drover_testkit::git_repository(&repo, &[("README.md", "hello\n")]);
    // The worktree first, so that its workspace is the daemon's first.
    let in_worktree = create(
        &mut client,
        json!({"cwd": repo, "title": "in a worktree", "worktree": {"name": "wt-first"}}),
    )
    .await;
    wait_idle(&mut client, &in_worktree).await;
    let at_checkout = idle_agent_in(&mut client, &repo, "at the checkout").await;
    let worktree = client.listed_agent(&in_worktree).await["workspaceId"].clone();
    let checkout = client.listed_agent(&at_checkout).await["workspaceId"].clone();
    assert_ne!(worktree, checkout);
    Scenario::run(
        "newAgentWhere",
        &daemon,
        json!({"checkout": checkout, "worktree": worktree, "worktreeAgent": in_worktree}),
    )
    .await;
}

async fn idle_agent_in(client: &mut Client, cwd: &Path, title: &str) -> String {
    let id = create(client, json!({"cwd": cwd, "title": title})).await;
    wait_idle(client, &id).await;
    id
}

#[tokio::test]
async fn a_turn_silent_for_30_seconds_says_so_in_its_pane_but_not_one_asking_permission() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let sleeper = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "sleeper", "prompt": "sleep 120000"}),
    )
    .await;
    let asker = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "asker", "prompt": "permission deploy"}),
    )
    .await;
    wait_permission(&mut client, &asker, "the permission request").await;
    client.wait_status(&sleeper, "running").await;
    Scenario::run(
        "quiet",
        &daemon,
        json!({"sleeper": sleeper, "asker": asker}),
    )
    .await;
}

#[tokio::test]
async fn the_demo_provider_tours_streaming_a_permission_a_subagent_and_a_job() {
    // The demo preset runs the drover binary, which this crate does not build: the scripted
    // agent in demo mode stands in for it, under the preset's name and label.
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    let bin = drover_testkit::scripted_agent_bin();
    let config = format!(
        "{}\n[providers.demo]\ncommand = [{:?}]\nenv = {{ SCRIPTED_AGENT_DEMO = \"1\", SCRIPTED_AGENT_STATE_DIR = {:?} }}\n",
        drover_testkit::scripted_config(&bin, state.path()),
        bin.display().to_string(),
        state.path().display().to_string(),
    );
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), Some(home), config).await;
    let (mut client, _) = daemon.client().await;
    idle_agent(&mut client, &daemon, "already here").await;
    Scenario::run("demo", &daemon, json!({})).await;
    let agents = client.agents(false).await;
    let demo = agents
        .iter()
        .find(|a| a["title"] == "the demo")
        .unwrap_or_else(|| panic!("no demo agent: {agents:?}"));
    assert_eq!(demo["type"], "demo", "{demo}");
    let sub = agents
        .iter()
        .find(|a| a["parentAgentId"] == demo["id"])
        .unwrap_or_else(|| panic!("no subagent: {agents:?}"));
    assert_eq!(sub["type"], "demo", "{sub}");
    let jobs = client.request(json!({"type": "list_jobs"})).await;
    let jobs = jobs["payload"]["jobs"].as_array().expect("jobs").clone();
    assert!(jobs.iter().any(|j| j["agentId"] == demo["id"]), "{jobs:?}");
}

/// A reply rendered as it streams, however it is cut, reads as the reply rendered whole (the
/// page renders only what is not settled yet at each frame).
#[tokio::test]
async fn a_reply_rendered_piece_by_piece_reads_as_it_does_whole() {
    let daemon = TestDaemon::start().await;
    let (mut client, _) = daemon.client().await;
    idle_agent(&mut client, &daemon, "one").await;
    Scenario::run("markdown", &daemon, json!({})).await;
}

#[tokio::test]
async fn a_command_run_from_the_pane_is_a_job_followed_to_its_end_and_another_is_killed() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = idle_agent(&mut client, &daemon, "builder").await;
    let lines: Vec<String> = (1..=40).map(|i| format!("line {i}")).collect();
    // Slow enough that the page follows it live, not only reads it at the end.
    let command = "for i in $(seq 1 40); do echo line $i; sleep 0.05; done";
    let mut s = Scenario::start(
        "jobs",
        &daemon,
        json!({"agent": id, "command": command, "lines": lines}),
    )
    .await;
    s.step("started-elsewhere").await;
    let jobs = client
        .request(json!({"type": "list_jobs", "agentId": id}))
        .await;
    let first = &jobs["payload"]["jobs"][0];
    assert_eq!(first["command"], command, "{jobs}");
    assert_eq!(first["status"], "exited", "{first}");
    assert_eq!(first["exitCode"], 0, "{first}");
    assert_eq!(first["startedBy"], "user", "{first}");
    let other = client
        .request(json!({"type": "start_job", "agentId": id, "command": "sleep 1000", "notifyOnExit": false}))
        .await;
    assert_eq!(other["type"], "job", "{other}");
    let other = other["payload"]["job"]["id"].clone();
    s.answer(other.as_str().expect("a job id")).await;
    s.done().await;
    let jobs = client
        .request(json!({"type": "list_jobs", "agentId": id}))
        .await;
    let killed = find_where(&jobs["payload"]["jobs"], "the second job", |j| {
        j["id"] == other
    });
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(killed["killedBy"], "request", "{killed}");
    // The first job told its agent how it ended (a queued followup, not an interruption).
    eventually("the exit notice", WAIT, async || {
        client.timeline(&id).await.iter().any(|i| {
            i["kind"] == "user_message"
                && i["data"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("job-") && t.contains("exit"))
        })
    })
    .await;
}

#[tokio::test]
async fn opening_an_agent_marks_its_finished_turn_seen_and_the_title_counts_the_rest() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let mut ids = Vec::new();
    for title in ["seen", "unseen"] {
        let id = create(
            &mut client,
            json!({"cwd": daemon.cwd(), "title": title, "prompt": "say done"}),
        )
        .await;
        eventually(format!("{title} to finish"), WAIT, async || {
            client.listed_agent(&id).await["attentionReason"] == "finished"
        })
        .await;
        ids.push(id);
    }
    let mut s = Scenario::start("attention", &daemon, json!({"seen": ids[0]})).await;
    s.step("opened").await;
    assert_eq!(
        client.listed_agent(&ids[0]).await["requiresAttention"],
        false
    );
    assert_eq!(
        client.listed_agent(&ids[1]).await["requiresAttention"],
        true
    );
    s.go().await;
    s.done().await;
}

#[tokio::test]
async fn older_history_is_paged_in_when_scrolling_up() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    // Each `tool` line is an item of its own: more than the first page's 200.
    let prompt: Vec<String> = (1..=230).map(|i| format!("tool step {i}")).collect();
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "long", "prompt": prompt.join("\n")}),
    )
    .await;
    wait_idle(&mut client, &id).await;
    let items = client.timeline(&id).await.len();
    assert!(items > 200, "{items} items");
    Scenario::run("paging", &daemon, json!({"agent": id, "items": items})).await;
}

#[tokio::test]
async fn the_timeline_renders_each_kind_and_never_the_agents_markup() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let prompt = [
        "say <img src=x onerror=window.pwned=1> **bold** `code` [bad](javascript:window.pwned=2) [good](https://example.com/)",
        "think pondering the tests",
        "tool run the linter",
        "plan read the code; fix the bug",
    ]
    .join("\n");
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "kinds", "prompt": prompt}),
    )
    .await;
    wait_idle(&mut client, &id).await;
    Scenario::run("timelineKinds", &daemon, json!({"agent": id})).await;
}

#[tokio::test]
async fn schedules_are_made_paused_and_deleted_from_the_agent_pane() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = idle_agent(&mut client, &daemon, "scheduled").await;
    let mut s = Scenario::start("schedules", &daemon, json!({"agent": agent})).await;
    s.step("created").await;
    let listed = client.request(json!({"type": "list_schedules"})).await;
    let schedules = listed["payload"]["schedules"]
        .as_array()
        .expect("schedules")
        .clone();
    assert_eq!(schedules.len(), 1, "{listed}");
    let made = &schedules[0];
    assert_eq!(made["agentId"], agent.as_str());
    assert_eq!(made["prompt"], "say tick");
    assert_eq!(made["cadence"]["everySecs"], 3600);
    assert_eq!(made["state"], "active");
    let id = made["id"].as_str().expect("id").to_string();
    s.answer(&id).await;
    s.step("paused").await;
    let listed = client.request(json!({"type": "list_schedules"})).await;
    assert_eq!(
        listed["payload"]["schedules"][0]["state"], "paused",
        "{listed}"
    );
    s.go().await;
    s.done().await;
    let listed = client.request(json!({"type": "list_schedules"})).await;
    assert_eq!(listed["payload"]["schedules"], json!([]), "{listed}");
}

#[tokio::test]
async fn a_workspace_terminal_runs_what_is_typed_survives_a_reload_and_ends_with_its_tab() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = idle_agent(&mut client, &daemon, "with a terminal").await;
    let workspace = string_at(&client.listed_agent(&id).await["workspaceId"]);
    let cwd = std::fs::canonicalize(daemon.cwd()).expect("cwd");
    let dir = cwd
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a name")
        .to_string();
    let mut s = Scenario::start("terminals", &daemon, json!({"agent": id, "dir": dir})).await;
    s.step("typed").await;
    let listed = client
        .request(json!({"type": "list_terminals", "workspaceId": workspace}))
        .await;
    let terminal = listed["payload"]["terminals"][0].clone();
    assert_eq!(terminal["cwd"], cwd.display().to_string(), "{listed}");
    let shell = terminal["pid"].as_u64().expect("the shell's pid");
    s.answer(terminal["id"].as_str().expect("an id")).await;
    s.step("closed").await;
    let listed = client.request(json!({"type": "list_terminals"})).await;
    assert_eq!(listed["payload"]["terminals"], json!([]), "{listed}");
    eventually("the shell to end", WAIT, async || {
        !Path::new(&format!("/proc/{shell}")).exists()
    })
    .await;
    s.go().await;
    s.done().await;
}

// ---- failed starts and sign-in ------------------------------------------------------------

/// The key the scripted agent of [`locked_daemon`] takes.
const KEY: &str = "k-ui-secret-42";

/// A daemon whose provider `locked` (label `Locked`) runs the scripted agent requiring a
/// sign-in, with no key given: its agents wait for one.
async fn locked_daemon(state: &Path) -> TestDaemon {
    let config = format!(
        "[providers.locked]\nlabel = \"Locked\"\ncommand = [{bin:?}]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_AUTH_KEY = \"{KEY}\" }}\n",
        bin = drover_testkit::scripted_agent_bin().display().to_string(),
        state = state.display().to_string(),
    );
    TestDaemon::start_fresh_with_config(config).await
}

#[tokio::test]
async fn an_agent_waiting_for_a_sign_in_is_signed_in_from_its_card_and_its_kept_prompt_runs() {
    let state = TempDir::new().expect("state");
    let daemon = locked_daemon(state.path()).await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(json!({"provider": "locked", "cwd": daemon.cwd(), "title": "locked out", "prompt": "say first"}))
        .await;
    eventually("the agent to wait for a sign-in", WAIT, async || {
        client.get_agent(&id).await["attentionReason"] == "auth_required"
    })
    .await;
    let mut s = Scenario::start(
        "signIn",
        &daemon,
        json!({"agent": id, "provider": "locked", "label": "Locked", "key": KEY}),
    )
    .await;
    s.step("opened").await;
    // Two browsers opened it: it still waits, cold, with its prompt and its attention.
    let agent = client.get_agent(&id).await;
    assert_eq!(
        agent["runtime"]["state"], "cold",
        "opening started it: {agent}"
    );
    assert_eq!(agent["attentionReason"], "auth_required", "{agent}");
    assert_eq!(agent["queued"][0]["text"], "say first", "{agent}");
    s.go().await;
    s.done().await;
    assert_eq!(client.replies(&id).await, ["first"]);
    let agent = client.get_agent(&id).await;
    assert!(agent["startFailure"].is_null(), "{agent}");
    let config = std::fs::read_to_string(daemon.home.join("config.toml")).expect("config");
    assert!(
        config.contains(&format!("SCRIPTED_KEY = \"{KEY}\"")),
        "{config}"
    );
    let timeline = serde_json::to_string(&client.timeline(&id).await).expect("json");
    assert!(!timeline.contains(KEY), "the key is in the timeline");
    let log = std::fs::read_to_string(daemon.home.join("daemon.log")).unwrap_or_default();
    assert!(!log.contains(KEY), "the key is in the daemon's log");
}

#[tokio::test]
async fn a_sign_in_the_agent_does_by_itself_is_one_click_on_the_card() {
    let state = TempDir::new().expect("state");
    let daemon = locked_daemon(state.path()).await;
    let (mut client, _) = daemon.client().await;
    let id = client
        .create_agent(
            json!({"provider": "locked", "cwd": daemon.cwd(), "prompt": "say by the agent"}),
        )
        .await;
    eventually("the agent to wait for a sign-in", WAIT, async || {
        client.get_agent(&id).await["attentionReason"] == "auth_required"
    })
    .await;
    Scenario::run("signInByAgent", &daemon, json!({"agent": id})).await;
    assert_eq!(client.replies(&id).await, ["by the agent"]);
    let config = std::fs::read_to_string(daemon.home.join("config.toml")).expect("config");
    assert!(config.contains("auth = \"scripted-login\""), "{config}");
}

#[tokio::test]
async fn a_start_that_failed_shows_its_words_and_retry_starts_it_once_fixed() {
    let scratch = TempDir::new().expect("scratch");
    let starts = scratch.path().join("starts");
    let broken = format!(
        "[providers.broken]\ncommand = [\"/bin/sh\", \"-c\", \"echo x >> {}; echo cannot start >&2; exit 3\"]\n",
        starts.display()
    );
    // The browser first: the scenario must open before the backoff's 30 s run out.
    let browser = BROWSER.lock().await;
    let daemon = TestDaemon::start_fresh_with_config(broken).await;
    let (mut client, _) = daemon.client().await;
    let count = || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count());
    let id = client
        .create_agent(json!({"provider": "broken", "cwd": daemon.cwd(), "title": "broken", "prompt": "say hello"}))
        .await;
    // The first start and the backoff's tries 1 s and 5 s later: the next is 30 s away.
    eventually("three failed starts", WAIT, async || count() == 3).await;
    eventually("the third failure", WAIT, async || {
        client.get_agent(&id).await["runtime"]["retryAt"].is_string()
    })
    .await;
    let mut s = Scenario::start_holding(browser, "failedStart", &daemon, json!({"agent": id}));
    s.step("fix").await;
    assert_eq!(count(), 3, "opening the agent started it");
    let fixed = format!(
        "[providers.broken]\ncommand = [{:?}]\n",
        drover_testkit::scripted_agent_bin().display().to_string()
    );
    std::fs::write(daemon.home.join("config.toml"), fixed).expect("config");
    s.go().await;
    s.done().await;
    assert_eq!(client.replies(&id).await, ["hello"]);
    let agent = client.get_agent(&id).await;
    assert!(agent["startFailure"].is_null(), "{agent}");
    assert_eq!(
        count(),
        3,
        "Retry started the fixed command, not the broken one"
    );
}

// ---- right at every instant, hard to lose work in (issue 24) ------------------------------

#[tokio::test]
async fn the_page_that_made_an_agent_shows_it_running_while_its_first_turn_streams() {
    // The agent takes a second to start, as a real one does: the page opens it while it is
    // still `initializing`, so answers read then reach the page around the newer events.
    let state = TempDir::new().expect("agent state");
    let home = TempDir::new().expect("home");
    let bin = drover_testkit::scripted_agent_bin();
    let config = drover_testkit::scripted_config(&bin, state.path()).replacen(
        &format!("command = [{:?}]", bin.display().to_string()),
        &format!(
            "command = [\"sh\", \"-c\", {:?}]",
            format!("sleep 1; exec '{}'", bin.display())
        ),
        1,
    );
    assert!(config.contains("sleep 1"), "{config}");
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), Some(home), config).await;
    let (mut client, _) = daemon.client().await;
    // The sidebar has a row before the page is ready.
    idle_agent(&mut client, &daemon, "already here").await;
    Scenario::run(
        "statusWhileStreaming",
        &daemon,
        json!({"chunks": 60, "delayMs": 100}),
    )
    .await;
}

#[tokio::test]
async fn collapsing_the_track_and_the_jobs_shows_their_heads_and_never_null() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (parent, child) = parent_and_child(&mut client, &daemon).await;
    let job = client
        .request(json!({"type": "start_job", "agentId": parent, "command": "sleep 1000", "notifyOnExit": false}))
        .await;
    assert_eq!(job["type"], "job", "{job}");
    Scenario::run(
        "collapse",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
}

#[tokio::test]
async fn after_stop_the_queue_shown_is_the_daemons_and_the_dropped_text_comes_back() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "worker", "prompt": LONG_TURN}),
    )
    .await;
    client.wait_status(&id, "running").await;
    let mut s = Scenario::start("stopDropsQueued", &daemon, json!({"agent": id})).await;
    s.step("queued").await;
    let queued = client.get_agent(&id).await["queued"].clone();
    assert_eq!(queued[0]["text"], "say never ran", "{queued}");
    s.go().await;
    s.done().await;
    let info = client.get_agent(&id).await;
    assert_eq!(info["queued"], json!([]), "{info}");
    assert!(
        !client.timeline(&id).await.iter().any(|i| i["data"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("never ran") && i["kind"] == "agent_message")),
        "the dropped message ran"
    );
}

#[tokio::test]
async fn a_root_tab_archives_a_subagent_tab_only_closes_and_an_archive_is_undone_from_its_toast() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let (parent, child) = parent_and_child(&mut client, &daemon).await;
    let mut s = Scenario::start(
        "archiveUndo",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    s.step("archived").await;
    assert!(archived(&mut client, &parent).await);
    s.go().await;
    s.step("unarchived").await;
    assert!(!archived(&mut client, &parent).await);
    s.go().await;
    s.done().await;
}

#[tokio::test]
async fn an_archive_from_another_browser_keeps_the_draft_says_so_and_offers_unarchive() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = idle_agent(&mut client, &daemon, "shared").await;
    let mut s = Scenario::start("archivedWhileTyping", &daemon, json!({"agent": id})).await;
    s.step("archived").await;
    assert!(archived(&mut client, &id).await);
    s.go().await;
    s.done().await;
    assert!(!archived(&mut client, &id).await);
}

#[tokio::test]
async fn at_390_pixels_the_drawer_has_a_backdrop_and_closes_on_a_tap_outside_or_escape() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let id = idle_agent(&mut client, &daemon, "phone").await;
    Scenario::run("phoneDrawer", &daemon, json!({"agent": id})).await;
}

#[tokio::test]
async fn a_subagents_permission_shows_on_its_root_and_one_click_opens_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = idle_agent(&mut client, &daemon, "orchestrator").await;
    let child = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "asker", "parentAgentId": parent, "prompt": "permission deploy"}),
    )
    .await;
    wait_permission(&mut client, &child, "the subagent's permission request").await;
    Scenario::run(
        "subagentAttention",
        &daemon,
        json!({"parent": parent, "child": child}),
    )
    .await;
    answered_permission(&mut client, &child).await;
}

#[tokio::test]
async fn the_page_says_which_agent_is_in_front_and_nothing_is_notified_about_it() {
    use crate::notify::{Answer, Receiver};
    let hook = Receiver::start(Answer::Status(200)).await;
    let daemon = crate::notify::daemon_with(&format!(
        "[[notify.sink]]\nkind = \"webhook\"\nurl = \"{}/\"\nevents = [\"finished\"]\n",
        hook.url
    ))
    .await;
    let (mut client, _) = daemon.client().await;
    let one = idle_agent(&mut client, &daemon, "one").await;
    let two = idle_agent(&mut client, &daemon, "two").await;
    let notified = |n: usize| {
        let hook = hook.clone();
        async move { hook.wait_for(n).await.remove(n - 1).json()["agentId"].clone() }
    };
    let turn = async |client: &mut Client, id: &str| {
        let answer = client
            .request(json!({"type": "send_message", "agentId": id, "text": "say again", "delivery": "followup"}))
            .await;
        assert_eq!(answer["type"], "message_queued", "{answer}");
        wait_idle(client, id).await;
    };
    let mut s = Scenario::start("watching", &daemon, json!({"one": one, "two": two})).await;

    // `one` in front: its turn end is not sent; `two`'s is.
    s.step("front-one").await;
    turn(&mut client, &one).await;
    turn(&mut client, &two).await;
    assert_eq!(notified(1).await, two.as_str());
    s.go().await;

    // The tab switched to `two`.
    s.step("front-two").await;
    turn(&mut client, &two).await;
    turn(&mut client, &one).await;
    assert_eq!(notified(2).await, one.as_str());
    s.go().await;

    // Hidden: `two`, still its front tab, is told about again.
    s.step("hidden").await;
    turn(&mut client, &two).await;
    assert_eq!(notified(3).await, two.as_str());
    s.go().await;
    s.done().await;
    assert_eq!(hook.events().len(), 3, "{:#?}", hook.events());
}

#[tokio::test]
async fn an_agents_header_shows_its_spend_and_its_trees_against_the_budget() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let root = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "frugal", "prompt": "usage",
            "budget": {"tokens": 2400}}),
    )
    .await;
    wait_idle(&mut client, &root).await;
    let child = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "spender", "prompt": "usage",
            "parentAgentId": root}),
    )
    .await;
    wait_idle(&mut client, &child).await;
    let tree_tokens = async |client: &mut Client| {
        let got = client
            .request(json!({"type": "get_agent", "agentId": root}))
            .await;
        got["payload"]["agent"]["treeSpend"]["tokens"].as_u64()
    };
    eventually("2000 tokens spent", WAIT, async || {
        tree_tokens(&mut client).await == Some(2000)
    })
    .await;
    let mut s = Scenario::start("budget", &daemon, json!({"root": root, "child": child})).await;
    s.step("warned").await;
    // The subagent spends past the budget.
    client.send_message(&child, "usage").await;
    s.go().await;
    s.done().await;
}

#[tokio::test]
async fn the_landing_says_which_agents_spent_their_budget_and_which_are_past_80_percent() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    // 1000 tokens of 500: spent; 1000 of 1200: past 80 %.
    let spent = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "spent", "prompt": "usage",
            "budget": {"tokens": 500}}),
    )
    .await;
    let warned = create(
        &mut client,
        json!({"cwd": daemon.cwd(), "title": "warned", "prompt": "usage",
            "budget": {"tokens": 1200}}),
    )
    .await;
    for id in [&spent, &warned] {
        wait_idle(&mut client, id).await;
        eventually("the budget's warning", WAIT, async || {
            client.get_agent(id).await["attentionReason"] == "budget_warning"
        })
        .await;
    }
    Scenario::run(
        "budgetSpentLanding",
        &daemon,
        json!({"spent": spent, "warned": warned}),
    )
    .await;
}

/// Ends a host daemon the test's link started, whatever the test's outcome.
struct HostDaemon(PathBuf);

impl Drop for HostDaemon {
    fn drop(&mut self) {
        let pid = std::fs::read(self.0.join("daemon.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["pid"].as_i64());
        if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn a_hosts_agents_are_under_their_host_and_a_lost_host_says_so() {
    let daemon = TestDaemon::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let b_home = dir.path().join("b");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let down = dir.path().join("down");
    // The link: b's `drover connect --stdio`, or, once `down` exists, what ssh says of a host
    // that refuses connections.
    let link = dir.path().join("link.sh");
    std::fs::write(
        &link,
        format!(
            "if [ -e {down} ]; then echo 'ssh: connect to host b port 22: Connection refused' >&2; exit 255; fi\n\
             exec env HOME={home} DROVER_HOME={b} DROVER_LISTEN=127.0.0.1:0 {drover} connect --stdio\n",
            down = down.display(),
            home = dir.path().display(),
            b = b_home.display(),
            drover = drover_testkit::drover_bin().display(),
        ),
    )
    .expect("link script");
    let b_daemon = HostDaemon(b_home.clone());
    let (mut client, _) = daemon.client().await;
    let added = client
        .request(json!({"type": "add_host", "host": {"name": "b", "command": ["sh", link]}}))
        .await;
    assert_eq!(added["type"], "hosts", "{added}");
    client
        .recv_where(|m| m["type"] == "host_update" && m["payload"]["host"]["state"] == "reachable")
        .await;
    let made = client
        .request(
            json!({"type": "create_agent", "host": "b", "provider": "demo",
            "cwd": work, "prompt": "say hello from b"}),
        )
        .await;
    assert_eq!(made["type"], "agent_created", "{made}");
    assert_eq!(made["payload"]["agent"]["host"], "b", "{made}");
    let remote = string_at(&made["payload"]["agent"]["id"]);
    let idle = client
        .request(json!({"type": "wait_idle", "agentId": remote, "timeoutMs": 20000}))
        .await;
    assert_eq!(idle["type"], "idle", "{idle}");

    // An agent here with a subagent on b.
    let parent = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "title": "parent"}))
        .await;
    let made = client
        .request(
            json!({"type": "create_agent", "host": "b", "provider": "demo", "cwd": work,
            "parentAgentId": parent, "title": "kid on b", "prompt": "say kid here"}),
        )
        .await;
    assert_eq!(made["type"], "agent_created", "{made}");
    assert_eq!(
        made["payload"]["agent"]["parentAgentId"],
        parent.as_str(),
        "{made}"
    );
    let kid = string_at(&made["payload"]["agent"]["id"]);

    let mut s = Scenario::start(
        "hosts",
        &daemon,
        json!({"remote": remote, "parent": parent, "kid": kid}),
    )
    .await;
    s.step("cut").await;
    std::fs::write(&down, "").expect("down");
    drop(b_daemon);
    s.go().await;
    // The next link starts b's daemon again; it is killed when the test ends.
    s.step("heal").await;
    std::fs::remove_file(&down).expect("up");
    let _b_again = HostDaemon(b_home.clone());
    s.go().await;
    s.done().await;
}
