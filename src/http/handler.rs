//! The handler of every API shape foldgate compacts (chat completions, Responses,
//! Anthropic Messages; see [`super::dialect`]): read the body, let the conversation
//! service decide, forward the original bytes or the compacted body, stream the answer
//! back, tag it with `x-foldgate-*` headers. On a context overflow that reached no client
//! byte yet (an error answer, or a stream that fails before its first event of substance,
//! see `super::overflow`), the service compacts deeper and the handler sends once more.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use super::body::{BodyProgress, ProxyBody, ReadError, full, read_limited};
use super::dialect::Dialect;
use super::error::ProxyError;
use super::overflow;
use super::passthrough::{self, build_request, client_response, declared_length};
use super::turn::{Turns, record_untaken};
use super::upstream::{Upstream, UpstreamBody};
use super::usage_tap::tapped_with as tapped;
use crate::metrics::Metrics;
use crate::summarizer::llm::SUMMARY_HEADER;
use crate::vocab::Outcome;

/// Handles one request of `dialect`'s shape; how far its body was read goes to `progress`.
pub async fn handle<D: Dialect>(
    dialect: &D,
    upstream: &Upstream,
    max_body: u64,
    turns: &Turns,
    metrics: &Arc<Metrics>,
    request: Request<Incoming>,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !turns.enabled || request.headers().contains_key(SUMMARY_HEADER) {
        if !turns.enabled {
            record_untaken(metrics, dialect.route(), Outcome::Disabled);
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
    let turn = turns.begin(dialect, upstream.name(), &parts.headers, &original, metrics).await;
    let Some(mut turn) = turn else {
        // A body foldgate does not understand goes as it is; the upstream answers.
        record_untaken(metrics, dialect.route(), Outcome::NotChat);
        let response = send(dialect, upstream, metrics, started, &parts, original).await?;
        return Ok(tapped(client_response(response), metrics, None, None));
    };
    let response = send(dialect, upstream, metrics, started, &parts, turn.body()).await?;
    let response = tapped(client_response(response), metrics, Some(turn.model()), turn.on_usage());
    // No byte has reached the client yet: an overflow can be retried once, deeper
    // compacted; the client then gets only the retry's answer.
    let first = overflow::read(dialect, response, turn.retryable()).await;
    let retry = match &first.error {
        Some(error) => turn.retry_after(error).await,
        None => None,
    };
    let Some(retry) = retry else {
        return Ok(turn.finish(first.response));
    };
    drop(first);
    let response = send(dialect, upstream, metrics, retry.started, &parts, retry.body).await?;
    let response = client_response(response);
    Ok(turn.finish(tapped(response, metrics, Some(turn.model()), turn.on_usage())))
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
