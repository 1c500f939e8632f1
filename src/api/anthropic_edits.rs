//! Anthropic's `context_management` served for an upstream that does not implement it
//! (the pure transforms; the edge decides when to use them):
//!
//! - the request: [`parse`] reads `context_management.edits` (an [`EditError`] names a
//!   malformed field); [`apply_clearing`] applies `clear_tool_uses_20250919` and
//!   `clear_thinking_20251015` (token counts come from the caller);
//!   `compact_20260112` is only read ([`Compact`]): the caller summarizes;
//!   [`without_context_management`] and [`strip_betas`] take the field and the beta
//!   names off what is forwarded;
//! - later requests: [`expand_compaction`] turns a `compaction` block sent back into the
//!   summary as user text, dropping what it summarized;
//! - the answer: [`decorate_message`] (whole JSON) and [`CompactionInjector`] (event
//!   stream) put the compaction block first and report `context_management` and
//!   `usage.iterations`; [`paused_message`] and [`paused_stream`] answer a request that
//!   pauses after compaction, without an upstream call;
//! - on-demand compaction (`compaction: {"type": "summarize"}`): [`parse_summarize`] reads
//!   it, [`summary_message`] and [`summary_stream`] answer with the block alone.
//!
//! Every function is deterministic (same input, same bytes) and keeps every byte it
//! does not need to change; untrusted input never panics.

mod answer;
mod clear;
mod compacted;
mod config;
mod layout;
mod stream;

use bytes::Bytes;

pub use answer::{
    AnswerEdits, CompactionAnswer, Usage, compaction_block, compaction_events, context_management,
    decorate_message, paused_message, paused_stream, summary_message, summary_stream,
};
pub use clear::{AppliedEdit, CLEARED, clear_thinking, clear_tool_uses};
pub use compacted::expand_compaction;
pub use config::{
    ClearInputs, ClearThinking, ClearToolUses, Compact, ContextManagement, DEFAULT_CLEAR_TRIGGER,
    DEFAULT_COMPACT_TRIGGER, DEFAULT_KEEP_TOOL_USES, Edit, EditError, Summarize, ThinkingKeep,
    Trigger, parse, parse_summarize,
};
pub use stream::CompactionInjector;

use crate::api::json_text::remove_members;

/// The beta that enables `context_management`'s clearing edits.
pub const CONTEXT_MANAGEMENT_BETA: &str = "context-management-2025-06-27";
/// The beta that enables `compact_20260112`.
pub const COMPACT_BETA: &str = "compact-2026-01-12";
/// The beta that enables on-demand compaction (the top-level `compaction` field).
pub const SUMMARIZE_BETA: &str = "compact-2026-09-04";

/// A request body after the clearing edits, and what they did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleared {
    /// The body (the original bytes when no edit applied).
    pub body: Bytes,
    /// The edits that changed something, in order.
    pub applied: Vec<AppliedEdit>,
}

/// Applies the clearing edits of `config` to `body`, in their order (`compact_20260112`
/// is the caller's). `input_tokens` is the request's input total; each edit sees it less
/// what the edits before it cleared. `count` counts the tokens of a JSON text.
pub fn apply_clearing(
    body: &[u8],
    config: &ContextManagement,
    input_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> Cleared {
    let Ok(original) = std::str::from_utf8(body) else {
        return Cleared { body: Bytes::copy_from_slice(body), applied: Vec::new() };
    };
    let mut text: Option<String> = None;
    let mut applied = Vec::new();
    let mut tokens = input_tokens;
    for edit in &config.edits {
        let current = text.as_deref().unwrap_or(original);
        let done = match edit {
            Edit::ClearToolUses(e) => clear_tool_uses(current, e, tokens, count),
            Edit::ClearThinking(e) => clear_thinking(current, e, count),
            Edit::Compact(_) => None,
        };
        if let Some((next, edit)) = done {
            tokens = tokens.saturating_sub(edit.cleared_input_tokens());
            applied.push(edit);
            text = Some(next);
        }
    }
    let body = text.map_or_else(|| Bytes::copy_from_slice(body), Bytes::from);
    Cleared { body, applied }
}

/// `body` without its `context_management` field, every other byte as received; `None`
/// when it has none (or is not a JSON object): forward it as it is.
pub fn without_context_management(body: &[u8]) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    remove_members(text, "context_management").map(Bytes::from)
}

/// `body` without its top-level `compaction` field (on-demand compaction); `None` when
/// it has none.
pub fn without_summarize(body: &[u8]) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    remove_members(text, "compaction").map(Bytes::from)
}

