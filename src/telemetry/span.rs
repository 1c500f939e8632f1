//! The spans foldgate makes when traces are exported, and what each records: one per
//! request (on the compacted routes with the GenAI semantic conventions' attributes and
//! foldgate's own under `foldgate.`), one per summarizer call and model call, one per
//! session store operation, one per background fold. Every attribute name is spelled here
//! once. No attribute ever holds a credential or message text: models, counts, the
//! vocabulary's labels and the hashed session key only.
//!
//! Every span is made at [`TARGET`], which the log filter turns off. With export off no
//! span is made at all (a span macro whose target is off costs one atomic load, and the
//! functions here return a disabled span before doing anything else); with export on, log
//! lines are unchanged (the text and JSON layers never see these spans).

use std::time::Duration;

use opentelemetry::trace::{Status, TraceContextExt};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::vocab::{FailureReason, Outcome, StoreOp, SummarizerKind, Tier};

/// The `tracing` target of every span foldgate exports.
pub const TARGET: &str = "foldgate::trace";

/// `gen_ai.operation.name`: `chat` for the chat, Responses and Messages APIs.
pub const OPERATION: &str = "gen_ai.operation.name";
/// `gen_ai.provider.name`: `openai` or `anthropic` (the API shape the upstream speaks).
pub const PROVIDER: &str = "gen_ai.provider.name";
/// `gen_ai.system`: the name earlier versions of the conventions gave the provider.
pub const SYSTEM: &str = "gen_ai.system";
/// `gen_ai.request.model`: the request's `model`, as sent.
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
/// `gen_ai.response.model`: the model the upstream's answer names.
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
/// `gen_ai.usage.input_tokens`: prompt tokens the upstream reported (cached included).
pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// `gen_ai.usage.output_tokens`: completion tokens the upstream reported.
pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `gen_ai.usage.cache_read.input_tokens`: prompt tokens read from the provider's cache.
pub const CACHE_READ_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
/// `gen_ai.usage.cache_creation.input_tokens`: prompt tokens written to it (Anthropic).
pub const CACHE_CREATION_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
/// `http.request.method` of a passthrough request.
pub const HTTP_METHOD: &str = "http.request.method";
/// `http.response.status_code` of the answer the client got.
pub const HTTP_STATUS: &str = "http.response.status_code";
/// `error.type`: why a span ended in error (a status code, a failure reason).
pub const ERROR_TYPE: &str = "error.type";
/// `db.operation.name` of a store operation.
pub const DB_OPERATION: &str = "db.operation.name";
/// `db.system.name` of a store operation on Redis.
pub const DB_SYSTEM: &str = "db.system.name";

/// `foldgate.request_id`: foldgate's id of the request (`x-foldgate-request-id`, the
/// access log's `request_id`).
pub const REQUEST_ID: &str = "foldgate.request_id";
/// `foldgate.route`: the route label of the request (as in the metrics;
/// `responses_compact` for `/v1/responses/compact`).
pub const ROUTE: &str = "foldgate.route";
/// `foldgate.outcome`: what happened to the request (`x-foldgate-outcome`).
pub const OUTCOME: &str = "foldgate.outcome";
/// `foldgate.tier`: the deepest tier the engine applied, 0 to 4.
pub const TIER: &str = "foldgate.tier";
/// `foldgate.tokens_before`: the prompt's tokens as received.
pub const TOKENS_BEFORE: &str = "foldgate.tokens_before";
/// `foldgate.tokens_after`: the prompt's tokens as the engine planned to forward them.
pub const TOKENS_AFTER: &str = "foldgate.tokens_after";
/// `foldgate.fold_wait_ms`: how long the request waited for a digest.
pub const FOLD_WAIT_MS: &str = "foldgate.fold_wait_ms";
/// `foldgate.session`: the hashed, tenant-scoped session key (`x-foldgate-session`).
pub const SESSION: &str = "foldgate.session";
/// `foldgate.retried`: the request was sent again, deeper compacted, after an overflow.
pub const RETRIED: &str = "foldgate.retried";
/// `foldgate.learned_window`: the context window learned from an overflow it was
/// planned against.
pub const LEARNED_WINDOW: &str = "foldgate.learned_window";
/// `foldgate.summarizer`: who wrote a digest (`llm`, `extractive`).
pub const SUMMARIZER: &str = "foldgate.summarizer";
/// `foldgate.store`: the session store's backend (`memory`, `redis`).
pub const STORE: &str = "foldgate.store";
/// `foldgate.fold`: why a background fold was made (`due`, `prefetch`).
pub const FOLD: &str = "foldgate.fold";

