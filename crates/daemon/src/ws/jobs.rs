//! The client protocol's job requests (`start_job`, `list_jobs`, `job_output`, `kill_job`,
//! `wait_job`): decode, call the operation in `crate::ops::jobs`, encode; and the jobs a
//! session follows (`follow_job`, `unfollow_job`), whose output is pushed to it as
//! `job_output_update`.
//!
//! A follow is one task reading the job's output by offset ([`JobFollower`]). It reads the
//! next chunk only once the session's push queue has room for it, so a session whose client
//! reads slowly holds at most [`PUSH_CAPACITY`] chunks: the follower lags behind the job
//! (and is told `skipped` if it lags past what the daemon keeps), the job never waits for it
//! and nothing buffers without bound.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{DaemonMessage, ErrorCode};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::{encode, request_error};
use crate::hosts::HostError;
use crate::ops::jobs::{FOLLOW_CHUNK, JobChunk, JobFollower, JobOutput, StartJob};
use crate::ops::{Caller, OpError, Ops, parse_agent};
use crate::wire;

/// Chunks (each at most [`FOLLOW_CHUNK`] bytes of output) waiting to be written to one
/// session's socket, for all the jobs it follows: the memory a slow client can hold.
const PUSH_CAPACITY: usize = 4;
/// How many jobs one session may follow at once.
const MAX_FOLLOWS: usize = 64;

/// Every client of the protocol is the machine's user.
const CALLER: Caller = Caller::User;

/// `start_job`.
pub(super) async fn start_job(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::StartJob,
) -> Result<DaemonMessage, OpError> {
    let request = StartJob {
        owner: parse_agent(&r.agent_id)?,
        command: r.command,
        cwd: r.cwd.map(PathBuf::from),
        env: r.env,
        timeout_s: r.timeout_s,
        notify_on_exit: r.notify_on_exit,
    };
    let job = ops.start_job(CALLER, request).await?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Job {
            job: wire::job_info(&job),
        },
    ))
}

/// `list_jobs`.
pub(super) fn list_jobs(
    ops: &Ops,
    request_id: Option<String>,
    r: &rq::ListJobs,
) -> Result<DaemonMessage, OpError> {
    let owner = r.agent_id.as_deref().map(parse_agent).transpose()?;
    let jobs = ops.list_jobs(CALLER, owner)?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Jobs {
            jobs: jobs.iter().map(wire::job_info).collect(),
        },
    ))
}

/// `job_output`.
pub(super) async fn job_output(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::JobOutput,
) -> Result<DaemonMessage, OpError> {
    let wait = r.wait_ms.map(Duration::from_millis);
    let out = ops
        .job_output(CALLER, &r.job_id, r.offset, r.tail, r.max_bytes, wait)
        .await?;
    let JobOutput { job, chunk } = out;
    Ok(DaemonMessage::answer(
        request_id,
        answers::JobOutput {
            job_id: job.id,
            offset: chunk.offset,
            text: chunk.text,
            next_offset: chunk.next_offset,
            end: chunk.end,
            skipped: chunk.skipped,
            eof: chunk.eof,
        },
    ))
}

/// `kill_job`.
pub(super) async fn kill_job(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::KillJob,
) -> Result<DaemonMessage, OpError> {
    let job = ops.kill_job(CALLER, &r.job_id).await?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Job {
            job: wire::job_info(&job),
        },
    ))
}

/// `wait_job`.
pub(super) async fn wait_job(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::WaitJob,
) -> Result<DaemonMessage, OpError> {
    let timeout = r.timeout_ms.map(Duration::from_millis);
    let (job, ended) = ops.wait_job(CALLER, &r.job_id, timeout).await?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::JobWaited {
            job: wire::job_info(&job),
            ended,
        },
    ))
}

/// One chunk of a followed job's output, encoded, on its way to the session's socket.
pub(super) struct Push {
    /// The follow it belongs to (see [`Follows`]): a push of a follow that was stopped or
    /// replaced is dropped.
    follow: u64,
    pub(super) text: Utf8Bytes,
    eof: bool,
}

