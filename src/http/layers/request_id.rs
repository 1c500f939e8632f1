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
    HeaderValue::from_bytes(&hex_pair(prefix, n))
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// `{a:016x}{b:016x}` without going through the formatter.
fn hex_pair(a: u64, b: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        let word = if i < 16 { a } else { b };
        let shift = 60 - 4 * (i % 16);
        *digit = b"0123456789abcdef"[((word >> shift) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_ids() {
        assert!(is_well_formed(&HeaderValue::from_static("abc-123")));
        assert!(!is_well_formed(&HeaderValue::from_static("has space")));
        assert!(!is_well_formed(&HeaderValue::from_str(&"x".repeat(200)).unwrap()));
        let pair = hex_pair(0x0123_4567_89ab_cdef, 42);
        assert_eq!(
            std::str::from_utf8(&pair).unwrap(),
            format!("{:016x}{:016x}", 0x0123_4567_89ab_cdef_u64, 42)
        );
        let id = generate();
        assert_eq!(id.len(), 32);
        assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit), "{id:?}");
        assert_ne!(generate(), generate(), "ids are unique");
    }
}
