//! Chat-completions interception over real HTTP: a growing agent conversation through
//! foldgate to a recording mock provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::agent::{
    COMPLETION, ProviderStats, chat_config, chat_request, conversation, provider, requests,
};
use common::*;
use foldgate::compaction::check::verify;
use foldgate::compaction::{Budget, Options, TokenCache};
use foldgate::config::{CompactionMode, SummarizerKind};
use foldgate::model::{ChatRequest, DIGEST_MARKER};
use http::{HeaderMap, Request, StatusCode};

fn header(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
}

/// Raw text of the forwarded messages up to and including the last digest.
fn prefix_through_last_digest(body: &[u8]) -> Vec<String> {
    let request = ChatRequest::parse(body).unwrap();
    let raws: Vec<String> = request.messages().iter().map(|m| m.raw().to_owned()).collect();
    let last = request.messages().iter().rposition(|m| m.is_digest());
    last.map(|i| raws[..=i].to_vec()).unwrap_or_default()
}

#[tokio::test]
async fn a_growing_conversation_is_compacted_validly_and_cache_stably() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let config = chat_config(&mock.url());
    let proxy = Proxy::start(config.clone()).await;
    let bodies = requests(&conversation(40, 4), &[]);
    assert!(bodies.len() >= 40);

    let mut outcomes = Vec::new();
    let mut cache = TokenCache::default();
    let mut previous_prefix: Vec<String> = Vec::new();
    for (i, body) in bodies.iter().take(40).enumerate() {
        let (status, headers, answer) =
            send(chat_request(&proxy, body.clone(), "Bearer sk-a", "session-1")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, COMPLETION.as_bytes(), "the upstream answer passes unchanged");
        let outcome = header(&headers, "x-foldgate-outcome");
        let sent = mock.forwarded_bodies()[i].clone();
        let original = ChatRequest::parse(body).unwrap();
        let budget = Budget::of(&original, &config.compaction, &Options::default());
        if outcome == "passthrough" {
            assert_eq!(sent, *body, "request {i} below the trigger is forwarded byte-identical");
            assert!(previous_prefix.is_empty(), "no passthrough after the first fold");
        } else {
            assert_eq!(outcome, "compacted", "request {i}");
            let after: usize = header(&headers, "x-foldgate-tokens-after").parse().unwrap();
            let before: usize = header(&headers, "x-foldgate-tokens-before").parse().unwrap();
            assert!(after < before && after <= budget.budget, "request {i}: {before} -> {after}");
            let sent_request = ChatRequest::parse(&sent).unwrap();
            let violations =
                verify(&original, &sent_request, &config.compaction, &budget, &mut cache);
            assert!(violations.is_empty(), "request {i}: {violations:?}");
            // Unknown top-level fields survive.
            let v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            assert_eq!(v["x_vendor_field"], serde_json::json!({"kept": [1, 2, 3]}));
            assert_eq!(v["max_tokens"], 512);
            // Prompt-cache stability: what was forwarded up to the last digest is
            // forwarded again, byte for byte.
            let prefix = prefix_through_last_digest(&sent);
            assert!(
                prefix.len() >= previous_prefix.len()
                    && prefix[..previous_prefix.len()] == previous_prefix[..],
                "request {i} rewrote an earlier fold block"
            );
            previous_prefix = prefix;
        }
        outcomes.push(outcome);
    }
    assert!(outcomes.iter().any(|o| o == "passthrough"));
    assert!(outcomes.iter().filter(|o| *o == "compacted").count() >= 10, "{outcomes:?}");
    let digests: std::collections::BTreeSet<String> = mock
        .forwarded_bodies()
        .iter()
        .flat_map(|b| {
            ChatRequest::parse(b)
                .unwrap()
                .messages()
                .iter()
                .filter(|m| m.is_digest())
                .map(|m| m.raw().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(digests.len() >= 2, "several folds happened");
    assert!(digests.iter().all(|d| d.contains(DIGEST_MARKER)));
    assert!(digests.iter().all(|d| d.contains("I read the modules")), "the model wrote them");
    // One summarizer call per fold, not per request; with prefetch on, the last fold
    // may have been summarized ahead of a request that the test never sends.
    let calls = stats.summaries.load(Ordering::SeqCst);
    assert!(
        (digests.len()..=digests.len() + 1).contains(&calls),
        "{calls} summarizer calls for {} folds",
        digests.len()
    );
}

#[tokio::test]
async fn a_failing_summarizer_falls_back_to_an_extractive_digest() {
    let chats = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = chats.clone();
    let mock = MockUpstream::start(Arc::new(move |rec: Recorded| {
        let counter = counter.clone();
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                return response(503, r#"{"error":{"message":"overloaded","code":"overloaded"}}"#);
            }
            counter.fetch_add(1, Ordering::SeqCst);
            response(200, COMPLETION)
        })
    }))
    .await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    // The first request does not wait for its digest: the fold is made in the background
    // (falling back to the extractive digest) and the next request applies it.
    for _ in 0..2 {
        let (status, headers, answer) =
            send(chat_request(&proxy, body.clone(), "Bearer k", "s")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, COMPLETION.as_bytes());
        assert_eq!(header(&headers, "x-foldgate-outcome"), "compacted");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let sent = mock.forwarded_bodies().pop().unwrap();
    let request = ChatRequest::parse(&sent).unwrap();
    let digest = request.messages().iter().find(|m| m.is_digest()).expect("a digest").text();
    assert!(digest.contains("src/module_"), "the extractive digest names the files read: {digest}");
}

#[tokio::test]
async fn a_concurrent_burst_on_one_session_summarizes_each_range_once() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Arc::new(Proxy::start(chat_config(&mock.url())).await);
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (proxy, body) = (proxy.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let (status, headers, _) = send(chat_request(&proxy, body, "Bearer k", "burst")).await;
            assert_eq!(status, StatusCode::OK);
            header(&headers, "x-foldgate-outcome")
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), "compacted");
    }
    assert_eq!(stats.summaries.load(Ordering::SeqCst), 1, "one summary for the one range");
    let distinct: std::collections::BTreeSet<Bytes> = mock.forwarded_bodies().into_iter().collect();
    assert_eq!(distinct.len(), 1, "every request forwarded the same compacted body");
}

