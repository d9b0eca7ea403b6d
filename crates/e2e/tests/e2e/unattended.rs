//! Fleets that run unattended (issue 25): a turn a daemon restart cuts off continues by policy
//! (`on_interrupt`), once. The daemon runs in a process of its own (`drover-daemon-proc`) so
//! that the test can kill it; the agents are the scripted agent.

use std::path::Path;
use std::time::Duration;

use drover_testkit::daemon::{Client, string_at};
use drover_testkit::wait::eventually;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::processes::{DaemonProcess, Home, said};

const WAIT: Duration = Duration::from_secs(20);

/// The scripted provider (policy `notify` by default), `steady` (the scripted agent with
/// `on_interrupt = "continue"`), and `relapsing` (the same, whose turn started by a notice
/// from drover hangs again).
fn config(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_drover-scripted-agent");
    let scripted = drover_fakes::scripted_agent::provider_config(Path::new(bin), state);
    let state = state.display().to_string();
    format!(
        "{scripted}\
         [providers.steady]\ncommand = [{bin:?}]\non_interrupt = \"continue\"\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {state:?} }}\n\
         [providers.relapsing]\ncommand = [{bin:?}]\non_interrupt = \"continue\"\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, SCRIPTED_AGENT_ON_DROVER = \"hang\" }}\n"
    )
}

/// The `user_message` items of the agent: (source, text).
async fn messages(client: &mut Client, agent: &str) -> Vec<(String, String)> {
    client
        .timeline(agent)
        .await
        .iter()
        .filter(|i| i["kind"] == "user_message")
        .map(|i| {
            let text = |k: &str| i["data"][k].as_str().unwrap_or_default().to_string();
            (text("source"), text("text"))
        })
        .collect()
}

/// The followups drover sent the agent to continue a cut turn.
async fn continues(client: &mut Client, agent: &str) -> Vec<String> {
    messages(client, agent)
        .await
        .into_iter()
        .filter(|(source, text)| {
            source == "system" && text.starts_with("[drover] Your previous turn was interrupted")
        })
        .map(|(_, text)| text)
        .collect()
}

async fn running(client: &mut Client, agent: &str) {
    let ran = drover_testkit::wait::poll_until(WAIT, async || {
        client.get_agent(agent).await["status"] == "running"
    })
    .await;
    if ran.is_none() {
        let info = client.get_agent(agent).await;
        let timeline = client.timeline(agent).await;
        panic!("{agent} does not run a turn: {info}\n{timeline:#?}");
    }
}

// One story: a crash cuts four turns (a subagent's whose parent waits to hear, one with the
// per-agent policy, one left to the user, one whose continuation hangs again); then a
// shutdown cuts that continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unattended_a_cut_turn_continues_once_by_policy() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let mut daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // A parent whose subagent (notifyOnFinish: the parent) hangs in its first turn.
    let parent = client
        .create_agent(json!({"provider": "steady", "cwd": cwd, "prompt": "subagent hang"}))
        .await;
    let child = eventually("the subagent", WAIT, async || {
        let text = said(&mut client, &parent).await;
        let id = text.split("started subagent ").nth(1)?;
        Some(id.split_whitespace().next()?.to_string())
    })
    .await;
    // The per-agent policy, over its provider's `notify`.
    let own = client
        .create_agent(
            json!({"provider": "scripted", "cwd": cwd, "prompt": "hang", "onInterrupt": "continue"}),
        )
        .await;
    assert_eq!(client.get_agent(&own).await["onInterrupt"], "continue");
    let left = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd, "prompt": "hang"}))
        .await;
    let relapsing = client
        .create_agent(json!({"provider": "relapsing", "cwd": cwd, "prompt": "hang"}))
        .await;
    for agent in [&child, &own, &left, &relapsing] {
        running(&mut client, agent).await;
    }
    client.wait_idle(&parent).await;

    daemon.die_by(Signal::SIGKILL);
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // Continued: one followup saying when and why, and the turn it starts ends.
    for agent in [&child, &own] {
        client.wait_idle(agent).await;
        let asked = continues(&mut client, agent).await;
        assert_eq!(asked.len(), 1, "{agent}: {asked:?}");
        assert!(
            asked[0].contains("stopped unexpectedly and was restarted"),
            "{asked:?}"
        );
        assert!(
            said(&mut client, agent)
                .await
                .contains("ok: [drover] Your previous turn was interrupted"),
            "the agent got the followup as its prompt"
        );
        let events = client.turn_events(agent).await;
        assert_eq!(events, ["turn_interrupted", "turn_completed"], "{agent}");
        let info = client.get_agent(agent).await;
        assert_eq!(info["status"], "idle", "{info}");
        assert_eq!(info["attentionReason"], "finished", "{info}");
    }
    // The parent hears once, of the turn that finally ended.
    client.wait_idle(&parent).await;
    let heard = |m: &[(String, String)]| {
        m.iter()
            .filter(|(source, _)| *source == format!("agent:{child}"))
            .map(|(_, text)| text.clone())
            .collect::<Vec<_>>()
    };
    let told = heard(&messages(&mut client, &parent).await);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("finished its turn"), "{told:?}");

    // `notify`: the agent waits for its user.
    client.wait_idle(&left).await;
    let info = client.get_agent(&left).await;
    assert_eq!(info["attentionReason"], "interrupted", "{info}");
    assert!(continues(&mut client, &left).await.is_empty());
    assert_eq!(client.turn_events(&left).await, ["turn_interrupted"]);

    // The continuation hangs too; this time the daemon shuts down in order.
    running(&mut client, &relapsing).await;
    assert_eq!(continues(&mut client, &relapsing).await.len(), 1);
    daemon.stop().await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    client.wait_idle(&relapsing).await;
    // Not twice: a continued turn cut off again is left to the user.
    let info = client.get_agent(&relapsing).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(info["attentionReason"], "interrupted", "{info}");
    assert_eq!(continues(&mut client, &relapsing).await.len(), 1);
    let ends: Vec<String> = client
        .timeline(&relapsing)
        .await
        .iter()
        .filter(|i| i["kind"] == "turn_ended")
        .map(|i| format!("{} {}", i["data"]["event"], i["data"]["cause"]))
        .collect();
    assert_eq!(
        ends,
        [
            r#""turn_interrupted" "crash""#,
            r#""turn_interrupted" "shutdown""#
        ]
    );
    // And the parent still heard only once.
    client.wait_idle(&parent).await;
    assert_eq!(heard(&messages(&mut client, &parent).await).len(), 1);
    daemon.stop().await;
}

