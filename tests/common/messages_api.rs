//! An Anthropic Messages provider as tests need it: a Claude Code-like session, a mock
//! provider answering it (JSON and event streams), and the validity checks of a
//! forwarded body.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use bytes::Bytes;
use foldgate::api::messages::{MAX_BREAKPOINTS, breakpoints};
use serde_json::{Value, json};

use super::{Handler, Recorded, channel_body, response};

pub const MODEL: &str = "claude-sonnet-4-5";

/// The digest the Anthropic mock writes when foldgate's summarizer asks it for one.
pub const DIGEST: &str = "## Milestones\n- I read every module the task named.";

/// An Anthropic mock: a message for `/v1/messages` (SSE when `stream`; [`DIGEST`] for a
/// summarization call), a count for `count_tokens`; every answer carries a `request-id`.
pub fn anthropic_provider() -> Handler {
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Arc::new(move |rec: Recorded| {
        let n = answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            let request: Value = serde_json::from_slice(&rec.body).unwrap_or(Value::Null);
            let mut r = if rec.uri.path().ends_with("/count_tokens") {
                response(200, r#"{"input_tokens":42}"#)
            } else if rec.headers.contains_key("x-foldgate-summary") {
                response(
                    200,
                    json!({"id":"msg_d","type":"message","role":"assistant","model":MODEL,
                        "content":[{"type":"text","text":DIGEST}],"stop_reason":"end_turn",
                        "usage":{"input_tokens":900,"output_tokens":20}})
                    .to_string(),
                )
            } else if request["stream"] == json!(true) {
                let events = [
                    (
                        "message_start",
                        json!({"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":MODEL,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":90,"cache_read_input_tokens":10,"cache_creation_input_tokens":0,"output_tokens":1}}}),
                    ),
                    (
                        "content_block_start",
                        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                    ),
                    (
                        "content_block_delta",
                        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"o"}}),
                    ),
                    (
                        "content_block_delta",
                        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"k"}}),
                    ),
                    ("content_block_stop", json!({"type":"content_block_stop","index":0})),
                    (
                        "message_delta",
                        json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}),
                    ),
                    ("message_stop", json!({"type":"message_stop"})),
                ];
                let (tx, body) = channel_body();
                tokio::spawn(async move {
                    for (event, data) in events {
                        let frame = hyper::body::Frame::data(Bytes::from(format!(
                            "event: {event}\ndata: {data}\n\n"
                        )));
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                });
                let mut r = http::Response::new(body);
                r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                r
            } else {
                let mut r = response(
                    200,
                    json!({"id":"msg_1","type":"message","role":"assistant","model":MODEL,
                        "content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn",
                        "stop_sequence":null,"usage":{"input_tokens":100,"output_tokens":1}})
                    .to_string(),
                );
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r
            };
            r.headers_mut().insert("request-id", format!("req_ant{n}").parse().unwrap());
            r
        })
    })
}

/// A Claude Code-like session: system and tools with breakpoints, a task, then rounds of
/// thinking + `tool_use` answered by `tool_result`, a short user remark beside the
/// result every fifth round.
pub fn session(rounds: usize) -> (Value, Value, Vec<Value>) {
    let system = json!([{"type": "text", "text": "You are a careful coding agent. Use the tools.",
        "cache_control": {"type": "ephemeral"}}]);
    let tools = json!([{"name": "read_file", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
        "required": ["path"]}, "cache_control": {"type": "ephemeral"}}]);
    let mut messages = vec![
        json!({"role": "user", "content": "Fix the failing test in src/parser.rs. Never touch Cargo.lock."}),
    ];
    for round in 0..rounds {
        let id = format!("toolu_{round:04}");
        let path = format!("src/module_{round}.rs");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("I should read {path} next."),
                "signature": format!("EqQBCkYIBhgCKkA{round:04}sig/+signature+{}", "Zm9v".repeat(20))},
            {"type": "tool_use", "id": id, "name": "read_file", "input": {"path": path}}]}));
        let mut body = String::new();
        for line in 0..30 {
            body.push_str(&format!(
                "fn item_{round}_{line}(x: u32) -> u32 {{ x * {line} + {round} }}\n"
            ));
        }
        let mut content = vec![json!({"type": "tool_result", "tool_use_id": id, "content": body})];
        if round % 5 == 4 {
            content.push(json!({"type": "text",
                "text": format!("Remark {round}: keep the public API of {path} stable.")}));
        }
        messages.push(json!({"role": "user", "content": content}));
    }
    // Claude Code's breakpoints: the last block of the last two user messages.
    let users: Vec<usize> =
        (0..messages.len()).filter(|&i| messages[i]["role"] == "user").collect();
    for &i in users.iter().rev().take(2) {
        if let Some(blocks) = messages[i]["content"].as_array_mut() {
            blocks.last_mut().unwrap()["cache_control"] = json!({"type": "ephemeral"});
        }
    }
    (system, tools, messages)
}

pub fn params(rounds: usize) -> Value {
    let (system, tools, messages) = session(rounds);
    json!({"model": MODEL, "max_tokens": 2048, "system": system, "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": messages})
}

/// The raw JSON text of every message of a body.
pub fn raw_messages(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        messages: Vec<&'a serde_json::value::RawValue>,
    }
    let body: Body<'_> = serde_json::from_slice(body).unwrap();
    body.messages.iter().map(|m| m.get().to_owned()).collect()
}

/// A forwarded body is a valid Messages request: user first, roles alternating, every
/// `tool_use` answered in the next message and every `tool_result` answering the one
/// before, at most four breakpoints.
pub fn assert_valid(body: &[u8]) {
    let value: Value = serde_json::from_slice(body).unwrap();
    let messages = value["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    let blocks = |m: &Value, kind: &str, key: &str| -> Vec<Value> {
        m["content"]
            .as_array()
            .map(|b| b.iter().filter(|b| b["type"] == kind).map(|b| b[key].clone()).collect())
            .unwrap_or_default()
    };
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            assert_ne!(m["role"], messages[i - 1]["role"], "message {i}");
        }
        for id in blocks(m, "tool_use", "id") {
            assert!(blocks(&messages[i + 1], "tool_result", "tool_use_id").contains(&id), "{id}");
        }
        for id in blocks(m, "tool_result", "tool_use_id") {
            assert!(blocks(&messages[i - 1], "tool_use", "id").contains(&id), "{id}");
        }
    }
    assert!(breakpoints(std::str::from_utf8(body).unwrap()) <= MAX_BREAKPOINTS);
}