/// True when spans are exported.
pub fn on() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// The span the calling code runs in, when spans are exported (a disabled span, found
/// without asking the subscriber, when they are not).
pub fn current() -> Span {
    if on() { Span::current() } else { Span::none() }
}

/// The span of one request of a compacted route (`route`), named after `operation` until
/// the request's model is known (see [`record_turn`]), whose upstream speaks `provider`'s
/// API, whose id is `request_id`. A root span: the client's trace is continued with
/// [`super::context::continue_remote`].
pub fn request(
    route: &'static str,
    operation: &'static str,
    provider: &'static str,
    request_id: Option<&str>,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "request",
        otel.name = operation,
        otel.kind = "server",
    );
    if !span.is_disabled() {
        span.set_attribute(ROUTE, route);
        span.set_attribute(OPERATION, operation);
        span.set_attribute(PROVIDER, provider);
        span.set_attribute(SYSTEM, provider);
        record_request_id(&span, request_id);
    }
    span
}

/// The span of one request forwarded as it is (`method`, id `request_id`), outside the
/// compacted routes.
pub fn passthrough(method: &str, request_id: Option<&str>) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "passthrough",
        otel.kind = "server",
    );
    if !span.is_disabled() {
        span.set_attribute(ROUTE, "passthrough");
        span.set_attribute(HTTP_METHOD, method.to_owned());
        record_request_id(&span, request_id);
    }
    span
}

fn record_request_id(span: &Span, request_id: Option<&str>) {
    if let Some(id) = request_id {
        span.set_attribute(REQUEST_ID, id.to_owned());
    }
}

/// What a request of a compacted route came to, for [`record_turn`].
#[derive(Debug, Clone, Copy)]
pub struct TurnRecord<'a> {
    /// `gen_ai.operation.name` (the span's name is it and the model).
    pub operation: &'static str,
    /// The request's `model`, as sent; empty when it named none.
    pub model: &'a str,
    /// What happened to it.
    pub outcome: Outcome,
    /// The engine's tier and token counts, when the engine measured the request.
    pub measured: Option<(Tier, usize, usize)>,
    /// How long it waited for a digest.
    pub fold_wait: Duration,
    /// The hashed session key, when the request belongs to a conversation.
    pub session: Option<&'a str>,
    /// Sent again after an overflow.
    pub retried: bool,
    /// The learned window it was planned against.
    pub learned_window: Option<usize>,
}

/// Records on `span` what its request came to.
pub fn record_turn(span: &Span, turn: &TurnRecord<'_>) {
    if span.is_disabled() {
        return;
    }
    if !turn.model.is_empty() {
        // The span started when its request was first polled: renamed through OpenTelemetry.
        let name = format!("{} {}", turn.operation, turn.model);
        span.context().span().update_name(name);
        span.set_attribute(REQUEST_MODEL, turn.model.to_owned());
    }
    span.set_attribute(OUTCOME, turn.outcome.as_str());
    if let Some(session) = turn.session {
        span.set_attribute(SESSION, session.to_owned());
    }
    if let Some((tier, before, after)) = turn.measured {
        span.set_attribute(TIER, i64::from(tier.number()));
        span.set_attribute(TOKENS_BEFORE, count(before));
        span.set_attribute(TOKENS_AFTER, count(after));
    }
    span.set_attribute(FOLD_WAIT_MS, i64::try_from(turn.fold_wait.as_millis()).unwrap_or(i64::MAX));
    span.set_attribute(RETRIED, turn.retried);
    if let Some(window) = turn.learned_window {
        span.set_attribute(LEARNED_WINDOW, count(window));
    }
}

