//! Byte-for-byte forwarding: the request streams to the upstream, the response streams back.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap};
use http::{Request, Response, Version};

use super::body::{BodyProgress, Limited, ProxyBody, boxed};
use super::error::ProxyError;
use super::headers::strip_hop_by_hop;
use super::record::{AnswerEnds, Record, team_of};
use super::trace;
use super::upstream::{Upstream, UpstreamBody};
use super::wire::UpstreamRequest;
use super::wire::server::ClientRequest;
use crate::metrics::Metrics;

/// Forwards `request` to the upstream, streaming both bodies; `max_body` bounds the
/// request, whose reading is recorded in `progress`. The answer is recorded as `record`
/// says, by the recorder every request has.
pub async fn forward(
    upstream: &Upstream,
    max_body: u64,
    metrics: &Arc<Metrics>,
    request: ClientRequest,
    progress: Arc<BodyProgress>,
    mut record: Record,
) -> Result<Response<ProxyBody>, ProxyError> {
    record.team = team_of(metrics, request.headers());
    let (parts, body) = request.into_parts();
    let body = boxed(Limited::new(body, max_body, progress.clone()));
    let outgoing = upstream_request(upstream, parts, body)?;
    let overhead = record.started.elapsed();
    let sent = Instant::now();
    let result = upstream.send(outgoing).await;
    record.sent(overhead, sent.elapsed());
    match result {
        Ok(response) => {
            Ok(record.watch(client_response(response), true, AnswerEnds::metrics(metrics)))
        }
        Err(error) => {
            record.failed(metrics);
            match progress.exceeded() {
                true => Err(ProxyError::BodyTooLarge { limit: max_body }),
                false => Err(error),
            }
        }
    }
}

/// Builds the upstream request: same method, headers minus hop-by-hop, mapped URI.
pub fn upstream_request(
    upstream: &Upstream,
    parts: http::request::Parts,
    body: ProxyBody,
) -> Result<UpstreamRequest, ProxyError> {
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
) -> Result<UpstreamRequest, ProxyError> {
    let uri = upstream
        .target_of(uri)
        .map_err(|e| ProxyError::UpstreamUnreachable(format!("cannot build upstream URI: {e}")))?;
    strip_hop_by_hop(&mut headers);
    // Traces exported: the upstream's parent span is foldgate's, not the client's.
    trace::propagate(&mut headers);
    // The connection pool sets Host for the upstream (HTTP/1.1) or drops it (HTTP/2,
    // which has `:authority`); an expectation is between client and foldgate.
    headers.remove(header::EXPECT);
    let mut outgoing = Box::new(Request::new(body));
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
