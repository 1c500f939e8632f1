//! API shapes at the edge of the conversation service. A [`Dialect`] knows one shape's
//! bodies: it reads a body into the engine's neutral request, renders the body to
//! forward, measures it for the quick decision, keys its conversation. It names its two
//! other parts: how its providers report an overflow ([`OverflowSignals`], in an error
//! answer or in the first events of a stream; `overflow.rs`), and the providers'
//! compaction API its requests may ask for ([`CompactionFamily`], in
//! `super::provider_compaction`). Dialects hold no state: what is
//! learned from providers lives in [`crate::learned`], sessions, summarizers and the
//! retry in [`crate::conversation`], the request's path in [`super::exchange`]. A new API
//! shape is a new file here.
//!
//! Dialects are used through generics, never `dyn`: the quick path of a request far below
//! the trigger stays as cheap as a direct call.

pub mod chat;
pub mod messages;
pub mod overflow;
pub mod responses;
pub mod responses_compact;

use bytes::Bytes;
use http::HeaderMap;

pub use self::overflow::{OverflowSignals, StreamEvent};
use super::provider_compaction::CompactionFamily;
#[cfg(doc)]
use super::provider_compaction::NoCompactionApi;
use super::session_key::SessionHeaders;
use crate::conversation::{Measure, Rewritten};
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;

pub use chat::ChatCompletions;
pub use messages::Messages;
pub use responses::Responses;
pub use responses_compact::ResponsesCompact;

/// One API shape, as the exchange and the conversation stage need it.
pub trait Dialect: Send + Sync + 'static {
    /// What a scan that does not parse reads of a body (fields, message extents).
    type Outline<'a>;

    /// Where the neutral messages of a parsed body came from (the original items that
    /// rendering writes back byte for byte); `()` for chat completions, whose body is the
    /// neutral request itself.
    type Origins: Send + Sync + 'static;

    /// How this shape's providers say a prompt is longer than the window.
    type Overflow: OverflowSignals;

    /// The providers' compaction API requests of this shape may ask for
    /// ([`NoCompactionApi`] when none).
    type Compaction: CompactionFamily;

    /// The route label of this shape's requests.
    fn route(&self) -> Route;

    /// The overflow signals of this shape's providers.
    fn overflow(&self) -> Self::Overflow;

    /// The provider compaction API of this shape, if it has one.
    fn compaction(&self) -> Option<Self::Compaction>;

    /// The outline of `body`; `None` when the scan cannot follow it (it is parsed then).
    fn outline<'a>(&self, body: &'a Bytes) -> Option<Self::Outline<'a>>;

    /// The model an outline names.
    fn outline_model(&self, outline: &Self::Outline<'_>) -> Option<String>;

    /// What the outline tells of the body's size, for the conversation stage's quick
    /// decision ([`Conversations::clearly_below`]); `None` when the body must be counted
    /// exactly (parsed, compacted).
    ///
    /// [`Conversations::clearly_below`]: crate::conversation::Conversations::clearly_below
    fn measure<'o>(&self, outline: &'o Self::Outline<'_>) -> Option<Measure<'o>>;

    /// The session key of a request known only by its outline (the same as the parsed
    /// request's); `None` when the outline does not tell it (the body is parsed then).
    fn outline_session_key(
        &self,
        headers: &HeaderMap,
        session_header: &SessionHeaders,
        outline: &Self::Outline<'_>,
    ) -> Option<SessionKey>;

    /// The body as the engine's neutral request and the origins of its messages; `None`
    /// when it is not a request of this shape that foldgate understands (it is then
    /// forwarded as it is).
    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, Self::Origins)>;

    /// For a shape whose provider keeps conversations by response id (the Responses
    /// API): the response a body continues (`previous_response_id`), if any.
    fn continues(&self, body: &[u8]) -> Option<String> {
        let _ = body;
        None
    }

    /// `body`, which continues a response, read as the whole conversation: `items` (the
    /// stored conversation up to that response) then its own input; `None` when it
    /// cannot be.
    fn expand_chain(&self, body: &[u8], items: &[u8]) -> Option<Bytes> {
        let _ = (body, items);
        None
    }

    /// The conversation items of `body` (as a JSON array text) to store with its
    /// answer's output, for a shape whose answers can be continued by id; `None` when
    /// this answer will not be (or the body has none). `continued`: the body is a chain
    /// foldgate expanded.
    fn chain_items(&self, body: &[u8], continued: bool) -> Option<String> {
        let _ = (body, continued);
        None
    }

    /// True when a parsed request relies on conversation state the provider keeps (e.g.
    /// a Responses `previous_response_id`): it is forwarded as received, never compacted.
    fn server_state(&self, origins: &Self::Origins) -> bool {
        let _ = origins;
        false
    }

    /// The session key of a parsed request (the same as its outline's).
    fn session_key(
        &self,
        headers: &HeaderMap,
        session_header: &SessionHeaders,
        request: &ChatRequest,
    ) -> SessionKey {
        super::session_key::session_key(headers, session_header, request)
    }

    /// The body to forward for the compacted neutral request the engine wrote, given
    /// the body as received and the origins its parse gave: every message the engine
    /// kept as its original item(s), every other field as received.
    fn render(&self, original: &Bytes, origins: &Self::Origins, compacted: &Rewritten) -> Bytes;

    /// True when this shape's providers count tokens with an encoder the engine does
    /// not have (Anthropic's): the engine's counts are then calibrated against the usage
    /// the upstream reports, per model and per conversation (see [`crate::learned`]).
    fn calibrated(&self) -> bool {
        false
    }

    /// The API the model summarizer speaks for this shape's conversations when it uses
    /// the client's credential (see [`crate::summarizer::llm::LlmSummarizer::bind_for`]);
    /// `None` when the client's credential must not be used for digests (they are then
    /// extractive, unless `summarizer.api_key` names a summarizer of its own).
    fn summary_api(&self, headers: &HeaderMap) -> Option<SummaryApi> {
        let _ = headers;
        Some(SummaryApi::ChatCompletions)
    }
}
