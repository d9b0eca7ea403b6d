//! Usage limits: whether a failed turn failed on the provider's rate or usage limit, as the
//! pinned agents say it, and when the limit resets where they say.
//!
//! What each agent answers `session/prompt` with, when its model API sends HTTP 429 (checked
//! with the pinned agents against the scripted model, `tests/e2e/real_agents_limits.rs`):
//!
//! - codex-acp 0.16, -32603 `Internal error` with its words in `data` (the `OpenAI` API's
//!   `usage_limit_reached`): "You've hit your usage limit. Try again
//!   at 4:57 PM." (the reset in the agent's local time, to the minute; a later day as
//!   "Dec 6th, 2026 4:57 PM"), or "… Try again later." when the API gave no reset time; other
//!   429s, once its own retries are spent: "exceeded retry limit, last status: 429 Too Many
//!   Requests".
//! - claude-agent-acp 0.23, -32603 "Internal error: " and Claude Code's result text (it retries
//!   a 429 ten times first, unless `CLAUDE_CODE_MAX_RETRIES` says otherwise):
//!   `API Error: 429 {…"rate_limit_error"…}`,
//!   or a subscription's "You've hit your session limit · resets 5am" (no time drover reads:
//!   the backoff) or, older, `Claude AI usage limit reached|<unix seconds of the reset>`.
//! - gemini-cli 0.61, the code 429 and its quota error's message: "You have exhausted your
//!   daily quota on this model." (a daily quota), or the API's "You exceeded your current
//!   quota … Please retry in 400s." for a delay longer than it waits itself; a shorter limit it
//!   retries itself (ten times, 5 to 30 s apart) before it says anything.
//!
//! Anything else that says "rate limit", "usage limit" or "Too Many Requests" counts too.

use jiff::civil::Time;
use jiff::{SignedDuration, Timestamp, ToSpan, ZonedDateTime};

/// A limit hit, and when it is surely over if the agent said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LimitHit {
    pub(crate) reset_at: Option<Timestamp>,
}

/// Phrases (lower case) that say a limit was hit.
const LIMIT_PHRASES: &[&str] = &[
    "hit your usage limit",
    "you've hit your",
    "usage limit reached",
    "usage_limit_reached",
    "hit your limit",
    "rate_limit_error",
    "rate limit",
    "rate-limit",
    "ratelimit",
    "too many requests",
    "last status: 429",
    "api error: 429",
    "resource_exhausted",
    "exceeded your current quota",
    "exhausted your daily quota",
    "exhausted your capacity",
    // How drover words an error whose JSON-RPC code is the HTTP status (gemini-cli).
    "with error 429:",
];

/// Whether `error` (an agent's failed turn, as drover words it) is a usage or rate limit, and
/// its reset time; `now` is the local time the agent's words are read in.
pub(crate) fn recognize(error: &str, now: &ZonedDateTime) -> Option<LimitHit> {
    let lower = error.to_lowercase();
    if !LIMIT_PHRASES.iter().any(|p| lower.contains(p)) {
        return None;
    }
    let reset_at = try_again_at(error, now)
        .or_else(|| retry_in(&lower, now.timestamp()))
        .or_else(|| unix_reset(error));
    Some(LimitHit { reset_at })
}

/// codex's "Try again at 4:57 PM." (today, else tomorrow) or "Try again at Dec 6th, 2026
/// 4:57 PM.": the minute it names is the reset's, so the limit is surely over a minute later.
fn try_again_at(error: &str, now: &ZonedDateTime) -> Option<Timestamp> {
    let lower = error.to_lowercase();
    let start = lower.find("try again at ")? + "try again at ".len();
    let rest = &error[start..];
    let end = rest.find(['.', ')', '\n']).unwrap_or(rest.len());
    let text = rest[..end].trim();
    let minute = if let Ok(time) = Time::strptime("%I:%M %p", text) {
        let today = now.date().to_zoned_datetime(now.time_zone().clone()).ok()?;
        let at = today.with().time(time).build().ok()?;
        // Minute precision: a time this minute or just before is now, not tomorrow.
        if at.timestamp() < now.timestamp() - SignedDuration::from_mins(5) {
            at.checked_add(1.day()).ok()?
        } else {
            at
        }
    } else {
        let mut words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        // "6th," → "6,".
        if let Some(day) = words.get_mut(1) {
            *day = day
                .trim_end_matches(',')
                .trim_end_matches(char::is_alphabetic)
                .to_string()
                + ",";
        }
        let civil = jiff::civil::DateTime::strptime("%b %d, %Y %I:%M %p", words.join(" ")).ok()?;
        civil.to_zoned_datetime(now.time_zone().clone()).ok()?
    };
    minute
        .timestamp()
        .checked_add(SignedDuration::from_mins(1))
        .ok()
}

