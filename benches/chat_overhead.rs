//! Added latency of the chat path with compaction warm: a ~100k-token agent conversation
//! whose fold blocks are stored, sent again with one new message per request, at a fixed
//! rate, against the same requests sent straight to the mock provider.
//!
//! A fourth path runs the warm chat path with sessions in a real `redis-server` (started
//! here on a free port, skipped with the reason printed when there is none) and reports
//! what Redis adds over the in-memory store, and the bytes stored for the conversation;
//! a fifth with sessions in a real Redis Cluster (six `redis-server` processes, three
//! primaries), beside them.
//!
//! Run: `cargo bench --bench chat_overhead` (options: `--rate N`, `--seconds N`;
//! `--otlp` adds a path with compaction warm and trace export on, every span sent over
//! OTLP/HTTP to a mock collector on a thread of its own (a build without `[telemetry]`
//! refuses to start with it);
//! `BENCH_FOLDGATE_BIN=path` measures another build of foldgate).
//! Targets: under 5 ms added at p99 at 100 requests per second; Redis over memory at
//! most 0.5 ms at p99 on loopback.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use args::arg;
use foldgate_process::{ChildGuard, FoldgateOptions};

#[path = "support/args.rs"]
mod args;
#[path = "support/foldgate_process.rs"]
mod foldgate_process;
#[path = "support/mock_upstream.rs"]
mod mock_upstream;
#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../tests/common/redis_topology.rs"]
mod redis_topology;
#[path = "../tests/common/tools.rs"]
mod tools;
#[path = "support/traces.rs"]
mod traces;

const COMPLETION: &str = r#"{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

fn body(history: &[Value], turn: usize) -> Bytes {
    let mut messages = history.to_vec();
    messages.push(json!({"role": "assistant", "content": format!("Step {turn} done.")}));
    messages.push(json!({"role": "user", "content": format!("Continue with step {}.", turn + 1)}));
    // gpt-4o: a 128k window; 100k prompt tokens are past the 0.75 trigger.
    let body = json!({"model": "gpt-4o", "messages": messages, "max_tokens": 1024});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// foldgate in front of the mock at `upstream` (compaction on or off, extractive
/// digests, `env` on top), logging warnings to the bench's output.
fn start_foldgate(upstream: SocketAddr, compaction: bool, env: &[(&str, String)]) -> ChildGuard {
    let mut settings = vec![("FOLDGATE_SUMMARIZER__KIND", "extractive".to_owned())];
    settings.extend(env.iter().cloned());
    foldgate_process::start_foldgate(FoldgateOptions {
        // Another build of foldgate may be measured instead (e.g. an older revision,
        // for a before/after comparison): `BENCH_FOLDGATE_BIN=path`.
        bin: std::env::var_os("BENCH_FOLDGATE_BIN")
            .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_foldgate")), PathBuf::from),
        upstream,
        compaction,
        env: settings,
        dir: None,
        log: None,
    })
}

struct Run {
    latencies: Vec<Duration>,
    errors: usize,
}

/// Sends `bodies` (cycling) at `rate` per second for `seconds`, open loop: latency is
/// measured from each request's scheduled time, so a stall cannot hide queued requests.
async fn load(addr: SocketAddr, bodies: &[Bytes], session: &str, rate: u32, seconds: u32) -> Run {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build_http();
    let uri: http::Uri = format!("http://{addr}/v1/chat/completions").parse().unwrap();
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for i in 0..(rate * seconds) as usize {
        let scheduled = start + interval * i as u32;
        tokio::time::sleep_until(scheduled).await;
        let request = Request::post(uri.clone())
            .header("authorization", "Bearer bench")
            .header("x-session-id", session)
            .header("content-type", "application/json")
            .body(Full::new(bodies[i % bodies.len()].clone()))
            .unwrap();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let ok = match client.request(request).await {
                Ok(response) => {
                    let ok = response.status().is_success();
                    ok && response.into_body().collect().await.is_ok()
                }
                Err(_) => false,
            };
            (scheduled.elapsed(), ok)
        }));
    }
    let mut run = Run { latencies: Vec::new(), errors: 0 };
    for task in tasks {
        let (latency, ok) = task.await.unwrap();
        run.latencies.push(latency);
        run.errors += usize::from(!ok);
    }
    run.latencies.sort();
    run
}

