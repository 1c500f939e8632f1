//! The providers' own compaction APIs, served by foldgate for upstreams that lack them:
//! OpenAI's `POST /v1/responses/compact` ([`compact`]) and `context_management`
//! compaction on `/v1/responses`, Anthropic's `context_management.edits` on
//! `/v1/messages`. Who serves each is configured (`[responses]`, `[messages]`; see
//! [`CompactionApis`]); in `auto` the upstream does until it answers that it does not
//! know the API, which is then remembered per upstream (see [`crate::learned::unserved`]).
//!
//! Each API family ([`CompactionFamily`], named by the dialect of its requests) has the
//! same four steps, met in this order by the request's exchange (`super::exchange`): the
//! body prepared (foldgate's own compaction items opened, the fields foldgate serves
//! taken out; [`CompactionFamily::prepare`]), an upstream's refusal of fields left for it
//! recognised ([`CompactionFamily::refuses`]), the fold the request asks for made
//! ([`CompactionFamily::fold_asked`]), and the answer written or rewritten
//! ([`CompactionFamily::conclude`], with [`on_request`] and [`answer`]).

pub mod answer;
mod apis;
pub mod compact;
mod messages_context;
pub mod on_request;
mod responses_context;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

pub use apis::{CompactionApis, rejects_field};
pub use compact::CompactEndpoint;
pub use messages_context::MessagesContext;
pub use responses_context::ResponsesContext;

use crate::api::anthropic_edits::{AppliedEdit, ContextManagement, Summarize};
use crate::api::compaction_item::ContextCompaction;
use crate::conversation::{FoldWhen, WholeFold};
use crate::vocab::CompactionApi;
use on_request::Concluded;

/// One of the providers' compaction APIs, as the exchange serves it.
pub trait CompactionFamily: Send + Sync + 'static {
    /// The API.
    fn api(&self) -> CompactionApi;

    /// The API a request with `body` asks for (a family may serve two: a Responses
    /// request ending with Codex's `compaction_trigger` asks for `responses.compact`).
    fn api_for(&self, body: &[u8]) -> CompactionApi {
        let _ = body;
        self.api()
    }

    /// `body` once foldgate's own compaction items in it are opened and, when foldgate
    /// serves the API (`serve`), the fields asking for it are taken out; an error (the
    /// request is answered with a 400) says what is wrong.
    fn prepare(&self, body: &Bytes, apis: &CompactionApis, serve: bool)
    -> Result<Prepared, String>;

    /// The client's headers as forwarded for `prepared`: as received, unless foldgate
    /// serves the API and a header asks the upstream for it.
    fn forwarded_headers(&self, headers: &HeaderMap, prepared: &Prepared) -> HeaderMap {
        let _ = prepared;
        headers.clone()
    }

    /// True when an upstream's answer (`status`, and its error body when it is an error
    /// that may be an overflow) says it does not know the API the request left for it.
    fn refuses(&self, status: StatusCode, error_body: &[u8]) -> bool {
        let _ = status;
        rejects_field(error_body, "context_management")
    }

    /// The whole fold `served` (a compaction of this family) asks for, if any.
    fn fold_asked(&self, served: &Served) -> Option<FoldAsk>;

    /// Writes what `served` (a compaction of this family) adds to the answer, given the
    /// whole `fold` it asked for (`None`: not folded), or foldgate's whole answer; an
    /// error (a 400) says why foldgate cannot answer the request itself.
    fn conclude(
        &self,
        served: Served,
        fold: Option<WholeFold>,
        request: &FoldFacts<'_>,
        apis: &CompactionApis,
    ) -> Result<Concluded, String>;

    /// True for an API foldgate answers from the whole conversation when it serves it
    /// (`/v1/responses/compact`): its requests are never compacted by the engine, never
    /// retried after an overflow, and recorded as compactions.
    fn answers_whole(&self) -> bool {
        false
    }
}

/// The family of a shape whose requests ask for no provider compaction (chat
/// completions): never made.
#[derive(Debug, Clone, Copy)]
pub enum NoCompactionApi {}

impl CompactionFamily for NoCompactionApi {
    fn api(&self) -> CompactionApi {
        match *self {}
    }

    fn prepare(&self, _: &Bytes, _: &CompactionApis, _: bool) -> Result<Prepared, String> {
        match *self {}
    }

    fn fold_asked(&self, _: &Served) -> Option<FoldAsk> {
        match *self {}
    }

    fn conclude(
        &self,
        _: Served,
        _: Option<WholeFold>,
        _: &FoldFacts<'_>,
        _: &CompactionApis,
    ) -> Result<Concluded, String> {
        match *self {}
    }
}

/// A body as the exchange decides on it, once the providers' compaction API that
/// foldgate serves has taken its part (see [`CompactionFamily::prepare`]).
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
    /// [`CompactionFamily::forwarded_headers`]).
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
    /// body, and the edits (a `compact_20260112` among them is made on the request).
    MessagesEdits {
        /// The edits the request asked for.
        edits: ContextManagement,
        /// The clearing edits that changed the body.
        applied: Vec<AppliedEdit>,
    },
    /// `POST /v1/responses/compact`: foldgate answers with the whole conversation
    /// folded.
    ResponsesCompact,
    /// A Responses request ending with Codex's `compaction_trigger` item: foldgate
    /// answers with one `compaction` item sealing the whole conversation folded.
    ResponsesTrigger,
    /// Anthropic on-demand compaction (`compaction: {"type": "summarize"}`): foldgate
    /// answers with the whole conversation folded into one `compaction` block.
    MessagesSummarize(Summarize),
}

/// The whole fold a served provider compaction asks for.
#[derive(Debug, Clone)]
pub struct FoldAsk {
    /// How large the request must be to be folded.
    pub when: FoldWhen,
    /// The client's instructions for the digest.
    pub instructions: Option<String>,
}

impl Served {
    /// True when foldgate answers the request itself (the upstream is never asked), so
    /// a body it cannot read is refused rather than forwarded.
    pub fn answered_here(&self) -> bool {
        matches!(self, Self::ResponsesCompact | Self::ResponsesTrigger | Self::MessagesSummarize(_))
    }
}

/// What writing a served compaction's answer needs of the request.
pub struct FoldFacts<'a> {
    /// The body as prepared.
    pub body: &'a Bytes,
    /// The request's `model`, as sent.
    pub model: &'a str,
    /// The request asks for an event stream.
    pub streams: bool,
}
