//! The official Anthropic Python SDK (from PyPI) pointed at foldgate with `base_url`, as
//! Claude Code is with `ANTHROPIC_BASE_URL`: plain and streaming requests of a long
//! agent session (thinking, tool loops, cache breakpoints) are compacted within budget
//! and stay valid Messages requests, while an OpenAI chat client uses the same foldgate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    missing_docs
)]

mod common;

use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use common::agent::{ProviderStats, chat_request_to, conversation, provider, requests};
use common::messages_api::*;
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/anthropic_sdk_check.py");
#[tokio::test]
async fn the_official_anthropic_sdk_works_through_foldgate_beside_an_openai_client() {
    if !common::tools::python_module_available("anthropic") {
        return;
    }
    let anthropic = MockUpstream::start(anthropic_provider()).await;
    let openai = MockUpstream::start(provider(Arc::new(ProviderStats::default()))).await;
    let mut config = config_for(&openai.url());
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    config.compaction.max_context_tokens = Some(12_000);
    let proxy = Proxy::start(config).await;

    let small = params(2);
    let long = params(40);
    let plan = json!([
        {"name": "small", "api_key": "sk-ant-a", "session": "s1", "kind": "create", "params": small},
        {"name": "long", "api_key": "sk-ant-a", "session": "s1", "kind": "create", "params": long},
        {"name": "long_stream", "api_key": "sk-ant-a", "session": "s1", "kind": "stream", "params": long},
        {"name": "other_tenant", "api_key": "sk-ant-b", "session": "s1", "kind": "create", "params": small},
        {"name": "count", "api_key": "sk-ant-a", "session": "s1", "kind": "count_tokens",
            "params": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}},
    ]);
    let dir = std::env::temp_dir().join(format!("foldgate-anthropic-sdk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan_file = dir.join("requests.json");
    std::fs::write(&plan_file, serde_json::to_vec(&plan).unwrap()).unwrap();
    let base_url = format!("http://{}", proxy.addr);
    let out = dir.clone();
    let python = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([SCRIPT, &base_url, plan_file.to_str().unwrap(), out.to_str().unwrap()])
            .output()
            .unwrap()
    });
    // Meanwhile an OpenAI client talks to the same foldgate.
    let chats = async {
        for body in requests(&conversation(12, 3), &[]).into_iter().take(6) {
            let url = proxy.url("/v1/chat/completions");
            let (status, _, _) = send(chat_request_to(&url, body, "Bearer sk-openai", "o1")).await;
            assert_eq!(status, 200);
        }
    };
    let (output, ()) = tokio::join!(python, chats);
    let output = output.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    let sent = |i: usize| std::fs::read(dir.join(format!("sent_{i}.json"))).unwrap();

    // The SDK's credential as it sent it (`x-api-key`, or `Authorization` in newer SDKs).
    let credential = |r: &Recorded| {
        let value = r.headers.get("x-api-key").or(r.headers.get("authorization")).unwrap();
        value.to_str().unwrap().trim_start_matches("Bearer ").to_owned()
    };
    // Each client reached its own provider, with its own credential and headers; the
    // digests of the Anthropic conversation were asked of Anthropic (in the background:
    // the long requests fitted once their old tool results were stubbed), with the
    // client's key and the conversation's model.
    let (summaries, ant): (Vec<Recorded>, Vec<Recorded>) = anthropic
        .recorded()
        .into_iter()
        .partition(|r| r.headers.contains_key("x-foldgate-summary"));
    assert!(!summaries.is_empty());
    for call in &summaries {
        assert_eq!(call.uri.path(), "/v1/messages");
        assert_eq!(credential(call), "sk-ant-a");
        assert!(call.headers.contains_key("anthropic-version"));
        let body: Value = serde_json::from_slice(&call.body).unwrap();
        assert_eq!(body["model"], MODEL);
        assert!(body["system"].is_string() && body["messages"][0]["role"] == "user", "{body}");
    }
    assert!(ant.iter().all(|r| r.uri.path().starts_with("/v1/messages")), "{ant:?}");
    assert!(ant.iter().all(|r| r.headers.contains_key("anthropic-version")));
    assert!(ant.iter().all(|r| credential(r).starts_with("sk-ant-")));
    assert_eq!(ant.len(), 5);
    let oai = openai.recorded();
    assert_eq!(oai.len(), 6);
    assert!(oai.iter().all(|r| r.uri.path() == "/v1/chat/completions"));

    // Below the trigger: forwarded byte for byte, as the SDK sent it.
    assert_eq!(lines[0]["x-foldgate-outcome"], "passthrough");
    assert_eq!(lines[0]["text"], "ok");
    assert_eq!(lines[0]["request_id"], "req_ant0", "the provider's answer passes through");
    assert_eq!(ant[0].body, sent(0));

    // The long session is compacted within budget, plain and streamed.
    let budget = 12_000 - 2_048;
    for i in [1, 2] {
        let line = &lines[i];
        assert_eq!(line["x-foldgate-outcome"], "compacted", "{line}");
        let after: usize = line["x-foldgate-tokens-after"].as_str().unwrap().parse().unwrap();
        let before: usize = line["x-foldgate-tokens-before"].as_str().unwrap().parse().unwrap();
        assert!(after <= budget && after < before, "{line}");
        assert_eq!(line["text"], "ok");
        let forwarded = &ant[i].body;
        assert!(forwarded.len() < sent(i).len());
        assert_valid(forwarded);
        let (value, original): (Value, Value) =
            (serde_json::from_slice(forwarded).unwrap(), serde_json::from_slice(&sent(i)).unwrap());
        for field in ["model", "max_tokens", "system", "tools", "thinking", "stream"] {
            assert_eq!(value.get(field), original.get(field), "{field}");
        }
        let text = String::from_utf8_lossy(forwarded);
        // Small user turns verbatim; the task too.
        for round in (4..40).step_by(5) {
            assert!(text.contains(&format!("\"Remark {round}: keep the public API")), "{round}");
        }
        assert!(text.contains("Fix the failing test in src/parser.rs. Never touch Cargo.lock."));
        // Assistant messages with thinking are forwarded byte for byte as the SDK sent
        // them, or not at all.
        let sent_text = String::from_utf8(sent(i)).unwrap();
        let kept: Vec<String> =
            raw_messages(forwarded).into_iter().filter(|m| m.contains("\"thinking\"")).collect();
        assert!(!kept.is_empty());
        for m in &kept {
            assert!(sent_text.contains(m.as_str()), "edited: {m}");
        }
    }
    assert_eq!(lines[1]["input_tokens"], 100);
    assert_eq!(lines[2]["input_tokens"], 90, "usage from message_start");
    assert_eq!(lines[2]["output_tokens"], 2);

    // Another key, same session id: another conversation.
    assert_eq!(lines[3]["x-foldgate-outcome"], "passthrough");
    assert_ne!(lines[3]["x-foldgate-session"], lines[0]["x-foldgate-session"]);
    assert_eq!(lines[1]["x-foldgate-session"], lines[0]["x-foldgate-session"]);

    // count_tokens passes through to the Anthropic upstream.
    assert_eq!(lines[4]["input_tokens"], 42);
    assert_eq!(ant[4].uri.path(), "/v1/messages/count_tokens");
    assert_eq!(ant[4].body, sent(4));

    // Upstream usage of both APIs reached the metrics.
    let (_, _, metrics) =
        send(http::Request::get(proxy.url("/metrics")).body(full(Bytes::new())).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains(r#"route="messages""#), "{metrics}");
}

#[tokio::test]
async fn a_request_below_the_trigger_is_forwarded_byte_for_byte() {
    let anthropic = MockUpstream::echo().await;
    let mut config = config_for("http://127.0.0.1:9/v1");
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    let proxy = Proxy::start(config).await;
    let body = serde_json::to_vec(&params(3)).unwrap();
    let body = [b"{ \"metadata\" : {\"user_id\":\"u\"},".as_slice(), &body[1..]].concat();
    let request = http::Request::post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-z")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "context-management-2025-06-27")
        .header("content-type", "application/json")
        .body(full(body.clone()))
        .unwrap();
    let (status, headers, answer) = send(request).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-outcome"], "passthrough");
    assert_eq!(answer, body);
    // The key in `x-api-key` scopes the session: the same session id under another key
    // is another conversation, under the same key the same one.
    let session_of = |key: &'static str| {
        let request = http::Request::post(proxy.url("/v1/messages"))
            .header("x-api-key", key)
            .header("x-session-id", "shared")
            .header("anthropic-version", "2023-06-01")
            .body(full(body.clone()))
            .unwrap();
        async move { send(request).await.1["x-foldgate-session"].clone() }
    };
    assert_eq!(session_of("sk-ant-1").await, session_of("sk-ant-1").await);
    assert_ne!(session_of("sk-ant-1").await, session_of("sk-ant-2").await);
    let recorded = anthropic.recorded();
    assert_eq!(recorded[0].uri.path(), "/v1/messages");
    assert_eq!(recorded[0].body, body);
    assert_eq!(recorded[0].headers["anthropic-beta"], "context-management-2025-06-27");
}

