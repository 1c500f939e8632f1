//! The session inspector's API: the operator's (`admin.listen`, behind `admin.token`)
//! and each tenant's own under the proxy port (`/foldgate/sessions`, behind its API key),
//! over a long compacted conversation, with the memory store and with a real Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent::{ProviderStats, chat_config, chat_request, conversation, provider, requests};
use common::redis_server::RedisServer;
use common::*;
use foldgate::config::{Config, Secret, SecretUrl, StoreKind};
use http::{Method, StatusCode};
use serde_json::Value;

const TOKEN: &str = "admin-secret-token";
const ALICE: &str = "Bearer sk-alice";
const BOB: &str = "Bearer sk-bob";

fn inspected(upstream: &str) -> Config {
    let mut config = chat_config(upstream);
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Secret::new(TOKEN);
    config
}

/// A request to the inspection listener, with `token` as a bearer token when given.
async fn admin(
    proxy: &Proxy,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let url = format!("http://{}{path}", proxy.admin_addr.unwrap());
    let mut request = http::Request::builder().method(method).uri(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (status, _, body) = send(request.body(full("")).unwrap()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A tenant's request to its view on the proxy port.
async fn tenant(proxy: &Proxy, path: &str, credential: Option<&str>) -> (StatusCode, Value) {
    let mut request = http::Request::get(proxy.url(path));
    if let Some(credential) = credential {
        request = request.header("authorization", credential);
    }
    let (status, _, body) = send(request.body(full("")).unwrap()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Sends `bodies` as one conversation; returns its session key.
async fn converse(proxy: &Proxy, bodies: &[Bytes], credential: &str, session: &str) -> String {
    let mut key = String::new();
    for (i, body) in bodies.iter().enumerate() {
        let (status, headers, _) =
            send(chat_request(proxy, body.clone(), credential, session)).await;
        assert_eq!(status, StatusCode::OK, "request {i}");
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
    }
    key
}

/// The session `key` once its record holds `requests` requests (a Redis store writes
/// records in the background).
async fn settled(proxy: &Proxy, key: &str, requests: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, session) =
            admin(proxy, Method::GET, &format!("/sessions/{key}"), Some(TOKEN)).await;
        if status == StatusCode::OK && session["requests"] == requests {
            return session;
        }
        assert!(Instant::now() < deadline, "{key}: {status} {session}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no summarizer call has started for a while (background folds landed).
async fn quiet(stats: &ProviderStats) {
    let mut seen = stats.summaries.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let now = stats.summaries.load(Ordering::SeqCst);
        if now == seen {
            return;
        }
        seen = now;
    }
}

fn keys(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_owned())
        .collect()
}

/// The whole API over one store configuration.
async fn the_api_shows_scopes_and_forgets_sessions(
    config: Config,
    mock: &MockUpstream,
    stats: Arc<ProviderStats>,
) {
    let proxy = Proxy::start(config).await;
    let long = requests(&conversation(40, 4), &[]);
    let short = requests(&conversation(3, 0), &[]);
    let alice = converse(&proxy, &long, ALICE, "alice-1").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let bob = converse(&proxy, &short, BOB, "bob-1").await;
    let session = settled(&proxy, &alice, long.len() as u64).await;
    settled(&proxy, &bob, short.len() as u64).await;

    // The operator's API: the token is required and checked.
    assert_eq!(admin(&proxy, Method::GET, "/sessions", None).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = admin(&proxy, Method::GET, "/sessions", Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.to_string().contains(TOKEN), "{body}");
    let path = format!("/sessions/{alice}");
    assert_eq!(admin(&proxy, Method::GET, &path, Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&proxy, Method::DELETE, &path, None).await.0, StatusCode::UNAUTHORIZED);
    let (status, list) = admin(&proxy, Method::GET, "/sessions", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    let mut listed = keys(&list);
    listed.sort();
    let mut expected = vec![alice.clone(), bob.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    let first = &list["sessions"][0];
    assert_eq!(first["key"], bob, "most recently seen first");
    assert_eq!(first["model"], "gpt-4o");

    // One session: every request, the folds with their digests, the tiers.
    assert_eq!(session["recent"].as_array().unwrap().len(), long.len(), "{session}");
    assert!(session["folds"].as_u64().unwrap() >= 1, "{session}");
    let blocks = session["blocks"].as_array().unwrap();
    assert!(!blocks.is_empty(), "{session}");
    assert_eq!(blocks[0]["start"], 0);
    for block in blocks {
        assert!(block["end"].as_u64() > block["start"].as_u64(), "{block}");
        assert!(block["digest"].as_str().unwrap().contains("I read the modules"), "{block}");
        assert_eq!(block["summarizer"], "llm");
        // The work trail up to the fold: the files the agent's read_file calls read.
        let trail = block["trail"].as_array().unwrap();
        assert!(trail.iter().any(|l| l == "- read: src/module_0.rs"), "{block}");
    }
    assert!(blocks.iter().any(|b| b["folded_at"].as_u64().is_some()), "{session}");
    let tiers: u64 = session["tiers"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).sum();
    assert_eq!(tiers, long.len() as u64);
    let recent = session["recent"].as_array().unwrap();
    assert!(recent.iter().any(|r| r["outcome"] == "compacted"));
    assert!(recent.iter().all(|r| r["tokens_after"].as_u64() <= r["tokens_before"].as_u64()));
    assert_eq!(recent.last().unwrap()["n"], long.len());
    // Why each got its tier; the changes of the last ten, each a stored fold or a new one.
    assert!(recent.iter().all(|r| !r["why"].as_str().unwrap().is_empty()), "{session}");
    let (older, last) = recent.split_at(recent.len() - 10);
    assert!(older.iter().all(|r| r.get("changes").is_none()), "{session}");
    assert!(last.iter().all(|r| r["changes"].is_array()), "{session}");
    let folded =
        last.iter().flat_map(|r| r["changes"].as_array().unwrap()).find(|c| c["kind"] == "folded");
    let folded = folded.unwrap_or_else(|| panic!("a fold among the last changes: {session}"));
    assert!(folded["tokens_after"].as_u64() < folded["tokens_before"].as_u64(), "{folded}");
    assert!(folded["text"].as_str().unwrap().contains("I read the modules"), "{folded}");
    // The usage the upstream reported, recorded with each request once its answer ended.
    assert!(recent.iter().all(|r| r["usage"]["prompt"] == 100 && r["usage"]["completion"] == 1));

    // Each tenant sees its own sessions only, and never another's by guessing its key.
    assert_eq!(tenant(&proxy, "/foldgate/sessions", None).await.0, StatusCode::UNAUTHORIZED);
    let (status, own) = tenant(&proxy, "/foldgate/sessions", Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys(&own), [alice.as_str()]);
    assert_eq!(keys(&tenant(&proxy, "/foldgate/sessions", Some(BOB)).await.1), [bob.as_str()]);
    assert!(keys(&tenant(&proxy, "/foldgate/sessions", Some("Bearer sk-eve")).await.1).is_empty());
    let (status, mine) = tenant(&proxy, &format!("/foldgate/sessions/{alice}"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(mine["blocks"], session["blocks"]);
    let (status, theirs) = tenant(&proxy, &format!("/foldgate/sessions/{alice}"), Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{theirs}");
    let (absent, _) =
        tenant(&proxy, &format!("/foldgate/sessions/{}", "0".repeat(32)), Some(BOB)).await;
    assert_eq!(absent, StatusCode::NOT_FOUND, "another's key answers as a key that does not exist");
    let eve = tenant(&proxy, &format!("/foldgate/sessions/{bob}"), Some("Bearer sk-eve")).await;
    assert_eq!(eve.0, StatusCode::NOT_FOUND);
    for bad in ["../x", "*", "ABCDEF"] {
        assert_eq!(
            tenant(&proxy, &format!("/foldgate/sessions/{bad}"), Some(ALICE)).await.0,
            StatusCode::NOT_FOUND
        );
    }

    // Forgetting a session: gone from the API, and its next request is compacted afresh,
    // without the digests of the forgotten folds.
    quiet(&stats).await;
    let digested = |body: &Bytes| String::from_utf8_lossy(body).contains("I read the modules");
    assert!(mock.forwarded_bodies().iter().any(digested), "the folds were forwarded before");
    let (status, _) = admin(&proxy, Method::DELETE, &path, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(admin(&proxy, Method::GET, &path, Some(TOKEN)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin(&proxy, Method::DELETE, &path, Some(TOKEN)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(keys(&admin(&proxy, Method::GET, "/sessions", Some(TOKEN)).await.1), [bob.as_str()]);
    let (status, headers, _) =
        send(chat_request(&proxy, long[long.len() - 1].clone(), ALICE, "alice-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-foldgate-session"], alice.as_str());
    assert_eq!(headers["x-foldgate-outcome"], "compacted");
    let forwarded = mock.forwarded_bodies().pop().unwrap();
    assert!(!digested(&forwarded), "no digest of the forgotten folds is forwarded");
    let afresh = settled(&proxy, &alice, 1).await;
    assert_eq!(afresh["recent"].as_array().unwrap().len(), 1, "{afresh}");
    assert!(afresh["blocks"].as_array().unwrap().is_empty(), "{afresh}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspection_api_with_the_memory_store() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    the_api_shows_scopes_and_forgets_sessions(inspected(&mock.url()), &mock, stats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspection_api_with_the_redis_store() {
    let Some(redis) = RedisServer::start() else { return };
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let mut config = inspected(&mock.url());
    config.session.store = StoreKind::Redis;
    config.session.redis_url = SecretUrl::new(redis.url());
    the_api_shows_scopes_and_forgets_sessions(config, &mock, stats).await;
}

#[tokio::test]
async fn the_inspector_is_off_by_default() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::to(&mock.url()).await;
    assert!(proxy.admin_addr.is_none());
    let (status, _) = tenant(&proxy, "/foldgate/sessions", Some(ALICE)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_history_is_bounded() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let mut config = inspected(&mock.url());
    config.admin.history = 5;
    let proxy = Proxy::start(config).await;
    let bodies = requests(&conversation(12, 0), &[]);
    let key = converse(&proxy, &bodies, ALICE, "bounded").await;
    let session = settled(&proxy, &key, bodies.len() as u64).await;
    let recent = session["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 5);
    assert_eq!(recent[0]["n"], bodies.len() - 4);
}
