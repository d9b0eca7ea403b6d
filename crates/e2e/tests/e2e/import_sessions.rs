//! `import_sessions`: a provider's own past sessions, listed by its agent through ACP
//! `session/list`, come in as agents whose next message continues the session (its history
//! replayed into the timeline by `session/load`); importing again
//! brings nothing twice, a session drover's own agent made is left alone, and a provider whose
//! agent cannot list says so.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_fakes::acp_client::{AcpClient, AgentCommand, ClientOptions};
use drover_testkit::daemon::{Client, TestDaemon, string_at};
use serde_json::{Value, json};
use tempfile::TempDir;

/// A session the user had with the scripted agent outside drover (through another client),
/// in `cwd`, with these prompts; its id.
async fn session_made_elsewhere(state: &Path, cwd: &Path, prompts: &[&str]) -> String {
    let command = AgentCommand {
        program: drover_testkit::scripted_agent_bin(),
        args: Vec::new(),
        env: BTreeMap::from([(
            "SCRIPTED_AGENT_STATE_DIR".to_string(),
            state.display().to_string(),
        )]),
        cwd: cwd.to_path_buf(),
    };
    let agent = AcpClient::spawn(&command, ClientOptions::default()).expect("spawn the agent");
    agent.initialize().await.expect("initialize");
    let session = agent.new_session(cwd).await.expect("session/new");
    for prompt in prompts {
        agent.prompt(&session, prompt).await.expect("a turn");
    }
    agent.shutdown(Duration::from_secs(2)).await;
    session
}

async fn import(client: &mut Client, fields: Value) -> Value {
    let mut request = json!({"type": "import_sessions", "provider": "scripted"});
    for (key, value) in fields.as_object().expect("fields") {
        request[key] = value.clone();
    }
    let answer = client.request(request).await;
    assert_eq!(answer["type"], "imported", "{answer}");
    answer["payload"].clone()
}

/// `(sourceId, agentId, title)` of each imported session.
fn imported(answer: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    let text = |v: &Value| v.as_str().map(str::to_string);
    let mut all: Vec<_> = answer["imported"]
        .as_array()
        .expect("imported")
        .iter()
        .map(|i| {
            assert_eq!(i["resumes"], true, "{i}");
            (
                text(&i["sourceId"]).expect("a source id"),
                text(&i["agentId"]),
                text(&i["title"]),
            )
        })
        .collect();
    all.sort();
    all
}

