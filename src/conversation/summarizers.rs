//! Who writes a conversation's digests: the model summarizer bound to the caller (its
//! credential, or `summarizer.api_key`), else the extractive one; every call timed, every
//! failure counted, and (traces exported) every call a span.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use super::Caller;
use crate::metrics::Metrics;
use crate::summarizer::llm::LlmSummarizer;
use crate::summarizer::{
    ExtractiveSummarizer, Summarizer, SummarizerError, SummarizerKind, SummaryInput,
};
use crate::telemetry::span;
use crate::vocab::FailureReason;

/// Which summarizer writes digests.
#[derive(Clone)]
pub enum Summarizers {
    /// Deterministic digests only.
    Extractive,
    /// A model, bound per request to the client's credential.
    Llm(Arc<LlmSummarizer>),
}

impl Summarizers {
    /// The summarizer for a request of `model` from `caller` (the extractive one when
    /// the model summarizer may not serve it), its calls timed into `metrics`.
    pub(super) fn choose(
        &self,
        caller: &Caller,
        model: &str,
        metrics: Option<&Arc<Metrics>>,
    ) -> Arc<dyn Summarizer> {
        let bound = match self {
            Self::Llm(llm) => llm.bind_for(
                caller.credential.clone(),
                model,
                caller.summary_api,
                &caller.summary_headers,
            ),
            Self::Extractive => None,
        };
        let inner: Box<dyn Summarizer> = match bound {
            Some(bound) => Box::new(bound),
            None => Box::new(ExtractiveSummarizer),
        };
        match metrics {
            Some(metrics) => Arc::new(Timed { inner, metrics: metrics.clone() }),
            None => Arc::from(inner),
        }
    }
}

/// A summarizer whose calls are timed and whose failures are counted.
struct Timed {
    inner: Box<dyn Summarizer>,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Summarizer for Timed {
    fn kind(&self) -> SummarizerKind {
        self.inner.kind()
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        let started = Instant::now();
        let span = span::summarize(self.kind());
        let result = self.inner.summarize(input).instrument(span.clone()).await;
        let failure = result.as_ref().err().map(|e| e.reason().unwrap_or(FailureReason::Other));
        self.metrics.summarizer_call(self.kind(), started.elapsed().as_secs_f64(), failure);
        if let Some(reason) = failure {
            span::summarizer_failed(&span, reason);
        }
        result
    }
}
