#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Bounded counting against the unbounded tokenizer on real agent text
//! (`../shared/traces/dev.jsonl`): chunking must not change counts except in the rare
//! runs where it has to cut inside a piece.

use std::path::Path;

use foldgate::compaction::tokens::encoding::for_each_chunk;
use foldgate::compaction::tokens::{Encoding, message_tokens, message_tokens_by, tools_tokens};
use foldgate::model::Message;

/// tiktoken-rs's encoder for `enc`: the reference.
fn tiktoken(enc: Encoding) -> &'static tiktoken_rs::CoreBPE {
    match enc {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    }
}

/// Every recorded conversation: its messages and its tool definitions.
fn recorded() -> Vec<(Vec<Message>, Option<String>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let messages = (v["messages"].as_array().into_iter().flatten())
                .map(|m| Message::from_value(m.clone()).unwrap())
                .collect();
            out.push((messages, v.get("tools").map(|t| t.to_string())));
        }
    }
    out
}

/// The encoder gives the counts tiktoken-rs gives the same chunks, on every message and
/// every tool list of every recorded conversation, as the engine counts them (so a
/// replay forwards the same bytes with either).
#[test]
fn counts_equal_tiktoken_s_on_every_recorded_conversation() {
    let conversations = recorded();
    assert!(conversations.len() >= 184, "{}", conversations.len());
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let reference = |text: &str| {
            let mut n = 0;
            for_each_chunk(text, |chunk| n += tiktoken(enc).encode_ordinary(chunk).len());
            n
        };
        let mut messages = 0;
        for (msgs, tools) in &conversations {
            for m in msgs {
                let (got, expected) = (message_tokens(enc, m), message_tokens_by(&reference, m));
                assert_eq!(got, expected, "{}: {:.300}", enc.name(), m.raw());
                messages += 1;
            }
            if let Some(tools) = tools {
                assert_eq!(tools_tokens(enc, tools), reference(tools), "{}", enc.name());
            }
        }
        assert!(messages > 10_000, "{messages}");
    }
}

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
                let t = Message::from_value(m.clone()).unwrap().text().into_owned();
                let exact = tiktoken(enc).encode_ordinary(&t).len();
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
