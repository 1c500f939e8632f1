//! Summarizers: turn the messages of a fold region into digest text.
//!
//! The engine calls a [`Summarizer`] once per new fold block. [`ExtractiveSummarizer`]
//! builds the digest without a model; it is also the engine's fallback when another
//! summarizer fails. [`artifacts`] extracts the exact strings a digest must keep.

pub mod artifacts;
pub mod extractive;

use std::sync::Arc;

use async_trait::async_trait;

pub use extractive::ExtractiveSummarizer;

use crate::model::Message;

/// Errors of a summarizer.
#[derive(Debug, thiserror::Error)]
pub enum SummarizerError {
    /// The summarizer did not answer in time.
    #[error("summarizer timed out")]
    Timeout,
    /// The summarizer failed.
    #[error("summarizer failed: {0}")]
    Failed(String),
}

impl SummarizerError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Failed(_) => "failed",
        }
    }
}

/// What a summarizer gets for one fold region.
#[derive(Debug, Clone, Copy)]
pub struct SummaryInput<'a> {
    /// The messages of the fold region, in order (user messages included, as context).
    pub messages: &'a [Arc<Message>],
    /// The digest of the previous fold block, if any, for continuity.
    pub prior_digest: Option<&'a str>,
    /// The digest should stay within about this many tokens.
    pub max_tokens: usize,
}

/// Writes the digest of a fold region: sections in the order of DESIGN.md ("Standing
/// facts & constraints", "Milestones", "Key decisions", "Findings", "Attempted &
/// abandoned", "Current state", "Open items", "Key artifacts"), each omitted when empty.
/// The engine adds the `[COMPACTED CONTEXT]` marker; summarizers return the body only.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// A short name for reports and metrics (`extractive`, `llm`).
    fn name(&self) -> &'static str;

    /// The digest body for `input`.
    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError>;
}
