//! The answer side: a whole Message answer given the compaction block first, the
//! top-level `context_management` (`applied_edits`) and `usage.iterations`; the
//! answer of a request that pauses after compaction (JSON and event stream); the events
//! of the compaction block.

use bytes::Bytes;
use serde_json::{Value, json};

use super::clear::AppliedEdit;
use crate::api::event_stream;
use crate::api::json_text::{Object, array_items, edit_member, prepend_item, set_member};

/// A compaction foldgate made for a request: the summary, and the tokens writing it took
/// (reported as the `compaction` entry of `usage.iterations`, not in the top-level usage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionAnswer {
    /// The summary: the `content` of the compaction block.
    pub summary: String,
    /// Input tokens of the summarization.
    pub input_tokens: u64,
    /// Output tokens of the summarization.
    pub output_tokens: u64,
}

/// What an answer reports of the request's context management.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerEdits {
    /// The compaction made for this request: its block goes first.
    pub compaction: Option<CompactionAnswer>,
    /// The clearing edits applied, written as `context_management.applied_edits`; `None`
    /// writes no `context_management`.
    pub applied_edits: Option<Vec<AppliedEdit>>,
}

impl AnswerEdits {
    /// The `context_management` value to write, if any.
    pub fn context_management(&self) -> Option<String> {
        self.applied_edits.as_deref().map(context_management)
    }
}

/// `{"applied_edits":[...]}` of `applied`.
pub fn context_management(applied: &[AppliedEdit]) -> String {
    let entries: Vec<String> = applied.iter().map(AppliedEdit::to_json).collect();
    format!(r#"{{"applied_edits":[{}]}}"#, entries.join(","))
}

/// The compaction block of an answer: `{"type":"compaction","content":<summary>}`.
pub fn compaction_block(summary: &str) -> String {
    json!({"type": "compaction", "content": summary}).to_string()
}

/// The `compaction` entry of `usage.iterations`.
fn compaction_iteration(c: &CompactionAnswer) -> String {
    json!({
        "type": "compaction",
        "input_tokens": c.input_tokens,
        "output_tokens": c.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
    .to_string()
}

/// The token counts of a `usage` object (absent ones 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `input_tokens`.
    pub input_tokens: u64,
    /// `output_tokens`.
    pub output_tokens: u64,
    /// `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: u64,
    /// `cache_read_input_tokens`.
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// This usage with the counts `usage` (a JSON object text) states replacing these.
    pub fn overlaid(mut self, usage: &str) -> Self {
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(usage) else { return self };
        let get = |name: &str| map.get(name).and_then(Value::as_u64);
        let fields = [
            (&mut self.input_tokens, "input_tokens"),
            (&mut self.output_tokens, "output_tokens"),
            (&mut self.cache_creation_input_tokens, "cache_creation_input_tokens"),
            (&mut self.cache_read_input_tokens, "cache_read_input_tokens"),
        ];
        for (field, name) in fields {
            if let Some(n) = get(name) {
                *field = n;
            }
        }
        self
    }

    /// The `message` entry of `usage.iterations`.
    fn iteration(&self) -> String {
        json!({
            "type": "message",
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        })
        .to_string()
    }
}

/// The `usage` object text with the compaction's entry first in `iterations`: put in
/// front of the ones it has, else `[compaction, message]` (the message's counts: `of`).
pub(super) fn with_iterations(usage: &str, c: &CompactionAnswer, of: Usage) -> Option<String> {
    let object = Object::parse(usage)?;
    let first = compaction_iteration(c);
    let listed = object.value(usage, "iterations").filter(|v| array_items(v).is_some());
    if listed.is_some() {
        return edit_member(usage, 0..usage.len(), "iterations", |v| prepend_item(v, &first));
    }
    set_member(usage, "iterations", &format!("[{first},{}]", of.iteration()))
}

/// A whole Message answer `body` with what `edits` reports: the compaction block first
/// in `content`, `usage.iterations`, the top-level `context_management`; every other
/// byte as received. `None` when `body` is not a Message (no `content` array).
pub fn decorate_message(body: &[u8], edits: &AnswerEdits) -> Option<Bytes> {
    let mut text = std::str::from_utf8(body).ok()?.to_owned();
    array_items(Object::parse(&text)?.value(&text, "content")?)?;
    if let Some(c) = &edits.compaction {
        let block = compaction_block(&c.summary);
        text = edit_member(&text, 0..text.len(), "content", |v| prepend_item(v, &block))?;
        let usage = Object::parse(&text)?.get("usage").map(|m| m.value.clone());
        if let Some(range) = usage {
            let of = Usage::default().overlaid(text.get(range.clone())?);
            let with = edit_member(&text, 0..text.len(), "usage", |u| with_iterations(u, c, of));
            text = with.unwrap_or(text);
        }
    }
    if let Some(cm) = edits.context_management() {
        text = set_member(&text, "context_management", &cm)?;
    }
    Some(Bytes::from(text))
}

/// The three events of the compaction block at index 0: its start (`content` null), one
/// `compaction_delta` with the whole summary, its stop.
pub fn compaction_events(summary: &str) -> Vec<u8> {
    let delta = json!({
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "compaction_delta", "content": Some(summary).filter(|s| !s.is_empty())},
    });
    let events = [
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "compaction", "content": null}}),
        ),
        ("content_block_delta", delta),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
    ];
    events.iter().flat_map(|(name, data)| event_stream::event(name, &data.to_string())).collect()
}