/// The scripted provider waiting 2 s for a limit without a reset time; runtimes idle 1 s
/// hibernate (so a waiting agent's does, and is woken at its reset).
fn limits_config(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_drover-scripted-agent");
    let state = state.display().to_string();
    format!(
        "[runtimes]\nidle_timeout = 1\n\
         [providers.scripted]\ncommand = [{bin:?}]\nlimit_backoff = \"2s\"\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {state:?} }}\n"
    )
}

/// The agent's `turn_ended` events.
async fn ends(client: &mut Client, agent: &str) -> Vec<String> {
    client.turn_events(agent).await
}

// One story: limits as codex, claude and gemini say them, with and without a reset time, a
// subagent whose parent waits, `on_limit = fail`; the daemon killed while they wait.
#[expect(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unattended_a_usage_limit_waits_and_sends_the_prompt_again_once() {
    let home = Home::new(limits_config);
    let cwd = home.cwd.clone();
    let mut daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    let create = async |client: &mut Client, fields: Value| {
        let mut fields = fields;
        fields["provider"] = json!("scripted");
        fields["cwd"] = json!(cwd);
        client.create_agent(fields).await
    };
    // A reset time (gemini's "retry in 4s"; claude's unix time), and none (the 2 s backoff).
    let gemini = create(
        &mut client,
        json!({"prompt": "limit gemini 4\nsay gemini went on"}),
    )
    .await;
    let claude = create(
        &mut client,
        json!({"prompt": "limit claude 4\nsay claude went on"}),
    )
    .await;
    let bare = create(
        &mut client,
        json!({"prompt": "limit codex 1 noreset\nsay codex went on"}),
    )
    .await;
    // A subagent whose parent hears once, when the turn after the limit ends.
    let parent = create(
        &mut client,
        json!({"prompt": "subagent limit gemini 6\\nsay child went on"}),
    )
    .await;
    let failing = create(
        &mut client,
        json!({"prompt": "limit codex 30 noreset\nsay never", "onLimit": "fail"}),
    )
    .await;
    let dropped = create(&mut client, json!({"prompt": "limit gemini 30\nsay never"})).await;
    let child = eventually("the subagent", WAIT, async || {
        let text = said(&mut client, &parent).await;
        let id = text.split("started subagent ").nth(1)?;
        Some(id.split_whitespace().next()?.to_string())
    })
    .await;

    for agent in [&gemini, &claude, &bare, &child] {
        let info = eventually("the agent to wait for its limit", WAIT, async || {
            let info = client.get_agent(agent).await;
            (info["attentionReason"] == "limited").then_some(info)
        })
        .await;
        assert_eq!(info["status"], "idle", "{info}");
        assert!(info["limited"]["retryAt"].is_string(), "{info}");
        // The agent's own words.
        assert!(
            info["limited"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("the agent answered `session/prompt` with error")),
            "{info}"
        );
        // Its prompt waits, first in its inbox.
        assert_eq!(info["queued"].as_array().map(Vec::len), Some(1), "{info}");
        assert_eq!(ends(&mut client, agent).await, ["turn_limited"]);
    }
    let info = client.get_agent(&gemini).await;
    assert!(info["limited"]["resetAt"].is_string(), "{info}");
    let info = client.get_agent(&bare).await;
    assert!(info["limited"]["resetAt"].is_null(), "{info}");
    // `fail`: an error like any other.
    let info = eventually("the failing agent's turn to fail", WAIT, async || {
        let info = client.get_agent(&failing).await;
        (info["attentionReason"] == "error").then_some(info)
    })
    .await;
    assert!(info["limited"].is_null(), "{info}");
    assert_eq!(ends(&mut client, &failing).await, ["turn_failed"]);
    // A cancel that drops the inbox drops the waiting prompt, and the wait.
    eventually("the agent to wait for its limit", WAIT, async || {
        client.get_agent(&dropped).await["attentionReason"] == "limited"
    })
    .await;
    let cancelled = client
        .request(json!({"type": "cancel", "agentId": dropped}))
        .await;
    assert_eq!(cancelled["type"], "ok", "{cancelled}");
    let info = eventually("the wait to end", WAIT, async || {
        let info = client.get_agent(&dropped).await;
        info["limited"].is_null().then_some(info)
    })
    .await;
    assert!(info["attentionReason"].is_null(), "{info}");
    assert_eq!(info["queued"].as_array().map(Vec::len), Some(0), "{info}");
    // The parent was told why, as context: it did not start a turn for it.
    client.wait_idle(&parent).await;
    assert_eq!(ends(&mut client, &parent).await, ["turn_completed"]);
    // A parent that asks (MCP `get_agent`) sees why its subagent waits, and until when.
    let ask = format!("mcp get_agent {{\"agentId\": \"{child}\"}}");
    client.send_message(&parent, &ask).await;
    client.wait_idle(&parent).await;
    let answer = said(&mut client, &parent).await;
    assert!(
        answer.contains(r#""attention": "limited""#) && answer.contains("retryAt"),
        "{answer}"
    );

    // A runtime hibernates while it waits (idle 1 s; claude's limit lasts 4 s).
    let info = eventually("the waiting runtime to hibernate", WAIT, async || {
        let info = client.get_agent(&claude).await;
        (info["runtime"]["state"] == "cold").then_some(info)
    })
    .await;
    assert_eq!(info["attentionReason"], "limited", "{info}");
    assert!(
        client
            .timeline(&claude)
            .await
            .iter()
            .any(|i| i["data"]["hibernated"] == true),
        "no hibernation notice"
    );

    // A crash while they wait changes nothing.
    daemon.die_by(Signal::SIGKILL);
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let info = client.get_agent(&gemini).await;
    assert!(
        info["attentionReason"] == "limited" || info["status"] == "running",
        "{info}"
    );

    for (agent, word) in [
        (&gemini, "gemini"),
        (&claude, "claude"),
        (&bare, "codex"),
        (&child, "child"),
    ] {
        eventually("the prompt sent again after the limit", WAIT, async || {
            ends(&mut client, agent).await.len() == 2
        })
        .await;
        let timeline = client.timeline(agent).await;
        assert_eq!(
            ends(&mut client, agent).await,
            ["turn_limited", "turn_completed"],
            "{agent} {word}: {timeline:#?}"
        );
        assert!(
            said(&mut client, agent)
                .await
                .contains(&format!("{word} went on")),
            "{agent}"
        );
        // Sent again once: two deliveries of the same prompt.
        let sent = messages(&mut client, agent).await;
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0].1, sent[1].1);
        // The turn's end reaches the record just after the timeline.
        let info = eventually("the record to say the turn finished", WAIT, async || {
            let info = client.get_agent(agent).await;
            (info["attentionReason"] == "finished").then_some(info)
        })
        .await;
        assert!(info["limited"].is_null(), "{info}");
    }
    // The parent heard once, of the turn that ended; why it waited came as context of its
    // next prompt (the one that asked).
    eventually("the parent to hear", WAIT, async || {
        ends(&mut client, &parent).await.len() == 3
    })
    .await;
    let told: Vec<Value> = client
        .timeline(&parent)
        .await
        .into_iter()
        .filter(|i| i["kind"] == "user_message" && i["data"]["source"] == format!("agent:{child}"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0]["data"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("finished its turn"),
        "{told:?}"
    );
    let contexts: String = client
        .timeline(&parent)
        .await
        .iter()
        .filter(|i| i["kind"] == "user_message")
        .map(|i| i["data"]["context"].to_string())
        .collect();
    assert!(contexts.contains("usage limit"), "{contexts}");
    // Nothing was sent again for the cancelled one.
    assert_eq!(messages(&mut client, &dropped).await.len(), 1);
    daemon.stop().await;
}

