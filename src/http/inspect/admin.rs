//! The inspection listener (`admin.listen`): the page at `/`, and the API
//! `GET /sessions`, `GET /sessions/{key}`, `DELETE /sessions/{key}` behind
//! `Authorization: Bearer <admin.token>` when a token is set. The token is compared in
//! constant time (as SHA-256 digests) and never logged.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use super::Inspector;
use crate::http::body::{ProxyBody, full};
use crate::http::error::ProxyError;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/inspector.js");
const STYLE: &str = include_str!("page/inspector.css");

/// The inspection API and page: the inspector and the token guarding the API.
pub struct Admin {
    inspector: Arc<Inspector>,
    /// SHA-256 of `admin.token`; `None`: no token set (a loopback address).
    token: Option<[u8; 32]>,
}

impl Admin {
    /// The API over `inspector`, guarded by `token` unless it is empty.
    pub fn new(inspector: Arc<Inspector>, token: &str) -> Self {
        let token = (!token.is_empty()).then(|| Sha256::digest(token.as_bytes()).into());
        Self { inspector, token }
    }

    /// True when `headers` carry the token (or none is needed).
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.token else { return true };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        let given: [u8; 32] = Sha256::digest(given).into();
        // Every byte is compared, whatever the first difference.
        given.iter().zip(expected).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    /// Answers one request of the inspection listener (its body, if any, is not read).
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ProxyBody> {
        let (parts, _) = request.into_parts();
        self.route(&parts).await.unwrap_or_else(ProxyError::into_response)
    }

    async fn route(&self, request: &Parts) -> Result<Response<ProxyBody>, ProxyError> {
        let path = request.uri.path();
        match (&request.method, path) {
            (&Method::GET, "/" | "/index.html") => Ok(asset(INDEX, "text/html; charset=utf-8")),
            (&Method::GET, "/inspector.js") => Ok(asset(SCRIPT, "text/javascript; charset=utf-8")),
            (&Method::GET, "/inspector.css") => Ok(asset(STYLE, "text/css; charset=utf-8")),
            (method, p) if p == "/sessions" || p.starts_with("/sessions/") => {
                if !self.authorized(&request.headers) {
                    return Err(ProxyError::Unauthorized("admin.token"));
                }
                match (method, p.strip_prefix("/sessions/")) {
                    (&Method::GET, None) => self.inspector.list(None).await,
                    (&Method::GET, Some(key)) => self.inspector.show(key, None).await,
                    (&Method::DELETE, Some(key)) => self.inspector.forget(key).await,
                    _ => Err(ProxyError::NotFound(p.to_owned())),
                }
            }
            _ => Err(ProxyError::NotFound(path.to_owned())),
        }
    }
}

/// A page asset: no outside source may be loaded by it.
fn asset(body: &'static str, content_type: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'"),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    response
}

/// Serves the inspection listener until the task is aborted.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let admin = admin.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let admin = admin.clone();
            async move { Ok::<_, Infallible>(admin.handle(request).await) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Inspection, SessionState};
    use crate::session::MemoryStore;

    fn admin(token: &str) -> Admin {
        let store = Arc::new(MemoryStore::<SessionState>::new(Duration::from_secs(60), 10));
        Admin::new(Arc::new(Inspector::new(Inspection::new(store, 10), true)), token)
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn the_token_is_checked_when_set() {
        let guarded = admin("s3cret");
        assert!(guarded.authorized(&bearer("Bearer s3cret")));
        assert!(!guarded.authorized(&bearer("Bearer s3cre")));
        assert!(!guarded.authorized(&bearer("s3cret")));
        assert!(!guarded.authorized(&HeaderMap::new()));
        assert!(admin("").authorized(&HeaderMap::new()));
    }
}
