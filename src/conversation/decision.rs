//! What the conversation stage decided for one request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::compaction::{Report, TokenRatio, WholeFold};
use crate::model::ChatRequest;
use crate::vocab::Outcome;

/// The decision for one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// What happened.
    pub outcome: Outcome,
    /// The compacted request to forward, when it is not the original.
    pub rewritten: Option<Rewritten>,
    /// The engine's report, when the engine ran to the end (boxed: the decision moves
    /// from the engine to the exchange's record, and the report is most of it).
    pub report: Option<Box<Report>>,
    /// The session store failed; the request was handled without stored state.
    pub store_error: bool,
    /// Why compaction failed, for the log.
    pub error: Option<String>,
    /// How long the request waited for a digest (a summarizer call, or a background
    /// fold of its conversation to land); zero when it did not.
    pub fold_wait: Duration,
    /// The original message ranges `[start, end)` of the fold blocks this request made
    /// (for the session inspector).
    pub new_blocks: Vec<(usize, usize)>,
    /// The conversation's own token ratio as stored when the request was decided (see
    /// [`crate::compaction::SessionState::token_ratio`]); `None` without one, or without a session load.
    pub token_ratio: Option<TokenRatio>,
    /// A fold was needed while a background fold of the conversation ran.
    pub(super) blocked: bool,
}

/// A compacted request: the neutral (chat-completions) body the engine wrote, and the
/// same request structured, from which other API shapes render their own body.
#[derive(Debug, Clone)]
pub struct Rewritten {
    /// The neutral request serialized.
    pub body: Bytes,
    /// The neutral request.
    pub request: Arc<ChatRequest>,
}

impl Decision {
    /// Nothing to compact: forward the original bytes (`report` says what was measured).
    pub fn unchanged(report: Report) -> Self {
        Self { report: Some(Box::new(report)), ..Self::original(Outcome::Passthrough) }
    }

    /// Forwarded as received without running the engine: a request that relies on
    /// conversation state the provider keeps.
    pub fn passthrough() -> Self {
        Self::original(Outcome::Passthrough)
    }

    /// Compaction did not run to the end: forward the original bytes.
    pub fn failed_open(error: String, store_error: bool) -> Self {
        tracing::error!(%error, "compaction failed; forwarding the original request");
        Self { store_error, error: Some(error), ..Self::original(Outcome::FailedOpen) }
    }

    /// `request` folded whole (`fold`) for one of the providers' compaction APIs.
    pub fn folded_whole(request: &ChatRequest, fold: &WholeFold) -> Self {
        let folded = Arc::new(fold.request(request));
        let rewritten = Rewritten { body: Bytes::from(folded.to_vec()), request: folded };
        Self {
            rewritten: Some(rewritten),
            report: Some(Box::new(fold.report.clone())),
            ..Self::original(Outcome::Compacted)
        }
    }

    /// The original bytes forwarded with `outcome`, nothing else known.
    fn original(outcome: Outcome) -> Self {
        Self {
            outcome,
            rewritten: None,
            report: None,
            store_error: false,
            error: None,
            fold_wait: Duration::ZERO,
            new_blocks: Vec::new(),
            token_ratio: None,
            blocked: false,
        }
    }
}