/// Records on `span` what happened to its request, when nothing else is known of it.
pub fn record_outcome(span: &Span, outcome: Outcome) {
    if !span.is_disabled() {
        span.set_attribute(OUTCOME, outcome.as_str());
    }
}

/// Token usage an upstream reported, for [`record_usage`].
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageRecord<'a> {
    /// Prompt tokens, cached ones included.
    pub input: u64,
    /// Completion tokens.
    pub output: u64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_creation: u64,
    /// The model the answer names.
    pub response_model: Option<&'a str>,
}

/// Records on `span` the usage its answer reported.
pub fn record_usage(span: &Span, usage: &UsageRecord<'_>) {
    if span.is_disabled() {
        return;
    }
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.set_attribute(INPUT_TOKENS, tokens(usage.input));
    span.set_attribute(OUTPUT_TOKENS, tokens(usage.output));
    span.set_attribute(CACHE_READ_TOKENS, tokens(usage.cache_read));
    if usage.cache_creation > 0 {
        span.set_attribute(CACHE_CREATION_TOKENS, tokens(usage.cache_creation));
    }
    if let Some(model) = usage.response_model {
        span.set_attribute(RESPONSE_MODEL, model.to_owned());
    }
}

/// Records on `span` the status of the answer its client got; a 5xx is an error.
pub fn record_status(span: &Span, status: u16) {
    if span.is_disabled() {
        return;
    }
    span.set_attribute(HTTP_STATUS, i64::from(status));
    if status >= 500 {
        failed(span, &status.to_string());
    }
}

/// Marks `span` as failed for `reason` (`error.type`, and the span's status).
pub fn failed(span: &Span, reason: &str) {
    if span.is_disabled() {
        return;
    }
    span.set_attribute(ERROR_TYPE, reason.to_owned());
    span.set_status(Status::error(reason.to_owned()));
}

/// The span of one session store operation (`op` on `backend`), a child of the current
/// span; disabled outside of one (the sweeper, a calibration after the answer), so that
/// no trace is made of a store operation alone.
pub fn store(op: StoreOp, backend: &'static str) -> Span {
    let parent = current();
    if parent.is_none() {
        return Span::none();
    }
    let redis = backend == "redis";
    let span = tracing::info_span!(
        target: TARGET,
        parent: &parent,
        "store",
        otel.name = format!("store {}", op.as_str()),
        otel.kind = if redis { "client" } else { "internal" },
    );
    span.set_attribute(DB_OPERATION, op.as_str());
    span.set_attribute(STORE, backend);
    if redis {
        span.set_attribute(DB_SYSTEM, "redis");
    }
    span
}

/// The span of one summarizer call (`kind`), a child of the current span.
pub fn summarize(kind: SummarizerKind) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "summarize",
        otel.kind = "internal",
    );
    span.set_attribute(SUMMARIZER, kind.as_str());
    span
}

/// The span of one model call a digest is asked in: `provider`'s API, `model`; a child
/// of the current span. The call carries its trace context (see
/// [`super::context::inject`]).
pub fn model_call(provider: &'static str, model: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "model_call",
        otel.name = format!("chat {model}"),
        otel.kind = "client",
    );
    if !span.is_disabled() {
        span.set_attribute(OPERATION, "chat");
        span.set_attribute(PROVIDER, provider);
        span.set_attribute(SYSTEM, provider);
        span.set_attribute(REQUEST_MODEL, model.to_owned());
    }
    span
}

/// Marks `span` as failed for a summarizer `reason`.
pub fn summarizer_failed(span: &Span, reason: FailureReason) {
    failed(span, reason.as_str());
}

/// The span of a fold made in the background (`why`: `due`, `prefetch`): a trace of its
/// own, linked to the request that started it (the current span), since it outlives that
/// request.
pub fn background_fold(why: &'static str) -> Span {
    let cause = current();
    if !on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "background_fold",
        otel.kind = "internal",
    );
    span.follows_from(&cause);
    span.set_attribute(FOLD, why);
    span
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
