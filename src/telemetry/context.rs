//! W3C trace context (`traceparent`, `tracestate`): the trace a client's request belongs
//! to, continued by foldgate's span of it, and the context a request foldgate sends
//! carries, naming foldgate's span. Headers are read and written through closures, so
//! that this module knows no HTTP type.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The headers of W3C trace context, which foldgate replaces on what it sends.
pub const HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Makes `span` continue the trace of the `traceparent` (and `tracestate`) that `get`
/// reads, when there is a valid one: the client's span becomes its parent. Call it before
/// `span` is first entered.
pub fn continue_remote<'a>(span: &Span, get: impl Fn(&str) -> Option<&'a str>) {
    if span.is_disabled() {
        return;
    }
    let Some(parent) = get(HEADERS[0]) else { return };
    let found = Found { parent, state: get(HEADERS[1]) };
    let parent = TraceContextPropagator::new().extract(&found);
    // Fails only for a span already started or not exported: it then stays a root.
    let _ = span.set_parent(parent);
}

/// Hands to `set` the `traceparent` (and `tracestate`) naming `span`, for a request sent
/// on its behalf; nothing when spans are not exported.
pub fn inject(span: &Span, set: impl FnMut(&'static str, String)) {
    if span.is_disabled() {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut Write(set));
}

/// The trace context headers of a request, as an [`Extractor`].
struct Found<'a> {
    parent: &'a str,
    state: Option<&'a str>,
}

impl Extractor for Found<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.parent),
            "tracestate" => self.state,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        if self.state.is_some() { HEADERS.to_vec() } else { vec![HEADERS[0]] }
    }
}

/// An [`Injector`] over a header setter.
struct Write<F>(F);

impl<F: FnMut(&'static str, String)> Injector for Write<F> {
    fn set(&mut self, key: &str, value: String) {
        if let Some(name) = HEADERS.iter().find(|name| **name == key) {
            (self.0)(name, value);
        }
    }
}