impl Push {
    /// `text` for the follow numbered `follow`; `eof`: its last.
    pub(super) fn new(follow: u64, text: Utf8Bytes, eof: bool) -> Push {
        Push { follow, text, eof }
    }
}

/// The jobs one session follows, and the workspace terminals it is attached to.
pub(super) struct Follows {
    /// Job or terminal id → its follow's number and task.
    active: HashMap<String, (u64, AbortHandle)>,
    next: u64,
    tx: mpsc::Sender<Push>,
    rx: mpsc::Receiver<Push>,
}

impl Follows {
    pub(super) fn new() -> Follows {
        let (tx, rx) = mpsc::channel(PUSH_CAPACITY);
        Follows {
            active: HashMap::new(),
            next: 0,
            tx,
            rx,
        }
    }

    /// Answers `follow_job`. The answer is to be sent before the session takes the next
    /// push: a follow's first chunk comes after its `job_followed`.
    pub(super) fn follow_job(
        &mut self,
        request_id: Option<String>,
        r: &rq::FollowJob,
        ops: &Ops,
    ) -> DaemonMessage {
        self.follow(request_id.clone(), &r.job_id, r.offset, ops)
            .unwrap_or_else(|e| {
                request_error(
                    request_id,
                    e.code(),
                    e.to_string(),
                    crate::wire::error_details(&e),
                )
            })
    }

    /// Answers `unfollow_job`: no chunk of the job is pushed after its `job_unfollowed`.
    pub(super) fn unfollow_job(
        &mut self,
        request_id: Option<String>,
        r: &rq::UnfollowJob,
    ) -> DaemonMessage {
        let followed = self.stop(&r.job_id);
        DaemonMessage::answer(
            request_id,
            answers::JobUnfollowed {
                job_id: r.job_id.clone(),
                followed,
            },
        )
    }

    fn follow(
        &mut self,
        request_id: Option<String>,
        job_id: &str,
        offset: Option<u64>,
        ops: &Ops,
    ) -> Result<DaemonMessage, OpError> {
        let follower = ops.follow_job(CALLER, job_id, offset)?;
        let id = follower.job_id().to_string();
        // Following again starts over: the old follow's pushes still queued are dropped.
        self.stop(&id);
        if self.active.len() >= MAX_FOLLOWS {
            return Ok(request_error(
                request_id,
                ErrorCode::TooManyRequests,
                format!("this connection follows {MAX_FOLLOWS} jobs already; unfollow one first"),
                None,
            ));
        }
        let answer = DaemonMessage::answer(
            request_id,
            answers::JobFollowed {
                job: wire::job_info(&follower.record()),
                offset: follower.offset(),
            },
        );
        self.next += 1;
        let follow = self.next;
        let task = tokio::spawn(push(follower, follow, self.tx.clone()));
        self.active.insert(id, (follow, task.abort_handle()));
        Ok(answer)
    }

    /// Follows `job` of `host` (the client's `r.job_id` is `job@host`): its output is read over
    /// the link (`job_output` waiting for more) and pushed as a local job's is, its
    /// `job_followed` first. A refusal now (too many follows) is returned; one of the host's
    /// comes as the answer.
    pub(super) fn follow_remote(
        &mut self,
        request_id: Option<String>,
        r: &rq::FollowJob,
        host: String,
        job: String,
        ops: &Ops,
    ) -> Option<DaemonMessage> {
        self.stop(&r.job_id);
        if self.active.len() >= MAX_FOLLOWS {
            return Some(request_error(
                request_id,
                ErrorCode::TooManyRequests,
                format!("this connection follows {MAX_FOLLOWS} jobs already; unfollow one first"),
                None,
            ));
        }
        self.next += 1;
        let follow = self.next;
        let remote = RemoteFollow {
            ops: ops.clone(),
            host,
            job,
            shown: r.job_id.clone(),
            follow,
            out: self.tx.clone(),
        };
        let task = tokio::spawn(remote.run(request_id, r.offset));
        self.active
            .insert(r.job_id.clone(), (follow, task.abort_handle()));
        None
    }

