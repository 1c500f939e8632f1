//! The handler of every API shape foldgate compacts (chat completions, Responses,
//! Anthropic Messages; see [`super::dialect`]): read the body, let the conversation
//! service decide, forward the original bytes or the compacted body, stream the answer
//! back, tag it with `x-foldgate-*` headers. On a context overflow that reached no client
//! byte yet (an error answer, or a stream that fails before its first event of substance,
//! see `super::overflow`), the service compacts deeper and the handler sends once more.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use super::body::{BodyProgress, ProxyBody, ReadError, full, read_limited};
use super::conversation::{Conversations, Turn};
use super::dialect::Dialect;
use super::error::ProxyError;
use super::overflow;
use super::passthrough::{self, build_request, client_response, declared_length};
use super::upstream::{Upstream, UpstreamBody};
use crate::compaction::Report;
use crate::metrics::{Metrics, Outcome};
use crate::summarizer::llm::SUMMARY_HEADER;

/// Handles one request of `dialect`'s shape; how far its body was read goes to `progress`.
pub async fn handle<D: Dialect>(
    dialect: &D,
    upstream: &Upstream,
    max_body: u64,
    conversations: &Conversations,
    metrics: &Arc<Metrics>,
    request: Request<Incoming>,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !conversations.enabled || request.headers().contains_key(SUMMARY_HEADER) {
        if !conversations.enabled {
            metrics.chat_request(dialect.route(), Outcome::Disabled);
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
    let turn =
        conversations.begin(dialect, upstream.name(), &parts.headers, &original, metrics).await;
    let Some(mut turn) = turn else {
        // A body foldgate does not understand goes as it is; the upstream answers.
        metrics.chat_request(dialect.route(), Outcome::NotChat);
        let response = send(dialect, upstream, metrics, started, &parts, original).await?;
        return Ok(dialect.tap_usage(client_response(response), metrics, None));
    };
    let response = send(dialect, upstream, metrics, started, &parts, turn.body()).await?;
    let response = dialect.tap_turn_usage(
        client_response(response),
        metrics,
        Some(turn.model()),
        turn.counted(),
    );
    // No byte has reached the client yet: an overflow can be retried once, deeper
    // compacted; the client then gets only the retry's answer.
    let first = overflow::read(dialect, response, turn.retryable()).await;
    let retry = match &first.error {
        Some(error) => turn.retry_after(error).await,
        None => None,
    };
    let Some(retry) = retry else {
        return Ok(tag(first.response, &turn));
    };
    drop(first);
    let response = send(dialect, upstream, metrics, retry.started, &parts, retry.body).await?;
    let response = client_response(response);
    Ok(tag(dialect.tap_turn_usage(response, metrics, Some(turn.model()), turn.counted()), &turn))
}

/// Sends `body` upstream with the client's method, path and headers; `started` is when
/// foldgate began working on it (for the overhead metric).
async fn send<D: Dialect>(
    dialect: &D,
    upstream: &Upstream,
    metrics: &Metrics,
    started: Instant,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<UpstreamBody>, ProxyError> {
    let mut headers = parts.headers.clone();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let request = build_request(upstream, parts.method.clone(), &parts.uri, headers, full(body))?;
    let route = dialect.route();
    metrics.observe_proxy_overhead(route, started.elapsed().as_secs_f64());
    let sent = Instant::now();
    let result = upstream.send(request).await;
    metrics.observe_upstream_ttfb(route, sent.elapsed().as_secs_f64());
    result
}

/// Records the turn's outcome and says in `x-foldgate-*` headers what happened.
fn tag<D: Dialect>(mut response: Response<ProxyBody>, turn: &Turn<'_, D>) -> Response<ProxyBody> {
    turn.record();
    let decision = turn.decision();
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: HeaderValue| {
        headers.insert(HeaderName::from_static(name), value);
    };
    set("x-foldgate-outcome", HeaderValue::from_static(decision.outcome.as_str()));
    if let Ok(value) = HeaderValue::from_str(turn.session().as_str()) {
        set("x-foldgate-session", value);
    }
    if let Some(Report { tokens_before, tokens_after, tier, .. }) = &decision.report {
        set("x-foldgate-tokens-before", HeaderValue::from(*tokens_before));
        set("x-foldgate-tokens-after", HeaderValue::from(*tokens_after));
        set("x-foldgate-tier", HeaderValue::from(u16::from(tier.number())));
    }
    if !decision.fold_wait.is_zero() {
        let millis = u64::try_from(decision.fold_wait.as_millis()).unwrap_or(u64::MAX);
        set("x-foldgate-fold-wait-ms", HeaderValue::from(millis));
    }
    if turn.retried() {
        set("x-foldgate-retried", HeaderValue::from_static("1"));
    }
    // The request was planned against a window learned from an earlier overflow error.
    if let Some(window) = turn.learned_window() {
        set("x-foldgate-learned-window", HeaderValue::from(window));
    }
    response
}
