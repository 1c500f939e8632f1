//! Chat completions (`POST /v1/chat/completions`): checks, reading the turn, answers (JSON,
//! or chunks with `tool_calls` deltas and a last usage chunk when asked).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use http::Response;
use serde_json::{Value, json};

use super::validate::{pairs, text_of};
use super::{Body, Reply, Shell, event_stream, json_response};

/// Known roles; the tool messages answering an assistant's `tool_calls` come right after it,
/// one per call, and no tool message stands anywhere else.
pub fn check(body: &Value, out: &mut Vec<String>) {
    let Some(messages) = body["messages"].as_array() else {
        out.push("no messages array".into());
        return;
    };
    let mut events = Vec::new();
    // The calls of the assistant message the current run of tool messages answers.
    let mut open: Option<Vec<String>> = None;
    for m in messages {
        let role = m["role"].as_str().unwrap_or("?");
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or("").to_owned();
            match &mut open {
                Some(ids) if ids.contains(&id) => ids.retain(|i| *i != id),
                _ => out.push(format!(
                    "tool message {id} does not follow the assistant message calling it"
                )),
            }
            events.push((false, id));
            continue;
        }
        if let Some(ids) = open.take() {
            for id in ids {
                out.push(format!("tool call {id} not answered right after its assistant message"));
            }
        }
        if !["system", "developer", "user", "assistant"].contains(&role) {
            out.push(format!("message with role {role}"));
        }
        if role == "assistant" {
            let ids: Vec<String> = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["id"].as_str().unwrap_or("").to_owned())
                .collect();
            events.extend(ids.iter().map(|id| (true, id.clone())));
            if !ids.is_empty() {
                open = Some(ids);
            }
        }
    }
    if let Some(ids) = open {
        for id in ids {
            out.push(format!("tool call {id} not answered"));
        }
    }
    pairs(&events, "tool", out);
}

pub fn shell(body: &Value) -> Option<Shell> {
    let tools = body["tools"].as_array()?;
    Shell::find(
        tools
            .iter()
            .filter_map(|t| Some((t["function"]["name"].as_str()?, &t["function"]["parameters"]))),
    )
}

/// The content of the last tool message.
pub fn last_result(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    messages.iter().rfind(|m| m["role"] == "tool").map(|m| text_of(&m["content"]))
}

pub fn answer(
    body: &Value,
    reply: &Reply,
    n: usize,
    tokens: usize,
    stream: bool,
) -> Response<Body> {
    let (message, finish) = match reply {
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Reply::Call { text, name, arguments } => (
            json!({"role": "assistant", "content": text, "tool_calls": [{"id": format!("call_{n:05}"), "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}}]}),
            "tool_calls",
        ),
    };
    let usage =
        json!({"prompt_tokens": tokens, "completion_tokens": 20, "total_tokens": tokens + 20});
    let id = format!("chatcmpl-{n:05}");
    if !stream {
        return json_response(
            &json!({"id": id, "object": "chat.completion", "created": 1_700_000_000, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}),
        );
    }
    let chunk = |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": body["model"], "choices": choices});
    let mut chunks = vec![chunk(
        json!([{"index": 0, "delta": {"role": "assistant", "content": message["content"]}, "finish_reason": null}]),
    )];
    for (index, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        chunks.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}]}, "finish_reason": null}])));
        chunks.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [{"index": index,
            "function": {"arguments": call["function"]["arguments"]}}]}, "finish_reason": null}])));
    }
    chunks.push(chunk(json!([{"index": 0, "delta": {}, "finish_reason": finish}])));
    if body["stream_options"]["include_usage"] == json!(true) {
        let mut last = chunk(json!([]));
        last["usage"] = usage;
        chunks.push(last);
    }
    let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    events.push("data: [DONE]\n\n".into());
    event_stream(events)
}
