//! Who serves each of the providers' own compaction APIs (`[responses]`, `[messages]`):
//! the upstream, foldgate, or in `auto` the upstream until it answers that it does not
//! know the API (remembered per upstream, see [`crate::learned::unserved`]); and the key
//! that seals foldgate's compaction items. Read by the dialects and the exchange.

use crate::api::compaction_item::Sealer;
use crate::config::ServedBy;
use crate::conversation::Conversations;
use crate::learned::CompactionApi;

/// Who serves each of the providers' compaction APIs, and the key of foldgate's items.
#[derive(Debug)]
pub struct CompactionApis {
    /// `responses.compact`.
    pub responses_compact: ServedBy,
    /// `responses.context_management`.
    pub responses_context: ServedBy,
    /// `messages.context_management`.
    pub messages_context: ServedBy,
    /// Seals and opens foldgate's compaction items (`responses.compaction_key`).
    pub sealer: Sealer,
}

impl CompactionApis {
    /// How `api` is configured.
    pub fn served_by(&self, api: CompactionApi) -> ServedBy {
        match api {
            CompactionApi::ResponsesCompact => self.responses_compact,
            CompactionApi::ResponsesContextManagement => self.responses_context,
            CompactionApi::MessagesContextManagement => self.messages_context,
        }
    }

    /// True when foldgate serves `api` for `upstream` now: configured so, or `auto` and
    /// the upstream was found not to serve it.
    pub fn foldgate_serves(
        &self,
        api: CompactionApi,
        conversations: &Conversations,
        upstream: &str,
    ) -> bool {
        match self.served_by(api) {
            ServedBy::Foldgate => true,
            ServedBy::Upstream => false,
            ServedBy::Auto => conversations.unserved(api, upstream),
        }
    }
}

/// True when an upstream's error body says it does not know the request field `field`
/// (an unknown, unrecognized, extra or unsupported parameter naming it).
pub fn rejects_field(error_body: &[u8], field: &str) -> bool {
    let text = String::from_utf8_lossy(error_body).to_ascii_lowercase();
    const SAYS_UNKNOWN: [&str; 9] = [
        "unknown",
        "unexpected",
        "unrecognized",
        "unrecognised",
        "extra",
        "not permitted",
        "not allowed",
        "unsupported",
        "not supported",
    ];
    text.contains(field) && SAYS_UNKNOWN.iter().any(|s| text.contains(s))
}

#[cfg(test)]
mod tests {
    use super::rejects_field;

    #[test]
    fn unknown_parameter_errors_are_recognised() {
        for body in [
            r#"{"error":{"message":"Unrecognized request argument supplied: context_management"}}"#,
            r#"{"detail":[{"type":"extra_forbidden","loc":["body","context_management"],"msg":"Extra inputs are not permitted"}]}"#,
            r#"{"error":{"message":"Unknown parameter: 'context_management'.","type":"invalid_request_error"}}"#,
        ] {
            assert!(rejects_field(body.as_bytes(), "context_management"), "{body}");
        }
        let overflow = r#"{"error":{"message":"maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#;
        assert!(!rejects_field(overflow.as_bytes(), "context_management"));
    }
}
