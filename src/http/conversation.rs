//! The conversation service: one request of a conversation, whatever its API shape. It
//! decides what to forward (the quick decision from the outline, or the compactor's
//! session transaction on the compaction runtime), picks the summarizer, compacts deeper
//! after an overflow error, and records the outcome. It forwards nothing itself: the
//! handler sends the body it gets and tags the answer (`super::chat`).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};

use super::dialect::Dialect;
use crate::compaction::{Options, Tier, TokenRatio};
use crate::compactor::{ChatOutcome, Compactor, Decision, windows};
use crate::metrics::{self, Metrics, OverflowRetry, WindowEvent, model_label};
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::{Credential, LlmSummarizer, SummaryApi};
use crate::summarizer::{
    ExtractiveSummarizer, FailureReason, Summarizer, SummarizerError, SummaryInput,
};

/// Which summarizer writes digests.
#[derive(Clone)]
pub enum Summarizers {
    /// Deterministic digests only.
    Extractive,
    /// A model, bound per request to the client's credential.
    Llm(Arc<LlmSummarizer>),
}

/// What the service shares. Cheap to clone: every connection thread holds one.
#[derive(Clone)]
pub struct Conversations {
    /// Sessions and the engine.
    pub compactor: Compactor,
    /// Digest writers.
    pub summarizers: Summarizers,
    /// The header naming a conversation.
    pub session_header: HeaderName,
    /// `compaction.enabled`.
    pub enabled: bool,
    /// Where compaction runs when it should not block the connection's thread (token
    /// counting and folding take milliseconds); `None` runs it on the calling task.
    pub compaction_runtime: Option<tokio::runtime::Handle>,
    /// The session inspector, when on (`admin.listen`): every request is recorded.
    pub inspector: Option<Arc<super::inspect::Inspector>>,
    /// The Anthropic Messages dialect; its token calibration is shared by every
    /// connection thread, so usage reported on one calibrates the counts of all.
    pub messages: super::dialect::Messages,
}

/// One request of a conversation, from its decision to its recorded outcome.
pub struct Turn<'a, D: Dialect> {
    conversations: &'a Conversations,
    dialect: &'a D,
    metrics: &'a Arc<Metrics>,
    headers: &'a HeaderMap,
    original: &'a Bytes,
    /// The parsed request and the origins of its messages; `None` when it was decided
    /// from its outline.
    parsed: Option<(Arc<ChatRequest>, D::Origins)>,
    key: SessionKey,
    model: &'static str,
    /// The request's `model`, as sent.
    model_name: String,
    model_key: String,
    learned: Option<usize>,
    decision: Decision,
    retried: bool,
}

/// A forwarded prompt the engine counted exactly: with the usage the upstream reports
/// for it, a sample of how the provider's token counts compare with the engine's.
pub struct Counted {
    /// The request's `model`, as sent.
    pub model: String,
    /// The prompt tokens the engine counted.
    pub tokens: usize,
    key: SessionKey,
    compactor: Compactor,
    /// The conversation's ratio as loaded for the request.
    known: Option<TokenRatio>,
}

impl Counted {
    /// Records in the conversation's state that the provider counted `reported` prompt
    /// tokens (see [`Compactor::calibrate`]), in a task of its own: the store may be
    /// remote, and this runs as the answer's body ends. A sample that agrees with the
    /// ratio the request was planned with is not worth a store round trip.
    pub fn calibrate_session(self, reported: u64) {
        if self.known.is_some_and(|known| known.settled_by(self.tokens, reported)) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            self.compactor.calibrate(&self.key, self.tokens, reported).await;
        });
    }
}

/// A deeper compaction to send after an overflow error.
pub struct Retry {
    /// The body to send.
    pub body: Bytes,
    /// When the retry's work began (for the overhead metric).
    pub started: Instant,
}

