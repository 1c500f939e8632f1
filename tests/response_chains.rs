//! Responses chains over HTTP: a client that sends only the new items and names the last
//! response (`previous_response_id`, as the Agents SDK does with `store: true`) is read as
//! the whole conversation foldgate stored, compacted past the trigger, and forwarded so
//! that the upstream answers from the compacted conversation; below the trigger, as
//! received. The upstream here keeps responses by id, as the Responses API does.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::*;
use foldgate::conversation::Encoding;
use serde_json::{Value, json};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_chain_check.py");
const WINDOW: usize = 16_000;

/// What the upstream saw: each request's prompt in tokens (o200k over the JSON text of
/// its instructions and whole input, which cannot under-count), and the requests that
/// named a response it did not know.
#[derive(Default)]
struct Seen {
    prompts: Vec<usize>,
    unknown: usize,
    continued: usize,
}

/// A Responses upstream that stores every response (its whole input and its output) and
/// continues a request naming one; each answer is one `function_call`.
fn chaining_upstream(seen: Arc<Mutex<Seen>>) -> Handler {
    let stored: Arc<Mutex<HashMap<String, Vec<Value>>>> = Arc::default();
    Arc::new(move |rec: Recorded| {
        if rec.method != http::Method::POST {
            // No WebSocket mode here (foldgate asks for one first).
            return Box::pin(async { response(404, r#"{"detail":"Not Found"}"#) });
        }
        if memchr::memmem::find(&rec.body, b"compaction_trigger").is_some() {
            // As vLLM or a gateway: the item is not one it knows.
            let error = r#"{"error":{"message":"Invalid value: 'compaction_trigger'.","type":"invalid_request_error","param":"input","code":"invalid_value"}}"#;
            return Box::pin(async move {
                let mut r = response(400, error);
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r
            });
        }
        let body: Value = serde_json::from_slice(&rec.body).unwrap_or(Value::Null);
        let mut seen = seen.lock().unwrap();
        let mut items = Vec::new();
        if let Some(previous) = body["previous_response_id"].as_str() {
            seen.continued += 1;
            match stored.lock().unwrap().get(previous) {
                Some(before) => items.extend(before.iter().cloned()),
                None => {
                    seen.unknown += 1;
                    let error = json!({"error": {"message": format!("Previous response with id '{previous}' not found."), "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"}});
                    return Box::pin(async move { response(400, error.to_string()) });
                }
            }
        }
        match &body["input"] {
            Value::Array(input) => items.extend(input.iter().cloned()),
            Value::String(text) => items.push(json!({"role": "user", "content": text})),
            _ => {}
        }
        let prompt = format!("{}{}", body["instructions"], Value::Array(items.clone()));
        let tokens = Encoding::O200kBase.count(&prompt);
        seen.prompts.push(tokens);
        let n = seen.prompts.len();
        let id = format!("resp_{n:04}");
        let call = json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"), "name": "shell", "arguments": "{\"cmd\":\"cargo test\"}", "status": "completed"});
        items.push(call.clone());
        stored.lock().unwrap().insert(id.clone(), items);
        let answer = json!({
            "id": id, "object": "response", "created_at": 1, "status": "completed",
            "model": body["model"], "output": [call],
            "usage": {"input_tokens": tokens, "output_tokens": 12, "total_tokens": tokens + 12},
        });
        let streamed = body["stream"] == json!(true);
        Box::pin(async move {
            if streamed {
                let created = json!({"type": "response.created", "sequence_number": 0, "response": {"id": answer["id"], "object": "response", "status": "in_progress", "output": []}});
                let done = json!({"type": "response.output_item.done", "sequence_number": 1, "output_index": 0, "item": answer["output"][0]});
                let completed =
                    json!({"type": "response.completed", "sequence_number": 2, "response": answer});
                let events = [
                    ("response.created", created),
                    ("response.output_item.done", done),
                    ("response.completed", completed),
                ];
                let text: String = events
                    .iter()
                    .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
                    .collect();
                let mut r = response(200, text);
                r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                return r;
            }
            let mut r = response(200, answer.to_string());
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    })
}

fn chain_config(upstream: &str) -> foldgate::config::Config {
    let mut config = config_for(upstream);
    config.compaction.max_context_tokens = Some(WINDOW);
    config.summarizer.kind = foldgate::config::SummarizerKind::Extractive;
    config
}

/// Runs the SDK `script` for `steps` steps across `urls`; its lines.
async fn run_script(script: &'static str, steps: usize, urls: Vec<String>) -> Vec<Value> {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(steps.to_string())
            .args(&urls)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn assert_chain_held(lines: &[Value], steps: usize, seen: &Seen) {
    assert_eq!(lines.len(), steps, "every step answered");
    assert!(lines.iter().all(|l| l["types"] == json!(["function_call"])), "{lines:?}");
    assert_eq!(seen.unknown, 0, "the upstream always knew the response named");
    let largest = seen.prompts.iter().max().copied().unwrap_or(0);
    assert!(largest <= WINDOW, "a prompt of {largest} tokens reached a {WINDOW}-token window");
    let compacted = lines.iter().filter(|l| l["outcome"] == "compacted").count();
    assert!(compacted >= steps / 3, "{compacted} of {steps} compacted: {lines:?}");
    // Below the trigger the first steps went as received: only the new item, continued
    // by the upstream.
    assert!(seen.continued >= 1, "the first steps continued upstream: {}", seen.continued);
}

#[tokio::test]
async fn a_chain_of_responses_is_compacted_and_never_overflows() {
    if !tools::python_module_available("openai") {
        return;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen.clone())).await;
    let proxy = Proxy::start(chain_config(&mock.url())).await;
    let steps = 32;
    let lines = run_script(SCRIPT, steps, vec![proxy.url("/v1")]).await;
    assert_chain_held(&lines, steps, &seen.lock().unwrap());
    let (_, _, metrics) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    let expanded = format!(r#"foldgate_response_chains_total{{result="expanded"}} {steps}"#);
    assert!(metrics.contains(&expanded), "{metrics}");
    assert!(metrics.contains(r#"foldgate_response_chains_total{result="unknown"} 0"#));
}

#[tokio::test]
async fn a_chain_continues_on_another_replica_sharing_redis() {
    if !common::redis_server::available() || !tools::python_module_available("openai") {
        return;
    }
    let redis = common::redis_server::RedisServer::start().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen.clone())).await;
    let replica = || {
        let mut config = chain_config(&mock.url());
        config.session.store = foldgate::config::StoreKind::Redis;
        config.session.redis_url = foldgate::config::SecretUrl::new(redis.url());
        config
    };
    let (a, b) = (Proxy::start(replica()).await, Proxy::start(replica()).await);
    let steps = 32;
    let lines = run_script(SCRIPT, steps, vec![a.url("/v1"), b.url("/v1")]).await;
    assert_chain_held(&lines, steps, &seen.lock().unwrap());
}

const WEBSOCKET_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_websocket_check.py");

#[tokio::test]
async fn the_websocket_mode_is_served_each_frame_compacted_over_an_http_upstream() {
    if !tools::python_module_available("openai") || !tools::python_module_available("websockets") {
        return;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen.clone())).await;
    // Codex's compaction_trigger, `auto`: the upstream refuses it, foldgate serves it.
    let proxy = Proxy::start(chain_config(&mock.url())).await;
    let steps = 32;
    let url = proxy.url("/v1");
    let lines = run_script(WEBSOCKET_SCRIPT, steps, vec![url]).await;
    // The warm-up: answered by foldgate, no output, the upstream not asked for it.
    assert_eq!(lines[0]["types"], json!(["response.created", "response.completed"]));
    assert_eq!(lines[0]["output"], json!([]));
    // Every frame answered with the upstream's events, in order, as frames.
    for line in &lines[1..=steps] {
        assert_eq!(line["output"], json!(["function_call"]), "{line}");
        let types = line["types"].as_array().unwrap();
        assert_eq!(types.first().unwrap(), "response.created", "{line}");
        assert_eq!(types.last().unwrap(), "response.completed", "{line}");
    }
    let trigger = &lines[steps + 1];
    assert_eq!(trigger["output"], json!(["compaction"]), "{trigger}");
    let after = &lines[steps + 2];
    assert_eq!(after["output"], json!(["function_call"]), "{after}");
    // The turn after it reached the upstream readable: the digest as an assistant
    // message, no sealed content, the new message as sent.
    let last = mock.forwarded().last().unwrap().body.clone();
    let text = String::from_utf8_lossy(&last);
    assert!(!text.contains(foldgate::api::compaction_item::SEALED_PREFIX), "{text:.300}");
    assert!(text.contains("[COMPACTED CONTEXT]") && text.contains("Now run the parser tests."));
    let unknown = &lines[steps + 3]["event"];
    assert_eq!(unknown["type"], "error", "{unknown}");
    assert_eq!(unknown["error"]["code"], "previous_response_not_found", "{unknown}");
    let (continued, posts, largest) = {
        let seen = seen.lock().unwrap();
        (seen.continued, seen.prompts.len(), seen.prompts.iter().max().copied().unwrap_or(0))
    };
    // The upstream (HTTP only) got the whole conversation each time, never a chain it
    // would not know, never past the window.
    assert_eq!(continued, 0, "no previous_response_id reaches an HTTP upstream");
    // One POST per frame (none for the warm-up, the trigger refused once and then
    // answered here, the turn after it).
    assert_eq!(posts, steps + 2, "one POST per frame, none for the warm-up");
    assert!(largest <= WINDOW, "a prompt of {largest} tokens reached a {WINDOW}-token window");
    // Each frame is a request like any other: compacted past the trigger, recorded.
    let (_, _, metrics) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    let compacted = metrics
        .lines()
        .find(|l| {
            l.starts_with(r#"foldgate_chat_requests_total{outcome="compacted",route="responses"}"#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .unwrap_or(0);
    assert!(compacted >= steps / 3, "{compacted} frames compacted: {metrics}");
}

/// A Responses upstream with the WebSocket mode, keeping each connection's responses
/// (as the API does with `store: false`); answers with a `function_call` each time. Its
/// URL (`http://…/v1`, as `upstream.url`).
async fn socket_upstream(seen: Arc<Mutex<Seen>>) -> String {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else { return };
                let mut stored: HashMap<String, Vec<Value>> = HashMap::new();
                while let Some(Ok(Message::Text(text))) = socket.next().await {
                    let frame: Value = serde_json::from_str(text.as_str()).unwrap();
                    let mut items = Vec::new();
                    let answer = {
                        let mut seen = seen.lock().unwrap();
                        if let Some(previous) = frame["previous_response_id"].as_str() {
                            seen.continued += 1;
                            match stored.get(previous) {
                                Some(before) => items.extend(before.iter().cloned()),
                                None => seen.unknown += 1,
                            }
                        }
                        items.extend(frame["input"].as_array().cloned().unwrap_or_default());
                        let prompt =
                            format!("{}{}", frame["instructions"], Value::Array(items.clone()));
                        let tokens = Encoding::O200kBase.count(&prompt);
                        seen.prompts.push(tokens);
                        let n = seen.prompts.len();
                        let call = json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"), "name": "shell", "arguments": "{}", "status": "completed"});
                        items.push(call.clone());
                        let id = format!("resp_ws_{n:04}");
                        stored.insert(id.clone(), items);
                        json!({"id": id, "object": "response", "status": "completed", "model": frame["model"], "output": [call], "usage": {"input_tokens": tokens, "output_tokens": 12, "total_tokens": tokens + 12}})
                    };
                    let events = [
                        json!({"type": "response.created", "sequence_number": 0, "response": {"id": answer["id"], "object": "response", "status": "in_progress", "output": []}}),
                        json!({"type": "response.output_item.done", "sequence_number": 1, "output_index": 0, "item": answer["output"][0]}),
                        json!({"type": "response.completed", "sequence_number": 2, "response": answer}),
                    ];
                    for event in events {
                        if socket.send(Message::text(event.to_string())).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn the_websocket_mode_speaks_a_websocket_to_an_upstream_that_has_one() {
    if !tools::python_module_available("openai") || !tools::python_module_available("websockets") {
        return;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = socket_upstream(seen.clone()).await;
    let mut config = chain_config(&upstream);
    config.responses.compact = foldgate::config::ServedBy::Foldgate;
    let proxy = Proxy::start(config).await;
    let steps = 32;
    let url = proxy.url("/v1");
    let lines = run_script(WEBSOCKET_SCRIPT, steps, vec![url]).await;
    for line in &lines[1..=steps] {
        assert_eq!(line["output"], json!(["function_call"]), "{line}");
    }
    assert_eq!(lines[steps + 1]["output"], json!(["compaction"]));
    assert_eq!(lines[steps + 2]["output"], json!(["function_call"]));
    let (continued, unknown, frames, largest) = {
        let seen = seen.lock().unwrap();
        let largest = seen.prompts.iter().max().copied().unwrap_or(0);
        (seen.continued, seen.unknown, seen.prompts.len(), largest)
    };
    // Every frame went on the upstream's socket; those below the trigger as received
    // (naming a response the upstream held), never one it did not hold.
    // One frame upstream per frame: none for the warm-up nor the trigger (served here).
    assert_eq!(frames, steps + 2, "one frame upstream per frame, none for the warm-up");
    assert!(continued >= 1, "frames below the trigger went as received: {continued}");
    assert_eq!(unknown, 0, "no frame named a response the upstream did not hold");
    assert!(largest <= WINDOW, "a prompt of {largest} tokens reached a {WINDOW}-token window");
}

#[tokio::test]
async fn a_response_foldgate_does_not_know_is_forwarded_as_received_and_counted() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen.clone())).await;
    let proxy = Proxy::start(chain_config(&mock.url())).await;
    let body = json!({"model": "gpt-4.1", "input": "hi", "previous_response_id": "resp_elsewhere"});
    let (status, _, _) = send(post(&proxy.url("/v1/responses"), body.to_string())).await;
    assert_eq!(status, 400, "the upstream's answer, as it gave it");
    assert_eq!(mock.forwarded().last().unwrap().body, body.to_string(), "as received");
    let (_, _, metrics) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    assert!(metrics.contains(r#"foldgate_response_chains_total{result="unknown"} 1"#), "{metrics}");
}

#[tokio::test]
async fn a_frame_past_the_body_limit_closes_the_socket_with_1009() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen.clone())).await;
    let mut config = chain_config(&mock.url());
    config.server.max_body_size = foldgate::config::ByteSize(64 * 1024);
    let proxy = Proxy::start(config).await;
    let url = format!("ws://{}/v1/responses", proxy.addr);
    let (mut socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let big = json!({"type": "response.create", "model": "m", "input": "x".repeat(100 * 1024)});
    socket.send(Message::text(big.to_string())).await.unwrap();
    let closed = loop {
        match socket.next().await {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(closed.map(|f| f.code), Some(CloseCode::Size));
    assert!(seen.lock().unwrap().prompts.is_empty(), "nothing reached the upstream");
}

#[tokio::test]
async fn idle_sockets_close_and_past_the_limit_an_upgrade_gets_503() {
    use futures_util::StreamExt;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mock = MockUpstream::start(chaining_upstream(seen)).await;
    let mut config = chain_config(&mock.url());
    config.responses.websocket_idle_timeout = std::time::Duration::from_millis(300);
    config.responses.websocket_max_connections = 1;
    let proxy = Proxy::start(config).await;
    let url = format!("ws://{}/v1/responses", proxy.addr);
    let (mut first, _) = tokio_tungstenite::connect_async(url.as_str()).await.unwrap();
    // The one connection allowed is held: another upgrade is refused with 503.
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
        }
        other => panic!("a second connection past the limit: {other:?}"),
    }
    // Idle past the timeout, the first is closed; its place is free again.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(Ok(message)) = first.next().await {
            if message.is_close() {
                return true;
            }
        }
        true
    })
    .await;
    assert_eq!(ended, Ok(true), "the idle connection closed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(tokio_tungstenite::connect_async(url.as_str()).await.is_ok(), "room again");
}
