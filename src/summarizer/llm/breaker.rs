//! The circuit breaker of the model path.
//!
//! Closed: every call goes through and consecutive failures are counted. At the
//! threshold it opens for the cooldown: calls fail at once, without touching the
//! network, and the engine uses the extractive digest. When the cooldown has passed,
//! one trial call is let through (half-open) while the others keep failing fast; a
//! success closes the breaker, a failure opens it for another cooldown. A trial whose
//! outcome never arrives (its call was cancelled) expires after one cooldown, so the
//! breaker cannot stay half-open forever.
//!
//! Time is passed in, so the state machine is tested with explicit instants.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What the breaker is doing, for a gauge or an admin view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls go through.
    Closed,
    /// Calls fail fast until the cooldown ends.
    Open,
    /// One trial call is in flight; the others fail fast.
    HalfOpen,
}

/// How a call that the breaker let through ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// The model path works.
    Success,
    /// The model path failed (counts towards the threshold).
    Failure,
    /// The call said nothing about the model path (e.g. the client's own key was
    /// rejected): the count is unchanged, and a trial is released.
    Neutral,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { trial_since: Instant },
}

/// A consecutive-failure circuit breaker; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// Opens after `threshold` (at least 1) consecutive failures, for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain value: a panic elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// May a call start at `now`? `false`: fail fast. Half-open admits one trial.
    pub fn admit(&self, now: Instant) -> bool {
        let mut state = self.lock();
        let trial = match *state {
            State::Closed { .. } => return true,
            State::Open { until } => now >= until,
            State::HalfOpen { trial_since } => now >= trial_since + self.cooldown,
        };
        if trial {
            *state = State::HalfOpen { trial_since: now };
        }
        trial
    }

    /// Records how an admitted call ended at `now`.
    pub fn record(&self, now: Instant, outcome: CallResult) {
        let mut state = self.lock();
        *state = match (outcome, *state) {
            (CallResult::Success, _) => State::Closed { failures: 0 },
            (CallResult::Failure, State::Closed { failures }) if failures + 1 < self.threshold => {
                State::Closed { failures: failures + 1 }
            }
            (CallResult::Failure, State::Closed { .. } | State::HalfOpen { .. }) => {
                State::Open { until: now + self.cooldown }
            }
            // A call admitted before the breaker opened: the cooldown already runs.
            (CallResult::Failure | CallResult::Neutral, open @ State::Open { .. }) => open,
            (CallResult::Neutral, State::HalfOpen { .. }) => State::Open { until: now },
            (CallResult::Neutral, closed @ State::Closed { .. }) => closed,
        };
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> CircuitState {
        match *self.lock() {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if now >= until => CircuitState::HalfOpen,
            State::Open { .. } => CircuitState::Open,
            State::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(30);

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn opens_after_threshold_consecutive_failures_only() {
        let b = Breaker::new(3, COOL);
        let t0 = Instant::now();
        for _ in 0..2 {
            assert!(b.admit(t0));
            b.record(t0, CallResult::Failure);
        }
        // A success in between resets the count.
        b.record(t0, CallResult::Success);
        for _ in 0..2 {
            assert!(b.admit(t0));
            b.record(t0, CallResult::Failure);
        }
        assert_eq!(b.state(t0), CircuitState::Closed);
        assert!(b.admit(t0));
        b.record(t0, CallResult::Failure);
        assert_eq!(b.state(t0), CircuitState::Open);
        assert!(!b.admit(at(t0, 1)));
        assert!(!b.admit(at(t0, 29)));
    }

    #[test]
    fn after_cooldown_one_trial_then_success_closes() {
        let b = Breaker::new(1, COOL);
        let t0 = Instant::now();
        b.record(t0, CallResult::Failure);
        assert!(!b.admit(at(t0, 10)));
        assert_eq!(b.state(at(t0, 30)), CircuitState::HalfOpen);
        assert!(b.admit(at(t0, 30)), "the trial");
        assert!(!b.admit(at(t0, 31)), "only one trial at a time");
        b.record(at(t0, 32), CallResult::Success);
        assert_eq!(b.state(at(t0, 32)), CircuitState::Closed);
        assert!(b.admit(at(t0, 32)));
        assert!(b.admit(at(t0, 32)));
    }

    #[test]
    fn failed_trial_reopens_for_a_full_cooldown() {
        let b = Breaker::new(2, COOL);
        let t0 = Instant::now();
        b.record(t0, CallResult::Failure);
        b.record(t0, CallResult::Failure);
        assert!(b.admit(at(t0, 30)));
        b.record(at(t0, 35), CallResult::Failure);
        assert!(!b.admit(at(t0, 36)));
        assert!(!b.admit(at(t0, 64)));
        assert!(b.admit(at(t0, 65)));
    }

    #[test]
    fn lost_trial_expires_and_neutral_trial_is_released() {
        let b = Breaker::new(1, COOL);
        let t0 = Instant::now();
        b.record(t0, CallResult::Failure);
        assert!(b.admit(at(t0, 30)));
        // The trial's outcome never comes (cancelled): after a cooldown, another trial.
        assert!(!b.admit(at(t0, 59)));
        assert!(b.admit(at(t0, 60)));
        // A neutral outcome releases the trial at once.
        b.record(at(t0, 61), CallResult::Neutral);
        assert!(b.admit(at(t0, 61)));
        assert!(!b.admit(at(t0, 61)));
    }

    #[test]
    fn late_results_do_not_extend_an_open_breaker_and_neutral_does_not_count() {
        let b = Breaker::new(2, COOL);
        let t0 = Instant::now();
        b.record(t0, CallResult::Failure);
        b.record(t0, CallResult::Neutral);
        assert_eq!(b.state(t0), CircuitState::Closed);
        b.record(t0, CallResult::Failure);
        assert_eq!(b.state(t0), CircuitState::Open);
        // A call admitted earlier fails late: the cooldown still ends at t0 + 30 s.
        b.record(at(t0, 20), CallResult::Failure);
        assert!(b.admit(at(t0, 30)));
    }
}
