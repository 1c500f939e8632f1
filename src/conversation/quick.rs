//! The quick decision: a request whose size, bounded from its text alone, is far below
//! the trigger is forwarded as it is, without parsing it or loading its conversation.
//! The edge measures (a dialect's outline of the body); this stage decides.

use memchr::memmem::Finder;

use crate::compaction::engine::Bound;
use crate::compaction::tokens::REPLY_PRIMING;
use crate::compaction::tokens::count::IMAGE_UNKNOWN;
use crate::compaction::{Engine, Options, Report};
use crate::outline::Outline;

use super::Conversations;

/// What the edge measured of a body without parsing it.
pub enum Measure<'a> {
    /// A chat-completions body, by its outline (message extents, images, calls).
    Outline(&'a Outline<'a>),
    /// A body of another shape, by its bytes (see [`Conversations::clearly_below`]).
    Bytes {
        /// The whole body.
        body: &'a [u8],
        /// How the body names an image block (each charged its most).
        image: &'a Finder<'static>,
        /// A block whose bytes do not bound its tokens (e.g. a PDF, charged by its
        /// pages): when named, the body is counted exactly.
        unbounded: Option<&'a Finder<'static>>,
        /// The raw text of its tool definitions.
        tools: Option<&'a [u8]>,
        /// Its messages, when the outline counted them (for the report).
        messages: usize,
        /// The request's `model`.
        model: Option<String>,
        /// The reply tokens it reserves.
        max_reply: Option<usize>,
    },
}

impl Conversations {
    /// A report of a request left unchanged, when `measure` shows it far below the
    /// trigger (and below `prefetch_ratio`); `None` when it must be parsed and counted.
    ///
    /// A body's bytes bound its tokens: every token of its prompt takes at least one
    /// byte of the JSON text (which also covers the per-message framing of the neutral
    /// form), except images, each charged its most. Tool definitions may become longer
    /// JSON in the neutral form, so they count twice.
    pub fn clearly_below(&self, measure: Measure<'_>, options: &Options) -> Option<Report> {
        below(self.engine(), measure, options)
    }
}

/// [`Conversations::clearly_below`] with `engine`.
pub fn below(engine: &Engine, measure: Measure<'_>, options: &Options) -> Option<Report> {
    {
        match measure {
            Measure::Outline(outline) => engine.clearly_below(outline, options),
            Measure::Bytes { body, image, unbounded, tools, messages, model, max_reply } => {
                let bound = byte_bound(body, image, unbounded, tools, messages)?;
                engine.below_bound(model, max_reply, bound, options)
            }
        }
    }
}

/// The bound of [`Measure::Bytes`] (see [`Conversations::clearly_below`]); `None` when
/// the body names a block its bytes do not bound.
pub fn byte_bound(
    body: &[u8],
    image: &Finder<'_>,
    unbounded: Option<&Finder<'_>>,
    tools: Option<&[u8]>,
    messages: usize,
) -> Option<Bound> {
    if unbounded.is_some_and(|needle| needle.find(body).is_some()) {
        return None;
    }
    let images = image.find_iter(body).count();
    let tools = tools.map_or(0, <[u8]>::len);
    let upper = body.len() + tools + images * IMAGE_UNKNOWN + REPLY_PRIMING;
    Some(Bound { upper, estimate: body.len() / 4, messages })
}
