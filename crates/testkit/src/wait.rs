//! Waiting in a test for something to become true: poll a check until it holds, bounded in
//! time (a deadline) and in count (at most one poll per [`EVERY`] of it, plus one), so that a
//! check that never holds fails the test with the name of what it waited for instead of
//! hanging it.
//!
//! A check answers `true`/`false`, or `Some(value)`/`None` to hand back what it found.
//! [`eventually`] panics when the time is up; [`poll_until`] (and [`poll_until_blocking`] for
//! tests on plain threads) returns `None` instead, for a caller whose own assertion says more.
//! The async forms use tokio's clock, so they also work in tests with paused time.

use std::fmt::Display;
use std::time::Duration;

/// How long a poll waits before it looks again.
pub const EVERY: Duration = Duration::from_millis(10);

/// What a check answers: whether what is waited for holds and, if it does, what it found.
pub trait Outcome {
    type Value;
    fn done(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    #[inline]
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn done(self) -> Option<T> {
        self
    }
}

/// The bounds of one wait: how many polls are left and until when.
struct Budget {
    within: Duration,
    polls_left: u128,
}

impl Budget {
    // Inline, like the generic polls: a test that waits links none of the rest of testkit.
    #[inline]
    fn new(within: Duration) -> Budget {
        Budget {
            within,
            polls_left: within.as_nanos() / EVERY.as_nanos() + 1,
        }
    }

    /// After a failed poll at `elapsed`: how long to sleep before the next one, or `None` when
    /// the budget is spent.
    #[inline]
    fn next(&mut self, elapsed: Duration) -> Option<Duration> {
        if self.polls_left == 0 || elapsed >= self.within {
            return None;
        }
        self.polls_left -= 1;
        Some(EVERY.min(self.within.saturating_sub(elapsed)))
    }
}

/// Polls `check` until it holds and returns what it found; `None` if the budget (`within`,
/// polled every [`EVERY`]) ran out first. The check runs once more at the deadline.
pub async fn poll_until<O: Outcome>(
    within: Duration,
    mut check: impl AsyncFnMut() -> O,
) -> Option<O::Value> {
    let start = tokio::time::Instant::now();
    let mut budget = Budget::new(within);
    loop {
        if let Some(value) = check().await.done() {
            return Some(value);
        }
        let wait = budget.next(start.elapsed())?;
        tokio::time::sleep(wait).await;
    }
}

/// Polls `check` until it holds and returns what it found; panics, naming `what`, when it did
/// not hold within `within`.
pub async fn eventually<O: Outcome>(
    what: impl Display,
    within: Duration,
    check: impl AsyncFnMut() -> O,
) -> O::Value {
    match poll_until(within, check).await {
        Some(value) => value,
        None => panic!("timed out after {within:?} waiting for {what}"),
    }
}

/// [`poll_until`] for a test on plain threads: sleeps the thread between polls.
pub fn poll_until_blocking<O: Outcome>(
    within: Duration,
    mut check: impl FnMut() -> O,
) -> Option<O::Value> {
    let start = std::time::Instant::now();
    let mut budget = Budget::new(within);
    loop {
        if let Some(value) = check().done() {
            return Some(value);
        }
        let wait = budget.next(start.elapsed())?;
        std::thread::sleep(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_that_never_holds_is_polled_a_bounded_number_of_times() {
        let mut polls = 0;
        let found = poll_until_blocking(Duration::from_millis(50), || {
            polls += 1;
            false
        });
        assert_eq!(found, None);
        assert!((2..=7).contains(&polls), "{polls} polls");
    }

    #[tokio::test]
    async fn what_a_check_finds_is_handed_back() {
        let mut polls = 0;
        let found = eventually("the third poll", Duration::from_secs(5), async || {
            polls += 1;
            (polls == 3).then_some(polls)
        })
        .await;
        assert_eq!(found, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 50ms waiting for the impossible")]
    async fn eventually_names_what_it_waited_for() {
        eventually("the impossible", Duration::from_millis(50), async || false).await;
    }
}
