//! `x-request-id`: taken from the request when well-formed, generated otherwise;
//! stored in the request's extensions, sent upstream, and returned to the client.

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

fn generate() -> HeaderValue {
    let id = uuid::Uuid::new_v4().simple().to_string();
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
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
    }
}
