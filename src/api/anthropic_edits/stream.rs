//! A Messages event stream rewritten to report what [`AnswerEdits`] says: the
//! compaction block's events at index 0 right after `message_start` (which must be the
//! first event but for `ping`s and comments), every later `content_block_*` event's
//! `index` one up, and `context_management` and `usage.iterations` in `message_delta`.
//! Every other event passes byte for byte; a changed event keeps every byte but the
//! members it changes.

use super::answer::{AnswerEdits, Usage, compaction_events, with_iterations};
use crate::api::event_stream::{self, Flow, Rewriting};
use crate::api::json_text::{Object, edit_member, set_member, splice};

/// Rewrites a Messages stream, fed in chunks split anywhere (see the module
/// documentation). A stream that is not an event stream, or whose first event is not
/// `message_start`, passes through unchanged.
#[derive(Debug)]
pub struct CompactionInjector {
    edits: AnswerEdits,
    stream: Rewriting,
    /// The usage `message_start` stated, once seen.
    started: Option<Usage>,
}

impl CompactionInjector {
    /// An injector of `edits`.
    pub fn new(edits: AnswerEdits) -> Self {
        Self { edits, stream: Rewriting::default(), started: None }
    }

    /// The bytes to send for `chunk` (possibly fewer or more: whole events only).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let (edits, started) = (&self.edits, &mut self.started);
        self.stream.push(chunk, |block, out| on_block(edits, started, block, out))
    }

    /// The bytes still held at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        self.stream.finish()
    }
}

/// Writes one whole event block.
fn on_block(
    edits: &AnswerEdits,
    started: &mut Option<Usage>,
    block: &[u8],
    out: &mut Vec<u8>,
) -> Flow {
    let read = event_stream::read(block);
    let Some(data) = read.data.as_deref() else {
        out.extend_from_slice(block);
        return Flow::Rewrite;
    };
    let kind = read.kind();
    let Some(usage) = started else {
        out.extend_from_slice(block);
        match kind.as_deref() {
            Some("message_start") => {}
            Some("ping") => return Flow::Rewrite,
            _ => return Flow::PassRest,
        }
        *started = Some(start_usage(data));
        if let Some(c) = &edits.compaction {
            out.extend(compaction_events(&c.summary));
        }
        return Flow::Rewrite;
    };
    let changed = match kind.as_deref() {
        Some("content_block_start" | "content_block_delta" | "content_block_stop")
            if edits.compaction.is_some() =>
        {
            shift_index(data)
        }
        Some("message_delta") => delta(edits, *usage, data),
        _ => None,
    };
    match changed {
        Some(data) => out.extend(event_stream::with_data(block, &data)),
        None => out.extend_from_slice(block),
    }
    Flow::Rewrite
}

/// The usage `message_start`'s message states.
fn start_usage(data: &str) -> Usage {
    let usage = Object::parse(data)
        .and_then(|o| o.value(data, "message").map(str::to_owned))
        .and_then(|m| Object::parse(&m).and_then(|o| o.value(&m, "usage").map(str::to_owned)));
    usage.map_or_else(Usage::default, |u| Usage::default().overlaid(&u))
}

/// The event's data with its top-level `index` one up.
fn shift_index(data: &str) -> Option<String> {
    let member = Object::parse(data)?.get("index")?.value.clone();
    let index: u64 = data.get(member.clone())?.parse().ok()?;
    splice(data, member, &index.saturating_add(1).to_string())
}