    /// Starts another follow (of a workspace terminal: `super::pty`), numbered, its pushes
    /// into this session's queue: `task` starts it, given its number and the queue. Replaces
    /// one of the same `key`. `false` (nothing started) when the session follows too many.
    pub(super) fn add(
        &mut self,
        key: &str,
        task: impl FnOnce(u64, mpsc::Sender<Push>) -> tokio::task::JoinHandle<()>,
    ) -> bool {
        self.stop(key);
        if self.active.len() >= MAX_FOLLOWS {
            return false;
        }
        self.next += 1;
        let follow = self.next;
        let task = task(follow, self.tx.clone());
        self.active
            .insert(key.to_string(), (follow, task.abort_handle()));
        true
    }

    /// Ends the follow of `job_id` (or of a terminal); whether there was one.
    pub(super) fn stop(&mut self, job_id: &str) -> bool {
        match self.active.remove(job_id) {
            Some((_, task)) => {
                task.abort();
                true
            }
            None => false,
        }
    }

    /// The next push waiting, if any, without waiting.
    pub(super) fn try_next(&mut self) -> Option<Push> {
        self.rx.try_recv().ok()
    }

    /// The next push (cancel-safe: for `select!`).
    pub(super) async fn next(&mut self) -> Push {
        loop {
            // The session holds a sender itself: the queue never closes.
            if let Some(push) = self.rx.recv().await {
                return push;
            }
        }
    }

    /// Whether `push` is to be sent: its follow is still on. Its `eof` ends the follow.
    pub(super) fn accept(&mut self, push: &Push) -> bool {
        let on = self
            .active
            .iter()
            .find(|(_, (follow, _))| *follow == push.follow)
            .map(|(job, _)| job.clone());
        match on {
            Some(job) => {
                if push.eof {
                    self.active.remove(&job);
                }
                true
            }
            None => false,
        }
    }
}

impl Drop for Follows {
    /// The session ended: so do its follows.
    fn drop(&mut self) {
        for (_, task) in self.active.values() {
            task.abort();
        }
    }
}

/// One follow's task: waits for output, then for room in the session's queue, then reads the
/// next chunk (what there is by then, so a fast job's output goes in full chunks) and queues
/// it; until the `eof` chunk.
async fn push(mut follower: JobFollower, follow: u64, out: mpsc::Sender<Push>) {
    while follower.ready().await {
        let Ok(permit) = out.reserve().await else {
            return; // the session ended
        };
        let Some(chunk) = follower.next_chunk(FOLLOW_CHUNK) else {
            continue;
        };
        let eof = chunk.eof;
        let text = encode_chunk(follower.job_id(), &chunk);
        permit.send(Push { follow, text, eof });
    }
}

/// A follow of another host's job: `job_output` asked over the link, each time from where the
/// last answer ended and waiting up to [`REMOTE_WAIT`] for more, until the chunk with `eof`.
/// A link that fails meanwhile is asked again a second later (the job goes on over there).
struct RemoteFollow {
    ops: Ops,
    host: String,
    /// As the host numbers it.
    job: String,
    /// As the client names it (`job-3@box`).
    shown: String,
    follow: u64,
    out: mpsc::Sender<Push>,
}

/// How long one `job_output` over a link waits for more output.
const REMOTE_WAIT: Duration = Duration::from_secs(20);

