//! Only its user drives drover: the token on loopback too, a private token file, the `Host`
//! check, what `/health` tells a stranger, agents' MCP tokens, worktrees owned by the agents
//! that made them, and WebSocket violations closed with their RFC 6455 codes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, WAIT, find_where, http, string_at};
use drover_testkit::git_repository;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn expect_error(message: &Value, code: &str) {
    assert_eq!(message["type"], "request_error", "{message}");
    assert_eq!(message["payload"]["code"], code, "{message}");
}

async fn create(client: &mut Client, daemon: &TestDaemon, prompt: &str) -> String {
    client
        .create_scripted(&daemon.cwd(), json!({"prompt": prompt}))
        .await
}

/// Sends `text` and waits for the turn to end; what the agent said in it.
async fn say(client: &mut Client, id: &str, text: &str) -> String {
    let before = client.replies(id).await.len();
    client.send_message(id, text).await;
    client.wait_idle(id).await;
    client.replies(id).await[before..].concat()
}

/// The JSON after `mcp <tool>: ` in what an agent said.
fn tool_result(said: &str, tool: &str) -> Value {
    let prefix = format!("mcp {tool}: ");
    let at = said.find(&prefix).unwrap_or_else(|| panic!("{said}"));
    serde_json::from_str(&said[at + prefix.len()..]).unwrap_or_else(|e| panic!("{e}: {said}"))
}

/// Calls an MCP tool at `url` as the agent that owns it would.
async fn mcp(url: &str, tool: &str, arguments: Value) -> Result<String, String> {
    let (url, tool) = (url.to_string(), tool.to_string());
    tokio::task::spawn_blocking(move || {
        drover_fakes::mcp_http::tools_call(&url, &tool, &arguments, WAIT)
            .map_err(|e| format!("{e:?}"))
    })
    .await
    .expect("MCP call")
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path).expect("metadata").mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_a_client_is_refused_even_on_loopback() {
    let daemon = TestDaemon::start().await;
    let token_path = daemon.home.join("token");
    assert_eq!(
        mode(&token_path),
        0o600,
        "the token file is the user's alone"
    );
    let token = daemon.token().expect("a token by default");
    assert!(token.len() >= 32);
    for hello in [
        json!({"type": "hello", "client": "t", "protocolVersion": 1}),
        json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": "wrong"}),
        json!({"type": "hello", "client": "t", "protocolVersion": 1, "token": &token[1..]}),
    ] {
        let mut client = Client::connect(&daemon.ws_url).await;
        client.send(hello).await;
        let answer = client.recv().await;
        expect_error(&answer, "unauthorized");
        assert!(
            answer["payload"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("drover ui --print")),
            "the refusal says where the token is: {answer}"
        );
        assert_eq!(client.close_code().await, Some(1008));
    }
    // Nothing before the hello works either.
    let mut client = Client::connect(&daemon.ws_url).await;
    let answer = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd()}))
        .await;
    expect_error(&answer, "hello_required");
    let (mut client, _) = daemon.client().await;
    assert!(client.agents(false).await.is_empty(), "nothing was created");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_lets_clients_in_but_only_on_loopback() {
    let home = TempDir::new().expect("home");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, true).await;
    let mut client = Client::connect(&daemon.ws_url).await;
    let state = client.hello(None).await;
    assert!(state["agents"].is_array(), "{state}");
    assert!(daemon.token().is_none(), "no token is made with --no-token");
    daemon.stop().await;

    // Reachable from other machines, a daemon without a token is refused at start.
    let home = TempDir::new().expect("home");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut config = drover_daemon::DaemonConfig::new(home.path(), addr).expect("config");
    config.no_token = true;
    let refused = drover_daemon::run(listener, config, std::future::pending())
        .await
        .expect_err("--no-token beyond loopback");
    assert!(refused.to_string().contains("loopback only"), "{refused}");
}

