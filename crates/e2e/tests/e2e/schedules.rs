//! Schedules through the real daemon: a followup and a new agent each time, archive admission
//! (refused listing the schedule, `stopActivity` deletes it), ownership over MCP, clear errors,
//! and SIGKILLs of a daemon process while schedules come due (each run delivered once).

use std::path::Path;
use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, string_at, write_scripted_config};

use crate::processes::DaemonProcess;
use drover_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);

async fn create(client: &mut Client, cwd: &Path, prompt: &str, title: &str) -> String {
    client
        .create_scripted(cwd, json!({"prompt": prompt, "title": title}))
        .await
}

async fn schedule(client: &mut Client, request: Value) -> Value {
    let mut message = json!({"type": "create_schedule"});
    for (k, v) in request.as_object().expect("object") {
        message[k] = v.clone();
    }
    let answer = client.request(message).await;
    assert_eq!(answer["type"], "schedule", "{answer}");
    answer["payload"]["schedule"].clone()
}

async fn list(client: &mut Client) -> Vec<Value> {
    let answer = client.request(json!({"type": "list_schedules"})).await;
    assert_eq!(answer["type"], "schedules", "{answer}");
    answer["payload"]["schedules"]
        .as_array()
        .expect("schedules")
        .clone()
}

/// The `user_message` items of the agent's timeline that a schedule sent.
async fn scheduled_messages(client: &mut Client, agent: &str) -> Vec<Value> {
    client.messages_from(agent, "schedule:").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_deliver_followups_and_create_agents_on_time() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon.cwd(), "say ready", "worker").await;
    client.wait_idle(&agent).await;

    let followup = schedule(
        &mut client,
        json!({"agentId": agent, "prompt": "say tick", "when": {"inSeconds": 1}, "title": "tick"}),
    )
    .await;
    assert_eq!(followup["state"], "active");
    assert_eq!(
        followup["description"]
            .as_str()
            .map(|d| d.starts_with("once at")),
        Some(true)
    );
    let id = followup["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("sched-"), "{id}");

    // Clients hear the run; the agent gets the prompt as a followup, once.
    let fired = client
        .recv_where(|m| {
            m["type"] == "schedule_update"
                && m["payload"]["scheduleId"] == id.as_str()
                && m["payload"]["schedule"]["state"] == "finished"
        })
        .await;
    let run = &fired["payload"]["schedule"]["runs"][0];
    assert_eq!(run["agentId"], agent.as_str(), "{run}");
    assert!(run["error"].is_null(), "{run}");
    let message_id = run["messageId"].as_str().expect("message id").to_string();
    let due: jiff::Timestamp = run["dueAt"].as_str().expect("due").parse().expect("time");
    let fired_at: jiff::Timestamp = run["firedAt"]
        .as_str()
        .expect("fired")
        .parse()
        .expect("time");
    assert!(
        fired_at.duration_since(due) < jiff::SignedDuration::from_secs(1),
        "late: {run}"
    );
    client.wait_idle(&agent).await;
    let sent = scheduled_messages(&mut client, &agent).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["data"]["messageId"], message_id.as_str());
    assert_eq!(sent[0]["data"]["source"], format!("schedule:{id}"));
    assert_eq!(client.replies(&agent).await, ["ready", "tick"]);

    // A schedule that creates an agent: the agent carries the schedule's labels and ran the
    // prompt.
    let maker = schedule(
        &mut client,
        json!({"newAgent": {"provider": "scripted", "cwd": daemon.cwd(), "parentAgentId": agent, "title": "nightly"},
               "prompt": "say made by a schedule", "when": {"inSeconds": 1}}),
    )
    .await;
    let maker_id = maker["id"].as_str().expect("id").to_string();
    let made = client
        .recv_where(|m| {
            m["type"] == "schedule_update"
                && m["payload"]["scheduleId"] == maker_id.as_str()
                && m["payload"]["schedule"]["runs"][0]["agentId"].is_string()
        })
        .await;
    let child = string_at(&made["payload"]["schedule"]["runs"][0]["agentId"]);
    client.wait_idle(&child).await;
    assert_eq!(client.replies(&child).await, ["made by a schedule"]);
    let listed = client.agents(false).await;
    let info = listed.iter().find(|a| a["id"] == child).expect("listed");
    assert_eq!(info["parentAgentId"], agent.as_str());
    assert_eq!(info["title"], "nightly");
    assert_eq!(info["labels"]["drover.schedule"], maker_id.as_str());
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_refuse_bad_input_by_name() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon.cwd(), "say ready", "worker").await;
    let cases = [
        (
            json!({"agentId": agent, "prompt": "x", "when": {"cron": "61 * * * *"}}),
            "invalid_input",
            "61 * * * *",
        ),
        (
            json!({"agentId": agent, "prompt": "x", "when": {"cron": "0 9 * * *", "timeZone": "Mars/Olympus"}}),
            "invalid_input",
            "Mars/Olympus",
        ),
        (
            json!({"agentId": agent, "prompt": "x", "when": {"inSeconds": 5, "everySeconds": 5}}),
            "invalid_message",
            "exactly one",
        ),
        (
            json!({"agentId": agent, "prompt": "x", "when": {"at": "2020-01-01T00:00:00Z"}}),
            "invalid_message",
            "in the past",
        ),
        (
            json!({"agentId": agent, "prompt": "x", "when": {"at": "tomorrow"}}),
            "invalid_message",
            "`tomorrow`",
        ),
        (
            json!({"agentId": agent, "prompt": "  ", "when": {"inSeconds": 5}}),
            "invalid_message",
            "prompt",
        ),
        (
            json!({"prompt": "x", "when": {"inSeconds": 5}}),
            "invalid_message",
            "agentId",
        ),
        (
            json!({"agentId": "0193b1c2-7d4e-7a10-8000-0123456789ab", "prompt": "x", "when": {"inSeconds": 5}}),
            "unknown_agent",
            "0193b1c2",
        ),
        (
            json!({"newAgent": {"provider": "nope", "cwd": daemon.cwd()}, "prompt": "x", "when": {"inSeconds": 5}}),
            "unknown_provider",
            "nope",
        ),
    ];
    for (request, code, names) in cases {
        let mut message = json!({"type": "create_schedule"});
        for (k, v) in request.as_object().expect("object") {
            message[k] = v.clone();
        }
        let answer = client.request(message).await;
        assert_eq!(answer["type"], "request_error", "{request}: {answer}");
        assert_eq!(answer["payload"]["code"], code, "{request}: {answer}");
        let text = answer["payload"]["message"].as_str().unwrap_or_default();
        assert!(text.contains(names), "{request}: {text}");
    }
    for kind in ["pause_schedule", "resume_schedule", "delete_schedule"] {
        for id in ["sched-999", "../etc/passwd"] {
            let answer = client
                .request(json!({"type": kind, "scheduleId": id}))
                .await;
            assert_eq!(answer["payload"]["code"], "unknown_schedule", "{answer}");
        }
    }
    assert!(list(&mut client).await.is_empty(), "nothing was made");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_archive_is_refused_listing_the_schedule_and_stop_activity_deletes_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = create(&mut client, &daemon.cwd(), "say parent", "parent").await;
    client.wait_idle(&parent).await;
    let child = string_at(&client
        .request(json!({"type": "create_agent", "provider": "scripted", "cwd": daemon.cwd(), "prompt": "say child", "parentAgentId": parent}))
        .await["payload"]["agent"]["id"]);
    client.wait_idle(&child).await;
    // The child's schedule counts for the parent's archive too: the cascade would hide it.
    let s = schedule(
        &mut client,
        json!({"agentId": child, "prompt": "say tick", "when": {"everySeconds": 3600}, "title": "hourly"}),
    )
    .await;
    let id = s["id"].as_str().expect("id").to_string();

    let refused = client
        .request(json!({"type": "archive", "agentId": parent}))
        .await;
    assert_eq!(refused["payload"]["code"], "agent_active", "{refused}");
    let items = &refused["payload"]["details"]["families"]["schedule"];
    assert_eq!(items[0]["id"], id.as_str(), "{refused}");
    assert_eq!(items[0]["agentId"], child.as_str(), "{refused}");
    assert_eq!(items[0]["title"], "hourly");
    assert!(
        refused["payload"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1 schedule")),
        "{refused}"
    );
    // Paused is not activity.
    client
        .request(json!({"type": "pause_schedule", "scheduleId": id}))
        .await;
    let archived = client
        .request(json!({"type": "archive", "agentId": child}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let resumed = client
        .request(json!({"type": "resume_schedule", "scheduleId": id}))
        .await;
    assert_eq!(resumed["payload"]["code"], "agent_archived", "{resumed}");
    client
        .request(json!({"type": "unarchive", "agentId": child}))
        .await;
    client
        .request(json!({"type": "resume_schedule", "scheduleId": id}))
        .await;

    let archived = client
        .request(json!({"type": "archive", "agentId": parent, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    assert_eq!(
        archived["payload"]["stopped"]["families"]["schedule"][0]["id"],
        id.as_str()
    );
    eventually("the schedule deleted", WAIT, async || {
        list(&mut client).await.is_empty()
    })
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_an_agent_manages_only_its_own_over_mcp() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let other = create(&mut client, &daemon.cwd(), "say other", "other").await;
    client.wait_idle(&other).await;
    let theirs = schedule(
        &mut client,
        json!({"agentId": other, "prompt": "say tick", "when": {"everySeconds": 3600}}),
    )
    .await;
    let theirs = theirs["id"].as_str().expect("id").to_string();
    let script = format!(
        "mcp create_schedule {{\"prompt\": \"say to me\", \"when\": {{\"cron\": \"0 9 * * 1-5\", \"timeZone\": \"Europe/Paris\"}}}}\n\
         mcp create_schedule {{\"agentId\": \"{other}\", \"prompt\": \"say x\", \"when\": {{\"inSeconds\": 60}}}}\n\
         mcp pause_schedule {{\"scheduleId\": \"{theirs}\"}}\n\
         mcp delete_schedule {{\"scheduleId\": \"{theirs}\"}}\n\
         mcp list_schedules {{}}"
    );
    let caller = create(&mut client, &daemon.cwd(), &script, "caller").await;
    client.wait_idle(&caller).await;
    let said = client.replies(&caller).await.concat();
    let first: Value = serde_json::from_str(
        said.split("mcp create_schedule: ")
            .nth(1)
            .and_then(|rest| rest.split("mcp create_schedule error").next())
            .expect("first answer"),
    )
    .expect("tool result JSON");
    assert_eq!(first["agentId"], caller.as_str());
    assert_eq!(first["createdBy"], caller.as_str());
    assert_eq!(first["description"], "cron 0 9 * * 1-5 (Europe/Paris)");
    let mine = first["id"].as_str().expect("id").to_string();
    assert!(
        said.contains("mcp create_schedule error:") && said.contains("is not yours"),
        "{said}"
    );
    assert!(said.contains("mcp pause_schedule error:"), "{said}");
    assert!(said.contains("mcp delete_schedule error:"), "{said}");
    assert!(said.contains("code: not_permitted"), "{said}");
    let listed = said.split("mcp list_schedules: ").nth(1).expect("listed");
    assert!(
        listed.contains(&mine) && !listed.contains(&theirs),
        "{listed}"
    );
    // The user sees both; theirs was left as it was.
    let all = list(&mut client).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        all.iter()
            .any(|s| s["id"] == theirs.as_str() && s["state"] == "active")
    );
    daemon.stop().await;
}

fn schedule_file(home: &Path, id: &str) -> Value {
    let bytes = std::fs::read(home.join("schedules").join(format!("{id}.json"))).expect("file");
    serde_json::from_slice(&bytes).expect("json")
}

/// A daemon process (one a test may SIGKILL) with the scripted provider, and its agent
/// `worker` idle after saying `ready`: the home, the folders to keep (agent state, work),
/// the daemon, a client, the agent.
async fn killable_worker() -> (TempDir, [TempDir; 2], DaemonProcess, Client, String) {
    let home = TempDir::new().expect("home");
    let state = TempDir::new().expect("state");
    let work = TempDir::new().expect("work");
    write_scripted_config(home.path(), state.path());
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    let agent = create(&mut client, work.path(), "say ready", "worker").await;
    client.wait_idle(&agent).await;
    (home, [state, work], daemon, client, agent)
}

/// Makes the schedule `request` describes; its id.
async fn schedule_id(client: &mut Client, request: Value) -> String {
    let s = schedule(client, request).await;
    s["id"].as_str().expect("id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_a_run_due_during_a_sigkill_fires_exactly_once_after_restart() {
    let (home, _dirs, mut daemon, mut client, agent) = killable_worker().await;
    let id = schedule_id(
        &mut client,
        json!({"agentId": agent, "prompt": "say once", "when": {"inSeconds": 2}}),
    )
    .await;
    daemon.sigkill();
    // It comes due while no daemon runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemon = DaemonProcess::start(home.path()).await;
    let mut client = daemon.client().await;
    eventually("the run recorded", WAIT, async || {
        schedule_file(home.path(), &id)["runs"]
            .as_array()
            .is_some_and(|r| r.len() == 1)
    })
    .await;
    client.wait_idle(&agent).await;
    // A while longer: nothing more comes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.wait_idle(&agent).await;
    let sent = scheduled_messages(&mut client, &agent).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let file = schedule_file(home.path(), &id);
    assert_eq!(file["runs"].as_array().map(Vec::len), Some(1), "{file}");
    assert_eq!(file["runs"][0]["messageId"], sent[0]["data"]["messageId"]);
    assert!(file["nextRunAt"].is_null(), "{file}");
    assert_eq!(client.replies(&agent).await, ["ready", "once"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_sigkills_while_runs_fire_never_lose_or_repeat_one() {
    let (home, _dirs, mut daemon, mut client, agent) = killable_worker().await;
    let id = schedule_id(
        &mut client,
        json!({"agentId": agent, "prompt": "say tick", "when": {"everySeconds": 1}}),
    )
    .await;
    // Killed at offsets that land before, during and after runs.
    for wait_ms in [1300_u64, 2050, 1700] {
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        daemon.sigkill();
        daemon = DaemonProcess::start(home.path()).await;
    }
    let mut client = daemon.client().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let paused = client
        .request(json!({"type": "pause_schedule", "scheduleId": id}))
        .await;
    assert_eq!(paused["payload"]["schedule"]["state"], "paused", "{paused}");
    client.wait_idle(&agent).await;
    let file = schedule_file(home.path(), &id);
    assert!(file["pending"].is_null(), "{file}");
    let runs: Vec<String> = file["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["messageId"].as_str().map(str::to_string))
        .collect();
    let sent: Vec<String> = scheduled_messages(&mut client, &agent)
        .await
        .iter()
        .filter_map(|m| m["data"]["messageId"].as_str().map(str::to_string))
        .collect();
    assert!(runs.len() >= 3, "too few runs to mean anything: {file}");
    let mut unique = sent.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        sent.len(),
        "a run was delivered twice: {sent:?}"
    );
    assert_eq!(
        sent, runs,
        "every recorded run was delivered, and only those"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_an_agent_made_for_a_subagent_pause_once_it_is_detached() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let parent = create(&mut client, &daemon.cwd(), "say parent", "parent").await;
    client.wait_idle(&parent).await;
    let child = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(),
            "prompt": "say child", "title": "child", "parentAgentId": parent}))
        .await;
    client.wait_idle(&child).await;
    let script = format!(
        "mcp create_schedule {{\"agentId\": \"{child}\", \"prompt\": \"say tick\", \"when\": {{\"everySeconds\": 1}}}}"
    );
    client
        .request(json!({"type": "send_message", "agentId": parent, "text": script}))
        .await;
    let ticked = eventually("a first tick to the subagent", WAIT, async || {
        let got = scheduled_messages(&mut client, &child).await;
        (!got.is_empty()).then_some(got.len())
    })
    .await;
    assert!(ticked >= 1);

    let detached = client
        .request(json!({"type": "detach", "agentId": child}))
        .await;
    assert_ne!(detached["type"], "request_error", "{detached}");
    // The next run pauses the schedule, saying why, instead of failing each second.
    let paused = eventually("the schedule paused", WAIT, async || {
        list(&mut client)
            .await
            .into_iter()
            .find(|s| s["state"] == "paused")
    })
    .await;
    let runs = paused["runs"].as_array().expect("runs");
    let last = runs.last().expect("a run");
    let error = last["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("schedule paused") && error.contains("no longer"),
        "{paused}"
    );
    assert_eq!(
        runs.iter().filter(|r| !r["error"].is_null()).count(),
        1,
        "{paused}"
    );
    daemon.stop().await;
}

/// Files in `schedules/` that boot leaves alone (unreadable, naming another id, written by a
/// newer drover) are never taken over: the next schedule gets an id past every one, and each
/// file stays byte for byte what it was. Nor is a deleted schedule's id given again after a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_never_reuse_the_id_of_a_file_boot_left_alone() {
    // A schedule file as this drover writes it, to derive the others from.
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon.cwd(), "say ready", "worker").await;
    let made = schedule(
        &mut client,
        json!({"agentId": agent, "prompt": "say later", "when": {"inSeconds": 3600}}),
    )
    .await;
    assert_eq!(made["id"], "sched-1", "{made}");
    let (home, keep) = daemon.stop().await;
    let template = schedule_file(&home, "sched-1");
    let left_alone = drover_testkit::records_boot_leaves_alone(&template, "sched");
    // The last past sched-5 too, which the case before made and deleted.
    let cases = left_alone
        .into_iter()
        .zip(["sched-2", "sched-5", "sched-6"]);
    let (mut home, mut keep) = (home, keep);
    for ((case, bytes), expected) in cases {
        let file = home.join("schedules").join("sched-1.json");
        std::fs::write(&file, &bytes).expect("write the file");
        let daemon = TestDaemon::start_in(home, keep, false).await;
        let (mut client, _) = daemon.client().await;
        assert!(
            list(&mut client).await.is_empty(),
            "{case}: the file was loaded"
        );
        let made = schedule(
            &mut client,
            json!({"agentId": agent, "prompt": "say later", "when": {"inSeconds": 3600}}),
        )
        .await;
        assert_eq!(made["id"], expected, "{case}: {made}");
        assert_eq!(
            std::fs::read(&file).expect("the file is still there"),
            bytes,
            "{case}: the file boot left alone was rewritten"
        );
        // The next case starts from the same folder, without this run's schedule (its id
        // stays taken).
        let id = made["id"].as_str().expect("id").to_string();
        let deleted = client
            .request(json!({"type": "delete_schedule", "scheduleId": id}))
            .await;
        assert_ne!(deleted["type"], "request_error", "{deleted}");
        (home, keep) = daemon.stop().await;
    }
}