/// `message_delta`'s data with `context_management` and `usage.iterations`.
fn delta(edits: &AnswerEdits, started: Usage, data: &str) -> Option<String> {
    let mut text = data.to_owned();
    let mut changed = false;
    if let Some(c) = &edits.compaction {
        let usage = Object::parse(&text)?.get("usage").map(|m| m.value.clone());
        if let Some(range) = usage {
            let of = started.overlaid(text.get(range)?);
            let whole = 0..text.len();
            if let Some(next) = edit_member(&text, whole, "usage", |u| with_iterations(u, c, of)) {
                text = next;
                changed = true;
            }
        }
    }
    if let Some(cm) = edits.context_management() {
        text = set_member(&text, "context_management", &cm)?;
        changed = true;
    }
    changed.then_some(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::api::anthropic_edits::{AppliedEdit, CompactionAnswer};

    fn upstream() -> String {
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":7,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            ("ping", r#"{"type": "ping"}"#),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            ),
            ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"read","input":{}}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#,
            ),
            ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ];
        events.iter().map(|(n, d)| format!("event: {n}\ndata: {d}\n\n")).collect()
    }

    fn edits() -> AnswerEdits {
        AnswerEdits {
            compaction: Some(CompactionAnswer {
                summary: "S".into(),
                input_tokens: 50,
                output_tokens: 5,
            }),
            applied_edits: Some(vec![AppliedEdit::ClearThinking {
                cleared_thinking_turns: 1,
                cleared_input_tokens: 8,
            }]),
        }
    }

    fn run(edits: AnswerEdits, stream: &[u8], splits: &[usize]) -> Vec<u8> {
        let mut injector = CompactionInjector::new(edits);
        let mut out = Vec::new();
        let mut at = 0;
        for &split in splits.iter().chain(std::iter::once(&stream.len())) {
            out.extend(injector.push(&stream[at..split]));
            at = split;
        }
        out.extend(injector.finish());
        out
    }

    fn data(stream: &[u8]) -> Vec<Value> {
        let text = String::from_utf8(stream.to_vec()).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn the_block_comes_first_and_later_indices_shift() {
        let out = run(edits(), upstream().as_bytes(), &[]);
        let events = data(&out);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            &kinds[..5],
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start"
            ]
        );
        assert_eq!(events[1]["content_block"], json!({"type": "compaction", "content": null}));
        assert_eq!(events[2]["delta"], json!({"type": "compaction_delta", "content": "S"}));
        let indices: Vec<u64> = events.iter().filter_map(|e| e["index"].as_u64()).collect();
        assert_eq!(indices, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
        let delta = &events[events.len() - 2];
        assert_eq!(
            delta["context_management"]["applied_edits"][0]["type"],
            "clear_thinking_20251015"
        );
        assert_eq!(
            delta["usage"]["iterations"],
            json!([
                {"type": "compaction", "input_tokens": 50, "output_tokens": 5,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                {"type": "message", "input_tokens": 20, "output_tokens": 9,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 7},
            ])
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(&upstream()[..upstream().find("event: content_block_start").unwrap()])
        );
        assert!(text.contains("event: ping\ndata: {\"type\": \"ping\"}\n\n"));
        assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    }

    #[test]
    fn chunks_split_at_every_byte_give_the_same_stream() {
        let stream = upstream();
        let whole = run(edits(), stream.as_bytes(), &[]);
        for split in 0..=stream.len() {
            assert_eq!(run(edits(), stream.as_bytes(), &[split]), whole, "split at {split}");
        }
        let every: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(run(edits(), stream.as_bytes(), &every), whole);
    }

    #[test]
    fn a_ping_before_message_start_is_passed_on() {
        let stream = format!("event: ping\ndata: {{\"type\":\"ping\"}}\n\n{}", upstream());
        let out = run(edits(), stream.as_bytes(), &[]);
        let injected = run(edits(), upstream().as_bytes(), &[]);
        assert_eq!(
            out[..out.len() - injected.len()],
            stream.as_bytes()[..stream.len() - upstream().len()]
        );
        assert_eq!(out[out.len() - injected.len()..], injected);
    }

    #[test]
    fn without_a_compaction_only_the_delta_changes() {
        let e = AnswerEdits { compaction: None, applied_edits: Some(vec![]) };
        let out = String::from_utf8(run(e, upstream().as_bytes(), &[])).unwrap();
        let want = upstream().replace(
            r#""usage":{"output_tokens":9}}"#,
            r#""usage":{"output_tokens":9},"context_management":{"applied_edits":[]}}"#,
        );
        assert_eq!(out, want);
        assert_eq!(run(AnswerEdits::default(), upstream().as_bytes(), &[]), upstream().as_bytes());
    }

    #[test]
    fn streams_it_must_not_touch_pass_through() {
        let error =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let event_error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\nevent: content_block_start\ndata: {\"index\":0}\n\n";
        for stream in [error, event_error, "", "garbage"] {
            for split in 0..=stream.len() {
                assert_eq!(run(edits(), stream.as_bytes(), &[split]), stream.as_bytes());
            }
        }
    }
}