/// Starts a daemon on `home` and returns why it refused to start.
async fn refused_start(home: &std::path::Path) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let config = drover_daemon::DaemonConfig::new(home, listener.local_addr().expect("addr"))
        .expect("config");
    let run = drover_daemon::run(listener, config, std::future::pending());
    match tokio::time::timeout(WAIT, run).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(())) => panic!("the daemon started and stopped"),
        Err(elapsed) => panic!("the daemon started with a bad token file ({elapsed})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_others_could_read_or_reach_through_a_link_is_refused_at_start() {
    let good = "0123456789abcdef0123456789abcdef0123456789abcdef";
    // Readable by others: refused, and left as it was (not rewritten, not used).
    let home = TempDir::new().expect("home");
    let token = home.path().join("token");
    std::fs::write(&token, good).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let why = refused_start(home.path()).await;
    assert!(
        why.contains("mode 644") && why.contains("chmod 600"),
        "{why}"
    );
    assert_eq!(std::fs::read_to_string(&token).expect("token"), good);
    assert_eq!(mode(&token), 0o644);

    // A file that holds no token: refused rather than rewritten. (An empty one, what a first
    // start killed before writing it leaves, is replaced: see `durability`.)
    let home = TempDir::new().expect("home");
    let token = home.path().join("token");
    std::fs::write(&token, "short").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let why = refused_start(home.path()).await;
    assert!(
        why.contains("no usable token") && why.contains("rm "),
        "{why}"
    );
    assert_eq!(std::fs::read_to_string(&token).expect("token"), "short");

    // A link, even to a private file: refused, the target untouched.
    let home = TempDir::new().expect("home");
    let elsewhere = TempDir::new().expect("elsewhere");
    let target = elsewhere.path().join("secret");
    std::fs::write(&target, good).expect("target");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::symlink(&target, home.path().join("token")).expect("link");
    let why = refused_start(home.path()).await;
    assert!(why.contains("symbolic link"), "{why}");
    // A dangling link is not followed to create a file either.
    std::fs::remove_file(&target).expect("remove");
    let why = refused_start(home.path()).await;
    assert!(why.contains("symbolic link"), "{why}");
    assert!(!target.exists(), "nothing was written through the link");

    // Another user's file (the tests run as root in CI, which may chown).
    if nix_is_root() {
        let home = TempDir::new().expect("home");
        let token = home.path().join("token");
        std::fs::write(&token, good).expect("token");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::chown(&token, Some(65534), Some(65534)).expect("chown");
        let why = refused_start(home.path()).await;
        assert!(why.contains("belongs to uid 65534"), "{why}");
    }
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_another_host_are_refused() {
    let daemon = TestDaemon::start().await;
    let addr = daemon.addr().to_string();
    let port = addr.rsplit(':').next().expect("port").to_string();
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (status, body) = http(&addr, "GET", "/health", &host, &[]).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    // A name an attacker controls, resolved to 127.0.0.1 (DNS rebinding), a wrong port, none.
    for host in [
        format!("evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
        "127.0.0.1:1".to_string(),
        "evil.example".to_string(),
        String::new(),
    ] {
        for path in ["/health", "/ws", "/mcp/x", "/"] {
            let (status, body) = http(&addr, "GET", path, &host, &[]).await;
            assert_eq!(status, 421, "{host} {path}: {body}");
            assert!(body.contains("forbidden_host"), "{host} {path}: {body}");
        }
    }
    let refused = Client::connect_with(&daemon.ws_url, &[("Host", "evil.example")]).await;
    assert!(refused.is_err(), "a WebSocket for another host");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_tells_a_stranger_only_that_it_is_alive() {
    let daemon = TestDaemon::start().await;
    let addr = daemon.addr().to_string();
    for headers in [&[][..], &["Authorization: Bearer wrong"][..]] {
        let (status, body) = http(&addr, "GET", "/health", &addr, headers).await;
        assert_eq!(status, 200, "{body}");
        let health: Value = serde_json::from_str(&body).expect("JSON");
        let mut keys: Vec<&str> = health
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["protocolVersion", "status", "version"], "{body}");
        let home = daemon.home.display().to_string();
        assert!(!body.contains(&home), "{body}");
    }
    let health = daemon.health().await;
    assert_eq!(health["pid"], std::process::id());
    assert_eq!(health["home"], daemon.home.display().to_string());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_mcp_token_dies_with_its_archive_and_works_only_at_its_exact_path() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "mcp-servers").await;
    client.wait_idle(&agent).await;
    let servers: Value =
        serde_json::from_str(&client.replies(&agent).await.concat()).expect("mcpServers JSON");
    let url = servers[0]["url"].as_str().expect("url").to_string();
    let token = url.rsplit('/').next().expect("token").to_string();
    assert_eq!(token.len(), 64, "{url}");
    assert!(mcp(&url, "list_agents", json!({})).await.is_ok());

    // Only `/mcp/<token>`: not with more path around it.
    let base = url.trim_end_matches(&format!("/mcp/{token}")).to_string();
    for other in [
        format!("{url}/"),
        format!("{base}/mcp/x/{token}"),
        format!("{base}/mcp/{token}/x"),
    ] {
        let refused = mcp(&other, "list_agents", json!({})).await;
        assert!(refused.is_err(), "{other}: {refused:?}");
    }

    let archived = client
        .request(json!({"type": "archive", "agentId": agent}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let refused = mcp(&url, "list_agents", json!({})).await;
    assert!(refused.is_err(), "archived: {refused:?}");
    let back = client
        .request(json!({"type": "unarchive", "agentId": agent}))
        .await;
    assert_eq!(back["type"], "ok", "{back}");
    let refused = mcp(&url, "list_agents", json!({})).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("unknown or missing agent token")),
        "after unarchive the old token stays dead: {refused:?}"
    );
    // The agent's next runtime has a token of its own.
    let servers: Value =
        serde_json::from_str(&say(&mut client, &agent, "mcp-servers").await).expect("JSON");
    let new_url = servers[0]["url"].as_str().expect("url").to_string();
    assert_ne!(new_url, url);
    assert!(mcp(&new_url, "list_agents", json!({})).await.is_ok());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_archives_only_worktrees_it_owns() {
    let daemon = TestDaemon::start().await;
    git_repository(&daemon.cwd(), &[("README", "hello\n")]);
    let (mut client, _) = daemon.client().await;

    // B, made by the user in a worktree of its own, with uncommitted work there.
    let created = client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "worktree": {"name": "b-work"}}))
        .await;
    assert_eq!(created["type"], "agent_created", "{created}");
    let b = string_at(&created["payload"]["agent"]["id"]);
    let b_workspace = string_at(&created["payload"]["agent"]["workspaceId"]);
    let b_dir = std::path::PathBuf::from(created["payload"]["agent"]["cwd"].as_str().expect("cwd"));
    std::fs::write(b_dir.join("draft.txt"), "not committed\n").expect("draft");

    // A, unrelated, tries to archive it, with and without force.
    let a = create(&mut client, &daemon, "say ready").await;
    client.wait_idle(&a).await;
    for force in [false, true] {
        let call = format!(
            "mcp archive_worktree {{\"workspaceId\": \"{b_workspace}\", \"force\": {force}}}"
        );
        let said = say(&mut client, &a, &call).await;
        assert!(
            said.contains("mcp archive_worktree error:") && said.contains("not yours"),
            "force={force}: {said}"
        );
    }
    assert!(
        b_dir.join("draft.txt").exists(),
        "B's uncommitted work is there"
    );
    let listed = client.agents(false).await;
    assert!(
        listed.iter().any(|x| x["id"] == b.as_str()),
        "B is not archived"
    );

    // C makes a worktree over MCP with no agent in it: it is C's, not A's.
    let c = create(&mut client, &daemon, "say ready").await;
    client.wait_idle(&c).await;
    let said = say(&mut client, &c, r#"mcp create_worktree {"name": "c-work"}"#).await;
    let made = tool_result(&said, "create_worktree");
    let c_workspace = made["workspaceId"]
        .as_str()
        .or_else(|| made["workspace"]["id"].as_str())
        .unwrap_or_else(|| panic!("{made}"))
        .to_string();
    let workspaces = client.request(json!({"type": "list_workspaces"})).await;
    let listed = find_where(
        &workspaces["payload"]["workspaces"],
        "C's worktree listed",
        |w| w["id"] == c_workspace.as_str(),
    );
    assert_eq!(listed["worktree"]["createdBy"], c.as_str(), "{listed}");
    let call =
        format!("mcp archive_worktree {{\"workspaceId\": \"{c_workspace}\", \"force\": true}}");
    let said = say(&mut client, &a, &call).await;
    assert!(
        said.contains("mcp archive_worktree error:") && said.contains("not made by you"),
        "{said}"
    );
    let said = say(&mut client, &c, &call).await;
    assert!(
        said.contains("mcp archive_worktree: "),
        "its maker may: {said}"
    );
    // A user may archive any of them.
    let archived = client
        .request(json!({"type": "archive_workspace", "workspaceId": b_workspace, "force": true}))
        .await;
    assert_eq!(archived["type"], "workspace_archived", "{archived}");
    daemon.stop().await;
}

