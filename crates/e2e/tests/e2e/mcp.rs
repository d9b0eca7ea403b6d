//! Agents driving drover through its MCP server: the scripted agent calls the tools at the URL
//! it got in `session/new`, through the real daemon.

use drover_testkit::daemon::{Client, TestDaemon, WAIT, find_where, string_at};
use drover_testkit::git_repository;
use drover_testkit::wait::poll_until;
use serde_json::{Value, json};

async fn create(client: &mut Client, daemon: &TestDaemon, prompt: &str, title: &str) -> String {
    client
        .create_scripted(&daemon.cwd(), json!({"prompt": prompt, "title": title}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_creates_a_subagent_and_hears_back() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let call = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "current"}, "title": "kid", "prompt": "say child reporting"}"#;
    let parent = create(&mut client, &daemon, call, "parent").await;
    client.wait_idle(&parent).await;
    let said = client.replies(&parent).await;
    assert!(said[0].starts_with("mcp create_agent: "), "{said:?}");
    let result: Value = serde_json::from_str(said[0].trim_start_matches("mcp create_agent: "))
        .expect("tool result JSON");
    assert_eq!(result["relationship"], "subagent");
    let child = result["agentId"].as_str().expect("child id").to_string();

    // The child shows under its parent, ran its prompt, and the parent was told.
    let listed = client.agents(false).await;
    let kid = listed
        .iter()
        .find(|a| a["id"] == child)
        .expect("child listed");
    assert_eq!(kid["parentAgentId"], parent.as_str());
    assert_eq!(kid["title"], "kid");
    client.wait_idle(&child).await;
    assert_eq!(client.replies(&child).await, ["child reporting"]);
    client.wait_idle(&parent).await;
    let notices: Vec<Value> = client
        .timeline(&parent)
        .await
        .into_iter()
        .filter(|i| i["kind"] == "user_message" && i["data"]["source"] == format!("agent:{child}"))
        .collect();
    assert_eq!(notices.len(), 1, "one notice");
    let text = notices[0]["data"]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("finished its turn") && text.contains("> child reporting"),
        "{text}"
    );

    // Archiving the parent takes the subagent with it, and the subagent's running turn ends
    // canceled by its parent.
    client.send_message(&child, "sleep 100000").await;
    poll_until(WAIT, async || {
        let agents = client.agents(false).await;
        agents
            .iter()
            .any(|a| a["id"] == child && a["status"] == "running")
            .then_some(())
    })
    .await
    .expect("the child runs its long turn");
    let archived = client
        .request(json!({"type": "archive", "agentId": parent, "stopActivity": true}))
        .await;
    let list: Vec<&str> = archived["payload"]["archived"]
        .as_array()
        .expect("archived")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(list, [parent.as_str(), child.as_str()]);
    let ended = poll_until(WAIT, async || {
        let items = client.timeline(&child).await;
        let last = items.last()?.clone();
        (last["kind"] == "turn_ended").then_some(last)
    })
    .await
    .expect("the child's last turn ended");
    assert_eq!(ended["data"]["event"], "turn_canceled", "{ended}");
    assert_eq!(ended["data"]["cause"], "parent", "{ended}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_name_the_field_and_agents_only_control_their_own() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let other = create(&mut client, &daemon, "say I am someone else", "other").await;
    client.wait_idle(&other).await;
    let script = format!(
        "mcp create_agent {{\"workspace\": {{\"kind\": \"current\"}}, \"prompt\": \"say x\"}}\n\
         mcp create_agent {{\"relationship\": {{\"kind\": \"sideways\"}}, \"workspace\": {{\"kind\": \"current\"}}}}\n\
         mcp cancel_agent {{\"agentId\": \"{other}\"}}\n\
         mcp get_agent {{\"agentId\": \"{other}\"}}\n\
         mcp list_agents {{\"scope\": \"all\"}}"
    );
    let caller = create(&mut client, &daemon, &script, "caller").await;
    client.wait_idle(&caller).await;
    let said = client.replies(&caller).await.concat();
    assert!(
        said.contains("mcp create_agent error: invalid arguments: missing field `relationship`"),
        "{said}"
    );
    assert!(said.contains("unknown variant `sideways`"), "{said}");
    assert!(
        said.contains("mcp cancel_agent error:") && said.contains("is not yours"),
        "{said}"
    );
    assert!(
        said.contains("mcp get_agent: ") && said.contains("I am someone else"),
        "read-only tools work on any agent: {said}"
    );
    assert!(
        said.contains("mcp list_agents: ") && said.contains(&other),
        "{said}"
    );
    // Nothing was created by the failed calls.
    assert_eq!(client.agents(false).await.len(), 2);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_valid_token_is_refused() {
    let daemon = TestDaemon::start().await;
    let addr = daemon.url.trim_start_matches("http://").to_string();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{}}}"#;
    for path in ["/mcp/not-a-token", "/mcp/"] {
        let response = tokio::task::spawn_blocking({
            let addr = addr.clone();
            move || {
                use std::io::{Read, Write};
                let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
                write!(
                    stream,
                    "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .expect("write");
                let mut out = String::new();
                stream.read_to_string(&mut out).expect("read");
                out
            }
        })
        .await
        .expect("request");
        assert!(
            response.contains("unknown or missing agent token"),
            "{path}: {response}"
        );
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_in_a_new_worktree_and_the_worktree_archived() {
    let daemon = TestDaemon::start().await;
    git_repository(&daemon.cwd(), &[("README", "hello\n")]);
    let (mut client, _) = daemon.client().await;
    let call = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "create", "source": {"kind": "worktree", "name": "feature"}}, "title": "worker", "prompt": "cwd"}"#;
    let parent = create(&mut client, &daemon, call, "lead").await;
    client.wait_idle(&parent).await;
    let said = client.replies(&parent).await;
    let result: Value = serde_json::from_str(said[0].trim_start_matches("mcp create_agent: "))
        .expect("tool result JSON");
    let child = result["agentId"].as_str().expect("child").to_string();
    let worktree = std::path::PathBuf::from(result["cwd"].as_str().expect("cwd"));
    assert!(
        worktree.starts_with(daemon.home.join("worktrees")),
        "{worktree:?}"
    );
    assert!(
        worktree.join("README").exists(),
        "the worktree holds the checkout"
    );
    client.wait_idle(&child).await;
    assert_eq!(
        client.replies(&child).await,
        [worktree.display().to_string()],
        "the child runs in the worktree"
    );
    let workspace = string_at(&result["workspaceId"]);
    assert_ne!(workspace, "", "a workspace of its own");

    // The lead archives the worktree: its agent goes with it, the directory is removed.
    client.wait_idle(&parent).await;
    let archive = format!("mcp archive_worktree {{\"workspaceId\": \"{workspace}\"}}");
    let sent = client
        .request(json!({"type": "send_message", "agentId": parent, "text": archive}))
        .await;
    assert_eq!(sent["type"], "message_queued");
    client.wait_idle(&parent).await;
    let said = client.replies(&parent).await.concat();
    assert!(said.contains("mcp archive_worktree: "), "{said}");
    assert!(!worktree.exists(), "the worktree directory is gone");
    let all = client
        .request(json!({"type": "list_agents", "includeArchived": true}))
        .await;
    let kid = find_where(&all["payload"]["agents"], "child", |a| a["id"] == child);
    assert!(
        kid["archivedAt"].is_string(),
        "the worktree's agent is archived: {kid}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_archived_agent_takes_the_worktree_made_for_it() {
    let daemon = TestDaemon::start().await;
    git_repository(&daemon.cwd(), &[("README", "hello\n")]);
    let (mut client, _) = daemon.client().await;
    let call = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "create", "source": {"kind": "worktree", "name": "oneshot"}}, "autoArchive": true, "notifyOnFinish": false, "prompt": "say done"}"#;
    let parent = create(&mut client, &daemon, call, "lead").await;
    client.wait_idle(&parent).await;
    let said = client.replies(&parent).await;
    let result: Value = serde_json::from_str(said[0].trim_start_matches("mcp create_agent: "))
        .expect("tool result JSON");
    let child = result["agentId"].as_str().expect("child").to_string();
    let worktree = std::path::PathBuf::from(result["cwd"].as_str().expect("cwd"));
    assert!(
        poll_until(std::time::Duration::from_secs(20), async || !worktree
            .exists())
        .await
        .is_some(),
        "the worktree outlived its autoArchived agent"
    );
    let all = client
        .request(json!({"type": "list_agents", "includeArchived": true}))
        .await;
    let kid = find_where(&all["payload"]["agents"], "child", |a| a["id"] == child);
    assert!(kid["archivedAt"].is_string(), "{kid}");
    daemon.stop().await;
}

