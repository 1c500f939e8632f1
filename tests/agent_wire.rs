//! What today's agents put on the wire, read as they send it: compressed request bodies
//! (Codex sends zstd), the Responses API's WebSocket handshake (answered 426 so that the
//! client uses HTTP at once), and the headers and fields that name a conversation
//! (Codex's `thread-id` / `session-id`, Claude Code's `metadata.user_id`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::Write;

use bytes::Bytes;
use common::responses_api::{body_of, responses_provider, session_items};
use common::{MockUpstream, Proxy, TestBody, config_for, full, json, send};
use foldgate::model::DIGEST_MARKER;
use http::{HeaderMap, Request};
use serde_json::json;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
    e.write_all(data).unwrap();
    drop(e);
    out
}

/// An encoder of one content coding.
type Encoder = fn(&[u8]) -> Vec<u8>;

/// The encoders of every coding foldgate reads, by their `Content-Encoding` name.
const CODINGS: [(&str, Encoder); 4] =
    [("zstd", zstd), ("gzip", gzip), ("deflate", deflate), ("br", brotli)];

fn responses_config(upstream: &str) -> foldgate::config::Config {
    let mut config = config_for(upstream);
    config.compaction.max_context_tokens = Some(12_000);
    config.summarizer.kind = foldgate::config::SummarizerKind::Extractive;
    config
}

fn post_encoded(proxy: &Proxy, path: &str, encoding: &str, body: Vec<u8>) -> Request<TestBody> {
    Request::post(proxy.url(path))
        .header("authorization", "Bearer sk-wire")
        .header("content-type", "application/json")
        .header("content-encoding", encoding)
        .body(full(body))
        .unwrap()
}