/// A WebSocket handshake by hand, so that frames the client libraries refuse to send can be.
async fn raw_websocket(daemon: &TestDaemon) -> TcpStream {
    let mut stream = TcpStream::connect(daemon.addr()).await.expect("connect");
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        daemon.addr()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(WAIT, stream.read_exact(&mut byte))
            .await
            .expect("handshake in time")
            .expect("read");
        head.push(byte[0]);
        assert!(head.len() < 4096, "handshake too long");
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    stream
}

/// A client frame, masked as RFC 6455 requires (unless `masked` is false).
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let len = u8::try_from(payload.len()).expect("short payload");
    let mut out = vec![first, if masked { 0x80 | len } else { len }];
    if masked {
        out.extend_from_slice(&mask);
        out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// The code of the close frame the daemon sends, if it sends one before the connection ends.
async fn close_code(stream: &mut TcpStream) -> Option<u16> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let _ = read.await;
    // Server frames are not masked: opcode byte, length byte, then the payload.
    let mut at = 0;
    while at + 2 <= buf.len() {
        let (opcode, len) = (buf[at] & 0x0f, usize::from(buf[at + 1] & 0x7f));
        if opcode == 0x8 && len >= 2 && at + 4 <= buf.len() {
            return Some(u16::from_be_bytes([buf[at + 2], buf[at + 3]]));
        }
        at += 2 + len;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_violations_are_closed_with_their_codes() {
    let daemon = TestDaemon::start().await;
    // Text that is not UTF-8: 1007.
    let mut stream = raw_websocket(&daemon).await;
    stream
        .write_all(&frame(0x81, &[0x7b, 0xff, 0xfe, 0x7d], true))
        .await
        .expect("write");
    assert_eq!(close_code(&mut stream).await, Some(1007));
    // A frame a client must mask, unmasked: 1002.
    let mut stream = raw_websocket(&daemon).await;
    stream
        .write_all(&frame(0x81, b"{}", false))
        .await
        .expect("write");
    assert_eq!(close_code(&mut stream).await, Some(1002));
    // Reserved bits set: 1002.
    let mut stream = raw_websocket(&daemon).await;
    stream
        .write_all(&frame(0xC1, b"{}", true))
        .await
        .expect("write");
    assert_eq!(close_code(&mut stream).await, Some(1002));
    // A close frame whose code no endpoint may send (reserved, or out of range): 1002.
    for code in [1005u16, 999, 5000] {
        let mut stream = raw_websocket(&daemon).await;
        stream
            .write_all(&frame(0x88, &code.to_be_bytes(), true))
            .await
            .expect("write");
        assert_eq!(close_code(&mut stream).await, Some(1002), "close {code}");
    }
    // A valid close is answered with the same code.
    let mut stream = raw_websocket(&daemon).await;
    stream
        .write_all(&frame(0x88, &1000u16.to_be_bytes(), true))
        .await
        .expect("write");
    assert_eq!(close_code(&mut stream).await, Some(1000));
    // The daemon serves on.
    let (mut client, _) = daemon.client().await;
    assert!(client.agents(false).await.is_empty());
    daemon.stop().await;
}

/// A host that lies: its link (a program the test controls) answers `hello` with a state that
/// claims one of the hub's own agents, then streams updates for it. The hub keeps its own
/// agent: clients are never shown the host's version, requests for it stay here.
#[tokio::test]
async fn a_host_cannot_claim_the_hubs_own_agents() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let local = create(&mut client, &daemon, "say mine").await;
    client.wait_idle(&local).await;
    let fake = json!({"id": local, "status": "error", "title": "stolen", "cwd": "/", "type": "x"});
    let state = json!({"type": "session_state", "payload": {"agents": [fake], "workspaces": []}});
    let welcome = json!({"type": "welcome", "payload": {"daemonVersion": "0.1.0",
        "protocolVersion": drover_protocol::PROTOCOL_VERSION, "sessionId": "s"}});
    let update = json!({"type": "agent_update", "payload": {"agentId": local, "timestamp": "t",
        "notification": {"op": "append", "seq": 1, "field": "text", "text": "forged"}, "revision": 999}});
    let dir = TempDir::new().expect("tempdir");
    let script = dir.path().join("liar.sh");
    std::fs::write(
        &script,
        format!(
            "read hello\necho '{welcome}'\necho '{state}'\nwhile true; do echo '{update}'; sleep 0.2; read -t 1 line; done\n"
        ),
    )
    .expect("script");
    let added = client
        .request(json!({"type": "add_host", "host": {"name": "liar", "command": ["sh", script]}}))
        .await;
    assert_eq!(added["type"], "hosts", "{added}");
    client
        .recv_where(|m| m["type"] == "host_update" && m["payload"]["host"]["state"] == "reachable")
        .await;
    let opened = client
        .request(json!({"type": "initialize_agent_request", "agentId": local}))
        .await;
    assert_eq!(opened["type"], "agent_initialized", "{opened}");
    assert!(opened["payload"]["info"].get("host").is_none(), "{opened}");
    // A second of the liar's updates: none reaches the client.
    let forged = tokio::time::timeout(
        Duration::from_secs(1),
        client.recv_where(|m| m["type"] == "agent_update" && m.to_string().contains("forged")),
    )
    .await;
    assert!(forged.is_err(), "a forged update reached the client");
    let agents = client.request(json!({"type": "list_agents"})).await;
    let listed: Vec<&Value> = agents["payload"]["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter(|a| a["id"] == local.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{agents}");
    assert!(
        listed[0].get("host").is_none() && listed[0]["title"] != "stolen",
        "{agents}"
    );
}

/// A host's notices are queued only for the hub's agents that made an agent there, and a
/// notice offered twice (as after a cut between queueing and acknowledging) is queued once.
/// The host is a script speaking the protocol on the link's stdio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_notices_reach_only_its_parents_and_only_once() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let bystander = create(&mut client, &daemon, "say mine").await;
    client.wait_idle(&bystander).await;
    let kid = "0193b1c2-7d4e-7a10-8000-00000000000b";
    let dir = TempDir::new().expect("tempdir");
    let script = fake_host(dir.path(), kid, &bystander);
    let added = client
        .request(json!({"type": "add_host", "host": {"name": "fake", "command": ["sh", script]}}))
        .await;
    assert_eq!(added["type"], "hosts", "{added}");
    client
        .recv_where(|m| m["type"] == "host_update" && m["payload"]["host"]["state"] == "reachable")
        .await;

    let call = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "current", "cwd": "/srv"}, "host": "fake", "prompt": "work"}"#;
    let parent = create(&mut client, &daemon, call).await;
    let heard = async |client: &mut Client, agent: &str| -> Vec<Value> {
        client
            .timeline(agent)
            .await
            .into_iter()
            .filter(|i| {
                i["kind"] == "user_message" && i["data"]["source"] == format!("agent:{kid}")
            })
            .collect()
    };
    let told = drover_testkit::wait::poll_until(WAIT, async || {
        let heard = heard(&mut client, &parent).await;
        (!heard.is_empty()).then_some(heard)
    })
    .await
    .expect("the parent heard from its subagent's host");
    assert_eq!(
        told[0]["data"]["messageId"],
        "0193b1c2-0000-7000-8000-000000000001"
    );
    client.wait_idle(&parent).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.wait_idle(&parent).await;
    assert_eq!(
        heard(&mut client, &parent).await.len(),
        1,
        "offered twice, queued once"
    );
    assert!(
        heard(&mut client, &bystander).await.is_empty(),
        "a host prompted an agent that made nothing there"
    );
    // Nor is a notice taken from an agent the host does not hold.
    let forged = client
        .timeline(&parent)
        .await
        .into_iter()
        .filter(|i| {
            i["kind"] == "user_message"
                && i["data"]["messageId"] == "0193b1c2-0000-7000-8000-000000000003"
        })
        .count();
    assert_eq!(
        forged, 0,
        "a notice from an agent the host does not hold was taken"
    );
}

