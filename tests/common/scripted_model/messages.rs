//! Anthropic Messages (`POST /v1/messages`): checks, reading the turn, answers (JSON or
//! the event stream the API writes).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use http::Response;
use serde_json::{Value, json};

use super::validate::{cache_controls, pairs, signature, text_of};
use super::{Body, Reply, Shell, event_stream, json_response};

/// Roles alternate from `user` once consecutive turns of one role are merged (Claude Code's
/// `system` messages between them are set aside); each `tool_use` is answered in the next
/// user turn, each `tool_result` answers the assistant turn just before; at most four
/// `cache_control` breakpoints; thinking blocks whole, as the model wrote them (their
/// signature is a hash of their text).
pub fn check(body: &Value, out: &mut Vec<String>) {
    let Some(messages) = body["messages"].as_array() else {
        out.push("no messages array".into());
        return;
    };
    let mut turns: Vec<(&str, Vec<&Value>)> = Vec::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("?");
        if role == "system" {
            continue;
        }
        if role != "user" && role != "assistant" {
            out.push(format!("message with role {role}"));
        }
        let blocks: Vec<&Value> = match &m["content"] {
            Value::Array(b) => b.iter().collect(),
            Value::String(_) => Vec::new(),
            _ => {
                out.push(format!("{role} message without content"));
                Vec::new()
            }
        };
        match turns.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    if turns.first().is_none_or(|(r, _)| *r != "user") {
        out.push("the first message is not a user message".into());
    }
    let mut events = Vec::new();
    for (i, (role, blocks)) in turns.iter().enumerate() {
        let uses: Vec<String> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap_or("").to_owned())
            .collect();
        let results: Vec<String> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["tool_use_id"].as_str().unwrap_or("").to_owned())
            .collect();
        if *role == "assistant" {
            let next: Vec<String> = turns
                .get(i + 1)
                .map(|(_, b)| {
                    b.iter()
                        .filter(|b| b["type"] == "tool_result")
                        .map(|b| b["tool_use_id"].as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .unwrap_or_default();
            for id in &uses {
                if !next.contains(id) {
                    out.push(format!("tool_use {id} not answered in the next user turn"));
                }
            }
        } else if !results.is_empty() {
            let before: Vec<String> = i
                .checked_sub(1)
                .and_then(|p| turns.get(p))
                .map(|(_, b)| {
                    b.iter()
                        .filter(|b| b["type"] == "tool_use")
                        .map(|b| b["id"].as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .unwrap_or_default();
            for id in &results {
                if !before.contains(id) {
                    out.push(format!(
                        "tool_result {id} does not answer the assistant turn before it"
                    ));
                }
            }
        }
        events.extend(uses.into_iter().map(|id| (true, id)));
        events.extend(results.into_iter().map(|id| (false, id)));
        for b in blocks {
            let whole = match b["type"].as_str() {
                Some("thinking") => b["thinking"]
                    .as_str()
                    .is_some_and(|t| b["signature"].as_str() == Some(signature(t).as_str())),
                Some("redacted_thinking") => b["data"].as_str().is_some_and(|s| !s.is_empty()),
                _ => true,
            };
            if !whole {
                out.push(format!(
                    "a {} block not as the model wrote it (text, signature or data)",
                    b["type"]
                ));
            }
        }
    }
    pairs(&events, "tool_use", out);
    let breakpoints = cache_controls(&body["system"])
        + cache_controls(&body["tools"])
        + cache_controls(&body["messages"]);
    if breakpoints > 4 {
        out.push(format!("{breakpoints} cache_control breakpoints (at most 4)"));
    }
}

pub fn shell(body: &Value) -> Option<Shell> {
    let tools = body["tools"].as_array()?;
    Shell::find(tools.iter().filter_map(|t| Some((t["name"].as_str()?, &t["input_schema"]))))
}

/// The text of the last `tool_result` block.
pub fn last_result(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    messages
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .rfind(|b| b["type"] == "tool_result")
        .map(|b| text_of(&b["content"]))
}

pub fn answer(
    body: &Value,
    reply: &Reply,
    n: usize,
    tokens: usize,
    stream: bool,
) -> Response<Body> {
    let (content, stop) = match reply {
        Reply::Text(text) => (vec![json!({"type": "text", "text": text})], "end_turn"),
        Reply::Call { text, name, arguments } => (
            vec![
                json!({"type": "text", "text": text}),
                json!({"type": "tool_use", "id": format!("toolu_{n:05}"), "name": name, "input": arguments}),
            ],
            "tool_use",
        ),
    };
    let mut content = content;
    if ["enabled", "adaptive"].contains(&body["thinking"]["type"].as_str().unwrap_or("")) {
        let thinking = format!("Reply {n}: the last tool result says which step comes next.");
        let block =
            json!({"type": "thinking", "thinking": thinking, "signature": signature(&thinking)});
        content.insert(0, block);
    }
    let usage = json!({"input_tokens": tokens, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
    let message = json!({"id": format!("msg_{n:05}"), "type": "message", "role": "assistant", "model": body["model"],
        "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage});
    if !stream {
        return json_response(&message);
    }
    let mut events = Vec::new();
    let mut event =
        |name: &str, data: Value| events.push(format!("event: {name}\ndata: {data}\n\n"));
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    event("message_start", json!({"type": "message_start", "message": start}));
    for (index, block) in content.iter().enumerate() {
        if block["type"] == "thinking" {
            let first = json!({"type": "thinking", "thinking": "", "signature": ""});
            let text = json!({"type": "thinking_delta", "thinking": block["thinking"]});
            let sig = json!({"type": "signature_delta", "signature": block["signature"]});
            let start =
                json!({"type": "content_block_start", "index": index, "content_block": first});
            event("content_block_start", start);
            for delta in [text, sig] {
                let delta = json!({"type": "content_block_delta", "index": index, "delta": delta});
                event("content_block_delta", delta);
            }
            event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
            continue;
        }
        let (first, delta) = if block["type"] == "text" {
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            )
        } else {
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            )
        };
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": first}),
        );
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
        event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
    }
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 20}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    event_stream(events)
}
