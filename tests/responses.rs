//! The Responses API (`POST /v1/responses`) through foldgate: the conversion of items to
//! neutral messages and back (engine level), the official `openai` Python SDK's
//! `client.responses.create`, plain and streamed, against a recording mock provider, and
//! the retry of a streamed request whose 200 event stream fails for its context length.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    missing_docs
)]

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use common::responses_api::*;
use common::*;
use foldgate::api::responses::{parse, render};
use foldgate::compaction::{Engine, Forward, Options, SessionState};
use foldgate::config::CompactionConfig;
use foldgate::model::DIGEST_MARKER;
use foldgate::summarizer::ExtractiveSummarizer;
use foldgate::summarizer::llm::SUMMARY_HEADER;
use http::Request;
use serde_json::{Value, json};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_responses_check.py");

/// The raw text of every `input` item of `body`, as sent.
fn raw_items(body: &[u8]) -> Vec<Vec<u8>> {
    let (_, origins) = parse(body).expect("a Responses body");
    (0..origins.items.len()).map(|i| origins.item(body, i).to_vec()).collect()
}

/// Checks a forwarded Responses body against the one sent: every other field unchanged,
/// every call answered right after it and every output answering a call, small user
/// messages verbatim, every item of the original kept byte for byte or written by
/// foldgate (digests, stubs), reasoning and compaction items never edited.
fn check_forwarded(sent: &[u8], forwarded: &[u8]) {
    let (sent_v, fwd_v) = (json(sent), json(forwarded));
    for (k, v) in sent_v.as_object().unwrap() {
        if k != "input" {
            assert_eq!(&fwd_v[k], v, "field {k} unchanged");
        }
    }
    let sent_raw = raw_items(sent);
    let originals: HashSet<&[u8]> = sent_raw.iter().map(Vec::as_slice).collect();
    let items = fwd_v["input"].as_array().unwrap();
    let mut open: Vec<&str> = Vec::new();
    let mut reasoning_kept = 0;
    for (item, raw) in items.iter().zip(raw_items(forwarded)) {
        let kind = item["type"].as_str().unwrap_or("message");
        match kind {
            "function_call" => open.push(item["call_id"].as_str().unwrap()),
            "function_call_output" => {
                let id = item["call_id"].as_str().unwrap();
                assert!(open.contains(&id), "output {id} answers a call before it");
            }
            _ => open.clear(),
        }
        let written_here = kind == "function_call_output"
            || item["content"].as_str().is_some_and(|t| t.starts_with(DIGEST_MARKER));
        assert!(
            originals.contains(raw.as_slice()) || written_here,
            "an item of the original, byte for byte: {}",
            String::from_utf8_lossy(&raw)
        );
        if matches!(kind, "reasoning" | "compaction") {
            assert!(originals.contains(raw.as_slice()), "{kind} kept byte for byte");
            reasoning_kept += usize::from(kind == "reasoning");
        }
    }
    assert!(reasoning_kept > 0, "the kept calls keep their reasoning items");
    // Calls are answered: every call in the forwarded input has its output.
    let outputs: HashSet<&str> = items
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["call_id"].as_str().unwrap())
        .collect();
    for call in items.iter().filter(|i| i["type"] == "function_call") {
        assert!(outputs.contains(call["call_id"].as_str().unwrap()), "call answered");
    }
    // Small user messages are forwarded verbatim.
    let forwarded_raw: HashSet<Vec<u8>> = raw_items(forwarded).into_iter().collect();
    for (item, raw) in sent_v["input"].as_array().unwrap().iter().zip(&sent_raw) {
        if item["role"] == "user" {
            assert!(forwarded_raw.contains(raw), "user message kept: {item}");
        }
    }
    // The compaction item stays first, as received.
    if let Some(first) = sent_raw.first().filter(|r| r.windows(12).any(|w| w == b"\"compaction\""))
    {
        assert_eq!(raw_items(forwarded).first(), Some(first), "compaction item pinned");
    }
}

