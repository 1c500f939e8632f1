//! A deterministic agent conversation and a mock provider that answers it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Handler, Proxy, Recorded, TestBody, channel_body, config_for, full, response};

/// A coding-agent conversation: a task, then rounds of tool calls with sizeable results,
/// with a short user remark every `remark_every` rounds. Tool-call ids are reused
/// across rounds, as real agents do.
pub fn conversation(rounds: usize, remark_every: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding agent. Use the tools."}),
        json!({"role": "user", "content": "Fix the failing test in src/parser.rs. Never touch Cargo.lock."}),
    ];
    for round in 0..rounds {
        let id = format!("call_{}", round % 3);
        let path = format!("src/module_{round}.rs");
        messages.push(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "read_file", "arguments": json!({"path": path}).to_string()}}]
        }));
        let mut body = String::new();
        for line in 0..30 {
            body.push_str(&format!(
                "fn item_{round}_{line}(x: u32) -> u32 {{ x * {line} + {round} }}\n"
            ));
        }
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": body}));
        if remark_every > 0 && round % remark_every == remark_every - 1 {
            messages
                .push(json!({"role": "assistant", "content": format!("Read {path}; continuing.")}));
            messages.push(json!({"role": "user", "content": format!("Remark {round}: keep the public API of {path} stable.")}));
        }
    }
    messages
}

/// The requests an agent sends for `messages`: one per point where the model must
/// answer (after a user or tool message), each carrying the whole history so far.
pub fn requests(messages: &[Value], extra: &[(&str, Value)]) -> Vec<Bytes> {
    let tools = json!([{"type": "function", "function": {"name": "read_file",
        "description": "Read a file", "parameters": {"type": "object",
        "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]);
    (1..=messages.len())
        .filter(|&end| {
            let role = messages[end - 1]["role"].as_str().unwrap();
            let next_is_tool = messages.get(end).is_some_and(|m| m["role"] == "tool");
            (role == "user" || role == "tool") && !next_is_tool
        })
        .map(|end| {
            let mut body = serde_json::Map::new();
            body.insert("model".into(), json!("gpt-4o"));
            body.insert("messages".into(), Value::Array(messages[..end].to_vec()));
            body.insert("tools".into(), tools.clone());
            body.insert("max_tokens".into(), json!(512));
            body.insert("x_vendor_field".into(), json!({"kept": [1, 2, 3]}));
            for (k, v) in extra {
                body.insert((*k).into(), v.clone());
            }
            Bytes::from(serde_json::to_vec(&Value::Object(body)).unwrap())
        })
        .collect()
}

/// Counters of a mock provider.
#[derive(Default)]
pub struct ProviderStats {
    pub summaries: AtomicUsize,
    pub chats: AtomicUsize,
}

pub const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}"#;

/// A provider: digests for summarization calls (`x-foldgate-summary`), SSE for
/// `"stream": true`, a completion otherwise.
pub fn provider(stats: Arc<ProviderStats>) -> Handler {
    Arc::new(move |rec: Recorded| {
        let stats = stats.clone();
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                let n = stats.summaries.fetch_add(1, Ordering::SeqCst);
                let digest = format!(
                    "## Milestones\n- I read the modules (digest {n}).\n## Key artifacts\n- src/parser.rs"
                );
                let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": digest}}]});
                return response(200, body.to_string());
            }
            stats.chats.fetch_add(1, Ordering::SeqCst);
            let request: Value = serde_json::from_slice(&rec.body).unwrap_or(Value::Null);
            if request["stream"] == json!(true) {
                let (tx, body) = channel_body();
                tokio::spawn(async move {
                    for chunk in [
                        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"o"}}]}"#,
                        r#"{"choices":[{"index":0,"delta":{"content":"k"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":2,"total_tokens":102}}"#,
                        "[DONE]",
                    ] {
                        let frame =
                            hyper::body::Frame::data(Bytes::from(format!("data: {chunk}\n\n")));
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                });
                let mut r = http::Response::new(body);
                r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                return r;
            }
            let mut r = response(200, COMPLETION);
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    })
}

/// foldgate's configuration for chat tests: a 12k-token window so conversations of a few
/// dozen tool rounds are compacted, and the model summarizer (answered by [`provider`]).
pub fn chat_config(upstream: &str) -> foldgate::config::Config {
    let mut config = config_for(upstream);
    config.compaction.max_context_tokens = Some(12_000);
    config.summarizer.kind = foldgate::config::SummarizerKind::Llm;
    config.summarizer.timeout = std::time::Duration::from_secs(5);
    config
}

/// A chat-completions request to `proxy` with a credential and a session id.
pub fn chat_request(
    proxy: &Proxy,
    body: Bytes,
    credential: &str,
    session: &str,
) -> http::Request<TestBody> {
    chat_request_to(&proxy.url("/v1/chat/completions"), body, credential, session)
}

/// A chat-completions request to `url` with a credential and a session id.
pub fn chat_request_to(
    url: &str,
    body: Bytes,
    credential: &str,
    session: &str,
) -> http::Request<TestBody> {
    http::Request::post(url)
        .header("authorization", credential)
        .header("x-session-id", session)
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap()
}
