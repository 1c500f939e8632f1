//! Generated requests through a running foldgate in front of a mock upstream: bodies of
//! every API shape with fields of any JSON type, bodies cut short, bytes that are not
//! JSON, and headers of any value on every compacted route. Every answer is the
//! upstream's (marked by the mock) or a well-formed JSON error of foldgate's; none takes
//! longer than a few seconds, and the server answers throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::agent::chat_config;
use common::*;
use http::{HeaderValue, Method};
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};

/// The mock's mark on every answer it gives.
const MARK: &str = "x-mock-upstream";

fn upstream() -> Handler {
    Arc::new(|_rec: Recorded| {
        Box::pin(async move {
            let body = r#"{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
            let mut r = response(200, body);
            r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
            r.headers_mut().insert(MARK, HeaderValue::from_static("1"));
            r
        })
    })
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "user",
            "assistant",
            "tool",
            "system",
            "developer",
            "function_call",
            "message",
            "tool_use",
            "thinking",
            "reasoning",
            "compaction",
            "input_text"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "role",
                        "content",
                        "type",
                        "text",
                        "id",
                        "call_id",
                        "tool_call_id",
                        "tool_calls",
                        "output",
                        "name",
                        "arguments",
                        "input",
                        "encrypted_content",
                        "signature"
                    ]),
                    inner
                ),
                0..4
            )
            .prop_map(|pairs| Value::Object(
                pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

/// A body of one of the three shapes, each field of any type, maybe cut short or not JSON.
fn body() -> BoxedStrategy<Vec<u8>> {
    let list = prop::collection::vec(any_json(), 0..6);
    let shaped = (
        prop::sample::select(vec!["messages", "input"]),
        list,
        any_json(),
        any_json(),
        any::<bool>(),
        prop::option::of(any_json()),
    )
        .prop_map(|(key, items, model, extra, stream, context)| {
            let mut body =
                json!({"model": model, key: items, "max_tokens": extra, "stream": stream});
            if let Some(context) = context {
                body["context_management"] = context;
            }
            serde_json::to_vec(&body).unwrap()
        })
        .boxed();
    let realistic = (1usize..60, any::<bool>()).prop_map(|(n, stream)| {
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        for i in 0..n {
            messages.push(json!({"role": "user", "content": format!("step {i} ").repeat(40)}));
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "out ".repeat(300)}));
        }
        serde_json::to_vec(&json!({"model": "gpt-4o", "messages": messages, "stream": stream})).unwrap()
    })
    .boxed();
    prop_oneof![
        4 => shaped.clone(),
        2 => realistic.clone(),
        2 => (shaped, any::<prop::sample::Index>()).prop_map(|(b, at)| b[..at.index(b.len() + 1)].to_vec()),
        1 => (realistic, any::<prop::sample::Index>()).prop_map(|(b, at)| b[..at.index(b.len() + 1)].to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
    ]
    .boxed()
}

/// One generated request: route, body, headers.
#[derive(Debug, Clone)]
struct Generated {
    path: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, Vec<u8>)>,
}

fn request() -> impl Strategy<Value = Generated> {
    let path = prop::sample::select(vec![
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/responses/compact",
        "/v1/messages",
        "/v1/completions",
    ]);
    let header = (
        prop::sample::select(vec![
            "x-session-id",
            "authorization",
            "x-api-key",
            "anthropic-beta",
            "content-type",
            "traceparent",
            "accept-encoding",
            "x-foldgate-summary",
        ]),
        prop::collection::vec(0x20u8..0x7f, 0..40),
    );
    (path, body(), prop::collection::vec(header, 0..4))
        .prop_map(|(path, body, headers)| Generated { path, body, headers })
}

/// Sends `generated`; panics unless the answer is the upstream's or a JSON error.
async fn check(proxy: &Proxy, generated: &Generated) {
    let mut builder = http::Request::builder().method(Method::POST).uri(proxy.url(generated.path));
    for (name, value) in &generated.headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            builder = builder.header(*name, value);
        }
    }
    let request = builder.body(full(Bytes::from(generated.body.clone()))).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), send(request)).await;
    let (status, headers, body) =
        answer.unwrap_or_else(|_| panic!("no answer within 20 s: {generated:?}"));
    if headers.contains_key(MARK) {
        return;
    }
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status} not from the upstream: {generated:?}"
    );
    let error: Value = serde_json::from_slice(&body).unwrap_or_else(|_| {
        panic!("{status}: not JSON: {:?} for {generated:?}", String::from_utf8_lossy(&body))
    });
    assert!(error["error"]["message"].is_string(), "{status}: {error} for {generated:?}");
    assert!(error["error"]["type"].is_string(), "{status}: {error} for {generated:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_get_the_upstream_s_answer_or_a_clear_error() {
    let mock = MockUpstream::start(upstream()).await;
    let mut config = chat_config(&mock.url());
    config.compaction.max_context_tokens = Some(4_000);
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let proxy = Proxy::start(config).await;
    // 256 per run; `HOSTILE_CASES=N` for a longer search.
    let cases = std::env::var("HOSTILE_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256);
    let mut runner = TestRunner::new(ProptestConfig { cases, ..ProptestConfig::default() });
    let tree_values: Vec<Generated> =
        (0..cases).map(|_| request().new_tree(&mut runner).unwrap().current()).collect();
    for generated in &tree_values {
        check(&proxy, generated).await;
    }
    // Still serving, and it did forward a share of them.
    let (status, _, _) = send(
        http::Request::post(proxy.url("/v1/chat/completions"))
            .body(full(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#))
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let forwarded = mock.recorded().len();
    println!("{cases} generated requests, {forwarded} reached the upstream");
    assert!(forwarded > cases as usize / 4, "{forwarded} of {cases} reached the upstream");
}
