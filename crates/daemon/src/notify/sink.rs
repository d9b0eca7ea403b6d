//! One task per sink: its bounded queue, its limit (at most `limit` per `window`, then one
//! summary), delivery with retries, and what `drover notify status` shows of it. Nothing here
//! waits on the daemon, and the daemon never waits on it: a full queue drops the notification
//! and counts it.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use jiff::Timestamp;
use serde::Serialize;
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::config::{EventKind, SinkConfig, Target};
use crate::http_client::HttpClient;

/// Notifications waiting for one sink. A sink that is down holds its task in retries for
/// seconds; this many wait meanwhile, and more are dropped (and counted) rather than held.
const QUEUE: usize = 64;

/// The most of a failed command's stderr kept for its error.
const STDERR_KEPT: u64 = 2048;

/// One notification, as every sink gets it (a webhook's body, a command's stdin). It never
/// holds a token, a secret or an agent's error text (which may quote what it was given).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Notice {
    #[serde(skip)]
    pub(crate) kind: EventKind,
    pub(crate) event: &'static str,
    pub(crate) agent_id: Option<String>,
    /// The agent's title, or the start of its id.
    pub(crate) title: Option<String>,
    pub(crate) provider: Option<String>,
    /// One line for people.
    pub(crate) message: String,
    /// The agent's page in the web UI.
    pub(crate) url: Option<String>,
    pub(crate) at: String,
    /// For a root's event raised by one of its subagents: which.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) subagent: Option<SubagentRef>,
    /// For a summary: how many of each event the limit held back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) held: Option<BTreeMap<&'static str, u64>>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SubagentRef {
    pub(crate) agent_id: String,
    pub(crate) title: Option<String>,
}

/// How a sink's deliveries went since the daemon started.
#[derive(Debug, Clone, Default)]
pub(crate) struct SinkStatus {
    pub(crate) sent: u64,
    pub(crate) last_sent_at: Option<Timestamp>,
    pub(crate) failed: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) last_error_at: Option<Timestamp>,
    pub(crate) dropped: u64,
    pub(crate) summarized: u64,
}

enum Job {
    Notice(Notice),
    /// A sample: delivered past the limit, its outcome handed back.
    Test(Notice, oneshot::Sender<Result<(), String>>),
}

/// A running sink.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) config: Arc<SinkConfig>,
    tx: mpsc::Sender<Job>,
    status: Arc<Mutex<SinkStatus>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Notice(n) | Job::Test(n, _) => f.write_str(n.event),
        }
    }
}

impl Sink {
    /// Starts the sink's task; `cwd` is where a command sink's program runs.
    pub(crate) fn start(config: SinkConfig, cwd: PathBuf) -> Sink {
        let (tx, rx) = mpsc::channel(QUEUE);
        let config = Arc::new(config);
        let status = Arc::new(Mutex::new(SinkStatus::default()));
        let worker = Worker {
            config: config.clone(),
            status: status.clone(),
            cwd,
            sent: VecDeque::new(),
            held: BTreeMap::new(),
            summary_at: None,
        };
        tokio::spawn(worker.run(rx));
        Sink { config, tx, status }
    }

