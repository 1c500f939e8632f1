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

use crate::vocab::{ChangeKind, CompactionApi, Outcome};

/// Number of tiers counted (0 to 4, see `compaction::Tier`).
pub const TIERS: usize = 5;

/// A request records at most this many changes (the rest are counted): a long
/// conversation cut hard stays a bounded record entry.
pub const CHANGES_MAX: usize = 64;

/// The changes of only this many of the last requests are kept (each request repeats
/// most of its predecessor's): what a record holds stays small beside the history.
pub const CHANGES_HISTORY: usize = 10;

/// One piece of the compaction instructions in force for a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstructionEntry {
    /// Where it came from.
    pub source: crate::vocab::InstructionSource,
    /// Its text (at most 500 characters here).
    pub text: String,
}

/// One request of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestEntry {
    /// When it was decided, in milliseconds since the Unix epoch.
    pub at: u64,
    /// The compaction instructions in force (past the trigger): where each came from
    /// and its text (at most 500 characters each here).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instructions: Vec<InstructionEntry>,
    /// Messages pin patterns pinned (past the trigger), by index: each forwarded byte
    /// for byte.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<u32>,
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
    /// Original messages it forwarded with their content replaced by a stub.
    pub stubbed: u32,
    /// Messages it carried.
    pub messages: u32,
    /// It was sent again, compacted deeper, after a context-overflow error.
    pub retried: bool,
    /// The provider's compaction API foldgate served on it, when it changed the request.
    pub api: Option<CompactionApi>,
    /// Prompt tokens the provider caches again because of its compaction.
    pub rewritten: u32,
    /// Why it got its tier, in a few words.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The usage the upstream reported for it, when its answer carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageEntry>,
}

/// One change compaction made to a request's messages `start..end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeEntry {
    /// What was done.
    pub kind: ChangeKind,
    /// The tier it belongs to (1 stubbed, 2 folded, 3 goal history, 4 dropped).
    pub tier: u8,
    /// First original message changed.
    pub start: u32,
    /// One past the last.
    pub end: u32,
    /// Their tokens as sent.
    pub tokens_before: u32,
    /// Tokens forwarded in their place.
    pub tokens_after: u32,
    /// The start of the stub or digest forwarded in their place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// The prompt and completion tokens an upstream reported for one request, the prompt
/// split by what the provider's cache did with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UsageEntry {
    /// Prompt tokens in all.
    pub prompt: u64,
    /// Of those, read from the provider's cache.
    pub cache_read: u64,
    /// Of those, written to the provider's cache.
    pub cache_write: u64,
    /// Completion tokens.
    pub completion: u64,
}

/// What compaction changed of one request's messages, in their order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestChanges {
    /// The first [`CHANGES_MAX`] changes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<ChangeEntry>,
    /// Changes past [`CHANGES_MAX`], counted only.
    #[serde(skip_serializing_if = "is_zero")]
    pub more: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
    /// What it changed.
    pub changes: RequestChanges,
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
    /// The changes of the last [`CHANGES_HISTORY`] requests, oldest first: the last of
    /// them belongs to the last request (one is added per request, empty or not).
    pub changes: VecDeque<RequestChanges>,
}

impl Record {
    /// Adds `update`, dropping the oldest requests and folds past its `history`.
    pub fn apply(&mut self, update: RecordUpdate) {
        self.summary.apply(&update);
        let limit = update.history.max(1);
        self.requests.push_back(update.request);
        self.folds.extend(update.folds);
        self.changes.push_back(update.changes);
        trim(&mut self.requests, limit);
        trim(&mut self.folds, limit);
        trim(&mut self.changes, limit.min(CHANGES_HISTORY));
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
            changes: RequestChanges::default(),
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
