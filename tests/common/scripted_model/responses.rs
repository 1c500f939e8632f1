//! The Responses API (`POST /v1/responses`, and the frames of its WebSocket mode): checks,
//! reading the turn, the response object and its events.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use http::Response;
use serde_json::{Value, json};

use super::validate::{pairs, sealed, text_of, unsealed};
use super::{Body, Reply, Shell, event_stream, json_response};

/// Every call (`function_call`, `custom_tool_call`, `local_shell_call`) answered by its
/// output after it, by `call_id`; known message roles; no `compaction` item (this model
/// never issued one, so any is foldgate's sealed item leaking) and no `item_reference`
/// (this model keeps no state over HTTP); reasoning items as the model wrote them (their
/// `encrypted_content` signed).
pub fn check(body: &Value, out: &mut Vec<String>) {
    let items = match &body["input"] {
        Value::String(_) => return,
        Value::Array(items) => items,
        _ => {
            out.push("no input".into());
            return;
        }
    };
    let mut events = Vec::new();
    for item in items {
        let kind = item["type"].as_str().unwrap_or("message");
        let call_id = item["call_id"].as_str().unwrap_or("").to_owned();
        match kind {
            "message" => {
                let role = item["role"].as_str().unwrap_or("?");
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    out.push(format!("message item with role {role}"));
                }
            }
            "function_call" | "custom_tool_call" | "local_shell_call" => {
                events.push((true, call_id))
            }
            "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
                events.push((false, call_id))
            }
            "compaction" | "compaction_summary" => {
                out.push(format!("a {kind} item reached the model (foldgate's sealed item leaked)"))
            }
            "item_reference" => out.push("an item_reference, but the model keeps no state".into()),
            "reasoning" if !item["encrypted_content"].as_str().is_some_and(unsealed) => {
                out.push(format!("reasoning item {} not as the model wrote it", item["id"]));
            }
            _ => {}
        }
    }
    pairs(&events, "function", out);
}

pub fn shell(body: &Value) -> Option<Shell> {
    let tools = body["tools"].as_array()?;
    Shell::find(
        tools
            .iter()
            .filter(|t| t["type"] == "function")
            .filter_map(|t| Some((t["name"].as_str()?, &t["parameters"]))),
    )
}

/// The output of the last `*_call_output` item.
pub fn last_result(body: &Value) -> Option<String> {
    let items = body["input"].as_array()?;
    items
        .iter()
        .rfind(|i| i["type"].as_str().is_some_and(|t| t.ends_with("_call_output")))
        .map(|i| text_of(&i["output"]))
}

/// The output items of `reply`: a reasoning item first when the request asks for their
/// encrypted content back (as Codex does).
pub fn output(body: &Value, reply: &Reply, n: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let include = body["include"].as_array().into_iter().flatten();
    if include.into_iter().any(|i| i == "reasoning.encrypted_content") {
        items.push(json!({"type": "reasoning", "id": format!("rs_{n:05}"), "summary": [],
            "encrypted_content": sealed(&format!("reasoning of reply {n}"))}));
    }
    items.extend(match reply {
        Reply::Text(text) => vec![
            json!({"type": "message", "id": format!("msg_{n:05}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}),
        ],
        Reply::Call { name, arguments, .. } => {
            vec![json!({"type": "function_call", "id": format!("fc_{n:05}"),
            "call_id": format!("call_{n:05}"), "name": name, "arguments": arguments.to_string(), "status": "completed"})]
        }
    });
    items
}

/// The completed response object.
pub fn response(body: &Value, output: &[Value], n: usize, tokens: usize) -> Value {
    json!({"id": format!("resp_{n:05}"), "object": "response", "created_at": 1_700_000_000, "status": "completed",
        "model": body["model"], "output": output,
        "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 20}})
}

/// The events of a streamed response, numbered.
pub fn events(response: &Value) -> Vec<Value> {
    let mut started = response.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    started["usage"] = Value::Null;
    let mut events = vec![
        json!({"type": "response.created", "response": started}),
        json!({"type": "response.in_progress", "response": started}),
    ];
    for (index, item) in response["output"].as_array().into_iter().flatten().enumerate() {
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        if item["type"] == "reasoning" {
            events.push(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
        } else if item["type"] == "function_call" {
            added["arguments"] = json!("");
            events.push(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            events.push(json!({"type": "response.function_call_arguments.delta", "output_index": index, "item_id": item["id"], "delta": item["arguments"]}));
            events.push(json!({"type": "response.function_call_arguments.done", "output_index": index, "item_id": item["id"], "arguments": item["arguments"]}));
        } else {
            let text = &item["content"][0]["text"];
            added["content"] = json!([]);
            events.push(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            events.push(json!({"type": "response.content_part.added", "output_index": index, "item_id": item["id"], "content_index": 0, "part": part}));
            events.push(json!({"type": "response.output_text.delta", "output_index": index, "item_id": item["id"], "content_index": 0, "delta": text}));
            events.push(json!({"type": "response.output_text.done", "output_index": index, "item_id": item["id"], "content_index": 0, "text": text}));
            events.push(json!({"type": "response.content_part.done", "output_index": index, "item_id": item["id"], "content_index": 0, "part": item["content"][0]}));
        }
        events.push(
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
    }
    events.push(json!({"type": "response.completed", "response": response}));
    for (seq, e) in events.iter_mut().enumerate() {
        e["sequence_number"] = json!(seq);
    }
    events
}

pub fn answer(
    body: &Value,
    reply: &Reply,
    n: usize,
    tokens: usize,
    stream: bool,
) -> Response<Body> {
    let response = response(body, &output(body, reply, n), n, tokens);
    if !stream {
        return json_response(&response);
    }
    let events = events(&response)
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    event_stream(events)
}
