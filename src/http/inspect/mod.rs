//! The session inspector: what foldgate did to each conversation (its fold blocks with
//! the digests that replaced them, its drops, its last requests' tokens before and
//! after), for operators on an address of their own (`admin.listen`, see [`admin`]) and
//! for each tenant under the proxy port at `/foldgate/sessions` (see [`tenant`]).
//!
//! Off by default. When on, every chat request adds an entry to its conversation's
//! inspection record in the session store ([`Inspector::record`]); the views read those
//! records and the conversations' stored state.

pub mod admin;
pub mod tenant;
mod views;

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode, header};

use super::body::{ProxyBody, full};
use super::error::ProxyError;
use crate::conversation::Decision;
use crate::conversation::{Change, SessionState};
use crate::session::record::{
    CHANGES_MAX, ChangeEntry, FoldEntry, RequestChanges, RequestEntry, UsageEntry, now_ms,
};
use crate::session::{RecordUpdate, SessionKey, SessionStore};
use crate::vocab::{CompactionApi, Outcome};

/// At most this many sessions are listed.
const LIST_MAX: usize = 1000;

/// Records requests into their conversations' inspection records and reads them back.
pub struct Inspector {
    store: Arc<dyn SessionStore<SessionState>>,
    history: usize,
    tenant_view: bool,
}

impl Inspector {
    /// An inspector over `store`, keeping `history` requests per conversation; serving
    /// tenants their own sessions when `tenant_view`.
    pub fn new(
        store: Arc<dyn SessionStore<SessionState>>,
        history: usize,
        tenant_view: bool,
    ) -> Self {
        Self { store, history, tenant_view }
    }

    /// What `decision` did, for the record of conversation `key` (the tenant is the
    /// hash of the request's credential): written by [`PendingRecord::write`] once the
    /// answer ended, with the usage it reported.
    pub fn entry(
        &self,
        headers: &HeaderMap,
        key: &SessionKey,
        model: &str,
        decision: &Decision,
        edge: EdgeFacts<'_>,
    ) -> PendingRecord {
        let EdgeFacts { retried, api, notes } = edge;
        let at = now_ms();
        let mut changes = RequestChanges::default();
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut request = RequestEntry {
            at,
            outcome: decision.outcome,
            wait_ms: u32::try_from(decision.fold_wait.as_millis()).unwrap_or(u32::MAX),
            folds: u16::try_from(decision.new_blocks.len()).unwrap_or(u16::MAX),
            retried,
            api,
            ..RequestEntry::default()
        };
        if let Some(report) = &decision.report {
            request.tokens_before = small(report.tokens_before);
            request.tokens_after = match decision.outcome.engine_compacted() {
                false => request.tokens_before,
                true => small(report.tokens_after),
            };
            request.tier = report.tier.number();
            if decision.rewritten.is_some() {
                request.rewritten = small(report.rewritten_tokens);
            }
            request.messages = small(report.messages_before);
            if request.outcome != Outcome::Passthrough {
                request.dropped = small(report.dropped);
            }
            if decision.outcome.engine_compacted() {
                request.stubbed = small(report.elided);
                let all = &report.changes;
                changes.changes = all.iter().take(CHANGES_MAX).map(change_entry).collect();
                changes.more = small(all.len().saturating_sub(CHANGES_MAX));
            }
            request.why = report.why();
        }
        if !notes.is_empty() {
            let why = std::mem::take(&mut request.why);
            request.why = notes
                .iter()
                .cloned()
                .chain((!why.is_empty()).then_some(why))
                .collect::<Vec<_>>()
                .join(", ");
        }
        let folds = decision
            .new_blocks
            .iter()
            .map(|&(start, end)| FoldEntry { at, start: small(start), end: small(end) })
            .collect();
        let update = RecordUpdate {
            tenant: super::session_key::tenant(headers),
            model: model.to_owned(),
            request,
            changes,
            folds,
            history: self.history,
        };
        PendingRecord { store: self.store.clone(), key: key.clone(), update }
    }

    /// The sessions, most recently seen first; only `tenant`'s when given.
    async fn list(&self, tenant: Option<&str>) -> Result<Response<ProxyBody>, ProxyError> {
        let found = self.store.records(tenant, LIST_MAX).await.map_err(unavailable)?;
        Ok(json(StatusCode::OK, &views::list(&found)))
    }

    /// One session: its record and stored state. A tenant gets 404 for a session that is
    /// not its own, exactly as for one that does not exist.
    async fn show(
        &self,
        key: &str,
        tenant: Option<&str>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let key = session_key(key)?;
        let record = self.store.record_of(&key).await.map_err(unavailable)?;
        if let Some(tenant) = tenant {
            if record.as_ref().and_then(|r| r.summary.tenant.as_deref()) != Some(tenant) {
                return Err(ProxyError::SessionNotFound);
            }
        }
        let state = self.store.load(&key).await.map_err(unavailable)?.map(|l| l.state);
        if record.is_none() && state.is_none() {
            return Err(ProxyError::SessionNotFound);
        }
        let view = views::detail(&key, record.unwrap_or_default(), state.as_ref(), self.history);
        Ok(json(StatusCode::OK, &view))
    }

    /// Forgets a session (state and record): its next request folds afresh.
    async fn forget(&self, key: &str) -> Result<Response<ProxyBody>, ProxyError> {
        let key = session_key(key)?;
        if !self.store.forget(&key).await.map_err(unavailable)? {
            return Err(ProxyError::SessionNotFound);
        }
        tracing::info!(session = key.as_str(), "session forgotten by the inspection API");
        Ok(json(StatusCode::OK, &serde_json::json!({"forgotten": key.as_str()})))
    }
}

/// What the edge knows of a request besides its decision.
#[derive(Debug, Clone, Copy)]
pub struct EdgeFacts<'a> {
    /// It was sent again, compacted deeper, after a context overflow.
    pub retried: bool,
    /// The provider compaction API foldgate served on it, when it changed it.
    pub api: Option<CompactionApi>,
    /// Changes foldgate made besides the engine's compaction, in a few words each.
    pub notes: &'a [String],
}

/// A request's record entry, to be written when its answer has ended.
pub struct PendingRecord {
    store: Arc<dyn SessionStore<SessionState>>,
    key: SessionKey,
    update: RecordUpdate,
}

impl PendingRecord {
    /// Writes the entry, with the usage the upstream reported, if any. Never waits (see
    /// [`SessionStore::record`]).
    pub fn write(mut self, usage: Option<UsageEntry>) {
        self.update.request.usage = usage;
        self.store.record(&self.key, self.update);
    }
}

/// A change as recorded.
fn change_entry(change: &Change) -> ChangeEntry {
    let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    ChangeEntry {
        kind: change.kind,
        tier: change.tier.number(),
        start: small(change.start),
        end: small(change.end),
        tokens_before: small(change.tokens_before),
        tokens_after: small(change.tokens_after),
        text: change.text.clone(),
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
