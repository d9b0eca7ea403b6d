//! `GET /metrics` through the real daemon, with the scripted agent: the token is required,
//! the numbers a user checks are right after a real turn and while an agent waits for a
//! permission, the exposition passes `promtool check metrics`, and Debian's `prometheus`
//! really scrapes the daemon (a generated config on 127.0.0.1 with the token in a
//! credentials file) and answers a query for a drover metric.

// The values compared exactly are counts, small integers that f64 holds exactly.
#![expect(clippy::float_cmp)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_testkit::daemon::{TestDaemon, http};
use drover_testkit::wait::{eventually, poll_until};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// How long Prometheus may take to start, scrape and answer.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);

/// `GET /metrics` with these header lines: the status and the body.
async fn scrape(daemon: &TestDaemon, headers: &[&str]) -> (u16, String) {
    http(daemon.addr(), "GET", "/metrics", daemon.addr(), headers).await
}

fn bearer(daemon: &TestDaemon) -> String {
    format!(
        "Authorization: Bearer {}",
        daemon.token().expect("the daemon keeps a token")
    )
}

/// The samples of an exposition: `name{labels}` (as written) → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no `{series}` in the exposition: {samples:#?}"))
}

fn promtool() -> PathBuf {
    drover_testkit::installed(
        PathBuf::from("/usr/bin/promtool"),
        "install Debian's prometheus with `apt-get install -y prometheus` (scripts/test does)",
    )
}

fn prometheus() -> PathBuf {
    drover_testkit::installed(
        PathBuf::from("/usr/bin/prometheus"),
        "install Debian's with `apt-get install -y prometheus` (scripts/test does)",
    )
}

