//! Each tenant's view of its own sessions on the proxy port: `GET /foldgate/sessions`
//! and `GET /foldgate/sessions/{key}`, authorized by the caller's own API key. Only the
//! sessions that key scopes are listed, and another tenant's key answers 404, exactly
//! as a key that does not exist.

use http::{HeaderMap, Method, Response};

use super::Inspector;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::session_key;

/// The path prefix of the tenant view.
pub const PREFIX: &str = "/foldgate/sessions";

/// Answers a request under `/foldgate/` (`method`, `path`, `headers`); `inspector` is
/// `None` when the view is off.
pub async fn handle(
    inspector: Option<&Inspector>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Some(inspector) = inspector.filter(|i| i.tenant_view) else {
        return Err(ProxyError::NotFound(path.to_owned()));
    };
    let rest = path.strip_prefix(PREFIX).filter(|r| r.is_empty() || r.starts_with('/'));
    let (Some(rest), &Method::GET) = (rest, method) else {
        return Err(ProxyError::NotFound(path.to_owned()));
    };
    let Some(tenant) = session_key::tenant(headers) else {
        return Err(ProxyError::Unauthorized("an API key"));
    };
    match rest.strip_prefix('/') {
        None | Some("") => inspector.list(Some(&tenant)).await,
        Some(key) => inspector.show(key, Some(&tenant)).await,
    }
}
