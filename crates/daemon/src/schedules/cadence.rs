//! When a schedule fires: once at a time, every fixed duration from an anchor, or by a cron
//! expression in a named time zone (parsed and searched by `croner`, on jiff's zoned times).

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::str::FromStr;

use croner::{CivilDate, CivilDateTime, CivilTime, Cron, CronDateTime, Resolution, Weekday};
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp, ZonedDateTime};
use serde::{Deserialize, Serialize};

/// The shortest `every`: a schedule is a timetable for agents, not a busy loop.
pub(crate) const MIN_EVERY_SECS: u64 = 1;

/// A cadence as stored and as clients send it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub(crate) enum Cadence {
    /// Once, at `at`.
    Once { at: Timestamp },
    /// At `from`, then every `every_secs` seconds after it.
    Every { every_secs: u64, from: Timestamp },
    /// By a cron expression (5 fields, or 6 with seconds first) read in `time_zone` (an IANA
    /// name such as `Europe/Paris`; `UTC` by default).
    Cron { expr: String, time_zone: String },
}

/// Why a cadence cannot be used, for the client's error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CadenceError {
    #[error("`{expr}` is not a cron expression: {reason}")]
    Cron { expr: String, reason: String },
    #[error("`{0}` is not a time zone this machine knows (an IANA name such as `Europe/Paris`)")]
    TimeZone(String),
    #[error("`every` must be at least {MIN_EVERY_SECS} second")]
    TooShort,
}

/// A cadence ready to answer "when next?".
#[derive(Debug, Clone)]
pub(crate) enum Compiled {
    Once(Timestamp),
    Every { every: i64, from: Timestamp },
    Cron { cron: Box<Cron>, tz: TimeZone },
}

impl Cadence {
    /// Checks and compiles it.
    pub(crate) fn compile(&self) -> Result<Compiled, CadenceError> {
        match self {
            Cadence::Once { at } => Ok(Compiled::Once(*at)),
            Cadence::Every { every_secs, from } => {
                if *every_secs < MIN_EVERY_SECS {
                    return Err(CadenceError::TooShort);
                }
                Ok(Compiled::Every {
                    every: i64::try_from(*every_secs).unwrap_or(i64::MAX),
                    from: *from,
                })
            }
            Cadence::Cron { expr, time_zone } => {
                let cron = Cron::from_str(expr).map_err(|e| CadenceError::Cron {
                    expr: expr.clone(),
                    reason: e.to_string(),
                })?;
                let tz = TimeZone::get(time_zone)
                    .map_err(|_| CadenceError::TimeZone(time_zone.clone()))?;
                Ok(Compiled::Cron {
                    cron: Box::new(cron),
                    tz,
                })
            }
        }
    }

    /// Whether it fires more than once.
    pub(crate) fn recurs(&self) -> bool {
        !matches!(self, Cadence::Once { .. })
    }

    /// One line for people: `once at …`, `every 1h`, `cron 0 9 * * 1-5 (Europe/Paris)`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Cadence::Once { at } => format!("once at {at}"),
            Cadence::Every { every_secs, .. } => {
                format!("every {}", human_secs(*every_secs))
            }
            Cadence::Cron { expr, time_zone } => format!("cron {expr} ({time_zone})"),
        }
    }
}

/// `90` → `1m30s`, `7200` → `2h`.
pub(crate) fn human_secs(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(d, "d"), (h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            // Writing to a `String` cannot fail.
            let _ = write!(out, "{n}{unit}");
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

impl Compiled {
    /// The first occurrence strictly after `t`.
    pub(crate) fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Compiled::Once(at) => (*at > t).then_some(*at),
            Compiled::Every { every, from } => {
                if t < *from {
                    return Some(*from);
                }
                let elapsed = t.duration_since(*from).as_secs();
                let k = elapsed / every + 1;
                from.checked_add(SignedDuration::from_secs(k.checked_mul(*every)?))
                    .ok()
            }
            Compiled::Cron { cron, tz } => {
                let start = Zoned(t.to_zoned_datetime(tz.clone()));
                cron.find_next_occurrence(&start, false)
                    .ok()
                    .map(|z| z.0.timestamp())
            }
        }
    }

    /// The last occurrence at or before `t`: what a schedule that missed its times while the
    /// daemon was down runs once.
    pub(crate) fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Compiled::Once(at) => (*at <= t).then_some(*at),
            Compiled::Every { every, from } => {
                if t < *from {
                    return None;
                }
                let elapsed = t.duration_since(*from).as_secs();
                let k = elapsed / every;
                from.checked_add(SignedDuration::from_secs(k.checked_mul(*every)?))
                    .ok()
            }
            Compiled::Cron { cron, tz } => {
                let start = Zoned(t.to_zoned_datetime(tz.clone()));
                cron.find_previous_occurrence(&start, true)
                    .ok()
                    .map(|z| z.0.timestamp())
            }
        }
    }
}