#[tokio::test]
async fn streaming_requests_are_compacted_and_streamed_back() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let bodies = requests(&conversation(30, 0), &[("stream", serde_json::json!(true))]);
    let last = bodies.last().unwrap().clone();
    let (status, headers, answer) =
        send(chat_request(&proxy, last.clone(), "Bearer sk-a", "s")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "x-foldgate-outcome"), "compacted");
    assert_eq!(headers["content-type"], "text/event-stream");
    let text = String::from_utf8(answer.to_vec()).unwrap();
    assert!(text.starts_with("data: {") && text.ends_with("data: [DONE]\n\n"), "{text}");
    let sent = mock.forwarded_bodies().pop().unwrap();
    assert!(sent.len() < last.len());
    let v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(v["stream"], true);
}

#[tokio::test]
async fn two_tenants_with_the_same_session_id_never_share_state() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    // Tenant A builds up fold blocks under session "shared".
    let a = requests(&conversation(30, 0), &[]);
    let (_, headers_a, _) =
        send(chat_request(&proxy, a.last().unwrap().clone(), "Bearer sk-tenant-a", "shared")).await;
    assert_eq!(header(&headers_a, "x-foldgate-outcome"), "compacted");
    // Tenant B's own, different conversation under the same session id.
    let mut other = conversation(30, 0);
    other[1] = serde_json::json!({"role": "user", "content": "Tenant B: summarise the README."});
    let b = requests(&other, &[]);
    let (_, headers_b, _) =
        send(chat_request(&proxy, b.last().unwrap().clone(), "Bearer sk-tenant-b", "shared")).await;
    assert_ne!(header(&headers_a, "x-foldgate-session"), header(&headers_b, "x-foldgate-session"));
    let sent_b = String::from_utf8(mock.forwarded_bodies().pop().unwrap().to_vec()).unwrap();
    assert!(!sent_b.contains("Fix the failing test"), "tenant A's text reached tenant B");
    assert!(sent_b.contains("Tenant B: summarise the README."));
    for key in ["sk-tenant-a", "sk-tenant-b"] {
        assert!(!header(&headers_a, "x-foldgate-session").contains(key));
    }
}

