//! Checks every provider makes of a prompt, shared by the three APIs.
//!
//! Tokens are counted with `o200k_base` over the request body's JSON text as received:
//! every character of the prompt is in it, and JSON keys, quotes and escapes only add
//! tokens, so the count cannot fall below the prompt's own (it runs 10-30% over).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashSet;

use serde_json::Value;

/// Prompt tokens of a request body (see the module's rule).
pub fn tokens(text: &str) -> usize {
    bpe_openai::o200k_base().count(text)
}

/// The signature the model gives its thinking text (and reasoning items): a hash of the
/// text, so that a block edited on its way back does not match.
pub fn signature(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// A reasoning item's `encrypted_content`: a payload and its signature.
pub fn sealed(payload: &str) -> String {
    format!("{payload}.{}", signature(payload))
}

/// True when `content` is one [`sealed`] made.
pub fn unsealed(content: &str) -> bool {
    content.rsplit_once('.').is_some_and(|(payload, sig)| signature(payload) == sig)
}

/// Thinking blocks (Messages) and reasoning items (Responses) in a request.
pub fn signed(body: &Value) -> usize {
    let blocks = body["messages"].as_array().into_iter().flatten();
    let blocks = blocks.filter_map(|m| m["content"].as_array()).flatten();
    let items = body["input"].as_array().into_iter().flatten();
    blocks.chain(items).filter(|b| b["type"] == "thinking" || b["type"] == "reasoning").count()
}

/// Text of a tool result's content: a string, or the text of its parts.
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().map(text_of).collect::<Vec<_>>().join("\n"),
        Value::Object(o) => ["text", "content", "output"]
            .iter()
            .find_map(|k| o.get(*k))
            .map(text_of)
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// Objects with a `cache_control` field anywhere in `v`.
pub fn cache_controls(v: &Value) -> usize {
    match v {
        Value::Object(o) => {
            usize::from(o.get("cache_control").is_some_and(Value::is_object))
                + o.values().map(cache_controls).sum::<usize>()
        }
        Value::Array(a) => a.iter().map(cache_controls).sum(),
        _ => 0,
    }
}

/// Calls and results in order (`(true, id)` a call, `(false, id)` a result): every call
/// answered by a result after it, every result after its call, no id called twice.
pub fn pairs(events: &[(bool, String)], what: &str, out: &mut Vec<String>) {
    let mut called = HashSet::new();
    let mut answered = HashSet::new();
    for (is_call, id) in events {
        if *is_call {
            if !called.insert(id.clone()) {
                out.push(format!("{what} call {id} made twice"));
            }
        } else if !called.contains(id) {
            out.push(format!("{what} result {id} without a call before it"));
        } else if !answered.insert(id.clone()) {
            out.push(format!("{what} call {id} answered twice"));
        }
    }
    for id in called.difference(&answered) {
        out.push(format!("{what} call {id} never answered"));
    }
}
