//! Sign-in and failed starts, through the real daemon with the scripted agent requiring a
//! sign-in (`SCRIPTED_AGENT_AUTH=1`, as codex-acp does): a key in the provider's `env` signs
//! in without asking; without one the agent waits (attention `auth_required`, the methods
//! listed, its prompts kept) until `sign_in`; a start that fails backs off, says so once, and
//! starts again only by its backoff or on `restart_agent`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use drover_testkit::daemon::{Client, TestDaemon, find_where};
use drover_testkit::scripted_agent_bin;
use drover_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);
const KEY: &str = "k-123-secret";

/// A provider `locked` running the scripted agent that requires a sign-in, with `extra`
/// variables in its `env`.
fn locked_config(state: &Path, extra: &str) -> String {
    format!(
        "[providers.locked]\ncommand = [{bin:?}]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}, SCRIPTED_AGENT_AUTH = \"1\", SCRIPTED_AGENT_AUTH_KEY = \"{KEY}\"{extra} }}\n",
        bin = scripted_agent_bin().display().to_string(),
        state = state.display().to_string(),
    )
}

async fn daemon_with(config: String) -> (TestDaemon, Client) {
    let daemon = TestDaemon::start_fresh_with_config(config).await;
    let (client, _) = daemon.client().await;
    (daemon, client)
}

/// The agent's notices that say it did not start.
async fn start_notices(client: &mut Client, id: &str) -> Vec<String> {
    client
        .timeline(id)
        .await
        .iter()
        .filter(|i| i["kind"] == "notice")
        .filter_map(|i| i["data"]["text"].as_str())
        .filter(|t| t.starts_with("the agent did not start"))
        .map(str::to_string)
        .collect()
}

