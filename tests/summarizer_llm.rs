//! The LLM summarizer against a real hyper server on loopback: what it sends, what it
//! reads back, and how it fails (status, timeout, circuit breaker, concurrency limit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::agent::{ProviderStats, chat_config, chat_request, provider};
use common::sessions::{Shape, session_requests};
use common::{MockUpstream, Recorded, response};
use foldgate::config::{Secret, SummarizerConfig, UpstreamConfig};
use foldgate::model::Message;
use foldgate::summarizer::llm::{
    CircuitState, Credential, LlmSummarizer, SUMMARY_HEADER, SummaryApi,
};
use foldgate::summarizer::{DigestKind, FailureReason, Summarizer, SummarizerError, SummaryInput};
use http::HeaderValue;
use serde_json::{Value, json};

fn answer(content: &str) -> String {
    json!({"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":content},"finish_reason":"stop"}]}).to_string()
}

/// A mock that answers every request with `status` and `body`.
async fn mock(status: u16, body: String) -> MockUpstream {
    MockUpstream::start(Arc::new(move |_rec: Recorded| {
        let body = body.clone();
        Box::pin(async move { response(status, body) })
    }))
    .await
}

fn config(mock: &MockUpstream) -> SummarizerConfig {
    SummarizerConfig {
        url: mock.url(),
        timeout: Duration::from_secs(5),
        ..SummarizerConfig::default()
    }
}

fn upstream() -> UpstreamConfig {
    // Unreachable on purpose: every test sets `summarizer.url`, except the one that
    // checks the fallback to `upstream.url`.
    UpstreamConfig { url: "http://127.0.0.1:9/v1".to_owned(), ..UpstreamConfig::default() }
}

fn region() -> Vec<Arc<Message>> {
    json!([
        {"role":"user","content":"Fix the failing parser test. Never touch src/api.rs."},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"run","arguments":"{\"cmd\":\"cargo test parser\"}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"test parser::empty ... FAILED"}
    ])
    .as_array()
    .unwrap()
    .iter()
    .map(|m| Arc::new(Message::from_value(m.clone()).unwrap()))
    .collect()
}

fn input(msgs: &[Arc<Message>]) -> SummaryInput<'_> {
    SummaryInput {
        messages: msgs,
        prior_digest: None,
        max_tokens: 500,
        kind: DigestKind::Fold,
        shared: None,
        instructions: None,
    }
}

fn bearer(token: &str) -> Option<Credential> {
    Some(Credential::authorization(HeaderValue::from_str(&format!("Bearer {token}")).unwrap()))
}

fn header<'a>(rec: &'a Recorded, name: &str) -> Option<&'a str> {
    rec.headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn sends_marked_request_with_client_credential_and_request_model() {
    let m = mock(200, answer("## Findings\n- parser::empty fails on empty input")).await;
    let s = LlmSummarizer::new(&config(&m), &upstream()).unwrap();
    let msgs = region();
    let digest = s.bind(bearer("client-token"), "gpt-4o-mini").summarize(input(&msgs)).await;
    assert_eq!(digest.unwrap(), "## Findings\n- parser::empty fails on empty input");

    let rec = m.recorded();
    assert_eq!(rec.len(), 1);
    let r = &rec[0];
    assert_eq!(r.uri.path(), "/v1/chat/completions");
    assert_eq!(header(r, SUMMARY_HEADER), Some("1"));
    assert_eq!(header(r, "content-type"), Some("application/json"));
    assert_eq!(header(r, "authorization"), Some("Bearer client-token"));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["model"], "gpt-4o-mini");
    assert_eq!(body["temperature"], 0);
    assert_eq!(body["max_tokens"], 500);
    assert_eq!(body["stream"], false);
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][1]["role"], "user");
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("Never touch src/api.rs."), "{user}");
    assert!(user.contains("call: run({\"cmd\":\"cargo test parser\"})"), "{user}");
    assert!(user.contains("result of run:\ntest parser::empty ... FAILED"), "{user}");
    assert_eq!(s.stats().successes, 1);
}