/// `(tokens, cost)` of an `AgentInfo.spend` or `treeSpend`.
fn spent(spend: &Value) -> (Option<u64>, Option<f64>) {
    (spend["tokens"].as_u64(), spend["cost"].as_f64())
}

// What agents spend, as they report it: per agent and per tree, unknown where an agent reports
// nothing, kept across a restart (whose new process counts from zero again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unattended_spend_is_recorded_per_agent_and_per_tree() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // 2000 tokens for the parent, 1000 for one subagent, nothing reported by the other.
    let parent = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "prompt": "usage\nusage\nsubagent usage\nsubagent say quiet"}))
        .await;
    client.wait_idle(&parent).await;
    let children: Vec<String> = said(&mut client, &parent)
        .await
        .split("started subagent ")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(children.len(), 2, "{children:?}");
    for child in &children {
        client.wait_idle(child).await;
    }
    client.wait_idle(&parent).await;
    // Recorded as reported, just after the turn's end.
    let info = eventually("the spend recorded", WAIT, async || {
        let info = client.get_agent(&parent).await;
        (spent(&info["treeSpend"]).0 == Some(3000)).then_some(info)
    })
    .await;
    assert_eq!(spent(&info["spend"]), (Some(2000), Some(0.002)), "{info}");
    assert_eq!(info["spend"]["currency"], "USD", "{info}");
    let quiet = client.get_agent(&children[1]).await;
    assert_eq!(
        spent(&quiet["spend"]),
        (None, None),
        "unknown, never zero: {quiet}"
    );
    let tree = &info["treeSpend"];
    assert_eq!(spent(tree), (Some(3000), Some(0.003)), "{info}");
    assert_eq!(tree["agents"], 3, "{info}");
    assert_eq!(tree["unknown"], json!([children[1]]), "{info}");

    // Kept across a restart; the new process's running total starts at zero and adds.
    daemon.stop().await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let info = client.get_agent(&children[0]).await;
    assert_eq!(spent(&info["spend"]), (Some(1000), Some(0.001)), "{info}");
    let queued = client
        .request(json!({"type": "send_message", "agentId": children[0], "text": "usage"}))
        .await;
    assert_eq!(queued["type"], "message_queued", "{queued}");
    client.wait_idle(&children[0]).await;
    let info = eventually("the spend recorded", WAIT, async || {
        let info = client.get_agent(&children[0]).await;
        (spent(&info["spend"]).0 == Some(2000)).then_some(info)
    })
    .await;
    assert_eq!(spent(&info["spend"]), (Some(2000), Some(0.002)), "{info}");
    let tree = client.get_agent(&parent).await["treeSpend"].clone();
    assert_eq!(spent(&tree), (Some(4000), Some(0.004)), "{tree}");
    daemon.stop().await;
}

