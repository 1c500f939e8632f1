//! Shared sessions on the Redis deployments platform teams run: a real Redis Cluster (six
//! `redis-server` processes, three primaries with a replica each) and a real Sentinel
//! setup (a primary, a replica, three `redis-sentinel` processes). Two replicas of
//! foldgate on each forward what one process forwards; a conversation's keys share one
//! hash slot; the primary holding a conversation killed mid-conversation costs no request,
//! and the state is written again once a replica took over.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    missing_docs
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::agent::{chat_config, chat_request};
use common::priced::{Pace, Priced, longest_sessions, send_priced};
use common::redis_server::RedisServer;
use common::redis_sharing::*;
use common::redis_topology::{MASTER, RedisCluster, RedisSentinel, cli};
use common::*;
use foldgate::config::{Config, RedisMode, SecretUrl, StoreKind};
use http::StatusCode;

/// A replica on the deployment at `urls` in `mode`.
fn replica_on(upstream: &str, urls: &str, mode: RedisMode) -> Config {
    let mut config = chat_config(upstream);
    config.compaction.max_context_tokens = Some(16_000);
    config.session.store = StoreKind::Redis;
    config.session.redis_url = SecretUrl::new(urls);
    config.session.redis_mode = mode;
    config.session.redis_sentinel_master = MASTER.to_owned();
    // A cluster answers within milliseconds; a failover takes seconds, past this.
    config.session.redis_timeout = Duration::from_millis(300);
    config
}

/// What one process with sessions in memory forwards for `bodies`.
async fn one_process(bodies: &[Bytes]) -> Vec<Bytes> {
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let mut single = chat_config(&mock.url());
    single.compaction.max_context_tokens = Some(16_000);
    let one = Proxy::start(single).await;
    converse(&[&one], &mock, bodies).await;
    mock.forwarded_bodies()
}

/// Two replicas on `urls` (`mode`) forward what one process forwards for a long
/// conversation alternating between them.
async fn replicas_forward_what_one_process_forwards(urls: &str, mode: RedisMode) {
    let bodies = long_session();
    let expected = one_process(&bodies).await;
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let a = Proxy::start(replica_on(&mock.url(), urls, mode)).await;
    let b = Proxy::start(replica_on(&mock.url(), urls, mode)).await;
    converse(&[&a, &b], &mock, &bodies).await;
    let forwarded = mock.forwarded_bodies();
    assert_eq!(forwarded.len(), expected.len());
    for (i, (got, want)) in forwarded.iter().zip(&expected).enumerate() {
        assert!(got == want, "request {i}: the replicas forwarded other bytes than one process");
    }
    let metrics = metrics_text(&a).await;
    assert!(!metrics.contains("foldgate_session_store_errors_total{op=\"save\"} 1"), "{metrics}");
}

async fn metrics_text(proxy: &Proxy) -> String {
    let (_, _, body) =
        send(http::Request::get(proxy.url("/metrics")).body(full("")).unwrap()).await;
    String::from_utf8(body.to_vec()).unwrap()
}

/// Sends `bodies` alternately to `proxies` under `session`, every answer a 200; the
/// conversation's key (from `x-foldgate-session`).
async fn answered(proxies: &[&Proxy], session: &str, bodies: &[Bytes]) -> String {
    let mut key = String::new();
    for (i, body) in bodies.iter().enumerate() {
        let proxy = proxies[i % proxies.len()];
        let started = std::time::Instant::now();
        let (status, headers, _) =
            send(chat_request(proxy, body.clone(), CREDENTIAL, session)).await;
        assert_eq!(status, StatusCode::OK, "request {i} answered");
        assert!(started.elapsed() < Duration::from_secs(10), "request {i} not held");
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
    }
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_a_redis_cluster_share_conversations_through_a_failover() {
    let Some(mut cluster) = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap() else {
        return;
    };
    replicas_forward_what_one_process_forwards(&cluster.urls(), RedisMode::Cluster).await;

    // Another conversation, concurrent requests on both replicas, inspected.
    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let mut config = replica_on(&mock.url(), &cluster.urls(), RedisMode::Cluster);
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let a = Proxy::start(config.clone()).await;
    let b = Proxy::start(config).await;
    let bodies = long_session();
    let half = bodies.len() / 2;
    let session = "cluster-failover";
    let key = answered(&[&a, &b], session, &bodies[..half]).await;
    let concurrent = (0..4).map(|i| {
        let proxy = if i % 2 == 0 { &a } else { &b };
        send(chat_request(proxy, bodies[half].clone(), CREDENTIAL, session))
    });
    for (status, _, _) in futures_util::future::join_all(concurrent).await {
        assert_eq!(status, StatusCode::OK);
    }
    // Every key of the conversation in one slot.
    let port = cluster.nodes[0].port;
    let slot = |k: &str| cli(port, &["cluster", "keyslot", k]).trim().to_owned();
    let state_key = format!("foldgate:{{{key}}}:s");
    for part in ["l", "m", "r", "f"] {
        assert_eq!(slot(&format!("foldgate:{{{key}}}:{part}")), slot(&state_key));
    }
    let primary = cluster.primary_of(&state_key);
    assert_eq!(cli(primary, &["exists", &state_key]).trim(), "1", "state stored");

    // The primary holding it fails: every request is answered, and once a replica took
    // over the state is written again.
    cluster.kill(primary);
    let rest = &bodies[half + 1..];
    let key_again = answered(&[&a, &b], session, &rest[..rest.len() / 2]).await;
    assert_eq!(key_again, key);
    let healed = state_key.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_failover(&healed, primary);
        cluster
    })
    .await
    .unwrap();
    answered(&[&a, &b], session, &rest[rest.len() / 2..]).await;
    let now = cluster.primary_of(&state_key);
    assert_ne!(now, primary);
    assert_eq!(cli(now, &["exists", &state_key]).trim(), "1", "state written again");
    assert!(failovers(&[&a, &b]).await >= 1.0, "the failover is counted");
    // The operator's list walks every primary; the record is whole on its one node.
    let admin = format!("http://{}/sessions", a.admin_addr.unwrap());
    let (_, _, list) = send(http::Request::get(&admin).body(full("")).unwrap()).await;
    let list = json(&list);
    let keys: Vec<&str> =
        list["sessions"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&key.as_str()), "{list}");
    let detail = format!("{admin}/{key}");
    let (_, _, detail) = send(http::Request::get(&detail).body(full("")).unwrap()).await;
    assert!(json(&detail)["requests"].as_u64().unwrap() >= 5, "recorded on its one node");
}