impl RemoteFollow {
    async fn run(self, request_id: Option<String>, offset: Option<u64>) {
        // The answer first: the job as its host says, and its first chunk's offset.
        let asked = serde_json::json!({"type": "wait_job", "jobId": self.job, "timeoutMs": 0});
        let job = match self.ops.ask_host(&self.host, asked).await {
            Ok(payload) => {
                serde_json::from_value::<drover_protocol::JobInfo>(payload["job"].clone())
            }
            Err(e) => {
                let refused =
                    request_error(request_id, e.code(), e.to_string(), wire::error_details(&e));
                self.send(encode(&refused), true).await;
                return;
            }
        };
        let Ok(job) = job else {
            let refused = request_error(
                request_id,
                ErrorCode::InvalidMessage,
                format!(
                    "host `{}` answered a job this daemon cannot read",
                    self.host
                ),
                None,
            );
            self.send(encode(&refused), true).await;
            return;
        };
        let mut first = true;
        let mut offset = offset;
        loop {
            let mut asked = serde_json::json!({"type": "job_output", "jobId": self.job,
                "maxBytes": FOLLOW_CHUNK});
            // The first read takes what is kept from `offset` (or the first byte kept); the
            // next ones wait for more.
            if let Some(at) = offset {
                asked["offset"] = at.into();
                if !first {
                    asked["waitMs"] = u64::try_from(REMOTE_WAIT.as_millis())
                        .unwrap_or(u64::MAX)
                        .into();
                }
            }
            let payload = match self.ops.ask_host(&self.host, asked).await {
                Ok(payload) => payload,
                // The link is down: the job goes on over there; asked again in a second.
                Err(OpError::Host(HostError::Unreachable { .. })) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    let why = format!("following job `{}` ended: {e}", self.shown);
                    tracing::info!(host = %self.host, job = %self.job, %why);
                    let ended =
                        request_error(request_id.clone().filter(|_| first), e.code(), why, None);
                    self.send(encode(&ended), true).await;
                    return;
                }
            };
            let number = |key: &str| payload[key].as_u64().unwrap_or_default();
            let chunk = JobChunk {
                offset: number("offset"),
                text: payload["text"].as_str().unwrap_or_default().to_string(),
                next_offset: number("nextOffset"),
                end: number("end"),
                skipped: number("skipped"),
                eof: payload["eof"].as_bool().unwrap_or(false),
            };
            if first {
                first = false;
                let answer = DaemonMessage::answer(
                    request_id.clone(),
                    answers::JobFollowed {
                        job: job.clone(),
                        offset: chunk.offset,
                    },
                );
                self.send(encode(&answer), false).await;
            }
            offset = Some(chunk.next_offset);
            if chunk.text.is_empty() && chunk.skipped == 0 && !chunk.eof {
                continue;
            }
            self.send(encode_chunk(&self.shown, &chunk), chunk.eof)
                .await;
            if chunk.eof {
                return;
            }
        }
    }

    async fn send(&self, text: Utf8Bytes, eof: bool) {
        let _ = self
            .out
            .send(Push {
                follow: self.follow,
                text,
                eof,
            })
            .await;
    }
}

