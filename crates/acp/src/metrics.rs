//! What the runtimes count as it happens, for the daemon's `/metrics`: turns started, turns
//! ended by outcome and how long they ran, and the text the agents streamed. Each is an atomic
//! (or a histogram's own small lock) touched once per event by the agent's task; the daemon
//! registers them in its Prometheus registry ([`RuntimeMetrics::register`]) and reads them
//! at scrape time. What describes the fleet at a moment (agents by status, live runtimes,
//! inbox depth) is not kept here: the daemon computes it from the registry and the runtimes
//! when it is scraped.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// How a turn ended, as `drover_turns_ended_total`'s `outcome` label says: the `event` of its
/// `turn_ended` item without the `turn_` prefix.
pub const OUTCOMES: [&str; 5] = ["completed", "failed", "canceled", "blocked", "interrupted"];

/// The index of `failed` in [`OUTCOMES`].
const FAILED: usize = 1;

/// Upper bounds of the turn-duration histogram, in seconds: a quick answer to an hour's work.
const DURATION_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Stream {
    kind: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The runtimes' counters (cheap to clone: every clone counts into the same metrics).
///
/// The families are what is registered; the series an event touches are taken out of them
/// once, here, so counting is an atomic add (a histogram's observation takes its own short
/// lock, once per turn), never a look-up in a family's map: a streamed chunk is a hot path.
#[derive(Clone, Debug)]
pub struct RuntimeMetrics {
    started: Counter,
    ended: Family<Outcome, Counter>,
    duration: Family<Outcome, Histogram, fn() -> Histogram>,
    streamed: Family<Stream, Counter>,
    /// `ended` and `duration` by outcome, in the order of [`OUTCOMES`].
    ended_by: [Counter; OUTCOMES.len()],
    duration_by: [Option<Histogram>; OUTCOMES.len()],
    streamed_message: Counter,
    streamed_thought: Counter,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        let ended: Family<Outcome, Counter> = Family::default();
        let duration = Family::<Outcome, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        let streamed: Family<Stream, Counter> = Family::default();
        // Every outcome from the start, at 0: a rate over a series that appears late misses
        // its first increase. A blocked turn never ran: it has no duration.
        let ended_by = OUTCOMES.map(|outcome| ended.get_or_create_owned(&Outcome { outcome }));
        let duration_by = OUTCOMES.map(|outcome| {
            (outcome != "blocked").then(|| duration.get_or_create_owned(&Outcome { outcome }))
        });
        let streamed_message = streamed.get_or_create_owned(&Stream { kind: "message" });
        let streamed_thought = streamed.get_or_create_owned(&Stream { kind: "thought" });
        RuntimeMetrics {
            started: Counter::default(),
            ended,
            duration,
            streamed,
            ended_by,
            duration_by,
            streamed_message,
            streamed_thought,
        }
    }
}

impl RuntimeMetrics {
    /// Adds these metrics to `registry` (whose prefix is the daemon's `drover_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "turns_started",
            "Turns started (a prompt sent to an agent)",
            self.started.clone(),
        );
        registry.register(
            "turns_ended",
            "Turns ended, by outcome (blocked: refused by the turn gate before it started; interrupted: the daemon stopped under it)",
            self.ended.clone(),
        );
        registry.register_with_unit(
            "turn_duration",
            "How long turns ran, from the prompt to their end, by outcome",
            Unit::Seconds,
            self.duration.clone(),
        );
        registry.register_with_unit(
            "agent_streamed",
            "Text the agents streamed (message and thought chunks), in bytes of UTF-8",
            Unit::Bytes,
            self.streamed.clone(),
        );
    }

    pub(crate) fn turn_started(&self) {
        self.started.inc();
    }

    /// A turn ended with `event` (`turn_completed`, ...); `ran` is how long, for one that
    /// started. Returns the outcome label.
    pub(crate) fn turn_ended(&self, event: &str, ran: Option<Duration>) -> &'static str {
        let name = event.strip_prefix("turn_").unwrap_or(event);
        // An event this version does not know is counted as a failure.
        let i = OUTCOMES.iter().position(|o| *o == name).unwrap_or(FAILED);
        self.ended_by[i].inc();
        if let (Some(ran), Some(histogram)) = (ran, &self.duration_by[i]) {
            histogram.observe(ran.as_secs_f64());
        }
        OUTCOMES[i]
    }

    /// `bytes` of streamed text, of a thought or of a message.
    pub(crate) fn streamed(&self, thought: bool, bytes: usize) {
        let counter = if thought {
            &self.streamed_thought
        } else {
            &self.streamed_message
        };
        counter.inc_by(bytes as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_exposed_from_the_start_and_counted_by_name() {
        let metrics = RuntimeMetrics::default();
        let mut registry = Registry::with_prefix("drover");
        metrics.register(&mut registry);
        metrics.turn_started();
        assert_eq!(
            metrics.turn_ended("turn_completed", Some(Duration::from_millis(1500))),
            "completed"
        );
        assert_eq!(metrics.turn_ended("turn_blocked", None), "blocked");
        assert_eq!(metrics.turn_ended("something_new", None), "failed");
        metrics.streamed(false, 5);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).expect("encode");
        for line in [
            "drover_turns_started_total 1",
            "drover_turns_ended_total{outcome=\"completed\"} 1",
            "drover_turns_ended_total{outcome=\"blocked\"} 1",
            "drover_turns_ended_total{outcome=\"failed\"} 1",
            "drover_turns_ended_total{outcome=\"canceled\"} 0",
            "drover_turn_duration_seconds_count{outcome=\"completed\"} 1",
            "drover_turn_duration_seconds_bucket{outcome=\"completed\",le=\"2.5\"} 1",
            "drover_turn_duration_seconds_bucket{outcome=\"completed\",le=\"1\"} 0",
            "drover_agent_streamed_bytes_total{kind=\"message\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
