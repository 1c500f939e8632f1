//! The official OpenAI Python SDK (from PyPI) pointed at foldgate with `base_url`,
//! plain and streaming, through a compacted conversation.
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

use common::agent::{ProviderStats, conversation, provider};
use common::*;
use foldgate::config::SummarizerKind;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_sdk_check.py");

#[tokio::test]
async fn the_official_python_sdk_works_through_foldgate() {
    if !common::tools::python_module_available("openai") {
        return;
    }
    let stats = Arc::new(ProviderStats::default());
    let mut handler = provider(stats.clone());
    // Also answer GET /v1/models for the SDK's listing call.
    // Every answer carries the provider's request id, as OpenAI's do.
    let inner = handler.clone();
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    handler = Arc::new(move |rec: Recorded| {
        let n = answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = if rec.uri.path().ends_with("/models") {
            Box::pin(async {
                response(
                    200,
                    r#"{"object":"list","data":[{"id":"gpt-4o","object":"model","created":0,"owned_by":"system"}]}"#,
                )
            })
        } else {
            inner(rec)
        };
        Box::pin(async move {
            let mut r = answer.await;
            r.headers_mut().insert("x-request-id", format!("req_mock{n}").parse().unwrap());
            r
        })
    });
    let mock = MockUpstream::start(handler).await;
    let mut config = config_for(&mock.url());
    config.compaction.max_context_tokens = Some(12_000);
    config.summarizer.kind = SummarizerKind::Llm;
    let proxy = Proxy::start(config).await;

    let dir = std::env::temp_dir().join(format!("foldgate-sdk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let messages_file = dir.join("messages.json");
    let messages = conversation(30, 0);
    std::fs::write(&messages_file, serde_json::to_vec(&messages).unwrap()).unwrap();
    let base_url = format!("http://{}/v1", proxy.addr);
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([SCRIPT, &base_url, messages_file.to_str().unwrap()])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["check"], "plain");
    assert_eq!(lines[0]["content"], "ok");
    assert_eq!(lines[0]["outcome"], "compacted", "the SDK's request was compacted");
    assert_eq!(lines[0]["prompt_tokens"], 100);
    assert_eq!(lines[1]["check"], "request_id");
    assert_eq!(lines[2]["check"], "stream");
    assert_eq!(lines[2]["content"], "ok");
    assert_eq!(lines[2]["prompt_tokens"], 100);
    assert_eq!(lines[3]["ids"], serde_json::json!(["gpt-4o"]));

    // `_request_id` (and the streamed response's `x-request-id`) is what the provider
    // sent, not foldgate's id; foldgate's id is the one it sent upstream.
    let all = mock.recorded();
    let answered_as = |i: usize| {
        let chats: Vec<usize> = (0..all.len())
            .filter(|&k| {
                all[k].uri.path().ends_with("/chat/completions")
                    && !all[k].headers.contains_key("x-foldgate-summary")
            })
            .collect();
        format!("req_mock{}", chats[i])
    };
    assert_eq!(lines[0]["request_id"], answered_as(0).as_str());
    assert_eq!(lines[1]["request_id"], answered_as(1).as_str());
    assert_eq!(lines[2]["request_id"], answered_as(2).as_str());
    let ours = lines[0]["foldgate_request_id"].as_str().unwrap();
    assert!(
        all.iter().any(|r| r.headers.get("x-request-id").is_some_and(|v| v == ours)),
        "ours went upstream"
    );

    // The provider received the SDK's requests with the SDK's own credential; the first
    // fits the window and goes as sent while its fold is summarized in the background,
    // the later ones are compacted with it.
    let chats: Vec<Recorded> = mock
        .recorded()
        .into_iter()
        .filter(|r| {
            r.uri.path().ends_with("/chat/completions")
                && !r.headers.contains_key("x-foldgate-summary")
        })
        .collect();
    assert_eq!(chats.len(), 3);
    for (i, chat) in chats.iter().enumerate() {
        assert_eq!(chat.headers["authorization"], "Bearer sk-sdk-test");
        let sent: serde_json::Value = serde_json::from_slice(&chat.body).unwrap();
        let forwarded = sent["messages"].as_array().unwrap().len();
        assert!(forwarded <= messages.len(), "request {i}");
        if i > 0 {
            assert!(forwarded < messages.len(), "request {i} was compacted");
        }
    }
}
