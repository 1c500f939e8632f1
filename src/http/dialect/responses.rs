//! The Responses dialect (`POST /v1/responses`, what OpenAI's Codex CLI and Agents SDK
//! send): bodies convert to and from neutral messages in [`crate::api::responses`];
//! overflow errors (`context_length_exceeded`) are the chat ones; usage is read from the
//! JSON answer or the `response.completed` event. Requests relying on state the provider
//! keeps (`previous_response_id`, `conversation`, `item_reference`) are forwarded as
//! received.
//!
//! There is no outline: every request is parsed (the scan of chat bodies does not read
//! `input` items).

use std::convert::Infallible;

use bytes::Bytes;
use http::HeaderMap;

use super::Dialect;
use super::chat::is_context_overflow;
use crate::api::{self, Origins};
use crate::compaction::{Engine, Options, Report};
use crate::compactor::Rewritten;
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;

/// OpenAI's Responses API.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

impl Dialect for Responses {
    type Outline<'a> = Infallible;
    type Origins = Origins;

    fn route(&self) -> Route {
        Route::Responses
    }

    fn outline(&self, _body: &[u8]) -> Option<Infallible> {
        None
    }

    fn outline_model(&self, outline: &Infallible) -> Option<String> {
        match *outline {}
    }

    fn clearly_below(&self, _: &Engine, outline: &Infallible, _: &Options) -> Option<Report> {
        match *outline {}
    }

    fn outline_session_key(&self, _: &HeaderMap, _: &str, outline: &Infallible) -> SessionKey {
        match *outline {}
    }

    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, Origins)> {
        api::responses::parse(body)
    }

    fn server_state(&self, origins: &Origins) -> bool {
        origins.server_state
    }

    fn render(&self, original: &Bytes, origins: &Origins, compacted: &Rewritten) -> Bytes {
        api::responses::render(original, origins, &compacted.request)
    }

    fn is_overflow(&self, error_body: &[u8]) -> bool {
        !is_invalid_encrypted_content(error_body) && is_context_overflow(error_body)
    }

    fn summary_api(&self) -> SummaryApi {
        SummaryApi::Responses
    }
}

/// True for the error the API gives when it cannot decrypt an encrypted item (reasoning
/// or compaction content from another organisation or model): the client's to handle,
/// passed through as it is, never retried.
fn is_invalid_encrypted_content(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"invalid_encrypted_content").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_overflow_is_retried_and_encrypted_content_errors_are_not() {
        let d = Responses;
        assert!(d.is_overflow(
            br#"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#
        ));
        assert!(!d.is_overflow(
            br#"{"error":{"message":"The encrypted content for item rs_1 could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#
        ));
    }
}