/// A host's daemon played by a script on the link's stdio: it answers every request; asked to
/// create an agent, it makes `kid` for the asking agent (as the hub gives it in `upstream`) and
/// offers one notice from it twice, one for `bystander`, and one from an agent it does not hold.
fn fake_host(dir: &std::path::Path, kid: &str, bystander: &str) -> std::path::PathBuf {
    let file = |name: &str, text: String| {
        std::fs::write(dir.join(name), text + "\n").expect("script file");
    };
    file(
        "welcome.json",
        json!({"type": "welcome", "payload": {"daemonVersion": "0.1.0",
        "protocolVersion": drover_protocol::PROTOCOL_VERSION, "sessionId": "s"}})
        .to_string(),
    );
    file(
        "state.json",
        json!({"type": "session_state", "payload": {"agents": [], "workspaces": []}}).to_string(),
    );
    file(
        "created.json",
        json!({"type": "agent_created", "payload": {"requestId": "REQ",
        "agent": {"id": kid, "parentAgentId": "PARENT", "title": "kid", "provider": "scripted",
            "cwd": "/srv", "workspaceId": "0193b1c2-7d4e-7a10-8000-00000000000c"}}})
        .to_string(),
    );
    file(
        "status.json",
        json!({"type": "agent_status", "payload": {"agent": {"id": kid,
        "parentAgentId": "PARENT", "title": "kid", "provider": "scripted", "status": "idle",
        "cwd": "/srv", "workspaceId": "0193b1c2-7d4e-7a10-8000-00000000000c"}}})
        .to_string(),
    );
    file(
        "notice.json",
        json!({"type": "notice_queued", "payload": {"notice": {"id": "NID",
        "at": "2026-12-05T00:00:00Z", "from": kid, "to": "TO", "delivery": "followup",
        "text": "say heard from the kid"}}})
        .to_string(),
    );
    let script = dir.join("host.sh");
    std::fs::write(
        &script,
        format!(
            r#"cd '{dir}'
read hello
cat welcome.json state.json
once=0193b1c2-0000-7000-8000-000000000001
while IFS= read -r line; do
  req=$(printf '%s\n' "$line" | sed -n 's/.*"requestId":"\([^"]*\)".*/\1/p')
  case "$line" in
    *'"type":"take_notices"'*) printf '{{"type":"notices","payload":{{"requestId":"%s","notices":[]}}}}\n' "$req" ;;
    *'"type":"create_agent"'*)
      parent=$(printf '%s\n' "$line" | sed -n 's/.*"upstream":{{"agentId":"\([^"]*\)".*/\1/p')
      sed -e "s/REQ/$req/" -e "s/PARENT/$parent/" created.json
      sed -e "s/PARENT/$parent/" status.json
      sed -e "s/NID/$once/" -e "s/TO/$parent/" notice.json
      sed -e "s/NID/$once/" -e "s/TO/$parent/" notice.json
      sed -e "s/NID/0193b1c2-0000-7000-8000-000000000002/" -e "s/TO/{bystander}/" notice.json
      sed -e "s/NID/0193b1c2-0000-7000-8000-000000000003/" -e "s/TO/$parent/" -e "s/{kid}/0193b1c2-7d4e-7a10-8000-0000000000ff/" notice.json ;;
    *) printf '{{"type":"ok","payload":{{"requestId":"%s","agentId":null}}}}\n' "$req" ;;
  esac
done
"#,
            dir = dir.display(),
        ),
    )
    .expect("script");
    script
}
