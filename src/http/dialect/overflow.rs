//! What providers say when a prompt is longer than the context window: the error
//! answers of OpenAI, Anthropic and compatible providers (by code or message), and the
//! window such an answer states ([`OverflowSignals`], one implementation per API).

use http::StatusCode;

use crate::http::sse::Event;
use crate::learned::windows::MIN_WINDOW;

/// How one API's providers say a prompt is longer than the context window. The
/// defaults are OpenAI's and compatible providers' (an error status, a JSON error body,
/// the window stated in its message).
pub trait OverflowSignals: Send + Sync + 'static {
    /// True when an answer with `status` may be a context overflow (its body is then
    /// peeked at).
    fn may_overflow(&self, status: StatusCode) -> bool {
        matches!(status, StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE)
    }

    /// True for the error bodies these providers give when a prompt is longer than the
    /// window.
    fn is_overflow(&self, error_body: &[u8]) -> bool {
        is_context_overflow(error_body)
    }

    /// True when a successful JSON answer of these providers may tell of an overflow
    /// (Anthropic's `stop_reason: "model_context_window_exceeded"`): such an answer is
    /// read whole (within the peek limit) before the client gets it, and judged by
    /// [`OverflowSignals::is_overflow`].
    fn overflows_in_answer(&self) -> bool {
        false
    }

    /// True when these providers may report an overflow inside a 200 event stream
    /// instead of with an error status (the Responses API's `response.failed`): the
    /// leading events of such a stream are then held until one tells
    /// ([`OverflowSignals::stream_event`]).
    fn overflows_in_stream(&self) -> bool {
        false
    }

    /// What a whole event of a 200 event stream tells, for providers that
    /// [overflow in streams](OverflowSignals::overflows_in_stream).
    fn stream_event(&self, event: &Event<'_>) -> StreamEvent {
        let _ = event;
        StreamEvent::Other
    }

    /// The context window an overflow error states, when it does.
    fn stated_window(&self, error_body: &[u8]) -> Option<usize> {
        stated_window(error_body)
    }
}

/// What an event at the start of a 200 event stream tells about the answer.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// Nothing yet (the Responses API's `response.created`, `response.in_progress`).
    Leading,
    /// The answer failed with this error (JSON), an overflow if
    /// [`OverflowSignals::is_overflow`] says so.
    Failed(Vec<u8>),
    /// Anything else: the answer is under way.
    Other,
}

/// OpenAI's chat completions and compatible providers: the defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiOverflow;

impl OverflowSignals for OpenAiOverflow {}

/// A request that is never retried after an overflow (`/v1/responses/compact`): no
/// answer is read as one.
#[derive(Debug, Clone, Copy, Default)]
pub struct NeverRetried;

impl OverflowSignals for NeverRetried {
    fn may_overflow(&self, _: StatusCode) -> bool {
        false
    }

    fn is_overflow(&self, _: &[u8]) -> bool {
        false
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

/// What an overflow error's message says, in lower case (any one of them).
const OVERFLOW_PHRASES: [&str; 8] = [
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
    "input is too long",
    "reduce the length of the messages",
];

/// What an overflow error's `code` or `type` has in it.
const OVERFLOW_CODE: &str = "context_length";

/// True for the error answers providers give when a prompt is longer than the window.
pub fn is_context_overflow(body: &[u8]) -> bool {
    // Most bodies judged are no overflow (every whole JSON answer of an API that may
    // report one in its answer): their text names none of the words, and is not parsed.
    if !may_name_overflow(body) {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let error = value.get("error").unwrap_or(&value);
    let code = ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k).and_then(serde_json::Value::as_str))
        .any(|c| c.contains(OVERFLOW_CODE));
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    code || OVERFLOW_PHRASES.iter().any(|p| message.contains(p))
}

/// False when `body`'s text cannot name an overflow: none of the phrases (in any case)
/// nor the code's word is in it, and no `\u` escape could spell one.
fn may_name_overflow(body: &[u8]) -> bool {
    use memchr::memmem::Finder;
    // Built once: a searcher's setup costs more than searching a short answer.
    static WORDS: std::sync::LazyLock<Vec<Finder<'static>>> = std::sync::LazyLock::new(|| {
        // The code is compared as it is written; its lower case is a superset.
        let words = OVERFLOW_PHRASES.iter().chain([&OVERFLOW_CODE]);
        words.map(|word| Finder::new(word.as_bytes())).collect()
    });
    let escaped = |at: usize| body.get(at + 1) == Some(&b'u');
    if memchr::memchr_iter(b'\\', body).any(escaped) {
        return true;
    }
    let lower = body.to_ascii_lowercase();
    WORDS.iter().any(|word| word.find(&lower).is_some())
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
        // Spelled with escapes, a message is still read.
        assert!(is_context_overflow(
            br#"{"error":{"message":"prompt is too lon\u0067: 210000 tokens > 200000 maximum"}}"#
        ));
        assert!(is_context_overflow(br#"{"error":{"message":"PROMPT IS TOO LONG"}}"#));
    }

    proptest::proptest! {
        /// The words looked for before parsing never turn away a body the parse would
        /// call an overflow.
        #[test]
        fn the_quick_look_agrees_with_the_parse(
            code in proptest::sample::select(vec!["context_length_exceeded", "invalid_request_error", "CONTEXT_LENGTH", ""]),
            message in "[ -~]{0,40}",
            phrase in proptest::sample::select(super::OVERFLOW_PHRASES.to_vec()),
            upper in proptest::bool::ANY,
            with_phrase in proptest::bool::ANY,
        ) {
            let phrase = if upper { phrase.to_ascii_uppercase() } else { phrase.to_owned() };
            let message = if with_phrase { format!("{message}{phrase}") } else { message };
            let body = serde_json::json!({"error": {"message": message, "code": code}}).to_string();
            let parsed = {
                let value: serde_json::Value = serde_json::from_str(&body).unwrap();
                let error = &value["error"];
                let code = error["code"].as_str().unwrap_or_default().contains(super::OVERFLOW_CODE);
                let message = error["message"].as_str().unwrap_or_default().to_ascii_lowercase();
                code || super::OVERFLOW_PHRASES.iter().any(|p| message.contains(p))
            };
            proptest::prop_assert_eq!(is_context_overflow(body.as_bytes()), parsed);
        }
    }
}