/// The `job_output_update` of `chunk`, as `serde_json` would write it, but by hand: the text is
/// most of it, and `serde_json` escapes it a byte at a time, the most costly step of following
/// a fast job. The buffer is sized for it at once (a chunk is large: growing by doubling
/// would copy it again and leave large free blocks behind).
fn encode_chunk(job_id: &str, chunk: &JobChunk) -> Utf8Bytes {
    use std::io::Write as _;
    // Output is mostly lines: an escaped newline every 8 bytes or more, or one more growth.
    let mut out = Vec::with_capacity(chunk.text.len() + chunk.text.len() / 8 + job_id.len() + 160);
    out.extend_from_slice(br#"{"type":"job_output_update","payload":{"jobId":"#);
    push_json_str(&mut out, job_id);
    // Writing to a Vec cannot fail.
    let _ = write!(out, r#","offset":{},"text":"#, chunk.offset);
    push_json_str(&mut out, &chunk.text);
    let _ = write!(
        out,
        r#","nextOffset":{},"end":{},"skipped":{},"eof":{}}}}}"#,
        chunk.next_offset, chunk.end, chunk.skipped, chunk.eof
    );
    // Text in, escapes and ASCII added: UTF-8.
    Utf8Bytes::try_from(bytes::Bytes::from(out)).unwrap_or_default()
}

/// Appends `text` as a JSON string, quotes included, escaped exactly as `serde_json` does
/// (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control characters as `\u00xx`); runs
/// that need no escape are found eight bytes at a time and copied whole.
fn push_json_str(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    out.push(b'"');
    // `bytes[copied..i]` needs no escape and is not yet in `out`.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8)
            && let Ok(word) = <[u8; 8]>::try_from(word)
            && !needs_escape(u64::from_le_bytes(word))
        {
            i += 8;
            continue;
        }
        let byte = bytes[i];
        let short: &[u8] = match byte {
            b'"' => br#"\""#,
            b'\\' => br"\\",
            0x08 => br"\b",
            0x0c => br"\f",
            b'\n' => br"\n",
            b'\r' => br"\r",
            b'\t' => br"\t",
            0..0x20 => b"",
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[copied..i]);
        if short.is_empty() {
            out.extend_from_slice(br"\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        i += 1;
        copied = i;
    }
    out.extend_from_slice(&bytes[copied..]);
    out.push(b'"');
}

/// Whether any of the eight bytes of `word` is a control character, `"` or `\` (exact: the
/// word tricks of "Bit Twiddling Hacks", haszero and hasless).
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGH != 0;
    below_space
        || has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(word ^ (ONES * u64::from(b'\\')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_encoded(job_id: &str, chunk: &JobChunk) -> String {
        serde_json::to_string(&DaemonMessage::JobOutputUpdate {
            job_id: job_id.to_string(),
            offset: chunk.offset,
            text: chunk.text.clone(),
            next_offset: chunk.next_offset,
            end: chunk.end,
            skipped: chunk.skipped,
            eof: chunk.eof,
        })
        .expect("encodes")
    }

    #[test]
    fn chunks_are_encoded_as_serde_json_encodes_them() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        let texts = [
            String::new(),
            "plain text, no escape at all, longer than a word\n".to_string(),
            every_ascii.clone(),
            every_ascii.chars().rev().collect(),
            "é€𝄞 \u{7f}\u{2028} \"quoted\" back\\slash\ttab\r\n".repeat(5),
            // Escapes at every position of an 8-byte word.
            (0..40)
                .map(|i| if i % 3 == 0 { '"' } else { 'x' })
                .collect(),
            (0..40)
                .map(|i| if i % 7 == 0 { '\u{1}' } else { 'y' })
                .collect(),
            (0..40)
                .map(|i| if i % 5 == 0 { '\\' } else { 'z' })
                .collect(),
        ];
        for (n, text) in texts.into_iter().enumerate() {
            let chunk = JobChunk {
                offset: 7,
                next_offset: 7 + text.len() as u64,
                end: u64::MAX,
                skipped: n as u64,
                eof: n % 2 == 0,
                text,
            };
            let ours = encode_chunk("job-12", &chunk);
            assert_eq!(ours.as_str(), serde_encoded("job-12", &chunk), "text {n}");
        }
    }

    #[test]
    fn the_word_test_finds_each_byte_to_escape_in_each_position() {
        // Among bytes that need none: ASCII, the space, UTF-8's lead and continuation bytes.
        for filler in [b'a', b' ', b'#', b']', 0x7f, 0x80, 0xc3, 0xff] {
            assert!(
                !needs_escape(u64::from_le_bytes([filler; 8])),
                "{filler:#x}"
            );
            for pos in 0..8 {
                for byte in 0u8..=255 {
                    let mut word = [filler; 8];
                    word[pos] = byte;
                    let expected = byte < 0x20 || byte == b'"' || byte == b'\\';
                    assert_eq!(
                        needs_escape(u64::from_le_bytes(word)),
                        expected,
                        "byte {byte:#x} at {pos} among {filler:#x}"
                    );
                }
            }
        }
    }
}