async fn metrics_text(proxy: &Proxy) -> String {
    let (_, _, text) = send(Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    String::from_utf8(text.to_vec()).unwrap()
}

#[tokio::test]
async fn compressed_conversations_are_read_compacted_and_forwarded_identity_encoded() {
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let long = body_of(&session_items(40), &[]);
    for (name, encode) in CODINGS {
        let (status, headers, _) =
            send(post_encoded(&proxy, "/v1/responses", name, encode(&long))).await;
        assert_eq!(status, 200, "{name}");
        assert_eq!(headers["x-foldgate-outcome"], "compacted", "{name}");
        let forwarded = mock.forwarded().pop().unwrap();
        // The model reads what it gets: plain JSON, its headers saying so.
        assert!(!forwarded.headers.contains_key("content-encoding"), "{name}");
        assert_eq!(forwarded.headers["content-length"], forwarded.body.len().to_string().as_str());
        let body = json(&forwarded.body);
        assert_eq!(body["model"], "gpt-4.1");
        let input = body["input"].as_array().unwrap();
        assert!(input.len() < session_items(40).len(), "{name}: folded");
        assert!(
            input.iter().any(|i| i["content"]
                .as_str()
                .is_some_and(|t| t.starts_with(DIGEST_MARKER))
                || i["content"][0]["text"].as_str().is_some_and(|t| t.starts_with(DIGEST_MARKER))),
            "{name}: a digest in place of the old work"
        );
    }
    // Below the trigger, the body goes as it came: compressed, its header kept.
    let small = body_of(&session_items(2), &[]);
    for (name, encode) in CODINGS {
        let sent = encode(&small);
        let (status, headers, _) =
            send(post_encoded(&proxy, "/v1/responses", name, sent.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-foldgate-outcome"], "passthrough", "{name}");
        let forwarded = mock.forwarded().pop().unwrap();
        assert_eq!(forwarded.body, sent, "{name}: forwarded as received");
        assert_eq!(forwarded.headers["content-encoding"], name);
    }
    let text = metrics_text(&proxy).await;
    for (name, _) in CODINGS {
        let line = format!(
            r#"foldgate_encoded_request_bodies_total{{encoding="{name}",result="decoded"}} 2"#
        );
        assert!(text.contains(&line), "{line}\n{text}");
    }
}

#[tokio::test]
async fn a_body_foldgate_cannot_decode_is_forwarded_as_received_and_counted() {
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let long = body_of(&session_items(40), &[]);
    let not_gzip = b"\x1f\x8b\x08 this is not a gzip stream".to_vec();
    for (encoding, body) in [("compress", long.to_vec()), ("gzip", not_gzip)] {
        let (status, _, _) =
            send(post_encoded(&proxy, "/v1/chat/completions", encoding, body.clone())).await;
        assert_eq!(status, 200);
        let forwarded = mock.forwarded().pop().unwrap();
        assert_eq!(forwarded.body, body, "{encoding}: as received");
        assert_eq!(forwarded.headers["content-encoding"], encoding);
    }
    let text = metrics_text(&proxy).await;
    for line in [
        r#"foldgate_encoded_request_bodies_total{encoding="unknown",result="unreadable"} 1"#,
        r#"foldgate_encoded_request_bodies_total{encoding="gzip",result="unreadable"} 1"#,
        r#"foldgate_chat_requests_total{outcome="not_chat",route="chat_completions"} 2"#,
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// The peak resident memory of process `pid` in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// About `target` bytes of `encode`'s output that decode to far more: one chunk of
/// 64 MiB of zeros encoded once, its member (or frame) repeated.
fn bomb(encode: Encoder, target: usize) -> Vec<u8> {
    let member = encode(&vec![0u8; 64 << 20]);
    member.repeat(target / member.len() + 1)
}

#[test]
fn a_decompression_bomb_gets_a_413_and_memory_stays_bounded() {
    // The upstream is never reached: the bodies are refused first.
    let (mut child, addr, logs) = common::binary::spawn_serve("http://127.0.0.1:9/v1", &[]);
    let before = peak_rss_kib(child.id());
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (name, encode) in [("gzip", gzip as Encoder), ("zstd", zstd)] {
        let body = bomb(encode, 10 << 20);
        assert!(body.len() >= 10 << 20 && body.len() < 12 << 20, "{name}: {}", body.len());
        let request = Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("content-encoding", name)
            .body(full(body))
            .unwrap();
        let (status, headers, answer) = rt.block_on(send(request));
        assert_eq!(status, 413, "{name}");
        assert_eq!(headers["content-type"], "application/json");
        let error = json(&answer);
        assert_eq!(error["error"]["code"], "request_too_large");
        assert!(error["error"]["message"].as_str().unwrap().contains("decoded"), "{error}");
    }
    // The default limit is 32 MiB: the bodies (10 MiB each) and what was decoded (at most
    // the limit) are what the process held, never the gigabytes the bombs decode to.
    let after = peak_rss_kib(child.id());
    assert!(after < before + 160 * 1024, "peak RSS {before} KiB -> {after} KiB");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(logs);
}

#[tokio::test]
async fn with_the_websocket_mode_off_an_upgrade_is_answered_426_without_asking_the_upstream() {
    let mock = MockUpstream::echo().await;
    // `responses.websocket = "off"`: the mode is not served.
    let mut config = config_for(&mock.url());
    config.responses.websocket = foldgate::config::WebSocketMode::Off;
    let proxy = Proxy::start(config).await;
    let upgrade = Request::get(proxy.url("/v1/responses"))
        .header("authorization", "Bearer sk-wire")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("openai-beta", "responses_websockets=2026-02-06")
        .body(full(""))
        .unwrap();
    let (status, headers, body) = send(upgrade).await;
    assert_eq!(status, 426);
    assert_eq!(headers["content-type"], "application/json");
    let error = json(&body);
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"].as_str().unwrap().contains("HTTP"), "{error}");
    assert!(mock.recorded().is_empty(), "the upstream is not asked");
    // Other requests of the API go on as before.
    let (status, _, _) =
        send(Request::get(proxy.url("/v1/responses/resp_1")).body(full("")).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(mock.recorded().len(), 1);
}

/// The `x-foldgate-session` foldgate gives a request of `path` with `headers` and `body`.
async fn session_of(proxy: &Proxy, path: &str, headers: &[(&str, &str)], body: Bytes) -> String {
    let mut request = Request::post(proxy.url(path))
        .header("authorization", "Bearer sk-wire")
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (status, answer, _) = send(request.body(full(body)).unwrap()).await;
    assert_eq!(status, 200);
    session(&answer)
}

fn session(headers: &HeaderMap) -> String {
    headers["x-foldgate-session"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn codex_conversations_are_named_by_its_headers_by_default() {
    let mock = MockUpstream::start(responses_provider()).await;
    let proxy = Proxy::start(responses_config(&mock.url())).await;
    let codex =
        |rounds: usize| body_of(&session_items(rounds)[1..], &[("model", json!("gpt-5-codex"))]);
    for header in ["thread-id", "session-id"] {
        // One agent's requests, small and large: one conversation.
        let a = session_of(&proxy, "/v1/responses", &[(header, "019a-a")], codex(2)).await;
        assert_eq!(a, session_of(&proxy, "/v1/responses", &[(header, "019a-a")], codex(40)).await);
        // Two agents started in one repository: the same first messages, two conversations.
        let b = session_of(&proxy, "/v1/responses", &[(header, "019a-b")], codex(2)).await;
        assert_ne!(a, b, "{header}");
        assert_eq!(b, session_of(&proxy, "/v1/responses", &[(header, "019a-b")], codex(40)).await);
    }
    // Both headers, as Codex sends them: the thread names it.
    let both = [("session-id", "s-1"), ("thread-id", "t-1")];
    assert_eq!(
        session_of(&proxy, "/v1/responses", &both, codex(2)).await,
        session_of(&proxy, "/v1/responses", &[("thread-id", "t-1")], codex(2)).await
    );
    // Without headers, `prompt_cache_key` tells them apart.
    let keyed = |key: &str| {
        body_of(
            &session_items(2)[1..],
            &[("model", json!("gpt-5-codex")), ("prompt_cache_key", json!(key))],
        )
    };
    let a = session_of(&proxy, "/v1/responses", &[], keyed("019a-a")).await;
    assert_eq!(a, session_of(&proxy, "/v1/responses", &[], keyed("019a-a")).await);
    assert_ne!(a, session_of(&proxy, "/v1/responses", &[], keyed("019a-b")).await);
}

#[tokio::test]
async fn claude_code_conversations_are_named_by_the_session_in_its_user_id() {
    let mock = MockUpstream::echo().await;
    let mut config = config_for(&mock.url());
    config.upstream.anthropic_url = format!("http://{}", mock.addr);
    let proxy = Proxy::start(config).await;
    let body = |session: &str, device: &str, turns: usize| {
        let user_id = json!({"device_id": device, "account_uuid": "", "session_id": session});
        let mut messages = vec![json!({"role": "user", "content": "Fix the parser bug."})];
        for turn in 0..turns {
            messages.push(json!({"role": "assistant", "content": format!("step {turn}")}));
            messages.push(json!({"role": "user", "content": format!("go on {turn}")}));
        }
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "metadata": {"user_id": user_id.to_string()}, "messages": messages});
        Bytes::from(body.to_string())
    };
    let path = "/v1/messages";
    let a = session_of(&proxy, path, &[], body("s-a", "dev", 0)).await;
    assert_eq!(a, session_of(&proxy, path, &[], body("s-a", "dev", 5)).await);
    assert_eq!(a, session_of(&proxy, path, &[], body("s-a", "other-device", 5)).await);
    let b = session_of(&proxy, path, &[], body("s-b", "dev", 0)).await;
    assert_ne!(a, b, "two sessions in one repository: two conversations");
}

#[tokio::test]
async fn session_header_takes_a_list_looked_up_in_order() {
    let mock = MockUpstream::echo().await;
    let env = [("FOLDGATE_SESSION__HEADER".to_owned(), "x-conversation, x-session-id".to_owned())];
    let config = foldgate::config::Config::from_toml_str("", "test", &env).unwrap();
    assert_eq!(config.session.header.names(), ["x-conversation", "x-session-id"]);
    let listed = foldgate::config::Config::from_toml_str(
        "[session]\nheader = [\"X-Conversation\", \"thread-id\"]\n",
        "test",
        &[],
    )
    .unwrap();
    assert_eq!(listed.session.header.names(), ["x-conversation", "thread-id"]);
    for bad in ["[session]\nheader = \"bad header\"\n", "[session]\nheader = []\n"] {
        let error =
            foldgate::config::Config::from_toml_str(bad, "test", &[]).unwrap_err().to_string();
        assert!(error.contains("session.header"), "{error}");
    }
    let mut config = config;
    config.upstream.url = mock.url();
    let proxy = Proxy::start(config).await;
    let chat = |first: &str| {
        Bytes::from(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": first}]})
                .to_string(),
        )
    };
    let path = "/v1/chat/completions";
    let named = [("x-conversation", "c1"), ("x-session-id", "other")];
    let a = session_of(&proxy, path, &named, chat("one")).await;
    assert_eq!(a, session_of(&proxy, path, &[("x-conversation", "c1")], chat("two")).await);
    // Codex's headers are not in this list: the fingerprint names the conversation.
    let plain = session_of(&proxy, path, &[], chat("one")).await;
    assert_eq!(plain, session_of(&proxy, path, &[("thread-id", "t")], chat("one")).await);
}
