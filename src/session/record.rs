//! What the session inspector shows of a conversation besides its state: who it belongs
//! to (a tenant hash), its model, and the last requests (tokens before and after, tier,
//! waits), folds and drops.
//!
//! Bounded: a record keeps at most `history` requests and `history` folds (the oldest
//! go first), plus a few counters. Kept apart from the conversation's state so that a
//! request decided from its outline (no state loaded or saved) is recorded too, and so
//! that several replicas append to one record without a compare-and-swap. Every field
//! has a default, so records written by an older release stay readable.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::vocab::{Outcome, ProviderApi};

/// Number of tiers counted (0 to 4, see `compaction::Tier`).
pub const TIERS: usize = 5;

/// One request of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestEntry {
    /// When it was decided, in milliseconds since the Unix epoch.
    pub at: u64,
    /// Prompt tokens as received.
    pub tokens_before: u32,
    /// Prompt tokens as forwarded.
    pub tokens_after: u32,
    /// Deepest compaction tier applied (0 to 4).
    pub tier: u8,
    /// What happened.
    pub outcome: Outcome,
    /// Milliseconds it waited for a digest.
    pub wait_ms: u32,
    /// Fold blocks it made.
    pub folds: u16,
    /// Original messages it did not forward in any form.
    pub dropped: u32,
    /// Messages it carried.
    pub messages: u32,
    /// It was sent again, compacted deeper, after a context-overflow error.
    pub retried: bool,
    /// The provider's compaction API foldgate served on it, when it changed the request.
    pub api: Option<ProviderApi>,
    /// Prompt tokens the provider caches again because of its compaction.
    pub rewritten: u32,
}

/// A fold block, as recorded by the request that made it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FoldEntry {
    /// When, in milliseconds since the Unix epoch.
    pub at: u64,
    /// First original message of the range it replaced.
    pub start: u32,
    /// One past the last original message of that range.
    pub end: u32,
}

/// What one request adds to its conversation's record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordUpdate {
    /// The hash of the request's credential (`None`: it carried none).
    pub tenant: Option<String>,
    /// The request's model.
    pub model: String,
    /// The request.
    pub request: RequestEntry,
    /// The fold blocks it made.
    pub folds: Vec<FoldEntry>,
    /// At most this many requests (and folds) are kept.
    pub history: usize,
}

/// One conversation's record, as listed: counters and the last request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// The tenant (credential hash) the conversation belongs to.
    pub tenant: Option<String>,
    /// Model of the last request.
    pub model: String,
    /// First request, in milliseconds since the Unix epoch.
    pub first_seen: u64,
    /// Last request, in milliseconds since the Unix epoch.
    pub last_seen: u64,
    /// Requests recorded in all (the history keeps the last ones).
    pub requests: u64,
    /// Prompt tokens of the last request as received.
    pub tokens_before: u32,
    /// Prompt tokens of the last request as forwarded.
    pub tokens_after: u32,
    /// Fold blocks made in all.
    pub folds: u64,
    /// Requests that dropped messages.
    pub drops: u64,
    /// Requests by deepest tier applied (index = tier).
    pub tiers: [u64; TIERS],
    /// Requests on which foldgate served a provider's compaction API (see
    /// [`RequestEntry::api`]).
    pub provider_compactions: u64,
}

impl Summary {
    /// Counts `update` in.
    pub fn apply(&mut self, update: &RecordUpdate) {
        let request = &update.request;
        if self.tenant.is_none() {
            self.tenant.clone_from(&update.tenant);
        }
        if self.first_seen == 0 {
            self.first_seen = request.at;
        }
        self.model.clone_from(&update.model);
        self.last_seen = request.at;
        self.requests += 1;
        self.tokens_before = request.tokens_before;
        self.tokens_after = request.tokens_after;
        self.folds += update.folds.len() as u64;
        self.drops += u64::from(request.dropped > 0);
        self.tiers[usize::from(request.tier).min(TIERS - 1)] += 1;
        self.provider_compactions += u64::from(request.api.is_some());
    }
}

/// One conversation's whole record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    /// Counters and the last request.
    pub summary: Summary,
    /// The last requests, oldest first.
    pub requests: VecDeque<RequestEntry>,
    /// The last folds made, oldest first.
    pub folds: VecDeque<FoldEntry>,
}

impl Record {
    /// Adds `update`, dropping the oldest requests and folds past its `history`.
    pub fn apply(&mut self, update: RecordUpdate) {
        self.summary.apply(&update);
        let limit = update.history.max(1);
        self.requests.push_back(update.request);
        self.folds.extend(update.folds);
        trim(&mut self.requests, limit);
        trim(&mut self.folds, limit);
    }
}

fn trim<T>(queue: &mut VecDeque<T>, limit: usize) {
    let excess = queue.len().saturating_sub(limit);
    queue.drain(..excess);
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(at: u64, tier: u8, folds: usize, history: usize) -> RecordUpdate {
        RecordUpdate {
            tenant: Some("t".into()),
            model: "gpt-4o".into(),
            request: RequestEntry { at, tier, tokens_before: 10, dropped: 0, ..Default::default() },
            folds: (0..folds).map(|i| FoldEntry { at, start: i as u32, end: 1 }).collect(),
            history,
        }
    }

    #[test]
    fn a_record_keeps_the_last_requests_and_counts_them_all() {
        let mut record = Record::default();
        for at in 1..=10 {
            record.apply(update(at, (at % 5) as u8, 1, 4));
        }
        assert_eq!(record.requests.len(), 4);
        assert_eq!(record.requests.front().map(|r| r.at), Some(7));
        assert_eq!(record.folds.len(), 4);
        let summary = &record.summary;
        assert_eq!(
            (summary.requests, summary.folds, summary.first_seen, summary.last_seen),
            (10, 10, 1, 10)
        );
        assert_eq!(summary.tiers, [2, 2, 2, 2, 2]);
        assert_eq!(summary.tenant.as_deref(), Some("t"));
    }

    #[test]
    fn records_of_an_older_layout_stay_readable() {
        let old =
            r#"{"summary":{"model":"m","requests":3},"requests":[{"at":5,"tokens_before":9}]}"#;
        let record: Record = serde_json::from_str(old).unwrap();
        assert_eq!(record.summary.requests, 3);
        assert_eq!(record.requests[0].tokens_before, 9);
        assert_eq!(record.requests[0].outcome, Outcome::Passthrough);
        assert!(record.folds.is_empty());
    }
}
