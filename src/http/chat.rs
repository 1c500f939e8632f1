//! `POST /v1/chat/completions`: read the body, let the compactor decide, forward the
//! original bytes or the compacted body, stream the answer back. On a context-length
//! error that reached no client byte yet, compact deeper and retry once.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::body::{BodyProgress, ProxyBody, ReadError, full, peek, read_limited};
use super::error::ProxyError;
use super::passthrough::{self, build_request, client_response, declared_length};
use super::session_key::{session_key, session_key_of_outline};
use super::upstream::{Upstream, UpstreamBody};
use super::usage_tap::tapped;
use crate::compaction::{Options, Report};
use crate::compactor::{ChatOutcome, Compactor, Decision, windows};
use crate::metrics::{Metrics, Route, TIERS, model_label};
use crate::model::ChatRequest;
use crate::outline::Outline;
use crate::session::SessionKey;
use crate::summarizer::llm::{Credential, LlmSummarizer, SUMMARY_HEADER};
use crate::summarizer::{
    ExtractiveSummarizer, FailureReason, Summarizer, SummarizerError, SummaryInput,
};

/// Error bodies larger than this are passed through without looking for an overflow.
const OVERFLOW_PEEK_LIMIT: usize = 256 * 1024;

/// Which summarizer writes digests.
#[derive(Clone)]
pub enum Summarizers {
    /// Deterministic digests only.
    Extractive,
    /// A model, bound per request to the client's credential.
    Llm(Arc<LlmSummarizer>),
}

/// What the chat handler shares. Cheap to clone: every connection thread holds one.
#[derive(Clone)]
pub struct ChatState {
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
}

impl ChatState {
    /// [`Compactor::decide`], on the compaction runtime when there is one.
    async fn decide(
        &self,
        key: &SessionKey,
        request: &Arc<ChatRequest>,
        summarizer: Arc<dyn Summarizer>,
        options: &Options,
    ) -> Decision {
        let Some(runtime) = &self.compaction_runtime else {
            return self.compactor.decide(key, request, summarizer, options).await;
        };
        let (compactor, key, request, options) =
            (self.compactor.clone(), key.clone(), request.clone(), options.clone());
        runtime
            .spawn(async move { compactor.decide(&key, &request, summarizer, &options).await })
            .await
            .unwrap_or_else(|e| Decision::failed_open(format!("compaction task ended: {e}"), false))
    }

    /// The summarizer for `request`, its calls timed and its failures counted.
    fn timed_summarizer(
        &self,
        headers: &HeaderMap,
        request: &ChatRequest,
        metrics: &Arc<Metrics>,
    ) -> Arc<dyn Summarizer> {
        Arc::new(Timed { inner: self.summarizer_for(headers, request), metrics: metrics.clone() })
    }

    fn summarizer_for(&self, headers: &HeaderMap, request: &ChatRequest) -> Box<dyn Summarizer> {
        match &self.summarizers {
            Summarizers::Extractive => Box::new(ExtractiveSummarizer),
            Summarizers::Llm(llm) => Box::new(
                llm.bind(Credential::from_headers(headers), &request.model().unwrap_or_default()),
            ),
        }
    }
}

