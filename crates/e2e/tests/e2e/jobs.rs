//! Jobs through the real daemon: background commands owned by an agent, started over the
//! protocol and over MCP by the scripted agent; their output by offset, kills of whole process
//! groups, exit notices, ownership, archive admission, and shutdown.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use drover_fakes::procs;
use drover_testkit::daemon::{Client, TestDaemon, string_at};
use drover_testkit::wait::eventually;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn create(client: &mut Client, daemon: &TestDaemon, prompt: &str, title: &str) -> String {
    client
        .create_scripted(&daemon.cwd(), json!({"prompt": prompt, "title": title}))
        .await
}

async fn start_job(client: &mut Client, agent: &str, command: &str) -> Value {
    let started = client
        .request(json!({"type": "start_job", "agentId": agent, "command": command}))
        .await;
    assert_eq!(started["type"], "job", "{started}");
    assert_eq!(started["payload"]["job"]["status"], "running", "{started}");
    started["payload"]["job"].clone()
}

async fn job(client: &mut Client, id: &str) -> Value {
    let listed = client.request(json!({"type": "list_jobs"})).await;
    listed["payload"]["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("job {id} not listed: {listed}"))
}

/// Follows the job's output from `offset` to its end, as `drover job logs -f` does.
async fn follow(client: &mut Client, id: &str, mut offset: u64) -> (String, u64) {
    let mut text = String::new();
    for _ in 0..10_000 {
        let out = client
            .request(json!({"type": "job_output", "jobId": id, "offset": offset, "waitMs": 5000, "maxBytes": 100_000}))
            .await;
        assert_eq!(out["type"], "job_output", "{out}");
        let payload = &out["payload"];
        assert_eq!(
            payload["offset"], offset,
            "a follower never skips: {payload}"
        );
        text.push_str(payload["text"].as_str().expect("text"));
        offset = payload["nextOffset"].as_u64().expect("nextOffset");
        if payload["eof"] == true {
            return (text, offset);
        }
    }
    panic!("job {id} never reached its end");
}

/// The most one `job_output_update` carries.
const CHUNK: usize = 256 * 1024;

/// The `job_output_update`s of job `id` from `offset` to the one with `eof`: their text, and
/// how many there were. Each starts where the one before ended.
async fn pushed(client: &mut Client, id: &str, mut offset: u64) -> (String, usize) {
    let mut text = String::new();
    for n in 1..=100_000 {
        let update = client
            .recv_where(|m| m["type"] == "job_output_update" && m["payload"]["jobId"] == id)
            .await;
        let p = &update["payload"];
        assert_eq!(p["offset"], offset, "pushed from where the last ended: {p}");
        assert_eq!(p["skipped"], 0, "{p}");
        let chunk = p["text"].as_str().expect("text");
        assert!(chunk.len() <= CHUNK, "a chunk of {} bytes", chunk.len());
        let next = p["nextOffset"].as_u64().expect("nextOffset");
        assert_eq!(next - offset, chunk.len() as u64, "{p}");
        text.push_str(chunk);
        offset = next;
        if p["eof"] == true {
            return (text, n);
        }
        assert!(!chunk.is_empty(), "only the last push may be empty: {p}");
    }
    panic!("job {id} pushed no eof");
}

/// `seq 1 n` as text.
fn seq(n: u32) -> String {
    let mut expected = String::new();
    for i in 1..=n {
        expected.push_str(&i.to_string());
        expected.push('\n');
    }
    expected
}

fn alive(pid: i32) -> bool {
    procs::Process::read(pid).is_some_and(|p| !p.zombie())
}

fn pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("pid="))
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_output_is_read_by_offset_across_the_ring_and_survives_a_restart() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    // About 2.6 MB: more than the 1 MiB ring, so a follower from 0 reads through the log, and
    // the first reads happen while the job still writes.
    let started = start_job(&mut client, &agent, "seq 1 400000; echo done >&2").await;
    let id = started["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("job-"), "{started}");
    assert_eq!(started["cwd"], daemon.cwd().display().to_string());
    let (text, end) = follow(&mut client, &id, 0).await;
    let mut expected = String::new();
    for i in 1..=400_000 {
        expected.push_str(&i.to_string());
        expected.push('\n');
    }
    expected.push_str("done\n");
    assert_eq!(text.len(), expected.len(), "every byte, once");
    assert!(text == expected, "the bytes in order");
    assert_eq!(end, expected.len() as u64);

    // A read from the middle, the tail, and a read past the end.
    let mid = client
        .request(json!({"type": "job_output", "jobId": id, "offset": 1_000_000, "maxBytes": 16}))
        .await;
    assert_eq!(
        mid["payload"]["text"],
        expected[1_000_000..1_000_016],
        "{mid}"
    );
    let tail = client
        .request(json!({"type": "job_output", "jobId": id, "tail": 12}))
        .await;
    assert_eq!(tail["payload"]["text"], "400000\ndone\n", "{tail}");
    assert_eq!(tail["payload"]["eof"], true);
    let past = client
        .request(json!({"type": "job_output", "jobId": id, "offset": end + 100}))
        .await;
    assert_eq!(past["payload"]["text"], "");
    assert_eq!(past["payload"]["nextOffset"], end);

    let ended = job(&mut client, &id).await;
    assert_eq!(ended["status"], "exited", "{ended}");
    assert_eq!(ended["exitCode"], 0);
    assert_eq!(ended["outputBytes"], end);
    assert!(ended["durationMs"].is_u64(), "{ended}");

    // Private files: the folder 0700, the record and the log 0600.
    let home = daemon.home.clone();
    let dir = home.join("jobs").join(&agent);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(format!("{id}.json"))), 0o600);
    assert_eq!(mode(&dir.join(format!("{id}.log"))), 0o600);

    // Shutdown kills a running job and says so; the output stays readable after a restart.
    let sleeper = start_job(&mut client, &agent, "echo pid=$$; exec sleep 1000").await;
    let sleeper_id = sleeper["id"].as_str().expect("id").to_string();
    let pid = i32::try_from(sleeper["pid"].as_u64().expect("pid")).expect("pid");
    assert!(alive(pid));
    let (home, keep) = daemon.stop().await;
    assert!(!alive(pid), "a job outlived the daemon's shutdown");
    let daemon = TestDaemon::start_in(home, keep, false).await;
    let (mut client, _) = daemon.client().await;
    let stopped = job(&mut client, &sleeper_id).await;
    assert_eq!(stopped["status"], "killed", "{stopped}");
    assert_eq!(stopped["killedBy"], "shutdown", "{stopped}");
    let again = client
        .request(json!({"type": "job_output", "jobId": id, "offset": 0, "maxBytes": 7}))
        .await;
    assert_eq!(again["payload"]["text"], "1\n2\n3\n4", "{again}");
    // Ids are never reused. (The agent's own cwd went with the first daemon's temp dir.)
    let next = client
        .request(
            json!({"type": "start_job", "agentId": agent, "command": "true", "cwd": daemon.cwd()}),
        )
        .await;
    assert_eq!(next["type"], "job", "{next}");
    assert_eq!(next["payload"]["job"]["id"], "job-3", "{next}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_kill_ends_the_whole_process_group_even_when_it_ignores_term() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    for (command, killed_by_term) in [
        (
            "sleep 1000 & echo pid=$!; sleep 1000 & echo pid=$!; wait",
            true,
        ),
        // Ignored signals stay ignored across exec: the shell and its child both outlast TERM.
        (
            "trap '' TERM; sleep 1000 & echo pid=$!; echo pid=$$; wait",
            false,
        ),
    ] {
        let started = start_job(&mut client, &agent, command).await;
        let id = started["id"].as_str().expect("id").to_string();
        let leader = i32::try_from(started["pid"].as_u64().expect("pid")).expect("pid");
        let children = eventually("the job to print its children", WAIT, async || {
            let out = client
                .request(json!({"type": "job_output", "jobId": id, "offset": 0}))
                .await;
            let found = pids(out["payload"]["text"].as_str().unwrap_or_default());
            (found.len() >= 2).then_some(found)
        })
        .await;
        assert!(children.iter().all(|p| alive(*p)), "{children:?}");
        let asked = std::time::Instant::now();
        let killed = client
            .request(json!({"type": "kill_job", "jobId": id}))
            .await;
        assert_eq!(killed["type"], "job", "{killed}");
        let record = &killed["payload"]["job"];
        assert_eq!(record["status"], "killed", "{record}");
        assert_eq!(record["killedBy"], "request", "{record}");
        let signal = if killed_by_term { 15 } else { 9 };
        assert_eq!(record["signal"], signal, "{record}");
        if !killed_by_term {
            assert!(
                asked.elapsed() >= Duration::from_secs(2),
                "KILL came before the grace"
            );
        }
        eventually("every process of the job to end", WAIT, async || {
            !alive(leader) && children.iter().all(|p| !alive(*p))
        })
        .await;
        assert!(procs::group_gone(leader), "its group outlived it");
    }

    // A job that ends on its own takes what it left in its group with it.
    let started = start_job(&mut client, &agent, "sleep 1000 & echo pid=$!; exit 4").await;
    let id = started["id"].as_str().expect("id").to_string();
    let waited = client
        .request(json!({"type": "wait_job", "jobId": id, "timeoutMs": 15000}))
        .await;
    assert_eq!(waited["payload"]["ended"], true, "{waited}");
    assert_eq!(waited["payload"]["job"]["status"], "exited");
    assert_eq!(waited["payload"]["job"]["exitCode"], 4);
    // A kill of a job that already ended leaves it as it is (and answers: it once deadlocked).
    let late = client
        .request(json!({"type": "kill_job", "jobId": id}))
        .await;
    assert_eq!(late["payload"]["job"]["status"], "exited", "{late}");
    assert_eq!(late["payload"]["job"]["killedBy"], Value::Null, "{late}");
    let out = client
        .request(json!({"type": "job_output", "jobId": id}))
        .await;
    let left = pids(out["payload"]["text"].as_str().unwrap_or_default());
    assert_eq!(left.len(), 1, "{out}");
    eventually("the job's background child to end", WAIT, async || {
        !alive(left[0])
    })
    .await;

    // Bad input is named.
    let bad = client
        .request(json!({"type": "start_job", "agentId": agent, "command": "true", "cwd": "/no/such/dir"}))
        .await;
    assert_eq!(bad["payload"]["code"], "invalid_input", "{bad}");
    assert!(
        bad["payload"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("/no/such/dir"),
        "{bad}"
    );
    let unknown = client
        .request(json!({"type": "kill_job", "jobId": "job-999"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "unknown_job", "{unknown}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_exit_notice_reaches_the_owner_as_a_queued_followup_never_an_interruption() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    // The job ends while the turn that started it still runs: its notice waits for the turn.
    let script =
        "mcp start_job {\"command\": \"echo hello-from-job; exit 3\"}\nsleep 1500\nsay turn done";
    let agent = create(&mut client, &daemon, script, "owner").await;
    let notice = eventually("the exit notice", WAIT, async || {
        client
            .messages_from(&agent, "job:")
            .await
            .into_iter()
            .next()
    })
    .await;
    client.wait_idle(&agent).await;
    let text = notice["data"]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("[drover] Job job-") && text.contains("exit status 3"),
        "{text}"
    );
    assert!(text.contains("> hello-from-job"), "{text}");
    assert_eq!(notice["data"]["delivery"], "followup");
    // The first turn ran to its end; the notice started the second.
    let said = client.replies(&agent).await.concat();
    assert!(said.contains("turn done"), "{said}");
    assert_eq!(
        client.turn_events(&agent).await,
        ["turn_completed", "turn_completed"]
    );

    // notifyOnExit false: no notice.
    let quiet = "mcp start_job {\"command\": \"true\", \"notifyOnExit\": false}";
    let other = create(&mut client, &daemon, quiet, "quiet").await;
    client.wait_idle(&other).await;
    let said = client.replies(&other).await.concat();
    let id = said
        .split("\"jobId\": \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("job id in the tool result")
        .to_string();
    let waited = client
        .request(json!({"type": "wait_job", "jobId": id, "timeoutMs": 15000}))
        .await;
    assert_eq!(waited["payload"]["ended"], true, "{waited}");
    client.wait_idle(&other).await;
    assert_eq!(client.turn_events(&other).await, ["turn_completed"]);
    daemon.stop().await;
}

/// A `wait_job` that names no timeout waits the operation's one default (50 s) over the
/// protocol and over MCP alike, then answers that the job still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_job_waits_one_default_over_the_protocol_and_over_mcp() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let owner = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&owner).await;
    let job = start_job(&mut client, &owner, "exec sleep 1000").await;
    let id = job["id"].as_str().expect("job id").to_string();

    let start = Instant::now();
    let call = format!("mcp wait_job {{\"jobId\": \"{id}\"}}");
    client.send_message(&owner, &call).await;
    client
        .send(json!({"type": "wait_job", "requestId": "waited", "jobId": id}))
        .await;
    let (mut protocol, mut mcp) = (None, None);
    // Other requests keep the socket read while both waits run (one read waits at most 20 s).
    for _ in 0..60 {
        if protocol.is_some() && mcp.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let said = client.replies(&owner).await;
        if mcp.is_none()
            && let Some(result) = said.iter().find(|s| s.starts_with("mcp wait_job"))
        {
            mcp = Some((start.elapsed(), result.clone()));
        }
        if protocol.is_none()
            && client
                .backlog()
                .iter()
                .any(|m| m["payload"]["requestId"] == "waited")
        {
            let answer = client
                .recv_where(|m| m["payload"]["requestId"] == "waited")
                .await;
            protocol = Some((start.elapsed(), answer));
        }
    }
    let (took, answer) = protocol.expect("the protocol's wait_job answered");
    assert_eq!(answer["type"], "job_waited", "{answer}");
    assert_eq!(answer["payload"]["ended"], false, "{answer}");
    assert!(
        (Duration::from_secs(48)..Duration::from_secs(60)).contains(&took),
        "the protocol's wait_job answered after {took:?}"
    );
    let (took, result) = mcp.expect("the MCP wait_job answered");
    assert!(result.contains("\"timedOut\": true"), "{result}");
    assert!(
        (Duration::from_secs(48)..Duration::from_secs(60)).contains(&took),
        "the MCP wait_job answered after {took:?}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_an_agent_sees_and_controls_only_its_own_and_its_subagents_jobs() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let owner = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&owner).await;
    let started = start_job(&mut client, &owner, "exec sleep 1000").await;
    let id = started["id"].as_str().expect("id").to_string();
    let script = format!(
        "mcp job_output {{\"jobId\": \"{id}\"}}\n\
         mcp kill_job {{\"jobId\": \"{id}\"}}\n\
         mcp start_job {{\"command\": \"true\", \"agentId\": \"{owner}\"}}\n\
         mcp list_jobs {{}}\n\
         mcp job_output {{\"jobId\": \"job-999\"}}\n\
         mcp start_job {{\"command\": \"echo mine\", \"timeoutS\": 0}}"
    );
    let stranger = create(&mut client, &daemon, &script, "stranger").await;
    client.wait_idle(&stranger).await;
    let said = client.replies(&stranger).await.concat();
    // Each answer starts with `mcp <tool>`; split them apart, in order.
    let answers: Vec<String> = said
        .split("mcp ")
        .filter(|a| !a.is_empty())
        .map(|a| format!("mcp {a}"))
        .collect();
    assert_eq!(answers.len(), 6, "{said}");
    for answer in &answers[..3] {
        assert!(
            answer.contains(" error:")
                && answer.contains("not yours")
                && answer.contains("code: not_permitted"),
            "{answer}"
        );
    }
    assert!(
        answers[1].starts_with("mcp kill_job error:")
            && answers[2].starts_with("mcp start_job error:"),
        "{answers:?}"
    );
    assert!(
        answers[3].starts_with("mcp list_jobs: ") && answers[3].contains("\"jobs\": []"),
        "{}",
        answers[3]
    );
    assert!(answers[4].contains("code: unknown_job"), "{}", answers[4]);
    assert!(
        answers[5].contains("timeoutS") && answers[5].contains("at least 1 second"),
        "{}",
        answers[5]
    );
    // The job still runs: the stranger's kill did nothing.
    assert_eq!(job(&mut client, &id).await["status"], "running");
    assert!(alive(
        i32::try_from(started["pid"].as_u64().expect("pid")).expect("pid")
    ));

    // The owner's parent may: a subagent's jobs are its parent's to see and control.
    let script = r#"mcp create_agent {"relationship": {"kind": "subagent"}, "workspace": {"kind": "current"}, "prompt": "mcp start_job {\"command\": \"exec sleep 1000\"}"}"#;
    let parent = create(&mut client, &daemon, script, "parent").await;
    client.wait_idle(&parent).await;
    let child_job = eventually("the child's job", WAIT, async || {
        let listed = client.request(json!({"type": "list_jobs"})).await;
        listed["payload"]["jobs"]
            .as_array()
            .and_then(|jobs| {
                jobs.iter()
                    .find(|j| j["command"] == "exec sleep 1000" && j["agentId"] != owner.as_str())
            })
            .and_then(|j| j["id"].as_str().map(str::to_string))
    })
    .await;
    let killed = client
        .request(json!({"type": "send_message", "agentId": parent, "text": format!("mcp kill_job {{\"jobId\": \"{child_job}\"}}")}))
        .await;
    assert_eq!(killed["type"], "message_queued", "{killed}");
    client.wait_idle(&parent).await;
    let said = client.replies(&parent).await.concat();
    assert!(
        said.contains("mcp kill_job: ") && said.contains("\"status\": \"killed\""),
        "{said}"
    );
    let killed = client
        .request(json!({"type": "kill_job", "jobId": id}))
        .await;
    assert_eq!(killed["payload"]["job"]["status"], "killed");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_archive_is_refused_listing_the_job_then_stop_activity_kills_it() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    let started = start_job(&mut client, &agent, "sleep 1000 & echo pid=$!; wait").await;
    let id = started["id"].as_str().expect("id").to_string();
    let leader = i32::try_from(started["pid"].as_u64().expect("pid")).expect("pid");
    let refused = client
        .request(json!({"type": "archive", "agentId": agent}))
        .await;
    assert_eq!(refused["payload"]["code"], "agent_active", "{refused}");
    let listed = &refused["payload"]["details"]["families"]["job"];
    assert_eq!(listed[0]["id"], id.as_str(), "{refused}");
    assert!(
        listed[0]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("sleep 1000"),
        "{refused}"
    );
    assert!(
        refused["payload"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("1 job"),
        "{refused}"
    );
    assert_eq!(job(&mut client, &id).await["status"], "running");

    let archived = client
        .request(json!({"type": "archive", "agentId": agent, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let ended = eventually("the job to be killed", WAIT, async || {
        let j = job(&mut client, &id).await;
        (j["status"] != "running").then_some(j)
    })
    .await;
    assert_eq!(ended["status"], "killed", "{ended}");
    assert_eq!(ended["killedBy"], "archive", "{ended}");
    eventually("the job's group to end", WAIT, async || {
        procs::group_gone(leader)
    })
    .await;
    // An archived agent gets no new job.
    let refused = client
        .request(json!({"type": "start_job", "agentId": agent, "command": "true"}))
        .await;
    assert_eq!(refused["payload"]["code"], "agent_archived", "{refused}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_loop_of_self_wakes_is_cut_after_five_and_its_last_notice_waits_as_context() {
    let home = tempfile::TempDir::new().expect("home");
    let state = tempfile::TempDir::new().expect("agent state");
    // An agent that acts on what a notice quotes.
    let config = format!(
        "[providers.scripted]\ncommand = [{bin:?}]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, SCRIPTED_AGENT_READ_QUOTES = \"1\" }}\n",
        bin = drover_testkit::scripted_agent_bin().display().to_string(),
        state = state.path().display().to_string(),
    );
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), None, config).await;
    let (mut client, _) = daemon.client().await;
    // A job whose output, quoted in its exit notice, makes the woken turn start it again: a
    // loop with no end of its own.
    let again = r#"mcp start_job {"command": "sh again.sh"}"#;
    std::fs::write(daemon.cwd().join("again.sh"), format!("echo '{again}'\n")).expect("script");
    let agent = create(&mut client, &daemon, again, "looper").await;

    let cap = drover_acp::jobs::MAX_SELF_WAKES as usize;
    let inbox = home.path().join("inbox").join(format!("{agent}.jsonl"));
    // The cap's notice is queued as an inject: context for a later turn, waking nothing.
    let cut = eventually(
        "the notice past the cap queued as an inject",
        WAIT * 3,
        async || {
            let text = std::fs::read_to_string(&inbox).unwrap_or_default();
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l.to_string().contains("Not woken:"))
        },
    )
    .await;
    assert_eq!(cut["message"]["delivery"], "inject", "{cut}");
    client.wait_idle(&agent).await;

    // The user's turn and one turn per wake, each starting the next job; nothing after.
    let jobs = client
        .request(json!({"type": "list_jobs", "agentId": agent}))
        .await;
    let jobs = jobs["payload"]["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), cap + 1, "{jobs:?}");
    assert!(jobs.iter().all(|j| j["status"] == "exited"), "{jobs:?}");
    assert_eq!(client.turn_events(&agent).await.len(), cap + 1);
    let wakes = client.messages_from(&agent, "job:").await.len();
    assert_eq!(wakes, cap);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_an_agent_keeps_its_last_twenty_ended_jobs_and_older_files_are_deleted() {
    let home = tempfile::TempDir::new().expect("home");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    let agent = create(&mut client, &daemon, "say ready", "worker").await;
    client.wait_idle(&agent).await;
    let keep = drover_acp::jobs::KEEP_ENDED;
    let runs = keep + 3;
    for i in 0..runs {
        let started = client
            .request(json!({"type": "start_job", "agentId": agent,
                "command": format!("echo run {i}"), "notifyOnExit": false}))
            .await;
        let id = string_at(&started["payload"]["job"]["id"]);
        let waited = client
            .request(json!({"type": "wait_job", "jobId": id, "timeoutMs": 15000}))
            .await;
        assert_eq!(waited["payload"]["ended"], true, "{waited}");
    }
    let dir = home.path().join("jobs").join(&agent);
    let on_disk = || {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("jobs dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    };
    let ids = |listed: &Value| -> Vec<String> {
        listed["payload"]["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["id"].as_str().expect("id").to_string())
            .collect()
    };
    let wanted: Vec<String> = (4..=runs).map(|n| format!("job-{n}")).collect();
    let listed = client
        .request(json!({"type": "list_jobs", "agentId": agent}))
        .await;
    assert_eq!(ids(&listed), wanted, "{listed}");
    let gone = client
        .request(json!({"type": "job_output", "jobId": "job-1", "offset": 0}))
        .await;
    assert_eq!(gone["payload"]["code"], "unknown_job", "{gone}");
    let files = on_disk();
    assert_eq!(files.len(), 2 * keep, "{files:?}");
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with("job-1.") || f.starts_with("job-3.")),
        "{files:?}"
    );
    let kept = client
        .request(json!({"type": "job_output", "jobId": format!("job-{runs}"), "offset": 0}))
        .await;
    assert_eq!(
        kept["payload"]["text"],
        format!("run {}\n", runs - 1),
        "{kept}"
    );

    // A log whose record is gone (a deletion a crash cut off) goes at the next boot; the kept
    // jobs stay, and numbering goes on after them.
    daemon.stop().await;
    std::fs::write(dir.join("job-2.log"), "orphan").expect("orphan log");
    let daemon = TestDaemon::start_in(home.path().to_path_buf(), None, false).await;
    let (mut client, _) = daemon.client().await;
    assert_eq!(on_disk().len(), 2 * keep, "{:?}", on_disk());
    let listed = client
        .request(json!({"type": "list_jobs", "agentId": agent}))
        .await;
    assert_eq!(ids(&listed), wanted, "{listed}");
    // (The first daemon's working directory went with it.)
    let next = client
        .request(
            json!({"type": "start_job", "agentId": agent, "command": "true", "cwd": daemon.cwd()}),
        )
        .await;
    assert_eq!(
        next["payload"]["job"]["id"],
        format!("job-{}", runs + 1),
        "{next}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_follower_from_offset_0_is_pushed_every_byte_once_in_order_then_eof() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    // About 2.6 MB, more than the 1 MiB ring, with a multi-byte character at the end.
    let started = start_job(&mut client, &agent, "seq 1 400000; printf 'fin €\n'").await;
    let id = started["id"].as_str().expect("id").to_string();
    let followed = client
        .request(json!({"type": "follow_job", "jobId": id, "offset": 0}))
        .await;
    assert_eq!(followed["type"], "job_followed", "{followed}");
    assert_eq!(followed["payload"]["offset"], 0, "{followed}");
    assert_eq!(followed["payload"]["job"]["id"], id.as_str(), "{followed}");
    let (text, pushes) = pushed(&mut client, &id, 0).await;
    let expected = seq(400_000) + "fin €\n";
    assert_eq!(text.len(), expected.len(), "every byte, once");
    assert!(text == expected, "the bytes in order");
    assert!(
        pushes >= expected.len() / CHUNK,
        "{pushes} pushes for {} bytes",
        expected.len()
    );
    // The follow is over: following an unknown job names it, and unfollowing says there was
    // nothing to stop.
    let unknown = client
        .request(json!({"type": "follow_job", "jobId": "job-999"}))
        .await;
    assert_eq!(unknown["type"], "request_error", "{unknown}");
    assert_eq!(unknown["payload"]["code"], "unknown_job", "{unknown}");
    assert!(
        unknown["payload"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("job-999"),
        "{unknown}"
    );
    let unfollowed = client
        .request(json!({"type": "unfollow_job", "jobId": id}))
        .await;
    assert_eq!(unfollowed["type"], "job_unfollowed", "{unfollowed}");
    assert_eq!(unfollowed["payload"]["followed"], false, "{unfollowed}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_late_follower_from_offset_0_gets_the_log_then_the_live_output() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    // 2.1 MB, then it waits for the test to open the gate: the first MiB is only in the log
    // by the time the follower comes.
    let started = start_job(&mut client, &agent, "mkfifo gate; seq 1 300000; cat gate").await;
    let id = started["id"].as_str().expect("id").to_string();
    let before = seq(300_000);
    let written = client
        .request(json!({"type": "job_output", "jobId": id, "offset": before.len() - 1, "waitMs": 20_000}))
        .await;
    assert_eq!(written["payload"]["end"], before.len(), "{written}");

    let followed = client
        .request(json!({"type": "follow_job", "jobId": id}))
        .await;
    assert_eq!(followed["payload"]["offset"], 0, "{followed}");
    assert_eq!(
        followed["payload"]["job"]["status"], "running",
        "{followed}"
    );
    // The log part, up to what the job had written.
    let mut text = String::new();
    let mut offset = 0;
    while offset < before.len() as u64 {
        let update = client.recv_type("job_output_update").await;
        let p = &update["payload"];
        assert_eq!(p["offset"], offset, "{p}");
        assert_eq!(p["eof"], false, "{p}");
        text.push_str(p["text"].as_str().expect("text"));
        offset = p["nextOffset"].as_u64().expect("nextOffset");
    }
    assert!(text == before, "the output before the follow, in order");
    // The live part.
    let gate = daemon.cwd().join("gate");
    tokio::task::spawn_blocking(move || std::fs::write(gate, "the live part\n"))
        .await
        .expect("join")
        .expect("write to the job's gate");
    let (live, _) = pushed(&mut client, &id, offset).await;
    assert_eq!(live, "the live part\n");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_follow_of_an_ended_job_sends_the_rest_then_eof_and_unfollow_stops_the_pushes() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    let started = start_job(&mut client, &agent, "printf 'héllo wörld\n'").await;
    let id = started["id"].as_str().expect("id").to_string();
    let waited = client
        .request(json!({"type": "wait_job", "jobId": id, "timeoutMs": 15000}))
        .await;
    assert_eq!(waited["payload"]["ended"], true, "{waited}");
    // From an offset: the rest, then eof (here in one push).
    let followed = client
        .request(json!({"type": "follow_job", "jobId": id, "offset": 3}))
        .await;
    assert_eq!(followed["payload"]["job"]["status"], "exited", "{followed}");
    assert_eq!(followed["payload"]["offset"], 3, "{followed}");
    let (rest, _) = pushed(&mut client, &id, 3).await;
    assert_eq!(rest, "llo wörld\n");
    // From the start: everything.
    client
        .request(json!({"type": "follow_job", "jobId": id}))
        .await;
    let (all, pushes) = pushed(&mut client, &id, 0).await;
    assert_eq!((all.as_str(), pushes), ("héllo wörld\n", 1));

    // A job that goes on writing: unfollowed, nothing more is pushed, though it writes on.
    let ticking = start_job(
        &mut client,
        &agent,
        "while :; do echo tick; sleep 0.02; done",
    )
    .await;
    let tick = ticking["id"].as_str().expect("id").to_string();
    client
        .request(json!({"type": "follow_job", "jobId": tick}))
        .await;
    let first = client.recv_type("job_output_update").await;
    assert_eq!(first["payload"]["jobId"], tick.as_str(), "{first}");
    let unfollowed = client
        .request(json!({"type": "unfollow_job", "jobId": tick}))
        .await;
    assert_eq!(unfollowed["type"], "job_unfollowed", "{unfollowed}");
    assert_eq!(unfollowed["payload"]["followed"], true, "{unfollowed}");
    // What came before the answer may have been pushed; nothing may come after it.
    client.clear_backlog();
    let now = client
        .request(json!({"type": "job_output", "jobId": tick, "tail": 0}))
        .await;
    let unfollowed_at = now["payload"]["end"].as_u64().expect("end");
    let mut end = unfollowed_at;
    for _ in 0..5 {
        let out = client
            .request(json!({"type": "job_output", "jobId": tick, "offset": end, "waitMs": 10_000}))
            .await;
        end = out["payload"]["end"].as_u64().expect("end");
    }
    assert!(end >= unfollowed_at + 5, "the job wrote on: {end}");
    assert!(
        !client
            .backlog()
            .iter()
            .any(|m| m["type"] == "job_output_update"),
        "pushed after the unfollow: {:?}",
        client.backlog()
    );
    client
        .request(json!({"type": "kill_job", "jobId": tick}))
        .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_follower_that_stops_reading_lags_then_gets_every_byte() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    let (mut reader, _) = daemon.client().await;
    // About 21 MB: far more than the socket's buffers and the session's queue hold.
    let started = start_job(&mut client, &agent, "seq 1 3000000").await;
    let id = started["id"].as_str().expect("id").to_string();
    let followed = reader
        .request(json!({"type": "follow_job", "jobId": id, "offset": 0}))
        .await;
    assert_eq!(followed["type"], "job_followed", "{followed}");
    // The reader reads nothing until the job ended: the job does not wait for it.
    let waited = client
        .request(json!({"type": "wait_job", "jobId": id, "timeoutMs": 60_000}))
        .await;
    assert_eq!(waited["payload"]["ended"], true, "{waited}");
    let (text, _) = pushed(&mut reader, &id, 0).await;
    let expected = seq(3_000_000);
    assert_eq!(text.len(), expected.len(), "every byte, once");
    assert!(text == expected, "the bytes in order");
    daemon.stop().await;
}

/// Job records that boot leaves alone (unreadable, naming another job, written by a newer
/// drover) are never taken over: the next job gets a number past every one, and each file
/// stays byte for byte what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_never_reuse_the_id_of_a_record_boot_left_alone() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = create(&mut client, &daemon, "say ready", "worker").await;
    client.wait_idle(&agent).await;
    let first = start_job(&mut client, &agent, "true").await;
    assert_eq!(first["id"], "job-1", "{first}");
    eventually("job-1 to end", WAIT, async || {
        job(&mut client, "job-1").await["status"] == "exited"
    })
    .await;
    let (home, keep) = daemon.stop().await;
    let file = home.join("jobs").join(&agent).join("job-1.json");
    let template: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("job-1.json")).expect("JSON");
    let left_alone = drover_testkit::records_boot_leaves_alone(&template, "job");
    let cases = left_alone.into_iter().zip(["job-2", "job-5", "job-2"]);
    let (mut home, mut keep) = (home, keep);
    for ((case, bytes), expected) in cases {
        std::fs::write(&file, &bytes).expect("write the record");
        // Only the record under test: the previous case's job goes.
        for entry in std::fs::read_dir(file.parent().expect("owner dir")).expect("dir") {
            let path = entry.expect("entry").path();
            if path != file && !path.ends_with("job-1.log") {
                std::fs::remove_file(&path).expect("remove");
            }
        }
        let daemon = TestDaemon::start_in(home, keep, false).await;
        let (mut client, _) = daemon.client().await;
        let listed = client.request(json!({"type": "list_jobs"})).await;
        assert_eq!(
            listed["payload"]["jobs"].as_array().map(Vec::len),
            Some(0),
            "{case}: the record was loaded: {listed}"
        );
        let next = client
            .request(json!({"type": "start_job", "agentId": agent, "command": "true", "cwd": daemon.cwd()}))
            .await;
        assert_eq!(next["payload"]["job"]["id"], expected, "{case}: {next}");
        let id = expected.to_string();
        eventually("the job to end", WAIT, async || {
            job(&mut client, &id).await["status"] == "exited"
        })
        .await;
        assert_eq!(
            std::fs::read(&file).expect("the record is still there"),
            bytes,
            "{case}: the record boot left alone was rewritten"
        );
        (home, keep) = daemon.stop().await;
    }
}
