//! Workspace terminals (`create_terminal` and the rest), a real daemon process, a real shell
//! on a real PTY: what is typed runs in the workspace's directory and its output reaches
//! every attached client, a second client gets the scrollback, and nothing the shell started
//! outlives the terminal's close, its workspace's archive, or the daemon's SIGKILL. Not the
//! agents' ACP client terminals (`terminals.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_testkit::daemon::Client;
use drover_testkit::wait::poll_until;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::processes::{DaemonProcess, alive, config, create};

/// How long what a terminal started may outlive its end.
const WITHIN: Duration = Duration::from_secs(2);

struct Setup {
    daemon: DaemonProcess,
    client: Client,
    _dirs: (TempDir, TempDir, TempDir),
    cwd: PathBuf,
}

async fn setup() -> Setup {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("agent state");
    let cwd = TempDir::new().expect("cwd");
    let path = std::fs::canonicalize(cwd.path()).expect("cwd");
    std::fs::write(home.path().join("config.toml"), config(state.path())).expect("config");
    let daemon = DaemonProcess::start(home.path()).await;
    let client = daemon.client().await;
    Setup {
        daemon,
        client,
        _dirs: (home, state, cwd),
        cwd: path,
    }
}

/// The workspace of a new agent in `cwd`.
async fn workspace_in(client: &mut Client, cwd: &Path) -> String {
    let agent = create(client, "scripted", cwd, "say hi").await;
    let found = client
        .request(json!({"type": "get_agent", "agentId": agent}))
        .await;
    found["payload"]["agent"]["workspaceId"]
        .as_str()
        .unwrap_or_else(|| panic!("no workspace in {found}"))
        .to_string()
}

async fn open(client: &mut Client, workspace: &str) -> Value {
    let opened = client
        .request(
            json!({"type": "create_terminal", "workspaceId": workspace, "cols": 100, "rows": 30}),
        )
        .await;
    assert_eq!(opened["type"], "terminal", "{opened}");
    opened["payload"]["terminal"].clone()
}

async fn attach(client: &mut Client, terminal: &str) -> Value {
    let attached = client
        .request(json!({"type": "attach_terminal", "terminalId": terminal}))
        .await;
    assert_eq!(attached["type"], "terminal_attached", "{attached}");
    attached["payload"].clone()
}

async fn type_in(client: &mut Client, terminal: &str, data: &str) {
    let typed = client
        .request(json!({"type": "terminal_input", "terminalId": terminal, "data": data}))
        .await;
    assert_eq!(typed["type"], "ok", "{typed}");
}

/// What the attached terminal shows from now, once it contains `want`.
async fn output_until(client: &mut Client, terminal: &str, want: &str) -> String {
    output_where(client, terminal, |text| text.contains(want)).await
}

/// What the attached terminal shows from now, once `done` says it is enough; each event's
/// offset follows the one before.
async fn output_where(client: &mut Client, terminal: &str, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    let mut next: Option<u64> = None;
    loop {
        let out = client
            .recv_where(|m| {
                m["type"] == "terminal_output" && m["payload"]["terminalId"] == terminal
            })
            .await;
        let offset = out["payload"]["offset"].as_u64().expect("offset");
        if let Some(next) = next {
            assert_eq!(offset, next, "output skipped or repeated: {out}");
        }
        next = out["payload"]["nextOffset"].as_u64();
        text.push_str(out["payload"]["data"].as_str().expect("data"));
        if done(&text) {
            return text;
        }
    }
}