/// The usage of a paused answer: no message was sampled, so the top-level counts are 0;
/// the compaction is its one iteration.
fn paused_usage(c: &CompactionAnswer) -> Value {
    let iteration: Value = serde_json::from_str(&compaction_iteration(c)).unwrap_or(Value::Null);
    json!({
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "iterations": [iteration],
    })
}

/// The answer of a request that pauses after compaction (no upstream call): a Message
/// with the compaction block alone, `stop_reason` `compaction`. `id` is its id
/// (`msg_…`), `model` the request's.
pub fn paused_message(
    id: &str,
    model: &str,
    c: &CompactionAnswer,
    applied: &[AppliedEdit],
) -> Vec<u8> {
    let cm: Value = serde_json::from_str(&context_management(applied)).unwrap_or(Value::Null);
    block_message(id, model, c, Some(cm))
}

/// [`paused_message`] as an event stream: `message_start` (no content), the compaction
/// block's events, `message_delta` (`stop_reason` `compaction`, the usage and
/// `context_management`), `message_stop`.
pub fn paused_stream(
    id: &str,
    model: &str,
    c: &CompactionAnswer,
    applied: &[AppliedEdit],
) -> Vec<u8> {
    let cm: Value = serde_json::from_str(&context_management(applied)).unwrap_or(Value::Null);
    block_stream(id, model, c, Some(cm))
}

/// The answer of an on-demand compaction request (`compaction: {"type": "summarize"}`):
/// a Message with the compaction block alone, `stop_reason` `compaction`, no
/// `context_management`. An empty summary (nothing to summarize) is a block whose
/// `content` is null, which a later request may send back as a no-op.
pub fn summary_message(id: &str, model: &str, c: &CompactionAnswer) -> Vec<u8> {
    block_message(id, model, c, None)
}

/// [`summary_message`] as an event stream.
pub fn summary_stream(id: &str, model: &str, c: &CompactionAnswer) -> Vec<u8> {
    block_stream(id, model, c, None)
}

/// A Message holding only `c`'s compaction block; with `cm` as its
/// `context_management` when given.
fn block_message(id: &str, model: &str, c: &CompactionAnswer, cm: Option<Value>) -> Vec<u8> {
    let content = Some(c.summary.as_str()).filter(|s| !s.is_empty());
    let block: Value = json!({"type": "compaction", "content": content});
    let mut message = json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": "compaction",
        "stop_sequence": null,
        "usage": paused_usage(c),
    });
    if let (Some(cm), Some(map)) = (cm, message.as_object_mut()) {
        map.insert("context_management".to_owned(), cm);
    }
    message.to_string().into_bytes()
}

