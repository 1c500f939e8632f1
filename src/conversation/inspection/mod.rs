//! The session inspector's side of the conversation stage: each request's entry in its
//! conversation's inspection record, and the views of those records and of the stored
//! state (`views`) that the edge serves as JSON (`crate::http::inspect`).

mod views;

use std::sync::Arc;

use serde_json::Value;

use super::{Change, Decision, SessionState};
use crate::session::record::{
    CHANGES_MAX, ChangeEntry, FoldEntry, InstructionEntry, RequestChanges, RequestEntry,
    UsageEntry, now_ms,
};
use crate::session::{RecordStore, RecordUpdate, SessionKey, SessionStore, StateStore, StoreError};
use crate::vocab::{CompactionApi, Outcome};

/// At most this many sessions are listed.
const LIST_MAX: usize = 1000;

/// Records requests into their conversations' inspection records and reads them back,
/// with the conversations' stored state.
pub struct Inspection {
    records: Arc<dyn RecordStore>,
    states: Arc<dyn StateStore<SessionState>>,
    history: usize,
}

impl Inspection {
    /// Over `store` (its records and states only), keeping `history` requests per
    /// conversation.
    pub fn new(store: Arc<dyn SessionStore<SessionState>>, history: usize) -> Self {
        Self { records: store.clone(), states: store, history }
    }

    /// What `decision` did, for the record of conversation `key` of `tenant` (the hash
    /// of the request's credential): written by [`PendingRecord::write`] once the answer
    /// ended, with the usage it reported.
    pub fn entry(
        &self,
        tenant: Option<String>,
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
            request.instructions = (report.instructions.iter())
                .map(|i| InstructionEntry {
                    source: i.source,
                    text: i.text.chars().take(500).collect(),
                })
                .collect();
            request.pinned = report.pinned.iter().map(|&i| small(i)).collect();
        }
        if let (None, Some(error)) = (&decision.report, &decision.error) {
            // Failed open: the reason is the why.
            request.why.clone_from(error);
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
            tenant,
            model: model.to_owned(),
            request,
            changes,
            folds,
            history: self.history,
        };
        PendingRecord { records: self.records.clone(), key: key.clone(), update }
    }

    /// The sessions, most recently seen first; only `tenant`'s when given.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Value, StoreError> {
        let found = self.records.records(tenant, LIST_MAX).await?;
        Ok(views::list(&found))
    }

    /// One session: its record and stored state; `None` when there is no such session,
    /// or (`tenant` given) it is not that tenant's.
    pub async fn show(
        &self,
        key: &SessionKey,
        tenant: Option<&str>,
    ) -> Result<Option<Value>, StoreError> {
        let record = self.records.record_of(key).await?;
        if let Some(tenant) = tenant {
            if record.as_ref().and_then(|r| r.summary.tenant.as_deref()) != Some(tenant) {
                return Ok(None);
            }
        }
        let state = self.states.load(key).await?.map(|l| l.state);
        if record.is_none() && state.is_none() {
            return Ok(None);
        }
        let record = record.unwrap_or_default();
        Ok(Some(views::detail(key, record, state.as_ref(), self.history)))
    }

    /// Forgets a session (state and record): its next request folds afresh. False when
    /// there was none.
    pub async fn forget(&self, key: &SessionKey) -> Result<bool, StoreError> {
        let forgotten = self.states.forget(key).await?;
        if forgotten {
            tracing::info!(session = key.as_str(), "session forgotten by the inspection API");
        }
        Ok(forgotten)
    }
}

/// What is known of a request besides its decision.
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
    records: Arc<dyn RecordStore>,
    key: SessionKey,
    update: RecordUpdate,
}

impl PendingRecord {
    /// Writes the entry, with the usage the upstream reported, if any. Never waits (see
    /// [`RecordStore::record`]).
    pub fn write(mut self, usage: Option<UsageEntry>) {
        self.update.request.usage = usage;
        self.records.record(&self.key, self.update);
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
