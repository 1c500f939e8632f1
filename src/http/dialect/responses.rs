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
//! A request far below the trigger is decided from its top-level fields alone (the
//! outline): its model, `max_output_tokens`, and a bound of its size in bytes; its session
//! key from `instructions` and the first items of `input` (read up to its first user
//! message). Anything else is parsed.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Dialect;
use super::overflow::{OverflowSignals, StreamEvent, is_context_overflow};
use crate::api::{self, Origins};
use crate::conversation::{Measure, Rewritten};
use crate::http::provider_compaction::ResponsesContext;
use crate::http::session_key::{
    FingerprintParts, SessionHeaders, remembered, scope_of, session_key_with,
};
use crate::http::sse::Event;
use crate::metrics::Route;
use crate::model::ChatRequest;
use crate::outline::Outline;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;

/// How a Responses body names an image, built once: a searcher's setup costs more than
/// searching a short body.
static INPUT_IMAGE: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"input_image\""));

/// OpenAI's Responses API.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

/// What the scan reads of a Responses body: its top-level fields, and the body.
#[derive(Debug)]
pub struct ResponsesOutline<'a> {
    fields: Outline<'a>,
    body: &'a [u8],
}

impl Dialect for Responses {
    type Outline<'a> = ResponsesOutline<'a>;
    type Origins = Origins;
    type Overflow = ResponsesOverflow;
    type Compaction = ResponsesContext;

    fn route(&self) -> Route {
        Route::Responses
    }

    fn compaction(&self) -> Option<ResponsesContext> {
        Some(ResponsesContext)
    }

    fn overflow(&self) -> ResponsesOverflow {
        ResponsesOverflow
    }

    /// `None` for a request without `input` or relying on state the provider keeps: it is
    /// parsed, as the decision for it is not the engine's.
    fn outline<'a>(&self, body: &'a Bytes) -> Option<ResponsesOutline<'a>> {
        let fields = Outline::scan_fields(body)?;
        let server_state = ["previous_response_id", "conversation"]
            .iter()
            .any(|k| fields.field(k).is_some_and(|raw| raw.trim_ascii() != b"null"));
        (fields.field("input").is_some() && !server_state)
            .then_some(ResponsesOutline { fields, body })
    }

    fn outline_model(&self, outline: &ResponsesOutline<'_>) -> Option<String> {
        outline.fields.model().map(std::borrow::Cow::into_owned)
    }

    /// The whole body's bytes (see [`Measure::Bytes`]).
    fn measure<'o>(&self, outline: &'o ResponsesOutline<'_>) -> Option<Measure<'o>> {
        let fields = &outline.fields;
        let max_reply = fields
            .field("max_output_tokens")
            .and_then(|raw| serde_json::from_slice::<u64>(raw).ok())
            .and_then(|n| usize::try_from(n).ok());
        Some(Measure::Bytes {
            body: outline.body,
            image: &INPUT_IMAGE,
            unbounded: None,
            tools: fields.tools_raw(),
            messages: 0,
            model: fields.model().map(std::borrow::Cow::into_owned),
            max_reply,
        })
    }

    fn outline_session_key(
        &self,
        headers: &HeaderMap,
        session_header: &SessionHeaders,
        outline: &ResponsesOutline<'_>,
    ) -> Option<SessionKey> {
        let fields = &outline.fields;
        session_key_with(headers, session_header, || {
            let instructions = match fields.field("instructions") {
                Some(raw) if raw.trim_ascii() != b"null" => Some(std::str::from_utf8(raw).ok()?),
                _ => None,
            };
            let input = std::str::from_utf8(fields.field("input")?).ok()?;
            // Each part made once per text on the thread: an agent sends the same
            // instructions and first items with every request of a conversation.
            let shared = |text: Option<String>| text.map(Arc::<str>::from);
            let (system, user) = api::responses::fingerprint_messages(
                instructions,
                input,
                |raw| {
                    let text = || shared(api::responses::instructions_text(raw));
                    remembered("responses/instructions", raw.as_bytes(), text)
                },
                |raw| {
                    let text = || shared(api::responses::text_input(raw));
                    remembered("responses/text input", raw.as_bytes(), text)
                },
                |raw| {
                    let item = || api::responses::first_item(raw).map(|i| i.map(Arc::<str>::from));
                    remembered("responses/item", raw, item)
                },
            )?;
            let model = fields.model().unwrap_or_default();
            let scope = scope_of(|k| fields.field(k));
            Some(FingerprintParts { model: model.into_owned(), system, user, scope })
        })
    }

    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, Origins)> {
        api::responses::parse(body)
    }

    fn continues(&self, body: &[u8]) -> Option<String> {
        api::responses::previous_response(body)
    }

    fn expand_chain(&self, body: &[u8], items: &[u8]) -> Option<Bytes> {
        api::responses::expand_chain(body, items)
    }

    /// Its input (a string input as a user message), unless it asks the provider not to
    /// store the answer (`"store": false`) and continues nothing: such an answer is not
    /// continued by id.
    fn chain_items(&self, body: &[u8], continued: bool) -> Option<String> {
        api::responses::chain_input(body, continued)
    }

    fn server_state(&self, origins: &Origins) -> bool {
        origins.server_state
    }

    fn render(&self, original: &Bytes, origins: &Origins, compacted: &Rewritten) -> Bytes {
        api::responses::render(original, origins, &compacted.request)
    }

    fn summary_api(&self, _: &HeaderMap) -> Option<SummaryApi> {
        Some(SummaryApi::Responses)
    }
}