/// A `request_error` with `code`: its payload.
fn refused(answer: &Value, code: &str) -> Value {
    assert_eq!(answer["type"], "request_error", "{answer}");
    assert_eq!(answer["payload"]["code"], code, "{answer}");
    answer["payload"].clone()
}

// A budget covers the agent's whole tree: once a subagent two levels down spends what is left,
// no new turn starts in the tree (a send to the root, a subagent's creation), the refusal lists
// the spend by agent, and raising the budget lets the send through.
#[tokio::test]
async fn unattended_a_spent_budget_refuses_new_turns_in_the_tree_until_raised() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // The root spends 1000 tokens, then its subagent makes a subagent that spends 1000 more:
    // past the root's 1500.
    let root = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "budget": {"tokens": 1500},
            "prompt": "usage\nsubagent subagent usage"}))
        .await;
    let info = client.get_agent(&root).await;
    assert_eq!(info["budget"], json!({"tokens": 1500}), "{info}");
    client.wait_idle(&root).await;
    let child = said(&mut client, &root)
        .await
        .split("started subagent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .expect("the subagent's id");
    client.wait_idle(&child).await;
    let grandchild = said(&mut client, &child)
        .await
        .split("started subagent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .expect("the sub-subagent's id");
    client.wait_idle(&grandchild).await;
    eventually("the tree's spend recorded", WAIT, async || {
        let info = client.get_agent(&root).await;
        (spent(&info["treeSpend"]).0 == Some(2000)).then_some(())
    })
    .await;
    for agent in [&grandchild, &child, &root] {
        client.wait_idle(agent).await;
    }
    // The budgeted root was warned when the tree went past 80 %, and its later turns' ends
    // keep the warning.
    let info = client.get_agent(&root).await;
    assert_eq!(info["attentionReason"], "budget_warning", "{info}");

    // A send to the root is refused, with what each agent spent.
    let answer = client
        .request(json!({"type": "send_message", "agentId": root, "text": "say again"}))
        .await;
    let refusal = refused(&answer, "budget_exhausted");
    let details = &refusal["details"];
    assert_eq!(details["agentId"], root.as_str(), "{refusal}");
    assert_eq!(details["budget"]["tokens"], 1500, "{refusal}");
    assert_eq!(details["spend"]["tokens"], 2000, "{refusal}");
    let by_agent: Vec<(String, Option<u64>)> = details["spend"]["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| {
            (
                a["agentId"].as_str().unwrap_or_default().to_string(),
                a["tokens"].as_u64(),
            )
        })
        .collect();
    assert!(by_agent.contains(&(root.clone(), Some(1000))), "{refusal}");
    assert!(by_agent.contains(&(child.clone(), None)), "{refusal}");
    assert!(
        by_agent.contains(&(grandchild.clone(), Some(1000))),
        "{refusal}"
    );
    // So is a send to the agent that spent it, and a new subagent anywhere in the tree.
    let answer = client
        .request(json!({"type": "send_message", "agentId": grandchild, "text": "usage"}))
        .await;
    refused(&answer, "budget_exhausted");
    let answer = client
        .request(
            json!({"type": "create_agent", "provider": "scripted", "cwd": cwd,
            "parentAgentId": child, "prompt": "say hello"}),
        )
        .await;
    refused(&answer, "budget_exhausted");
    // Nothing ran: the root said nothing more.
    assert!(!said(&mut client, &root).await.contains("again"));

    // Raised, the send is accepted and its turn runs.
    let raised = client
        .request(json!({"type": "set_budget", "agentId": root, "budget": {"tokens": 5000}}))
        .await;
    assert_eq!(raised["type"], "ok", "{raised}");
    client.send_message(&root, "say again").await;
    client.wait_idle(&root).await;
    assert!(said(&mut client, &root).await.contains("again"));

    // The budget is durable.
    daemon.stop().await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let info = client.get_agent(&root).await;
    assert_eq!(info["budget"], json!({"tokens": 5000}), "{info}");
    daemon.stop().await;
}

