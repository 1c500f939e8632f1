//! The summarizer a request's own compaction calls: it measures how long the request
//! waited for a digest, keeps that wait within a deadline, and never starts a second
//! call for a conversation whose fold is already being summarized in the background
//! (it defers instead, and the caller waits for that fold to land).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::summarizer::{Summarizer, SummarizerError, SummaryInput};

/// Wraps the summarizer of one request.
pub struct Gate<'a> {
    inner: &'a dyn Summarizer,
    /// A background fold of this conversation is running.
    busy: bool,
    /// Calls give up at this instant (the extractive digest is used instead).
    deadline: Option<Instant>,
    blocked: AtomicBool,
    waited: Mutex<Duration>,
}

impl<'a> Gate<'a> {
    /// `inner` for a request; `busy` when a background fold of its conversation runs.
    pub fn new(inner: &'a dyn Summarizer, busy: bool, deadline: Option<Instant>) -> Self {
        Self { inner, busy, deadline, blocked: AtomicBool::new(false), waited: Mutex::default() }
    }

    /// True when a fold was needed while the background fold ran (nothing was called).
    pub fn blocked(&self) -> bool {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Time spent in summarizer calls.
    pub fn waited(&self) -> Duration {
        self.waited.lock().map(|w| *w).unwrap_or_default()
    }
}

#[async_trait]
impl Summarizer for Gate<'_> {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        self.inner.kind()
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<crate::summarizer::ModelPrompt> {
        self.inner.prompt(input)
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        if self.busy {
            self.blocked.store(true, Ordering::Relaxed);
            return Err(SummarizerError::Deferred);
        }
        let started = Instant::now();
        let result = match self.deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(started);
                tokio::time::timeout(left, self.inner.summarize(input))
                    .await
                    .unwrap_or(Err(SummarizerError::Timeout))
            }
            None => self.inner.summarize(input).await,
        };
        if let Ok(mut waited) = self.waited.lock() {
            *waited += started.elapsed();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::Message;

    /// Answers after `delay`.
    struct Slow(Duration);

    #[async_trait]
    impl Summarizer for Slow {
        fn kind(&self) -> crate::vocab::SummarizerKind {
            crate::vocab::SummarizerKind::Llm
        }

        async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
            tokio::time::sleep(self.0).await;
            Ok("digest".to_owned())
        }
    }

    fn input(messages: &[Arc<Message>]) -> SummaryInput<'_> {
        SummaryInput {
            messages,
            prior_digest: None,
            max_tokens: 100,
            kind: crate::summarizer::DigestKind::Fold,
            shared: None,
            instructions: None,
        }
    }

    #[tokio::test]
    async fn a_busy_conversation_defers_without_calling() {
        let slow = Slow(Duration::from_secs(5));
        let gate = Gate::new(&slow, true, None);
        assert!(matches!(gate.summarize(input(&[])).await, Err(SummarizerError::Deferred)));
        assert!(gate.blocked());
        assert_eq!(gate.waited(), Duration::ZERO);
    }

    #[tokio::test]
    async fn calls_end_at_the_deadline_and_the_wait_is_measured() {
        let slow = Slow(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_millis(50);
        let gate = Gate::new(&slow, false, Some(deadline));
        assert!(matches!(gate.summarize(input(&[])).await, Err(SummarizerError::Timeout)));
        assert!(!gate.blocked());
        let waited = gate.waited();
        assert!(
            waited >= Duration::from_millis(40) && waited < Duration::from_secs(2),
            "{waited:?}"
        );

        let quick = Slow(Duration::from_millis(10));
        let gate = Gate::new(&quick, false, Some(Instant::now() + Duration::from_secs(5)));
        assert_eq!(gate.summarize(input(&[])).await.unwrap(), "digest");
        assert!(gate.waited() >= Duration::from_millis(10));
    }
}
