//! What the engine did to one request.

use serde::Serialize;

use super::budget::Budget;

/// The report of one `compact` call (serializable for `--report-json` and logs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The budget planned against.
    pub budget: Budget,
    /// Prompt tokens of the original request.
    pub tokens_before: usize,
    /// False when `tokens_before` is the cheap upper bound (far below the trigger).
    pub tokens_before_exact: bool,
    /// Prompt tokens of the forwarded request.
    pub tokens_after: usize,
    /// Highest tier applied: 0 none (or stored blocks only), 1 elide, 2 fold, 4 fallback.
    pub tier: u8,
    /// The call was forced (below the trigger).
    pub forced: bool,
    /// Messages in the original request.
    pub messages_before: usize,
    /// Messages forwarded.
    pub messages_after: usize,
    /// Original messages forwarded verbatim (in the tail or inside fold blocks).
    pub kept: usize,
    /// Original messages forwarded with their content replaced by a stub.
    pub elided: usize,
    /// Original messages folded into a digest.
    pub folded: usize,
    /// Original messages not forwarded in any form.
    pub dropped: usize,
    /// Stored fold blocks reused byte for byte.
    pub blocks_reused: usize,
    /// Fold blocks made by this call.
    pub blocks_new: usize,
    /// Stored fold blocks dropped because the history no longer matched.
    pub blocks_invalidated: usize,
    /// A block summarized ahead of need (prefetch) was applied, with no summarizer call.
    pub used_prefetched: bool,
    /// Summarizer used for new blocks.
    pub summarizer: Option<String>,
    /// Why the summarizer failed, if it did (the extractive digest was used instead).
    pub summarizer_error: Option<String>,
    /// Artifact recall of the new digest before missing artifacts were appended.
    pub artifact_recall: Option<f64>,
    /// The forwarded prompt fits `window - reserve`.
    pub fits: bool,
}
