//! What providers say when a prompt is longer than the context window: the error
//! answers of OpenAI, Anthropic and compatible providers (by code or message), and the
//! window such an answer states. Every dialect's overflow reading starts here.

use crate::learned::windows::MIN_WINDOW;

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
