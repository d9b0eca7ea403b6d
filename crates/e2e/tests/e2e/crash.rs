//! Crash consistency: `drover-crashdriver` mutates a registry and is killed with SIGKILL at a
//! random moment, over and over on the same data directory. After every kill the files must
//! parse, the registry must open without quarantining anything, and every agent must be as
//! its last acknowledged mutation left it, or as the one mutation in flight would leave it
//! (all of it or none of it, for an archive cascade too). The sign-ins it keeps in
//! `config.toml` are held to the same rule.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use drover_core::{AgentId, NoRuntimes, Registry};
use drover_testkit::KillOnDrop as Driver;
use drover_testkit::crash::{Ack, AgentState, Begin, Failed, Op, XorShift};

/// Kills per run, all on the same data directory; `DROVER_CRASH_ROUNDS` overrides it.
const ROUNDS: usize = 25;
/// Kill no earlier than this many acks into a round, so every round changes something.
const MIN_ACKS: (u64, u64) = (2, 8);
/// Kill after a random delay in this range (ms) once the acks are in.
const KILL_AFTER_MS: (u64, u64) = (30, 300);
/// A round that takes longer than this means the driver hangs or never acks.
const ROUND_TIMEOUT: Duration = Duration::from_secs(15);

/// One line of the driver's stdout; `complete` is false for a last line cut by the kill.
struct Line {
    text: String,
    complete: bool,
}

#[derive(Default)]
struct Summary {
    rounds: usize,
    acks: usize,
    errs: usize,
    agents_checked: usize,
    in_flight: usize,
    in_flight_applied: usize,
    cascades_in_flight: usize,
    cascades_applied: usize,
    cascades_finished_by_boot: usize,
    temp_files_left: usize,
    /// Acknowledged ops by kind.
    kinds: BTreeMap<String, usize>,
    sign_ins_in_flight: usize,
}

