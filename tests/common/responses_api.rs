//! A Responses API provider as tests need it: Codex-like sessions as items, response
//! objects and event streams as the API writes them, a mock provider answering them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use hyper::body::Frame;
use serde_json::{Value, json};

use super::{Handler, Recorded, TestBody, channel_body, response};

/// An encrypted blob as the API returns them (opaque to foldgate).
pub fn blob(seed: usize) -> String {
    (0..240).map(|i| char::from(b'A' + ((i * 7 + seed * 13) % 26) as u8)).collect()
}

/// A Codex-like session as Responses items: a compaction item from an earlier
/// server-side compaction, the task, then rounds of encrypted reasoning, a shell call and
/// its sizeable output, with a short user remark every fifth round.
pub fn session_items(rounds: usize) -> Vec<Value> {
    let mut items = vec![
        json!({"type": "compaction", "id": "cmp_0", "encrypted_content": blob(0)}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text",
            "text": "Fix the failing test in src/parser.rs. Never touch Cargo.lock."}]}),
    ];
    for round in 0..rounds {
        items.extend(round_items(round));
        if round % 5 == 4 {
            items.push(
                json!({"type": "message", "role": "assistant", "id": format!("msg_{round}"),
                "status": "completed", "content": [{"type": "output_text",
                "text": format!("Read module {round}; continuing."), "annotations": []}]}),
            );
            items.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text",
                "text": format!("Remark {round}: keep the public API of module {round} stable.")}]}));
        }
    }
    items
}

pub fn round_items(round: usize) -> Vec<Value> {
    let call_id = format!("call_{round}");
    let mut output = String::new();
    for line in 0..30 {
        output.push_str(&format!(
            "fn item_{round}_{line}(x: u32) -> u32 {{ x * {line} + {round} }}\n"
        ));
    }
    vec![
        json!({"type": "reasoning", "id": format!("rs_{round}"), "summary": [],
            "encrypted_content": blob(round + 1)}),
        json!({"type": "function_call", "id": format!("fc_{round}"), "call_id": call_id,
            "name": "shell", "arguments": json!({"cmd": ["cat", format!("src/module_{round}.rs")]}).to_string(),
            "status": "completed"}),
        json!({"type": "function_call_output", "call_id": call_id, "output": output}),
    ]
}

pub fn body_of(items: &[Value], extra: &[(&str, Value)]) -> Bytes {
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!("gpt-4.1"));
    body.insert("instructions".into(), json!("You are a careful coding agent."));
    body.insert("input".into(), Value::Array(items.to_vec()));
    body.insert(
        "tools".into(),
        json!([{"type": "function", "name": "shell",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "array"}}}}]),
    );
    body.insert("max_output_tokens".into(), json!(512));
    body.insert("store".into(), json!(false));
    for (k, v) in extra {
        body.insert((*k).into(), v.clone());
    }
    Bytes::from(serde_json::to_vec(&Value::Object(body)).unwrap())
}

pub const USAGE: &str = r#"{"input_tokens":100,"input_tokens_details":{"cached_tokens":40},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":101}"#;

/// A response object as the API returns it, with its status, usage and (for a failure)
/// error.
pub fn response_object(status: &str, usage: &str, error: &str) -> String {
    format!(
        r#"{{"id":"resp_1","object":"response","created_at":1700000000,"status":"{status}","error":{error},"model":"gpt-4.1","output":[{{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"ok","annotations":[]}}]}}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{usage}}}"#
    )
}

/// Server-sent events as the API writes them: `event:` and `data:` lines.
pub fn sse(events: &[(&str, String)]) -> String {
    events.iter().map(|(e, d)| format!("event: {e}\ndata: {d}\n\n")).collect()
}

/// `response.created` and `response.in_progress`, the events a stream starts with.
pub fn leading_events() -> Vec<(&'static str, String)> {
    let in_progress = response_object("in_progress", "null", "null");
    vec![
        (
            "response.created",
            format!(
                r#"{{"type":"response.created","sequence_number":0,"response":{in_progress}}}"#
            ),
        ),
        (
            "response.in_progress",
            format!(
                r#"{{"type":"response.in_progress","sequence_number":1,"response":{in_progress}}}"#
            ),
        ),
    ]
}

/// A streamed answer that completes, with usage in its `response.completed` event.
pub fn completed_stream() -> String {
    sse(&[
        ("response.created", format!(r#"{{"type":"response.created","sequence_number":0,"response":{}}}"#, response_object("in_progress", "null", "null"))),
        ("response.output_text.delta", r#"{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"ok","logprobs":[]}"#.to_owned()),
        ("response.completed", format!(r#"{{"type":"response.completed","sequence_number":2,"response":{}}}"#, response_object("completed", USAGE, "null"))),
    ])
}

/// A streamed answer that fails after its leading events with `code` and `message`.
pub fn failed_stream(code: &str, message: &str) -> String {
    let error = json!({"code": code, "message": message}).to_string();
    let failed = response_object("failed", "null", &error);
    let mut events = leading_events();
    events.push((
        "response.failed",
        format!(r#"{{"type":"response.failed","sequence_number":2,"response":{failed}}}"#),
    ));
    sse(&events)
}

/// OpenAI's answer to a streamed request over the window.
pub fn overflow_stream() -> String {
    failed_stream(
        "context_length_exceeded",
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
    )
}

/// A 200 event stream of `text`, sent in small frames a moment apart, with a header of
/// the provider's own.
pub fn event_stream(text: String) -> Response<TestBody> {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        for chunk in Bytes::from(text).chunks(97).map(Bytes::copy_from_slice) {
            if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    });
    let mut r = Response::new(body);
    r.headers_mut().insert("content-type", "text/event-stream; charset=utf-8".parse().unwrap());
    r.headers_mut().insert("x-request-id", "req_upstream".parse().unwrap());
    r
}

/// A mock Responses provider: a digest for summarizer calls, SSE for `"stream": true`,
/// a 400 `invalid_encrypted_content` when an item's encrypted content is `INVALID`, a
/// response object otherwise.
pub fn responses_provider() -> Handler {
    Arc::new(|rec: Recorded| {
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                // A digest asked in the Responses API, as a Codex model answers it.
                let body = json!({"id": "resp_d", "object": "response", "status": "completed",
                    "output": [{"type": "reasoning", "id": "rs_d", "summary": []},
                        {"type": "message", "id": "msg_d", "role": "assistant", "content":
                        [{"type": "output_text", "text": DIGEST, "annotations": []}]}]});
                return response(200, body.to_string());
            }
            if memchr::memmem::find(&rec.body, b"\"INVALID\"").is_some() {
                let mut r = response(400, INVALID_ENCRYPTED);
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                return r;
            }
            let request: Value = serde_json::from_slice(&rec.body).unwrap_or(Value::Null);
            if request["stream"] == json!(true) {
                let mut r = response(200, completed_stream());
                r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                return r;
            }
            let mut r = response(200, response_object("completed", USAGE, "null"));
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    })
}

/// The digest the mock writes when foldgate's summarizer asks it for one.
pub const DIGEST: &str = "## Milestones\n- I read modules 0 to 39 and ran the parser tests.";

pub const INVALID_ENCRYPTED: &str = r#"{"error":{"message":"The encrypted content for item rs_bad could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#;
