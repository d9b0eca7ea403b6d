//! `drover-bench-hosts`: a hub and its hosts, each a network namespace of its own joined by veth
//! pairs, each host behind Debian's sshd (`drover host add NAME ssh://root@ADDRESS`), every
//! daemon the real `drover` binary. Needs root, iproute2 and openssh-server (scripts/test
//! installs them).
//!
//! 1. Streaming through the hub: one demo agent on host `h1` streams 200 chunks 20 ms apart;
//!    `drover attach --json` reads it on the hub (through the link) and on `h1`'s own daemon at
//!    the same time, and each message's arrival is timed as this process reads it. The figure
//!    is what the hub adds: hub arrival minus direct arrival, message by message (the same
//!    messages: the hub relays the host's). Target: ≤ 2 ms at p99.
//! 2. 4 hosts × 250 agents against one daemon with 1,000 agents (stores written before the
//!    daemons start, as `drover-bench` does): the hub's `drover ls --json` (connect, `hello`,
//!    `session_state`, print) and its RSS. Target: ≤ 2× the single daemon's, each. Then 40 of
//!    the hosts' agents (10 each) stream while 10 clients of the hub (this binary's `--client`
//!    mode, run in the hub's namespace) follow all 40: the hub daemon's CPU meanwhile.
//! 3. A link cut (`ip link set … down` in the host's namespace) until the hub says
//!    `unreachable`, then back up: the time until the hub says `reachable` and lists the host's
//!    agents again. Target: ≤ 2 s.
//!
//! Not a timed test: it prints figures with PASS/MISS. `DROVER_BENCH_ROUNDS` (default 5) sets
//! the rounds of parts 2 and 3.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use drover_bench::{self as bench, Row, fmt_dur, fmt_kb, median};
use drover_testkit::netns::{Machine, SshServer, link};
use serde_json::Value;

const ADDED_P99_TARGET: Duration = Duration::from_millis(2);
const FLEET_RATIO_TARGET: f64 = 2.0;
const RECONNECT_TARGET: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(60);

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--client") {
        // A client of the hub, run inside its namespace by part 2 (see `stream_clients`).
        return bench::block_on(
            "drover-bench-hosts client",
            Some(1),
            client(args[2..].to_vec()),
        );
    }
    bench::exit("drover-bench-hosts", run())
}

/// `--client URL TOKEN ID…`: says hello, opens every agent, and reads until each one's turn
/// ended; prints how many messages came.
async fn client(args: Vec<String>) -> Result<()> {
    let [url, token, ids @ ..] = args.as_slice() else {
        bail!("--client URL TOKEN ID…");
    };
    let url = url.replacen("http://", "ws://", 1);
    let mut ws = bench::ws_connect(&format!("{url}/ws")).await?;
    bench::send_json(
        &mut ws,
        &serde_json::json!({"type": "hello", "client": "bench", "protocolVersion": drover_protocol::PROTOCOL_VERSION, "token": token}),
    )
    .await?;
    for (i, id) in ids.iter().enumerate() {
        bench::send_json(
            &mut ws,
            &serde_json::json!({"type": "initialize_agent_request", "requestId": format!("i{i}"), "agentId": id, "limit": 1}),
        )
        .await?;
    }
    let mut ended = std::collections::HashSet::new();
    let mut messages = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while ended.len() < ids.len() && Instant::now() < deadline {
        let message = bench::recv_json(&mut ws).await?;
        messages += 1;
        if message["type"] == "agent_update"
            && message["payload"]["notification"]["item"]["kind"] == "turn_ended"
        {
            ended.insert(message["payload"]["agentId"].to_string());
        }
    }
    println!("{messages} {}", ended.len());
    Ok(())
}