#[tokio::test]
async fn context_overflow_is_retried_once_with_a_deeper_compaction() {
    // The provider rejects anything over 20 KB as too long.
    let chats = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = chats.clone();
    let mock = MockUpstream::start(Arc::new(move |rec: Recorded| {
        let counter = counter.clone();
        Box::pin(async move {
            counter.fetch_add(1, Ordering::SeqCst);
            if rec.body.len() > 20_000 {
                response(400, r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#)
            } else {
                response(200, COMPLETION)
            }
        })
    }))
    .await;
    let mut config = chat_config(&mock.url());
    config.summarizer.kind = SummarizerKind::Extractive; // the mock counts chat calls only
    config.compaction.max_context_tokens = Some(128_000); // far below the trigger
    let proxy = Proxy::start(config).await;
    let body = requests(&conversation(20, 0), &[]).pop().unwrap();
    assert!(body.len() > 20_000);
    let (status, headers, answer) = send(chat_request(&proxy, body, "Bearer k", "s")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(header(&headers, "x-foldgate-retried"), "1");
    assert_eq!(header(&headers, "x-foldgate-outcome"), "compacted");
    assert_eq!(chats.load(Ordering::SeqCst), 2, "one failed attempt, one retry");
}

#[tokio::test]
async fn a_persistent_overflow_is_passed_through_after_one_retry() {
    let chats = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = chats.clone();
    let error = r#"{"error":{"message":"prompt is too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
    let mock = MockUpstream::start(Arc::new(move |_| {
        let counter = counter.clone();
        Box::pin(async move {
            counter.fetch_add(1, Ordering::SeqCst);
            response(400, error)
        })
    }))
    .await;
    let mut config = chat_config(&mock.url());
    config.summarizer.kind = SummarizerKind::Extractive; // the mock counts chat calls only
    let proxy = Proxy::start(config).await;
    let body = requests(&conversation(20, 0), &[]).pop().unwrap();
    let (status, _, answer) = send(chat_request(&proxy, body, "Bearer k", "s")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(answer, error.as_bytes(), "the provider's error passes unchanged");
    assert_eq!(chats.load(Ordering::SeqCst), 2, "retried once, never looped");
}

#[tokio::test]
async fn other_400_errors_are_not_retried() {
    let error =
        r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error"}}"#;
    let mock =
        MockUpstream::start(Arc::new(move |_| Box::pin(async move { response(400, error) }))).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let body = requests(&conversation(2, 0), &[]).pop().unwrap();
    let (status, _, answer) = send(chat_request(&proxy, body, "Bearer k", "s")).await;
    assert_eq!((status, answer), (StatusCode::BAD_REQUEST, Bytes::from(error)));
    assert_eq!(mock.forwarded_bodies().len(), 1);
}

#[tokio::test]
async fn bodies_foldgate_does_not_understand_are_forwarded_unchanged() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    for body in
        [&b"not json at all"[..], br#"{"model":"gpt-4o"}"#, br#"{"messages":"nope"}"#, b"[1,2]"]
    {
        let (status, _, answer) =
            send(post(&proxy.url("/v1/chat/completions"), body.to_vec())).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, body, "the upstream saw the original bytes");
    }
}

#[tokio::test]
async fn a_conversation_holding_a_message_foldgate_cannot_read_is_forwarded_as_sent() {
    // Valid JSON that serde_json will not read into a value: nesting past its limit,
    // or a number too large for a float. Folding it would lose what it says.
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    let (_, headers, answer) = send(chat_request(&proxy, body.clone(), "Bearer k", "a")).await;
    assert_eq!(header(&headers, "x-foldgate-outcome"), "compacted");
    assert_ne!(answer, body, "readable, the same conversation is compacted");

    let deep = format!("{}0{}", "[".repeat(300), "]".repeat(300));
    for (i, extra) in [deep.as_str(), "1e999"].into_iter().enumerate() {
        let text = String::from_utf8(body.to_vec()).unwrap();
        let at = text.find(r#""messages":[{"#).unwrap() + r#""messages":[{"#.len();
        let unreadable = Bytes::from(format!(r#"{}"x":{extra},{}"#, &text[..at], &text[at..]));
        let session = format!("b{i}");
        let request = chat_request(&proxy, unreadable.clone(), "Bearer k", &session);
        let (status, headers, answer) = send(request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "x-foldgate-outcome"), "failed_open");
        assert_eq!(answer, unreadable, "the upstream saw the original bytes");
    }
}

#[tokio::test]
async fn summarization_calls_and_disabled_compaction_pass_through() {
    let mock = MockUpstream::echo().await;
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let request = Request::post(proxy.url("/v1/chat/completions"))
        .header("x-foldgate-summary", "1")
        .body(full(body.clone()))
        .unwrap();
    assert_eq!(send(request).await.2, body, "a summarization call is never compacted");

    let mut config = chat_config(&mock.url());
    config.compaction.enabled = false;
    let proxy = Proxy::start(config).await;
    assert_eq!(send(post(&proxy.url("/v1/chat/completions"), body.clone())).await.2, body);
}

#[tokio::test]
async fn observe_mode_reports_but_forwards_the_original() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let mut config = chat_config(&mock.url());
    config.compaction.mode = CompactionMode::Observe;
    let proxy = Proxy::start(config).await;
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    let (status, headers, _) = send(chat_request(&proxy, body.clone(), "Bearer k", "s")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "x-foldgate-outcome"), "observed");
    let before: usize = header(&headers, "x-foldgate-tokens-before").parse().unwrap();
    let after: usize = header(&headers, "x-foldgate-tokens-after").parse().unwrap();
    assert!(after < before);
    assert_eq!(mock.forwarded_bodies().pop().unwrap(), body);
}

#[tokio::test]
async fn chat_bodies_over_the_limit_are_413() {
    let mock = MockUpstream::echo().await;
    let mut config = chat_config(&mock.url());
    config.server.max_body_size = foldgate::config::ByteSize(4096);
    let proxy = Proxy::start(config).await;
    let body = requests(&conversation(10, 0), &[]).pop().unwrap();
    let (status, _, answer) = send(post(&proxy.url("/v1/chat/completions"), body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(&answer)["error"]["code"], "request_too_large");
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn with_prefetch_the_request_crossing_the_trigger_waits_for_no_summary() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let bodies = requests(&conversation(40, 4), &[]);
    let mut crossing = None;
    for (i, body) in bodies.iter().enumerate() {
        // Let a background prefetch started by the previous request finish.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let calls_before = stats.summaries.load(Ordering::SeqCst);
        let (status, headers, _) = send(chat_request(&proxy, body.clone(), "Bearer k", "pf")).await;
        assert_eq!(status, StatusCode::OK);
        if header(&headers, "x-foldgate-outcome") == "compacted" {
            let inline = stats.summaries.load(Ordering::SeqCst) - calls_before;
            crossing = Some((i, calls_before, inline));
            break;
        }
    }
    let (i, calls_before, inline) = crossing.expect("the conversation crossed the trigger");
    assert!(calls_before >= 1, "request {i}: the fold was summarized ahead of need");
    assert_eq!(inline, 0, "request {i}: the crossing request made no summarizer call");
    let sent = mock.forwarded_bodies().pop().unwrap();
    let digest = ChatRequest::parse(&sent)
        .unwrap()
        .messages()
        .iter()
        .find(|m| m.is_digest())
        .unwrap()
        .text()
        .into_owned();
    assert!(digest.contains("I read the modules"), "the prefetched model digest was used");
}

#[tokio::test]
async fn without_prefetch_the_crossing_request_postpones_its_fold_while_it_fits() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let mut config = chat_config(&mock.url());
    config.compaction.prefetch = false;
    let proxy = Proxy::start(config).await;
    let mut crossed = false;
    for body in requests(&conversation(40, 4), &[]) {
        let calls_before = stats.summaries.load(Ordering::SeqCst);
        let (_, headers, _) = send(chat_request(&proxy, body, "Bearer k", "np")).await;
        assert!(!headers.contains_key("x-foldgate-fold-wait-ms"), "no request waited");
        let over = header(&headers, "x-foldgate-tokens-before").parse::<usize>().unwrap_or(0)
            > (12_000 - 4096) * 3 / 4;
        if header(&headers, "x-foldgate-outcome") == "compacted" {
            assert!(crossed, "a request before fitted without the fold and was forwarded as is");
            assert_eq!(calls_before, 1, "its fold was summarized in the background");
            assert_eq!(stats.summaries.load(Ordering::SeqCst), 1, "and applied, not redone");
            let forwarded = mock.recorded().pop().unwrap();
            assert!(String::from_utf8_lossy(&forwarded.body).contains("I read the modules"));
            return;
        }
        crossed |= over;
        // The agent's think time: the background fold lands before the next request.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the conversation never crossed the trigger");
}

#[tokio::test]
async fn a_slow_prefetch_does_not_hold_up_the_conversations_next_request() {
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = provider(Arc::new(ProviderStats::default()));
    let counter = started.clone();
    let mock = MockUpstream::start(Arc::new(move |rec: Recorded| {
        let (inner, counter) = (inner.clone(), counter.clone());
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
            }
            inner(rec).await
        })
    }))
    .await;
    // Tool output never stubbed: the plan at the trigger folds, so a fold is prefetched.
    let mut config = chat_config(&mock.url());
    config.compaction.elide_min_tokens = 1_000_000;
    let proxy = Proxy::start(config).await;
    let bodies = requests(&conversation(40, 4), &[]);
    for (i, body) in bodies.iter().enumerate() {
        let summaries_before = started.load(Ordering::SeqCst);
        let t = std::time::Instant::now();
        let (status, headers, _) =
            send(chat_request(&proxy, body.clone(), "Bearer k", "slow")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "x-foldgate-outcome"), "passthrough", "request {i}");
        if summaries_before > 0 {
            // A prefetch is summarizing (for 2 s); this request did not wait for it.
            assert!(t.elapsed() < std::time::Duration::from_millis(1_000), "request {i} waited");
            return;
        }
        // Give a prefetch started by this request time to reach the provider.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no prefetch started");
}

