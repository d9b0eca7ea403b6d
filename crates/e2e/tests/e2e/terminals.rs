//! ACP client terminals through the real daemon: drover advertises `terminal: true`, and the
//! scripted agent opens terminals (`terminal/create`, `output`, `wait_for_exit`, `kill`,
//! `release`) that drover runs as jobs of the agent. Their exit status and output (cut from the
//! start at `outputByteLimit`, on a character boundary), kill and release, errors that name the
//! terminal, the listing with `terminal: true` and no exit notice, archive admission, and the
//! end of the runtime that opened them (a crash, an archive) killing what still runs, which
//! never hibernates while one runs.

use std::path::Path;
use std::time::Duration;

use drover_fakes::procs;
use drover_testkit::daemon::{Client, TestDaemon};
use drover_testkit::wait::eventually;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Creates a scripted agent with `prompt`; returns its id.
async fn create(client: &mut Client, daemon: &TestDaemon, prompt: &str, title: &str) -> String {
    client
        .create_scripted(&daemon.cwd(), json!({"prompt": prompt, "title": title}))
        .await
}

/// Every job `list_jobs` shows, by id.
async fn jobs(client: &mut Client) -> Vec<Value> {
    let listed = client.request(json!({"type": "list_jobs"})).await;
    assert_eq!(listed["type"], "jobs", "{listed}");
    listed["payload"]["jobs"].as_array().expect("jobs").clone()
}

/// The job `id` as `list_jobs` shows it.
async fn job(client: &mut Client, id: &str) -> Value {
    let listed = jobs(client).await;
    listed
        .iter()
        .find(|j| j["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("job {id} not listed: {listed:?}"))
}

/// Waits for job `id` to have ended; returns its record.
async fn ended(client: &mut Client, id: &str) -> Value {
    eventually(format!("job {id} to end"), WAIT, async || {
        let j = job(client, id).await;
        (j["status"] != "running").then_some(j)
    })
    .await
}

/// Writes a shell script (run as `sh <path>`: never executed from a file just written, which
/// another thread's fork could still hold open for writing).
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).expect("write script");
    path.display().to_string()
}

/// No process is left in group `pgid`: `kill(-pgid, 0)` (the shell's `kill -0`, this crate
/// having no unsafe code) finds none, nor does `/proc`.
fn group_gone(pgid: i32) -> bool {
    let signalled = std::process::Command::new("sh")
        .args(["-c", &format!("kill -0 -- -{pgid} 2>/dev/null")])
        .status()
        .expect("run sh");
    !signalled.success() && procs::group_gone(pgid)
}

fn pid_of(job: &Value) -> i32 {
    i32::try_from(job["pid"].as_u64().expect("pid")).expect("pid")
}

