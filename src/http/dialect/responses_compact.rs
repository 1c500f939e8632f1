//! `POST /v1/responses/compact`: a Responses body (`model`, `input`, `instructions`)
//! asking for the conversation folded. When the upstream serves it, the request is
//! forwarded as received and the upstream answers; when foldgate does
//! (`responses.compact`, or `auto` once the upstream answered 404 or 405), foldgate folds
//! the whole conversation and answers itself (see
//! [`crate::http::provider_compaction::compact`]). Either way it is never compacted by
//! the engine, nor retried after an overflow.

use bytes::Bytes;
use http::HeaderMap;

use super::overflow::NeverRetried;
use super::{Dialect, Responses};
use crate::api::Origins;
use crate::conversation::{Measure, Rewritten};
use crate::http::provider_compaction::CompactEndpoint;
use crate::http::session_key::SessionHeaders;
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;

/// OpenAI's `POST /v1/responses/compact`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesCompact;

impl Dialect for ResponsesCompact {
    /// Never outlined: the request is always parsed and keyed whole.
    type Outline<'a> = std::convert::Infallible;
    type Origins = Origins;
    type Overflow = NeverRetried;
    type Compaction = CompactEndpoint;

    fn route(&self) -> Route {
        Route::Responses
    }

    fn overflow(&self) -> NeverRetried {
        NeverRetried
    }

    fn compaction(&self) -> Option<CompactEndpoint> {
        Some(CompactEndpoint)
    }

    fn outline<'a>(&self, _: &'a Bytes) -> Option<Self::Outline<'a>> {
        None
    }

    fn outline_model(&self, outline: &Self::Outline<'_>) -> Option<String> {
        match *outline {}
    }

    fn measure<'o>(&self, outline: &'o Self::Outline<'_>) -> Option<Measure<'o>> {
        match *outline {}
    }

    fn outline_session_key(
        &self,
        _: &HeaderMap,
        _: &SessionHeaders,
        outline: &Self::Outline<'_>,
    ) -> Option<SessionKey> {
        match *outline {}
    }

    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, Origins)> {
        Responses.parse(body)
    }

    fn render(&self, original: &Bytes, origins: &Origins, compacted: &Rewritten) -> Bytes {
        Responses.render(original, origins, compacted)
    }

    fn summary_api(&self, headers: &HeaderMap) -> Option<SummaryApi> {
        Responses.summary_api(headers)
    }
}