/// How the Responses API says a prompt is longer than the window: the chat errors
/// (`context_length_exceeded`), except `invalid_encrypted_content`, which is the
/// client's to handle; also inside a 200 event stream, as `response.failed` or an
/// `error` event.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesOverflow;

impl OverflowSignals for ResponsesOverflow {
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
    use crate::compaction::{Engine, Options};

    fn event<'a>(name: Option<&'a str>, data: &'a str) -> Event<'a> {
        Event { name: name.map(str::as_bytes), data: Cow::Borrowed(data.as_bytes()) }
    }

    #[test]
    fn a_stream_tells_from_its_first_event_after_created_and_in_progress() {
        let d = ResponsesOverflow;
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
        let d = ResponsesOverflow;
        assert!(d.is_overflow(
            br#"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#
        ));
        assert!(!d.is_overflow(
            br#"{"error":{"message":"The encrypted content for item rs_1 could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#
        ));
    }

    /// Bodies whose first messages come in every way `parse` makes them.
    fn bodies() -> Vec<serde_json::Value> {
        use serde_json::json;
        let user =
            json!({"role": "user", "content": [{"type": "input_text", "text": "Fix the parser."}]});
        let call = json!({"type": "function_call", "call_id": "c1", "name": "run",
            "arguments": "{\"cmd\":\"cargo test\"}"});
        let output = json!({"type": "function_call_output", "call_id": "c1",
            "output": "test parser ... FAILED"});
        let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [],
            "encrypted_content": "gAAAA"});
        let developer = json!({"type": "message", "role": "developer", "content": "Be brief."});
        let later = json!({"role": "user", "content": "Now the writer."});
        let reference = json!({"type": "item_reference", "id": "msg_1"});
        vec![
            json!({"model": "gpt-5-codex", "input": "Fix the parser."}),
            json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "input": "hi"}),
            json!({"model": "gpt-5-codex", "instructions": null, "input": [user]}),
            json!({"model": "gpt-5-codex", "instructions": ["odd"], "input": [user, reasoning, call, output]}),
            json!({"model": "gpt-4.1", "input": [developer, reasoning, user, call, output]}),
            json!({"model": "gpt-4.1", "instructions": "Codex.", "input": [reasoning, user, developer, call, output]}),
            json!({"input": [call, output, user], "max_output_tokens": 300}),
            json!({"model": "gpt-5-codex", "instructions": "Codex.", "input": [user],
                "prompt_cache_key": "019a9544-7ab1-73c1-837e-1fa681f4462b"}),
            // The next requests of a conversation: the same first items, more after them
            // (a reference past the first messages is never read).
            json!({"model": "gpt-4.1", "input": [developer, reasoning, user, call, output, later]}),
            json!({"model": "gpt-4.1", "input": [developer, reasoning, user, call, output, later,
                reference]}),
            json!({"model": "gpt-4.1", "input": [later, developer, user]}),
        ]
    }

    #[test]
    fn the_outline_s_session_key_is_the_parsed_request_s() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer sk-a".parse().unwrap());
        for body in bodies() {
            let bytes = serde_json::to_vec(&body).unwrap();
            let bytes = Bytes::from(bytes);
            let outline = Responses.outline(&bytes).unwrap();
            let (request, _) = Responses.parse(&bytes).unwrap();
            let parsed = Responses.session_key(&headers, &SessionHeaders::default(), &request);
            // Twice: the second time from the parts the thread kept.
            for _ in 0..2 {
                let outlined =
                    Responses.outline_session_key(&headers, &SessionHeaders::default(), &outline);
                assert_eq!(outlined, Some(parsed.clone()), "{body}");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Bodies of items of every kind the fingerprint reads, in any order, each
        /// keyed from its outline twice (the second time from the parts the thread kept,
        /// some of them from the bodies before): the parsed request's key, or none.
        #[test]
        fn any_first_items_give_the_parsed_requests_key(
            instructions in proptest::option::of("[a-z \"é]{0,12}"),
            items in proptest::collection::vec((0usize..8, "[a-z \"é]{0,12}"), 0..8),
        ) {
            use serde_json::json;
            let input: Vec<serde_json::Value> = items
                .iter()
                .map(|(kind, text)| match kind {
                    0 => json!({"role": "user", "content": text}),
                    1 => json!({"type": "message", "role": "developer",
                        "content": [{"type": "input_text", "text": text}]}),
                    2 => json!({"role": "system", "content": text}),
                    3 => json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}),
                    4 => json!({"type": "function_call", "call_id": "c1", "name": "run",
                        "arguments": text}),
                    5 => json!({"type": "function_call_output", "call_id": "c1", "output": text}),
                    6 => json!({"type": "reasoning", "id": "rs_1", "summary": [],
                        "encrypted_content": text}),
                    _ => json!({"type": "compaction", "id": "cmp_1", "encrypted_content": text}),
                })
                .collect();
            let body = json!({"model": "m", "instructions": instructions, "input": input});
            let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
            let mut headers = HeaderMap::new();
            headers.insert("authorization", "Bearer sk-a".parse().unwrap());
            let named_by = SessionHeaders::default();
            let Some(outline) = Responses.outline(&bytes) else { return Ok(()) };
            let Some((request, _)) = Responses.parse(&bytes) else { return Ok(()) };
            let parsed = Responses.session_key(&headers, &named_by, &request);
            for _ in 0..2 {
                if let Some(outlined) = Responses.outline_session_key(&headers, &named_by, &outline) {
                    proptest::prop_assert_eq!(&outlined, &parsed, "{}", body);
                }
            }
        }
    }

    #[test]
    fn the_outline_defers_to_the_parser_where_it_cannot_tell() {
        use serde_json::json;
        let headers = HeaderMap::new();
        let pinned = json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"});
        let user = json!({"role": "user", "content": "hi"});
        // A compaction item before any system message is the first system message.
        let body = serde_json::to_vec(&json!({"model": "m", "input": [pinned, user]})).unwrap();
        let body = Bytes::from(body);
        let outline = Responses.outline(&body).unwrap();
        assert_eq!(
            Responses.outline_session_key(&headers, &SessionHeaders::default(), &outline),
            None
        );
        // With a session header the fingerprint is not needed.
        let mut named = HeaderMap::new();
        named.insert("x-session-id", "s1".parse().unwrap());
        assert!(
            Responses.outline_session_key(&named, &SessionHeaders::default(), &outline).is_some()
        );
        // State the provider keeps, or no `input`: parsed.
        for body in [
            json!({"model": "m", "input": [user], "previous_response_id": "resp_1"}),
            json!({"model": "m", "input": [user], "conversation": "conv_1"}),
            json!({"model": "m"}),
        ] {
            assert!(
                Responses.outline(&Bytes::from(serde_json::to_vec(&body).unwrap())).is_none(),
                "{body}"
            );
        }
    }

    #[test]
    fn the_byte_bound_is_never_below_the_exact_count() {
        let engine = Engine::new(crate::config::CompactionConfig::default());
        for body in bodies() {
            let bytes = serde_json::to_vec(&body).unwrap();
            let bytes = Bytes::from(bytes);
            let outline = Responses.outline(&bytes).unwrap();
            let measure = Responses.measure(&outline).unwrap();
            let report = crate::conversation::below(&engine, measure, &Options::default()).unwrap();
            let (request, _) = Responses.parse(&bytes).unwrap();
            let mut cache = crate::compaction::TokenCache::default();
            let exact = engine.count_prompt(&request, &report.budget, &mut cache);
            let bound = crate::conversation::byte_bound(
                &bytes,
                &INPUT_IMAGE,
                None,
                outline.fields.tools_raw(),
                0,
            )
            .unwrap();
            assert!(bound.upper >= exact, "{} < {exact}: {body}", bound.upper);
        }
    }
}
