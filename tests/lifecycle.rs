//! Process lifecycle: configuration errors at start, check-config, graceful shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::binary::{foldgate, spawn_serve};
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;

#[test]
fn check_config_prints_the_effective_configuration() {
    let out =
        foldgate(&["check-config"], &[("FOLDGATE_UPSTREAM_URL", "http://localhost:11434/v1")])
            .output()
            .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let parsed: toml::Table = text.parse().unwrap();
    assert_eq!(parsed["upstream"]["url"].as_str(), Some("http://localhost:11434/v1"));
    assert_eq!(parsed["server"]["listen"].as_str(), Some("127.0.0.1:8080"));
}

#[test]
fn check_config_masks_the_redis_password_and_rejects_a_missing_url() {
    let out = foldgate(
        &["check-config"],
        &[
            ("FOLDGATE_SESSION__STORE", "redis"),
            ("FOLDGATE_SESSION__REDIS_URL", "rediss://app:hunter2@cache.internal:6380/1"),
        ],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("hunter2"), "the password is printed: {text}");
    let parsed: toml::Table = text.parse().unwrap();
    assert_eq!(parsed["session"]["store"].as_str(), Some("redis"));
    assert_eq!(
        parsed["session"]["redis_url"].as_str(),
        Some("rediss://app:********@cache.internal:6380/1")
    );

    for (url, expected) in [("", "is required"), ("http://u:hunter2@h:1", "scheme `http`")] {
        let out = foldgate(
            &["check-config"],
            &[("FOLDGATE_SESSION__STORE", "redis"), ("FOLDGATE_SESSION__REDIS_URL", url)],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("session.redis_url") && stderr.contains(expected), "{stderr}");
        assert!(!stderr.contains("hunter2"), "the password is printed: {stderr}");
    }
}