fn pct(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn main() {
    let rate = arg("--rate", 100);
    let seconds = arg("--seconds", 10);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mock = mock_upstream::start(COMPLETION).await;
        let warm = start_foldgate(mock, true, &[]);
        let plain = start_foldgate(mock, false, &[]);
        let redis = redis_server::RedisServer::start();
        let shared = redis.as_ref().map(|redis| {
            let env = [
                ("FOLDGATE_SESSION__STORE", "redis".to_owned()),
                ("FOLDGATE_SESSION__REDIS_URL", redis.url()),
            ];
            start_foldgate(mock, true, &env)
        });
        let cluster = redis_topology::RedisCluster::start();
        let clustered = cluster.as_ref().map(|cluster| {
            let env = [
                ("FOLDGATE_SESSION__STORE", "redis".to_owned()),
                ("FOLDGATE_SESSION__REDIS_MODE", "cluster".to_owned()),
                ("FOLDGATE_SESSION__REDIS_URL", cluster.urls()),
            ];
            start_foldgate(mock, true, &env)
        });
        // Trace export on, to a collector on a thread of its own.
        let exporting = std::env::args().any(|a| a == "--otlp").then(|| {
            let collector = collector();
            let env = [("FOLDGATE_TELEMETRY__OTLP_ENDPOINT", format!("http://{collector}"))];
            start_foldgate(mock, true, &env)
        });
        let history = traces::conversation(108_000);
        // One distinct request per send: the stored history plus one new exchange.
        let bodies: Vec<Bytes> = (0..(rate * seconds) as usize).map(|turn| body(&history, turn)).collect();
        println!("request body: {} KB, {} messages", bodies[0].len() / 1024, history.len() + 2);

        // Warm up: the first request folds (extractive digest) and stores the blocks.
        let mut paths = vec![
            ("direct to the mock", mock),
            ("foldgate, compaction off", plain.addr),
            ("foldgate, compaction warm", warm.addr),
        ];
        if let Some(shared) = &shared {
            paths.push(("foldgate, compaction warm, Redis store", shared.addr));
        }
        if let Some(clustered) = &clustered {
            paths.push(("foldgate, compaction warm, Redis Cluster store", clustered.addr));
        }
        if let Some(exporting) = &exporting {
            paths.push(("foldgate, compaction warm, OTLP export on", exporting.addr));
        }
        for &(name, addr) in &paths[2..] {
            warm_up(name, addr, &bodies[0]).await;
            load(addr, &bodies[..rate as usize], "warm", rate, 1).await;
        }
        if let Some(redis) = &redis {
            print_stored_sizes(redis).await;
        }

        println!("\n| path | p50 ms | p99 ms | max ms | errors |\n| --- | --- | --- | --- | --- |");
        let mut p99 = Vec::new();
        for &(name, addr) in &paths {
            let run = load(addr, &bodies, "warm", rate, seconds).await;
            let l = &run.latencies;
            println!("| {name} | {:.2} | {:.2} | {:.2} | {} |", pct(l, 0.5), pct(l, 0.99), pct(l, 1.0), run.errors);
            p99.push((name, pct(l, 0.99)));
        }
        let p99_of = |wanted: &str| p99.iter().find(|(name, _)| *name == wanted).map(|p| p.1);
        let p99: Vec<f64> = p99.iter().map(|p| p.1).collect();
        println!(
            "\nadded at p99: compaction off {:.2} ms, compaction warm {:.2} ms (target < 5 ms) at {rate} req/s",
            p99[1] - p99[0],
            p99[2] - p99[0]
        );
        if let Some(redis_p99) = p99_of("foldgate, compaction warm, Redis store") {
            println!(
                "Redis store over memory store at p99: {:.2} ms (target <= 0.5 ms)",
                redis_p99 - p99[2]
            );
        }
        if let Some(otlp_p99) = p99_of("foldgate, compaction warm, OTLP export on") {
            println!("OTLP export on over off (memory store) at p99: {:.2} ms", otlp_p99 - p99[2]);
        }
        if let Some(cluster_p99) = p99_of("foldgate, compaction warm, Redis Cluster store") {
            println!(
                "Redis Cluster store over memory store at p99: {:.2} ms, added over direct: {:.2} ms",
                cluster_p99 - p99[2],
                cluster_p99 - p99[0]
            );
        }
    });
}

/// A collector for trace exports (the mock, which takes `POST /v1/traces`) on a thread
/// and runtime of its own: receiving spans must not take time from the load generator.
fn collector() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            tx.send(mock_upstream::start(COMPLETION).await).unwrap();
            std::future::pending::<()>().await
        });
    });
    rx.recv().unwrap()
}

/// Prints the bytes each session stored in `redis` takes: its state and Redis's memory.
async fn print_stored_sizes(redis: &redis_server::RedisServer) {
    let mut conn = redis.connection().await;
    let keys: Vec<String> =
        redis::cmd("KEYS").arg("foldgate:{*}:s").query_async(&mut conn).await.unwrap();
    for key in keys {
        let state: usize =
            redis::cmd("HSTRLEN").arg(&key).arg("state").query_async(&mut conn).await.unwrap();
        let memory: usize =
            redis::cmd("MEMORY").arg("USAGE").arg(&key).query_async(&mut conn).await.unwrap();
        println!("stored per session: state {state} bytes, Redis memory {memory} bytes");
    }
}

/// Sends the first request of the conversation, which folds and stores its blocks.
async fn warm_up(name: &str, addr: SocketAddr, body: &Bytes) {
    let started = Instant::now();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let first = client
        .request(
            Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", "Bearer bench")
                .header("x-session-id", "warm")
                .body(Full::new(body.clone()))
                .unwrap(),
        )
        .await
        .unwrap();
    let header = |name: &str| {
        first.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned()
    };
    println!(
        "{name}: cold first request {:.1} ms, outcome {}, prompt tokens {} -> {}",
        started.elapsed().as_secs_f64() * 1000.0,
        header("x-foldgate-outcome"),
        header("x-foldgate-tokens-before"),
        header("x-foldgate-tokens-after"),
    );
    assert_eq!(header("x-foldgate-outcome"), "compacted");
}
