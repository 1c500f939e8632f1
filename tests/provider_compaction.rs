//! The providers' own compaction APIs served by foldgate for an upstream without them:
//! OpenAI's `POST /v1/responses/compact` and `context_management` compaction on
//! `/v1/responses` (through the official `openai` SDK), and what passes through to an
//! upstream that has them.
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
use common::responses_api::*;
use common::*;
use foldgate::api::compaction_item::{SEALED_PREFIX, Sealed, Sealer, item};
use foldgate::config::{Config, Secret, ServedBy};
use foldgate::model::DIGEST_MARKER;
use serde_json::{Value, json};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_compaction_check.py");

/// A 32-byte key in base64, the same for every replica of a test.
const KEY: &str = "Zm9sZGdhdGUtdGVzdC1rZXktMzItYnl0ZXMtbG9uZyE=";

const UNKNOWN_PARAMETER: &str = r#"{"error":{"message":"Unknown parameter: 'context_management'.","type":"invalid_request_error","param":"context_management","code":"unknown_parameter"}}"#;

const UNKNOWN_ITEM: &str = r#"{"error":{"message":"Invalid value: 'compaction_trigger'. Supported values are: 'message', 'function_call', 'function_call_output' and 'reasoning'.","type":"invalid_request_error","param":"input[-1].type","code":"invalid_value"}}"#;