/// [`block_message`] as an event stream: `message_start` (no content), the compaction
/// block's events, `message_delta` (`stop_reason` `compaction`, the usage and `cm`),
/// `message_stop`.
fn block_stream(id: &str, model: &str, c: &CompactionAnswer, cm: Option<Value>) -> Vec<u8> {
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 0, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }});
    let mut usage = paused_usage(c);
    if let Some(map) = usage.as_object_mut() {
        map.retain(|k, _| k == "output_tokens" || k == "iterations");
    }
    let mut delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": "compaction", "stop_sequence": null},
        "usage": usage,
    });
    if let (Some(cm), Some(map)) = (cm, delta.as_object_mut()) {
        map.insert("context_management".to_owned(), cm);
    }
    let mut out = event_stream::event("message_start", &start.to_string());
    out.extend(compaction_events(&c.summary));
    out.extend(event_stream::event("message_delta", &delta.to_string()));
    out.extend(event_stream::event("message_stop", r#"{"type":"message_stop"}"#));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    pub(crate) fn compaction() -> CompactionAnswer {
        CompactionAnswer {
            summary: "Line one.\nLine \"two\".".into(),
            input_tokens: 900,
            output_tokens: 40,
        }
    }

    fn applied() -> Vec<AppliedEdit> {
        vec![AppliedEdit::ClearToolUses { cleared_tool_uses: 2, cleared_input_tokens: 300 }]
    }

    const MESSAGE: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_read_input_tokens":5,"output_tokens":3}}"#;

    #[test]
    fn a_whole_answer_gets_the_block_first_and_the_reports() {
        let edits = AnswerEdits { compaction: Some(compaction()), applied_edits: Some(applied()) };
        let out = decorate_message(MESSAGE.as_bytes(), &edits).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["content"][0],
            json!({"type": "compaction", "content": "Line one.\nLine \"two\"."})
        );
        assert_eq!(v["content"][1]["text"], "Hi");
        assert_eq!(
            v["usage"]["iterations"],
            json!([
                {"type": "compaction", "input_tokens": 900, "output_tokens": 40,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                {"type": "message", "input_tokens": 12, "output_tokens": 3,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5},
            ])
        );
        assert_eq!(v["usage"]["input_tokens"], 12, "the top-level usage is the upstream's");
        assert_eq!(
            v["context_management"],
            json!({"applied_edits": [{"type": "clear_tool_uses_20250919",
                "cleared_tool_uses": 2, "cleared_input_tokens": 300}]})
        );
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with(r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"compaction""#));
        assert_eq!(decorate_message(MESSAGE.as_bytes(), &edits).unwrap(), out, "deterministic");
    }

    #[test]
    fn only_what_there_is_to_report_is_written() {
        let clearing = AnswerEdits { compaction: None, applied_edits: Some(vec![]) };
        let out = decorate_message(MESSAGE.as_bytes(), &clearing).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            MESSAGE.replace(
                r#""output_tokens":3}}"#,
                r#""output_tokens":3},"context_management":{"applied_edits":[]}}"#
            )
        );
        let none = decorate_message(MESSAGE.as_bytes(), &AnswerEdits::default()).unwrap();
        assert_eq!(&none[..], MESSAGE.as_bytes());
        // Iterations the upstream reported stay, after the compaction's.
        let with = MESSAGE.replace(
            r#""output_tokens":3}"#,
            r#""output_tokens":3,"iterations":[{"type":"message","input_tokens":12,"output_tokens":3}]}"#,
        );
        let edits = AnswerEdits { compaction: Some(compaction()), applied_edits: None };
        let v: Value =
            serde_json::from_slice(&decorate_message(with.as_bytes(), &edits).unwrap()).unwrap();
        let iterations = v["usage"]["iterations"].as_array().unwrap();
        assert_eq!((iterations.len(), &iterations[1]["input_tokens"]), (2, &json!(12)));
        assert!(v.get("context_management").is_none());
        assert!(decorate_message(br#"{"type":"error"}"#, &edits).is_none());
        assert!(decorate_message(b"[", &edits).is_none());
    }

    #[test]
    fn a_paused_answer_is_the_block_alone() {
        let c = compaction();
        let v: Value =
            serde_json::from_slice(&paused_message("msg_p", "claude-x", &c, &applied())).unwrap();
        assert_eq!(v["content"], json!([{"type": "compaction", "content": c.summary}]));
        assert_eq!((&v["stop_reason"], &v["stop_sequence"]), (&json!("compaction"), &Value::Null));
        assert_eq!(
            (&v["id"], &v["model"], &v["role"]),
            (&json!("msg_p"), &json!("claude-x"), &json!("assistant"))
        );
        assert_eq!(v["usage"]["input_tokens"], 0);
        assert_eq!(v["usage"]["iterations"][0]["output_tokens"], 40);
        assert_eq!(v["context_management"]["applied_edits"][0]["cleared_tool_uses"], 2);

        let stream = String::from_utf8(paused_stream("msg_p", "claude-x", &c, &[])).unwrap();
        let names: Vec<&str> = stream.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(stream.contains(r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Line one.\nLine \"two\"."}}"#));
        assert!(stream.contains(r#""delta":{"stop_reason":"compaction","stop_sequence":null},"usage":{"output_tokens":0,"iterations":[{"type":"compaction""#));
        assert!(stream.contains(r#""context_management":{"applied_edits":[]}"#));
        assert_eq!(paused_stream("msg_p", "claude-x", &c, &[]), stream.as_bytes(), "deterministic");
    }
}