async fn wait_for_sign_in(client: &mut Client, id: &str) -> Value {
    eventually("the agent to wait for a sign-in", WAIT, async || {
        let agent = client.get_agent(id).await;
        (agent["attentionReason"] == "auth_required").then_some(agent)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_providers_env_signs_in_without_asking() {
    let state = TempDir::new().expect("state");
    let config = locked_config(state.path(), &format!(", SCRIPTED_KEY = \"{KEY}\""));
    let (daemon, mut client) = daemon_with(config).await;
    let id = client
        .create_agent(
            json!({"provider": "locked", "cwd": daemon.cwd(), "prompt": "say signed in by key"}),
        )
        .await;
    client.wait_idle(&id).await;
    assert_eq!(client.replies(&id).await, ["signed in by key"]);
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["status"], "idle", "{agent}");
    assert!(agent["startFailure"].is_null(), "{agent}");
    let providers = client.request(json!({"type": "list_providers"})).await;
    let locked = find_where(&providers["payload"]["providers"], "locked", |p| {
        p["name"] == "locked"
    });
    assert_eq!(locked["signIn"]["state"], "signed_in", "{locked}");
    assert!(
        !providers.to_string().contains(KEY),
        "the key is never shown: {providers}"
    );
}

/// A wrong key leaves the agent waiting, saying why; a variable the method does not take, or
/// an unknown method, is refused naming what it takes.
async fn wrong_sign_ins_are_refused(client: &mut Client, id: &str) {
    // A wrong key: still waiting, saying why.
    let wrong = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-key", "vars": {"SCRIPTED_KEY": "nope"}}))
        .await;
    assert_eq!(wrong["type"], "signed_in", "{wrong}");
    assert_eq!(wrong["payload"]["retried"], json!([id]));
    let agent = eventually("the wrong key to be refused", WAIT, async || {
        let agent = client.get_agent(id).await;
        agent["error"]
            .as_str()
            .is_some_and(|e| e.contains("signing in with `scripted-key` failed"))
            .then_some(agent)
    })
    .await;
    assert_eq!(agent["attentionReason"], "auth_required", "{agent}");

    // A variable the method does not take, or none of its own: refused, naming them.
    let bad = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-key", "vars": {"OTHER": "x"}}))
        .await;
    assert_eq!(bad["payload"]["code"], "invalid_input", "{bad}");
    assert!(bad.to_string().contains("SCRIPTED_KEY"), "{bad}");
    let unknown = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "magic"}))
        .await;
    assert_eq!(unknown["payload"]["code"], "invalid_input", "{unknown}");
    assert!(unknown.to_string().contains("scripted-login"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_way_to_sign_in_the_agent_waits_and_keeps_its_prompts_until_sign_in() {
    let state = TempDir::new().expect("state");
    let (daemon, mut client) = daemon_with(locked_config(state.path(), "")).await;
    let id = client
        .create_agent(json!({"provider": "locked", "cwd": daemon.cwd(), "prompt": "say first"}))
        .await;
    let agent = wait_for_sign_in(&mut client, &id).await;
    assert_eq!(agent["status"], "error", "{agent}");
    let error = agent["error"].as_str().expect("error");
    assert!(
        error.contains("locked needs a sign-in")
            && error.contains("Authentication required")
            && error.contains("drover login locked")
            && error.contains("SCRIPTED_KEY"),
        "the error says what the agent said and how to sign in: {error}"
    );
    let methods: Vec<(&str, &str)> = agent["startFailure"]["signIn"]
        .as_array()
        .expect("the methods")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap_or(""),
                m["type"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        methods,
        [
            ("scripted-key", "env_var"),
            ("scripted-login", "agent"),
            ("scripted-terminal", "terminal")
        ]
    );
    assert!(
        agent["runtime"]["retryAt"].is_null(),
        "a sign-in is never retried alone: {agent}"
    );

    // More messages and opening the agent start nothing: they are kept, shown as queued.
    client.send_message(&id, "say second").await;
    client.initialize_agent(&id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["runtime"]["state"], "cold", "{agent}");
    let queued: Vec<&str> = agent["queued"]
        .as_array()
        .expect("queued")
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(queued, ["say first", "say second"]);
    assert_eq!(start_notices(&mut client, &id).await.len(), 1, "said once");

    wrong_sign_ins_are_refused(&mut client, &id).await;

    // The right key: kept in config.toml (private), never shown, and both prompts run.
    let signed = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-key", "vars": {"SCRIPTED_KEY": KEY}}))
        .await;
    assert_eq!(signed["type"], "signed_in", "{signed}");
    eventually("both kept prompts to run", WAIT, async || {
        client.replies(&id).await == ["first", "second"]
    })
    .await;
    client.wait_idle(&id).await;
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["status"], "idle", "{agent}");
    assert!(agent["startFailure"].is_null(), "{agent}");
    assert!(agent["attentionReason"] != "auth_required", "{agent}");
    let config_path = daemon.home.join("config.toml");
    let config = std::fs::read_to_string(&config_path).expect("config.toml");
    assert!(
        config.contains(&format!("SCRIPTED_KEY = \"{KEY}\"")),
        "{config}"
    );
    assert!(
        config.contains("SCRIPTED_AGENT_STATE_DIR"),
        "the rest is kept: {config}"
    );
    let mode = std::fs::metadata(&config_path)
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "config.toml holds a key: private");
    let timeline = serde_json::to_string(&client.timeline(&id).await).expect("json");
    assert!(!timeline.contains(KEY), "the key is not in the timeline");
    assert!(!signed.to_string().contains(KEY));
    let log = std::fs::read_to_string(daemon.home.join("daemon.log")).unwrap_or_default();
    assert!(!log.contains(KEY), "the key is not in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_method_is_kept_as_the_providers_auth_and_used_by_the_next_start() {
    let state = TempDir::new().expect("state");
    let (daemon, mut client) = daemon_with(locked_config(state.path(), "")).await;
    let id = client
        .create_agent(json!({"provider": "locked", "cwd": daemon.cwd(), "prompt": "say via the agent's login"}))
        .await;
    wait_for_sign_in(&mut client, &id).await;
    let signed = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-login"}))
        .await;
    assert_eq!(signed["payload"]["retried"], json!([id]), "{signed}");
    eventually("the prompt to run", WAIT, async || {
        client.replies(&id).await == ["via the agent's login"]
    })
    .await;
    let config = std::fs::read_to_string(daemon.home.join("config.toml")).expect("config");
    assert!(config.contains("auth = \"scripted-login\""), "{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_backs_off_says_it_once_and_restarts_on_request() {
    let scratch = TempDir::new().expect("scratch");
    let starts = scratch.path().join("starts");
    let failing = format!(
        "[providers.broken]\ncommand = [\"/bin/sh\", \"-c\", \"date +%s.%N >> {}; echo cannot start >&2; exit 3\"]\n",
        starts.display()
    );
    let (daemon, mut client) = daemon_with(failing).await;
    let count = || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count());
    let id = client
        .create_agent(json!({"provider": "broken", "cwd": daemon.cwd(), "prompt": "say hello"}))
        .await;
    // The first start, then the backoff's tries after 1 s and 5 s more.
    let agent = eventually("the first failure", WAIT, async || {
        let agent = client.get_agent(&id).await;
        (agent["status"] == "error").then_some(agent)
    })
    .await;
    assert!(
        agent["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot start")),
        "the agent's own words: {agent}"
    );
    assert_eq!(agent["attentionReason"], "error");
    assert!(agent["startFailure"]["signIn"].is_null(), "{agent}");
    eventually("three starts (1 s and 5 s apart)", WAIT, async || {
        count() == 3
    })
    .await;
    eprintln!(
        "starts: {}",
        std::fs::read_to_string(&starts).unwrap_or_default()
    );
    // Then 30 s: nothing meanwhile, whatever the user does short of a retry. The third
    // start wrote its line before it failed: the next try is announced once it has.
    eventually("the next try announced", WAIT, async || {
        let agent = client.get_agent(&id).await;
        agent["runtime"]["retryAt"].is_string()
    })
    .await;
    client
        .request(json!({"type": "send_message", "agentId": id, "text": "say again"}))
        .await;
    client
        .request(json!({"type": "initialize_agent_request", "agentId": id}))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        count(),
        3,
        "a message or opening the agent does not restart it"
    );
    let notices = start_notices(&mut client, &id).await;
    assert_eq!(
        notices.len(),
        1,
        "the same failure is said once: {notices:#?}"
    );

    // The user fixes the provider and asks for a retry: the kept prompts run.
    let fixed = format!(
        "[providers.broken]\ncommand = [{:?}]\n",
        scripted_agent_bin().display().to_string()
    );
    std::fs::write(daemon.home.join("config.toml"), fixed).expect("config");
    let ok = client
        .request(json!({"type": "restart_agent", "agentId": id}))
        .await;
    assert_eq!(ok["type"], "ok", "{ok}");
    eventually("the kept prompts to run", WAIT, async || {
        client.replies(&id).await == ["hello", "again"]
    })
    .await;
    let agent = client.get_agent(&id).await;
    assert!(agent["startFailure"].is_null(), "{agent}");
    assert!(agent["runtime"]["retryAt"].is_null(), "{agent}");
    assert_eq!(count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_start_failed_waits_for_the_user_after_a_restart_of_the_daemon() {
    let state = TempDir::new().expect("state");
    let home = TempDir::new().expect("home");
    let path = home.path().to_path_buf();
    let daemon =
        TestDaemon::start_with_config(path.clone(), None, locked_config(state.path(), "")).await;
    let (mut client, _) = daemon.client().await;
    let cwd = TempDir::new().expect("cwd");
    let id = client
        .create_agent(json!({"provider": "locked", "cwd": cwd.path(), "prompt": "say kept"}))
        .await;
    wait_for_sign_in(&mut client, &id).await;
    drop(client);
    daemon.stop().await;

    let daemon =
        TestDaemon::start_with_config(path, Some(home), locked_config(state.path(), "")).await;
    let (mut client, _) = daemon.client().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["attentionReason"], "auth_required", "{agent}");
    assert_eq!(
        agent["runtime"]["state"], "cold",
        "not started at boot: {agent}"
    );
    assert_eq!(agent["queued"][0]["text"], "say kept", "{agent}");
    assert_eq!(start_notices(&mut client, &id).await.len(), 1);
    let providers = client.request(json!({"type": "list_providers"})).await;
    let locked = find_where(&providers["payload"]["providers"], "locked", |p| {
        p["name"] == "locked"
    });
    assert_eq!(locked["signIn"]["state"], "needs_sign_in", "{locked}");
    assert_eq!(
        locked["signIn"]["methods"].as_array().map(Vec::len),
        Some(3)
    );

    client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-login"}))
        .await;
    let ran =
        drover_testkit::wait::poll_until(WAIT, async || client.replies(&id).await == ["kept"])
            .await;
    let timeline = client.timeline(&id).await;
    let agent = client.get_agent(&id).await;
    assert!(
        ran.is_some(),
        "the kept prompt runs: {timeline:#?} {agent:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_an_agent_never_waits_for_its_start() {
    // An agent that takes a few seconds to start, as a real one on a cold machine.
    let slow = format!(
        "[providers.slow]\ncommand = [\"/bin/sh\", \"-c\", \"sleep 3; exec {}\"]\n",
        scripted_agent_bin().display()
    );
    let (daemon, mut client) = daemon_with(slow).await;
    let id = client
        .create_agent(json!({"provider": "slow", "cwd": daemon.cwd(), "prompt": "say late"}))
        .await;
    eventually("the start to begin", WAIT, async || {
        client.get_agent(&id).await["runtime"]["state"] == "starting"
    })
    .await;
    // Asked while the agent starts: answered now, with the prompt still queued (an answer
    // that waited for the start would show it delivered).
    let agent = client.get_agent(&id).await;
    assert_eq!(agent["runtime"]["state"], "starting", "{agent}");
    assert_eq!(agent["queued"][0]["text"], "say late", "{agent}");
    eventually("the prompt to run", WAIT, async || {
        client.replies(&id).await == ["late"]
    })
    .await;
    assert_eq!(client.get_agent(&id).await["queued"], json!([]));
}

/// The errors of a schedule's runs so far.
async fn run_errors(client: &mut Client, schedule: &str) -> Vec<String> {
    let answer = client.request(json!({"type": "list_schedules"})).await;
    answer["payload"]["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .filter(|s| s["id"] == schedule)
        .flat_map(|s| s["runs"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["error"].as_str().map(str::to_string))
        .collect()
}

async fn create_schedule(client: &mut Client, request: Value) -> String {
    let mut message = json!({"type": "create_schedule", "when": {"everySeconds": 1}});
    for (k, v) in request.as_object().expect("object") {
        message[k] = v.clone();
    }
    let answer = client.request(message).await;
    assert_eq!(answer["type"], "schedule", "{answer}");
    answer["payload"]["schedule"]["id"]
        .as_str()
        .expect("id")
        .to_string()
}

/// The agents a schedule made.
async fn made_by(client: &mut Client, schedule: &str) -> Vec<String> {
    client
        .agents(false)
        .await
        .iter()
        .filter(|a| a["labels"]["drover.schedule"] == schedule)
        .filter_map(|a| a["id"].as_str().map(str::to_string))
        .collect()
}

// A schedule that fires every second into an agent waiting for a sign-in leaves one run
// waiting, not one per second; one that makes agents makes one that waits, not one per second.
// Signing in then plays what waited, once: nobody finds a pile of stale runs played at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_leave_one_run_waiting_for_a_sign_in_not_a_pile() {
    let state = TempDir::new().expect("state");
    let (daemon, mut client) = daemon_with(locked_config(state.path(), "")).await;
    let id = client
        .create_agent(json!({"provider": "locked", "cwd": daemon.cwd(), "prompt": "say first"}))
        .await;
    wait_for_sign_in(&mut client, &id).await;
    let into = create_schedule(
        &mut client,
        json!({"agentId": id, "prompt": "say scheduled"}),
    )
    .await;
    let making = create_schedule(
        &mut client,
        json!({"newAgent": {"provider": "locked", "cwd": daemon.cwd()}, "prompt": "say made"}),
    )
    .await;

    for schedule in [&into, &making] {
        let errors = eventually("a run refused behind the waiting one", WAIT, async || {
            let errors = run_errors(&mut client, schedule).await;
            (!errors.is_empty()).then_some(errors)
        })
        .await;
        assert!(
            errors[0].contains("waits for a sign-in to locked")
                && errors[0].contains("drover login locked")
                && errors[0].contains("an earlier run of this schedule"),
            "{errors:?}"
        );
    }
    let made = made_by(&mut client, &making).await;
    // Three more seconds of runs change nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let agent = client.get_agent(&id).await;
    let queued: Vec<&str> = agent["queued"]
        .as_array()
        .expect("queued")
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(queued, ["say first", "say scheduled"], "{agent}");
    assert_eq!(made_by(&mut client, &making).await, made, "no agent more");
    assert!(run_errors(&mut client, &into).await.len() >= 3);

    for schedule in [&into, &making] {
        let deleted = client
            .request(json!({"type": "delete_schedule", "scheduleId": schedule}))
            .await;
        assert_eq!(deleted["type"], "schedule_deleted", "{deleted}");
    }
    let signed = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-key", "vars": {"SCRIPTED_KEY": KEY}}))
        .await;
    assert_eq!(signed["type"], "signed_in", "{signed}");
    eventually("what waited to run, once", WAIT, async || {
        client.replies(&id).await == ["first", "scheduled"]
    })
    .await;
    for agent in &made {
        eventually("the made agent's run", WAIT, async || {
            client.replies(agent).await == ["made"]
        })
        .await;
    }
}

// Before any agent of a provider started, the daemon has seen none of its sign-in methods: it
// asks the provider's agent, and keeps only a method it offers, with that method's variables.
// A provider whose agent offers none is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_before_any_start_is_checked_against_what_the_agent_offers() {
    let state = TempDir::new().expect("state");
    let open = format!(
        "[providers.open]\ncommand = [{:?}]\n",
        scripted_agent_bin().display().to_string()
    );
    let config = format!("{}{open}", locked_config(state.path(), ""));
    let (daemon, mut client) = daemon_with(config).await;
    let config_path = daemon.home.join("config.toml");
    let before = std::fs::read_to_string(&config_path).expect("config");
    let refused = [
        (json!({"methodId": "magic"}), "scripted-login"),
        (
            json!({"methodId": "scripted-key", "vars": {"SCRIPTED_KEY": KEY, "LD_PRELOAD": "/tmp/x.so"}}),
            "LD_PRELOAD",
        ),
        (
            json!({"methodId": "scripted-key", "vars": {}}),
            "SCRIPTED_KEY",
        ),
        (
            json!({"methodId": "scripted-login", "vars": {"NODE_OPTIONS": "--require /tmp/x.js"}}),
            "takes no variables",
        ),
    ];
    for (asked, named) in refused {
        let mut request = json!({"type": "sign_in", "provider": "locked"});
        for (k, v) in asked.as_object().expect("object") {
            request[k] = v.clone();
        }
        let answer = client.request(request).await;
        assert_eq!(
            answer["payload"]["code"], "invalid_input",
            "{asked}: {answer}"
        );
        assert!(answer.to_string().contains(named), "{asked}: {answer}");
    }
    assert_eq!(
        std::fs::read_to_string(&config_path).expect("config"),
        before,
        "nothing refused is kept"
    );
    let none = client
        .request(json!({"type": "sign_in", "provider": "open", "methodId": "anything"}))
        .await;
    assert_eq!(none["payload"]["code"], "invalid_input", "{none}");
    assert!(
        none.to_string().contains("offers no sign-in method"),
        "{none}"
    );

    // What it offers is kept.
    let signed = client
        .request(json!({"type": "sign_in", "provider": "locked", "methodId": "scripted-key", "vars": {"SCRIPTED_KEY": KEY}}))
        .await;
    assert_eq!(signed["type"], "signed_in", "{signed}");
    let config = std::fs::read_to_string(&config_path).expect("config");
    assert!(
        config.contains(&format!("SCRIPTED_KEY = \"{KEY}\"")),
        "{config}"
    );
    // The agent asked ended with its answer.
    let dir = state.path().display().to_string();
    eventually("the agent asked to end", WAIT, async || {
        !drover_fakes::procs::live()
            .iter()
            .any(|p| p.has_env("SCRIPTED_AGENT_STATE_DIR", &dir))
    })
    .await;
}

// A client that leaves while the daemon asks a provider's agent for its sign-in methods takes
// that agent with it: the request is dropped, and the agent it started (one that never
// answers `initialize`) is ended at once, not left running for the daemon's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_asked_for_a_sign_in_ends_when_its_client_leaves() {
    let mark = TempDir::new().expect("mark");
    let mark = mark.path().display().to_string();
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep");
    let config = format!(
        "[providers.mute]\ncommand = [{sleep:?}, \"1000\"]\nenv = {{ DROVER_TEST_MARK = {mark:?} }}\n"
    );
    let (daemon, mut client) = daemon_with(config).await;
    let asked = || {
        drover_fakes::procs::live()
            .into_iter()
            .filter(|p| p.has_env("DROVER_TEST_MARK", &mark))
            .count()
    };
    client
        .send(json!({"type": "sign_in", "requestId": "s1", "provider": "mute", "methodId": "any"}))
        .await;
    eventually("the agent asked to start", WAIT, async || {
        (asked() > 0).then_some(())
    })
    .await;
    drop(client);
    let left = std::time::Instant::now();
    eventually("the agent asked to end", WAIT, async || {
        (asked() == 0).then_some(())
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "ended with its client, not by a timeout: {:?}",
        left.elapsed()
    );
    // The daemon still answers.
    let (mut client, _) = daemon.client().await;
    let providers = client.request(json!({"type": "list_providers"})).await;
    assert_eq!(providers["type"], "providers", "{providers}");
}

// What a provider's agent offered when started only to ask is known from then on, "none"
// too: it shows in the providers' list, and a second sign-in does not start the agent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_agent_asked_alone_offers_is_known_from_then_on() {
    let state = TempDir::new().expect("state");
    let starts = TempDir::new().expect("starts");
    // Each start of the agent leaves a line in its provider's file.
    let counted = |name: &str, env: &str| {
        let file = starts.path().join(name).display().to_string();
        format!(
            "[providers.{name}]\ncommand = [\"/bin/sh\", \"-c\", \"echo start >> '{file}'; exec '{bin}'\"]\nenv = {{ SCRIPTED_AGENT_STATE_DIR = {state:?}{env} }}\n",
            bin = scripted_agent_bin().display(),
            state = state.path().display().to_string(),
        )
    };
    let config = format!(
        "{}{}",
        counted("locked", ", SCRIPTED_AGENT_AUTH = \"1\""),
        counted("open", "")
    );
    let (_daemon, mut client) = daemon_with(config).await;
    let started = |name: &str| {
        std::fs::read_to_string(starts.path().join(name))
            .unwrap_or_default()
            .lines()
            .count()
    };
    for _ in 0..2 {
        let wrong = client
            .request(json!({"type": "sign_in", "provider": "locked", "methodId": "magic"}))
            .await;
        assert_eq!(wrong["payload"]["code"], "invalid_input", "{wrong}");
        assert!(wrong.to_string().contains("scripted-login"), "{wrong}");
        let none = client
            .request(json!({"type": "sign_in", "provider": "open", "methodId": "any"}))
            .await;
        assert!(
            none.to_string().contains("offers no sign-in method"),
            "{none}"
        );
    }
    assert_eq!(
        (started("locked"), started("open")),
        (1, 1),
        "each agent asked once"
    );
    let providers = client.request(json!({"type": "list_providers"})).await;
    let locked = find_where(&providers["payload"]["providers"], "locked", |p| {
        p["name"] == "locked"
    });
    let ids: Vec<&str> = locked["signIn"]["methods"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        ids,
        ["scripted-key", "scripted-login", "scripted-terminal"],
        "{locked}"
    );
}