#[tokio::test]
async fn api_key_credential_is_forwarded_as_received() {
    let m = mock(200, answer("## Milestones\n- done")).await;
    let s = LlmSummarizer::new(&config(&m), &upstream()).unwrap();
    let cred = Credential::api_key(HeaderValue::from_static("azure-key"));
    let msgs = region();
    s.bind(Some(cred), "gpt-4o").summarize(input(&msgs)).await.unwrap();
    let rec = m.recorded();
    assert_eq!(header(&rec[0], "api-key"), Some("azure-key"));
    assert_eq!(header(&rec[0], "authorization"), None);
}

#[tokio::test]
async fn configured_key_and_model_win_over_the_clients() {
    let m = mock(200, answer("## Current state\n- ok")).await;
    let cfg = SummarizerConfig {
        api_key: Secret::new("sk-summary"),
        model: "summary-model".to_owned(),
        ..config(&m)
    };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let msgs = region();
    s.bind(bearer("client-token"), "gpt-4o").summarize(input(&msgs)).await.unwrap();
    let rec = m.recorded();
    assert_eq!(header(&rec[0], "authorization"), Some("Bearer sk-summary"));
    let body: Value = serde_json::from_slice(&rec[0].body).unwrap();
    assert_eq!(body["model"], "summary-model");
}

/// A Responses API answer whose output is `text` (after a reasoning item).
fn responses_answer(text: &str) -> String {
    json!({"id": "resp_d", "object": "response", "status": "completed", "output": [
        {"type": "reasoning", "id": "rs_d", "summary": []},
        {"type": "message", "id": "msg_d", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]})
    .to_string()
}

#[tokio::test]
async fn a_responses_conversation_s_digest_is_asked_of_the_responses_api() {
    let m = mock(200, responses_answer("## Milestones\n- the parser test was run")).await;
    let s = LlmSummarizer::new(&config(&m), &upstream()).unwrap();
    let msgs = region();
    let bound =
        s.bind_to(bearer("codex"), "gpt-5-codex", SummaryApi::Responses, &Default::default());
    let digest = bound.summarize(input(&msgs)).await.unwrap();
    assert_eq!(digest, "## Milestones\n- the parser test was run");
    let r = &m.recorded()[0];
    assert_eq!(r.uri.path(), "/v1/responses");
    assert_eq!(header(r, SUMMARY_HEADER), Some("1"));
    assert_eq!(header(r, "authorization"), Some("Bearer codex"));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["model"], "gpt-5-codex");
    assert_eq!(body["store"], false);
    assert!(body["instructions"].as_str().unwrap().contains("memory"), "{body}");
    let prompt = body["input"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("Never touch src/api.rs."), "{prompt}");
}