/// A provider whose model has a 16,000-token window, smaller than foldgate's table says
/// (128k for gpt-4o): prompts over it are rejected as OpenAI does, stating the window.
fn small_window_provider(rejected: Arc<std::sync::atomic::AtomicUsize>) -> Handler {
    let normal = provider(Arc::new(ProviderStats::default()));
    let cache = Arc::new(std::sync::Mutex::new(TokenCache::default()));
    Arc::new(move |rec: Recorded| {
        let (normal, rejected, cache) = (normal.clone(), rejected.clone(), cache.clone());
        Box::pin(async move {
            if !rec.headers.contains_key("x-foldgate-summary") {
                let request = ChatRequest::parse(&rec.body).unwrap();
                let config = foldgate::config::CompactionConfig::default();
                let budget = Budget::of(&request, &config, &Options::default());
                let engine = foldgate::compaction::Engine::new(config);
                let tokens = engine.count_prompt(&request, &budget, &mut cache.lock().unwrap());
                if tokens > 16_000 {
                    rejected.fetch_add(1, Ordering::SeqCst);
                    let message = format!(
                        "This model's maximum context length is 16000 tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."
                    );
                    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
                    return response(400, body.to_string());
                }
            }
            normal(rec).await
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_learned_from_one_overflow_serves_every_conversation_of_the_model() {
    let rejected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mock = MockUpstream::start(small_window_provider(rejected.clone())).await;
    let mut config = chat_config(&mock.url());
    config.compaction.max_context_tokens = None;
    let proxy = Proxy::start(config).await;
    let mut learned_seen = 0;
    for (seed, session) in [(3, "first"), (4, "second")] {
        let bodies =
            common::sessions::session_requests(common::sessions::Shape::ToolCalling, seed, 30_000);
        for (i, request) in bodies.iter().enumerate() {
            let (status, headers, _) =
                send(chat_request(&proxy, request.body.clone(), "Bearer k", session)).await;
            assert_eq!(status, StatusCode::OK, "{session} request {i}");
            if headers.contains_key("x-foldgate-learned-window") {
                assert_eq!(header(&headers, "x-foldgate-learned-window"), "16000");
                learned_seen += 1;
            }
        }
    }
    assert_eq!(
        rejected.load(Ordering::SeqCst),
        1,
        "one rejected request for the model, not one per request"
    );
    assert!(learned_seen > 20, "later requests were planned against the learned window");
    let text = String::from_utf8(
        send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await.2.to_vec(),
    )
    .unwrap();
    assert!(text.contains(r#"foldgate_learned_windows_total{event="learned"} 1"#), "{text}");
}
