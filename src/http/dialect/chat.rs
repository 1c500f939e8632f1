//! The chat-completions dialect (`POST /v1/chat/completions`): the engine's neutral
//! request is a chat request, so parsing and rendering are the identity (the body the
//! engine wrote is forwarded, no copy); overflow errors are the ones of
//! [`super::overflow`], as OpenAI and compatible providers word them.

use bytes::Bytes;
use http::HeaderMap;

use super::Dialect;
use super::overflow::OpenAiOverflow;
use crate::api;
use crate::conversation::{Measure, Rewritten};
use crate::http::provider_compaction::NoCompactionApi;
use crate::http::session_key::{SessionHeaders, session_key_of_outline};
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::outline::Outline;
use crate::session::SessionKey;

/// OpenAI's chat completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatCompletions;

impl Dialect for ChatCompletions {
    type Outline<'a> = Outline<'a>;
    type Origins = ();
    type Overflow = OpenAiOverflow;
    type Compaction = NoCompactionApi;

    fn route(&self) -> Route {
        Route::ChatCompletions
    }

    fn overflow(&self) -> OpenAiOverflow {
        OpenAiOverflow
    }

    fn compaction(&self) -> Option<NoCompactionApi> {
        None
    }

    fn outline<'a>(&self, body: &'a Bytes) -> Option<Outline<'a>> {
        Outline::scan_kept(body)
    }

    fn outline_model(&self, outline: &Outline<'_>) -> Option<String> {
        outline.model().map(std::borrow::Cow::into_owned)
    }

    fn measure<'o>(&self, outline: &'o Outline<'_>) -> Option<Measure<'o>> {
        Some(Measure::Outline(outline))
    }

    fn outline_session_key(
        &self,
        headers: &HeaderMap,
        session_header: &SessionHeaders,
        outline: &Outline<'_>,
    ) -> Option<SessionKey> {
        Some(session_key_of_outline(headers, session_header, outline))
    }

    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, ())> {
        api::chat::parse(body).map(|request| (request, ()))
    }

    fn render(&self, _original: &Bytes, _origins: &(), compacted: &Rewritten) -> Bytes {
        compacted.body.clone()
    }
}
