//! Traces at the edge, when spans are exported (`[telemetry]`): the span of each request,
//! continuing the trace of the client's `traceparent`; the trace context of every request
//! sent upstream, naming foldgate's span in place of the client's. What a request came
//! to is recorded on its span by the exchange's recorder. With export off, nothing here does any work, and the client's
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
use crate::metrics::Route;
use crate::telemetry::{context, span};

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