    /// Queues `notice`, or drops it (counted) when the queue is full.
    pub(crate) fn offer(&self, notice: Notice) {
        if let Err(mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job)) =
            self.tx.try_send(Job::Notice(notice))
        {
            self.status().dropped += 1;
            tracing::warn!(sink = %self.config.name, event = ?job, "notification dropped: the sink's queue is full");
        }
    }

    /// Delivers `notice` (past the limit, after what is queued) and says how it went.
    pub(crate) async fn test(&self, notice: Notice) -> Result<(), String> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .try_send(Job::Test(notice, reply))
            .map_err(|_| "the sink's queue is full; try again later".to_string())?;
        outcome
            .await
            .unwrap_or_else(|_| Err("the sink stopped".to_string()))
    }

    pub(crate) fn snapshot(&self) -> SinkStatus {
        self.status().clone()
    }

    fn status(&self) -> std::sync::MutexGuard<'_, SinkStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Worker {
    config: Arc<SinkConfig>,
    status: Arc<Mutex<SinkStatus>>,
    cwd: PathBuf,
    /// When the notifications of the current window went out.
    sent: VecDeque<Instant>,
    /// What the limit held back, by event, for the next summary.
    held: BTreeMap<&'static str, u64>,
    /// When that summary goes.
    summary_at: Option<Instant>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        loop {
            let summary_at = self.summary_at;
            tokio::select! {
                job = rx.recv() => match job {
                    None => return,
                    Some(Job::Notice(notice)) => self.take(notice).await,
                    Some(Job::Test(notice, reply)) => {
                        let outcome = self.deliver(&notice).await;
                        let _ = reply.send(outcome);
                    }
                },
                () = async {
                    match summary_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => self.summarize().await,
            }
        }
    }

    /// Sends `notice` if the window has room (and nothing is held already), else holds it
    /// for the summary.
    async fn take(&mut self, notice: Notice) {
        let now = Instant::now();
        while self
            .sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.config.window)
        {
            self.sent.pop_front();
        }
        if self.held.is_empty() && self.sent.len() < self.config.limit as usize {
            self.sent.push_back(now);
            let _ = self.deliver(&notice).await;
            return;
        }
        *self.held.entry(notice.event).or_default() += 1;
        self.lock().summarized += 1;
        if self.summary_at.is_none() {
            // When the window's first notification leaves it.
            let first = self.sent.front().copied().unwrap_or(now);
            self.summary_at = Some(first + self.config.window);
        }
    }

    async fn summarize(&mut self) {
        self.summary_at = None;
        let held = std::mem::take(&mut self.held);
        let total: u64 = held.values().sum();
        if total == 0 {
            return;
        }
        let parts: Vec<String> = held.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let notice = Notice {
            kind: EventKind::Summary,
            event: EventKind::Summary.as_str(),
            agent_id: None,
            title: None,
            provider: None,
            message: format!(
                "{total} more notifications held back by the limit ({} per {}): {}",
                self.config.limit,
                describe(self.config.window),
                parts.join(", ")
            ),
            url: None,
            at: Timestamp::now().to_string(),
            subagent: None,
            held: Some(held),
        };
        self.sent.push_back(Instant::now());
        let _ = self.deliver(&notice).await;
    }

    /// One notification, tried `1 + retries` times (1 s, 2 s, 4 s… apart); the outcome is
    /// recorded in the status and logged.
    async fn deliver(&self, notice: &Notice) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..=self.config.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1 << (attempt - 1).min(5))).await;
            }
            match self.attempt(notice).await {
                Ok(()) => {
                    let mut status = self.lock();
                    status.sent += 1;
                    status.last_sent_at = Some(Timestamp::now());
                    tracing::debug!(sink = %self.config.name, event = notice.event, "notification sent");
                    return Ok(());
                }
                Err(e) => {
                    tracing::debug!(sink = %self.config.name, attempt = attempt + 1, error = %e, "notification attempt failed");
                    last = e;
                }
            }
        }
        tracing::warn!(sink = %self.config.name, event = notice.event, error = %last,
            tries = self.config.retries + 1, "notification not delivered");
        let mut status = self.lock();
        status.failed += 1;
        status.last_error = Some(last.clone());
        status.last_error_at = Some(Timestamp::now());
        Err(last)
    }

    async fn attempt(&self, notice: &Notice) -> Result<(), String> {
        let http = HttpClient::new(self.config.timeout);
        let version = concat!("drover/", env!("CARGO_PKG_VERSION"));
        match &self.config.target {
            Target::Webhook { url, secret } => {
                let body = serde_json::to_vec(notice).map_err(|e| e.to_string())?;
                let signature = secret
                    .as_deref()
                    .map(|s| format!("sha256={}", hex(&hmac_sha256(s.as_bytes(), &body))));
                let mut headers = vec![("user-agent", version), ("x-drover-event", notice.event)];
                if let Some(signature) = &signature {
                    headers.push(("x-drover-signature", signature.as_str()));
                }
                answered(url, http.post_json(url, &headers, body).await)
            }
            Target::Ntfy { url } => {
                // ntfy's JSON form: posted to the server's root with the topic inside, so a
                // title in any script needs no header encoding.
                let (root, topic) = url.rsplit_once('/').unwrap_or((url, ""));
                let body = ntfy_message(topic, notice);
                let root = format!("{root}/");
                answered(
                    &root,
                    http.post_json(&root, &[("user-agent", version)], body.to_string())
                        .await,
                )
            }
            Target::Command { argv, env } => self.run_command(argv, env, notice).await,
        }
    }

    /// Runs the command with the notice on stdin, without a shell and with the environment
    /// agents get (none of the daemon's own secrets) plus the sink's `env`, killed with its
    /// process group when `timeout` passes.
    async fn run_command(
        &self,
        argv: &[String],
        env: &BTreeMap<String, String>,
        notice: &Notice,
    ) -> Result<(), String> {
        let program = argv.first().cloned().unwrap_or_default();
        let mut body = serde_json::to_vec(notice).map_err(|e| e.to_string())?;
        body.push(b'\n');
        let mut command = std::process::Command::new(&program);
        command
            .args(&argv[1..])
            .current_dir(&self.cwd)
            .env_clear()
            .envs(drover_acp::process::inherited_env())
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        drover_core::child::die_with_daemon(&mut command);
        let handle = tokio::runtime::Handle::current();
        let mut child = drover_core::child::on_spawner(move || {
            let _entered = handle.enter();
            tokio::process::Command::from(command)
                .kill_on_drop(true)
                .spawn()
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stderr = child.stderr.take();
        let run = async {
            if let Some(mut stdin) = stdin {
                // A program that does not read its stdin may close it first: not an error.
                let _ = stdin.write_all(&body).await;
            }
            let mut said = String::new();
            let read = async {
                if let Some(stderr) = stderr {
                    let _ = stderr.take(STDERR_KEPT).read_to_string(&mut said).await;
                }
            };
            let ((), status) = tokio::join!(read, child.wait());
            (status, said)
        };
        match tokio::time::timeout(self.config.timeout, run).await {
            Ok((Ok(status), _)) if status.success() => Ok(()),
            Ok((Ok(status), said)) => {
                let said = said.trim().lines().last().unwrap_or_default().to_string();
                let how = drover_core::child::describe_exit(&status);
                Err(if said.is_empty() {
                    format!("`{program}` ended with {how}")
                } else {
                    format!("`{program}` ended with {how}: {said}")
                })
            }
            Ok((Err(e), _)) => Err(format!("cannot wait for `{program}`: {e}")),
            Err(_) => {
                if let Some(pid) = pid {
                    drover_core::child::signal_group(pid, Some(nix::sys::signal::Signal::SIGKILL));
                }
                let _ = child.kill().await;
                Err(format!(
                    "`{program}` did not finish within {}; killed",
                    describe(self.config.timeout)
                ))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SinkStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A 2xx answer is a delivery; anything else is an error naming the status.
fn answered(
    url: &str,
    answer: Result<crate::http_client::HttpResponse, crate::http_client::HttpError>,
) -> Result<(), String> {
    match answer {
        Ok(answer) if answer.is_success() => Ok(()),
        Ok(answer) => Err(format!("{url} answered HTTP {}", answer.status)),
        Err(e) => Err(e.to_string()),
    }
}

/// ntfy's JSON message: topic, title, message, priority (1–5), tags (emoji short codes), and
/// the link to open.
fn ntfy_message(topic: &str, notice: &Notice) -> serde_json::Value {
    let (priority, tag) = match notice.kind {
        EventKind::Permission => (4, "raising_hand"),
        EventKind::AuthRequired => (4, "key"),
        EventKind::Failed => (4, "x"),
        EventKind::Interrupted => (3, "warning"),
        EventKind::Limited => (3, "hourglass"),
        EventKind::Finished => (3, "white_check_mark"),
        EventKind::Summary => (3, "bell"),
        EventKind::Test => (2, "test_tube"),
    };
    let title = match &notice.title {
        Some(title) => format!("drover: {title}"),
        None => "drover".to_string(),
    };
    let mut message = serde_json::json!({
        "topic": topic,
        "title": title,
        "message": notice.message,
        "priority": priority,
        "tags": [tag, notice.event],
    });
    if let Some(url) = &notice.url {
        message["click"] = serde_json::Value::String(url.clone());
    }
    message
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    // Any key length is valid for HMAC: `new_from_slice` cannot fail here.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `10s`, `1m`, `1500ms`.
fn describe(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test cases 2 and 6 (a key longer than the block).
    #[test]
    fn hmac_matches_the_rfc_vectors() {
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn windows_read_as_people_write_them() {
        assert_eq!(describe(Duration::from_secs(60)), "1m");
        assert_eq!(describe(Duration::from_secs(10)), "10s");
        assert_eq!(describe(Duration::from_millis(1500)), "1500ms");
    }
}
