//! Summarizers: turn the messages of a fold region into digest text.
//!
//! The engine calls a [`Summarizer`] once per new fold block. [`ExtractiveSummarizer`]
//! builds the digest without a model; it is also the engine's fallback when another
//! summarizer fails. [`llm`] asks a model for the digest. [`artifacts`] tells the lines of a
//! result that report an error.

pub mod artifacts;
pub mod extractive;
pub mod llm;

use std::sync::Arc;

use async_trait::async_trait;

pub use extractive::ExtractiveSummarizer;

pub use crate::vocab::{FailureReason, SummarizerKind};

use crate::model::Message;

/// Errors of a summarizer. On any of them but [`SummarizerError::Deferred`] the engine
/// uses the extractive digest.
#[derive(Debug, thiserror::Error)]
pub enum SummarizerError {
    /// The summarizer did not answer in time.
    #[error("summarizer timed out")]
    Timeout,
    /// The summarizer failed (unclassified).
    #[error("summarizer failed: {0}")]
    Failed(String),
    /// The model path kept failing and is skipped until its cooldown ends; no call made.
    #[error("summarizer circuit open: model path skipped during its cooldown")]
    CircuitOpen,
    /// The model endpoint answered with a non-2xx status.
    #[error("summarizer upstream answered {status}{}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Status {
        /// The HTTP status code.
        status: u16,
        /// The OpenAI error `code` or `type`, when the body has a short one.
        code: Option<String>,
    },
    /// The call could not be made or its answer not read (connect, TLS, I/O).
    #[error("summarizer transport error: {0}")]
    Transport(String),
    /// The model answered 2xx with something that is not a usable digest.
    #[error("summarizer answer unusable: {0}")]
    InvalidResponse(String),
    /// Another process is summarizing this conversation right now: no digest is made
    /// (not even the extractive one) and the request goes on with the folds it has.
    #[error("another process is summarizing this conversation")]
    Deferred,
}

impl SummarizerError {
    /// The bounded failure reason (a metric label); `None` for an unclassified `Failed`
    /// and for `Deferred`, which is no failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Self::Timeout => Some(FailureReason::Timeout),
            Self::Failed(_) | Self::Deferred => None,
            Self::CircuitOpen => Some(FailureReason::CircuitOpen),
            Self::Status { .. } => Some(FailureReason::Status),
            Self::Transport(_) => Some(FailureReason::Transport),
            Self::InvalidResponse(_) => Some(FailureReason::InvalidResponse),
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
    /// What kind of digest to write.
    pub kind: DigestKind,
    /// The conversation as its provider last saw it, and where the region ends in it: a
    /// model summarizer that sends these messages first is served them from the
    /// provider's prompt cache.
    pub shared: Option<SharedPrefix<'a>>,
    /// What the client asked of this digest besides (a compaction API's `instructions`):
    /// a model summarizer adds it to its instruction; the extractive digest cannot.
    pub instructions: Option<&'a str>,
}

/// The kinds of digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestKind {
    /// Tier 2: the work of one stretch of the conversation.
    Fold,
    /// Tier 3: the oldest whole turns, user messages and earlier digests included, as one
    /// goal history (goal arc, human direction, achieved, dead ends, lasting
    /// constraints, key artifacts).
    GoalBatch,
}

/// The conversation as last forwarded (the previous forwarded request, then what the
/// client added since), which the provider has cached, and where in it the region to
/// digest ends.
#[derive(Debug, Clone, Copy)]
pub struct SharedPrefix<'a> {
    /// The messages, in order: stored blocks' messages, then the originals (as cut by
    /// the last request, if it was).
    pub messages: &'a [Arc<Message>],
    /// The region ends before `messages[end]`: the messages from there on stay in the
    /// context as they are (`messages.len()`: the region runs to the end).
    pub end: usize,
    /// The request's `tools`, as raw JSON.
    pub tools: Option<&'a str>,
    /// The digest replaces the whole conversation above, earlier digests included (not
    /// only what follows the last digest).
    pub whole: bool,
}

/// What a model summarizer sends for one digest: its messages and tool definitions, in
/// order (for pricing a replay).
#[derive(Debug, Clone, Default)]
pub struct ModelPrompt {
    /// The messages sent.
    pub messages: Vec<Arc<Message>>,
    /// The `tools` sent, as raw JSON.
    pub tools: Option<String>,
}

/// Writes the digest of a fold region: sections in the order of DESIGN.md ("Standing
/// facts & constraints", "Milestones", "Key decisions", "Findings", "Attempted &
/// abandoned", "Current state", "Open items", "Key artifacts"), each omitted when empty.
/// The engine adds the `[COMPACTED CONTEXT]` marker and checks and completes "Key
/// artifacts" from the work trail; summarizers return the body only.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// What writes the digests: a model, or the extractive digest. A wrapper gives the
    /// kind of what it wraps.
    fn kind(&self) -> SummarizerKind;

    /// The kind's name, for reports and logs (`extractive`, `llm`).
    fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The digest body for `input`.
    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError>;

    /// What [`Summarizer::summarize`] would send a model for `input`; `None` when it calls
    /// no model.
    fn prompt(&self, _input: &SummaryInput<'_>) -> Option<ModelPrompt> {
        None
    }
}