#[test]
fn parse_then_render_without_compaction_gives_the_original_bytes() {
    let mut items = session_items(12);
    items.push(json!({"type": "web_search_call", "id": "ws_1", "status": "completed"}));
    items.push(json!({"type": "message", "role": "assistant", "content": "done"}));
    items.push(json!({"type": "custom_tool_call", "call_id": "c9", "name": "apply_patch", "input": "*** Begin Patch"}));
    items.push(json!({"type": "custom_tool_call_output", "call_id": "c9", "output": "Done!"}));
    items.push(
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"}]}),
    );
    for body in [
        body_of(&items, &[("stream", json!(true)), ("x_vendor", json!({"b": [1.0, 2]}))]),
        Bytes::from_static(br#"{ "model" : "gpt-5", "input" : "hi there" , "instructions": null }"#),
        Bytes::from_static(b"{\"input\": [ {\"role\":\"user\",\"content\":\"a\"} ,\n {\"type\":\"reasoning\",\"id\":\"rs\",\"encrypted_content\":\"x\"} ]}"),
    ] {
        let (request, origins) = parse(&body).unwrap();
        assert_eq!(render(&body, &origins, &request), body);
        // Every message rebuilt from its value (new allocations, same bytes) too.
        let copies = request
            .messages()
            .iter()
            .map(|m| Arc::new(foldgate::model::Message::from_value(m.value().clone()).unwrap()))
            .collect();
        assert_eq!(render(&body, &origins, &request.with_messages(copies)), body);
    }
}

#[tokio::test]
async fn the_engine_compacts_a_long_session_and_rendering_keeps_items_whole() {
    let body = body_of(&session_items(40), &[]);
    let (request, origins) = parse(&body).unwrap();
    assert!(!origins.server_state);
    let cfg = CompactionConfig { max_context_tokens: Some(12_000), ..Default::default() };
    let engine = Engine::new(cfg);
    let mut state = SessionState::default();
    let outcome = engine
        .compact_request(&request, &mut state, &ExtractiveSummarizer, &Options::default())
        .await
        .unwrap();
    let Forward::Compacted { request: compacted, report, .. } = outcome else {
        panic!("a 40-round session is over a 12k window");
    };
    assert!(report.tokens_after <= report.budget.budget, "{report:?}");
    let forwarded = render(&body, &origins, &compacted);
    assert!(forwarded.len() < body.len());
    check_forwarded(&body, &forwarded);
    // A digest went in, as an assistant message item.
    let input = json(&forwarded)["input"].as_array().unwrap().clone();
    assert!(input.iter().any(|i| i["role"] == "assistant"
        && i["content"].as_str().is_some_and(|t| t.starts_with(DIGEST_MARKER))));
}

/// A provider whose first answers to Responses requests are the event streams `first`,
/// one per request, in order; then [`responses_provider`]'s.
fn streams_first(first: Vec<String>) -> Handler {
    let inner = responses_provider();
    let first = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(first)));
    Arc::new(move |rec: Recorded| {
        let summary = rec.headers.contains_key("x-foldgate-summary");
        let next = if summary { None } else { first.lock().unwrap().pop_front() };
        match next {
            Some(text) => Box::pin(async move { event_stream(text) }),
            None => inner(rec),
        }
    })
}

fn responses_config(upstream: &str) -> foldgate::config::Config {
    let mut config = config_for(upstream);
    config.compaction.max_context_tokens = Some(12_000);
    // Deterministic digests: every request over the trigger is compacted inline.
    config.summarizer.kind = foldgate::config::SummarizerKind::Extractive;
    config
}

fn post_responses(proxy: &Proxy, body: Bytes) -> Request<TestBody> {
    Request::post(proxy.url("/v1/responses"))
        .header("authorization", "Bearer sk-r")
        .header("x-session-id", "s")
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap()
}

