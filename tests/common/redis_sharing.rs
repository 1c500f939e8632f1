//! Replicas sharing conversations through Redis, as tests need them: a provider whose
//! digests depend only on what is summarized (whichever replica asks gets the same), a
//! replica's configuration, and a long conversation sent alternately to several
//! replicas, each request waiting for the background folds of the last.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use foldgate::config::{Config, SecretUrl, StoreKind};
use http::StatusCode;
use serde_json::json;

use super::agent::{chat_config, chat_request};
use super::sessions::{Shape, session_requests};
use super::*;

pub const CREDENTIAL: &str = "Bearer sk-redis-test-credential";

pub const SESSION: &str = "conversation-under-test";

/// The agent provider, with digests that depend only on what is summarized (so that
/// whichever replica asks gets the same digest) and take `delay` to write.
pub fn provider(delay: Duration) -> Handler {
    let normal = super::agent::provider(Default::default());
    Arc::new(move |rec: Recorded| {
        let normal = normal.clone();
        Box::pin(async move {
            if !rec.headers.contains_key("x-foldgate-summary") {
                return normal(rec).await;
            }
            tokio::time::sleep(delay).await;
            let mut hasher = DefaultHasher::new();
            rec.body.hash(&mut hasher);
            let digest = format!(
                "## Milestones\n- I read the modules (range {:016x}).\n## Key artifacts\n- src/parser.rs",
                hasher.finish()
            );
            let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": digest}}]});
            response(200, body.to_string())
        })
    })
}

/// A replica's configuration: a 16k window, the model summarizer, sessions in `redis`.
pub fn replica(upstream: &str, redis: &str) -> Config {
    let mut config = chat_config(upstream);
    config.compaction.max_context_tokens = Some(16_000);
    config.session.store = StoreKind::Redis;
    config.session.redis_url = SecretUrl::new(redis);
    config
}

pub fn summaries(mock: &MockUpstream) -> Vec<Bytes> {
    mock.recorded()
        .into_iter()
        .filter(|r| r.headers.contains_key("x-foldgate-summary"))
        .map(|r| r.body)
        .collect()
}

/// Waits until no summarizer call has started for a while: background folds (prefetch)
/// of the last request have landed, so the next request finds the same state whichever
/// process serves it.
pub async fn settle(mock: &MockUpstream) {
    let mut seen = summaries(mock).len();
    loop {
        tokio::time::sleep(Duration::from_millis(120)).await;
        let now = summaries(mock).len();
        if now == seen {
            return;
        }
        seen = now;
    }
}

/// Sends every request of `bodies` to `proxies` in turn; returns the statuses.
pub async fn converse(proxies: &[&Proxy], mock: &MockUpstream, bodies: &[Bytes]) {
    for (i, body) in bodies.iter().enumerate() {
        let proxy = proxies[i % proxies.len()];
        let (status, _, answer) =
            send(chat_request(proxy, body.clone(), CREDENTIAL, SESSION)).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {}", String::from_utf8_lossy(&answer));
        settle(mock).await;
    }
}

pub fn long_session() -> Vec<Bytes> {
    session_requests(Shape::CodingAgent, 7, 40_000).into_iter().map(|r| r.body).collect()
}
