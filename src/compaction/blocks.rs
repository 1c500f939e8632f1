//! Fold blocks: the stored, reusable result of folding a range of the history.
//!
//! A block covers original messages `[start, end)` and holds the exact JSON text of the
//! messages it emits instead (the range's pinned and small user messages verbatim, then
//! one digest). A later request of the same conversation reuses a block byte for byte
//! while its history still holds the same messages in that range (checked by a hash of
//! their hashes), so the forwarded prefix stays the same and provider prompt caches keep
//! hitting. Blocks are contiguous from message 0; the first block that no longer matches
//! is dropped with every block after it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

use super::budget::TokenRatio;
use super::tokens::TokenCache;
use super::trail::Trail;
use super::units::{Unit, is_boundary};
use crate::model::{Message, ModelError};

/// One fold block.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoldBlock {
    /// First original message covered.
    pub start: usize,
    /// One past the last original message covered.
    pub end: usize,
    /// Hash of the hashes of the covered messages' JSON text.
    pub range_hash: u64,
    /// The messages emitted in place of the range, as exact JSON text.
    pub messages: Vec<Box<RawValue>>,
    /// Original indices of the messages emitted verbatim (pinned and small user messages).
    pub verbatim: Vec<usize>,
    /// Which summarizer wrote the digest.
    pub summarizer: String,
    /// Share of the trail entries the digest shows that its summarizer named itself.
    pub artifact_recall: Option<f64>,
    /// The work trail of the conversation up to `end` (`None`: stored before trails were
    /// kept; rebuilt from the originals when needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trail: Option<Trail>,
    /// The digest is a goal history (tier 3): earlier turns and digests batched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub goal_batch: bool,
}

impl PartialEq for FoldBlock {
    fn eq(&self, other: &Self) -> bool {
        self.start == other.start
            && self.end == other.end
            && self.range_hash == other.range_hash
            && self.messages.len() == other.messages.len()
            && self.messages.iter().zip(&other.messages).all(|(a, b)| a.get() == b.get())
    }
}

impl FoldBlock {
    /// The original indices of its range that it folds (those not kept verbatim), in
    /// order; the verbatim list is searched sorted, not once per index.
    pub fn folded_indices(&self, end: usize) -> impl Iterator<Item = usize> + '_ {
        let mut verbatim = self.verbatim.clone();
        verbatim.sort_unstable();
        (self.start..end.min(self.end)).filter(move |i| verbatim.binary_search(i).is_err())
    }

    /// The emitted messages, parsed.
    pub fn emitted(&self) -> Result<Vec<Arc<Message>>, ModelError> {
        self.messages.iter().map(|raw| Message::from_raw(raw.clone()).map(Arc::new)).collect()
    }
}

/// What the caller keeps per conversation between requests.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionState {
    /// Fold blocks, contiguous from message 0, oldest first.
    pub blocks: Vec<FoldBlock>,
    /// Token counts of messages seen before; never serialized (recomputable, and the
    /// largest part of a state).
    #[serde(skip)]
    pub token_cache: TokenCache,
    /// A fold block summarized ahead of need (prefetch). It is applied only once a request
    /// needs compaction and it still continues `blocks`; until then requests stay unchanged.
    #[serde(default)]
    pub pending: Option<FoldBlock>,
    /// What elision and the fallback cut after the blocks in the last compacted request:
    /// reapplied as long as the prompt stays under the trigger, so that a cut changes the
    /// forwarded prefix once per many requests, not on every request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<CutItem>,
    /// The cut was made for a fold postponed while its digest is written: it is reused
    /// while the request fits, but the fold is still due (see [`crate::compaction::Engine`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_postponed: bool,
    /// The conversation's own ratio of provider-counted to engine-counted prompt tokens,
    /// once the provider reported usage for it (an API whose tokenizer the engine lacks):
    /// planned against in place of [`super::Options::token_ratio`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ratio: Option<TokenRatio>,
    /// Where the conversation's compaction instructions came from so far (one bit per
    /// [`crate::vocab::InstructionSource`]): each source is counted once per conversation.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub instruction_sources: u8,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// One item of a stored cut: a unit of the history (from original message `pos`) dropped,
/// or forwarded as other messages (its tool results stubbed), or a block's digest (at
/// the block's start) dropped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CutItem {
    /// Original index of the unit's first message (of a digest: its block's start).
    pub pos: usize,
    /// Hash of that message (of a digest: of the digest), to check that the history is
    /// still the same.
    pub hash: u64,
    /// The messages forwarded instead, as exact JSON text; `None`: dropped.
    pub messages: Option<Vec<Box<RawValue>>>,
}

/// Hash of the messages `msgs` (one range).
pub fn range_hash(msgs: &[Arc<Message>]) -> u64 {
    let mut h = Xxh3::new();
    for m in msgs {
        h.update(&m.hash().to_le_bytes());
    }
    h.digest()
}

/// True when `block` starts at `start` and still covers the same messages of `msgs`.
fn matches_at(block: &FoldBlock, start: usize, msgs: &[Arc<Message>], units: &[Unit]) -> bool {
    block.start == start
        && block.end > block.start
        && block.end <= msgs.len()
        && is_boundary(units, block.end)
        && range_hash(&msgs[block.start..block.end]) == block.range_hash
}

/// True when `block` can follow `blocks` (already matched against `msgs`).
pub fn continues(
    block: &FoldBlock,
    blocks: &[FoldBlock],
    msgs: &[Arc<Message>],
    units: &[Unit],
) -> bool {
    matches_at(block, blocks.last().map_or(0, |b| b.end), msgs, units)
}

/// True when `block` can be applied after `blocks`: it follows them, or it absorbs them
/// (it starts at message 0 and reaches past their end).
pub fn applies(
    block: &FoldBlock,
    blocks: &[FoldBlock],
    msgs: &[Arc<Message>],
    units: &[Unit],
) -> bool {
    let end = blocks.last().map_or(0, |b| b.end);
    continues(block, blocks, msgs, units)
        || (block.start == 0 && block.end > end && matches_at(block, 0, msgs, units))
}

/// Adds `block` after `blocks`, or in their place when it starts at message 0.
pub fn add_block(blocks: &mut Vec<FoldBlock>, block: FoldBlock) {
    if block.start == 0 {
        blocks.clear();
    }
    blocks.push(block);
}

/// Drops the stored blocks from the first that folds a message now pinned (a pattern
/// added since it was made): it is forwarded whole again. Returns how many were dropped.
pub fn unfold_pinned(blocks: &mut Vec<FoldBlock>, pinned: &[bool]) -> usize {
    if pinned.is_empty() {
        return 0;
    }
    let folds_pin = |b: &FoldBlock| b.folded_indices(pinned.len()).any(|i| pinned[i]);
    let keep = blocks.iter().position(folds_pin).unwrap_or(blocks.len());
    let dropped = blocks.len() - keep;
    blocks.truncate(keep);
    dropped
}

/// Keeps the leading blocks that still match `msgs`; returns how many were dropped.
pub fn retain_matching(
    blocks: &mut Vec<FoldBlock>,
    msgs: &[Arc<Message>],
    units: &[Unit],
) -> usize {
    let mut expected_start = 0;
    let mut keep = 0;
    for b in blocks.iter() {
        if !matches_at(b, expected_start, msgs, units) {
            break;
        }
        expected_start = b.end;
        keep += 1;
    }
    let dropped = blocks.len() - keep;
    blocks.truncate(keep);
    dropped
}
