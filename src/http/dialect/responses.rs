//! The Responses dialect (`POST /v1/responses`, what OpenAI's Codex CLI and Agents SDK
//! send): bodies convert to and from neutral messages in [`crate::api::responses`];
//! overflow errors (`context_length_exceeded`) are the chat ones, except
//! `invalid_encrypted_content`, which is the client's to handle; usage is read from the
//! JSON answer or the `response.completed` event. Requests relying on state the provider
//! keeps (`previous_response_id`, `conversation`, `item_reference`) are forwarded as
//! received.
//!
//! A streamed request may learn of its overflow inside a 200 event stream rather than
//! from a 400: `response.created`, `response.in_progress`, then `response.failed` whose
//! `response.error` has `code: "context_length_exceeded"` (Codex CLI reads that event as
//! an overflow of the context window), or an `error` event with that code. So the
//! leading `response.created` and `response.in_progress` events (and comments) are held,
//! up to 256 KiB, until the first other event: when it is such a failure, the request is
//! compacted deeper and sent once more, and the client gets only the retry's stream;
//! otherwise every held byte goes on unchanged, in order, then the rest of the stream
//! (see `src/http/overflow.rs`). The cost: those two small events reach the client
//! with the first event of substance instead of before it.
//!
//! There is no outline: every request is parsed (the scan of chat bodies does not read
//! `input` items).

use std::borrow::Cow;
use std::convert::Infallible;

use bytes::Bytes;
use http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::chat::is_context_overflow;
use super::{Dialect, StreamEvent};
use crate::api::{self, Origins};
use crate::compaction::{Engine, Options, Report};
use crate::compactor::Rewritten;
use crate::http::sse::Event;
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::session::SessionKey;

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

    fn overflows_in_stream(&self) -> bool {
        true
    }

    fn stream_event(&self, event: &Event<'_>) -> StreamEvent {
        match event_type(event).as_deref() {
            Some("response.created" | "response.in_progress") => StreamEvent::Leading,
            Some("response.failed") => {
                failure_of(&event.data).map_or(StreamEvent::Other, StreamEvent::Failed)
            }
            // An `error` event states its error at its top level (or under `error`).
            Some("error") => StreamEvent::Failed(event.data.to_vec()),
            _ => StreamEvent::Other,
        }
    }
}

/// A streamed event's type: its `event` field, else its data's `type`.
fn event_type<'a>(event: &'a Event<'_>) -> Option<Cow<'a, str>> {
    match event.name {
        Some(name) => std::str::from_utf8(name).ok().map(Cow::Borrowed),
        None => serde_json::from_slice::<Typed<'a>>(&event.data).ok().map(|typed| typed.kind),
    }
}

/// The `type` of a streamed event's data.
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// A `response.failed` event's data: the response, and the error it failed with.
#[derive(Deserialize)]
struct FailedEvent<'a> {
    #[serde(borrow)]
    response: FailedResponse<'a>,
}

#[derive(Deserialize)]
struct FailedResponse<'a> {
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// The error object (JSON) of a `response.failed` event's data, when it has one.
fn failure_of(data: &[u8]) -> Option<Vec<u8>> {
    let failed: FailedEvent<'_> = serde_json::from_slice(data).ok()?;
    Some(failed.response.error?.get().as_bytes().to_vec())
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

    fn event<'a>(name: Option<&'a str>, data: &'a str) -> Event<'a> {
        Event { name: name.map(str::as_bytes), data: Cow::Borrowed(data.as_bytes()) }
    }

    #[test]
    fn a_stream_tells_from_its_first_event_after_created_and_in_progress() {
        let d = Responses;
        let created = r#"{"type":"response.created","response":{"status":"in_progress"}}"#;
        assert_eq!(d.stream_event(&event(Some("response.created"), created)), StreamEvent::Leading);
        assert_eq!(d.stream_event(&event(None, created)), StreamEvent::Leading, "no event field");
        let in_progress = r#"{"type":"response.in_progress","response":{}}"#;
        assert_eq!(d.stream_event(&event(None, in_progress)), StreamEvent::Leading);
        let delta = r#"{"type":"response.output_text.delta","delta":"ok"}"#;
        assert_eq!(d.stream_event(&event(None, delta)), StreamEvent::Other);

        let failed = r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model."}}}"#;
        let StreamEvent::Failed(error) = d.stream_event(&event(Some("response.failed"), failed))
        else {
            panic!("a failure");
        };
        assert!(d.is_overflow(&error), "{}", String::from_utf8_lossy(&error));
        let encrypted = r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"invalid_encrypted_content","message":"The encrypted content could not be verified; the context window was not read."}}}"#;
        let StreamEvent::Failed(error) = d.stream_event(&event(None, encrypted)) else {
            panic!("a failure");
        };
        assert!(!d.is_overflow(&error));
        let error_event = r#"{"type":"error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":null}"#;
        let StreamEvent::Failed(error) = d.stream_event(&event(Some("error"), error_event)) else {
            panic!("a failure");
        };
        assert!(d.is_overflow(&error));
        let no_error = r#"{"type":"response.failed","response":{"status":"failed","error":null}}"#;
        assert_eq!(d.stream_event(&event(None, no_error)), StreamEvent::Other);
    }

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