#[tokio::test]
async fn requests_below_the_trigger_and_with_server_state_are_forwarded_byte_for_byte() {
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let small = body_of(&session_items(2), &[]);
    let stateful = body_of(&session_items(40), &[("previous_response_id", json!("resp_0"))]);
    for (body, outcome) in [(small, "passthrough"), (stateful, "passthrough")] {
        let (status, headers, _) = send(post_responses(&proxy, body.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-foldgate-outcome"], outcome);
        assert_eq!(mock.recorded().last().unwrap().body, body, "forwarded byte for byte");
    }
    // A long one is compacted, within the budget.
    let long = body_of(&session_items(40), &[]);
    let (status, headers, _) = send(post_responses(&proxy, long.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    let after: usize = headers["x-foldgate-tokens-after"].to_str().unwrap().parse().unwrap();
    assert!(after <= 12_000 - 512, "{after}");
    check_forwarded(&long, &mock.recorded().last().unwrap().body);
    // An error about encrypted content passes through unchanged, never retried.
    let mut items = session_items(40);
    items.push(
        json!({"type": "reasoning", "id": "rs_bad", "summary": [], "encrypted_content": "INVALID"}),
    );
    let sent_before = mock.recorded().len();
    let (status, _, answer) = send(post_responses(&proxy, body_of(&items, &[]))).await;
    assert_eq!(status, 400);
    assert_eq!(answer, INVALID_ENCRYPTED.as_bytes());
    assert_eq!(mock.recorded().len(), sent_before + 1, "no retry");
    let (_, _, text) = send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(
        text.contains(r#"foldgate_chat_requests_total{outcome="compacted",route="responses"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"foldgate_chat_requests_total{outcome="passthrough",route="responses"} 2"#),
        "{text}"
    );
}

#[tokio::test]
async fn the_official_python_sdk_responses_calls_are_compacted_through_foldgate() {
    if !common::tools::python_module_available("openai") {
        return;
    }
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let dir = std::env::temp_dir().join(format!("foldgate-responses-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let session_file = dir.join("session.json");
    let session = json!({
        "instructions": "You are a careful coding agent.",
        "items": session_items(40),
        "more": round_items(40),
        "invalid": [{"type": "reasoning", "id": "rs_bad", "summary": [], "encrypted_content": "INVALID"}],
    });
    std::fs::write(&session_file, serde_json::to_vec(&session).unwrap()).unwrap();
    let base_url = format!("http://{}/v1", proxy.addr);
    let args = [
        SCRIPT.to_owned(),
        base_url,
        session_file.display().to_string(),
        dir.display().to_string(),
    ];
    let output =
        tokio::task::spawn_blocking(move || Command::new("python3").args(args).output().unwrap())
            .await
            .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let sent = |n: usize| Bytes::from(std::fs::read(dir.join(format!("sent_{n}.json"))).unwrap());
    let forwarded: Vec<Bytes> = mock
        .recorded()
        .into_iter()
        .filter(|r| r.uri.path() == "/v1/responses")
        .map(|r| r.body)
        .collect();
    assert_eq!(forwarded.len(), 5, "one upstream request per SDK call, no retry");

    assert_eq!(lines[0]["check"], "small");
    assert_eq!(lines[0]["outcome"], "passthrough");
    assert_eq!(lines[0]["text"], "ok");
    assert_eq!(forwarded[0], sent(0), "below the trigger: byte for byte");

    assert_eq!(lines[1]["check"], "long");
    assert_eq!(lines[1]["outcome"], "compacted");
    assert_eq!(lines[1]["input_tokens"], 100);
    assert_eq!(lines[1]["cached_tokens"], 40);
    let after: usize = lines[1]["tokens_after"].as_str().unwrap().parse().unwrap();
    assert!(after <= 12_000 - 512, "within the budget: {after}");
    check_forwarded(&sent(1), &forwarded[1]);

    assert_eq!(lines[2]["check"], "stream");
    assert_eq!(lines[2]["text"], "ok");
    assert_eq!(lines[2]["input_tokens"], 100);
    assert_eq!(lines[2]["outcome"], "compacted");
    check_forwarded(&sent(2), &forwarded[2]);

    assert_eq!(lines[3]["check"], "previous_response_id");
    assert_eq!(lines[3]["outcome"], "passthrough");
    assert_eq!(forwarded[3], sent(3), "server-side state: forwarded unchanged");

    assert_eq!(lines[4]["check"], "invalid");
    assert_eq!(lines[4]["status"], 400);
    assert_eq!(lines[4]["code"], "invalid_encrypted_content");
    assert_eq!(lines[4]["body"], INVALID_ENCRYPTED, "the upstream's error, unchanged");

    let (_, _, metrics) = send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics
            .contains(r#"foldgate_upstream_usage_tokens_total{kind="cached",model="gpt-4.1"} 160"#),
        "usage read from JSON answers and the response.completed event:\n{metrics}"
    );
}

#[tokio::test]
async fn a_codex_session_is_keyed_alike_on_both_paths_and_its_digests_come_from_the_responses_api()
{
    let mock = MockUpstream::start(responses_provider()).await;
    let mut config = config_for(&mock.url());
    config.compaction.max_context_tokens = Some(12_000);
    let proxy = Proxy::start(config).await;
    // No session header, no compaction item: the conversation is known by its fingerprint.
    let items = |rounds: usize| session_items(rounds)[1..].to_vec();
    let codex = [("model", json!("gpt-5-codex"))];
    let send_rounds = |rounds: usize| {
        let request = Request::post(proxy.url("/v1/responses"))
            .header("authorization", "Bearer sk-codex")
            .header("content-type", "application/json")
            .body(full(body_of(&items(rounds), &codex)))
            .unwrap();
        send(request)
    };
    // Far below the trigger: decided from the outline, not parsed.
    let (status, small, _) = send_rounds(2).await;
    assert_eq!(status, 200);
    assert_eq!(small["x-foldgate-outcome"], "passthrough");
    assert_eq!(mock.recorded()[0].body, body_of(&items(2), &codex));
    // Over it: parsed and compacted, as the same conversation.
    let (_, long, _) = send_rounds(40).await;
    assert_eq!(long["x-foldgate-outcome"], "compacted");
    assert_eq!(long["x-foldgate-session"], small["x-foldgate-session"]);
    // Its fold is summarized in the Responses API, by the conversation's model.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let summary = loop {
        let found = mock.recorded().into_iter().find(|r| r.headers.contains_key(SUMMARY_HEADER));
        if let Some(call) = found {
            break call;
        }
        assert!(std::time::Instant::now() < deadline, "no summarization call");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(summary.uri.path(), "/v1/responses");
    assert_eq!(summary.headers["authorization"], "Bearer sk-codex");
    let call: Value = serde_json::from_slice(&summary.body).unwrap();
    assert_eq!(call["model"], "gpt-5-codex");
    assert_eq!(call["store"], false);
    assert_eq!(call["input"][0]["role"], "user");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, next, _) = send_rounds(41).await;
    assert_eq!(next["x-foldgate-session"], small["x-foldgate-session"]);
    let last = mock.forwarded().pop().unwrap();
    check_forwarded(&body_of(&items(41), &codex), &last.body);
    let text = String::from_utf8_lossy(&last.body);
    assert!(text.contains("I read modules 0 to 39 and ran the parser tests."), "{text}");
}

#[tokio::test]
async fn codex_sessions_that_start_alike_are_told_apart_by_their_prompt_cache_key() {
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let session_of = |rounds: usize, cache_key: &'static str| {
        let extra = [("model", json!("gpt-5-codex")), ("prompt_cache_key", json!(cache_key))];
        let request = Request::post(proxy.url("/v1/responses"))
            .header("authorization", "Bearer sk-codex")
            .header("content-type", "application/json")
            .body(full(body_of(&session_items(rounds)[1..], &extra)))
            .unwrap();
        async move { send(request).await.1["x-foldgate-session"].clone() }
    };
    // Below the trigger (outline) and above it (parsed): one key per conversation.
    let a = session_of(2, "conv-a").await;
    assert_eq!(a, session_of(40, "conv-a").await);
    let b = session_of(2, "conv-b").await;
    assert_ne!(a, b, "same instructions and first message, another conversation");
    assert_eq!(b, session_of(40, "conv-b").await);
}

#[tokio::test]
async fn a_context_overflow_is_compacted_deeper_and_retried_once() {
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let inner = responses_provider();
    let handler: Handler = Arc::new(move |rec: Recorded| {
        if counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            return Box::pin(async {
                response(
                    400,
                    r#"{"error":{"message":"Your input exceeds the context window of this model. The maximum context length is 6000 tokens.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
                )
            });
        }
        inner(rec)
    });
    let mock = MockUpstream::start(handler).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    // Below the trigger of a 12k window: forwarded as is, then refused by the provider.
    let body = body_of(&session_items(10), &[]);
    let (status, headers, _) = send(post_responses(&proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), 2, "one retry");
    assert_eq!(recorded[0].body, body, "the first try went as received");
    assert!(recorded[1].body.len() < body.len());
    check_forwarded(&body, &recorded[1].body);
}

/// A streamed request of a session below the trigger (forwarded as received).
fn streamed_body() -> Bytes {
    body_of(&session_items(10), &[("stream", json!(true))])
}

/// Sends `body` and checks that the upstream's first answer, an overflow inside a 200
/// stream, was retried once, deeper compacted, and that the client got only the retry's
/// answer.
async fn assert_retried_once(proxy: &Proxy, mock: &MockUpstream, body: &Bytes) {
    let sent_before = mock.recorded().len();
    let (status, headers, answer) = send(post_responses(proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    assert_eq!(answer, completed_stream().as_bytes(), "only the retry's stream");
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), sent_before + 2, "one retry");
    let (first, retry) = (&recorded[sent_before].body, &recorded[sent_before + 1].body);
    assert_eq!(first, body, "the first try went as received");
    assert!(retry.len() < body.len(), "{} < {}", retry.len(), body.len());
    check_forwarded(body, retry);
    assert_eq!(json(retry)["stream"], true);
}

#[tokio::test]
async fn a_stream_that_fails_for_its_context_length_is_compacted_deeper_and_retried_once() {
    let error_event = {
        let mut events = leading_events();
        events.push(("error", r#"{"type":"error","sequence_number":2,"code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":null}"#.to_owned()));
        sse(&events)
    };
    for first in [overflow_stream(), error_event] {
        let mock = MockUpstream::start(streams_first(vec![first])).await;
        let proxy = Proxy::start(responses_config(&mock.url())).await;
        assert_retried_once(&proxy, &mock, &streamed_body()).await;
        let (_, _, text) = send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
        let text = String::from_utf8(text.to_vec()).unwrap();
        assert!(text.contains(r#"foldgate_overflow_retries_total{result="retried"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"foldgate_upstream_usage_tokens_total{kind="cached",model="gpt-4.1"} 40"#
            ),
            "usage read from the retry's stream:\n{text}"
        );
    }
    // Once only: a retry that overflows too reaches the client as it is.
    let mock = MockUpstream::start(streams_first(vec![overflow_stream(), overflow_stream()])).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let (status, headers, answer) = send(post_responses(&proxy, streamed_body())).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-foldgate-retried"], "1");
    assert_eq!(answer, overflow_stream().as_bytes());
    assert_eq!(mock.recorded().len(), 2);
}

#[tokio::test]
async fn streams_that_fail_otherwise_or_succeed_reach_the_client_byte_for_byte() {
    let server_error = failed_stream(
        "server_error",
        "The server had an error while processing your request. Sorry about that!",
    );
    // Keep-alive comments around the leading events, one with CRLF line ends.
    let under_way = sse(&[
        ("response.output_item.added", r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"reasoning","id":"rs_9","summary":[]}}"#.to_owned()),
        ("response.completed", format!(r#"{{"type":"response.completed","sequence_number":3,"response":{}}}"#, response_object("completed", USAGE, "null"))),
    ]);
    let succeeded =
        format!(": keep-alive\n\n{}: keep-alive\r\n\r\n{under_way}", sse(&leading_events()));
    let streams = vec![server_error.clone(), succeeded.clone(), overflow_stream()];
    let mock = MockUpstream::start(streams_first(streams)).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let body = streamed_body();
    for sent in [server_error, succeeded] {
        let sent_before = mock.recorded().len();
        let (status, headers, answer) = send(post_responses(&proxy, body.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(answer, sent.as_bytes(), "byte for byte");
        assert_eq!(headers["content-type"], "text/event-stream; charset=utf-8");
        assert_eq!(headers["x-request-id"], "req_upstream");
        assert!(!headers.contains_key("x-foldgate-retried"));
        assert_eq!(mock.recorded().len(), sent_before + 1, "one upstream request");
    }
    // The same proxy retries a stream that fails for its context length.
    assert_retried_once(&proxy, &mock, &body).await;
    let (_, _, text) = send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(
        text.contains(r#"foldgate_upstream_usage_tokens_total{kind="cached",model="gpt-4.1"} 80"#),
        "usage read from the stream passed through and from the retry's:\n{text}"
    );
}

#[tokio::test]
async fn a_stream_that_fails_on_encrypted_content_is_passed_through_not_retried() {
    // Its message speaks of the context window, yet it is not an overflow.
    let invalid = failed_stream(
        "invalid_encrypted_content",
        "The encrypted content for item rs_3 could not be verified; it was made for another context window.",
    );
    let streams = vec![invalid.clone(), overflow_stream()];
    let mock = MockUpstream::start(streams_first(streams)).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let body = streamed_body();
    let (status, headers, answer) = send(post_responses(&proxy, body.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(answer, invalid.as_bytes(), "the upstream's stream, unchanged");
    assert!(!headers.contains_key("x-foldgate-retried"));
    assert_eq!(mock.recorded().len(), 1, "no retry");
    // The same proxy retries a stream that fails for its context length.
    assert_retried_once(&proxy, &mock, &body).await;
}

#[test]
fn the_offline_commands_read_responses_bodies() {
    let dir = std::env::temp_dir().join(format!("foldgate-responses-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = body_of(&session_items(40), &[]);
    let file = dir.join("body.json");
    std::fs::write(&file, &body).unwrap();
    let foldgate = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_foldgate"))
            .args(args)
            .env_remove("FOLDGATE_CONFIG")
            .output()
            .unwrap()
    };
    let path = file.to_str().unwrap();
    let out = foldgate(&["compact", "--api", "responses", "--window", "12000", path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.len() < body.len());
    check_forwarded(&body, &out.stdout);
    // A replay record is a Responses body.
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, [&body[..], b"\n"].concat()).unwrap();
    let out = foldgate(&[
        "replay",
        "--api",
        "responses",
        "--window",
        "12000",
        "--json",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = json(&out.stdout);
    assert!(report["total"]["compacted"].as_u64().unwrap() > 0, "{report}");
    // A Responses body is not a Messages request: forwarded unchanged, and said so.
    let out = foldgate(&["compact", "--api", "messages", path]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, body);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Messages request"));
}