// One story: rounds of run, kill and reboot, each checked against what was acknowledged.
#[expect(clippy::too_many_lines)]
#[test]
fn sigkill_never_loses_or_tears_an_acknowledged_mutation() {
    let started = Instant::now();
    // Any 64 bits of the clock make a seed, so the cast may drop the high ones.
    #[expect(clippy::cast_possible_truncation)]
    let seed = std::env::var("DROVER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    // The seed fixes the drivers' seeds and the kill delays; where a kill lands still varies.
    println!("crash test seed {seed} (DROVER_CRASH_SEED={seed} repeats the seeds and delays)");
    let mut rng = XorShift::new(seed);
    let home = tempfile::TempDir::new().expect("home");
    let cwd = tempfile::TempDir::new().expect("cwd");
    let logs = tempfile::TempDir::new().expect("logs");

    // The state every agent is known to have: from the last verified reopen, plus acks.
    let mut known: BTreeMap<AgentId, AgentState> = BTreeMap::new();
    // The sign-ins kept in config.toml: variable → value, as last acknowledged.
    let mut sign_ins: BTreeMap<String, String> = BTreeMap::new();
    let mut summary = Summary::default();

    let rounds = std::env::var("DROVER_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS);
    for round in 0..rounds {
        let driver_seed = rng.next_u64();
        let stderr_path = logs.path().join(format!("round-{round}.stderr"));
        let lines = run_until_killed(home.path(), cwd.path(), driver_seed, &stderr_path, &mut rng);
        let context = format!("round {round} (driver seed {driver_seed})");

        // Replay the protocol: what was acknowledged, and what was in flight at the kill.
        let mut in_flight: Option<Begin> = None;
        for line in &lines {
            if !line.complete {
                // Cut by the kill: a begin not fully printed had not started; an ack not
                // fully printed leaves its op in flight, which it still is.
                continue;
            }
            let (tag, json) = line.text.split_once(' ').unwrap_or((&line.text, ""));
            match tag {
                "boot" => {}
                "begin" => {
                    assert!(
                        in_flight.is_none(),
                        "{context}: two ops in flight: {in_flight:?} and {json}"
                    );
                    in_flight = Some(serde_json::from_str(json).expect("begin line"));
                }
                "ack" => {
                    let ack: Ack = serde_json::from_str(json).expect("ack line");
                    let begin = in_flight.take().expect("an ack without a begin");
                    assert_eq!(ack.seq, begin.seq, "{context}: ack of another op");
                    let kind = serde_json::to_value(&begin.op).expect("an op")["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    *summary.kinds.entry(kind).or_default() += 1;
                    if let Op::SignIn { var, value } = &begin.op {
                        sign_ins.insert(var.clone(), value.clone());
                    }
                    for agent in ack.agents {
                        let id = agent.id.expect("acked agents have ids");
                        known.insert(id, agent);
                    }
                    summary.acks += 1;
                }
                "err" => {
                    let err: Failed = serde_json::from_str(json).expect("err line");
                    let begin = in_flight.take().expect("an err without a begin");
                    assert_eq!(err.seq, begin.seq, "{context}: err of another op");
                    assert!(!begin.ok, "{context}: {begin:?} failed: {}", err.error);
                    summary.errs += 1;
                }
                _ => panic!(
                    "{context}: the driver said {:?}\nstderr: {}",
                    line.text,
                    fs::read_to_string(&stderr_path).unwrap_or_default()
                ),
            }
        }

        // (1) Every record on disk is whole JSON, whatever the kill interrupted.
        let mut temps = 0;
        for dir in ["agents", "workspaces", "journal"] {
            for path in files_under(&home.path().join(dir)) {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if name.starts_with('.') && name.contains(".tmp-") {
                    temps += 1;
                    continue;
                }
                let bytes = fs::read(&path).expect("read record");
                if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                    panic!(
                        "{context}: {} is not JSON after the kill: {e}",
                        path.display()
                    );
                }
            }
        }
        summary.temp_files_left += temps;

        // (2) It opens, and nothing needed quarantine.
        let (registry, boot) =
            Registry::open(home.path(), Arc::new(NoRuntimes)).expect("reopen after the kill");
        assert!(
            boot.quarantined.is_empty(),
            "{context}: quarantined {:?}",
            boot.quarantined
        );
        assert!(boot.skipped_newer.is_empty(), "{context}");
        assert_eq!(
            boot.workspaces_restored, 0,
            "{context}: a workspace was lost"
        );
        assert!(boot.cascades_completed <= 1, "{context}: {boot:?}");
        if boot.cascades_completed == 1 {
            assert!(
                matches!(
                    in_flight,
                    Some(Begin {
                        op: Op::Archive { .. },
                        ..
                    })
                ),
                "{context}: boot finished a cascade, but none was in flight: {in_flight:?}"
            );
            summary.cascades_finished_by_boot += 1;
        }
        assert!(
            files_under(&home.path().join("journal")).is_empty(),
            "{context}: a journal is left after boot"
        );

        // (3) Each agent is as last acknowledged, or as the op in flight makes it.
        let on_disk: BTreeMap<AgentId, AgentState> = registry
            .agents()
            .iter()
            .map(|a| (a.id, AgentState::of(a)))
            .collect();
        for id in known.keys() {
            assert!(
                on_disk.contains_key(id),
                "{context}: acknowledged agent {id} is gone"
            );
        }
        let expected_new: HashMap<Option<AgentId>, &AgentState> = in_flight
            .iter()
            .flat_map(|b| b.expect.iter())
            .map(|s| (s.id, s))
            .collect();
        let mut as_old = 0;
        let mut as_new = 0;
        let mut touched = 0;
        for (id, actual) in &on_disk {
            summary.agents_checked += 1;
            // (4) Nothing is left running.
            assert!(
                !actual.status.is_busy(),
                "{context}: {id} is {} after boot",
                actual.status
            );
            if let Some(old) = known.get(id) {
                let old = old.after_restart();
                let new = expected_new.get(&Some(*id)).map(|s| s.after_restart());
                let (is_old, is_new) = (*actual == old, new.as_ref() == Some(actual));
                assert!(
                    is_old || is_new,
                    "{context}: agent {id} is {actual:?}\n  last acked: {old:?}\n  \
                     in flight: {in_flight:?}"
                );
                if new.is_some() {
                    touched += 1;
                    as_old += usize::from(is_old);
                    as_new += usize::from(is_new);
                }
            } else {
                // Only the create in flight may have made an agent nobody acked.
                let begin = in_flight.as_ref().unwrap_or_else(|| {
                    panic!("{context}: unknown agent {id} ({actual:?}), nothing in flight")
                });
                let created = expected_new
                    .get(&None)
                    .filter(|_| matches!(begin.op, Op::Create { .. }))
                    .unwrap_or_else(|| {
                        panic!("{context}: unknown agent {id} ({actual:?}); in flight: {begin:?}")
                    });
                let mut want = created.after_restart();
                want.id = Some(*id);
                assert_eq!(*actual, want, "{context}: the agent of {begin:?}");
                assert_eq!(touched, 0, "{context}: two agents from one create");
                touched += 1;
                as_new += 1;
            }
        }
        if let Some(begin) = &in_flight {
            summary.in_flight += 1;
            let applied = touched > 0 && as_new == touched;
            let creates = matches!(begin.op, Op::Create { .. });
            // All or nothing: the op's agents are all as before, or all as after.
            assert!(
                as_old == touched || as_new == touched || (creates && touched == 0),
                "{context}: {begin:?} was applied to {as_new} of its {touched} agents"
            );
            summary.in_flight_applied += usize::from(applied);
            if matches!(begin.op, Op::Archive { .. }) && begin.expect.len() > 1 {
                summary.cascades_in_flight += 1;
                summary.cascades_applied += usize::from(applied);
            }
        }
        let temps: Vec<PathBuf> = files_under(home.path())
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(
            temps.is_empty(),
            "{context}: temp files survived boot: {temps:?}"
        );

        // (5) config.toml reads, and holds each sign-in as last acknowledged, or as the one in
        // flight left it.
        let flight = match &in_flight {
            Some(Begin {
                op: Op::SignIn { var, value },
                ..
            }) => Some((var.clone(), value.clone())),
            _ => None,
        };
        let line = |var: &str, value: &str| format!("{var} = \"{value}\"");
        match fs::read_to_string(home.path().join("config.toml")) {
            Ok(text) => {
                if let Err(e) = drover_acp::providers::Providers::load(home.path()) {
                    panic!("{context}: config.toml does not load after the kill: {e}\n{text}");
                }
                for (var, value) in &sign_ins {
                    let new = flight.as_ref().filter(|(v, _)| v == var);
                    assert!(
                        text.contains(&line(var, value))
                            || new.is_some_and(|(v, n)| text.contains(&line(v, n))),
                        "{context}: the sign-in {var} = {value} is lost (in flight: {flight:?}):\n{text}"
                    );
                }
                if let Some((var, value)) = &flight
                    && text.contains(&line(var, value))
                {
                    sign_ins.insert(var.clone(), value.clone());
                }
                summary.sign_ins_in_flight += usize::from(flight.is_some());
            }
            Err(_) => assert!(
                sign_ins.is_empty(),
                "{context}: config.toml is gone, with sign-ins acknowledged: {sign_ins:?}"
            ),
        }

        // What boot made of it (busy agents now idle) is the starting point of the next round.
        known = on_disk;
        drop(registry);
        summary.rounds += 1;
    }

    println!(
        "crash test: {} rounds in {:.1?}: {} acks and {} refusals verified, {} agent states \
         checked, {} agents at the end; {} kills with an op in flight ({} applied); {} \
         cascades in flight ({} applied, {} finished by boot from the journal); {} temp files \
         of interrupted writes cleaned up; {} kills in a sign-in; acks by kind: {:?}",
        summary.rounds,
        started.elapsed(),
        summary.acks,
        summary.errs,
        summary.agents_checked,
        known.len(),
        summary.in_flight,
        summary.in_flight_applied,
        summary.cascades_in_flight,
        summary.cascades_applied,
        summary.cascades_finished_by_boot,
        summary.temp_files_left,
        summary.sign_ins_in_flight,
        summary.kinds,
    );
    // Every kind of write the driver makes was acknowledged and held to it.
    for kind in [
        "create",
        "set_status",
        "set_title",
        "archive",
        "set_budget",
        "add_spend",
        "labels",
        "upstream_budgets",
        "limited",
        "clear_limited",
        "start_failure",
        "sign_in",
    ] {
        assert!(
            summary.kinds.contains_key(kind),
            "no `{kind}` was acknowledged: {:?}",
            summary.kinds
        );
    }
    assert!(summary.acks >= rounds * usize::try_from(MIN_ACKS.0).expect("a small constant"));
}

/// Starts the driver, lets it run past a few acks and a random delay, SIGKILLs it, and returns
/// everything it printed.
fn run_until_killed(
    home: &Path,
    cwd: &Path,
    seed: u64,
    stderr_path: &Path,
    rng: &mut XorShift,
) -> Vec<Line> {
    let min_acks = rng.range(MIN_ACKS.0, MIN_ACKS.1 + 1);
    let delay = Duration::from_millis(rng.range(KILL_AFTER_MS.0, KILL_AFTER_MS.1 + 1));
    let extra = Duration::from_micros(rng.range(0, 5000));
    let stderr = fs::File::create(stderr_path).expect("stderr file");
    let started = Instant::now();
    let mut driver = Driver(
        drover_testkit::hermetic::command(env!("CARGO_BIN_EXE_drover-crashdriver"), home)
            .arg(home)
            .arg(cwd)
            .arg(seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn drover-crashdriver"),
    );
    let stdout = driver.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<Line>();
    let reader = thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut buf = Vec::new();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let complete = buf.last() == Some(&b'\n');
                    let text = String::from_utf8_lossy(&buf).trim_end().to_string();
                    if tx.send(Line { text, complete }).is_err() {
                        return;
                    }
                }
            }
        }
    });

    let mut lines = Vec::new();
    let mut acks = 0;
    let mut kill_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if kill_at.is_some_and(|at| now >= at) {
            break;
        }
        assert!(
            now - started < ROUND_TIMEOUT,
            "the driver made {acks} acks in {ROUND_TIMEOUT:?}; stderr: {}",
            fs::read_to_string(stderr_path).unwrap_or_default()
        );
        let wait = kill_at.map_or(Duration::from_millis(50), |at| at - now);
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if line.text.starts_with("ack ") {
                    acks += 1;
                    if acks == min_acks {
                        kill_at = Some((started + delay).max(Instant::now() + extra));
                    }
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = driver.0.wait();
                panic!(
                    "drover-crashdriver exited on its own ({status:?}); last lines: {:?}; \
                     stderr: {}",
                    lines
                        .iter()
                        .rev()
                        .take(3)
                        .map(|l| &l.text)
                        .collect::<Vec<_>>(),
                    fs::read_to_string(stderr_path).unwrap_or_default()
                );
            }
        }
    }
    // Whatever it printed before dying is still in the pipe.
    driver.kill_and_drain(reader, &rx, &mut lines);
    lines
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}