// Over MCP: an agent gives the subagent it creates a budget, and once the subagent spent it,
// the agent's `send_prompt` to it is refused with `budget_exhausted` and the spend by agent.
#[tokio::test]
async fn unattended_an_agent_budgets_its_subagent_over_mcp() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    let lead = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "prompt": r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "current"}, "prompt": "usage", "budget": {"tokens": 500}}"#}))
        .await;
    client.wait_idle(&lead).await;
    let said_lead = said(&mut client, &lead).await;
    let sub = said_lead
        .split("\"agentId\": \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .map_or_else(|| panic!("the subagent's id: {said_lead}"), str::to_string);
    client.wait_idle(&sub).await;
    let info = eventually("the subagent's spend", WAIT, async || {
        let info = client.get_agent(&sub).await;
        (spent(&info["spend"]).0 == Some(1000)).then_some(info)
    })
    .await;
    assert_eq!(info["budget"], json!({"tokens": 500}), "{info}");
    client.wait_idle(&lead).await;

    let call = format!(r#"mcp send_prompt {{"agentId": "{sub}", "prompt": "say hi"}}"#);
    client.send_message(&lead, &call).await;
    client.wait_idle(&lead).await;
    let said_lead = said(&mut client, &lead).await;
    let error = said_lead
        .split("mcp send_prompt error")
        .nth(1)
        .unwrap_or_else(|| panic!("refused: {said_lead}"));
    assert!(error.contains("code: budget_exhausted"), "{error}");
    assert!(
        error.contains(&format!("\"agentId\":\"{sub}\"")) && error.contains("\"tokens\":1000"),
        "the spend by agent: {error}"
    );
    assert!(!said(&mut client, &sub).await.contains("hi"));
    daemon.stop().await;
}

/// The `turn_ended` items of the agent: (event, cause).
async fn turn_ends(client: &mut Client, agent: &str) -> Vec<(String, String)> {
    client
        .timeline(agent)
        .await
        .iter()
        .filter(|i| i["kind"] == "turn_ended")
        .map(|i| {
            let text = |k: &str| i["data"][k].as_str().unwrap_or_default().to_string();
            (text("event"), text("cause"))
        })
        .collect()
}

/// The id after `started subagent ` in what `agent` said.
async fn started_subagent(client: &mut Client, agent: &str) -> String {
    let text = said(client, agent).await;
    text.split("started subagent ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| panic!("no subagent started: {text:?}"))
}

// A hard budget: when the tree's spend crosses it, the turns running in the tree are cancelled
// (a subagent's long turn, and the turn that spent it), not only new ones refused.
#[tokio::test]
async fn unattended_a_hard_budget_cancels_the_turns_running_in_the_tree() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // The root starts a subagent whose turn runs a minute.
    let root = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "budget": {"cost": 0.0015, "hard": true},
            "prompt": "subagent sleep 60000\\nsay never"}))
        .await;
    let info = client.get_agent(&root).await;
    assert_eq!(
        info["budget"],
        json!({"cost": 0.0015, "hard": true}),
        "{info}"
    );
    client.wait_idle(&root).await;
    let child = started_subagent(&mut client, &root).await;
    running(&mut client, &child).await;

    // The root spends 0.001, then 0.002 in all: past the budget, in the middle of its turn.
    let started = std::time::Instant::now();
    client
        .send_message(&root, "usage\nusage\nsleep 60000\nsay never")
        .await;
    for agent in [&child, &root] {
        eventually("the turn cancelled by the budget", WAIT, async || {
            let ends = turn_ends(&mut client, agent).await;
            ends.contains(&("turn_canceled".to_string(), "budget".to_string()))
                .then_some(())
        })
        .await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cancelled, not finished"
    );
    for agent in [&child, &root] {
        assert!(!said(&mut client, agent).await.contains("never"), "{agent}");
    }
    let info = client.get_agent(&root).await;
    assert_eq!(spent(&info["treeSpend"]).1, Some(0.002), "{info}");
    daemon.stop().await;
}

