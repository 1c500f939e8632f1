//! Metrics over real HTTP: chat traffic through foldgate to the agent mock provider, then
//! `/metrics` read as text, asserting each counter and histogram moved by the amount the
//! traffic implies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::agent::{
    COMPLETION, ProviderStats, chat_config, chat_request, conversation, provider, requests,
};
use common::*;
use foldgate::model::DIGEST_MARKER;
use futures_util::StreamExt;
use http::{HeaderMap, Request, StatusCode};
use serde_json::json;

fn header_num(headers: &HeaderMap, name: &str) -> f64 {
    headers.get(name).unwrap_or_else(|| panic!("no {name}")).to_str().unwrap().parse().unwrap()
}

async fn get(url: String) -> (StatusCode, String) {
    let (status, _, body) = send(Request::get(url).body(full("")).unwrap()).await;
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, text) = get(format!("http://{addr}/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    text
}

/// One parsed sample line: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            (name.to_owned(), labels, value.parse().unwrap())
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include every pair of `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .into_iter()
        .filter(|(n, l, _)| {
            n == name && labels.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test]
async fn a_compacted_request_counts_tokens_saved_as_before_minus_after() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let text = scrape(proxy.addr).await;
    assert_eq!(value(&text, "foldgate_tokens_saved_total", &[]), 0.0);
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[("outcome", "compacted")]), 0.0);

    // Below the trigger: forwarded as is, counted before = after.
    let small = requests(&conversation(2, 0), &[]).pop().unwrap();
    let (status, h_small, _) = send(chat_request(&proxy, small, "Bearer k", "small")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h_small["x-foldgate-outcome"], "passthrough");
    let small_before = header_num(&h_small, "x-foldgate-tokens-before");

    // Over the trigger: compacted.
    let big = requests(&conversation(30, 0), &[]).pop().unwrap();
    let (status, h_big, answer) = send(chat_request(&proxy, big, "Bearer k", "big")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, COMPLETION.as_bytes());
    assert_eq!(h_big["x-foldgate-outcome"], "compacted");
    let before = header_num(&h_big, "x-foldgate-tokens-before");
    let after = header_num(&h_big, "x-foldgate-tokens-after");
    assert!(after < before);

    let text = scrape(proxy.addr).await;
    let gpt4o = [("model", "gpt-4o")];
    assert_eq!(value(&text, "foldgate_tokens_saved_total", &gpt4o), before - after);
    assert_eq!(value(&text, "foldgate_prompt_tokens_before_total", &gpt4o), small_before + before);
    assert_eq!(value(&text, "foldgate_prompt_tokens_after_total", &gpt4o), small_before + after);
    let outcome = |o| value(&text, "foldgate_chat_requests_total", &[("outcome", o)]);
    assert_eq!(
        (outcome("passthrough"), outcome("compacted"), outcome("failed_open")),
        (1.0, 1.0, 0.0)
    );
    // One compaction: the ratio histogram saw exactly after / before.
    assert_eq!(value(&text, "foldgate_compaction_ratio_count", &[]), 1.0);
    let ratio = value(&text, "foldgate_compaction_ratio_sum", &[]);
    assert!((ratio - after / before).abs() < 1e-9, "{ratio} vs {}", after / before);
    let tier = h_big["x-foldgate-tier"].to_str().unwrap();
    assert_eq!(
        value(&text, "foldgate_compactions_total", &[("tier", tier), ("outcome", "compacted")]),
        1.0
    );
    assert_eq!(value(&text, "foldgate_compactions_total", &[]), 1.0);
    // The LLM summarizer was called (and timed) once per summary the mock wrote.
    let summaries = stats.summaries.load(Ordering::SeqCst) as f64;
    assert!(summaries >= 1.0);
    assert_eq!(
        value(&text, "foldgate_summarizer_duration_seconds_count", &[("summarizer", "llm")]),
        summaries
    );
    assert_eq!(value(&text, "foldgate_summarizer_failures_total", &[]), 0.0);
    // Two chat requests, each timed once before and once after the upstream send.
    let chat = [("route", "chat_completions")];
    assert_eq!(value(&text, "foldgate_proxy_overhead_seconds_count", &chat), 2.0);
    assert_eq!(value(&text, "foldgate_upstream_ttfb_seconds_count", &chat), 2.0);
    assert_eq!(
        value(
            &text,
            "foldgate_requests_total",
            &[("route", "chat_completions"), ("status_class", "2xx")]
        ),
        2.0
    );
    // Only the conversation past the trigger holds state: the small one was decided from
    // its text alone.
    assert_eq!(value(&text, "foldgate_active_sessions", &[]), 1.0);
    assert_eq!(value(&text, "foldgate_session_store_errors_total", &[]), 0.0);
    // The mock answers every chat call with usage 100 prompt + 1 completion tokens.
    let usage = |kind| {
        value(&text, "foldgate_upstream_usage_tokens_total", &[("model", "gpt-4o"), ("kind", kind)])
    };
    assert_eq!((usage("prompt"), usage("completion"), usage("cached")), (200.0, 2.0, 0.0));
}

#[tokio::test]
async fn a_fold_counts_the_prompt_it_makes_the_provider_cache_again_and_reuse_none() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let rewritten = |text: &str| value(text, "foldgate_prompt_tokens_rewritten_total", &[]);
    // The first request over the trigger folds: from the fold on, the prompt is new.
    let all = requests(&conversation(31, 0), &[]);
    let (status, headers, _) =
        send(chat_request(&proxy, all[all.len() - 2].clone(), "Bearer k", "c")).await;
    assert_eq!(
        (status, headers["x-foldgate-outcome"].to_str().unwrap()),
        (StatusCode::OK, "compacted")
    );
    let after = header_num(&headers, "x-foldgate-tokens-after");
    let text = scrape(proxy.addr).await;
    let first = rewritten(&text);
    assert!(first > 0.0 && first <= after, "{first} of {after}");
    // Counted once, by why, with its estimated cost at the default cached price.
    assert_eq!(value(&text, "foldgate_prefix_rewrites_total", &[]), 1.0, "{text}");
    let cost = value(&text, "foldgate_prefix_rewrite_cost_total", &[]);
    assert!((cost - first * 0.9).abs() <= 1.0, "{cost} for {first} tokens rewritten");
    // Sent again, it applies the fold its first request summarized in the background
    // (the prompt changes once more), then forwards the stored fold byte for byte
    // (tier 0): that rewrites nothing.
    let mut reused = false;
    for _ in 0..5 {
        let before = rewritten(&scrape(proxy.addr).await);
        let (_, headers, _) =
            send(chat_request(&proxy, all[all.len() - 2].clone(), "Bearer k", "c")).await;
        if headers["x-foldgate-tier"] == "0" {
            assert_eq!(
                rewritten(&scrape(proxy.addr).await),
                before,
                "a reused fold rewrites nothing"
            );
            reused = true;
            break;
        }
    }
    assert!(reused, "the stored fold was reused");
}

#[tokio::test]
async fn upstream_usage_is_read_from_json_and_from_streamed_responses() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let usage = |text: &str, kind| {
        value(text, "foldgate_upstream_usage_tokens_total", &[("model", "gpt-4o"), ("kind", kind)])
    };

    let plain = requests(&conversation(1, 0), &[]).pop().unwrap();
    let (status, _, answer) = send(chat_request(&proxy, plain, "Bearer k", "json")).await;
    assert_eq!((status, answer), (StatusCode::OK, Bytes::from(COMPLETION)));
    let text = scrape(proxy.addr).await;
    assert_eq!((usage(&text, "prompt"), usage(&text, "completion")), (100.0, 1.0));

    // SSE: the mock's final chunk carries usage 100 prompt + 2 completion tokens.
    let streamed = requests(&conversation(1, 0), &[("stream", json!(true))]).pop().unwrap();
    let (status, headers, answer) = send(chat_request(&proxy, streamed, "Bearer k", "sse")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    let answer = String::from_utf8(answer.to_vec()).unwrap();
    assert!(answer.contains(r#""usage":{"prompt_tokens":100"#), "bytes unchanged: {answer}");
    assert!(answer.ends_with("data: [DONE]\n\n"));
    let text = scrape(proxy.addr).await;
    assert_eq!((usage(&text, "prompt"), usage(&text, "completion")), (200.0, 3.0));
    assert_eq!(usage(&text, "cached"), 0.0);
}

#[tokio::test]
async fn cached_prompt_tokens_are_counted() {
    let mock = MockUpstream::start(Arc::new(|_| {
        Box::pin(async {
            let mut r = response(
                200,
                r#"{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":768}}}"#,
            );
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    }))
    .await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let body = br#"{"model":"claude-3-5-sonnet","messages":[{"role":"user","content":"hi"}]}"#;
    send(post(&proxy.url("/v1/chat/completions"), body.to_vec())).await;
    let text = scrape(proxy.addr).await;
    let usage = |kind| {
        value(&text, "foldgate_upstream_usage_tokens_total", &[("model", "claude"), ("kind", kind)])
    };
    assert_eq!((usage("prompt"), usage("completion"), usage("cached")), (900.0, 5.0, 768.0));
    assert_eq!((usage("uncached"), usage("cache_write")), (132.0, 0.0));
}

#[tokio::test]
async fn token_usage_is_counted_by_team_within_a_bounded_set() {
    let mock = MockUpstream::start(Arc::new(|_| {
        Box::pin(async {
            let mut r = response(
                200,
                r#"{"type":"message","usage":{"input_tokens":100,"cache_read_input_tokens":300,"cache_creation_input_tokens":50,"output_tokens":7}}"#,
            );
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    }))
    .await;
    let mut config = chat_config(&mock.url());
    config.metrics.team_header = "x-team".to_owned();
    config.metrics.teams = vec!["alpha".to_owned(), "beta".to_owned()];
    let proxy = Proxy::start(config).await;
    let body = br#"{"model":"claude-3-5-sonnet","messages":[{"role":"user","content":"hi"}]}"#;
    for team in [Some("alpha"), Some("alpha"), Some("gamma"), Some("bad team!"), None] {
        let mut request = post(&proxy.url("/v1/chat/completions"), body.to_vec());
        if let Some(team) = team {
            request.headers_mut().insert("x-team", team.parse().unwrap());
        }
        assert_eq!(send(request).await.0, StatusCode::OK);
    }
    // A passthrough route counts its team too.
    let mut request = post(&proxy.url("/v1/embeddings"), b"{}".to_vec());
    request.headers_mut().insert("x-team", "beta".parse().unwrap());
    send(request).await;
    let text = scrape(proxy.addr).await;
    let team =
        |team, kind| value(&text, "foldgate_team_tokens_total", &[("team", team), ("kind", kind)]);
    assert_eq!(team("alpha", "prompt"), 900.0);
    assert_eq!(team("alpha", "uncached"), 200.0);
    assert_eq!(team("alpha", "cached"), 600.0);
    assert_eq!(team("alpha", "cache_write"), 100.0);
    assert_eq!(team("alpha", "completion"), 14.0);
    assert_eq!(team("other", "prompt"), 900.0, "not on the list, or not a name");
    assert_eq!(team("none", "prompt"), 450.0, "no header");
    assert_eq!(team("beta", "prompt"), 450.0);
    let teams: std::collections::HashSet<String> = text
        .lines()
        .filter(|l| l.starts_with("foldgate_team_tokens_total{"))
        .filter_map(|l| l.split("team=\"").nth(1)?.split('"').next().map(str::to_owned))
        .collect();
    let expected: std::collections::HashSet<String> =
        ["alpha", "beta", "other", "none"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(teams, expected);
}

#[tokio::test]
async fn requests_are_counted_by_route_and_status_class() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    assert_eq!(get(proxy.url("/nope")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(proxy.url("/v1x/users/42")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(proxy.url("/healthz")).await.0, StatusCode::OK);
    assert_eq!(get(proxy.url("/v1/models")).await.0, StatusCode::OK);
    let (status, _, _) = send(post(&proxy.url("/v1/chat/completions"), "not json")).await;
    assert_eq!(status, StatusCode::OK);

    let text = scrape(proxy.addr).await;
    let requests = |route, class| {
        value(&text, "foldgate_requests_total", &[("route", route), ("status_class", class)])
    };
    assert_eq!(requests("unknown", "4xx"), 2.0);
    assert_eq!(requests("local", "2xx"), 1.0, "the healthz call; this scrape is counted after");
    assert_eq!(requests("passthrough", "2xx"), 1.0);
    assert_eq!(requests("chat_completions", "2xx"), 1.0);
    assert_eq!(value(&text, "foldgate_requests_total", &[]), 5.0);
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[("outcome", "not_chat")]), 1.0);
    assert_eq!(
        value(&text, "foldgate_proxy_overhead_seconds_count", &[("route", "passthrough")]),
        1.0
    );
    assert!(!text.contains("/nope") && !text.contains("/v1x"), "no raw paths as labels");
    let text = scrape(proxy.addr).await;
    assert_eq!(
        value(&text, "foldgate_requests_total", &[("route", "local"), ("status_class", "2xx")]),
        2.0,
        "the first scrape itself"
    );
}

#[tokio::test]
async fn overflow_retries_and_summarizer_failures_are_counted() {
    // Summaries fail (503); chat calls without a digest are rejected as too long once
    // the client asks for it, to force the overflow retry.
    let mock = MockUpstream::start(Arc::new(|rec: Recorded| {
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                return response(503, r#"{"error":{"message":"overloaded"}}"#);
            }
            let has_digest = String::from_utf8_lossy(&rec.body).contains(DIGEST_MARKER);
            if rec.headers.contains_key("x-test-overflow") && !has_digest {
                return response(
                    400,
                    r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","code":"context_length_exceeded"}}"#,
                );
            }
            response(200, COMPLETION)
        })
    }))
    .await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;

    let big = requests(&conversation(30, 0), &[]).pop().unwrap();
    let (status, headers, _) = send(chat_request(&proxy, big, "Bearer k", "fail")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-foldgate-outcome"], "compacted", "an extractive digest instead");
    let text = scrape(proxy.addr).await;
    let failures = value(&text, "foldgate_summarizer_failures_total", &[("reason", "status")]);
    assert!(failures >= 1.0);
    assert_eq!(value(&text, "foldgate_summarizer_failures_total", &[]), failures);
    assert_eq!(
        value(&text, "foldgate_summarizer_duration_seconds_count", &[("summarizer", "llm")]),
        failures,
        "failed calls are timed too"
    );

    let medium = requests(&conversation(8, 0), &[]).pop().unwrap();
    let request = Request::post(proxy.url("/v1/chat/completions"))
        .header("x-session-id", "overflow")
        .header("x-test-overflow", "1")
        .header("content-type", "application/json")
        .body(full(medium))
        .unwrap();
    let (status, headers, answer) = send(request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(
        headers.get("x-foldgate-retried").map(|v| v.to_str().unwrap()),
        Some("1"),
        "{headers:?}"
    );
    let text = scrape(proxy.addr).await;
    let retries = |result| value(&text, "foldgate_overflow_retries_total", &[("result", result)]);
    assert_eq!((retries("retried"), retries("nothing_to_compact")), (1.0, 0.0));
    // Two upstream sends for the one request; the request itself is counted once.
    let chat = [("route", "chat_completions")];
    assert_eq!(value(&text, "foldgate_upstream_ttfb_seconds_count", &chat), 3.0);
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[]), 2.0);
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[("outcome", "compacted")]), 2.0);
}

#[tokio::test]
async fn rare_event_series_exist_from_start_up_at_zero() {
    let mock = MockUpstream::echo().await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let text = scrape(proxy.addr).await;
    for series in [
        r#"foldgate_session_store_errors_total{op="load"} 0"#,
        r#"foldgate_session_store_errors_total{op="save"} 0"#,
        r#"foldgate_session_store_errors_total{op="lease"} 0"#,
        r#"foldgate_requests_total{route="chat_completions",status_class="5xx"} 0"#,
        r#"foldgate_compactions_total{outcome="compacted",tier="4"} 0"#,
        r#"foldgate_overflow_retries_total{result="retried"} 0"#,
        r#"foldgate_summarizer_failures_total{reason="timeout"} 0"#,
        r#"foldgate_chat_requests_total{outcome="failed_open",route="chat_completions"} 0"#,
        r#"foldgate_chat_requests_total{outcome="compacted",route="responses"} 0"#,
        "foldgate_active_sessions 0",
        "foldgate_compaction_ratio_count 0",
    ] {
        assert!(text.lines().any(|l| l == series), "missing {series}:\n{text}");
    }
}

#[tokio::test]
async fn a_separate_metrics_listener_serves_metrics_and_the_proxy_port_does_not() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let mut config = chat_config(&mock.url());
    config.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    config.metrics.path = "/prom".to_owned();
    let proxy = Proxy::start(config).await;
    let metrics_addr = proxy.metrics_addr.expect("a metrics listener");
    assert_ne!(metrics_addr, proxy.addr);

    let body = requests(&conversation(1, 0), &[]).pop().unwrap();
    send(chat_request(&proxy, body, "Bearer k", "s")).await;
    assert_eq!(get(proxy.url("/prom")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(proxy.url("/metrics")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(format!("http://{metrics_addr}/metrics")).await.0, StatusCode::NOT_FOUND);
    let (status, text) = get(format!("http://{metrics_addr}/prom")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[("outcome", "passthrough")]), 1.0);
    assert_eq!(
        value(&text, "foldgate_requests_total", &[("route", "unknown"), ("status_class", "4xx")]),
        2.0,
        "the two metrics paths tried on the proxy port"
    );
    assert_eq!(
        value(&text, "foldgate_requests_total", &[("route", "local")]),
        0.0,
        "the metrics listener's own scrapes are not proxy requests"
    );
    // The same registry: a second scrape differs only by what happened in between.
    let (_, again) = get(format!("http://{metrics_addr}/prom")).await;
    assert_eq!(text, again);
}

#[tokio::test]
async fn disabled_metrics_are_not_served() {
    let mock = MockUpstream::echo().await;
    let mut config = chat_config(&mock.url());
    config.metrics.enabled = false;
    let proxy = Proxy::start(config.clone()).await;
    let (status, body) = get(proxy.url("/metrics")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!body.contains("foldgate_"));
    assert!(proxy.metrics_addr.is_none());

    config.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let proxy = Proxy::start(config).await;
    assert!(proxy.metrics_addr.is_none(), "no listener when disabled");
    assert_eq!(get(proxy.url("/metrics")).await.0, StatusCode::NOT_FOUND);
}

/// Exported series: the lines of the text exposition that are not comments.
fn series_count(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count()
}

#[tokio::test]
async fn a_thousand_models_and_sessions_keep_the_series_bounded() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let client = client();
    let url = proxy.url("/v1/chat/completions");
    let body = |i: usize| {
        let model = if i % 2 == 0 { format!("model-{i}") } else { format!("gpt-4o-{i}") };
        json!({"model": model, "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": format!("Question {i}: what is {i} + {i}?")},
        ]})
        .to_string()
    };
    let run = |range: std::ops::Range<usize>| {
        let client = client.clone();
        let url = url.clone();
        futures_util::stream::iter(range)
            .map(move |i| {
                let request = Request::post(&url)
                    .header("x-session-id", format!("sess-{i}"))
                    .header("content-type", "application/json")
                    .body(full(body(i)))
                    .unwrap();
                let client = client.clone();
                async move {
                    let response = client.request(request).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
    };

    scrape(proxy.addr).await; // counted as a `local` request from now on
    run(0..20).await;
    let early_text = scrape(proxy.addr).await;
    let early = series_count(&early_text);
    run(20..1000).await;
    let text = scrape(proxy.addr).await;
    let late = series_count(&text);
    assert!(late < 300, "{late} series");
    let keys = |t: &str| -> std::collections::BTreeSet<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
            .collect()
    };
    let new: Vec<String> = keys(&text).difference(&keys(&early_text)).cloned().collect();
    assert_eq!(late, early, "20 requests and 1,000 export the same series: {new:?}");
    assert_eq!(value(&text, "foldgate_chat_requests_total", &[]), 1000.0);
    // Small conversations are decided from their text alone and hold no state.
    assert_eq!(value(&text, "foldgate_active_sessions", &[]), 0.0);
    for leaked in ["model-", "gpt-4o-", "sess-", "Question"] {
        assert!(!text.contains(leaked), "{leaked} in the metrics");
    }
    let models: std::collections::BTreeSet<String> = samples(&text)
        .into_iter()
        .filter_map(|(_, labels, _)| labels.get("model").cloned())
        .collect();
    assert_eq!(models, ["gpt-4o", "other"].map(String::from).into_iter().collect());
}