impl Conversations {
    /// Decides what to forward for `original` (the body as received); `None` when the
    /// dialect does not understand it (it is then forwarded as it is). A request far
    /// below the trigger is decided from its outline on the calling task, without
    /// parsing or conversation state; any other makes the hop to the compaction runtime.
    pub async fn begin<'a, D: Dialect>(
        &'a self,
        dialect: &'a D,
        upstream: &str,
        headers: &'a HeaderMap,
        original: &'a Bytes,
        metrics: &'a Arc<Metrics>,
    ) -> Option<Turn<'a, D>> {
        let outline = dialect.outline(original);
        let mut parsed = None;
        let model_name = match &outline {
            Some(outline) => dialect.outline_model(outline),
            None => parsed.insert(parse(dialect, original)?).0.model(),
        };
        let model = model_label(model_name.as_deref().unwrap_or_default());
        let model_key = windows::model_key(upstream, model_name.as_deref().unwrap_or_default());
        let learned = self.compactor.learned_window(&model_key);
        if learned.is_some() {
            metrics.learned_window(WindowEvent::Applied);
        }
        // A dialect whose provider counts tokens differently from the engine plans with
        // the model's ratio (a conversation's own, once measured, takes its place).
        let token_ratio = dialect.token_ratio(model_name.as_deref().unwrap_or_default());
        let options = Options { window_cap: learned, token_ratio, ..Options::default() };
        let session_header = self.session_header.as_str();
        // Far below the trigger (most requests of most conversations) the request goes as
        // it is: not parsed, no conversation state, no hop to the compaction runtime.
        let quick = outline.as_ref().and_then(|outline| {
            let report = dialect.clearly_below(self.compactor.engine(), outline, &options)?;
            let key = dialect.outline_session_key(headers, session_header, outline)?;
            Some((Decision::unchanged(report), key))
        });
        drop(outline);
        let (decision, key) = match quick {
            Some(quick) => quick,
            None => {
                let (request, origins) = match parsed.take() {
                    Some(parsed) => parsed,
                    None => parse(dialect, original)?,
                };
                let key = dialect.session_key(headers, session_header, &request);
                let decision = if dialect.server_state(&origins) {
                    // The provider holds the conversation: nothing here to compact.
                    Decision::passthrough()
                } else {
                    let api = dialect.summary_api(headers);
                    let summarizer = self.timed_summarizer(headers, &request, api, metrics);
                    self.decide(&key, &request, summarizer, &options).await
                };
                parsed = Some((request, origins));
                (decision, key)
            }
        };
        log_decision(&decision, false);
        Some(Turn {
            conversations: self,
            dialect,
            metrics,
            headers,
            original,
            parsed,
            key,
            model,
            model_name: model_name.unwrap_or_default(),
            model_key,
            learned,
            decision,
            retried: false,
        })
    }

    /// [`Compactor::decide`], on the compaction runtime when there is one.
    async fn decide(
        &self,
        key: &SessionKey,
        request: &Arc<ChatRequest>,
        summarizer: Arc<dyn Summarizer>,
        options: &Options,
    ) -> Decision {
        let Some(runtime) = &self.compaction_runtime else {
            // Boxed: the compaction's future is large, and every request's handler future
            // (moved whole when it is boxed and polled) would otherwise carry its size.
            return Box::pin(self.compactor.decide(key, request, summarizer, options)).await;
        };
        let (compactor, key, request, options) =
            (self.compactor.clone(), key.clone(), request.clone(), options.clone());
        runtime
            .spawn(async move { compactor.decide(&key, &request, summarizer, &options).await })
            .await
            .unwrap_or_else(|e| Decision::failed_open(format!("compaction task ended: {e}"), false))
    }

    /// The summarizer for `request` (of a conversation whose model summarizer speaks
    /// `api` with the client's credential, or that must not use it: `None`), its calls
    /// timed and its failures counted.
    fn timed_summarizer(
        &self,
        headers: &HeaderMap,
        request: &ChatRequest,
        api: Option<SummaryApi>,
        metrics: &Arc<Metrics>,
    ) -> Arc<dyn Summarizer> {
        let bound = match &self.summarizers {
            Summarizers::Llm(llm) => {
                let credential = Credential::from_headers(headers);
                let model = request.model().unwrap_or_default();
                llm.bind_for(credential, &model, api, headers)
            }
            Summarizers::Extractive => None,
        };
        let inner: Box<dyn Summarizer> = match bound {
            Some(bound) => Box::new(bound),
            None => Box::new(ExtractiveSummarizer),
        };
        Arc::new(Timed { inner, metrics: metrics.clone() })
    }
}