// A turn that crosses a hard budget as it ends, with a message queued behind it: the usage
// report mid-turn spends the budget (its cancel asks the agent's own task), the prompt's
// answer reports more a few milliseconds later. The next turn's start waits only for both
// spends to be written, never for that cancel: the queued message is held at once. (Whether
// the cancel lands as the turn ends depends on timing: several agents, each a little later.)
#[tokio::test]
async fn unattended_a_turn_crossing_a_hard_budget_as_it_ends_holds_the_next_at_once() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let mut slow = Vec::new();
    for ms in 1..=16 {
        let root = client
            .create_agent(json!({"provider": "scripted", "cwd": cwd,
                "budget": {"cost": 0.0005, "hard": true}, "prompt": "say ready"}))
            .await;
        client.wait_idle(&root).await;
        let sent = std::time::Instant::now();
        client
            .send_message(&root, &format!("usage\nsleep {ms}"))
            .await;
        client.send_message(&root, "say next").await;
        eventually("the queued message held", WAIT, async || {
            let timeline = client.timeline(&root).await;
            timeline
                .iter()
                .any(|i| {
                    i["kind"] == "notice"
                        && i["data"]["text"]
                            .as_str()
                            .is_some_and(|t| t.contains("its budget is spent"))
                })
                .then_some(())
        })
        .await;
        let held = sent.elapsed();
        if held > Duration::from_secs(3) {
            slow.push((ms, held));
        }
        // The agent's task answers at once.
        let asked = std::time::Instant::now();
        let answer = client
            .request(json!({"type": "cancel", "agentId": root, "keepInbox": true}))
            .await;
        assert_eq!(answer["type"], "ok", "{answer}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        assert!(!said(&mut client, &root).await.contains("next"));
        assert_eq!(queued_texts(&mut client, &root).await, ["say next"]);
    }
    assert!(
        slow.is_empty(),
        "held late (ms of sleep after the usage report, how late): the next turn's start \
         waited for the budget's cancel: {slow:?}"
    );
    daemon.stop().await;
}