/// The pid a shell printed after `bg=` (the echo of the command line has `bg=$!`).
fn printed_pid(text: &str) -> Option<i32> {
    text.split("bg=").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// Starts `sleep 1000` in the background of the attached terminal's shell: its pid.
async fn background_sleep(client: &mut Client, terminal: &str) -> i32 {
    type_in(client, terminal, "sleep 1000 & echo bg=$!\n").await;
    let text = output_where(client, terminal, |text| printed_pid(text).is_some()).await;
    let pid = printed_pid(&text).expect("pid");
    assert!(alive(pid), "the background sleep {pid} is not running");
    pid
}

/// A new terminal of `workspace`, attached, with `sleep 1000` in its shell's background: the
/// terminal, its id, the sleep's pid.
async fn busy_terminal(client: &mut Client, workspace: &str) -> (Value, String, i32) {
    let terminal = open(client, workspace).await;
    let id = terminal["id"].as_str().expect("id").to_string();
    attach(client, &id).await;
    let sleep = background_sleep(client, &id).await;
    (terminal, id, sleep)
}

async fn gone_within(pids: &[i32], what: &str) {
    let gone = poll_until(WITHIN, async || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    })
    .await;
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        gone.is_some(),
        "{what}: still alive after {WITHIN:?}: {left:?}"
    );
}

fn pid_of(terminal: &Value) -> i32 {
    i32::try_from(terminal["pid"].as_u64().expect("pid")).expect("pid")
}

