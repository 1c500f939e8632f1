#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The outline scan against the parser on every conversation of the recorded traces: the
//! same message extents and roles, mentions no fewer than a search of the text finds,
//! and the same session key, in the key orders clients send.

use std::path::Path;

use foldgate::model::ChatRequest;
use foldgate::outline::Outline;
use serde_json::{Value, json};

#[test]
fn the_outline_of_every_recorded_conversation_is_what_the_parser_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    let text = std::fs::read_to_string(&path).expect("shared/traces/dev.jsonl beside the repo");
    let mut checked = 0;
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let messages = &record["messages"];
        let tools = json!([{"type": "function", "function": {"name": "bash", "parameters":
            {"type": "object", "properties": {"model": {"type": "string"}}}}}]);
        // Model first (most clients) and messages first (the OpenAI Python SDK), with a
        // tool whose schema names a property `model`, and with whitespace.
        let bodies = [
            serde_json::to_vec(&json!({"model": record["model"], "messages": messages,
                "max_tokens": 1000}))
            .unwrap(),
            serde_json::to_vec(&json!({"messages": messages, "model": record["model"],
                "tools": tools, "max_completion_tokens": 900}))
            .unwrap(),
            serde_json::to_vec_pretty(&json!({"messages": messages, "model": record["model"]}))
                .unwrap(),
        ];
        for body in &bodies {
            let outline = Outline::scan(body).expect("a chat body has an outline");
            let parsed = ChatRequest::parse(body).unwrap();
            assert_eq!(outline.model().as_deref(), parsed.model().as_deref());
            assert_eq!(outline.messages().len(), parsed.messages().len());
            for (o, m) in outline.messages().iter().zip(parsed.messages()) {
                let raw = outline.raw(o);
                assert_eq!(raw, m.raw().as_bytes());
                assert_eq!(o.role, Some(m.role()));
                let search = |needle: &[u8]| memchr::memmem::find_iter(raw, needle).count();
                assert!(o.image_mentions >= search(b"\"image_url\""));
                assert_eq!(o.call_mentions, search(b"\"arguments\""));
            }
            checked += 1;
        }
    }
    assert!(checked >= 3 * 184, "{checked} bodies");
}
