//! Traces at the edge, when spans are exported (`[telemetry]`): the span of each request,
//! continuing the trace of the client's `traceparent`; the trace context of every request
//! sent upstream, naming foldgate's span in place of the client's; what a turn came to,
//! recorded on its span. With export off, nothing here does any work, and the client's
//! `traceparent` reaches the upstream unchanged, as any header does.

/// Awaits the future `$work` makes with `$span` entered at each poll, as
/// `tracing::Instrument` does, but pinned where it is made instead of moved into a
/// wrapper: the handler's future is large, and moving it into `Instrumented` cost every
/// request a copy of it (about 700 instructions of `memcpy` at 2 KB), spans exported or
/// not.
macro_rules! in_span {
    ($span:expr, $work:expr) => {{
        let span: &tracing::Span = $span;
        let mut work = std::pin::pin!($work);
        std::future::poll_fn(|cx| {
            let _entered = span.enter();
            std::future::Future::poll(work.as_mut(), cx)
        })
        .await
    }};
}
pub(crate) use in_span;

use http::header::{HeaderMap, HeaderValue};
use tracing::Span;

use super::layers::request_id::X_REQUEST_ID;
use crate::conversation::Decision;
use crate::metrics::Route;
use crate::telemetry::{context, span};
use crate::vocab::Outcome;

/// The span of a request of a compacted `route` (`/v1/responses/compact`: `compact`),
/// continuing the client's trace.
pub fn request_span(route: Route, compact: bool, headers: &HeaderMap) -> Span {
    if !span::on() {
        return Span::none();
    }
    let provider = if route == Route::Messages { "anthropic" } else { "openai" };
    let operation = if compact { "compact" } else { "chat" };
    let label = if compact { "responses_compact" } else { route.as_str() };
    let span = span::request(label, operation, provider, request_id(headers));
    continue_client_trace(&span, headers);
    span
}

/// The span of a request forwarded as it is, continuing the client's trace.
pub fn passthrough_span(method: &http::Method, headers: &HeaderMap) -> Span {
    if !span::on() {
        return Span::none();
    }
    let span = span::passthrough(method.as_str(), request_id(headers));
    continue_client_trace(&span, headers);
    span
}

/// Replaces the trace context in `headers` (a request about to go upstream) with the
/// current span's, when there is one.
pub fn propagate(headers: &mut HeaderMap) {
    let current = span::current();
    if current.is_disabled() {
        return;
    }
    for name in context::HEADERS {
        headers.remove(name);
    }
    context::inject(&current, |name, value| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    });
}

/// Records on the current span what a turn came to: `decision` for the request of
/// `model` in conversation `session`, sent again after an overflow when `retried`,
/// planned against the `learned` window.
pub fn record_turn(
    decision: &Decision,
    session: &str,
    model: &str,
    retried: bool,
    learned: Option<usize>,
) {
    let current = span::current();
    if current.is_disabled() {
        return;
    }
    let measured = decision.report.as_ref().map(|r| (r.tier, r.tokens_before, r.tokens_after));
    let turn = span::TurnRecord {
        operation: "chat",
        model,
        outcome: decision.outcome,
        measured,
        fold_wait: decision.fold_wait,
        session: Some(session),
        retried,
        learned_window: learned,
    };
    span::record_turn(&current, &turn);
}

/// Records on the current span the `outcome` of a request no turn took (compaction off,
/// a body foldgate does not understand).
pub fn record_outcome(outcome: Outcome) {
    span::record_outcome(&span::current(), outcome);
}

/// Records on the current span what a `/v1/responses/compact` request of `model` came
/// to: folded by foldgate as `report` says, or (`None`) nothing to fold.
pub fn record_compact(model: &str, report: Option<&crate::conversation::Report>) {
    let current = span::current();
    if current.is_disabled() {
        return;
    }
    let turn = span::TurnRecord {
        operation: "compact",
        model,
        outcome: if report.is_some() { Outcome::Compacted } else { Outcome::Passthrough },
        measured: report.map(|r| (r.tier, r.tokens_before, r.tokens_after)),
        fold_wait: std::time::Duration::ZERO,
        session: None,
        retried: false,
        learned_window: None,
    };
    span::record_turn(&current, &turn);
}

/// Records on `span` the status its client got.
pub fn record_status(span: &Span, status: http::StatusCode) {
    span::record_status(span, status.as_u16());
}

fn continue_client_trace(span: &Span, headers: &HeaderMap) {
    context::continue_remote(span, |name| headers.get(name).and_then(|v| v.to_str().ok()));
}

fn request_id(headers: &HeaderMap) -> Option<&str> {
    headers.get(&X_REQUEST_ID).and_then(|v| v.to_str().ok())
}
