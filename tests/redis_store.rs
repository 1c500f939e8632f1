//! Shared sessions on a real `redis-server` (started here on a free port): replicas on
//! one Redis forward what one process forwards, summarize each range once, keep
//! answering while Redis is down, frozen or restarted, and never trust a value of
//! another schema version.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::agent::{chat_config, chat_request};
use common::redis_server::RedisServer;
use common::redis_sharing::*;
use common::*;
use foldgate::compaction::SessionState;
use foldgate::config::SecretUrl;
use foldgate::session::{
    LearnedStore, LeaseStore, RedisOptions, RedisStore, Saved, SessionKey, StateStore,
};
use http::StatusCode;

/// Every key foldgate wrote, checked to be prefixed hashes (no session id, no credential).
async fn keys(redis: &RedisServer) -> Vec<String> {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    for key in &keys {
        let tagged = key.starts_with("foldgate:{");
        assert!(tagged && (key.ends_with("}:s") || key.ends_with("}:l")), "{key}");
        assert!(!key.contains(SESSION) && !key.contains("sk-redis"), "{key}");
    }
    keys
}

fn counter(metrics: &str, name: &str, op: &str) -> f64 {
    let prefix = format!("{name}{{op=\"{op}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0.0, |v| v.trim().parse().unwrap())
}

async fn metrics(proxy: &Proxy) -> String {
    let (_, _, body) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_forward_what_one_process_forwards() {
    let Some(redis) = RedisServer::start() else { return };
    let bodies = long_session();
    assert!(bodies.len() > 40);

    // One process, sessions in memory.
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let mut single = chat_config(&mock.url());
    single.compaction.max_context_tokens = Some(16_000);
    let one = Proxy::start(single).await;
    converse(&[&one], &mock, &bodies).await;
    let expected = mock.forwarded_bodies();
    let expected_summaries = summaries(&mock).len();
    assert!(expected_summaries >= 2, "the session was folded ({expected_summaries} digests)");

    // Two replicas on one Redis, requests alternating between them.
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let a = Proxy::start(replica(&mock.url(), &redis.url())).await;
    let b = Proxy::start(replica(&mock.url(), &redis.url())).await;
    converse(&[&a, &b], &mock, &bodies).await;
    let forwarded = mock.forwarded_bodies();
    assert_eq!(forwarded.len(), expected.len());
    for (i, (got, want)) in forwarded.iter().zip(&expected).enumerate() {
        assert!(got == want, "request {i}: the replicas forwarded other bytes than one process");
    }
    let digests = summaries(&mock);
    assert_eq!(digests.len(), expected_summaries, "one summarizer call per fold");

    let keys = keys(&redis).await;
    assert_eq!(keys.len(), 1, "one conversation stored, no lease left behind: {keys:?}");
    let mut conn = redis.connection().await;
    let stored: usize =
        redis::cmd("HSTRLEN").arg(&keys[0]).arg("state").query_async(&mut conn).await.unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query_async(&mut conn).await.unwrap();
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "expires session.ttl after last use: {ttl} ms");
    println!("state of a {}-message conversation: {stored} bytes", bodies.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_two_replicas_summarize_each_range_once() {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start(provider(Duration::from_millis(600))).await;
    let a = Proxy::start(replica(&mock.url(), &redis.url())).await;
    let b = Proxy::start(replica(&mock.url(), &redis.url())).await;
    let bodies = long_session();
    // The first request past the trigger: its fold needs a digest.
    let body = bodies[bodies.len() * 3 / 4].clone();

    let started = Instant::now();
    let requests = (0..6).map(|i| {
        let proxy = if i % 2 == 0 { &a } else { &b };
        send(chat_request(proxy, body.clone(), CREDENTIAL, SESSION))
    });
    for (status, headers, _) in futures_util::future::join_all(requests).await {
        assert_eq!(status, StatusCode::OK);
        assert!(headers.contains_key("x-foldgate-tier"), "compaction ran: {headers:?}");
    }
    settle(&mock).await;
    // The summarizer takes 600 ms: let the last fold land.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let digests = summaries(&mock);
    assert!(!digests.is_empty());
    let mut distinct = digests.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), digests.len(), "a range was summarized twice");
    assert!(started.elapsed() < Duration::from_secs(10));

    // Both replicas now forward the stored fold, without another summarizer call.
    let calls = digests.len();
    for proxy in [&a, &b] {
        let (status, _, _) = send(chat_request(proxy, body.clone(), CREDENTIAL, SESSION)).await;
        assert_eq!(status, StatusCode::OK);
    }
    let forwarded = mock.forwarded_bodies();
    let (last_a, last_b) = (&forwarded[forwarded.len() - 2], &forwarded[forwarded.len() - 1]);
    assert!(last_a == last_b, "both replicas forward the same bytes");
    assert!(String::from_utf8_lossy(last_a).contains("I read the modules (range"));
    assert_eq!(summaries(&mock).len(), calls, "the stored fold was reused");
    assert!(keys(&redis).await.iter().all(|k| k.ends_with("}:s")), "leases released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_answered_while_redis_is_down_and_sharing_resumes_after_a_restart() {
    let Some(mut redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let mut config = replica(&mock.url(), &redis.url());
    config.session.redis_timeout = Duration::from_millis(150);
    let a = Proxy::start(config.clone()).await;
    let b = Proxy::start(config).await;
    let bodies = long_session();
    let third = bodies.len() / 3;

    converse(&[&a, &b], &mock, &bodies[..third]).await;
    assert_eq!(keys(&redis).await.len(), 1);

    // Killed: every request is still answered, quickly, and the failures are counted.
    redis.kill();
    for (i, body) in bodies[third..2 * third].iter().enumerate() {
        let proxy = if i % 2 == 0 { &a } else { &b };
        let started = Instant::now();
        let (status, _, _) = send(chat_request(proxy, body.clone(), CREDENTIAL, SESSION)).await;
        assert_eq!(status, StatusCode::OK, "request {i} while Redis is down");
        assert!(started.elapsed() < Duration::from_secs(2), "request {i} waited for Redis");
    }
    let errors = counter(&metrics(&a).await, "foldgate_session_store_errors_total", "load");
    assert!(errors >= 1.0, "store errors are counted: {errors}");

    // Restarted (empty): once the store retries, conversations are shared again.
    redis.restart();
    tokio::time::sleep(foldgate::session::redis::PROBE_INTERVAL * 3).await;
    let rest = &bodies[2 * third..];
    let (status, _, _) = send(chat_request(&a, rest[0].clone(), CREDENTIAL, SESSION)).await;
    assert_eq!(status, StatusCode::OK);
    settle(&mock).await;
    assert_eq!(keys(&redis).await.len(), 1, "A stored the conversation in the new Redis");
    // B, which has seen none of this since the restart, forwards the fold A made.
    let (status, _, _) = send(chat_request(&b, rest[1].clone(), CREDENTIAL, SESSION)).await;
    assert_eq!(status, StatusCode::OK);
    let forwarded = mock.forwarded_bodies();
    let last = String::from_utf8_lossy(&forwarded[forwarded.len() - 1]).into_owned();
    assert!(last.contains("I read the modules (range"), "B applied the fold A stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_or_absent_redis_costs_at_most_the_operation_timeout() {
    let Some(redis) = RedisServer::start() else { return };
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let mut config = replica(&mock.url(), &redis.url());
    config.session.redis_timeout = Duration::from_millis(100);
    let proxy = Proxy::start(config.clone()).await;
    let bodies = long_session();
    let body = bodies[bodies.len() / 2].clone();
    let (status, _, _) = send(chat_request(&proxy, body.clone(), CREDENTIAL, SESSION)).await;
    assert_eq!(status, StatusCode::OK);

    // Frozen: connections stay open, nothing answers.
    redis.freeze();
    for i in 0..5 {
        let started = Instant::now();
        let (status, _, _) = send(chat_request(&proxy, body.clone(), CREDENTIAL, SESSION)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "request {i}: {:?}",
            started.elapsed()
        );
    }
    redis.thaw();

    // Nothing listening at all, from start-up.

    config.session.redis_url = SecretUrl::new(format!("redis://127.0.0.1:{}", free_port()));
    let orphan = Proxy::start(config).await;
    for i in 0..3 {
        let started = Instant::now();
        let (status, _, _) = send(chat_request(&orphan, body.clone(), CREDENTIAL, SESSION)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "request {i}: {:?}",
            started.elapsed()
        );
    }
    let text = metrics(&orphan).await;
    assert!(counter(&text, "foldgate_session_store_errors_total", "load") >= 1.0, "{text}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn store(redis: &RedisServer) -> RedisStore<SessionState> {
    RedisStore::new(&RedisOptions {
        urls: vec![redis.url()],
        mode: foldgate::config::RedisMode::Standalone,
        sentinel_master: String::new(),
        key_prefix: "foldgate:".to_owned(),
        ttl: Duration::from_secs(60),
        timeout: Duration::from_secs(1),
        max_sessions: 100,
    })
    .unwrap()
}

#[tokio::test]
async fn a_value_of_another_schema_version_is_ignored_and_replaced() {
    let Some(redis) = RedisServer::start() else { return };
    let store = store(&redis);
    let key = SessionKey::from_digest("00ff");
    let mut conn = redis.connection().await;
    // What a later release might write: another version, a layout this one cannot read.
    let _: () = redis::cmd("HSET")
        .arg("foldgate:{00ff}:s")
        .arg("v")
        .arg("999")
        .arg("rev")
        .arg("7")
        .arg("state")
        .arg(r#"{"blocks":"a layout of the future"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(store.load(&key).await.unwrap().is_none(), "another version reads as absent");
    assert_eq!(store.save(&key, SessionState::default(), 0).await.unwrap(), Saved::Written);
    let loaded = store.load(&key).await.unwrap().expect("our own value reads back");
    assert_eq!(loaded.revision, 8, "revisions keep increasing across versions");
    let version: String =
        redis::cmd("HGET").arg("foldgate:{00ff}:s").arg("v").query_async(&mut conn).await.unwrap();
    assert_eq!(version, "1");

    // Our version, unreadable: never trusted, replaced by the next save.
    let _: () = redis::cmd("HSET")
        .arg("foldgate:{00ff}:s")
        .arg("state")
        .arg("{not json")
        .query_async(&mut conn)
        .await
        .unwrap();
    let loaded = store.load(&key).await.unwrap().unwrap();
    assert!(loaded.state.blocks.is_empty());
    assert_eq!(
        store.save(&key, SessionState::default(), loaded.revision).await.unwrap(),
        Saved::Written
    );
}

#[tokio::test]
async fn saves_compare_and_swap_and_leases_expire() {
    let Some(redis) = RedisServer::start() else { return };
    let store = store(&redis);
    let key = SessionKey::from_digest("abcd");
    assert_eq!(store.save(&key, SessionState::default(), 0).await.unwrap(), Saved::Written);
    assert_eq!(store.save(&key, SessionState::default(), 0).await.unwrap(), Saved::Conflict);
    let loaded = store.load(&key).await.unwrap().unwrap();
    assert_eq!(loaded.revision, 1);
    assert_eq!(store.save(&key, SessionState::default(), 1).await.unwrap(), Saved::Written);
    assert_eq!(store.save(&key, SessionState::default(), 1).await.unwrap(), Saved::Conflict);

    let ttl = Duration::from_millis(300);
    let lease = store.try_lease(&key, ttl).await.unwrap().expect("free");
    assert!(store.try_lease(&key, ttl).await.unwrap().is_none(), "held");
    let stranger = foldgate::session::Lease { token: "not-the-holder".to_owned() };
    store.release(&key, stranger).await.unwrap();
    assert!(store.try_lease(&key, ttl).await.unwrap().is_none(), "only the holder releases");
    store.release(&key, lease).await.unwrap();
    let dead = store.try_lease(&key, ttl).await.unwrap().expect("released");
    drop(dead); // its holder died without releasing it
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert!(store.try_lease(&key, ttl).await.unwrap().is_some(), "a lease expires by itself");
}

#[tokio::test]
async fn learned_windows_are_shared_through_redis() {
    let Some(redis) = RedisServer::start() else { return };
    let (a, b) = (store(&redis), store(&redis));
    assert!(b.load_windows().await.unwrap().is_empty());
    a.save_window("api.openai.com/v1|gpt-4o", 16_000).await.unwrap();
    assert_eq!(b.load_windows().await.unwrap(), [("api.openai.com/v1|gpt-4o".to_owned(), 16_000)]);
    let mut conn = redis.connection().await;
    let ttl: i64 = redis::cmd("PTTL").arg("foldgate:windows").query_async(&mut conn).await.unwrap();
    assert!(ttl > 0, "the windows expire: {ttl}");
}