/// What two replicas on the deployment at `urls` (`mode`) cost for the longest dev
/// sessions sent alternately to them at an agent's pace: the next request does not wait
/// for the background folds of the last (the agent's model answers in about as long as a
/// digest takes to write).
async fn two_replicas_priced(
    urls: &str,
    mode: RedisMode,
    sessions: &[serde_json::Value],
) -> Priced {
    let mock = MockUpstream::start(provider(Duration::from_millis(40))).await;
    let config = replica_on(&mock.url(), urls, mode);
    let a = Proxy::start(config.clone()).await;
    let b = Proxy::start(config.clone()).await;
    let pace = Pace { between: Duration::from_millis(50), after: Duration::from_millis(300) };
    send_priced(&[&a, &b], &mock, sessions, CREDENTIAL, pace, &config).await
}

/// Two replicas on a Redis Cluster cost what two replicas on one Redis cost, for the same
/// conversations in the same order without waiting for background folds: a request that
/// needs the fold another replica is summarizing waits for it, as it would in one
/// process, instead of cutting its prefix now and rewriting it again when the digest
/// lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_a_redis_cluster_cost_what_two_on_one_redis_cost() {
    let Some(cluster) = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap() else {
        return;
    };
    let Some(one) = RedisServer::start() else { return };
    let sessions = longest_sessions(&["mini-swe-agent", "openhands"], 2);
    let single = two_replicas_priced(&one.url(), RedisMode::Standalone, &sessions).await;
    let clustered = two_replicas_priced(&cluster.urls(), RedisMode::Cluster, &sessions).await;
    let (on_one, on_cluster) = (single.cost(0.1), clustered.cost(0.1));
    println!(
        "one Redis: {on_one:.0} ({} rewrites, {} summarizer calls); cluster: {on_cluster:.0} \
         ({} rewrites, {} summarizer calls); {:.4}x; sent whole {:.0}",
        single.rewrites,
        single.summarizer_calls,
        clustered.rewrites,
        clustered.summarizer_calls,
        on_cluster / on_one,
        single.cost_whole(0.1),
    );
    for run in [&single, &clustered] {
        assert!(run.violations.is_empty(), "{}", run.violations.join("\n"));
    }
    assert!((on_cluster / on_one - 1.0).abs() <= 0.02, "{on_cluster:.0} against {on_one:.0}");
}

/// Failovers the replicas counted, together.
async fn failovers(proxies: &[&Proxy]) -> f64 {
    let mut total = 0.0;
    for proxy in proxies {
        let metrics = metrics_text(proxy).await;
        let line =
            metrics.lines().find(|l| l.starts_with("foldgate_session_store_failovers_total"));
        let value = line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok());
        total += value.expect("the failover counter is exported");
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_under_sentinel_share_conversations_through_a_failover() {
    let Some(mut setup) = tokio::task::spawn_blocking(RedisSentinel::start).await.unwrap() else {
        return;
    };
    replicas_forward_what_one_process_forwards(&setup.urls(), RedisMode::Sentinel).await;

    let mock = MockUpstream::start(provider(Duration::ZERO)).await;
    let a = Proxy::start(replica_on(&mock.url(), &setup.urls(), RedisMode::Sentinel)).await;
    let b = Proxy::start(replica_on(&mock.url(), &setup.urls(), RedisMode::Sentinel)).await;
    let bodies = long_session();
    let half = bodies.len() / 2;
    let session = "sentinel-failover";
    let key = answered(&[&a, &b], session, &bodies[..half]).await;
    let state_key = format!("foldgate:{{{key}}}:s");
    assert_eq!(cli(setup.primary.port, &["exists", &state_key]).trim(), "1", "state stored");

    // The primary fails: requests meanwhile are answered, then the sentinels' new
    // primary (the replica) holds the state written again.
    let rest = &bodies[half..];
    let third = rest.len() / 3;
    let failover = tokio::task::spawn_blocking(move || {
        setup.fail_over();
        setup
    });
    answered(&[&a, &b], session, &rest[..third]).await;
    let setup = failover.await.unwrap();
    answered(&[&a, &b], session, &rest[third..]).await;
    let primary = setup.replica.port;
    assert_eq!(setup.current_primary(), primary);
    assert_eq!(cli(primary, &["exists", &state_key]).trim(), "1", "state written again");
    assert!(failovers(&[&a, &b]).await >= 1.0, "the new primary is counted");
}
