//! Counters of the LLM summarizer: atomics bumped per call, read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::CircuitState;
use crate::summarizer::FailureReason;

/// Counters of the LLM summarizer (a snapshot), for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmStats {
    /// Finished calls to `summarize`, circuit-open ones included.
    pub calls: u64,
    /// Calls that returned a digest.
    pub successes: u64,
    failures: [u64; FailureReason::ALL.len()],
    /// Time spent in calls, summed (divide by `calls` for the mean).
    pub total_duration: Duration,
    /// The breaker's state when the snapshot was taken.
    pub circuit: CircuitState,
}

impl LlmStats {
    /// Failed calls with `reason`.
    pub fn failures(&self, reason: FailureReason) -> u64 {
        self.failures[reason.index()]
    }

    /// Failed calls, all reasons.
    pub fn total_failures(&self) -> u64 {
        self.failures.iter().sum()
    }
}

/// The live counters.
#[derive(Debug, Default)]
pub(super) struct Counters {
    calls: AtomicU64,
    successes: AtomicU64,
    failures: [AtomicU64; FailureReason::ALL.len()],
    micros: AtomicU64,
}

impl Counters {
    /// Counts one call that took `elapsed` and failed with `failure`, if it failed.
    pub(super) fn record(&self, elapsed: Duration, failure: Option<FailureReason>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.micros.fetch_add(micros, Ordering::Relaxed);
        match failure {
            None => self.successes.fetch_add(1, Ordering::Relaxed),
            Some(reason) => self.failures[reason.index()].fetch_add(1, Ordering::Relaxed),
        };
    }

    /// The counters now, with the breaker's `circuit` state.
    pub(super) fn snapshot(&self, circuit: CircuitState) -> LlmStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LlmStats {
            calls: load(&self.calls),
            successes: load(&self.successes),
            failures: std::array::from_fn(|i| load(&self.failures[i])),
            total_duration: Duration::from_micros(load(&self.micros)),
            circuit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_successes_and_failures_by_reason() {
        let c = Counters::default();
        c.record(Duration::from_millis(10), None);
        c.record(Duration::from_millis(5), Some(FailureReason::Timeout));
        c.record(Duration::ZERO, Some(FailureReason::CircuitOpen));
        let s = c.snapshot(CircuitState::Closed);
        assert_eq!((s.calls, s.successes, s.total_failures()), (3, 1, 2));
        assert_eq!(s.failures(FailureReason::Timeout), 1);
        assert_eq!(s.failures(FailureReason::Status), 0);
        assert_eq!(s.total_duration, Duration::from_millis(15));
    }
}