/// Handles one chat-completions request; how far its body was read goes to `progress`.
pub async fn handle(
    upstream: &Upstream,
    max_body: u64,
    chat: &ChatState,
    metrics: &Arc<Metrics>,
    request: Request<Incoming>,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !chat.enabled || request.headers().contains_key(SUMMARY_HEADER) {
        if !chat.enabled {
            metrics.chat_requests.with_label_values(&["disabled"]).inc();
        }
        return passthrough::forward(upstream, max_body, metrics, request, progress).await;
    }
    if declared_length(request.headers()).is_some_and(|len| len > max_body) {
        return Err(ProxyError::BodyTooLarge { limit: max_body });
    }
    let (parts, body) = request.into_parts();
    let original = read_limited(body, max_body, progress).await.map_err(|e| match e {
        ReadError::TooLarge { limit } => ProxyError::BodyTooLarge { limit },
        ReadError::Body(message) => ProxyError::ClientBody(message),
    })?;
    let started = Instant::now();
    // Most requests are decided from their outline alone (see below); the others, and a
    // body the outline scan does not follow, are parsed.
    let outline = Outline::scan(&original);
    let mut parsed = None;
    let model_name = match &outline {
        Some(outline) => outline.model(),
        None => match ChatRequest::parse(&original) {
            Ok(request) => parsed.insert(Arc::new(request)).model(),
            Err(_) => return not_chat(upstream, metrics, started, &parts, original).await,
        },
    };
    let model = model_label(model_name.as_deref().unwrap_or_default());
    let model_key = windows::model_key(upstream.name(), model_name.as_deref().unwrap_or_default());
    let learned = chat.compactor.learned_window(&model_key);
    if learned.is_some() {
        metrics.learned_windows.with_label_values(&["applied"]).inc();
    }
    let options = Options { window_cap: learned, ..Options::default() };
    // Far below the trigger (most requests of most conversations) the request goes as it
    // is: not parsed, no conversation state, no hop to the compaction runtime.
    let quick = outline.as_ref().and_then(|outline| {
        let report = chat.compactor.engine().clearly_below(outline, &options)?;
        let key = session_key_of_outline(&parts.headers, chat.session_header.as_str(), outline);
        Some((Decision::unchanged(report), key))
    });
    drop(outline);
    let (decision, key) = match quick {
        Some(quick) => quick,
        None => {
            let request = match parsed.take() {
                Some(request) => request,
                None => match ChatRequest::parse(&original) {
                    Ok(request) => Arc::new(request),
                    Err(_) => return not_chat(upstream, metrics, started, &parts, original).await,
                },
            };
            let key = session_key(&parts.headers, chat.session_header.as_str(), &request);
            let summarizer = chat.timed_summarizer(&parts.headers, &request, metrics);
            let decision = chat.decide(&key, &request, summarizer, &options).await;
            parsed = Some(request);
            (decision, key)
        }
    };
    log_decision(&decision, false);
    let response = send(upstream, metrics, started, &parts, decision.body(&original)).await?;
    let response = tapped(client_response(response), metrics, Some(model));
    let tag = |response, decision: &Decision, retried| {
        record(metrics, chat, decision, model);
        let response = with_report_headers(response, decision, key.as_str(), retried);
        with_learned_window(response, learned)
    };
    if !matches!(response.status(), StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE) {
        return Ok(tag(response, &decision, false));
    }

    // An error answer: no byte has reached the client yet, so a context overflow can be
    // retried once with a deeper compaction.
    let (head, body) = response.into_parts();
    let error_body = match peek(body, OVERFLOW_PEEK_LIMIT).await {
        Ok(bytes) => bytes,
        Err(replay) => return Ok(tag(Response::from_parts(head, replay), &decision, false)),
    };
    let as_received = |head| Response::from_parts(head, full(error_body.clone()));
    if !is_context_overflow(&error_body) {
        return Ok(tag(as_received(head), &decision, false));
    }
    if let Some(window) = stated_window(&error_body) {
        if chat.compactor.learn_window(&model_key, window).await {
            metrics.learned_windows.with_label_values(&["learned"]).inc();
            tracing::info!(model = %model_key, window, "context window learned from an overflow error");
        }
    }
    let request = match parsed {
        Some(request) => request,
        None => match ChatRequest::parse(&original) {
            Ok(request) => Arc::new(request),
            Err(_) => return Ok(tag(as_received(head), &decision, false)),
        },
    };
    let options = overflow_options(chat, &decision, &error_body);
    let started = Instant::now();
    let summarizer = chat.timed_summarizer(&parts.headers, &request, metrics);
    let retry = chat.decide(&key, &request, summarizer, &options).await;
    log_decision(&retry, true);
    let Some(body) = retry.rewritten.clone() else {
        // Nothing more to take out (or observe mode): the upstream's answer stands.
        metrics.overflow_retries.with_label_values(&["nothing_to_compact"]).inc();
        return Ok(tag(as_received(head), &decision, false));
    };
    metrics.overflow_retries.with_label_values(&["retried"]).inc();
    let response = send(upstream, metrics, started, &parts, body).await?;
    Ok(tag(tapped(client_response(response), metrics, Some(model)), &retry, true))
}

/// Records what happened to one chat request.
fn record(metrics: &Metrics, chat: &ChatState, decision: &Decision, model: &'static str) {
    let outcome = decision.outcome.as_str();
    metrics.chat_requests.with_label_values(&[outcome]).inc();
    metrics
        .active_sessions
        .set(i64::try_from(chat.compactor.store().active_sessions()).unwrap_or(i64::MAX));
    let Some(report) = &decision.report else { return };
    let before = report.tokens_before as u64;
    let forwarded = if decision.rewritten.is_some() { report.tokens_after as u64 } else { before };
    metrics.prompt_tokens_before.with_label_values(&[model]).inc_by(before);
    metrics.prompt_tokens_after.with_label_values(&[model]).inc_by(forwarded);
    metrics.tokens_saved.with_label_values(&[model]).inc_by(before.saturating_sub(forwarded));
    if matches!(decision.outcome, ChatOutcome::Compacted | ChatOutcome::Observed) && before > 0 {
        metrics.compaction_ratio.observe(report.tokens_after as f64 / before as f64);
        metrics.fold_wait.observe(decision.fold_wait.as_secs_f64());
        let tier = TIERS.get(usize::from(report.tier)).copied().unwrap_or("other");
        metrics.compactions.with_label_values(&[tier, outcome]).inc();
    }
    if let Some(recall) = report.artifact_recall {
        metrics.artifact_recall.observe(recall);
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
        self.metrics
            .summarizer_duration
            .with_label_values(&[self.inner.name()])
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.metrics
                .summarizer_failures
                .with_label_values(&[e.reason().map_or("failed", FailureReason::as_str)])
                .inc();
        }
        result
    }
}