/// `drover ARGS` on `machine`, which must succeed.
fn run_on(machine: &Machine, args: &[&str]) -> Result<Output> {
    let out = machine.command(args).output().context("run drover")?;
    ensure!(
        out.status.success(),
        "drover {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// `drover ARGS` on `machine`, its stdout as JSON.
fn json(machine: &Machine, args: &[&str]) -> Result<Value> {
    Ok(serde_json::from_slice(&run_on(machine, args)?.stdout)?)
}

/// A hub and `n` hosts `h1`…, linked and added to the hub, each host's store holding
/// `agents_per_host` generated agents.
struct Fleet {
    hub: Machine,
    hosts: Vec<(Machine, SshServer)>,
}

impl Fleet {
    fn new(root: &Path, drover: &Path, n: usize, agents_per_host: usize) -> Result<Fleet> {
        let hub = Machine::new(root, "hub", drover)?;
        let bin_dir = drover.parent().context("bin dir")?.display().to_string();
        let mut hosts = Vec::new();
        for i in 1..=n {
            let name = format!("h{i}");
            let host = Machine::new(root, &name, drover)?;
            link(
                &hub.ns,
                &format!("to-{name}"),
                &format!("10.78.{i}.1/24"),
                &host.ns,
                "to-hub",
                &format!("10.78.{i}.2/24"),
            )?;
            if agents_per_host > 0 {
                bench::fleet_gen::generate_fleet(
                    &host.drover_home,
                    10,
                    agents_per_host / 10,
                    7 + i as u64,
                )?;
            }
            let ssh = SshServer::start(
                &host.ns,
                &format!("10.78.{i}.2"),
                &root.join(format!("sshd-{name}")),
                &[
                    ("PATH", &format!("{bin_dir}:/usr/bin:/bin")),
                    ("HOME", &host.home.display().to_string()),
                    ("DROVER_HOME", &host.drover_home.display().to_string()),
                    ("DROVER_LISTEN", "127.0.0.1:7717"),
                ],
            )?;
            hosts.push((host, ssh));
        }
        run_on(&hub, &["daemon", "start"])?;
        for (i, (_, ssh)) in hosts.iter().enumerate() {
            let name = format!("h{}", i + 1);
            let address = format!("ssh://root@{}", ssh.address);
            let key = ssh.key.display().to_string();
            let mut args = vec!["host", "add", &name, &address, "--identity", &key];
            let options = ssh.ssh_options();
            for option in &options {
                args.extend(["--ssh-option", option]);
            }
            run_on(&hub, &args)?;
        }
        Ok(Fleet { hub, hosts })
    }

    fn host_state(&self, name: &str) -> Result<Value> {
        let hosts = json(&self.hub, &["host", "ls", "--json"])?;
        hosts
            .as_array()
            .and_then(|h| h.iter().find(|h| h["name"] == name))
            .cloned()
            .context("host listed")
    }
}

fn run() -> Result<()> {
    let drover = bench::drover_binary()?;
    let (scratch, keep) = bench::scratch("drover-bench-hosts-")?;
    let root = scratch.path().canonicalize()?;
    let rounds = bench::rounds(5);
    println!("drover-bench-hosts");
    println!("  scratch: {}", root.display());
    println!(
        "  machine: {} CPUs, {}; load average {}; {rounds} rounds",
        bench::cpus(),
        bench::kernel(),
        bench::load_average()
    );
    println!();
    let started = Instant::now();
    let mut rows = Vec::new();

    println!("== 1. a remote agent's stream: through the hub against its own daemon ==");
    streaming(&root.join("stream"), &drover, &mut rows)?;
    println!("== 2. 4 hosts × 250 agents against one daemon with 1,000 ==");
    fleet(&root.join("fleet"), &drover, rounds, &mut rows)?;
    println!("== 3. a link cut, then back: until the hub has the host again ==");
    reconnect(&root.join("cut"), &drover, rounds, &mut rows)?;
    println!();
    bench::print_summary(&rows, started);
    if keep {
        std::mem::forget(scratch);
    }
    Ok(())
}

/// Reads `drover attach ID --json` lines in a thread, each with its arrival time, until the
/// agent's turn ends.
fn attach(machine: &Machine, id: &str) -> Result<std::thread::JoinHandle<Vec<(Instant, String)>>> {
    let mut child = machine
        .command(&["attach", id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    Ok(std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // `attach` follows until it is stopped: the turn's end is the stream's.
            let ended = line.contains("\"turn_ended\"");
            lines.push((Instant::now(), line));
            if ended {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        lines
    }))
}

/// The streamed appends of an attach's lines, with their arrival times.
fn appends(lines: &[(Instant, String)]) -> Vec<(Instant, String)> {
    lines
        .iter()
        .filter_map(|(at, line)| {
            let v: Value = serde_json::from_str(line).ok()?;
            (v["op"] == "append").then(|| (*at, v["text"].as_str().unwrap_or_default().to_string()))
        })
        .collect()
}

fn streaming(root: &Path, drover: &Path, rows: &mut Vec<Row>) -> Result<()> {
    let fleet = Fleet::new(root, drover, 1, 0)?;
    let (host, _) = &fleet.hosts[0];
    let work = host.home.display().to_string();
    let out = run_on(
        &fleet.hub,
        &[
            "run",
            "--host",
            "h1",
            "--cwd",
            &work,
            "--provider",
            "demo",
            "--detach",
            "sleep 3000\nstream 200 20",
        ],
    )?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let through_hub = attach(&fleet.hub, &id)?;
    let direct = attach(host, &id)?;
    let hub_lines = through_hub
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    let direct_lines = direct
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    let (hub, direct) = (appends(&hub_lines), appends(&direct_lines));
    ensure!(
        !hub.is_empty() && !direct.is_empty(),
        "no appends read ({} / {})",
        hub.len(),
        direct.len()
    );
    let mut added: Vec<u64> = Vec::new();
    let mut mismatched = 0;
    for ((at_hub, text_hub), (at_direct, text_direct)) in hub.iter().zip(&direct) {
        if text_hub != text_direct {
            mismatched += 1;
            continue;
        }
        let delta = at_hub.saturating_duration_since(*at_direct);
        added.push(u64::try_from(delta.as_nanos()).unwrap_or(u64::MAX));
    }
    added.sort_unstable();
    let (p50, p99) = (bench::quantile(&added, 0.5), bench::quantile(&added, 0.99));
    println!(
        "  {} messages through the hub, {} direct ({} compared, {mismatched} out of step); added p50 {}, p99 {}",
        hub.len(),
        direct.len(),
        added.len(),
        fmt_dur(p50),
        fmt_dur(p99)
    );
    rows.push(Row::info(
        "1. hub's added latency per streamed message, p50",
        fmt_dur(p50),
    ));
    rows.push(Row::target(
        "1. hub's added latency per streamed message, p99",
        fmt_dur(p99),
        format!("≤ {}", fmt_dur(ADDED_P99_TARGET)),
        p99 <= ADDED_P99_TARGET,
    ));
    Ok(())
}

/// Median time of `drover ls --json` on `machine` over `rounds`, and the agents it listed.
fn ls_time(machine: &Machine, rounds: usize) -> Result<(Duration, usize)> {
    let mut times = Vec::new();
    let mut listed = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let agents = json(machine, &["ls", "--json"])?;
        times.push(t.elapsed());
        listed = agents.as_array().map_or(0, Vec::len);
    }
    Ok((median(&times), listed))
}

fn fleet(root: &Path, drover: &Path, rounds: usize, rows: &mut Vec<Row>) -> Result<()> {
    // One daemon with 1,000 agents, in a namespace of its own.
    let single = Machine::new(root, "single", drover)?;
    bench::fleet_gen::generate_fleet(&single.drover_home, 10, 100, 7)?;
    run_on(&single, &["daemon", "start"])?;
    let (single_ls, single_listed) = ls_time(&single, rounds)?;
    let single_rss = bench::proc_mem_kb(single.daemon_pid().context("single daemon")?)?.0;
    drop(single);

    let fleet = Fleet::new(root, drover, 4, 250)?;
    let deadline = Instant::now() + WAIT;
    for i in 1..=4 {
        while fleet.host_state(&format!("h{i}"))?["state"] != "reachable" {
            ensure!(Instant::now() < deadline, "h{i} never became reachable");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (hub_ls, hub_listed) = ls_time(&fleet.hub, rounds)?;
    let hub_rss_idle = bench::proc_mem_kb(fleet.hub.daemon_pid().context("hub")?)?.0;
    stream_clients(&fleet, rows)?;
    let hub_rss = hub_rss_idle;
    println!(
        "  one daemon: {single_listed} agents listed in {} (RSS {}); the hub: {hub_listed} in {} (RSS {})",
        fmt_dur(single_ls),
        fmt_kb(single_rss),
        fmt_dur(hub_ls),
        fmt_kb(hub_rss)
    );
    let time_ratio = hub_ls.as_secs_f64() / single_ls.as_secs_f64().max(1e-9);
    #[expect(clippy::cast_precision_loss)]
    let rss_ratio = hub_rss as f64 / single_rss.max(1) as f64;
    rows.push(Row::target(
        "2. hub's `ls` (session_state) 4×250 vs 1×1,000",
        format!(
            "{} vs {} ({time_ratio:.2}×)",
            fmt_dur(hub_ls),
            fmt_dur(single_ls)
        ),
        format!("≤ {FLEET_RATIO_TARGET}×"),
        time_ratio <= FLEET_RATIO_TARGET,
    ));
    rows.push(Row::target(
        "2. hub's RSS 4×250 vs 1×1,000",
        format!(
            "{} vs {} ({rss_ratio:.2}×)",
            fmt_kb(hub_rss),
            fmt_kb(single_rss)
        ),
        format!("≤ {FLEET_RATIO_TARGET}×"),
        rss_ratio <= FLEET_RATIO_TARGET,
    ));
    Ok(())
}

/// 40 remote agents (10 on each host) stream while 10 clients of the hub follow all of them:
/// the hub daemon's CPU meanwhile.
fn stream_clients(fleet: &Fleet, rows: &mut Vec<Row>) -> Result<()> {
    let mut ids = Vec::new();
    for (i, (host, _)) in fleet.hosts.iter().enumerate() {
        let work = host.home.display().to_string();
        let name = format!("h{}", i + 1);
        for _ in 0..10 {
            let out = run_on(
                &fleet.hub,
                &[
                    "run",
                    "--host",
                    &name,
                    "--cwd",
                    &work,
                    "--provider",
                    "demo",
                    "--detach",
                    "sleep 3000\nstream 100 30",
                ],
            )?;
            ids.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
    }
    let info: Value =
        serde_json::from_slice(&std::fs::read(fleet.hub.drover_home.join("daemon.json"))?)?;
    let url = info["url"].as_str().context("hub url")?.to_string();
    let token = std::fs::read_to_string(fleet.hub.drover_home.join("token"))?
        .trim()
        .to_string();
    let me = std::env::current_exe()?;
    let hub = fleet.hub.daemon_pid().context("hub")?;
    let (cpu_before, started) = (bench::proc_cpu_time(hub)?, Instant::now());
    let clients: Vec<std::process::Child> = (0..10)
        .map(|_| {
            fleet
                .hub
                .ns
                .command(&me)
                .arg("--client")
                .arg(&url)
                .arg(&token)
                .args(&ids)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let mut messages = 0u64;
    for client in clients {
        let out = client.wait_with_output()?;
        ensure!(
            out.status.success(),
            "a client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        let mut words = said.split_whitespace();
        messages += words
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let ended: usize = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        ensure!(
            ended == ids.len(),
            "a client saw {ended} of {} turns end",
            ids.len()
        );
    }
    let (cpu, wall) = (
        bench::proc_cpu_time(hub)?.saturating_sub(cpu_before),
        started.elapsed(),
    );
    println!(
        "  40 remote agents streaming to 10 clients: {messages} messages delivered in {}; the hub used {} of CPU ({:.0} % of one core)",
        fmt_dur(wall),
        fmt_dur(cpu),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    rows.push(Row::info(
        "2. hub's CPU, 40 remote agents streaming to 10 clients",
        format!(
            "{} in {} ({messages} messages)",
            fmt_dur(cpu),
            fmt_dur(wall)
        ),
    ));
    Ok(())
}

fn reconnect(root: &Path, drover: &Path, rounds: usize, rows: &mut Vec<Row>) -> Result<()> {
    let fleet = Fleet::new(root, drover, 1, 50)?;
    let (host, _) = &fleet.hosts[0];
    let wait_state = |state: &str| -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while fleet.host_state("h1")?["state"] != state {
            if Instant::now() > deadline {
                bail!("h1 not {state} within {WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    };
    wait_state("reachable")?;
    let mut times = Vec::new();
    for _ in 0..rounds {
        host.ns.exec(&["ip", "link", "set", "to-hub", "down"])?;
        wait_state("unreachable")?;
        host.ns.exec(&["ip", "link", "set", "to-hub", "up"])?;
        let up = Instant::now();
        wait_state("reachable")?;
        // … and its agents listed again.
        let agents = json(&fleet.hub, &["ls", "--json", "--host", "h1"])?;
        ensure!(
            agents.as_array().is_some_and(|a| !a.is_empty()),
            "no agents of h1 listed"
        );
        times.push(up.elapsed());
    }
    let back = median(&times);
    let worst = times.iter().max().copied().unwrap_or_default();
    println!(
        "  back after {} (median of {rounds}; worst {})",
        fmt_dur(back),
        fmt_dur(worst)
    );
    rows.push(Row::target(
        "3. link back → host reachable with its agents (median)",
        fmt_dur(back),
        format!("≤ {}", fmt_dur(RECONNECT_TARGET)),
        back <= RECONNECT_TARGET,
    ));
    Ok(())
}
