//! The session inspector's page in a real headless browser (Debian `chromium`, which
//! `.ci/run` installs): after a long compacted conversation the page renders the
//! session, its chart has one point per request, and its digests are shown. The
//! screenshot is kept at `target/tmp/inspector-page.png`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent::{ProviderStats, chat_config, chat_request, conversation, provider, requests};
use common::*;
use foldgate::config::Secret;
use http::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "page-test-token";

/// Runs chromium headless on `url` with `args`; its stdout. A fresh profile every time,
/// nothing fetched but `url`.
fn chromium(url: &str, args: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!("foldgate-chromium-{}", uuid::Uuid::new_v4()));
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        out
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&profile);
    reader.join().unwrap()
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_charts_a_compacted_conversation_and_shows_its_digests() {
    if !common::tools::tool_available("chromium", "chromium") {
        return;
    }
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let mut config = chat_config(&mock.url());
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Secret::new(TOKEN);
    let proxy = Proxy::start(config).await;
    let bodies = requests(&conversation(40, 4), &[]);
    let mut key = String::new();
    let mut compacted = 0;
    for body in &bodies {
        let (status, headers, _) =
            send(chat_request(&proxy, body.clone(), "Bearer sk-page", "page-1")).await;
        assert_eq!(status, StatusCode::OK);
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
        compacted += usize::from(headers["x-foldgate-outcome"] == "compacted");
    }
    assert!(compacted > 0, "the conversation was compacted");

    let url = format!("http://{}/#session={key}&token={TOKEN}", proxy.admin_addr.unwrap());
    let dom = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"])).await.unwrap()
    };
    assert!(dom.contains(&format!("data-loaded=\"{key}\"")), "the session rendered:\n{dom}");
    assert_eq!(count(&dom, "class=\"pt pt-after\""), bodies.len(), "one point per request");
    assert_eq!(count(&dom, "class=\"pt pt-before\""), bodies.len());
    assert!(dom.contains(&format!("data-points=\"{}\"", bodies.len())));
    assert!(count(&dom, "class=\"mark-fold\"") >= 1, "folds are marked");
    assert!(count(&dom, "class=\"block\"") >= 1, "fold blocks are listed");
    assert!(dom.contains("I read the modules"), "a digest is shown");
    assert!(dom.contains("messages 0–"), "beside the range it replaced");
    assert!(dom.contains(&format!("data-key=\"{key}\"")), "the sessions table lists it");

    let shot: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspector-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || chromium(&url, &[&arg, "--window-size=1280,1600"]))
        .await
        .unwrap();
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "a screenshot at {} ({size} bytes)", shot.display());
}

/// One recorded OpenHands session of `../shared/traces/dev.jsonl`, whose large tool
/// outputs a 16k window cannot carry: its messages and tool definitions.
fn recorded_session(id: &str) -> (Vec<Value>, Option<Value>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    let text = std::fs::read_to_string(&path).expect("shared/traces/dev.jsonl beside the repo");
    let record: Value = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} is in dev.jsonl"));
    (record["messages"].as_array().unwrap().clone(), record.get("tools").cloned())
}

/// A provider answering every chat request with the usage a cache-aware provider reports:
/// a quarter of the forwarded body's bytes as prompt tokens, half of them read from the
/// cache; digest requests with a digest.
fn caching_provider() -> common::Handler {
    Arc::new(|rec: common::Recorded| {
        Box::pin(async move {
            let content = if rec.headers.contains_key("x-foldgate-summary") {
                "## Milestones\n- I reproduced the failure.\n## Key artifacts\n- astropy/io/ascii/rst.py"
            } else {
                "ok"
            };
            let prompt = rec.body.len() / 4;
            let body = json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7,
                    "prompt_tokens_details": {"cached_tokens": prompt / 2}},
            });
            let mut r = response(200, body.to_string());
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    })
}

fn cut_requests_of(recent: &[Value]) -> usize {
    recent.iter().filter(|r| r.get("changes").is_some()).count()
}