/// Sends `body` upstream with the client's method, path and headers; `started` is when
/// foldgate began working on it (for the overhead metric).
async fn send(
    upstream: &Upstream,
    metrics: &Metrics,
    started: Instant,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<UpstreamBody>, ProxyError> {
    let mut headers = parts.headers.clone();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let request = build_request(upstream, parts.method.clone(), &parts.uri, headers, full(body))?;
    metrics.observe_proxy_overhead(Route::ChatCompletions, started.elapsed().as_secs_f64());
    let sent = Instant::now();
    let result = upstream.send(request).await;
    metrics.observe_upstream_ttfb(Route::ChatCompletions, sent.elapsed().as_secs_f64());
    result
}

/// Forwards a body foldgate does not understand as it is; the upstream answers.
async fn not_chat(
    upstream: &Upstream,
    metrics: &Arc<Metrics>,
    started: Instant,
    parts: &http::request::Parts,
    original: Bytes,
) -> Result<Response<ProxyBody>, ProxyError> {
    metrics.chat_requests.with_label_values(&["not_chat"]).inc();
    let response = send(upstream, metrics, started, parts, original).await?;
    Ok(tapped(client_response(response), metrics, None))
}

/// Options for the retry after an overflow: forced, to half the usual target, within the
/// window the provider stated (else within the prompt size that it just rejected).
fn overflow_options(chat: &ChatState, decision: &Decision, error_body: &[u8]) -> Options {
    let mut options = Options::overflow_retry(chat.compactor.engine().config());
    let rejected = decision.report.as_ref().map(|r| r.tokens_after);
    options.window_cap = stated_window(error_body).or(rejected).filter(|&n| n > 0);
    options
}

/// The context window a provider's overflow message states, e.g. "maximum context
/// length is 8192 tokens" or "210000 tokens > 200000 maximum".
fn stated_window(body: &[u8]) -> Option<usize> {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    ["maximum context length is ", "context length is ", " > "].iter().find_map(|marker| {
        let start = text.find(marker)? + marker.len();
        let digits: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

/// True for the error answers providers give when a prompt is longer than the window.
pub fn is_context_overflow(body: &[u8]) -> bool {
    const PHRASES: [&str; 8] = [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "prompt is too long",
        "too many tokens",
        "input is too long",
        "reduce the length of the messages",
    ];
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let error = value.get("error").unwrap_or(&value);
    let code = ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k).and_then(serde_json::Value::as_str))
        .any(|c| c.contains("context_length"));
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    code || PHRASES.iter().any(|p| message.contains(p))
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
        tier = report.tier,
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

/// Says in `x-foldgate-learned-window` that the request was planned against a window
/// learned from an earlier overflow error.
fn with_learned_window(
    mut response: Response<ProxyBody>,
    learned: Option<usize>,
) -> Response<ProxyBody> {
    if let Some(window) = learned {
        response.headers_mut().insert(
            HeaderName::from_static("x-foldgate-learned-window"),
            HeaderValue::from(window),
        );
    }
    response
}

/// Adds `x-foldgate-*` headers saying what happened.
fn with_report_headers(
    mut response: Response<ProxyBody>,
    decision: &Decision,
    session: &str,
    retried: bool,
) -> Response<ProxyBody> {
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: HeaderValue| {
        headers.insert(HeaderName::from_static(name), value);
    };
    set("x-foldgate-outcome", HeaderValue::from_static(decision.outcome.as_str()));
    if let Ok(value) = HeaderValue::from_str(session) {
        set("x-foldgate-session", value);
    }
    if let Some(Report { tokens_before, tokens_after, tier, .. }) = &decision.report {
        set("x-foldgate-tokens-before", HeaderValue::from(*tokens_before));
        set("x-foldgate-tokens-after", HeaderValue::from(*tokens_after));
        set("x-foldgate-tier", HeaderValue::from(u16::from(*tier)));
    }
    if !decision.fold_wait.is_zero() {
        let millis = u64::try_from(decision.fold_wait.as_millis()).unwrap_or(u64::MAX);
        set("x-foldgate-fold-wait-ms", HeaderValue::from(millis));
    }
    if retried {
        set("x-foldgate-retried", HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::{is_context_overflow, stated_window};

    #[test]
    fn reads_the_window_a_provider_states() {
        assert_eq!(
            stated_window(b"This model's maximum context length is 128,000 tokens."),
            Some(128_000)
        );
        assert_eq!(
            stated_window(b"prompt is too long: 210000 tokens > 200000 maximum"),
            Some(200_000)
        );
        assert_eq!(stated_window(b"too long"), None);
    }

    #[test]
    fn recognises_context_overflow_errors() {
        assert!(is_context_overflow(
            br#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#
        ));
        assert!(is_context_overflow(
            br#"{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#
        ));
        assert!(!is_context_overflow(
            br#"{"error":{"message":"Invalid value for 'temperature'"}}"#
        ));
        assert!(!is_context_overflow(b"not json"));
    }
}
