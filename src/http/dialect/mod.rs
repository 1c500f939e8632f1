//! API shapes at the edge of the conversation service. A [`Dialect`] knows one shape's
//! bodies and errors: it reads a body into the engine's neutral request, renders the body
//! to forward, estimates tokens for the quick decision, recognises an overflow error (in
//! an error answer, or in the first events of a stream). Dialects hold no state: what is
//! learned from providers lives in [`crate::learned`], sessions, summarizers and the
//! retry in [`crate::conversation`], the request's path in [`super::turn`]. A new API
//! shape is a new file here.
//!
//! Dialects are used through generics, never `dyn`: the quick path of a request far below
//! the trigger stays as cheap as a direct call.

pub mod chat;
pub mod messages;
pub mod overflow;
pub mod responses;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::compaction_apis::CompactionApis;
use super::session_key::SessionHeaders;
use super::sse::Event;
use crate::api::anthropic_edits::{AppliedEdit, ContextManagement};
use crate::api::compaction_item::ContextCompaction;
use crate::conversation::{Measure, Rewritten};
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;
use crate::vocab::CompactionApi;

pub use chat::ChatCompletions;
pub use messages::Messages;
pub use responses::Responses;

/// What an event at the start of a 200 event stream tells about the answer.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// Nothing yet (the Responses API's `response.created`, `response.in_progress`).
    Leading,
    /// The answer failed with this error (JSON), an overflow if
    /// [`Dialect::is_overflow`] says so.
    Failed(Vec<u8>),
    /// Anything else: the answer is under way.
    Other,
}

/// A body as the turn reads it, once the providers' compaction APIs that foldgate serves
/// have taken their part (see [`Dialect::prepare`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The body to go on with: as received, or with foldgate's compaction items opened
    /// and the fields foldgate honours taken out.
    pub body: Bytes,
    /// The provider compaction this request asks of foldgate.
    pub served: Option<Served>,
    /// The body asks for a provider compaction that is left to the upstream (it serves
    /// it, or `auto` has not found that it does not).
    pub left_for_upstream: bool,
    /// foldgate serves the provider compaction itself: the headers that would ask the
    /// upstream for it are taken off what is forwarded (see
    /// [`Dialect::forwarded_headers`]).
    pub served_here: bool,
}

impl Prepared {
    /// `body` as it is.
    pub fn unchanged(body: &Bytes) -> Self {
        Self { body: body.clone(), served: None, left_for_upstream: false, served_here: false }
    }
}

/// A provider compaction foldgate serves on one request.
#[derive(Debug, Clone)]
pub enum Served {
    /// Responses `context_management` compaction.
    ResponsesCompaction(ContextCompaction),
    /// Anthropic `context_management.edits`: the clearing edits already applied to the
    /// body, and the edits (a `compact_20260112` among them is made on the turn).
    MessagesEdits {
        /// The edits the request asked for.
        edits: ContextManagement,
        /// The clearing edits that changed the body.
        applied: Vec<AppliedEdit>,
    },
}

/// One API shape, as the conversation service and the handler need it.
pub trait Dialect: Send + Sync + 'static {
    /// What a scan that does not parse reads of a body (fields, message extents).
    type Outline<'a>;

    /// Where the neutral messages of a parsed body came from (the original items that
    /// rendering writes back byte for byte); `()` for chat completions, whose body is the
    /// neutral request itself.
    type Origins: Send + Sync + 'static;

    /// The route label of this shape's requests.
    fn route(&self) -> Route;

    /// The provider compaction API requests of this shape may ask for, if any.
    fn provider_api(&self) -> Option<CompactionApi> {
        None
    }

    /// `body` once foldgate's own compaction items in it are opened and, when foldgate
    /// serves the shape's provider compaction (`serve`), the fields asking for it are
    /// taken out; an error (the request is answered with a 400) says what is wrong.
    fn prepare(
        &self,
        body: &Bytes,
        provider: &CompactionApis,
        serve: bool,
    ) -> Result<Prepared, String> {
        let _ = (provider, serve);
        Ok(Prepared::unchanged(body))
    }

    /// The client's headers as forwarded for `prepared`: as received, unless foldgate
    /// serves the provider compaction and a header of this shape asks the upstream for it.
    fn forwarded_headers(&self, headers: &HeaderMap, prepared: &Prepared) -> HeaderMap {
        let _ = prepared;
        headers.clone()
    }

    /// True when an upstream's error answer says it does not know the provider
    /// compaction fields the request carried.
    fn rejects_provider_compaction(&self, error_body: &[u8]) -> bool {
        super::compaction_apis::rejects_field(error_body, "context_management")
    }

    /// The outline of `body`; `None` when the scan cannot follow it (it is parsed then).
    fn outline<'a>(&self, body: &'a [u8]) -> Option<Self::Outline<'a>>;

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

    /// True when an answer with `status` may be a context overflow (its body is then
    /// peeked at).
    fn may_overflow(&self, status: StatusCode) -> bool {
        matches!(status, StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE)
    }

    /// True for the error bodies this shape's providers give when a prompt is longer
    /// than the window.
    fn is_overflow(&self, error_body: &[u8]) -> bool;

    /// True when this shape's providers may report an overflow inside a 200 event stream
    /// instead of with an error status (the Responses API's `response.failed`): the
    /// leading events of such a stream are then held until one tells
    /// ([`Dialect::stream_event`]).
    fn overflows_in_stream(&self) -> bool {
        false
    }

    /// What a whole event of a 200 event stream tells, for a shape that
    /// [overflows in streams](Dialect::overflows_in_stream).
    fn stream_event(&self, event: &Event<'_>) -> StreamEvent {
        let _ = event;
        StreamEvent::Other
    }

    /// The context window an overflow error states, when it does.
    fn stated_window(&self, error_body: &[u8]) -> Option<usize> {
        overflow::stated_window(error_body)
    }

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