/// A recorded OpenHands session replayed at a 16k window, one request per assistant
/// message: its large tool outputs are cut to stubs. The inspection API lists each cut
/// message of each request (tier 1, its tokens before and after, the stub) with why the
/// request got its tier and the usage the upstream reported, split by cache; the page,
/// in headless Chromium, shows every one of those cuts with the same sizes and marks
/// the requests that made them on the chart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_each_cut_tool_output_with_its_size_before_and_after() {
    if !common::tools::tool_available("chromium", "chromium") {
        return;
    }
    let mock = MockUpstream::start(caching_provider()).await;
    let mut config = chat_config(&mock.url());
    config.compaction.max_context_tokens = Some(16_000);
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Secret::new(TOKEN);
    let proxy = Proxy::start(config).await;
    let (messages, tools) =
        recorded_session("openhands-codeact-claude-3-5-sonnet-django__django-11451");
    let mut key = String::new();
    let mut sent = 0;
    for end in (1..messages.len()).filter(|&i| messages[i]["role"] == "assistant") {
        let mut body = json!({"model": "gpt-4o", "messages": &messages[..end]});
        if let Some(tools) = &tools {
            body["tools"] = tools.clone();
        }
        let body = Bytes::from(body.to_string());
        let (status, headers, _) =
            send(chat_request(&proxy, body, "Bearer sk-cuts", "cuts-1")).await;
        assert_eq!(status, StatusCode::OK);
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
        sent += 1;
    }

    // The API: every request recorded, with the upstream's usage split by cache.
    let admin = proxy.admin_addr.unwrap();
    let detail = loop {
        let request = http::Request::get(format!("http://{admin}/sessions/{key}"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(full(""))
            .unwrap();
        let (_, _, body) = send(request).await;
        let detail: Value = serde_json::from_slice(&body).unwrap();
        if detail["recent"].as_array().is_some_and(|r| r.len() == sent) {
            break detail;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let recent = detail["recent"].as_array().unwrap();
    for r in recent {
        let usage = &r["usage"];
        let prompt = usage["prompt"].as_u64().unwrap();
        assert_eq!(usage["cache_read"].as_u64(), Some(prompt / 2), "{r}");
        assert_eq!(usage["completion"], 7, "{r}");
        assert!(!r["why"].as_str().unwrap_or("").is_empty(), "why its tier: {r}");
    }
    let cuts: Vec<&Value> = recent
        .iter()
        .flat_map(|r| r["changes"].as_array().into_iter().flatten())
        .filter(|c| c["kind"] == "elided")
        .collect();
    assert!(!cuts.is_empty(), "tool outputs were cut: {recent:?}");
    println!(
        "{sent} requests; the last {} with changes recorded hold {} cut(s)",
        cut_requests_of(recent),
        cuts.len()
    );
    for c in &cuts {
        let (before, after) =
            (c["tokens_before"].as_u64().unwrap(), c["tokens_after"].as_u64().unwrap());
        assert!(after < before, "a cut makes its message smaller: {c}");
        assert_eq!(c["tier"], 1, "a stub is tier 1: {c}");
        assert!(c["text"].as_str().unwrap().starts_with("[elided by foldgate:"), "{c}");
    }
    let cut_requests: Vec<&Value> = recent
        .iter()
        .filter(|r| {
            r["changes"].as_array().is_some_and(|c| c.iter().any(|c| c["kind"] == "elided"))
        })
        .collect();
    for r in &cut_requests {
        assert!(r["why"].as_str().unwrap().contains("tool output cut"), "{r}");
        let dropped = r["changes"].as_array().unwrap().iter().any(|c| c["kind"] == "dropped");
        if !dropped {
            assert_ne!(r["tier"], 4, "a request that only stubbed is not tier 4: {r}");
        }
    }

    // The page: each cut with the same sizes, and the requests that made them marked.
    let page = format!("http://{admin}/#session={key}&token={TOKEN}");
    let url = page.clone();
    let dom = tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"])).await.unwrap();
    assert!(dom.contains(&format!("data-loaded=\"{key}\"")), "the session rendered:\n{dom}");
    for c in &cuts {
        let shown = format!(
            "data-kind=\"elided\" data-start=\"{}\" data-end=\"{}\" data-before=\"{}\" data-after=\"{}\"",
            c["start"], c["end"], c["tokens_before"], c["tokens_after"]
        );
        assert!(dom.contains(&shown), "the page shows the cut {c}");
    }
    assert_eq!(count(&dom, "data-kind=\"elided\""), cuts.len(), "every cut, once");
    let stubbing = recent.iter().filter(|r| r["stubbed"].as_u64() > Some(0)).count();
    assert!(stubbing >= cut_requests.len());
    assert_eq!(count(&dom, "class=\"mark-cut\""), stubbing, "each request that stubbed is marked");
    assert!(dom.contains("cache read"), "the usage split is shown");

    let shot: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspector-cuts.png");
    let _ = std::fs::remove_file(&shot);
    let (arg, url) = (format!("--screenshot={}", shot.display()), page);
    tokio::task::spawn_blocking(move || chromium(&url, &[&arg, "--window-size=1280,2400"]))
        .await
        .unwrap();
    assert!(std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 10_000, "a screenshot");
}
