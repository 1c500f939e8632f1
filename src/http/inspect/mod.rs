//! The session inspector: what foldgate did to each conversation (its fold blocks with
//! the digests that replaced them, its drops, its last requests' tokens before and
//! after), for operators on an address of their own (`admin.listen`, see [`admin`]) and
//! for each tenant under the proxy port at `/foldgate/sessions` (see [`tenant`]).
//!
//! Off by default. When on, every request of a compacted route adds an entry to its
//! conversation's inspection record ([`Inspector::entry`]); the views are the
//! conversation stage's ([`Inspection`]), served here as JSON.

pub mod admin;
pub mod tenant;

use http::{HeaderMap, Response, StatusCode, header};

use super::body::{ProxyBody, full};
use super::error::ProxyError;
use crate::conversation::Decision;
pub use crate::conversation::{EdgeFacts, Inspection, PendingRecord};
use crate::session::SessionKey;

/// The inspection API over the conversation stage's records and views.
pub struct Inspector {
    inspection: Inspection,
    tenant_view: bool,
}

impl Inspector {
    /// An inspector over `inspection`; serving tenants their own sessions when
    /// `tenant_view`.
    pub fn new(inspection: Inspection, tenant_view: bool) -> Self {
        Self { inspection, tenant_view }
    }

    /// The record entry of a request with `headers` (its tenant is the hash of its
    /// credential); see [`Inspection::entry`].
    pub fn entry(
        &self,
        headers: &HeaderMap,
        key: &SessionKey,
        model: &str,
        decision: &Decision,
        edge: EdgeFacts<'_>,
    ) -> PendingRecord {
        let tenant = super::session_key::tenant(headers);
        self.inspection.entry(tenant, key, model, decision, edge)
    }

    /// The sessions, most recently seen first; only `tenant`'s when given.
    async fn list(&self, tenant: Option<&str>) -> Result<Response<ProxyBody>, ProxyError> {
        let view = self.inspection.list(tenant).await.map_err(unavailable)?;
        Ok(json(StatusCode::OK, &view))
    }

    /// One session: its record and stored state. A tenant gets 404 for a session that is
    /// not its own, exactly as for one that does not exist.
    async fn show(
        &self,
        key: &str,
        tenant: Option<&str>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let key = session_key(key)?;
        let view = self.inspection.show(&key, tenant).await.map_err(unavailable)?;
        let view = view.ok_or(ProxyError::SessionNotFound)?;
        Ok(json(StatusCode::OK, &view))
    }

    /// Forgets a session (state and record): its next request folds afresh.
    async fn forget(&self, key: &str) -> Result<Response<ProxyBody>, ProxyError> {
        let key = session_key(key)?;
        if !self.inspection.forget(&key).await.map_err(unavailable)? {
            return Err(ProxyError::SessionNotFound);
        }
        Ok(json(StatusCode::OK, &serde_json::json!({"forgotten": key.as_str()})))
    }
}

/// A session key as given in a path: 32 lowercase hex digits, else no such session.
fn session_key(text: &str) -> Result<SessionKey, ProxyError> {
    let hex = text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if hex { Ok(SessionKey::from_digest(text)) } else { Err(ProxyError::SessionNotFound) }
}

fn unavailable(e: crate::session::StoreError) -> ProxyError {
    ProxyError::StoreUnavailable(e.to_string())
}

/// A JSON answer that no cache keeps.
fn json(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    headers.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    response
}