impl<D: Dialect> Turn<'_, D> {
    /// The body to forward: the original bytes, or the rendered compaction.
    pub fn body(&self) -> Bytes {
        match (&self.decision.rewritten, &self.parsed) {
            (Some(compacted), Some((_, origins))) => {
                self.dialect.render(self.original, origins, compacted)
            }
            _ => self.original.clone(),
        }
    }

    /// The current decision (the retry's, after a retry).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The conversation's session key.
    pub fn session(&self) -> &SessionKey {
        &self.key
    }

    /// The request's model label.
    pub fn model(&self) -> &'static str {
        self.model
    }

    /// The prompt tokens the engine counted exactly for the forwarded body, when it did
    /// (a dialect calibrates its counts against the usage the upstream reports for it).
    pub fn counted(&self) -> Option<Counted> {
        let report = self.decision.report.as_ref().filter(|r| r.tokens_before_exact)?;
        let tokens = match self.decision.rewritten {
            Some(_) => report.tokens_after,
            None => report.tokens_before,
        };
        Some(Counted {
            model: self.model_name.clone(),
            tokens,
            key: self.key.clone(),
            compactor: self.conversations.compactor.clone(),
            known: self.decision.token_ratio,
        })
    }

    /// The context window learned from an earlier overflow that the request was planned
    /// against, if any.
    pub fn learned_window(&self) -> Option<usize> {
        self.learned
    }

    /// True when the forwarded body is a retry after an overflow error.
    pub fn retried(&self) -> bool {
        self.retried
    }

    /// False when an overflow could not be retried: the request relies on conversation
    /// state the provider keeps, or is already the retry.
    pub fn retryable(&self) -> bool {
        let server_state = self.parsed.as_ref().is_some_and(|(_, o)| self.dialect.server_state(o));
        !server_state && !self.retried
    }

    /// After an error answer with `error_body`: when it is a context overflow, learns the
    /// window it states and compacts deeper, forced. `None` when the answer stands (not
    /// an overflow, or nothing more to take out).
    pub async fn retry_after(&mut self, error_body: &[u8]) -> Option<Retry> {
        if !self.dialect.is_overflow(error_body) {
            return None;
        }
        let stated = self.dialect.stated_window(error_body);
        let compactor = &self.conversations.compactor;
        if let Some(window) = stated {
            if compactor.learn_window(&self.model_key, window).await {
                self.metrics.learned_window(WindowEvent::Learned);
                tracing::info!(model = %self.model_key, window, "context window learned from an overflow error");
            }
        }
        if self.parsed.is_none() {
            self.parsed = Some(parse(self.dialect, self.original)?);
        }
        let (request, origins) = self.parsed.as_ref()?;
        if self.dialect.server_state(origins) {
            return None;
        }
        let request = request.clone();
        // Forced, to half the usual target, within the window the provider stated (else
        // within the prompt size that it just rejected).
        let mut options = Options::overflow_retry(compactor.engine().config());
        // Windows are in the provider's tokens; the rejected prompt was counted in the
        // engine's, so it is scaled back by the ratio it was planned with.
        let rejected = self
            .decision
            .report
            .as_ref()
            .map(|r| (r.tokens_after as f64 * r.budget.token_ratio) as usize);
        options.window_cap = stated.or(rejected).filter(|&n| n > 0);
        options.token_ratio = self.dialect.token_ratio(&self.model_name);
        let started = Instant::now();
        let api = self.dialect.summary_api(self.headers);
        let summarizer =
            self.conversations.timed_summarizer(self.headers, &request, api, self.metrics);
        let retry = self.conversations.decide(&self.key, &request, summarizer, &options).await;
        log_decision(&retry, true);
        let Some(compacted) = retry.rewritten.clone() else {
            // Nothing more to take out (or observe mode): the upstream's answer stands.
            self.metrics.overflow_retry(OverflowRetry::NothingToCompact);
            return None;
        };
        self.metrics.overflow_retry(OverflowRetry::Retried);
        self.decision = retry;
        self.retried = true;
        let (_, origins) = self.parsed.as_ref()?;
        Some(Retry { body: self.dialect.render(self.original, origins, &compacted), started })
    }

    /// Records what happened to the request in the metrics (and the session inspector).
    pub fn record(&self) {
        let (metrics, decision) = (self.metrics, &self.decision);
        if let Some(inspector) = &self.conversations.inspector {
            inspector.record(self.headers, &self.key, self.model, decision, self.retried);
        }
        let outcome = outcome_label(decision.outcome);
        let route = self.dialect.route();
        metrics.chat_request(route, outcome);
        let sessions = self.conversations.compactor.store().active_sessions();
        metrics.active_sessions.set(i64::try_from(sessions).unwrap_or(i64::MAX));
        let Some(report) = &decision.report else { return };
        let before = report.tokens_before as u64;
        let forwarded =
            if decision.rewritten.is_some() { report.tokens_after as u64 } else { before };
        let model = self.model;
        metrics.prompt_tokens(route, model, before, forwarded);
        if matches!(decision.outcome, ChatOutcome::Compacted | ChatOutcome::Observed) && before > 0
        {
            metrics.compaction_ratio.observe(report.tokens_after as f64 / before as f64);
            metrics.fold_wait.observe(decision.fold_wait.as_secs_f64());
            metrics.compaction(tier_label(report.tier), outcome);
        }
        if let Some(recall) = report.artifact_recall {
            metrics.artifact_recall.observe(recall);
        }
        metrics.trail_rereads(route, report.rereads);
    }
}