/// A daemon listening on another loopback address than 127.0.0.1: its agents call the MCP
/// server at that address, and a name allowed with `--allow-host` reaches it too. One `Host`
/// rule (the daemon's) holds for every route, `/mcp` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_on_another_loopback_address_and_an_allowed_name() {
    let daemon = TestDaemon::start_allowing("127.0.0.2:0", &["drover.test"]).await;
    let (mut client, _) = daemon.client().await;
    let agent = create(
        &mut client,
        &daemon,
        "mcp list_agents {\"scope\": \"all\"}",
        "far",
    )
    .await;
    client.wait_idle(&agent).await;
    let said = client.replies(&agent).await;
    assert!(
        said[0].starts_with("mcp list_agents: ") && said[0].contains(&agent),
        "the agent's own MCP call on 127.0.0.2 failed: {said:?}"
    );
    client.send_message(&agent, "mcp-servers").await;
    let servers = poll_until(WAIT, async || {
        let said = client.replies(&agent).await;
        serde_json::from_str::<Value>(said.get(1)?).ok()
    })
    .await
    .expect("the agent says its MCP servers");
    let url = servers[0]["url"].as_str().expect("an HTTP MCP server");
    let path = url
        .strip_prefix(&daemon.url)
        .unwrap_or_else(|| panic!("{url} is not on {}", daemon.url));
    let port = daemon.addr().rsplit_once(':').expect("a port").1;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{"scope":"all"}}}"#;
    let call = |host: String| {
        let (addr, path) = (daemon.addr().to_string(), path.to_string());
        async move {
            let length = format!("Content-Length: {}", body.len());
            let headers = [
                "Content-Type: application/json",
                "Accept: application/json, text/event-stream",
                length.as_str(),
            ];
            drover_testkit::daemon::http_with_body(&addr, "POST", &path, &host, &headers, body)
                .await
        }
    };
    let (status, answer) = call(format!("drover.test:{port}")).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(&agent), "{answer}");
    // A name nobody allowed is refused by the same rule as every other route.
    let (status, answer) = call(format!("evil.test:{port}")).await;
    assert_eq!(status, 421, "{answer}");
    assert!(answer.contains("forbidden_host"), "{answer}");
    daemon.stop().await;
}

