//! The chat-completions dialect (`POST /v1/chat/completions`): the engine's neutral
//! request is a chat request, so parsing and rendering are the identity (the body the
//! engine wrote is forwarded, no copy); overflow errors are recognised by code or
//! message, as OpenAI and compatible providers word them.

use bytes::Bytes;
use http::HeaderMap;

use super::Dialect;
use crate::api;
use crate::compaction::{Engine, Options, Report};
use crate::conversation::Rewritten;
use crate::http::session_key::{SessionHeaders, session_key_of_outline};
use crate::learned::windows::MIN_WINDOW;
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

    fn route(&self) -> Route {
        Route::ChatCompletions
    }

    fn outline<'a>(&self, body: &'a [u8]) -> Option<Outline<'a>> {
        Outline::scan(body)
    }

    fn outline_model(&self, outline: &Outline<'_>) -> Option<String> {
        outline.model()
    }

    fn clearly_below(
        &self,
        engine: &Engine,
        outline: &Outline<'_>,
        options: &Options,
    ) -> Option<Report> {
        engine.clearly_below(outline, options)
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

    fn is_overflow(&self, error_body: &[u8]) -> bool {
        is_context_overflow(error_body)
    }
}

/// Stated windows below this many tokens are not believed (see [`MIN_WINDOW`]).
pub const MIN_STATED_WINDOW: usize = MIN_WINDOW;

/// The context window a provider's overflow message states, e.g. "maximum context
/// length is 8192 tokens" or "210000 tokens > 200000 maximum"; `None` when it states
/// none, or one below [`MIN_STATED_WINDOW`].
pub fn stated_window(body: &[u8]) -> Option<usize> {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    ["maximum context length is ", "context length is ", " > "].iter().find_map(|marker| {
        let start = text.find(marker)? + marker.len();
        let digits: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(char::is_ascii_digit)
            .collect();
        digits.parse().ok().filter(|&window| window >= MIN_STATED_WINDOW)
    })
}

/// True for the error answers providers give when a prompt is longer than the window.
pub fn is_context_overflow(body: &[u8]) -> bool {
    const PHRASES: [&str; 8] = [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "prompt is too long",
        "too many tokens",
        "input is too long",
        "reduce the length of the messages",
    ];
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let error = value.get("error").unwrap_or(&value);
    let code = ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k).and_then(serde_json::Value::as_str))
        .any(|c| c.contains("context_length"));
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    code || PHRASES.iter().any(|p| message.contains(p))
}

#[cfg(test)]
mod tests {
    use super::{is_context_overflow, stated_window};

    #[test]
    fn reads_the_window_a_provider_states() {
        assert_eq!(
            stated_window(b"This model's maximum context length is 128,000 tokens."),
            Some(128_000)
        );
        assert_eq!(
            stated_window(b"prompt is too long: 210000 tokens > 200000 maximum"),
            Some(200_000)
        );
        assert_eq!(stated_window(b"too long"), None);
        // Found by fuzzing: a window of 0 (or any implausibly small one) is not stated.
        assert_eq!(stated_window(b"{kens > 0000 mumror"), None);
        assert_eq!(stated_window(b"maximum context length is 12 tokens"), None);
    }

    #[test]
    fn recognises_context_overflow_errors() {
        assert!(is_context_overflow(
            br#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#
        ));
        assert!(is_context_overflow(
            br#"{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#
        ));
        assert!(!is_context_overflow(
            br#"{"error":{"message":"Invalid value for 'temperature'"}}"#
        ));
        assert!(!is_context_overflow(b"not json"));
    }
}