/// `promtool check metrics` reads the exposition on stdin; its complaints fail the test.
async fn promtool_check(exposition: &str, home: &Path) {
    let mut command = tokio::process::Command::new(promtool());
    drover_testkit::hermetic::apply(command.as_std_mut(), home);
    let mut child = command
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("promtool runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(exposition.as_bytes())
        .await
        .expect("write the exposition");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("promtool answers in time")
        .expect("promtool's output");
    drover_testkit::assert_succeeded(&out, &format!("promtool check metrics of\n{exposition}\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_and_count_agents_turns_jobs_and_schedules() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let cwd = daemon.cwd();

    // Strangers get nothing: no token, a wrong one, another scheme.
    for headers in [
        &[][..],
        &["Authorization: Bearer not-the-token"][..],
        &["Authorization: Basic Zm9vOmJhcg=="][..],
    ] {
        let (status, body) = scrape(&daemon, headers).await;
        assert_eq!(status, 401, "{headers:?}: {body}");
        assert!(!body.contains("drover_agents"), "{body}");
    }

    // A real turn, to its end; a job and a schedule of the agent.
    let done = client
        .create_agent(json!({"provider": "scripted", "cwd": cwd, "prompt": "say hello\nusage"}))
        .await;
    client.wait_idle(&done).await;
    let job = client
        .request(json!({"type": "start_job", "agentId": done, "command": "sleep 60", "notifyOnExit": false}))
        .await;
    assert_eq!(job["type"], "job", "{job}");
    let schedule = client
        .request(
            json!({"type": "create_schedule", "agentId": done, "prompt": "say daily",
                        "when": {"everySeconds": 86_400}}),
        )
        .await;
    assert_eq!(schedule["type"], "schedule", "{schedule}");
    let (status, text) = scrape(&daemon, &[&bearer(&daemon)]).await;
    assert_eq!(status, 200, "{text}");
    let s = samples(&text);
    assert_eq!(value(&s, "drover_agents{status=\"idle\"}"), 1.0, "{text}");
    assert_eq!(value(&s, "drover_turns_started_total"), 1.0, "{text}");
    assert_eq!(
        value(&s, "drover_turns_ended_total{outcome=\"completed\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        value(&s, "drover_turns_ended_total{outcome=\"failed\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            "drover_turn_duration_seconds_count{outcome=\"completed\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(
        value(
            &s,
            "drover_turn_duration_seconds_sum{outcome=\"completed\"}"
        ) > 0.0,
        "{text}"
    );
    assert_eq!(
        value(&s, "drover_agents_attention{reason=\"finished\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(value(&s, "drover_runtimes{state=\"live\"}"), 1.0, "{text}");
    assert_eq!(value(&s, "drover_clients"), 1.0, "{text}");
    assert!(
        value(&s, "drover_agent_streamed_bytes_total{kind=\"message\"}") >= "hello".len() as f64,
        "{text}"
    );
    assert!(value(&s, "drover_client_sent_bytes_total") > 0.0, "{text}");
    assert_eq!(value(&s, "drover_jobs{status=\"running\"}"), 1.0, "{text}");
    assert_eq!(value(&s, "drover_jobs{status=\"exited\"}"), 0.0, "{text}");
    assert_eq!(
        value(&s, "drover_schedules{state=\"active\"}"),
        1.0,
        "{text}"
    );
    // The live agent's process tree, read from /proc.
    assert!(value(&s, "drover_agent_processes") >= 1.0, "{text}");
    assert!(
        value(&s, "drover_agent_resident_memory_bytes") > 0.0,
        "{text}"
    );
    // What the agent reported spending: 1,000 tokens at 1 USD per million.
    assert_eq!(value(&s, "drover_spend_tokens"), 1000.0, "{text}");
    assert!(
        value(&s, "drover_spend_cost{currency=\"USD\"}") > 0.0,
        "{text}"
    );
    assert_eq!(value(&s, "drover_agents_spend_unknown"), 0.0, "{text}");
    // The daemon's own process.
    assert!(value(&s, "process_resident_memory_bytes") > 0.0, "{text}");
    assert!(value(&s, "process_open_fds") > 0.0, "{text}");
    promtool_check(&text, &daemon.home).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_an_agent_waiting_for_permission_and_how_long_it_has_waited() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let cwd = daemon.cwd();
    // An agent waiting for a permission: counted, with how long it has waited (what the
    // "needs permission for 10 minutes" alert reads).
    let asking = client
        .create_agent(
            json!({"provider": "scripted", "cwd": cwd, "prompt": "permission write the file"}),
        )
        .await;
    let waiting = eventually(
        "the permission counted in /metrics",
        Duration::from_secs(20),
        async || {
            let (_, text) = scrape(&daemon, &[&bearer(&daemon)]).await;
            let s = samples(&text);
            (s.get("drover_agents_attention{reason=\"permission\"}") == Some(&1.0)).then_some(s)
        },
    )
    .await;
    assert_eq!(value(&waiting, "drover_agents{status=\"running\"}"), 1.0);
    assert_eq!(value(&waiting, "drover_runtimes{state=\"live\"}"), 1.0);
    assert_eq!(
        value(
            &waiting,
            "drover_agents_attention_oldest_age_seconds{reason=\"finished\"}"
        ),
        0.0
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, text) = scrape(&daemon, &[&bearer(&daemon)]).await;
    let age = value(
        &samples(&text),
        "drover_agents_attention_oldest_age_seconds{reason=\"permission\"}",
    );
    assert!(
        age >= 1.0,
        "the permission has waited over a second: {text}"
    );
    let _ = client
        .request(json!({"type": "cancel", "agentId": asking}))
        .await;
}

/// A Prometheus server of the test's own: its config, data and port in a temporary
/// directory, killed with the test.
struct Prometheus {
    child: tokio::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` (`127.0.0.1:PORT`) every second with the token in `token_file`.
    fn start(target: &str, token_file: &Path) -> Prometheus {
        let dir = tempfile::TempDir::new().expect("prometheus dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: drover\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{target}']\n    authorization:\n      type: Bearer\n      credentials_file: {}\n",
                token_file.display()
            ),
        )
        .expect("prometheus.yml");
        // A free port: taken by the kernel, released for Prometheus.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut command = tokio::process::Command::new(prometheus());
        drover_testkit::hermetic::apply(command.as_std_mut(), dir.path());
        let child = command
            .current_dir(dir.path())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.path().join("prometheus.log")).expect("prometheus.log"),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("prometheus runs");
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` on Prometheus's HTTP API: the JSON answer, if it answered.
    async fn get(&self, path: &str) -> Option<Value> {
        let addr = format!("127.0.0.1:{}", self.port);
        // Connection refused while it starts.
        tokio::net::TcpStream::connect(&addr).await.ok()?;
        let (status, body) = http(&addr, "GET", path, &addr, &[]).await;
        if status != 200 {
            return None;
        }
        // The JSON object, whatever framing the body had.
        let start = body.find('{')?;
        let end = body.rfind('}')?;
        serde_json::from_str(&body[start..=end]).ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_prometheus_scrapes_the_daemon_with_the_token_and_answers_a_query() {
    let (daemon, mut client) = TestDaemon::start_with_client().await;
    let agent = client
        .create_agent(json!({"provider": "scripted", "cwd": daemon.cwd(), "prompt": "say hi"}))
        .await;
    client.wait_idle(&agent).await;

    let mut prometheus = Prometheus::start(daemon.addr(), &daemon.home.join("token"));
    // The query API answers with the value Prometheus scraped: the idle agent, and the turn.
    let query = "/api/v1/query?query=drover_agents%7Bstatus%3D%22idle%22%7D";
    let found = poll_until(PROMETHEUS_WAIT, async || {
        let answer = prometheus.get(query).await?;
        let result = answer["data"]["result"].as_array()?.first()?.clone();
        Some(result)
    })
    .await;
    let Some(result) = found else {
        let targets = prometheus.get("/api/v1/targets").await;
        panic!(
            "Prometheus never had drover_agents; targets: {targets:#?}\nits log:\n{}",
            prometheus.log()
        );
    };
    assert_eq!(result["metric"]["job"], "drover", "{result}");
    assert_eq!(result["value"][1], "1", "{result}");
    let turns = prometheus
        .get("/api/v1/query?query=drover_turns_ended_total%7Boutcome%3D%22completed%22%7D")
        .await
        .expect("a query answer");
    assert_eq!(turns["data"]["result"][0]["value"][1], "1", "{turns}");
    // The scrape itself was healthy (`up` is 1 only when the token was accepted and the
    // exposition parsed).
    let up = prometheus
        .get("/api/v1/query?query=up%7Bjob%3D%22drover%22%7D")
        .await
        .expect("a query answer");
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
    let _ = prometheus.child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), prometheus.child.wait()).await;
}

/// The YAML code blocks of the README's "Running unattended" section, in order.
fn readme_yaml() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Running unattended"))
        .expect("a `Running unattended` section in the README");
    section
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(yaml, _)| yaml.to_string()))
        .collect()
}

/// `promtool` with these arguments in `dir`; fails the test unless it succeeds.
async fn promtool_in(dir: &Path, args: &[&str]) {
    let mut command = tokio::process::Command::new(promtool());
    drover_testkit::hermetic::apply(command.as_std_mut(), dir);
    let out = command
        .current_dir(dir)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("promtool answers in time")
        .expect("promtool runs");
    drover_testkit::assert_succeeded(&out, &format!("promtool {args:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_the_readmes_scrape_config_and_permission_alert_work_in_prometheus() {
    let blocks = readme_yaml();
    let scrape = blocks
        .iter()
        .find(|b| b.contains("scrape_configs:"))
        .expect("the README's scrape config");
    let rules = blocks
        .iter()
        .find(|b| b.contains("groups:"))
        .expect("the README's alert rules");
    let dir = tempfile::TempDir::new().expect("dir");
    let token = dir.path().join("token");
    std::fs::write(&token, "a-token\n").expect("token");
    // The config as written, the token file where this test keeps one, and the rules.
    let (before, after) = scrape
        .split_once("credentials_file: ")
        .expect("the token read from a file");
    let rest = after.split_once('\n').map_or("", |(_, rest)| rest);
    let config = format!(
        "rule_files: ['rules.yml']\n{before}credentials_file: {}\n{rest}",
        token.display()
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("prometheus.yml");
    std::fs::write(dir.path().join("rules.yml"), rules).expect("rules.yml");
    promtool_in(dir.path(), &["check", "config", "prometheus.yml"]).await;
    // The permission alert: quiet while an agent has waited 9 minutes, firing at 11.
    std::fs::write(
        dir.path().join("test.yml"),
        r#"rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'drover_agents_attention_oldest_age_seconds{reason="permission"}'
        values: '0+60x20'
      - series: 'drover_agents_attention_oldest_age_seconds{reason="finished"}'
        values: '0+60x20'
    alert_rule_test:
      - eval_time: 9m
        alertname: DroverAgentWaitsForPermission
        exp_alerts: []
      - eval_time: 11m
        alertname: DroverAgentWaitsForPermission
        exp_alerts:
          - exp_labels:
              reason: permission
            exp_annotations:
              summary: "a drover agent has needed permission for 11m 0s"
"#,
    )
    .expect("test.yml");
    promtool_in(dir.path(), &["test", "rules", "test.yml"]).await;
}
