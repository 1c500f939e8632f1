//! The compaction engine: plans how a chat request's `messages` are compacted to fit a
//! token budget. Pure and synchronous except the summarizer call; knows nothing of HTTP.
//!
//! Entry point: [`Engine::compact`] (or [`Engine::compact_request`] for a parsed
//! request) with the conversation's [`SessionState`], a [`Summarizer`] and [`Options`];
//! it returns a [`Forward`] with a [`Report`]. [`check::verify`] checks the guarantees
//! of a forwarded request against its original. See `docs/COMPACTION.md`.
//!
//! [`Summarizer`]: crate::summarizer::Summarizer

mod blocks;
mod budget;
mod changes;
pub mod check;
pub(crate) mod engine;
mod fold;
mod forward;
mod keep;
mod pass;
mod plan;
mod price;
mod report;
pub mod steer;
pub mod tokens;
pub(crate) mod trail;
mod units;
mod whole;

pub use blocks::{FoldBlock, SessionState};
pub use budget::{Budget, Options, TokenRatio};
pub use changes::{Change, ChangeKind};
pub use engine::Engine;
pub use forward::Forward;
pub use price::{Choice, PlanKind};
pub use report::{Report, Tier};
pub use tokens::TokenCache;
pub use whole::{FoldWhen, WholeFold};

use crate::model::ModelError;

/// Errors of the engine. The caller forwards the original request on any of them.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// The body is not a chat request the engine understands.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The messages pin patterns pin do not fit the budget beside what no compaction
    /// takes out: nothing may be folded in their place, so the request goes as sent.
    #[error(
        "pinned messages take {pinned} tokens; with the tools, system messages and last user message that is {essentials}, more than the prompt budget of {budget}: the request goes as sent"
    )]
    PinsDoNotFit {
        /// Tokens of the messages pin patterns pin.
        pinned: usize,
        /// With the tools, priming, system messages and last user message.
        essentials: usize,
        /// The prompt budget.
        budget: usize,
    },
}
