//! Long agent sessions through the proxy: every forwarded request keeps the small user
//! messages verbatim and in order, and the current turn intact whenever it fits,
//! including requests served from stored fold blocks and requests that hit tier 4.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::{ProviderStats, chat_request, provider};
use common::sessions::{Shape, session_requests};
use common::*;
use foldgate::compaction::check::verify;
use foldgate::compaction::{Budget, Engine, Options, TokenCache};
use foldgate::model::ChatRequest;
use http::StatusCode;

/// How the agent and the summarizer take their time.
#[derive(Clone, Copy, Default)]
struct Pace {
    /// How long the summarizer takes to write a digest.
    summary: Duration,
    /// The agent's pause between an answer and its next request.
    pause: Duration,
}

/// What one replay saw.
#[derive(Default)]
struct Replayed {
    /// Requests served by each tier (`x-foldgate-tier`).
    tiers: BTreeMap<String, usize>,
    /// Summarizer calls (one per fold).
    folds: usize,
    /// Requests that waited for a digest (`x-foldgate-fold-wait-ms`), with the wait.
    waits: Vec<(usize, Duration)>,
    /// The slowest request that did not wait.
    slowest_unwaited: Duration,
    /// Forwarded requests that did not start with the previous forwarded request's
    /// messages (the provider's cached prefix was lost).
    rewrites: usize,
}

/// The agent provider, with digests that take `delay` to write.
fn slow_provider(stats: Arc<ProviderStats>, delay: Duration) -> Handler {
    let normal = provider(stats);
    Arc::new(move |rec: Recorded| {
        let normal = normal.clone();
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                tokio::time::sleep(delay).await;
            }
            normal(rec).await
        })
    })
}

async fn replay(shape: Shape, seed: u64) -> BTreeMap<String, usize> {
    replay_paced(shape, seed, Pace::default()).await.tiers
}

/// Replays one session of `shape` through foldgate at a 16,000-token window, growing to
/// 2.5 times the window, at `pace`, and checks every forwarded request against its
/// original.
async fn replay_paced(shape: Shape, seed: u64, pace: Pace) -> Replayed {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(slow_provider(stats.clone(), pace.summary)).await;
    let mut config = common::agent::chat_config(&mock.url());
    config.compaction.max_context_tokens = Some(16_000);
    let proxy = Proxy::start(config.clone()).await;
    let requests = session_requests(shape, seed, 40_000);
    assert!(requests.len() > 40, "{} requests", requests.len());

    let mut cache = TokenCache::default();
    let engine = Engine::new(config.compaction.clone());
    let mut seen = Replayed::default();
    let mut failures = Vec::new();
    let mut sent = 0;
    for (i, request) in requests.iter().enumerate() {
        tokio::time::sleep(pace.pause).await;
        let started = Instant::now();
        let (status, headers, answer) =
            send(chat_request(&proxy, request.body.clone(), "Bearer sk-s", "long-session")).await;
        let took = started.elapsed();
        match headers.get("x-foldgate-fold-wait-ms") {
            Some(ms) => {
                seen.waits.push((i, Duration::from_millis(ms.to_str().unwrap().parse().unwrap())))
            }
            None => seen.slowest_unwaited = seen.slowest_unwaited.max(took),
        }
        assert_eq!(status, StatusCode::OK, "request {i}");
        if request.stream {
            assert!(answer.starts_with(b"data: "), "request {i} streamed");
        }
        let tier = headers.get("x-foldgate-tier").map(|v| v.to_str().unwrap().to_owned());
        *seen.tiers.entry(tier.unwrap_or_else(|| "-".into())).or_default() += 1;

        let chats = mock.forwarded();
        assert_eq!(chats.len(), sent + 1, "one forwarded request per request");
        sent += 1;
        let original = ChatRequest::parse(&request.body).unwrap();
        let forwarded = ChatRequest::parse(&chats[sent - 1].body).unwrap();
        if sent > 1 {
            let before = ChatRequest::parse(&chats[sent - 2].body).unwrap();
            let (before, now) = (before.messages(), forwarded.messages());
            let kept = before.len() <= now.len()
                && before.iter().zip(now).all(|(a, b)| a.raw() == b.raw());
            seen.rewrites += usize::from(!kept);
        }
        let budget = Budget::of(&original, &config.compaction, &Options::default());
        if seen.waits.last().is_some_and(|&(at, _)| at == i) {
            // Only a request that could not be forwarded without its digest may wait.
            let tokens = engine.count_prompt(&original, &budget, &mut cache);
            assert!(
                tokens > budget.fit_limit(),
                "request {i} waited for a digest with {tokens} tokens, which fit {}",
                budget.fit_limit()
            );
        }
        for v in verify(&original, &forwarded, &config.compaction, &budget, &mut cache) {
            failures.push(format!("request {i}: ({}) {}", v.check, v.detail));
        }
    }
    assert!(
        failures.is_empty(),
        "{shape:?}: {} violations:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let compacted: usize =
        seen.tiers.iter().filter(|(t, _)| !matches!(t.as_str(), "-" | "0")).map(|(_, n)| n).sum();
    assert!(compacted > 10, "{shape:?}: the session was compacted ({:?})", seen.tiers);
    seen.folds = stats.summaries.load(std::sync::atomic::Ordering::SeqCst);
    seen
}

/// Replays three sessions of `shape`; the guarantees must have held on requests served
/// by a fold (tier 2, also from stored blocks later on) and by the fallback (tier 4).
async fn replay_three(shape: Shape) {
    let mut all: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 1..=3 {
        for (tier, n) in replay(shape, seed).await {
            *all.entry(tier).or_default() += n;
        }
    }
    assert!(all.get("2").is_some_and(|&n| n > 0), "{shape:?}: no fold ({all:?})");
    assert!(all.get("4").is_some_and(|&n| n > 0), "{shape:?}: no fallback ({all:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coding_agent_session_keeps_user_turns_and_the_current_turn() {
    replay_three(Shape::CodingAgent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_session_keeps_user_turns_and_the_current_turn() {
    replay_three(Shape::ToolCalling).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_user_turns_outlive_pastes_that_pass_the_floor() {
    replay_three(Shape::PastingAgent).await;
}

/// A summarizer that takes a second and an agent that pauses half a second between
/// requests: folds are summarized in the background while requests still fit, so almost
/// no request waits for a digest, and the guarantees hold on every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_summarizer_makes_almost_no_request_wait() {
    let pace = Pace { summary: Duration::from_millis(1_000), pause: Duration::from_millis(500) };
    let seen = replay_paced(Shape::CodingAgent, 11, pace).await;
    println!(
        "folds {}, waits {:?}, prefix rewrites {}, tiers {:?}",
        seen.folds, seen.waits, seen.rewrites, seen.tiers
    );
    assert!(seen.folds >= 3, "the session was folded several times: {}", seen.folds);
    assert!(
        seen.waits.len() * 20 <= seen.folds,
        "at least 95% of folds made no request wait: {} waits for {} folds: {:?}",
        seen.waits.len(),
        seen.folds,
        seen.waits
    );
    // A fold rewrites the forwarded prefix once (twice only when the request that makes
    // it due cannot fit without a cut); the fallback's stable cuts add a few more.
    assert!(
        seen.rewrites * 2 < seen.folds * 3,
        "the forwarded prefix changes about once per fold, not once per request while a \
         digest is written, nor twice per fold: {} rewrites for {} folds",
        seen.rewrites,
        seen.folds
    );
    assert!(
        seen.slowest_unwaited < pace.summary / 2,
        "a request without the wait header took {:?}: it waited unreported",
        seen.slowest_unwaited
    );
}