#[tokio::test]
async fn an_anthropic_conversation_s_digest_is_asked_of_anthropic_with_its_headers() {
    let m = mock(
        200,
        json!({"type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "## Milestones\n- ran the tests"}]})
        .to_string(),
    )
    .await;
    // Anthropic is `upstream.anthropic_url`; `summarizer.url` (an OpenAI endpoint) is not
    // where an Anthropic key goes.
    let up = UpstreamConfig { anthropic_url: m.url().replace("/v1", ""), ..upstream() };
    let cfg = SummarizerConfig { url: "http://127.0.0.1:9/v1".to_owned(), ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &up).unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    headers.insert("anthropic-beta", HeaderValue::from_static("oauth-2025-04-20"));
    let key = Credential::from_headers(&{
        let mut h = http::HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("sk-ant-k"));
        h
    });
    let bound = s.bind_to(key, "claude-sonnet-4-5", SummaryApi::Messages, &headers);
    let msgs = region();
    assert_eq!(bound.summarize(input(&msgs)).await.unwrap(), "## Milestones\n- ran the tests");
    let r = &m.recorded()[0];
    assert_eq!(r.uri.path(), "/v1/messages");
    assert_eq!(header(r, "x-api-key"), Some("sk-ant-k"));
    assert_eq!(header(r, "authorization"), None);
    assert_eq!(header(r, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(r, "anthropic-beta"), Some("oauth-2025-04-20"));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["model"], "claude-sonnet-4-5");
    assert!(body["system"].is_string());
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(body["max_tokens"], 500);
}

#[tokio::test]
async fn a_configured_summarizer_is_asked_in_chat_completions_whatever_the_conversation() {
    let m = mock(200, answer("## Findings\n- ok")).await;
    let msgs = region();
    // `summarizer.model`: a Responses conversation's digest is asked of that chat model
    // (with the client's key, at the OpenAI endpoint).
    let cfg = SummarizerConfig { model: "gpt-4.1-mini".to_owned(), ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let headers = http::HeaderMap::new();
    let bound = s.bind_to(bearer("c"), "gpt-5-codex", SummaryApi::Responses, &headers);
    bound.summarize(input(&msgs)).await.unwrap();
    // `summarizer.api_key`: every conversation's digest, an Anthropic one too, is asked
    // of the configured endpoint with that key; the client's key stays home.
    let cfg = SummarizerConfig { api_key: Secret::new("sk-summary"), ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let key = Credential::api_key(HeaderValue::from_static("sk-ant-k"));
    let bound = s.bind_to(Some(key), "claude-sonnet-4-5", SummaryApi::Messages, &headers);
    bound.summarize(input(&msgs)).await.unwrap();
    let rec = m.recorded();
    assert!(rec.iter().all(|r| r.uri.path() == "/v1/chat/completions"));
    let model = |i: usize| serde_json::from_slice::<Value>(&rec[i].body).unwrap()["model"].clone();
    assert_eq!(model(0), "gpt-4.1-mini");
    assert_eq!(header(&rec[0], "authorization"), Some("Bearer c"));
    assert_eq!(model(1), "claude-sonnet-4-5");
    assert_eq!(header(&rec[1], "authorization"), Some("Bearer sk-summary"));
    assert_eq!(header(&rec[1], "api-key"), None);
}

#[tokio::test]
async fn one_failing_model_does_not_open_the_breaker_of_another() {
    let m = MockUpstream::start(Arc::new(|rec: Recorded| {
        let broken = memchr::memmem::find(&rec.body, b"\"model\":\"broken\"").is_some();
        Box::pin(async move {
            if broken { response(404, "{}") } else { response(200, answer("## Findings\n- ok")) }
        })
    }))
    .await;
    let cfg = SummarizerConfig { failure_threshold: 2, ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let msgs = region();
    for _ in 0..4 {
        let _ = s.bind(None, "broken").summarize(input(&msgs)).await;
    }
    assert_eq!(s.stats().circuit, CircuitState::Open);
    assert_eq!(m.recorded().len(), 2, "the broken model's breaker opened after two failures");
    s.bind(None, "gpt-4o").summarize(input(&msgs)).await.unwrap();
    assert!(matches!(
        s.bind(None, "broken").summarize(input(&msgs)).await,
        Err(SummarizerError::CircuitOpen)
    ));
}

#[tokio::test]
async fn upstream_url_is_used_when_no_summarizer_url_is_set() {
    let m = mock(200, answer("## Findings\n- via upstream")).await;
    let up = UpstreamConfig { url: m.url(), ..UpstreamConfig::default() };
    let s = LlmSummarizer::new(&SummarizerConfig::default(), &up).unwrap();
    let msgs = region();
    let d = s.bind(None, "gpt-4o").summarize(input(&msgs)).await.unwrap();
    assert_eq!(d, "## Findings\n- via upstream");
    assert_eq!(m.recorded()[0].uri.path(), "/v1/chat/completions");
    assert_eq!(header(&m.recorded()[0], "authorization"), None);
}

#[tokio::test]
async fn non_2xx_and_empty_answers_fail_with_their_reason() {
    let m = mock(
        429,
        json!({"error":{"message":"Rate limit for sk-abc","type":"requests","code":"rate_limit_exceeded"}})
            .to_string(),
    )
    .await;
    let s = LlmSummarizer::new(&config(&m), &upstream()).unwrap();
    let msgs = region();
    let e = s.bind(bearer("t"), "gpt-4o").summarize(input(&msgs)).await.unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::Status));
    assert!(matches!(e, SummarizerError::Status { status: 429, .. }), "{e:?}");
    assert!(!e.to_string().contains("sk-abc"), "error text is not echoed: {e}");
    assert_eq!(s.stats().failures(FailureReason::Status), 1);

    let m = mock(200, answer("   ")).await;
    let s = LlmSummarizer::new(&config(&m), &upstream()).unwrap();
    let e = s.bind(None, "gpt-4o").summarize(input(&msgs)).await.unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::InvalidResponse));
}

#[tokio::test]
async fn unreachable_endpoint_is_a_transport_failure() {
    let s = LlmSummarizer::new(&SummarizerConfig::default(), &upstream()).unwrap();
    let msgs = region();
    let e = s.bind(None, "gpt-4o").summarize(input(&msgs)).await.unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::Transport), "{e}");
}