/// What the agent said in its turns after the first, one answer per terminal directive (the
/// chunks of a turn join into one message; each answer starts `terminal `).
async fn answers(client: &mut Client, agent: &str) -> Vec<String> {
    let replies = client.replies(agent).await;
    let text = replies[1..].concat();
    text.split("terminal job-")
        .filter(|s| !s.is_empty())
        .flat_map(|s| {
            // A create that failed says `terminal error: …` after the previous answer.
            let (answer, failed) = s.split_once("terminal error: ").unwrap_or((s, ""));
            let failed = (!failed.is_empty()).then(|| format!("terminal error: {failed}"));
            std::iter::once(format!("terminal job-{answer}")).chain(failed)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_answer_exit_status_output_truncation_and_errors_naming_the_terminal() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let scripts = tempfile::tempdir().expect("tempdir");
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    // A job of the agent that is not a terminal: no terminal of its session.
    let plain = client
        .request(json!({"type": "start_job", "agentId": agent, "command": "exec sleep 1000", "notifyOnExit": false}))
        .await;
    assert_eq!(plain["payload"]["job"]["id"], "job-1", "{plain}");

    let exits = script(
        scripts.path(),
        "exits.sh",
        "echo \"out $SCRIPTED_TERMINAL $(pwd)\"\necho err >&2\nexit 3\n",
    );
    let prompt = [
        format!("terminal sh {exits}"),
        // 11 bytes, `€` being 3: the last 7 start inside a `€`, which is dropped.
        "terminal-limit 7 printf ab€€€".to_string(),
        "terminal-limit 100 printf ab€€€".to_string(),
        "terminal-output job-999".to_string(),
        "terminal-output job-1".to_string(),
        "terminal no-such-program-for-drover".to_string(),
    ]
    .join("\n");
    client.send_message(&agent, &prompt).await;
    client.wait_idle(&agent).await;
    let said = answers(&mut client, &agent).await;
    assert_eq!(said.len(), 6, "{said:#?}");
    let cwd = daemon.cwd().display().to_string();
    assert_eq!(
        said[0],
        format!(
            "terminal job-2 exit 3 signal null truncated false output {:?}",
            format!("out 1 {cwd}\nerr\n")
        ),
        "exit code, output (stdout and stderr), the env asked for, the agent's cwd"
    );
    assert_eq!(
        said[1], "terminal job-3 exit 0 signal null truncated true output \"€€\"",
        "cut from the start at a character boundary"
    );
    assert_eq!(
        said[2],
        "terminal job-4 exit 0 signal null truncated false output \"ab€€€\""
    );
    assert!(
        said[3].starts_with("terminal job-999 output error: ")
            && said[3].contains("no terminal `job-999`"),
        "{}",
        said[3]
    );
    assert!(
        said[4].starts_with("terminal job-1 output error: ")
            && said[4].contains("no terminal `job-1`"),
        "a job that is not a terminal of this session is none: {}",
        said[4]
    );
    assert!(
        said[5].starts_with("terminal error: ")
            && said[5].contains("could not start `no-such-program-for-drover`"),
        "a program that cannot start is an error naming it: {}",
        said[5]
    );
    let exited = job(&mut client, "job-2").await;
    assert_eq!(exited["status"], "exited", "{exited}");
    assert_eq!(exited["exitCode"], 3, "{exited}");
    assert_eq!(exited["terminal"], true, "{exited}");
    assert_eq!(
        exited["command"],
        format!("sh {exits}"),
        "no shell around it: {exited}"
    );
    assert_eq!(job(&mut client, "job-1").await["terminal"], false);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_kill_and_release_whole_groups_are_listed_as_jobs_and_never_notify() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let scripts = tempfile::tempdir().expect("tempdir");
    let agent = create(&mut client, &daemon, "say ready", "owner").await;
    client.wait_idle(&agent).await;
    let sleeper = script(
        scripts.path(),
        "sleeper.sh",
        "sleep 1000 & echo pid=$!\nwait\n",
    );
    let prompt = format!(
        "terminal-kill sleep 1000\nterminal-release sh {sleeper}\nterminal-limit 10 printf done"
    );
    client.send_message(&agent, &prompt).await;
    client.wait_idle(&agent).await;
    let said = answers(&mut client, &agent).await;
    assert_eq!(
        said[0], "terminal job-1 exit null signal \"SIGTERM\" truncated false output \"\"",
        "a kill says the signal"
    );
    assert!(
        said[1].starts_with("terminal job-2 released; output: ")
            && said[1].contains("no terminal `job-2`"),
        "a released terminal is unknown: {}",
        said[1]
    );
    assert_eq!(
        said[2..],
        ["terminal job-3 exit 0 signal null truncated false output \"done\""]
    );

    // Listed as jobs of the agent, marked as terminals.
    let listed = jobs(&mut client).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    for t in &listed {
        assert_eq!(t["agentId"], agent.as_str(), "{t}");
        assert_eq!(t["terminal"], true, "{t}");
        assert_eq!(t["startedBy"], "terminal", "{t}");
        assert_eq!(t["notifyOnExit"], false, "{t}");
    }
    let killed = job(&mut client, "job-1").await;
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(killed["killedBy"], "request", "{killed}");
    assert_eq!(killed["signal"], 15, "{killed}");
    // Release killed the whole group of a terminal still running.
    let released = ended(&mut client, "job-2").await;
    assert_eq!(released["status"], "killed", "{released}");
    assert_eq!(released["killedBy"], "request", "{released}");
    let pgid = pid_of(&released);
    eventually("the released terminal's group to end", WAIT, async || {
        group_gone(pgid)
    })
    .await;

    // No terminal queued an exit notice. A notifying job started after they all ended is the
    // barrier: once its notice is in, any of theirs would be too.
    let notifying = client
        .request(json!({"type": "start_job", "agentId": agent, "command": "echo barrier"}))
        .await;
    assert_eq!(notifying["payload"]["job"]["id"], "job-4", "{notifying}");
    eventually("the barrier job's notice", WAIT, async || {
        client
            .timeline(&agent)
            .await
            .iter()
            .any(|i| i["kind"] == "user_message" && i["data"]["source"] == "job:job-4")
    })
    .await;
    client.wait_idle(&agent).await;
    let sources: Vec<String> = client
        .timeline(&agent)
        .await
        .iter()
        .filter(|i| i["kind"] == "user_message")
        .filter_map(|i| i["data"]["source"].as_str().map(str::to_string))
        .filter(|s| s.starts_with("job:"))
        .collect();
    assert_eq!(sources, ["job:job-4"], "only the plain job notified");
    assert_eq!(
        client.turn_events(&agent).await,
        ["turn_completed", "turn_completed", "turn_completed"]
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_block_a_plain_archive_and_end_with_the_runtime_that_opened_them() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let scripts = tempfile::tempdir().expect("tempdir");
    let sleeper = script(
        scripts.path(),
        "sleeper.sh",
        "sleep 1000 & echo pid=$!\nwait\n",
    );

    // A terminal outlives the turn that opened it, as `job` activity of its agent.
    let agent = create(
        &mut client,
        &daemon,
        &format!("terminal-start sh {sleeper}"),
        "crashes",
    )
    .await;
    client.wait_idle(&agent).await;
    assert_eq!(client.replies(&agent).await, ["terminal job-1 started"]);
    let running = job(&mut client, "job-1").await;
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["terminal"], true, "{running}");
    let first = pid_of(&running);
    let refused = client
        .request(json!({"type": "archive", "agentId": agent}))
        .await;
    assert_eq!(refused["payload"]["code"], "agent_active", "{refused}");
    let families = &refused["payload"]["details"]["families"];
    assert_eq!(families["job"][0]["id"], "job-1", "{refused}");
    assert_eq!(
        families
            .as_object()
            .map(|f| f.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["job".to_string()]),
        "the terminal is the only activity: {refused}"
    );

    // The agent's process crashing ends its terminals, whole groups.
    client.send_message(&agent, "crash 5").await;
    let crashed = ended(&mut client, "job-1").await;
    assert_eq!(crashed["status"], "killed", "{crashed}");
    assert_eq!(crashed["killedBy"], "runtime_ended", "{crashed}");
    eventually(
        "the crashed runtime's terminal group to end",
        WAIT,
        async || group_gone(first),
    )
    .await;
    // The next runtime does not know the old one's terminal.
    client.send_message(&agent, "terminal-output job-1").await;
    let said = eventually("the restarted agent's answer", WAIT, async || {
        client
            .replies(&agent)
            .await
            .into_iter()
            .find(|r| r.starts_with("terminal job-1 output"))
    })
    .await;
    assert!(
        said.contains("error") && said.contains("no terminal `job-1`"),
        "{said}"
    );

    // An archive with stopActivity ends the terminals of the runtime it closes.
    let other = create(
        &mut client,
        &daemon,
        &format!("terminal-start sh {sleeper}"),
        "archived",
    )
    .await;
    client.wait_idle(&other).await;
    assert_eq!(client.replies(&other).await, ["terminal job-2 started"]);
    let second = pid_of(&job(&mut client, "job-2").await);
    let archived = client
        .request(json!({"type": "archive", "agentId": other, "stopActivity": true}))
        .await;
    assert_eq!(archived["type"], "archived", "{archived}");
    let stopped = ended(&mut client, "job-2").await;
    assert_eq!(stopped["status"], "killed", "{stopped}");
    // The archive's stop of the job and the runtime's close race: either names the cause.
    assert!(
        ["archive", "runtime_ended"].contains(&stopped["killedBy"].as_str().unwrap_or_default()),
        "{stopped}"
    );
    eventually(
        "the archived runtime's terminal group to end",
        WAIT,
        async || group_gone(second),
    )
    .await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_keep_their_runtime_from_hibernating_until_they_end() {
    let state = tempfile::tempdir().expect("agent state");
    let home = tempfile::tempdir().expect("home");
    let config = format!(
        "{}\n[runtimes]\nidle_timeout = \"1s\"\n",
        drover_testkit::scripted_config(&drover_testkit::scripted_agent_bin(), state.path())
    );
    let daemon = TestDaemon::start_with_config(home.path().to_path_buf(), Some(home), config).await;
    let (mut client, _) = daemon.client().await;
    let agent = create(&mut client, &daemon, "terminal-start sleep 1000", "keeps").await;
    client.wait_idle(&agent).await;
    // Idle as a client sees it (no turn), but its runtime is not: hibernating would kill the
    // terminal, which belongs to its ACP session. No deadline, so no hibernation.
    let got = client
        .request(json!({"type": "get_agent", "agentId": agent}))
        .await;
    let runtime = &got["payload"]["agent"]["runtime"];
    assert_eq!(runtime["state"], "live", "{got}");
    assert_eq!(runtime["hibernateAt"], Value::Null, "{got}");

    // Once the terminal ends, the idle clock runs and the runtime hibernates.
    client.clear_backlog();
    let killed = client
        .request(json!({"type": "kill_job", "jobId": "job-1"}))
        .await;
    assert_eq!(killed["payload"]["job"]["killedBy"], "request", "{killed}");
    let cold = client
        .recv_where(|m| {
            m["type"] == "agent_status"
                && m["payload"]["agent"]["id"] == agent.as_str()
                && m["payload"]["agent"]["runtime"]["state"] == "cold"
        })
        .await;
    assert_eq!(cold["payload"]["agent"]["status"], "idle", "{cold}");
    daemon.stop().await;
}