#[tokio::test]
async fn workspace_terminals_run_in_their_workspace_are_shared_and_end_with_it_or_the_daemon() {
    let Setup {
        daemon,
        mut client,
        _dirs,
        cwd,
    } = setup().await;
    let workspace = workspace_in(&mut client, &cwd).await;
    let terminal = open(&mut client, &workspace).await;
    let id = terminal["id"].as_str().expect("id").to_string();
    assert_eq!(terminal["cwd"], cwd.display().to_string(), "{terminal}");
    assert_eq!(
        (terminal["cols"].as_u64(), terminal["rows"].as_u64()),
        (Some(100), Some(30))
    );
    let update = client
        .recv_where(|m| m["type"] == "terminal_update" && m["payload"]["terminalId"] == id)
        .await;
    assert_eq!(
        update["payload"]["terminal"]["workspaceId"], workspace,
        "{update}"
    );

    // Typed into, it runs in the workspace's directory on a terminal.
    assert_eq!(attach(&mut client, &id).await["offset"], 0);
    type_in(
        &mut client,
        &id,
        "echo $((6*7)); pwd; test -t 0 && echo tty=y''es\n",
    )
    .await;
    let text = output_until(&mut client, &id, "tty=yes").await;
    assert!(text.contains("42"), "{text:?}");
    assert!(text.contains(&cwd.display().to_string()), "{text:?}");
    // The daemon's secrets are not in its environment; the terminal type is.
    type_in(
        &mut client,
        &id,
        "echo token=${DROVER_TOKEN:-none} term=$TERM\n",
    )
    .await;
    let text = output_until(&mut client, &id, "term=xterm-256color").await;
    assert!(text.contains("token=none"), "{text:?}");

    // Resized, its programs see the new size.
    let resized = client
        .request(json!({"type": "resize_terminal", "terminalId": id, "cols": 120, "rows": 40}))
        .await;
    assert_eq!(resized["payload"]["terminal"]["cols"], 120, "{resized}");
    type_in(&mut client, &id, "stty size\n").await;
    output_until(&mut client, &id, "40 120").await;

    // A second client attaching gets the scrollback, then what comes next.
    let mut second = daemon.client().await;
    let listed = second
        .request(json!({"type": "list_terminals", "workspaceId": workspace}))
        .await;
    assert_eq!(listed["payload"]["terminals"][0]["id"], id, "{listed}");
    attach(&mut second, &id).await;
    let replay = output_until(&mut second, &id, "40 120").await;
    assert!(
        replay.contains("42") && replay.contains("tty=yes"),
        "{replay:?}"
    );
    type_in(&mut client, &id, "echo both=$((20+1))\n").await;
    output_until(&mut second, &id, "both=21").await;
    output_until(&mut client, &id, "both=21").await;

    // Closing it ends the shell and what it left in the background.
    let sleep = background_sleep(&mut client, &id).await;
    let closed = client
        .request(json!({"type": "close_terminal", "terminalId": id}))
        .await;
    assert_eq!(closed["type"], "terminal", "{closed}");
    gone_within(&[pid_of(&terminal), sleep], "a closed terminal").await;
    let exit = second
        .recv_where(|m| m["type"] == "terminal_exit" && m["payload"]["terminalId"] == id)
        .await;
    assert!(exit["payload"]["status"].is_string(), "{exit}");
    let listed = client.request(json!({"type": "list_terminals"})).await;
    assert_eq!(listed["payload"]["terminals"], json!([]), "{listed}");
    let unknown = client
        .request(json!({"type": "terminal_input", "terminalId": id, "data": "x"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "unknown_terminal", "{unknown}");

    // Archiving its workspace ends a terminal; an archived workspace opens none.
    let (terminal, _, sleep) = busy_terminal(&mut client, &workspace).await;
    let archived = client
        .request(json!({"type": "archive_workspace", "workspaceId": workspace}))
        .await;
    assert_eq!(archived["type"], "workspace_archived", "{archived}");
    gone_within(
        &[pid_of(&terminal), sleep],
        "an archived workspace's terminal",
    )
    .await;
    let refused = client
        .request(json!({"type": "create_terminal", "workspaceId": workspace}))
        .await;
    assert_eq!(
        refused["payload"]["code"], "workspace_archived",
        "{refused}"
    );

    // A daemon that stops ends its terminals and what they started.
    let other = cwd.join("other");
    std::fs::create_dir(&other).expect("another directory");
    let workspace = workspace_in(&mut client, &other).await;
    let (terminal, _, sleep) = busy_terminal(&mut client, &workspace).await;
    daemon.stop().await;
    gone_within(&[pid_of(&terminal), sleep], "a stopped daemon's terminal").await;
}

#[tokio::test]
async fn workspace_terminals_are_out_of_reach_without_the_token_end_with_their_shell_and_the_daemon()
 {
    let Setup {
        mut daemon,
        mut client,
        _dirs,
        cwd,
    } = setup().await;
    let workspace = workspace_in(&mut client, &cwd).await;
    let (terminal, id, sleep) = busy_terminal(&mut client, &workspace).await;

    // Without the token nothing reaches it: no request before a `hello` that carries it.
    let mut stranger = Client::connect(daemon.ws_url()).await;
    let typed = stranger
        .request(json!({"type": "terminal_input", "terminalId": id, "data": "touch pwned\n"}))
        .await;
    assert_eq!(typed["payload"]["code"], "hello_required", "{typed}");
    stranger
        .send(json!({"type": "hello", "client": "test", "protocolVersion": 1, "token": "wrong"}))
        .await;
    let refused = stranger.recv_type("request_error").await;
    assert_eq!(refused["payload"]["code"], "unauthorized", "{refused}");
    assert!(!cwd.join("pwned").exists());

    // A shell that exits ends its terminal: attached clients are told how.
    let short = open(&mut client, &workspace).await;
    let short_id = short["id"].as_str().expect("id").to_string();
    attach(&mut client, &short_id).await;
    type_in(&mut client, &short_id, "exit 3\n").await;
    let exit = client
        .recv_where(|m| m["type"] == "terminal_exit" && m["payload"]["terminalId"] == short_id)
        .await;
    assert_eq!(exit["payload"]["status"], "exit status 3", "{exit}");
    assert_eq!(exit["payload"]["exitCode"], 3, "{exit}");
    client
        .recv_where(|m| {
            m["type"] == "terminal_update"
                && m["payload"]["terminalId"] == short_id
                && m["payload"]["terminal"].is_null()
        })
        .await;
    let listed = client.request(json!({"type": "list_terminals"})).await;
    assert_eq!(listed["payload"]["terminals"][0]["id"], id, "{listed}");
    assert_eq!(
        listed["payload"]["terminals"].as_array().map(Vec::len),
        Some(1)
    );

    // The daemon's death ends the shell and what it started.
    daemon.sigkill();
    gone_within(&[pid_of(&terminal), sleep], "a SIGKILLed daemon's terminal").await;
}
