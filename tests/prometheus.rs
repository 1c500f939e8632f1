//! The dashboard against a real Prometheus: start `prometheus` scraping an in-process
//! foldgate every second, drive every kind of traffic the dashboard shows, then run each
//! PromQL expression of `dashboards/foldgate.json` through Prometheus's HTTP API and
//! require that it parses and returns data. Also `promtool check config` on the compose
//! stack's Prometheus config.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::{chat_config, conversation, requests};
use common::*;
use foldgate::model::DIGEST_MARKER;
use http::{Request, StatusCode};
use serde_json::{Value, json};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// True when the Prometheus `tool` runs here (else skipped, or failed under CI).
fn have(tool: &str) -> bool {
    common::tools::tool_available(tool, "prometheus")
}

#[test]
fn promtool_accepts_the_compose_prometheus_config() {
    if !have("promtool") {
        return;
    }
    let output = Command::new("promtool")
        .args(["check", "config"])
        .arg(repo("config/prometheus.yml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool check config failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `prometheus` process, killed when dropped.
struct PrometheusProcess {
    child: Child,
    addr: String,
    _dir: TempDir,
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("foldgate-prom-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PrometheusProcess {
    async fn start(target: std::net::SocketAddr) -> Self {
        let dir = TempDir::new();
        let config = dir.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: foldgate\n    scrape_interval: 1s\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.0.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let process = Self { child, addr, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ready = client()
                .request(Request::get(process.url("/-/ready")).body(full("")).unwrap())
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            if ready {
                return process;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready:\n{}",
                process.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until Prometheus has scraped foldgate `n` more times than it had when called.
    async fn await_scrapes(&self, n: u32) {
        let scrapes = "count_over_time(foldgate_active_sessions[10m])";
        let count = |answer: Value| {
            answer["data"]["result"][0]["value"][1].as_str().and_then(|v| v.parse::<f64>().ok())
        };
        let start = count(self.query(scrapes).await).unwrap_or(0.0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if count(self.query(scrapes).await).unwrap_or(0.0) >= start + f64::from(n) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus did not scrape foldgate:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<endpoint>?<params>`, the decoded JSON answer.
    async fn api(&self, endpoint: &str, params: &[(&str, String)]) -> Value {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())))
            .finish();
        let (_, _, body) = send(
            Request::get(self.url(&format!("/api/v1/{endpoint}?{query}"))).body(full("")).unwrap(),
        )
        .await;
        serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
    }

    async fn query(&self, expr: &str) -> Value {
        self.api("query", &[("query", expr.to_owned())]).await
    }

    async fn query_range(&self, expr: &str) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        self.api(
            "query_range",
            &[
                ("query", expr.to_owned()),
                ("start", format!("{:.3}", now - 60.0)),
                ("end", format!("{now:.3}")),
                ("step", "1".to_owned()),
            ],
        )
        .await
    }
}

/// Every `targets[].expr` of the dashboard (rows' nested panels too), with Grafana's
/// interval variables replaced by a fixed window.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("dashboards/foldgate.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            assert!(!expr.contains("datasource"), "a data source in an expression: {expr}");
            let expr = ["$__rate_interval", "${__rate_interval}", "$__interval", "$__range"]
                .iter()
                .fold(expr.to_owned(), |e, var| e.replace(var, "1m"));
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            exprs.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    exprs
}

fn non_empty(answer: &Value) -> bool {
    answer["status"] == "success"
        && answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty())
}

/// The agent provider, plus: summaries fail for credential `Bearer fail`, and a chat call
/// with `x-test-overflow` is rejected as too long until it carries a digest.
fn provider() -> Handler {
    let normal = common::agent::provider(Default::default());
    std::sync::Arc::new(move |rec: Recorded| {
        let normal = normal.clone();
        Box::pin(async move {
            let summary = rec.headers.contains_key("x-foldgate-summary");
            if summary && rec.headers.get("authorization").is_some_and(|v| v == "Bearer fail") {
                return response(503, r#"{"error":{"message":"overloaded"}}"#);
            }
            let has_digest = String::from_utf8_lossy(&rec.body).contains(DIGEST_MARKER);
            if !summary && rec.headers.contains_key("x-test-overflow") && !has_digest {
                return response(
                    400,
                    r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","code":"context_length_exceeded"}}"#,
                );
            }
            normal(rec).await
        })
    })
}

async fn chat(proxy: &Proxy, body: bytes::Bytes, headers: &[(&str, &str)]) -> http::HeaderMap {
    let mut request =
        Request::post(proxy.url("/v1/chat/completions")).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let (status, headers, answer) = send(request.body(full(body)).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&answer));
    headers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    if !have("prometheus") {
        return;
    }
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 15, "{} expressions", exprs.len());

    let mock = MockUpstream::start(provider()).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let prometheus = PrometheusProcess::start(proxy.addr).await;

    // Traffic: plain, compacted, streamed, a failing summarizer, an overflow retry, a 404.
    let plain = requests(&conversation(2, 0), &[]).pop().unwrap();
    let big = requests(&conversation(30, 0), &[]).pop().unwrap();
    let streamed = requests(&conversation(30, 0), &[("stream", json!(true))]).pop().unwrap();
    let medium = requests(&conversation(8, 0), &[]).pop().unwrap();
    let h = chat(&proxy, plain, &[("x-session-id", "plain")]).await;
    assert_eq!(h["x-foldgate-outcome"], "passthrough");
    let h = chat(&proxy, big.clone(), &[("x-session-id", "big")]).await;
    assert_eq!(h["x-foldgate-outcome"], "compacted");
    let h = chat(&proxy, streamed, &[("x-session-id", "stream")]).await;
    assert_eq!(h["content-type"], "text/event-stream");
    let h = chat(&proxy, big, &[("x-session-id", "fail"), ("authorization", "Bearer fail")]).await;
    assert_eq!(h["x-foldgate-outcome"], "compacted");
    let h = chat(&proxy, medium, &[("x-session-id", "overflow"), ("x-test-overflow", "1")]).await;
    assert_eq!(h["x-foldgate-retried"], "1");
    let (status, _, _) = send(Request::get(proxy.url("/nope")).body(full("")).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Two scrapes after the traffic, so that every rate() has two samples to work with.
    prometheus.await_scrapes(2).await;
    let deadline = Instant::now() + Duration::from_secs(20);

    let mut pending = exprs;
    let mut failures = Vec::new();
    while !pending.is_empty() {
        let mut empty = Vec::new();
        for (title, expr) in pending {
            let answer = prometheus.query(&expr).await;
            assert_eq!(answer["status"], "success", "{title}: {expr}: {answer}");
            if non_empty(&answer) || non_empty(&prometheus.query_range(&expr).await) {
                continue;
            }
            empty.push((title, expr));
        }
        if empty.is_empty() || Instant::now() > deadline {
            failures = empty;
            break;
        }
        pending = empty;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(failures.is_empty(), "dashboard queries without data: {failures:#?}");
}

/// The panels whose instant query returns no series, or a value that is not a number
/// (Grafana shows "No data" or "NaN" for both), with what Prometheus answered.
async fn panels_without_a_value(
    prometheus: &PrometheusProcess,
    exprs: &[(String, String)],
) -> Vec<String> {
    let mut failures = Vec::new();
    for (title, expr) in exprs {
        let answer = prometheus.query(expr).await;
        assert_eq!(answer["status"], "success", "{title}: {expr}: {answer}");
        let result = answer["data"]["result"].as_array().cloned().unwrap_or_default();
        let numbers = result.iter().all(|series| {
            series["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        });
        if result.is_empty() || !numbers {
            failures.push(format!("{title}: {expr} -> {}", answer["data"]["result"]));
        }
    }
    failures
}

/// A healthy proxy shows a number on every panel: before any traffic, and after ordinary,
/// error-free traffic that compacts nothing (a passthrough GET, a small chat request, a
/// small streamed one). Series of events that have not happened yet are exported at zero
/// or the query falls back to a neutral value; "No data" would read as broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_healthy_proxy_shows_a_number_on_every_panel() {
    if !have("prometheus") {
        return;
    }
    let exprs = dashboard_exprs();
    let mock = MockUpstream::start(provider()).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let prometheus = PrometheusProcess::start(proxy.addr).await;

    prometheus.await_scrapes(2).await;
    let fresh = panels_without_a_value(&prometheus, &exprs).await;
    assert!(fresh.is_empty(), "panels without a value before any traffic: {fresh:#?}");

    let (status, _, _) = send(Request::get(proxy.url("/v1/models")).body(full("")).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let plain = requests(&conversation(2, 0), &[]).pop().unwrap();
    let streamed = requests(&conversation(2, 0), &[("stream", json!(true))]).pop().unwrap();
    let h = chat(&proxy, plain, &[("x-session-id", "plain")]).await;
    assert_eq!(h["x-foldgate-outcome"], "passthrough");
    let h = chat(&proxy, streamed, &[("x-session-id", "stream")]).await;
    assert_eq!(h["content-type"], "text/event-stream");

    prometheus.await_scrapes(2).await;
    let after = panels_without_a_value(&prometheus, &exprs).await;
    assert!(after.is_empty(), "panels without a value after error-free traffic: {after:#?}");
}