/// jiff's zoned date and time as croner searches it (croner ships an adapter for an older
/// jiff; drover's is 1.x, and the adapter is these few lines).
#[derive(Debug, Clone)]
struct Zoned(ZonedDateTime);

fn civil_of(dt: DateTime) -> CivilDateTime {
    // jiff keeps every part in range, so the parts are valid as they are.
    CivilDateTime::new(
        CivilDate::from_parts_unchecked(
            i32::from(dt.year()),
            u32::from(dt.month().unsigned_abs()),
            u32::from(dt.day().unsigned_abs()),
        ),
        CivilTime::from_parts_unchecked(
            u32::from(dt.hour().unsigned_abs()),
            u32::from(dt.minute().unsigned_abs()),
            u32::from(dt.second().unsigned_abs()),
        ),
    )
}

fn datetime_of(civil: CivilDateTime) -> Result<DateTime, croner::errors::CronError> {
    let part = |n: u32| i8::try_from(n).map_err(|_| croner::errors::CronError::InvalidTime);
    DateTime::new(
        i16::try_from(civil.year()).map_err(|_| croner::errors::CronError::InvalidDate)?,
        part(civil.month())?,
        part(civil.day())?,
        part(civil.hour())?,
        part(civil.minute())?,
        part(civil.second())?,
        0,
    )
    .map_err(|_| croner::errors::CronError::InvalidDate)
}

impl CronDateTime for Zoned {
    fn to_civil(&self) -> CivilDateTime {
        civil_of(self.0.datetime())
    }

    fn civil_weekday(&self) -> Weekday {
        Weekday::from_days_from_sunday(u32::from(
            self.0.weekday().to_sunday_zero_offset().unsigned_abs(),
        ))
    }

    fn resolve_civil(
        &self,
        civil: CivilDateTime,
    ) -> Result<Resolution<Self>, croner::errors::CronError> {
        let invalid = |_| croner::errors::CronError::InvalidTime;
        let ambiguous = self
            .0
            .time_zone()
            .to_ambiguous_zoned_datetime(datetime_of(civil)?);
        Ok(match ambiguous.offset() {
            AmbiguousOffset::Unambiguous { .. } => {
                Resolution::Single(Zoned(ambiguous.unambiguous().map_err(invalid)?))
            }
            AmbiguousOffset::Fold { .. } => Resolution::Ambiguous(
                Zoned(ambiguous.clone().earlier().map_err(invalid)?),
                Zoned(ambiguous.later().map_err(invalid)?),
            ),
            AmbiguousOffset::Gap { .. } => Resolution::Gap,
        })
    }

    fn checked_add_seconds(&self, seconds: i64) -> Option<Self> {
        self.0
            .checked_add(SignedDuration::from_secs(seconds))
            .ok()
            .map(Zoned)
    }

