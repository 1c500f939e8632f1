#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Bounded counting against the unbounded tokenizer on real agent text
//! (`../shared/traces/dev.jsonl`): chunking must not change counts except in the rare
//! runs where it has to cut inside a piece.

use std::path::Path;

use foldgate::compaction::tokens::Encoding;
use foldgate::model::Message;

#[test]
fn bounded_counts_match_tiktoken_on_trace_text() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let (mut messages, mut differing, mut exact_total, mut diff_total) =
            (0usize, 0usize, 0usize, 0usize);
        for line in text.lines().step_by(6) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for m in v["messages"].as_array().unwrap() {
                let t = Message::from_value(m.clone()).unwrap().text();
                let exact = enc.bpe().encode_ordinary(&t).len();
                let ours = enc.count(&t);
                messages += 1;
                exact_total += exact;
                diff_total += exact.abs_diff(ours);
                differing += usize::from(exact != ours);
            }
        }
        assert!(messages > 1000, "{messages}");
        assert!(
            differing * 100 < messages,
            "{}: {differing} of {messages} messages differ",
            enc.name()
        );
        assert!(
            diff_total * 1000 < exact_total,
            "{}: off by {diff_total} of {exact_total} tokens",
            enc.name()
        );
    }
}

#[test]
fn adversarial_runs_count_quickly() {
    for text in
        ["a".repeat(200_000), " ".repeat(200_000), "=/".repeat(100_000), "é".repeat(100_000)]
    {
        let ours = Encoding::O200kBase.count(&text);
        // One token per byte is the most a text can take.
        assert!(ours > 0 && ours <= text.len());
    }
}