/// "retry in 37.5s", "retryDelay": "30s", "retry after 30 seconds", "retry-after: 30".
fn retry_in(lower: &str, now: Timestamp) -> Option<Timestamp> {
    for key in [
        "retry in ",
        "retrydelay\":\"",
        "retrydelay\": \"",
        "retry after ",
        "retry-after: ",
    ] {
        let Some(at) = lower.find(key) else { continue };
        let number: String = lower[at + key.len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        if let Ok(seconds) = number.parse::<f64>()
            && seconds.is_finite()
            && (0.0..=7.0 * 86_400.0).contains(&seconds)
        {
            return now
                .checked_add(SignedDuration::from_secs_f64(seconds.ceil()))
                .ok();
        }
    }
    None
}

/// claude's "Claude AI usage limit reached|1767052800", or a `"resets_at": 1767052800`.
fn unix_reset(error: &str) -> Option<Timestamp> {
    let after = error
        .split_once("limit reached|")
        .map(|(_, rest)| rest)
        .or_else(|| {
            error
                .split_once("resets_at\":")
                .map(|(_, rest)| rest.trim_start())
        })?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    Timestamp::from_second(digits.parse().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> ZonedDateTime {
        text.parse().expect("zoned")
    }

    #[test]
    fn codex_says_the_reset_minute_in_local_time() {
        let now = at("2026-12-05T16:57:09+00:00[UTC]");
        let hit = recognize(
            "the agent answered `session/prompt` with error -32603: Internal error (You've hit your usage limit. Try again at 4:57 PM.)",
            &now,
        )
        .expect("a limit");
        assert_eq!(
            hit.reset_at,
            Some("2026-12-05T16:58:00Z".parse().expect("ts"))
        );
        // An earlier time of day is tomorrow's.
        let hit = recognize("You've hit your usage limit. Try again at 3:05 AM.", &now);
        assert_eq!(
            hit.and_then(|h| h.reset_at),
            Some("2026-12-06T03:06:00Z".parse().expect("ts"))
        );
        let hit = recognize(
            "You've hit your usage limit. Upgrade to Pro or try again at Dec 7th, 2026 1:30 PM.",
            &now,
        );
        assert_eq!(
            hit.and_then(|h| h.reset_at),
            Some("2026-12-07T13:31:00Z".parse().expect("ts"))
        );
        let hit = recognize("You've hit your usage limit. Try again later.", &now);
        assert_eq!(hit, Some(LimitHit { reset_at: None }));
    }

    #[test]
    fn claude_and_gemini_and_the_rest() {
        let now = at("2026-12-05T16:57:09+00:00[UTC]");
        let ts = |s: &str| Some(s.parse::<Timestamp>().expect("ts"));
        let claude = r#"Internal error (API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit."}})"#;
        assert_eq!(recognize(claude, &now), Some(LimitHit { reset_at: None }));
        let plan = "Internal error (You've hit your weekly limit · resets Dec 8, 5am (UTC))";
        assert_eq!(recognize(plan, &now), Some(LimitHit { reset_at: None }));
        let sub = "Internal error (Claude AI usage limit reached|1796489400)";
        assert_eq!(
            recognize(sub, &now).and_then(|h| h.reset_at),
            Timestamp::from_second(1_796_489_400).ok()
        );
        let gemini =
            "Internal error ([API Error: You exceeded your current quota. Please retry in 37.2s.])";
        assert_eq!(
            recognize(gemini, &now).and_then(|h| h.reset_at),
            ts("2026-12-05T16:57:47Z")
        );
        let detail = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"30s"}]}}"#;
        assert_eq!(
            recognize(detail, &now).and_then(|h| h.reset_at),
            ts("2026-12-05T16:57:39Z")
        );
        assert!(
            recognize(
                "exceeded retry limit, last status: 429 Too Many Requests",
                &now
            )
            .is_some()
        );
        // Not a limit.
        assert_eq!(
            recognize(
                "Internal error (stream disconnected before completion)",
                &now
            ),
            None
        );
        assert_eq!(recognize("permission denied: limit of 3 files", &now), None);
    }
}