    fn cmp_instant(&self, other: &Self) -> Ordering {
        self.0.timestamp().cmp(&other.0.timestamp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn cron(expr: &str, tz: &str) -> Compiled {
        Cadence::Cron {
            expr: expr.into(),
            time_zone: tz.into(),
        }
        .compile()
        .expect("compiles")
    }

    #[test]
    fn every_keeps_to_its_grid() {
        let c = Cadence::Every {
            every_secs: 600,
            from: ts("2026-12-01T10:00:00Z"),
        }
        .compile()
        .expect("compiles");
        assert_eq!(
            c.next_after(ts("2026-12-01T09:00:00Z")),
            Some(ts("2026-12-01T10:00:00Z"))
        );
        assert_eq!(
            c.next_after(ts("2026-12-01T10:00:00Z")),
            Some(ts("2026-12-01T10:10:00Z"))
        );
        // Late by 3 minutes: the next is still on the grid, no drift.
        assert_eq!(
            c.next_after(ts("2026-12-01T10:13:00Z")),
            Some(ts("2026-12-01T10:20:00Z"))
        );
        assert_eq!(
            c.latest_at_or_before(ts("2026-12-01T13:07:00Z")),
            Some(ts("2026-12-01T13:00:00Z"))
        );
        assert_eq!(c.latest_at_or_before(ts("2026-12-01T09:59:59Z")), None);
    }

    #[test]
    fn a_daily_cron_keeps_its_local_hour_across_dst() {
        // Paris leaves summer time on 2026-10-25: 09:00 is 07:00Z before, 08:00Z after.
        let c = cron("0 9 * * *", "Europe/Paris");
        let first = c.next_after(ts("2026-10-24T06:00:00Z")).expect("next");
        assert_eq!(first, ts("2026-10-24T07:00:00Z"));
        let second = c.next_after(first).expect("next");
        assert_eq!(second, ts("2026-10-25T08:00:00Z"));
        // And back on 2027-03-28.
        let spring = c.next_after(ts("2027-03-27T12:00:00Z")).expect("next");
        assert_eq!(spring, ts("2027-03-28T07:00:00Z"));
    }

    #[test]
    fn a_cron_in_the_repeated_hour_fires_once() {
        // New York repeats 01:00-02:00 on 2026-11-01: 01:30 happens twice, fires once.
        let c = cron("30 1 * * *", "America/New_York");
        let first = c.next_after(ts("2026-11-01T00:00:00Z")).expect("next");
        assert_eq!(first, ts("2026-11-01T05:30:00Z"), "the first 01:30 (EDT)");
        let second = c.next_after(first).expect("next");
        assert_eq!(
            second,
            ts("2026-11-02T06:30:00Z"),
            "the next day's, not the repeat"
        );
    }

    #[test]
    fn a_cron_in_the_skipped_hour_still_fires_that_day() {
        // Paris skips 02:00-03:00 on 2027-03-28: a 02:30 job runs once that day, not never.
        let c = cron("30 2 * * *", "Europe/Paris");
        let day_before = c.next_after(ts("2027-03-27T00:00:00Z")).expect("next");
        assert_eq!(day_before, ts("2027-03-27T01:30:00Z"));
        let in_gap = c.next_after(day_before).expect("next");
        let day_after = c.next_after(in_gap).expect("next");
        assert!(
            in_gap > ts("2027-03-28T00:00:00Z") && in_gap < ts("2027-03-28T02:00:00Z"),
            "{in_gap}"
        );
        assert_eq!(day_after, ts("2027-03-29T00:30:00Z"));
    }

    #[test]
    fn weekday_crons_skip_the_weekend() {
        let c = cron("0 9 * * 1-5", "UTC");
        // Friday 2026-12-04 after 09:00 → Monday 2026-12-07.
        assert_eq!(
            c.next_after(ts("2026-12-04T10:00:00Z")),
            Some(ts("2026-12-07T09:00:00Z"))
        );
        assert_eq!(
            c.latest_at_or_before(ts("2026-12-06T10:00:00Z")),
            Some(ts("2026-12-04T09:00:00Z"))
        );
    }

    #[test]
    fn bad_cadences_say_what_is_wrong() {
        let e = Cadence::Cron {
            expr: "61 * * * *".into(),
            time_zone: "UTC".into(),
        }
        .compile()
        .expect_err("minute 61");
        assert!(e.to_string().contains("61 * * * *"), "{e}");
        let e = Cadence::Cron {
            expr: "0 9 * * *".into(),
            time_zone: "Mars/Olympus".into(),
        }
        .compile()
        .expect_err("zone");
        assert!(e.to_string().contains("Mars/Olympus"), "{e}");
        assert_eq!(
            Cadence::Every {
                every_secs: 0,
                from: ts("2026-12-01T10:00:00Z")
            }
            .compile()
            .expect_err("zero"),
            CadenceError::TooShort
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_secs(90), "1m30s");
        assert_eq!(human_secs(7200), "2h");
        assert_eq!(human_secs(86_400 + 60), "1d1m");
    }
}