/// `list_agents` over MCP: the caller's subagents by default, its workspace's agents, or all;
/// never an archived one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_agents_scopes_are_the_callers_subagents_workspace_or_all() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let far = client
        .create_agent(json!({"provider": "scripted", "cwd": elsewhere.path(), "prompt": "say far"}))
        .await;
    let near = create(&mut client, &daemon, "say near", "near").await;
    let gone = create(&mut client, &daemon, "say gone", "gone").await;
    client.wait_idle(&gone).await;
    let archived = client
        .request(json!({"type": "archive", "agentId": gone, "stopActivity": true}))
        .await;
    assert_ne!(archived["type"], "request_error", "{archived}");

    let script = "mcp create_agent {\"relationship\": {\"kind\": \"subagent\"}, \"workspace\": {\"kind\": \"current\"}, \"prompt\": \"say kid\", \"notifyOnFinish\": false}\n\
         mcp list_agents {}\n\
         mcp list_agents {\"scope\": \"workspace\"}\n\
         mcp list_agents {\"scope\": \"all\"}";
    let lead = create(&mut client, &daemon, script, "lead").await;
    client.wait_idle(&lead).await;
    // One message with each call's answer after the other, each starting `mcp <tool>: `.
    let said = client.replies(&lead).await.concat();
    let answers: Vec<Value> = said
        .split("mcp ")
        .filter(|a| !a.is_empty())
        .map(|a| {
            let (_, json) = a.split_once(": ").unwrap_or_else(|| panic!("{said}"));
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {said}"))
        })
        .collect();
    assert_eq!(answers.len(), 4, "{said}");
    let kid = answers[0]["agentId"].as_str().expect("kid").to_string();
    let listed: Vec<Vec<String>> = answers[1..]
        .iter()
        .map(|result| {
            let mut ids: Vec<String> = result["agents"]
                .as_array()
                .expect("agents")
                .iter()
                .map(|a| a["agentId"].as_str().expect("id").to_string())
                .collect();
            ids.sort();
            ids
        })
        .collect();
    let sorted = |mut ids: Vec<&String>| {
        ids.sort();
        ids.into_iter().cloned().collect::<Vec<String>>()
    };
    assert_eq!(
        listed[0],
        sorted(vec![&kid]),
        "the default scope: the caller's subagents"
    );
    assert_eq!(listed[1], sorted(vec![&lead, &near, &kid]), "its workspace");
    assert_eq!(listed[2], sorted(vec![&lead, &near, &kid, &far]), "all");
    daemon.stop().await;
}
