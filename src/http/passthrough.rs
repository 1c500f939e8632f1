//! Byte-for-byte forwarding: the request streams to the upstream, the response streams back.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap};
use http::{Request, Response, Version};
use hyper::body::Incoming;

use super::body::{BodyProgress, Limited, ProxyBody, boxed};
use super::error::ProxyError;
use super::headers::strip_hop_by_hop;
use super::trace;
use super::upstream::{Upstream, UpstreamBody};
use super::usage_tap::{tapped, team_of};
use crate::metrics::{Metrics, Route};

/// Forwards `request` to the upstream, streaming both bodies; `max_body` bounds the
/// request, whose reading is recorded in `progress`.
pub async fn forward(
    upstream: &Upstream,
    max_body: u64,
    metrics: &Arc<Metrics>,
    request: Request<Incoming>,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let started = Instant::now();
    if declared_length(request.headers()).is_some_and(|len| len > max_body) {
        return Err(ProxyError::BodyTooLarge { limit: max_body });
    }
    let team = team_of(metrics, request.headers());
    let (parts, body) = request.into_parts();
    let body = boxed(Limited::new(body, max_body, progress.clone()));
    let outgoing = upstream_request(upstream, parts, body)?;
    metrics.observe_proxy_overhead(Route::Passthrough, started.elapsed().as_secs_f64());
    let sent = Instant::now();
    let result = upstream.send(outgoing).await;
    metrics.observe_upstream_ttfb(Route::Passthrough, sent.elapsed().as_secs_f64());
    match result {
        Ok(response) => Ok(tapped(client_response(response), metrics, None, team, None)),
        Err(_) if progress.exceeded() => Err(ProxyError::BodyTooLarge { limit: max_body }),
        Err(e) => Err(e),
    }
}

/// Builds the upstream request: same method, headers minus hop-by-hop, mapped URI.
pub fn upstream_request(
    upstream: &Upstream,
    parts: http::request::Parts,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, ProxyError> {
    build_request(upstream, parts.method, &parts.uri, parts.headers, body)
}

/// Builds an upstream request from its pieces (see [`upstream_request`]); with traces
/// exported, its trace context names the current span.
pub fn build_request(
    upstream: &Upstream,
    method: http::Method,
    uri: &http::Uri,
    mut headers: HeaderMap,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, ProxyError> {
    let uri = upstream
        .target_uri(uri.path(), uri.query())
        .map_err(|e| ProxyError::UpstreamUnreachable(format!("cannot build upstream URI: {e}")))?;
    strip_hop_by_hop(&mut headers);
    // Traces exported: the upstream's parent span is foldgate's, not the client's.
    trace::propagate(&mut headers);
    // The connection pool sets Host for the upstream (HTTP/1.1) or drops it (HTTP/2,
    // which has `:authority`); an expectation is between client and foldgate.
    headers.remove(header::EXPECT);
    let mut outgoing = Request::new(body);
    *outgoing.method_mut() = method;
    *outgoing.uri_mut() = uri;
    *outgoing.headers_mut() = headers;
    // The pooled connection decides between HTTP/1.1 and HTTP/2 (ALPN).
    Ok(outgoing)
}

/// The upstream's response as the client gets it: status, headers (minus hop-by-hop), body.
pub fn client_response(response: Response<UpstreamBody>) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_11;
    Response::from_parts(parts, boxed(body))
}

/// The request's `Content-Length`, if it has a valid one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
