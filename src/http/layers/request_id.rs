//! `x-request-id`: taken from the request when well-formed, generated otherwise;
//! stored in the request's extensions, sent upstream, and returned to the client.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Request, Response};

/// The header name.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id, in request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub HeaderValue);

/// Adds [`RequestId`] handling to a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

/// See [`RequestIdLayer`].
#[derive(Debug, Clone)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for RequestIdService<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let id = request
            .headers()
            .get(&X_REQUEST_ID)
            .filter(|v| is_well_formed(v))
            .cloned()
            .unwrap_or_else(generate);
        request.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
        request.extensions_mut().insert(RequestId(id.clone()));
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            response.headers_mut().insert(X_REQUEST_ID.clone(), id);
            Ok(response)
        })
    }
}

/// Visible ASCII, at most 128 bytes: anything else could poison logs.
fn is_well_formed(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// 32 hex digits: a random per-process prefix (so replicas never collide) and a counter
/// (so no request pays for a system call to the random source).
fn generate() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    HeaderValue::from_str(&format!("{prefix:016x}{n:016x}"))
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_ids() {
        assert!(is_well_formed(&HeaderValue::from_static("abc-123")));
        assert!(!is_well_formed(&HeaderValue::from_static("has space")));
        assert!(!is_well_formed(&HeaderValue::from_str(&"x".repeat(200)).unwrap()));
        assert_eq!(generate().len(), 32);
        assert_ne!(generate(), generate(), "ids are unique");
    }
}