#[test]
fn check_config_accepts_the_shipped_file() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/foldgate.toml");
    let out = foldgate(&["check-config", "--config", shipped], &[]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn invalid_configuration_fails_at_start_naming_key_and_file() {
    let dir = std::env::temp_dir().join(format!("foldgate-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("[upstream]\nurl = \"not a url\"\n", "upstream.url"),
        ("[compaction]\ntarget_ratio = 1.2\n", "compaction.target_ratio"),
        ("[server]\nlisten_on = \"x\"\n", "listen_on"),
        ("[server\n", "invalid TOML"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let file = dir.join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        for command in ["serve", "check-config"] {
            let out =
                foldgate(&[command, "--config", file.to_str().unwrap()], &[]).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{command} {text}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(expected), "{command}: {stderr}");
            assert!(stderr.contains(file.to_str().unwrap()), "{command}: names the file: {stderr}");
        }
    }
    let out = foldgate(&["serve"], &[("FOLDGATE_LISTEN", "nowhere")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("FOLDGATE_LISTEN") && stderr.contains("server.listen"), "{stderr}");
    let out = foldgate(&["serve", "--config", "/nonexistent/foldgate.toml"], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A mock whose SSE response sends one chunk every 100 ms, `chunks` in all.
async fn slow_stream(chunks: usize, started: Arc<AtomicUsize>) -> MockUpstream {
    MockUpstream::start(Arc::new(move |_| {
        let started = started.clone();
        Box::pin(async move {
            started.fetch_add(1, Ordering::SeqCst);
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                for i in 0..chunks {
                    let chunk = Bytes::from(format!("data: {i}\n\n"));
                    if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
            http::Response::new(body)
        })
    }))
    .await
}

fn expected_stream(chunks: usize) -> String {
    (0..chunks).map(|i| format!("data: {i}\n\n")).collect()
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_stream_finish_then_exits_zero() {
    let started = Arc::new(AtomicUsize::new(0));
    let mock = slow_stream(10, started.clone()).await;
    let (mut child, addr, _) = spawn_serve(&mock.url(), &[]);
    let (first, body) = open_stream(&format!("http://{addr}/v1/chat/completions")).await;
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let rest = body.collect().await.unwrap().to_bytes();
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(String::from_utf8(all).unwrap(), expected_stream(10), "stream completed");
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert_eq!(exit.code(), Some(0));
    assert!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "no longer accepting connections"
    );
}

#[tokio::test]
async fn shutdown_stops_accepting_and_cuts_streams_after_the_grace_period() {
    let started = Arc::new(AtomicUsize::new(0));
    let mock = slow_stream(100, started.clone()).await;
    let mut config = config_for(&mock.url());
    config.server.shutdown_grace = Duration::from_millis(500);
    let mut proxy = Proxy::start(config).await;
    let (_, body) = open_stream(&proxy.url("/v1/chat/completions")).await;
    proxy.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = tokio::net::TcpStream::connect(proxy.addr).await;
    assert!(refused.is_err(), "the listener is closed during the drain");
    let task = proxy.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("run() returns once the grace period is over")
        .unwrap();
    // The 10 s stream was cut when the 0.5 s grace period ended.
    let _ =
        tokio::time::timeout(Duration::from_secs(3), body.collect()).await.expect("stream ended");
    let get = Request::get(proxy.url("/healthz")).body(full(Bytes::new())).unwrap();
    assert!(client().request(get).await.is_err());
}

#[tokio::test]
async fn json_access_log_has_one_line_per_request_and_no_credentials() {
    let mock = MockUpstream::echo().await;
    let (mut child, addr, lines) = spawn_serve(&mock.url(), &[("FOLDGATE_LOG__FORMAT", "json")]);
    let request = Request::post(format!("http://{addr}/v1/chat/completions?key=sk-query-secret"))
        .header("authorization", "Bearer sk-header-secret")
        .header("api-key", "sk-azure-secret")
        .header("x-request-id", "log-test-1")
        .body(full("{}"))
        .unwrap();
    let (status, _, _) = send(request).await;
    assert_eq!(status, StatusCode::OK);
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    let lines = tokio::task::spawn_blocking(move || lines.after_exit()).await.unwrap();
    let all = lines.join("\n");
    assert!(!all.contains("secret"), "credentials leaked into logs:\n{all}");
    let access: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "request")
        .collect();
    assert_eq!(access.len(), 1, "{all}");
    let line = &access[0];
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/v1/chat/completions");
    assert_eq!(line["status"], 200);
    assert_eq!(line["request_id"], "log-test-1");
    assert!(line["duration_ms"].as_f64().is_some());
}

#[tokio::test]
async fn the_binary_serves_on_every_connection_thread_and_compacts_on_its_own_runtime() {
    use common::agent::{ProviderStats, chat_request_to, conversation, provider, requests};
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let (mut child, addr, lines) = spawn_serve(
        &mock.url(),
        &[
            ("FOLDGATE_SERVER__WORKERS", "3"),
            ("FOLDGATE_COMPACTION__MAX_CONTEXT_TOKENS", "12000"),
            ("FOLDGATE_SUMMARIZER__KIND", "llm"),
        ],
    );
    let pid = child.id();
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap())
        .map(|name| name.trim().to_owned())
        .collect();
    for n in 0..3 {
        let name = format!("foldgate-conn-{n}");
        assert!(threads.contains(&name), "no thread {name} in {threads:?}");
    }
    assert!(threads.iter().any(|t| t.starts_with("foldgate-compa")), "{threads:?}");

    // Many connections at once: every one is served, whichever thread accepts it.
    let answers = (0..24).map(|i| {
        let url = format!("http://{addr}/v1/models?n={i}");
        tokio::spawn(async move { send(Request::get(url).body(full("")).unwrap()).await.0 })
    });
    for answer in answers {
        assert_eq!(answer.await.unwrap(), StatusCode::OK);
    }

    // A long conversation is compacted (on the compaction runtime) and still answered.
    let mut outcomes = Vec::new();
    for body in requests(&conversation(40, 5), &[]) {
        let url = format!("http://{addr}/v1/chat/completions");
        let (status, headers, _) =
            send(chat_request_to(&url, body, "Bearer sk-test", "threads")).await;
        assert_eq!(status, StatusCode::OK);
        outcomes.push(headers["x-foldgate-outcome"].to_str().unwrap().to_owned());
    }
    assert_eq!(outcomes[0], "passthrough");
    assert_eq!(outcomes.last().unwrap(), "compacted", "{outcomes:?}");
    assert!(stats.summaries.load(Ordering::SeqCst) >= 1, "the model summarizer ran");

    Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    let lines = tokio::task::spawn_blocking(move || lines.after_exit()).await.unwrap();
    assert!(status.success(), "{status:?}\n{}", lines.join("\n"));
}

/// `THP_enabled` of process `pid` (Linux: 0 once the process turned transparent huge
/// pages off for itself).
fn thp_enabled(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(|v| v.trim().to_owned())
}

#[tokio::test]
async fn transparent_huge_pages_are_off_unless_the_configuration_allows_them() {
    if thp_enabled(std::process::id()).is_none() {
        // A kernel before 5.0 does not say; the call is made all the same.
        assert!(std::env::var_os("CI").is_none(), "CI runs on a kernel that says");
        println!("skipped: this kernel's /proc/<pid>/status has no THP_enabled line");
        return;
    }
    let mock = MockUpstream::echo().await;
    for (allowed, expected) in [("false", "0"), ("true", "1")] {
        let env = [("FOLDGATE_SERVER__TRANSPARENT_HUGE_PAGES", allowed)];
        let (mut child, _addr, _lines) = spawn_serve(&mock.url(), &env);
        let pid = child.id();
        assert_eq!(thp_enabled(pid).as_deref(), Some(expected), "allowed = {allowed}");
        Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    }
}