/// A Responses provider that knows neither `/responses/compact` (404), nor
/// `context_management` (400 unknown parameter), nor the `compaction_trigger` item (400
/// invalid value), as vLLM or Ollama.
fn bare_provider() -> Handler {
    let inner = responses_provider();
    Arc::new(move |rec: Recorded| {
        if rec.uri.path().ends_with("/responses/compact") {
            return Box::pin(async { response(404, r#"{"detail":"Not Found"}"#) });
        }
        if memchr::memmem::find(&rec.body, b"compaction_trigger").is_some() {
            return Box::pin(async {
                let mut r = response(400, UNKNOWN_ITEM);
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r
            });
        }
        if memchr::memmem::find(&rec.body, b"\"context_management\"").is_some() {
            return Box::pin(async {
                let mut r = response(400, UNKNOWN_PARAMETER);
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r
            });
        }
        inner(rec)
    })
}

fn compaction_config(upstream: &str) -> Config {
    let mut config = config_for(upstream);
    config.compaction.max_context_tokens = Some(12_000);
    config.summarizer.kind = foldgate::config::SummarizerKind::Extractive;
    config.responses.compaction_key = Secret::new(KEY);
    config
}

/// The `input` items of a forwarded body.
fn input_of(body: &[u8]) -> Vec<Value> {
    json(body)["input"].as_array().cloned().unwrap_or_default()
}

/// Checks a body forwarded after foldgate opened its compaction item: the upstream
/// reads the digest as text, never foldgate's sealed content, and every user message
/// the client sent is there as sent.
fn assert_opened(forwarded: &[u8], sent_users: &[Value]) {
    let text = String::from_utf8_lossy(forwarded);
    assert!(!text.contains(SEALED_PREFIX), "no sealed content reaches the upstream: {text}");
    let input = input_of(forwarded);
    let digest = input
        .iter()
        .find(|i| i["content"].as_str().is_some_and(|t| t.starts_with(DIGEST_MARKER)))
        .unwrap_or_else(|| panic!("a digest message the upstream reads: {text}"));
    assert_eq!(digest["role"], "assistant");
    for user in sent_users {
        assert!(input.contains(user), "user message kept as sent: {user}");
    }
}

fn run_script(base_url: String, session: &Value) -> Vec<Value> {
    run_compaction_script(SCRIPT, base_url, session)
}

fn run_compaction_script(script: &str, base_url: String, session: &Value) -> Vec<Value> {
    let dir = std::env::temp_dir().join(format!("foldgate-compaction-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("session-{}.json", rand_suffix()));
    std::fs::write(&file, serde_json::to_vec(session).unwrap()).unwrap();
    let output = Command::new("python3").args([script, &base_url, file.to_str().unwrap()]).output();
    let output = output.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn check<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines.iter().find(|l| l["check"] == name).unwrap_or_else(|| panic!("no {name} in {lines:?}"))
}

#[tokio::test]
async fn the_openai_sdk_compacts_through_foldgate_for_an_upstream_without_the_apis() {
    if !common::tools::python_module_available("openai") {
        return;
    }
    let mock = MockUpstream::start(bare_provider()).await;
    let proxy = Proxy::start(compaction_config(&mock.url())).await;
    // A conversation that never met a provider compaction (no vendor item first).
    let items = session_items(30)[1..].to_vec();
    let users: Vec<Value> = items.iter().filter(|i| i["role"] == "user").cloned().collect();
    let foreign = item("cmp_f", &Sealer::new(&[9; 32]).seal(&Sealed { digest: "x".into() }));
    let session = json!({"items": items, "threshold": 2000, "foreign": json(foreign.as_bytes())});
    let base_url = format!("http://{}/v1", proxy.addr);
    let lines = tokio::task::spawn_blocking(move || run_script(base_url, &session)).await.unwrap();

    // compact: the documented shape, the user messages then one sealed item.
    let compact = check(&lines, "compact");
    assert_eq!(compact["object"], "response.compaction");
    let types = compact["types"].as_array().unwrap();
    assert_eq!(types.last().unwrap(), "compaction", "{compact}");
    let roles = &compact["roles"].as_array().unwrap()[..types.len() - 1];
    assert!(!roles.is_empty() && roles.iter().all(|r| r == "user"), "{compact}");
    assert!(compact["encrypted"].as_str().unwrap().starts_with(SEALED_PREFIX));
    assert!(compact["input_tokens"].as_u64().unwrap() > compact["output_tokens"].as_u64().unwrap());

    let forwarded = mock.forwarded();
    let paths: Vec<&str> = forwarded.iter().map(|r| r.uri.path()).collect();
    assert!(paths[0].ends_with("/responses/compact"), "auto asks the upstream first: {paths:?}");
    assert!(
        !paths[1..].iter().any(|p| p.ends_with("/compact")),
        "a 404 is remembered for the upstream: {paths:?}"
    );
    // The next turn reaches the upstream as text it reads.
    let after = check(&lines, "after_compact");
    assert_eq!(after["text"], "ok");
    assert_opened(&forwarded[1].body, &users);

    // context_management, plain: rejected once by the upstream, then served here.
    let plain = check(&lines, "cm_plain");
    assert_eq!(plain["types"][0], "compaction", "{plain}");
    assert_eq!(plain["text"], "ok");
    let bodies: Vec<&Bytes> = forwarded[2..].iter().map(|r| &r.body).collect();
    let rejected = bodies[0];
    assert!(memchr::memmem::find(rejected, b"context_management").is_some());
    let served = bodies[1];
    assert!(memchr::memmem::find(served, b"context_management").is_none(), "field taken out");
    let input = input_of(served);
    assert!(input.last().unwrap()["content"].as_str().unwrap().starts_with(DIGEST_MARKER));
    for user in &users {
        assert!(input.contains(user), "user message kept: {user}");
    }
    // The next turn carries the item back: opened, what it stands for dropped.
    let next = check(&lines, "cm_next");
    assert!(next["types"].as_array().unwrap().contains(&json!("message")), "{next}");
    assert_opened(bodies[2], &users);
    let opened = input_of(bodies[2]);
    assert!(
        !opened.iter().any(|i| i["type"] == "function_call_output"),
        "the calls the digest stands for are not sent again"
    );

    // Streamed: the item added first, indices and sequence numbers shifted after it.
    let stream = check(&lines, "cm_stream");
    let events = stream["events"].as_array().unwrap();
    let added: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.output_item.added").collect();
    assert_eq!(added[0]["item_type"], "compaction");
    assert_eq!(added[0]["output_index"], 0);
    let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "sequence numbers in order: {numbers:?}");
    assert_eq!(stream["final_types"][0], "compaction");
    assert_eq!(stream["text"], "ok");

    // Items foldgate cannot open: a clear 400 each, never forwarded.
    for name in ["tampered", "truncated", "foreign"] {
        let line = check(&lines, name);
        assert_eq!(line["status"], 400, "{line}");
        assert!(line["message"].as_str().unwrap().contains("compaction item"), "{line}");
    }
    // compact (404), the next turn, context_management rejected then served, its next
    // turn, the stream: nothing else reached the upstream.
    assert_eq!(forwarded.len(), 6, "{paths:?}");
}

/// A Responses provider that serves both APIs itself.
fn native_provider() -> Handler {
    let inner = responses_provider();
    Arc::new(move |rec: Recorded| {
        if rec.uri.path().ends_with("/responses/compact") {
            return Box::pin(async {
                let mut r = response(200, NATIVE_COMPACTED);
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r.headers_mut().insert("x-request-id", "req_native".parse().unwrap());
                r
            });
        }
        inner(rec)
    })
}

const NATIVE_COMPACTED: &str = r#"{"id":"resp_n","object":"response.compaction","created_at":1,"output":[{"id":"msg_1","type":"message","status":"completed","content":[{"type":"input_text","text":"fix it"}],"role":"user"},{"id":"cmp_n","type":"compaction","encrypted_content":"gAAAAABvendor"}],"usage":{"input_tokens":9,"output_tokens":3,"total_tokens":12}}"#;

#[tokio::test]
async fn an_upstream_with_the_apis_gets_requests_and_answers_pass_byte_for_byte() {
    let mock = MockUpstream::start(native_provider()).await;
    let proxy = Proxy::start(compaction_config(&mock.url())).await;
    let compact =
        Bytes::from_static(br#"{"model":"gpt-4.1","input":[{"role":"user","content":"fix it"}]}"#);
    let (status, headers, answer) =
        send(post(&proxy.url("/v1/responses/compact"), compact.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(answer, NATIVE_COMPACTED.as_bytes());
    assert_eq!(headers["x-request-id"], "req_native");
    // The vendor's item and context_management go to the upstream as sent.
    let items = json!([{"id": "cmp_n", "type": "compaction", "encrypted_content": "gAAAAABvendor"},
        {"role": "user", "content": "next"}]);
    let body = json!({"model": "gpt-4.1", "input": items,
        "context_management": [{"type": "compaction", "compact_threshold": 1000}]});
    let body = Bytes::from(body.to_string());
    let (status, _, answer) = send(post(&proxy.url("/v1/responses"), body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(answer, response_object("completed", USAGE, "null").as_bytes());
    assert_eq!(mock.forwarded_bodies(), vec![compact, body]);
}

#[tokio::test]
async fn foldgate_serves_compact_without_asking_when_configured() {
    let mock = MockUpstream::start(native_provider()).await;
    let mut config = compaction_config(&mock.url());
    config.responses.compact = ServedBy::Foldgate;
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let proxy = Proxy::start(config).await;
    let items = Value::Array(session_items(6));
    let body = json!({"model": "gpt-4.1", "input": items, "instructions": "Be careful."});
    let (status, headers, answer) =
        send(post(&proxy.url("/v1/responses/compact"), body.to_string())).await;
    assert_eq!(status, 200);
    let answer = json(&answer);
    assert_eq!(answer["object"], "response.compaction");
    assert!(mock.recorded().is_empty(), "the upstream is never asked");
    // Recorded like any request: its outcome said, counted, and in the inspector.
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    assert_eq!(headers["x-foldgate-tier"], "2");
    let before: usize = headers["x-foldgate-tokens-before"].to_str().unwrap().parse().unwrap();
    assert_eq!(answer["usage"]["input_tokens"], before);
    let (_, _, metrics) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    let counted = r#"foldgate_chat_requests_total{outcome="compacted",route="responses"} 1"#;
    assert!(metrics.contains(counted), "{metrics}");
    let key = headers["x-foldgate-session"].to_str().unwrap();
    let detail = format!("http://{}/sessions/{key}", proxy.admin_addr.unwrap());
    let (status, _, detail) = send(http::Request::get(detail).body(full("")).unwrap()).await;
    assert_eq!(status, 200);
    let detail = json(&detail);
    let recent = detail["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1, "{detail}");
    assert_eq!(recent[0]["outcome"], "compacted", "{detail}");
    assert_eq!(recent[0]["api"], "responses_compact", "{detail}");
    // previous_response_id cannot be resolved here: a clear 400.
    let body = json!({"model": "gpt-4.1", "previous_response_id": "resp_1", "input": []});
    let (status, _, answer) =
        send(post(&proxy.url("/v1/responses/compact"), body.to_string())).await;
    assert_eq!(status, 400);
    assert!(json(&answer)["error"]["message"].as_str().unwrap().contains("previous_response_id"));
}

#[tokio::test]
async fn an_item_sealed_by_one_replica_opens_on_another_sharing_redis() {
    if !common::redis_server::available() {
        return;
    }
    let redis = common::redis_server::RedisServer::start().unwrap();
    let mock = MockUpstream::start(bare_provider()).await;
    let replica = |mock: &MockUpstream| {
        let mut config = compaction_config(&mock.url());
        config.session.store = foldgate::config::StoreKind::Redis;
        config.session.redis_url = foldgate::config::SecretUrl::new(redis.url());
        config
    };
    let (a, b) = (Proxy::start(replica(&mock)).await, Proxy::start(replica(&mock)).await);
    let items = Value::Array(session_items(20));
    let body = json!({"model": "gpt-4.1", "input": items});
    let (status, _, answer) = send(post(&a.url("/v1/responses/compact"), body.to_string())).await;
    assert_eq!(status, 200);
    let mut output = json(&answer)["output"].as_array().unwrap().clone();
    output.push(json!({"role": "user", "content": "next"}));
    let next = json!({"model": "gpt-4.1", "input": output});
    let (status, _, _) = send(post(&b.url("/v1/responses"), next.to_string())).await;
    assert_eq!(status, 200);
    let users: Vec<Value> = session_items(20).into_iter().filter(|i| i["role"] == "user").collect();
    assert_opened(mock.forwarded().last().unwrap().body.as_ref(), &users);
    // What replica a learned (the upstream has no /responses/compact) reaches b through
    // the store, read back every 5 s: b answers a compact request without asking.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let (status, _, _) = send(post(&b.url("/v1/responses/compact"), body.to_string())).await;
    assert_eq!(status, 200);
    let asked = mock.recorded().iter().filter(|r| r.uri.path().ends_with("/compact")).count();
    assert_eq!(asked, 1, "only replica a asked the upstream");
}

/// An Anthropic-compatible provider without context management: the field, or its beta
/// header, is rejected as the API rejects what it does not know.
fn bare_anthropic() -> Handler {
    let inner = common::messages_api::anthropic_provider();
    Arc::new(move |rec: Recorded| {
        let field = memchr::memmem::find(&rec.body, b"\"context_management\"").is_some();
        // On-demand compaction: the top-level field (a block is `"type":"compaction"`).
        let summarize = json(&rec.body).get("compaction").is_some();
        let beta = rec.headers.get_all("anthropic-beta").iter().any(|v| {
            let v = v.to_str().unwrap_or("");
            ["context-management-2025-06-27", "compact-2026-01-12", "compact-2026-09-04"]
                .iter()
                .any(|beta| v.contains(beta))
        });
        if field || summarize || beta {
            let message = if summarize {
                "compaction: Extra inputs are not permitted"
            } else if field {
                "context_management: Extra inputs are not permitted"
            } else {
                "Unexpected value(s) `context-management-2025-06-27` for the `anthropic-beta` header"
            };
            let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
            return Box::pin(async move {
                let mut r = response(400, body.to_string());
                r.headers_mut().insert("content-type", "application/json".parse().unwrap());
                r
            });
        }
        inner(rec)
    })
}

/// The text of every `text` and `tool_result` block of a Messages body's messages.
fn texts(body: &[u8]) -> Vec<String> {
    let value = json(body);
    let mut out = Vec::new();
    for message in value["messages"].as_array().unwrap() {
        match &message["content"] {
            Value::String(s) => out.push(s.clone()),
            Value::Array(blocks) => {
                for b in blocks {
                    if let Some(t) = b["text"].as_str() {
                        out.push(t.to_owned());
                    }
                    if let Some(t) = b["content"].as_str() {
                        out.push(t.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[tokio::test]
async fn the_anthropic_sdk_gets_context_management_from_foldgate() {
    if !common::tools::python_module_available("anthropic") {
        return;
    }
    use common::messages_api::{assert_valid, params};
    let anthropic = MockUpstream::start(bare_anthropic()).await;
    let mut config = compaction_config(&anthropic.url());
    config.upstream.anthropic_url = anthropic.url();
    // Digests from the Anthropic mock (the client's credential, its API).
    config.summarizer.kind = foldgate::config::SummarizerKind::Llm;
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let proxy = Proxy::start(config).await;
    let params = params(24);
    let original = serde_json::to_vec(&params).unwrap();
    let session = json!({"params": params});
    let base_url = format!("http://{}", proxy.addr);
    let lines = tokio::task::spawn_blocking(move || {
        run_compaction_script(ANTHROPIC_SCRIPT, base_url, &session)
    })
    .await
    .unwrap();

    for name in ["clear_tool_uses", "clear_tool_uses_stream"] {
        let clear = check(&lines, name);
        let applied = &clear["applied"][0];
        assert_eq!(applied["type"], "clear_tool_uses_20250919", "{clear}");
        assert_eq!(applied["cleared_tool_uses"], 22, "all but the last 2: {clear}");
        assert!(applied["cleared_input_tokens"].as_u64().unwrap() > 5000, "{clear}");
        assert_eq!(clear["types"], json!(["text"]), "{clear}");
    }
    for name in ["clear_thinking", "clear_thinking_stream"] {
        let thinking = check(&lines, name);
        assert_eq!(thinking["applied"][0]["type"], "clear_thinking_20251015", "{thinking}");
        // Five turns (the task, then a remark every fifth round): all but the last cleared.
        assert_eq!(thinking["applied"][0]["cleared_thinking_turns"], 4, "{thinking}");
    }
    for name in ["compact", "compact_stream"] {
        let line = check(&lines, name);
        assert_eq!(line["types"][0], "compaction", "{line}");
        assert_eq!(line["types"][1], "text", "the answer follows: {line}");
        assert!(!line["summary"].as_str().unwrap().is_empty(), "{line}");
        let iterations = line["iterations"].as_array().unwrap();
        assert_eq!(iterations[0]["type"], "compaction", "{line}");
        assert_eq!(iterations[1]["type"], "message", "{line}");
    }
    for name in ["paused", "paused_stream"] {
        let paused = check(&lines, name);
        assert_eq!(paused["types"], json!(["compaction"]), "{paused}");
        assert_eq!(paused["stop_reason"], "compaction", "{paused}");
    }
    let malformed = check(&lines, "malformed");
    assert_eq!(malformed["status"], 400, "{malformed}");
    assert!(malformed["message"].as_str().unwrap().contains("keep"), "{malformed}");

    // What reached the upstream: the first request rejected (auto), then every one
    // without the field and its beta, a valid Messages request, small user turns as
    // sent, thinking blocks whole or not at all.
    let forwarded = anthropic.forwarded();
    let bodies: Vec<&Bytes> = forwarded.iter().map(|r| &r.body).collect();
    assert!(memchr::memmem::find(bodies[0], b"context_management").is_some());
    let sent_text = String::from_utf8_lossy(&original).into_owned();
    let remarks: Vec<String> =
        texts(&original).into_iter().filter(|t| t.starts_with("Remark")).collect();
    assert!(!remarks.is_empty());
    for (request, body) in forwarded.iter().zip(&bodies).skip(1) {
        assert!(memchr::memmem::find(body, b"context_management").is_none());
        let betas = request.headers.get_all("anthropic-beta").iter().count();
        assert_eq!(betas, 0, "the betas foldgate serves are not sent on");
        assert_valid(body);
        let forwarded_texts = texts(body);
        for remark in &remarks {
            assert!(forwarded_texts.contains(remark), "small user turn kept: {remark}");
        }
        for block in json(body)["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        {
            if block["type"] == "thinking" {
                let raw = block.to_string();
                let signature = block["signature"].as_str().unwrap();
                assert!(sent_text.contains(signature), "thinking kept whole: {raw}");
            }
            assert_ne!(block["type"], "compaction", "no compaction block reaches the upstream");
        }
    }
    // The clearing: old results replaced by the placeholder, the last two intact.
    for cleared in [bodies[1], bodies[2]] {
        let texts = texts(cleared);
        let placeholders = texts.iter().filter(|t| t.contains("cleared to save context")).count();
        assert_eq!(placeholders, 22);
    }
    // The next turn carried the compaction block back: its summary reached the upstream
    // as text, what it summarized did not.
    let summary = check(&lines, "compact")["summary"].as_str().unwrap().to_owned();
    let next = bodies
        .iter()
        .find(|b| texts(b).iter().any(|t| t.contains(&summary) && t.starts_with(DIGEST_MARKER)))
        .expect("the summary forwarded as text");
    let stale: Vec<String> = texts(next)
        .into_iter()
        .filter(|t| t.contains("fn item_0_0") && !t.starts_with(DIGEST_MARKER))
        .collect();
    assert!(stale.is_empty(), "what it summarized is not sent: {stale:?}");
    // The compact edit's instructions reached the summarizer.
    let asked =
        anthropic.recorded().into_iter().filter(|r| r.headers.contains_key("x-foldgate-summary"));
    let asked: Vec<Recorded> = asked.collect();
    assert!(!asked.is_empty(), "digests written by the model");
    // (The engine's own folds of these requests are asked without them.)
    assert!(
        asked.iter().any(|r| {
            memchr::memmem::find(&r.body, b"Name every module that was read.").is_some()
        })
    );
    // The inspector shows which requests foldgate served an edit on, and counts them.
    let list = format!("http://{}/sessions", proxy.admin_addr.unwrap());
    let (_, _, sessions) = send(http::Request::get(list).body(full("")).unwrap()).await;
    let key = json(&sessions)["sessions"][0]["key"].as_str().unwrap().to_owned();
    let detail = format!("http://{}/sessions/{key}", proxy.admin_addr.unwrap());
    let (_, _, detail) = send(http::Request::get(detail).body(full("")).unwrap()).await;
    let detail = json(&detail);
    let served: Vec<&Value> = detail["recent"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["api"] == "messages_context_management")
        .collect();
    // The clears, the compactions and the pauses, plain and streamed; the next turn,
    // under the trigger once its compaction block was opened, had nothing done.
    assert_eq!(served.len(), 8, "{detail}");
    assert_eq!(detail["provider_compactions"], 8, "{detail}");
    // Each clearing edit is named, with what it cleared, in why its request got its tier.
    let why =
        |what: &str| served.iter().filter(|r| r["why"].as_str().unwrap().contains(what)).count();
    assert_eq!(why("clear_tool_uses_20250919 cleared 22 tool use(s)"), 2, "{detail}");
    assert_eq!(why("clear_thinking_20251015 removed the thinking of 4 turn(s)"), 2, "{detail}");
    // The paused compaction never reached the upstream: one request fewer than checks.
    assert_eq!(forwarded.len(), 8, "rejected, 4 clears, 2 compacts, next; not the pauses");
}

const ANTHROPIC_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/anthropic_compaction_check.py");

const TRIGGER_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_trigger_check.py");

#[tokio::test]
async fn codex_s_compaction_trigger_is_served_for_an_upstream_without_it() {
    if !common::tools::python_module_available("openai") {
        return;
    }
    let mock = MockUpstream::start(bare_provider()).await;
    let proxy = Proxy::start(compaction_config(&mock.url())).await;
    let items = session_items(6);
    let session = json!({"items": items});
    let base_url = format!("http://{}/v1", proxy.addr);
    let lines = tokio::task::spawn_blocking(move || {
        run_compaction_script(TRIGGER_SCRIPT, base_url, &session)
    })
    .await
    .unwrap();
    // Exactly one compaction item, sealed by foldgate, with usage; streamed as the
    // Responses API streams an answer.
    let trigger = check(&lines, "trigger");
    assert_eq!(trigger["types"], json!(["compaction"]), "{trigger}");
    assert!(trigger["encrypted"].as_str().unwrap().starts_with(SEALED_PREFIX), "{trigger}");
    assert!(trigger["input_tokens"].as_u64().unwrap() > 0, "{trigger}");
    let streamed = check(&lines, "trigger_stream");
    assert_eq!(streamed["types"], json!(["compaction"]), "{streamed}");
    assert_eq!(
        streamed["events"],
        json!([
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]),
        "{streamed}"
    );
    assert!(!check(&lines, "next")["text"].as_str().unwrap().is_empty());
    // The upstream: asked once with the trigger (it refused), never again; the next
    // turn reached it readable: the digest as an assistant message, no sealed content.
    let forwarded = mock.forwarded();
    let with_trigger = forwarded
        .iter()
        .filter(|r| memchr::memmem::find(&r.body, b"compaction_trigger").is_some())
        .count();
    assert_eq!(with_trigger, 1, "asked once, in auto");
    let next = forwarded.last().unwrap();
    assert_opened(&next.body, &[json!({"role": "user", "content": "Now run the parser tests."})]);
}

const SUMMARIZE_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/anthropic_summarize_check.py");

#[tokio::test]
async fn the_anthropic_sdk_gets_on_demand_compaction_from_foldgate() {
    if !common::tools::python_module_available("anthropic") {
        return;
    }
    use common::messages_api::{assert_valid, params};
    let anthropic = MockUpstream::start(bare_anthropic()).await;
    let mut config = compaction_config(&anthropic.url());
    config.upstream.anthropic_url = anthropic.url();
    config.summarizer.kind = foldgate::config::SummarizerKind::Llm;
    let proxy = Proxy::start(config).await;
    let params = params(24);
    let session = json!({"params": params});
    let base_url = format!("http://{}", proxy.addr);
    let lines = tokio::task::spawn_blocking(move || {
        run_compaction_script(SUMMARIZE_SCRIPT, base_url, &session)
    })
    .await
    .unwrap();
    // The answer holds the compaction block alone, plain and streamed.
    for name in ["summarize", "summarize_stream"] {
        let line = check(&lines, name);
        assert_eq!(line["types"], json!(["compaction"]), "{line}");
        assert_eq!(line["stop_reason"], "compaction", "{line}");
        assert!(!line["summary"].as_str().unwrap_or("").is_empty(), "{line}");
    }
    let next = check(&lines, "next");
    assert_eq!(next["types"][0], "text", "{next}");
    let combined = check(&lines, "combined");
    assert_eq!(combined["status"], 400, "{combined}");
    assert!(combined["message"].as_str().unwrap().contains("context_management"), "{combined}");

    // The upstream: asked once with the field (it refused), never again; the next turn
    // reached it readable, its summary as user text first, nothing it summarized.
    let forwarded = anthropic.forwarded();
    let with_field = forwarded.iter().filter(|r| json(&r.body).get("compaction").is_some());
    assert_eq!(with_field.count(), 1, "asked once, in auto");
    let next = forwarded.last().unwrap();
    assert_valid(&next.body);
    let body = json(&next.body);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user", "{body}");
    let summary = check(&lines, "summarize")["summary"].as_str().unwrap().to_owned();
    let texts = texts(&next.body);
    assert!(texts.iter().any(|t| t.contains(&summary)), "the summary forwarded: {texts:?}");
    assert!(texts.iter().any(|t| t == "Go on with the parser."), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains("fn item_0_0")), "what it summarized is gone");
    assert!(next.headers.get_all("anthropic-beta").iter().next().is_none(), "beta served here");
    // The instructions reached the model summarizer.
    let asked =
        anthropic.recorded().into_iter().filter(|r| r.headers.contains_key("x-foldgate-summary"));
    assert!(
        asked.into_iter().any(|r| {
            memchr::memmem::find(&r.body, b"Name every module that was read.").is_some()
        })
    );
}

#[tokio::test]
async fn an_anthropic_upstream_with_context_management_gets_it_byte_for_byte() {
    let anthropic = MockUpstream::start(common::messages_api::anthropic_provider()).await;
    let mut config = compaction_config(&anthropic.url());
    config.upstream.anthropic_url = anthropic.url();
    let proxy = Proxy::start(config).await;
    let mut params = common::messages_api::params(4);
    params["context_management"] = json!({"edits": [{"type": "clear_thinking_20251015"}]});
    let body = Bytes::from(params.to_string());
    let request = http::Request::post(proxy.url("/v1/messages"))
        .header("anthropic-beta", "context-management-2025-06-27")
        .header("x-api-key", "sk-ant")
        .body(full(body.clone()))
        .unwrap();
    let (status, _, answer) = send(request).await;
    assert_eq!(status, 200);
    assert_eq!(json(&answer)["content"][0]["text"], "ok", "the upstream's answer as it is");
    let forwarded = anthropic.forwarded();
    assert_eq!(forwarded[0].body, body);
    assert_eq!(forwarded[0].headers["anthropic-beta"], "context-management-2025-06-27");
}
