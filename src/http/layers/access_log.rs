//! One log line per request when its response body ends (or is dropped): method,
//! path (never the query, which may carry keys), status, duration, request id.
//! Headers are never logged, so credentials cannot leak here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http::{HeaderValue, Method, Response, StatusCode, Uri};

use super::request_id::X_REQUEST_ID;
use crate::http::body::{BodyEnd, BodyObserver, Observed, ProxyBody};
use crate::http::wire::server::{ClientRequest, ClientService};
use crate::telemetry::access::{self, AccessLine};

/// The access log around a service.
#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
}

impl<S> AccessLog<S> {
    /// `inner`, its requests logged.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: ClientService> ClientService for AccessLog<S> {
    fn call(
        &mut self,
        request: ClientRequest,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<S> {
        // At a level that drops access lines, the body is not watched at all.
        if !tracing::enabled!(tracing::Level::INFO) {
            return ResponseFuture { inner: self.inner.call(request), record: None };
        }
        // Shared, not copied: the method, the target and the id (the request id layer
        // put it in `x-request-id`).
        let record = Record {
            method: request.method().clone(),
            uri: request.uri().clone(),
            request_id: request.headers().get(&X_REQUEST_ID).cloned(),
            start: Instant::now(),
            status: StatusCode::OK,
        };
        ResponseFuture { inner: self.inner.call(request), record: Some(record) }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`AccessLog`]: the inner service's, its answer's body watched
    /// for the line.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        record: Option<Record>,
    }
}

impl<F: Future<Output = Response<ProxyBody>>> Future for ResponseFuture<F> {
    type Output = Response<ProxyBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx));
        Poll::Ready(match this.record.take() {
            Some(record) => {
                let record = Record { status: response.status(), ..record };
                response
                    .map(|body| http_body_util::BodyExt::boxed_unsync(Observed::new(body, record)))
            }
            None => response,
        })
    }
}

/// What the access line says of a request, gathered before its answer.
#[derive(Debug)]
struct Record {
    method: Method,
    uri: Uri,
    request_id: Option<HeaderValue>,
    start: Instant,
    status: StatusCode,
}

/// Logs once when the response body ends, fails or is dropped: straight into
/// foldgate's log when it runs one (see [`crate::telemetry::access`]), else through
/// `tracing`.
/// The duration ends at the body's last frame, before its flush.
impl BodyObserver for Record {
    fn end(&mut self, how: BodyEnd) {
        let outcome = match how {
            BodyEnd::Complete => "complete",
            BodyEnd::Failed => "body_error",
            BodyEnd::Dropped => "aborted",
        };
        let duration_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        let request_id = self.request_id.as_ref().and_then(|id| id.to_str().ok());
        let line = AccessLine {
            method: self.method.as_str(),
            path: self.uri.path(),
            status: self.status.as_u16(),
            duration_us,
            request_id: request_id.unwrap_or("-"),
            outcome,
        };
        if access::write(&line) {
            return;
        }
        tracing::info!(
            method = %self.method,
            path = %line.path,
            status = self.status.as_u16(),
            duration_ms = line.duration_ms(),
            request_id = %line.request_id,
            outcome,
            "request"
        );
    }
}