/// `(sourceId, reason)` of each skipped session.
fn skipped(answer: &Value) -> Vec<(String, String)> {
    let mut all: Vec<_> = answer["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| {
            (
                s["sourceId"].as_str().unwrap_or_default().to_string(),
                s["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    all.sort();
    all
}

/// The first imported session's history is in its agent's timeline, as the agent replayed it
/// (`session/load`), before the `recall` that followed.
async fn history_replayed(client: &mut Client, agent: &str) {
    let timeline = client.timeline(agent).await;
    let said: Vec<(&str, &str)> = timeline
        .iter()
        .filter_map(|i| Some((i["kind"].as_str()?, i["data"]["text"].as_str()?)))
        .filter(|(kind, _)| *kind != "notice")
        .collect();
    assert_eq!(
        said,
        [
            ("user_message", "say first question"),
            ("agent_message", "first question"),
            ("user_message", "say second question"),
            ("agent_message", "second question"),
            ("user_message", "recall"),
            (
                "agent_message",
                "recall: 2 earlier: say first question / say second question"
            ),
        ],
        "{timeline:?}"
    );
    assert!(
        timeline.iter().any(|i| i["kind"] == "notice"
            && i["data"]["via"] == "session/load"
            && i["data"]["replayed"] == true),
        "{timeline:?}"
    );
}

/// An agent drover runs in `cwd`, after its first turn: its id and its session's.
async fn own_agent(client: &mut Client, cwd: &Path) -> (String, String) {
    let own = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd, "prompt": "say mine"}))
        .await;
    client.wait_idle(&own).await;
    let session = string_at(
        &client
            .request(json!({"type": "get_agent", "agentId": own}))
            .await["payload"]["agent"]["sessionId"],
    );
    (own, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_sessions_come_in_once_and_continue_where_they_were() {
    // One session a page: the listing follows the agent's cursor.
    let (daemon, state) = TestDaemon::start_scripted("SCRIPTED_AGENT_LIST_PAGE = \"1\"", "").await;
    let (mut client, _) = daemon.client().await;
    let cwd = daemon.cwd();
    let elsewhere = TempDir::new().expect("another directory");
    let other_cwd = std::fs::canonicalize(elsewhere.path()).expect("canonical");

    // drover's own agent has a session of the provider too.
    let (own, own_session) = own_agent(&mut client, &cwd).await;
    let first = session_made_elsewhere(
        state.path(),
        &cwd,
        &["say first question", "say second question"],
    )
    .await;
    let second = session_made_elsewhere(state.path(), &cwd, &["say other work"]).await;
    let far = session_made_elsewhere(state.path(), &other_cwd, &["say far away"]).await;

    // A dry run of one directory says what would come in, and changes nothing.
    let dry = import(&mut client, json!({"cwd": cwd})).await;
    assert_eq!(dry["dryRun"], true, "{dry}");
    let mut expected = vec![
        (first.clone(), None, Some("say first question".to_string())),
        (second.clone(), None, Some("say other work".to_string())),
    ];
    expected.sort();
    assert_eq!(imported(&dry), expected, "{dry}");
    assert_eq!(
        skipped(&dry),
        [(
            own_session.clone(),
            format!("already the session of agent {own}")
        )],
        "{dry}"
    );
    assert_eq!(
        client.agents(true).await.len(),
        1,
        "a dry run imports nothing"
    );

    // One session by id; an id the agent does not list is said so.
    let one = import(
        &mut client,
        json!({"sessions": [first, "no-such-session"], "apply": true}),
    )
    .await;
    let got = imported(&one);
    assert_eq!(got.len(), 1, "{one}");
    assert_eq!(got[0].0, first);
    let first_agent = got[0].1.clone().expect("an agent id");
    assert_eq!(
        skipped(&one),
        [(
            "no-such-session".to_string(),
            "the agent of provider `scripted` lists no such session".to_string()
        )],
        "{one}"
    );

    // All the rest: those imported before, and drover's own, are left alone.
    let rest = import(&mut client, json!({"apply": true})).await;
    let ids: Vec<String> = imported(&rest).into_iter().map(|i| i.0).collect();
    let mut want = vec![second.clone(), far.clone()];
    want.sort();
    assert_eq!(ids, want, "{rest}");
    let reasons = skipped(&rest);
    assert_eq!(reasons.len(), 2, "{rest}");
    assert!(
        reasons
            .iter()
            .any(|(id, r)| *id == first && *r == format!("already imported as {first_agent}")),
        "{rest}"
    );
    assert_eq!(client.agents(true).await.len(), 4);

    // The imported agent is the session: its title, directory and label, and its next
    // message continues the conversation.
    let agent = client
        .request(json!({"type": "get_agent", "agentId": first_agent}))
        .await["payload"]["agent"]
        .clone();
    assert_eq!(agent["title"], "say first question", "{agent}");
    assert_eq!(agent["status"], "idle", "{agent}");
    assert_eq!(agent["cwd"], cwd.display().to_string(), "{agent}");
    assert_eq!(agent["labels"]["acp.session-id"], first.as_str(), "{agent}");
    client
        .request(json!({"type": "send_message", "agentId": first_agent, "text": "recall"}))
        .await;
    client.wait_idle(&first_agent).await;
    assert_eq!(
        client
            .replies(&first_agent)
            .await
            .last()
            .map(String::as_str),
        Some("recall: 2 earlier: say first question / say second question")
    );
    // Its history came in with it.
    history_replayed(&mut client, &first_agent).await;

    // Again: nothing new.
    let again = import(&mut client, json!({"apply": true})).await;
    assert!(imported(&again).is_empty(), "{again}");
    assert_eq!(skipped(&again).len(), 4, "{again}");
    assert_eq!(client.agents(true).await.len(), 4);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_whose_agent_cannot_list_says_so() {
    let (daemon, _state) = TestDaemon::start_scripted("SCRIPTED_AGENT_NO_LIST = \"1\"", "").await;
    let (mut client, _) = daemon.client().await;
    let answer = client
        .request(json!({"type": "import_sessions", "provider": "scripted", "apply": true}))
        .await;
    assert_eq!(answer["type"], "request_error", "{answer}");
    assert_eq!(answer["payload"]["code"], "invalid_input", "{answer}");
    let message = answer["payload"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("provider `scripted` cannot list its sessions"),
        "{answer}"
    );
    let unknown = client
        .request(json!({"type": "import_sessions", "provider": "nobody"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "unknown_provider", "{unknown}");
    assert!(client.agents(true).await.is_empty());
    daemon.stop().await;
}
