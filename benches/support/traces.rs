//! Long conversations for benchmarks, made of the recorded agent sessions in
//! `../shared/traces/dev.jsonl` (read-only; CI clones the repository beside it).

use foldgate::compaction::tokens::{Encoding, message_tokens};
use foldgate::model::Message;
use serde_json::Value;

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/traces/dev.jsonl");

/// Messages of the longest dev sessions, concatenated (system prompts after the first
/// dropped) until the conversation holds at least `tokens` o200k tokens; it ends on a
/// user or tool message, as a request does.
pub fn conversation(tokens: usize) -> Vec<Value> {
    let text =
        std::fs::read_to_string(TRACES).expect("../shared/traces/dev.jsonl beside the repository");
    let mut sessions: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    sessions.sort_by_key(|s| std::cmp::Reverse(s["approx_tokens"].as_u64().unwrap_or(0)));
    let mut out: Vec<Value> = Vec::new();
    let mut total = 0;
    'outer: for s in sessions {
        for m in s["messages"].as_array().unwrap() {
            // Stop at the target, but never between a call and its results.
            if total >= tokens && m["role"] != "tool" {
                break 'outer;
            }
            if !out.is_empty() && m["role"] == "system" {
                continue;
            }
            total += message_tokens(Encoding::O200kBase, &Message::from_value(m.clone()).unwrap());
            out.push(m.clone());
        }
    }
    while out.last().is_some_and(|m| m["role"] == "assistant") {
        out.pop();
    }
    out
}