#[tokio::test]
async fn anthropic_writes_the_digests_of_anthropic_conversations() {
    let anthropic = MockUpstream::start(anthropic_provider()).await;
    let mut config = config_for("http://127.0.0.1:9/v1");
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    config.compaction.max_context_tokens = Some(12_000);
    let proxy = Proxy::start(config).await;
    let request = |body: Vec<u8>| {
        let post = messages_post(&proxy, "sk-ant-d", "digests");
        post.header("anthropic-beta", "context-management-2025-06-27").body(full(body)).unwrap()
    };
    let (status, headers, _) = send(request(serde_json::to_vec(&params(40)).unwrap())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    // The fold is summarized in the background (the request fitted without it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !anthropic.recorded().iter().any(|r| r.headers.contains_key("x-foldgate-summary")) {
        assert!(std::time::Instant::now() < deadline, "no summarization call");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (status, _, _) = send(request(serde_json::to_vec(&params(41)).unwrap())).await;
    assert_eq!(status, 200);

    let recorded = anthropic.recorded();
    let call = recorded.iter().find(|r| r.headers.contains_key("x-foldgate-summary")).unwrap();
    assert_eq!(call.uri.path(), "/v1/messages");
    assert_eq!(call.headers["x-api-key"], "sk-ant-d");
    assert_eq!(call.headers["anthropic-version"], "2023-06-01");
    assert_eq!(call.headers["anthropic-beta"], "context-management-2025-06-27");
    let body: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(body["model"], MODEL);
    let prompt = body["messages"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("src/module_3.rs"), "the folded work is in the prompt");
    // The next request carries the model's digest where the folded work was.
    let last = anthropic.forwarded().pop().unwrap();
    assert_valid(&last.body);
    let text = String::from_utf8_lossy(&last.body);
    assert!(text.contains("[COMPACTED CONTEXT]"), "{text}");
    assert!(text.contains("I read every module the task named."), "{text}");
    assert!(text.contains("Fix the failing test in src/parser.rs. Never touch Cargo.lock."));
}

/// A POST to `/v1/messages` with the Anthropic key `key`, in conversation `session`
/// (more headers may be added before its body).
fn messages_post(proxy: &Proxy, key: &str, session: &str) -> http::request::Builder {
    http::Request::post(proxy.url("/v1/messages"))
        .header("x-api-key", key)
        .header("x-session-id", session)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
}

/// A POST to `/v1/messages` of `body`, in one conversation.
fn messages_request(proxy: &Proxy, body: Vec<u8>) -> http::Request<TestBody> {
    messages_post(proxy, "sk-ant-c", "calibrated").body(full(body)).unwrap()
}

#[tokio::test]
async fn prompt_is_too_long_is_retried_compacted_and_teaches_the_window() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let anthropic = MockUpstream::start(Arc::new(move |_rec: Recorded| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            if n == 0 {
                return response(
                    400,
                    r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 31000 tokens > 12000 maximum"}}"#,
                );
            }
            response(200, r#"{"type":"message","content":[],"usage":{"input_tokens":5,"output_tokens":1}}"#)
        })
    }))
    .await;
    let mut config = config_for("http://127.0.0.1:9/v1");
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    let proxy = Proxy::start(config).await;
    let body = serde_json::to_vec(&params(40)).unwrap();
    let (status, headers, _) = send(messages_request(&proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    let recorded = anthropic.forwarded();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].body, body, "the first try went as sent");
    assert!(recorded[1].body.len() < body.len() / 2);
    assert_valid(&recorded[1].body);
    // The stated window is remembered: the next request is compacted before it is sent.
    let (status, headers, _) = send(messages_request(&proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-learned-window"], "12000");
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    assert_eq!(anthropic.forwarded().len(), 3);
}

#[tokio::test]
async fn an_answer_stopped_at_the_context_window_is_retried_compacted() {
    // Anthropic's `model_context_window_exceeded` stop reason, in a JSON answer and in a
    // stream's `message_delta` before any content: read as an overflow, like a 400.
    // A prompt longer than half the conversation as sent stops at the window.
    let body = serde_json::to_vec(&params(40)).unwrap();
    let window = body.len() / 2;
    let anthropic = MockUpstream::start(Arc::new(move |rec: Recorded| {
        let streamed = json(&rec.body)["stream"] == true;
        let stopped = rec.body.len() > window && !rec.headers.contains_key("x-foldgate-summary");
        Box::pin(async move {
            match (streamed, stopped) {
                (false, true) => json_response(r#"{"type":"message","role":"assistant","content":[],"stop_reason":"model_context_window_exceeded","usage":{"input_tokens":9000,"output_tokens":0}}"#),
                (false, false) => json_response(r#"{"type":"message","role":"assistant","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":1}}"#),
                (true, stopped) => {
                    let stop = if stopped { "model_context_window_exceeded" } else { "end_turn" };
                    let mut events = String::from("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n");
                    if !stopped {
                        events.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
                    }
                    events.push_str(&format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\"}},\"usage\":{{\"output_tokens\":1}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"));
                    let mut r = response(200, events);
                    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                    r
                }
            }
        })
    }))
    .await;
    let mut config = config_for("http://127.0.0.1:9/v1");
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    let proxy = Proxy::start(config).await;
    let (status, headers, answer) = send(messages_request(&proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    assert_eq!(json(&answer)["stop_reason"], "end_turn", "the client gets the retry's answer");
    let mut streamed = params(40);
    streamed["stream"] = json!(true);
    let streamed = serde_json::to_vec(&streamed).unwrap();
    let (status, headers, answer) = send(messages_request(&proxy, streamed)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("Done.") && !text.contains("model_context_window_exceeded"), "{text}");
    assert_eq!(text.matches("message_start").count(), 2, "one stream, the retry's: {text}");
    let recorded: Vec<Recorded> = anthropic
        .forwarded()
        .into_iter()
        .filter(|r| !r.headers.contains_key("x-foldgate-summary"))
        .collect();
    assert_eq!(recorded.len(), 4, "two tries of each");
    assert_eq!(recorded[0].body, body, "the first try went as sent");
    assert!(recorded[1].body.len() < window, "the retry compacted");
    assert_valid(&recorded[1].body);
}

/// A 200 JSON answer with `body`.
fn json_response(body: &'static str) -> http::Response<TestBody> {
    let mut r = response(200, body);
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    r
}

/// An Anthropic mock that counts a prompt as 1.5 tokens per byte of its body in the
/// conversation `dense` (about 3.6 times the engine's count, as for text Claude's
/// tokenizer splits finer) and as 0.4 per byte elsewhere (about 0.95 times it).
fn counting_provider() -> Handler {
    Arc::new(|rec: Recorded| {
        Box::pin(async move {
            let dense = rec.headers.get("x-session-id").is_some_and(|v| v == "dense");
            let tokens = if dense { rec.body.len() * 3 / 2 } else { rec.body.len() * 2 / 5 };
            let usage = json!({"type": "message", "content": [], "usage": {
                "input_tokens": tokens - 100, "cache_read_input_tokens": 100,
                "output_tokens": 1}});
            let mut r = response(200, usage.to_string());
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    })
}

/// A config for the Anthropic mock at `anthropic`, with a 40,000-token window, no
/// prefetch and inline digests (so that every decision below is the trigger's).
fn calibration_config(anthropic: &MockUpstream) -> foldgate::config::Config {
    let mut config = config_for("http://127.0.0.1:9/v1");
    config.upstream.anthropic_url = format!("http://{}", anthropic.addr);
    config.compaction.max_context_tokens = Some(40_000);
    config.compaction.prefetch = false;
    config.summarizer.kind = foldgate::config::SummarizerKind::Extractive;
    config
}

/// Sends `body` as conversation `session` and returns the answer's outcome header, once
/// the usage of the answer was recorded (when its body ends, in a task of its own).
async fn outcome_in(proxy: &Proxy, session: &str, body: &[u8]) -> String {
    let request = messages_post(proxy, "sk-ant-c", session).body(full(body.to_vec())).unwrap();
    let (status, headers, _) = send(request).await;
    assert_eq!(status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    headers["x-foldgate-outcome"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn each_conversation_is_planned_with_its_own_token_ratio() {
    let anthropic = MockUpstream::start(counting_provider()).await;
    let proxy = Proxy::start(calibration_config(&anthropic)).await;
    // Below the trigger as the engine counts it (about 22,500 of 28,464 tokens).
    let body = serde_json::to_vec(&params(30)).unwrap();
    assert_eq!(outcome_in(&proxy, "plain", &body).await, "passthrough");
    assert_eq!(outcome_in(&proxy, "dense", &body).await, "passthrough");
    // The model's average is now about 1.7, which would put this prompt over the trigger
    // (about 15,700 tokens), but the plain conversation measured its own ratio below 1.
    assert_eq!(outcome_in(&proxy, "plain", &body).await, "passthrough");
    // The dense one measured about 3.6: the same prompt is over its trigger.
    assert_eq!(outcome_in(&proxy, "dense", &body).await, "compacted");
    for rec in anthropic.recorded() {
        assert_valid(&rec.body);
    }
    // A new conversation, not measured yet, is planned with the model's average.
    let mut other = params(30);
    other["messages"][0]["content"] = json!("Another task: fix the lexer. Never touch Cargo.lock.");
    let other = serde_json::to_vec(&other).unwrap();
    assert_eq!(outcome_in(&proxy, "new", &other).await, "compacted");
}

#[tokio::test]
async fn a_conversation_s_token_ratio_follows_it_to_every_replica() {
    let Some(redis) = common::redis_server::RedisServer::start() else { return };
    let anthropic = MockUpstream::start(counting_provider()).await;
    let replica = || {
        let mut config = calibration_config(&anthropic);
        config.session.store = foldgate::config::StoreKind::Redis;
        config.session.redis_url = foldgate::config::SecretUrl::new(redis.url());
        // The test's runtime also counts tokens (in a debug build): a store operation
        // must not time out behind it, or the calibration it carries is dropped.
        config.session.redis_timeout = std::time::Duration::from_secs(5);
        config
    };
    let (a, b) = (Proxy::start(replica()).await, Proxy::start(replica()).await);
    let body = serde_json::to_vec(&params(30)).unwrap();
    assert_eq!(outcome_in(&a, "dense", &body).await, "passthrough");
    // The ratio is measured when a's answer ends and saved in the background: wait until
    // the conversation's stored state holds it.
    let mut conn = redis.connection().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let keys: Vec<String> =
            redis::cmd("KEYS").arg("foldgate:{*}:s").query_async(&mut conn).await.unwrap();
        let mut measured = false;
        for key in keys {
            let state: Option<String> =
                redis::cmd("HGET").arg(&key).arg("state").query_async(&mut conn).await.unwrap();
            measured |= state.is_some_and(|s| s.contains("\"token_ratio\":{"));
        }
        if measured {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the ratio never reached Redis");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Replica b never saw an answer for this model: the ratio comes with the session.
    assert_eq!(outcome_in(&b, "dense", &body).await, "compacted");
}