/// `body` parsed by `dialect`, the request shared with the compaction runtime.
fn parse<D: Dialect>(dialect: &D, body: &[u8]) -> Option<(Arc<ChatRequest>, D::Origins)> {
    dialect.parse(body).map(|(request, origins)| (Arc::new(request), origins))
}

/// The metric label of an outcome.
fn outcome_label(outcome: ChatOutcome) -> metrics::Outcome {
    match outcome {
        ChatOutcome::Passthrough => metrics::Outcome::Passthrough,
        ChatOutcome::Compacted => metrics::Outcome::Compacted,
        ChatOutcome::Observed => metrics::Outcome::Observed,
        ChatOutcome::FailedOpen => metrics::Outcome::FailedOpen,
    }
}

/// The metric label of a tier.
fn tier_label(tier: Tier) -> metrics::Tier {
    match tier {
        Tier::Reuse => metrics::Tier::Reuse,
        Tier::Elide => metrics::Tier::Elide,
        Tier::Fold => metrics::Tier::Fold,
        Tier::GoalBatch => metrics::Tier::GoalBatch,
        Tier::Fallback => metrics::Tier::Fallback,
    }
}

/// The metric label of a summarizer failure (`None`: a failure without a reason).
fn failure_label(reason: Option<FailureReason>) -> metrics::SummarizerFailure {
    match reason {
        Some(FailureReason::Timeout) => metrics::SummarizerFailure::Timeout,
        Some(FailureReason::Status) => metrics::SummarizerFailure::Status,
        Some(FailureReason::Transport) => metrics::SummarizerFailure::Transport,
        Some(FailureReason::InvalidResponse) => metrics::SummarizerFailure::InvalidResponse,
        Some(FailureReason::CircuitOpen) => metrics::SummarizerFailure::CircuitOpen,
        None => metrics::SummarizerFailure::Failed,
    }
}

/// A summarizer whose calls are timed and whose failures are counted.
struct Timed {
    inner: Box<dyn Summarizer>,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Summarizer for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        let started = Instant::now();
        let result = self.inner.summarize(input).await;
        let name = if self.inner.name() == ExtractiveSummarizer.name() {
            metrics::SummarizerName::Extractive
        } else {
            metrics::SummarizerName::Llm
        };
        let failure = result.as_ref().err().map(|e| failure_label(e.reason()));
        self.metrics.summarizer_call(name, started.elapsed().as_secs_f64(), failure);
        result
    }
}

fn log_decision(decision: &Decision, retry: bool) {
    let Some(report) = &decision.report else { return };
    if decision.outcome == ChatOutcome::Passthrough && !retry {
        tracing::debug!(tokens = report.tokens_before, "below the trigger");
        return;
    }
    tracing::info!(
        outcome = decision.outcome.as_str(),
        retry,
        tier = report.tier.number(),
        tokens_before = report.tokens_before,
        tokens_after = report.tokens_after,
        folded = report.folded,
        elided = report.elided,
        dropped = report.dropped,
        blocks_reused = report.blocks_reused,
        fold_postponed = report.fold_postponed,
        fold_wait_ms = decision.fold_wait.as_millis() as u64,
        blocks_new = report.blocks_new,
        summarizer = report.summarizer.as_deref().unwrap_or("-"),
        summarizer_error = report.summarizer_error.as_deref().unwrap_or("-"),
        "compaction"
    );
}