/// An `anthropic-beta` header value (comma-separated names) without
/// [`CONTEXT_MANAGEMENT_BETA`], [`COMPACT_BETA`] and [`SUMMARIZE_BETA`]: the value as received when it names
/// neither, the other names joined by `,` when it does, `None` when none remain.
pub fn strip_betas(value: &str) -> Option<String> {
    let ours = |name: &str| {
        [CONTEXT_MANAGEMENT_BETA, COMPACT_BETA, SUMMARIZE_BETA]
            .iter()
            .any(|beta| name.eq_ignore_ascii_case(beta))
    };
    let names: Vec<&str> = value.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    if !names.iter().any(|n| ours(n)) {
        return (!names.is_empty()).then(|| value.to_owned());
    }
    let rest: Vec<&str> = names.into_iter().filter(|n| !ours(n)).collect();
    (!rest.is_empty()).then(|| rest.join(","))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A JSON text's "tokens": its length in bytes / 4, rounded up.
    pub(super) fn count(text: &str) -> usize {
        text.len().div_ceil(4)
    }

    #[test]
    fn edits_apply_in_order_and_report_what_they_did() {
        let body = json!({
            "model": "m",
            "context_management": {"edits": [
                {"type": "clear_thinking_20251015"},
                {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1},
                 "trigger": {"type": "input_tokens", "value": 10}},
                {"type": "compact_20260112"},
            ]},
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s1"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": "a"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "x".repeat(400)}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {"p": "b"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "y"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                {"role": "user", "content": "next"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "again", "signature": "s2"},
                    {"type": "text", "text": "ok"}]},
                {"role": "user", "content": "more"},
            ],
        })
        .to_string();
        let config = parse(body.as_bytes()).unwrap().unwrap();
        let cleared = apply_clearing(body.as_bytes(), &config, 1000, &count);
        assert_eq!(cleared.applied.len(), 2, "{:?}", cleared.applied);
        assert!(matches!(
            cleared.applied[0],
            AppliedEdit::ClearThinking { cleared_thinking_turns: 1, .. }
        ));
        assert!(matches!(
            cleared.applied[1],
            AppliedEdit::ClearToolUses { cleared_tool_uses: 1, .. }
        ));
        let value: Value = serde_json::from_slice(&cleared.body).unwrap();
        let m = &value["messages"];
        assert_eq!(m[1]["content"][0]["type"], "tool_use", "old thinking gone");
        assert_eq!(m[2]["content"][0]["content"], CLEARED);
        assert_eq!(m[4]["content"][0]["content"], "y");
        assert_eq!(m[7]["content"][0]["signature"], "s2", "the last turn keeps its thinking");
        // Same input, same bytes; the field itself stays until taken off.
        let again = apply_clearing(body.as_bytes(), &config, 1000, &count);
        assert_eq!(again, cleared);
        assert!(String::from_utf8_lossy(&cleared.body).contains("context_management"));
        let nothing = apply_clearing(body.as_bytes(), &ContextManagement::default(), 0, &count);
        assert_eq!(&nothing.body[..], body.as_bytes());
        assert!(nothing.applied.is_empty());
    }

    #[test]
    fn the_field_comes_off_every_other_byte_kept() {
        let body = br#"{"model":"m", "context_management": {"edits":[]},
  "messages":[]}"#;
        let out = without_context_management(body).unwrap();
        assert_eq!(
            &out[..],
            br#"{"model":"m",
  "messages":[]}"#
        );
        assert!(without_context_management(br#"{"model":"m"}"#).is_none());
        assert!(without_context_management(b"nope").is_none());
    }

    #[test]
    fn beta_names_come_off_the_header() {
        assert_eq!(strip_betas("context-management-2025-06-27"), None);
        assert_eq!(strip_betas("compact-2026-01-12, context-management-2025-06-27"), None);
        assert_eq!(
            strip_betas("interleaved-thinking-2025-05-14, compact-2026-01-12,files-api-2025-04-14")
                .as_deref(),
            Some("interleaved-thinking-2025-05-14,files-api-2025-04-14")
        );
        assert_eq!(strip_betas("a, b").as_deref(), Some("a, b"));
        assert_eq!(strip_betas(" , "), None);
        assert_eq!(strip_betas("").as_deref(), None);
    }

    /// Every prefix of a body and of a stream, and each with one byte changed, goes
    /// through every function without a panic.
    #[test]
    fn truncated_and_mangled_input_never_panics() {
        let body = json!({"model": "m", "context_management": {"edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}},
                {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 0},
                 "trigger": {"type": "tool_uses", "value": 0}, "clear_tool_inputs": true}]},
            "messages": [
                {"role": "user", "content": "go \u{e9}"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
                {"role": "assistant", "content": [{"type": "compaction", "content": "S"}, {"type": "text", "text": "x"}]},
                {"role": "user", "content": "next"}]})
        .to_string();
        let config = parse(body.as_bytes()).unwrap().unwrap();
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\n\n";
        let edits = AnswerEdits {
            compaction: Some(CompactionAnswer {
                summary: "S".into(),
                input_tokens: 1,
                output_tokens: 1,
            }),
            applied_edits: Some(vec![]),
        };
        for input in [body.as_bytes(), stream.as_bytes()] {
            for i in 0..input.len() {
                let mut variants = vec![input[..i].to_vec()];
                for b in [b'"', b'{', b']', b'\\', 0xff, b'\n'] {
                    let mut v = input.to_vec();
                    v[i] = b;
                    variants.push(v);
                }
                for v in variants {
                    let _ = parse(&v);
                    let _ = apply_clearing(&v, &config, 1_000_000, &count);
                    let _ = expand_compaction(&v);
                    let _ = without_context_management(&v);
                    let _ = decorate_message(&v, &edits);
                    let mut injector = CompactionInjector::new(edits.clone());
                    let _ = (injector.push(&v), injector.finish());
                    let _ = crate::api::responses_output::insert_output_item(&v, "{}");
                    let mut injector =
                        crate::api::responses_output::OutputItemInjector::new("{}".into());
                    let _ = (injector.push(&v), injector.finish());
                }
            }
        }
    }
}