/// The texts of the messages queued for `agent` and not delivered yet.
async fn queued_texts(client: &mut Client, agent: &str) -> Vec<String> {
    client.get_agent(agent).await["queued"]
        .as_array()
        .map(|q| {
            q.iter()
                .filter_map(|m| m["text"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn schedule_errors(client: &mut Client, id: &str) -> Vec<String> {
    let answer = client.request(json!({"type": "list_schedules"})).await;
    assert_eq!(answer["type"], "schedules", "{answer}");
    answer["payload"]["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .filter(|s| s["id"] == id)
        .flat_map(|s| s["runs"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["error"].as_str().map(str::to_string))
        .collect()
}

// What drover queues itself into a spent tree waits: a subagent's finish notice to its parent
// and a schedule's run stay queued (one run of a schedule at a time), start no turn, and are
// kept across a restart; raising the budget delivers each, once. A send refused meanwhile is
// not replayed: its client was told.
#[tokio::test]
async fn unattended_a_spent_budget_holds_what_drover_queues_until_raised() {
    let home = Home::new(config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // The subagent spends past the root's budget after the root's turn ended: the notice of
    // its end finds the tree spent (its spend is recorded before the notice goes).
    let root = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "budget": {"cost": 0.0015},
            "prompt": "subagent sleep 1000\\nusage\\nusage"}))
        .await;
    client.wait_idle(&root).await;
    let child = started_subagent(&mut client, &root).await;
    client.wait_idle(&child).await;
    let notice = eventually("the finish notice held", WAIT, async || {
        let queued = queued_texts(&mut client, &root).await;
        queued.into_iter().find(|t| t.contains("finished its turn"))
    })
    .await;
    // Every second a schedule runs into the root: one run waits, the next ones are refused.
    let answer = client
        .request(json!({"type": "create_schedule", "agentId": root,
            "prompt": "say scheduled", "when": {"everySeconds": 1}}))
        .await;
    assert_eq!(answer["type"], "schedule", "{answer}");
    let schedule = string_at(&answer["payload"]["schedule"]["id"]);
    let errors = eventually("a run refused behind the waiting one", WAIT, async || {
        let errors = schedule_errors(&mut client, &schedule).await;
        (!errors.is_empty()).then_some(errors)
    })
    .await;
    assert!(
        errors[0].contains("budget") && errors[0].contains("an earlier run of this schedule waits"),
        "{errors:?}"
    );
    let answer = client
        .request(json!({"type": "send_message", "agentId": root, "text": "say refused"}))
        .await;
    refused(&answer, "budget_exhausted");
    client.wait_idle(&root).await;

    let queued = queued_texts(&mut client, &root).await;
    assert_eq!(queued, vec![notice.clone(), "say scheduled".to_string()]);
    let texts: Vec<String> = messages(&mut client, &root)
        .await
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert_eq!(texts.len(), 1, "only the first prompt ran: {texts:?}");
    let timeline = client.timeline(&root).await;
    assert!(
        timeline.iter().any(|i| i["kind"] == "notice"
            && i["data"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("its budget is spent"))),
        "the timeline says why: {timeline:#?}"
    );

    // Kept across a restart, still held.
    daemon.stop().await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let queued = queued_texts(&mut client, &root).await;
    assert_eq!(queued, vec![notice.clone(), "say scheduled".to_string()]);
    assert_eq!(messages(&mut client, &root).await.len(), 1);
    let deleted = client
        .request(json!({"type": "delete_schedule", "scheduleId": schedule}))
        .await;
    assert_eq!(deleted["type"], "schedule_deleted", "{deleted}");

    // Raised: each held message runs once.
    let raised = client
        .request(json!({"type": "set_budget", "agentId": root, "budget": {"cost": 1.0}}))
        .await;
    assert_eq!(raised["type"], "ok", "{raised}");
    eventually("the held messages delivered", WAIT, async || {
        (messages(&mut client, &root).await.len() == 3).then_some(())
    })
    .await;
    client.wait_idle(&root).await;
    let texts: Vec<String> = messages(&mut client, &root)
        .await
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert_eq!(
        texts[1..],
        [notice, "say scheduled".to_string()],
        "{texts:?}"
    );
    let said_root = said(&mut client, &root).await;
    assert!(said_root.contains("scheduled"), "{said_root}");
    assert!(!said_root.contains("refused"), "{said_root}");
    assert!(queued_texts(&mut client, &root).await.is_empty());
    daemon.stop().await;
}

/// [`config`], with `capped` (the scripted agent, falling back to `spare` on a usage limit)
/// and `spare` (the scripted agent, whose limit was not hit).
fn fallback_config(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_drover-scripted-agent");
    let dir = state.display().to_string();
    format!(
        "{}[providers.capped]\ncommand = [{bin:?}]\non_limit = {{ fallback = \"spare\" }}\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {dir:?} }}\n\
         [providers.spare]\ncommand = [{bin:?}]\n\
         env = {{ SCRIPTED_AGENT_STATE_DIR = {dir:?}, SCRIPTED_AGENT_UNLIMITED = \"1\" }}\n",
        config(state)
    )
}

/// The lead was told where its subagent's work went (as context), then heard once how the
/// agent that took it over ended its turn.
async fn lead_heard_of_the_fallback(client: &mut Client, lead: &str, spare: &str) {
    let done = |t: &String| t.contains("finished its turn") && t.contains("the work is done");
    let heard = eventually("the lead told of the new agent's end", WAIT, async || {
        let texts: Vec<String> = messages(client, lead)
            .await
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        texts.iter().any(done).then_some(texts)
    })
    .await;
    assert_eq!(heard.iter().filter(|t| done(t)).count(), 1, "{heard:?}");
    // Why, as context of the lead's next prompt (it does not wake the lead).
    let context: Vec<String> = client
        .timeline(lead)
        .await
        .iter()
        .filter(|i| i["kind"] == "user_message")
        .flat_map(|i| i["data"]["context"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    assert!(
        context
            .iter()
            .any(|c| c.contains("The work goes on on `spare`") && c.contains(spare)),
        "{context:?}"
    );
}

// `on_limit = { fallback = "spare" }`: a turn of `capped` that hits its usage limit goes on as
// a new agent of `spare` (a subagent of the limited one), whose first prompt quotes the
// conversation from the timeline and the prompt that failed; the limited agent waits for
// nothing, and the agent that sent the prompt hears why, then how the new agent's turn ends.
#[tokio::test]
async fn unattended_a_usage_limit_falls_back_to_another_provider() {
    let home = Home::new(fallback_config);
    let cwd = home.cwd.clone();
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;

    // A lead makes a worker on `capped`, which answers a first prompt.
    let lead = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd,
            "prompt": r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "current"}, "provider": "capped", "title": "worker", "prompt": "say first answer"}"#}))
        .await;
    client.wait_idle(&lead).await;
    let said_lead = said(&mut client, &lead).await;
    let worker = said_lead
        .split("\"agentId\": \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .map_or_else(|| panic!("the worker's id: {said_lead}"), str::to_string);
    client.wait_idle(&worker).await;
    client.wait_idle(&lead).await;

    // The lead's next prompt to it hits codex's usage limit.
    let call = format!(
        r#"mcp send_prompt {{"agentId": "{worker}", "prompt": "limit codex 600\nsay the work is done"}}"#
    );
    client.send_message(&lead, &call).await;
    let ended = eventually("the worker's turn handed over", WAIT, async || {
        let timeline = client.timeline(&worker).await;
        timeline
            .into_iter()
            .find(|i| i["kind"] == "turn_ended" && i["data"]["event"] == "turn_limited")
    })
    .await;
    let spare = string_at(&ended["data"]["fallbackAgentId"]);
    assert_eq!(ended["data"]["fallbackProvider"], "spare", "{ended}");
    assert!(ended["data"]["retryAt"].is_null(), "{ended}");

    // The new agent: on `spare`, under the worker, its prompt the conversation and the work.
    client.wait_idle(&spare).await;
    let info = client.get_agent(&spare).await;
    assert_eq!(info["type"], "spare", "{info}");
    assert_eq!(info["parentAgentId"], worker.as_str(), "{info}");
    assert_eq!(
        info["labels"]["drover.fallback-of"],
        worker.as_str(),
        "{info}"
    );
    let first = messages(&mut client, &spare).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let (source, prompt) = &first[0];
    assert_eq!(source, "system");
    assert!(
        prompt.starts_with("[drover] You take over the work of agent \"worker\"")
            && prompt.contains("which runs on `capped`")
            && prompt.contains("usage limit")
            && prompt.contains("User:\n> say first answer")
            && prompt.contains("Agent:\n> first answer")
            && prompt.ends_with("now yours:\n\nlimit codex 600\nsay the work is done"),
        "{prompt}"
    );
    assert!(said(&mut client, &spare).await.contains("the work is done"));

    // The worker waits for nothing and sends nothing again.
    let info = client.get_agent(&worker).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert!(info["limited"].is_null(), "{info}");
    assert!(queued_texts(&mut client, &worker).await.is_empty());

    lead_heard_of_the_fallback(&mut client, &lead, &spare).await;
    daemon.stop().await;
}