#[tokio::test]
async fn a_slow_model_times_out_within_about_the_timeout() {
    let m = MockUpstream::start(Arc::new(|_rec: Recorded| {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            response(200, answer("too late"))
        })
    }))
    .await;
    let cfg = SummarizerConfig { timeout: Duration::from_millis(300), ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let msgs = region();
    let started = Instant::now();
    let e = s.bind(None, "gpt-4o").summarize(input(&msgs)).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, SummarizerError::Timeout), "{e:?}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(s.stats().failures(FailureReason::Timeout), 1);
}

#[tokio::test]
async fn breaker_opens_skips_the_network_then_lets_one_trial_through() {
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let m = MockUpstream::start(Arc::new(move |_rec: Recorded| {
        let ok = flag.load(Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if ok { response(200, answer("## Findings\n- back")) } else { response(500, "{}") }
        })
    }))
    .await;
    let cfg = SummarizerConfig {
        failure_threshold: 3,
        cooldown: Duration::from_millis(300),
        ..config(&m)
    };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let bound = s.bind(None, "gpt-4o");
    let msgs = region();
    for _ in 0..3 {
        let e = bound.summarize(input(&msgs)).await.unwrap_err();
        assert_eq!(e.reason(), Some(FailureReason::Status));
    }
    assert_eq!(s.stats().circuit, CircuitState::Open);
    for _ in 0..5 {
        let started = Instant::now();
        let e = bound.summarize(input(&msgs)).await.unwrap_err();
        assert!(matches!(e, SummarizerError::CircuitOpen), "{e:?}");
        assert!(started.elapsed() < Duration::from_millis(20), "fails at once");
    }
    assert_eq!(m.recorded().len(), 3, "no call while open");

    // After the cooldown: one trial (still failing) while concurrent calls fail fast.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let calls: Vec<_> = (0..4).map(|_| bound.summarize(input(&msgs))).collect();
    let results = futures_util::future::join_all(calls).await;
    let reasons: Vec<_> = results.iter().map(|r| r.as_ref().unwrap_err().reason()).collect();
    assert_eq!(reasons.iter().filter(|r| **r == Some(FailureReason::Status)).count(), 1);
    assert_eq!(reasons.iter().filter(|r| **r == Some(FailureReason::CircuitOpen)).count(), 3);
    assert_eq!(m.recorded().len(), 4, "exactly one trial");

    // The failed trial reopened it; after the next cooldown a good trial closes it.
    assert!(matches!(bound.summarize(input(&msgs)).await, Err(SummarizerError::CircuitOpen)));
    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(bound.summarize(input(&msgs)).await.unwrap(), "## Findings\n- back");
    assert_eq!(s.stats().circuit, CircuitState::Closed);
    bound.summarize(input(&msgs)).await.unwrap();
    assert_eq!(m.recorded().len(), 6);
    let stats = s.stats();
    assert_eq!(stats.calls, 15);
    assert_eq!(stats.failures(FailureReason::CircuitOpen), 9);
    assert_eq!(stats.failures(FailureReason::Status), 4);
    assert_eq!(stats.successes, 2);
}

