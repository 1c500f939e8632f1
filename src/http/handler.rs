//! The handler of every API shape foldgate compacts (chat completions, Responses,
//! Anthropic Messages; see [`super::dialect`]): read the body, let the conversation
//! service decide, forward the original bytes or the compacted body, stream the answer
//! back, tag it with `x-foldgate-*` headers. On a context overflow that reached no client
//! byte yet (an error answer, or a stream that fails before its first event of substance,
//! see `super::overflow`), the service compacts deeper and the handler sends once more.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use super::body::{BodyProgress, ProxyBody, full};
use super::dialect::{Dialect, Prepared};
use super::error::ProxyError;
use super::overflow;
use super::passthrough::{self, build_request, client_response};
use super::provider_compaction::answer;
use super::provider_compaction::on_request::{self, Addition};
use super::request_body::{self, ReceivedBody};
use super::turn::{Turns, record_untaken};
use super::upstream::{Upstream, UpstreamBody};
use super::usage_tap::{tapped, team_of};
use crate::config::ServedBy;
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
    let (parts, body) = request.into_parts();
    let received = request_body::read(&parts.headers, body, max_body, progress, metrics).await?;
    let started = Instant::now();
    let Some(original) = received.content() else {
        // Compressed in a way foldgate cannot undo: forwarded as received, uncompacted.
        let headers = &parts.headers;
        let out =
            Outgoing { dialect, upstream, metrics, parts: &parts, headers, received: &received };
        return out.untaken(started, received.raw().clone()).await;
    };
    let api = dialect.provider_api();
    let provider = &turns.provider;
    let conversations = &turns.conversations;
    let serves = |api| provider.foldgate_serves(api, conversations, upstream.name());
    let mut serve = api.is_some_and(serves);
    loop {
        let prepared =
            dialect.prepare(original, provider, serve).map_err(ProxyError::InvalidRequest)?;
        // In `auto`, an upstream that rejects the provider compaction fields is asked once.
        let auto = api.filter(|&api| provider.served_by(api) == ServedBy::Auto);
        let may_reject = prepared.left_for_upstream && auto.is_some();
        let exchange = Exchange {
            dialect,
            upstream,
            turns,
            metrics,
            parts: &parts,
            received: &received,
            started,
        };
        match exchange.run(prepared, may_reject).await? {
            Attempt::Answered(response) => return Ok(response),
            Attempt::Rejected => {
                if let Some(api) = auto {
                    conversations.learn_unserved(api, upstream.name()).await;
                }
                serve = true;
            }
        }
    }
}

/// One request's exchange with the upstream.
struct Exchange<'a, D> {
    dialect: &'a D,
    upstream: &'a Upstream,
    turns: &'a Turns,
    metrics: &'a Arc<Metrics>,
    parts: &'a http::request::Parts,
    /// The body as received, and its content.
    received: &'a ReceivedBody,
    started: Instant,
}

/// How an exchange ended.
enum Attempt {
    /// With the answer for the client.
    Answered(Response<ProxyBody>),
    /// The upstream rejected the provider compaction fields left for it: foldgate is to
    /// serve them and send again.
    Rejected,
}

impl<D: Dialect> Exchange<'_, D> {
    /// Decides what to send for `prepared`, sends it, and retries once after an overflow.
    async fn run(&self, prepared: Prepared, may_reject: bool) -> Result<Attempt, ProxyError> {
        let Self { dialect, upstream, turns, metrics, parts, received, started } = *self;
        let headers = dialect.forwarded_headers(&parts.headers, &prepared);
        let team = team_of(metrics, &parts.headers);
        let out = Outgoing { dialect, upstream, metrics, parts, headers: &headers, received };
        // The headers as forwarded: digest calls pass them on, betas foldgate serves off.
        let turn = turns.begin(dialect, upstream.name(), &headers, &prepared.body, metrics);
        let Some(mut turn) = turn.await else {
            // A body foldgate does not understand goes as it is; the upstream answers.
            return out.untaken(started, prepared.body).await.map(Attempt::Answered);
        };
        let addition = match &prepared.served {
            Some(served) => on_request::serve(&mut turn, served, &turns.provider, metrics).await,
            None => None,
        };
        if let Some(Addition::Paused { body, events }) = addition {
            // Paused after compaction: foldgate's answer, the upstream never asked.
            return Ok(Attempt::Answered(turn.finish(answer::local(body, events))));
        }
        let response = out.send(started, turn.body()).await?;
        let (model, on_usage) = (Some(turn.model()), turn.on_usage());
        let response = tapped(client_response(response), metrics, model, team.clone(), on_usage);
        // No byte has reached the client yet: an overflow can be retried once, deeper
        // compacted; the client then gets only the retry's answer.
        let first = overflow::read(dialect, response, turn.retryable()).await;
        let error = first.error.as_deref();
        if may_reject && error.is_some_and(|e| dialect.rejects_provider_compaction(e)) {
            return Ok(Attempt::Rejected);
        }
        let retry = match error {
            Some(error) => turn.retry_after(error).await,
            None => None,
        };
        let response = match retry {
            None => first.response,
            Some(retry) => {
                drop(first);
                let response = out.send(retry.started, retry.body).await?;
                let (model, on_usage) = (Some(turn.model()), turn.on_usage());
                tapped(client_response(response), metrics, model, team, on_usage)
            }
        };
        let response = turn.finish(response);
        Ok(Attempt::Answered(match addition {
            Some(addition) => answer::rewrite(response, |kind| addition.rewrite(kind)),
            None => response,
        }))
    }
}

/// Where and how a request's bodies are sent.
struct Outgoing<'a, D> {
    dialect: &'a D,
    upstream: &'a Upstream,
    metrics: &'a Arc<Metrics>,
    parts: &'a http::request::Parts,
    /// The headers to send (the client's, see [`Dialect::forwarded_headers`]).
    headers: &'a HeaderMap,
    /// The body as received: a body sent unchanged goes as received (compressed as it
    /// came), a changed one identity-encoded.
    received: &'a ReceivedBody,
}

impl<D: Dialect> Outgoing<'_, D> {
    /// Sends `body`, which foldgate does not understand, as it is and counts it
    /// (`not_chat`); the upstream's answer comes back through the usage tap.
    async fn untaken(
        &self,
        started: Instant,
        body: Bytes,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        record_untaken(self.metrics, self.dialect.route(), Outcome::NotChat);
        let response = self.send(started, body).await?;
        let team = team_of(self.metrics, &self.parts.headers);
        Ok(tapped(client_response(response), self.metrics, None, team, None))
    }

    /// Sends `body` upstream with the client's method and path; `started` is when
    /// foldgate began working on it (for the overhead metric).
    async fn send(
        &self,
        started: Instant,
        body: Bytes,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let mut headers = self.headers.clone();
        let body = self.received.outgoing(body, &mut headers);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let (method, uri) = (self.parts.method.clone(), &self.parts.uri);
        let request = build_request(self.upstream, method, uri, headers, full(body))?;
        let route = self.dialect.route();
        self.metrics.observe_proxy_overhead(route, started.elapsed().as_secs_f64());
        let sent = Instant::now();
        let result = self.upstream.send(request).await;
        self.metrics.observe_upstream_ttfb(route, sent.elapsed().as_secs_f64());
        result
    }
}
