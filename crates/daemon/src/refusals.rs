//! The warning for requests refused for a foreign `Host` or `Origin`, rate-limited: any web
//! page the user visits can send such requests, as many as it likes, and each must not cost a
//! line of `daemon.log`. The first refusal is logged at once; after it, at most one line a
//! minute says how many came since, naming the latest.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one warning line per window.
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct State {
    /// When the last line was written.
    logged_at: Option<Instant>,
    /// Refusals since that line, not yet reported.
    unreported: u64,
}

/// Counts refusals and says when one should be written (cheap to share behind an `Arc`).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    state: Mutex<State>,
}

impl Refusals {
    /// Records one refusal at `now`: `Some(n)` when a line is due now, reporting `n`
    /// refusals (this one included), `None` when it is only counted.
    pub(crate) fn refused(&self, now: Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.unreported += 1;
        let due = state
            .logged_at
            .is_none_or(|at| now.saturating_duration_since(at) >= WINDOW);
        if !due {
            return None;
        }
        state.logged_at = Some(now);
        Some(std::mem::take(&mut state.unreported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_line_a_minute_with_the_count() {
        let refusals = Refusals::default();
        let t0 = Instant::now();
        assert_eq!(refusals.refused(t0), Some(1));
        for s in 1..60 {
            assert_eq!(refusals.refused(t0 + Duration::from_secs(s)), None);
        }
        // The 59 counted since, and this one.
        assert_eq!(refusals.refused(t0 + WINDOW), Some(60));
        assert_eq!(refusals.refused(t0 + WINDOW + Duration::from_secs(1)), None);
        // Long quiet: the next one is logged at once with what was left unreported.
        assert_eq!(refusals.refused(t0 + WINDOW * 10), Some(2));
    }
}