#[tokio::test]
async fn a_rejected_client_key_does_not_open_the_breaker_for_everyone() {
    let m = mock(401, json!({"error":{"code":"invalid_api_key"}}).to_string()).await;
    let cfg = SummarizerConfig { failure_threshold: 2, ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let msgs = region();
    for _ in 0..5 {
        let e = s.bind(bearer("wrong"), "gpt-4o").summarize(input(&msgs)).await.unwrap_err();
        assert_eq!(e.reason(), Some(FailureReason::Status));
    }
    assert_eq!(s.stats().circuit, CircuitState::Closed);
    assert_eq!(m.recorded().len(), 5);
}

#[tokio::test]
async fn at_most_max_concurrency_calls_are_in_flight() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (now, max) = (in_flight.clone(), peak.clone());
    let m = MockUpstream::start(Arc::new(move |_rec: Recorded| {
        let (now, max) = (now.clone(), max.clone());
        Box::pin(async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            response(200, answer("## Milestones\n- ok"))
        })
    }))
    .await;
    let cfg = SummarizerConfig { max_concurrency: 2, ..config(&m) };
    let s = LlmSummarizer::new(&cfg, &upstream()).unwrap();
    let msgs = region();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let bound = s.bind(bearer(&format!("tenant-{i}")), "gpt-4o");
            let msgs = msgs.clone();
            tokio::spawn(async move { bound.summarize(input(&msgs)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(m.recorded().len(), 10);
    assert_eq!(peak.load(Ordering::SeqCst), 2, "never more than 2, and 2 in parallel");
}

/// The previous forwarded request of `window` (the client request during which a
/// summarizer call arrived): the forward of that request, or of the one before it.
fn previous_forwards(forwards: &[(usize, Value)], window: usize) -> Vec<&Value> {
    forwards
        .iter()
        .filter(|(w, _)| *w + 1 == window || *w == window)
        .map(|(_, body)| body)
        .collect()
}

/// Through the proxy, with `summarizer.share_prefix` on: every summarizer call of a long
/// session sends the conversation's previous forwarded request first (the same `tools`,
/// the same messages, byte for byte once parsed), and the digest instruction last, so the
/// provider's prompt cache serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_call_starts_with_the_previous_forwarded_request() {
    // The client request in flight when each request reached the provider.
    let current = Arc::new(AtomicUsize::new(0));
    let events: Arc<std::sync::Mutex<Vec<(usize, bool, Value)>>> = Arc::default();
    let answer = provider(Arc::new(ProviderStats::default()));
    let (seen, log) = (current.clone(), events.clone());
    let mock = MockUpstream::start(Arc::new(move |rec: Recorded| {
        let summary = rec.headers.contains_key(SUMMARY_HEADER);
        let body: Value = serde_json::from_slice(&rec.body).unwrap();
        log.lock().unwrap().push((seen.load(Ordering::SeqCst), summary, body));
        answer(rec)
    }))
    .await;
    let mut config = chat_config(&mock.url());
    config.compaction.max_context_tokens = Some(16_000);
    config.summarizer.share_prefix = Some(true);
    let proxy = common::Proxy::start(config).await;

    for (session, shape) in [("coding", Shape::CodingAgent), ("tools", Shape::ToolCalling)] {
        events.lock().unwrap().clear();
        for (i, request) in session_requests(shape, 7, 40_000).into_iter().enumerate() {
            current.store(i, Ordering::SeqCst);
            let (status, _, _) =
                common::send(chat_request(&proxy, request.body, "Bearer sk-p", session)).await;
            assert_eq!(status, 200, "{session}: request {i}");
            // Background folds of this request reach the provider before the next one.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let events = events.lock().unwrap().clone();
        let forwards: Vec<(usize, Value)> =
            events.iter().filter(|e| !e.1).map(|(w, _, b)| (*w, b.clone())).collect();
        let calls: Vec<(usize, Value)> =
            events.iter().filter(|e| e.1).map(|(w, _, b)| (*w, b.clone())).collect();
        let mut shared = 0;
        for (k, (window, call)) in calls.iter().enumerate() {
            let messages = call["messages"].as_array().unwrap();
            let (instruction, sent) = messages.split_last().unwrap();
            assert_eq!(instruction["role"], "user", "{session}: call {k}");
            let text = instruction["content"].as_str().unwrap();
            // A region whose last message the previous request cut is rendered instead.
            if !text.starts_with("Pause the task") {
                assert!(text.starts_with("Write my memory"), "{session}: call {k}: {text}");
                continue;
            }
            shared += 1;
            let previous = previous_forwards(&forwards, *window);
            let starts = previous.iter().any(|f| {
                let before = f["messages"].as_array().unwrap();
                f["tools"] == call["tools"]
                    && sent.len() >= before.len()
                    && sent[..before.len()] == before[..]
            });
            assert!(
                starts,
                "{session}: summarizer call {k} (during request {window}, {} messages) does \
                 not start with the previous forwarded request ({:?} messages)",
                sent.len(),
                previous
                    .iter()
                    .map(|f| f["messages"].as_array().unwrap().len())
                    .collect::<Vec<_>>()
            );
            assert_eq!(call["tool_choice"], "none", "{session}: call {k}");
        }
        println!("{session}: {shared} of {} summarizer calls shared the prefix", calls.len());
        assert!(shared >= 3 && shared * 2 >= calls.len(), "{session}: {shared} shared");
    }
}
