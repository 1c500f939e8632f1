//! One log line per request when its response body ends (or is dropped): method,
//! path (never the query, which may carry keys), status, duration, request id.
//! Headers are never logged, so credentials cannot leak here.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::request_id::RequestId;
use crate::http::body::{BoxError, ProxyBody};

/// Adds the access log to a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLogLayer;

impl<S> tower::Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AccessLog { inner }
    }
}

/// See [`AccessLogLayer`].
#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for AccessLog<S>
where
    S: tower::Service<Request<B>, Response = Response<ProxyBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ProxyBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let record = Record {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            request_id: request
                .extensions()
                .get::<RequestId>()
                .and_then(|id| id.0.to_str().ok())
                .unwrap_or("-")
                .to_owned(),
            start: Instant::now(),
            status: StatusCode::OK,
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            let record = Record { status: response.status(), ..record };
            Ok(response.map(|body| {
                http_body_util::BodyExt::boxed_unsync(Logged { inner: body, record: Some(record) })
            }))
        })
    }
}

struct Record {
    method: Method,
    path: String,
    request_id: String,
    start: Instant,
    status: StatusCode,
}

impl Record {
    fn emit(self, outcome: &'static str) {
        tracing::info!(
            method = %self.method,
            path = %self.path,
            status = self.status.as_u16(),
            duration_ms = self.start.elapsed().as_secs_f64() * 1000.0,
            request_id = %self.request_id,
            outcome,
            "request"
        );
    }
}

/// The response body, logging once when it ends, fails or is dropped.
struct Logged {
    inner: ProxyBody,
    record: Option<Record>,
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish("complete"),
            Poll::Ready(Some(Err(_))) => self.finish("body_error"),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Logged {
    fn finish(&mut self, outcome: &'static str) {
        if let Some(record) = self.record.take() {
            record.emit(outcome);
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // A body dropped before its end: the client went away or the stream was cut.
        let outcome = if self.inner.is_end_stream() { "complete" } else { "aborted" };
        self.finish(outcome);
    }
}
