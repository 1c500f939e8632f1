//! The first request of a long conversation foldgate has never seen, and the requests
//! after it: a ~500 KB agent conversation (127k o200k tokens, past gpt-4o's trigger, so
//! that it must be counted exactly and planned) sent through foldgate in the default
//! configuration, beside the same bodies sent straight to the mock provider.
//!
//! Each round starts a new conversation (its system prompt names the round, so no count
//! of it is cached anywhere), sends its first request (cold: every message counted),
//! then `--steady N` more, each the one before with one more exchange, one at a time.
//! Added latency is foldgate's time less the median of the same body sent direct. After
//! the rounds, foldgate is restarted and a conversation it served goes on: the first
//! request after a restart is cold again (token counts are kept per process).
//!
//! Run: `cargo bench --bench cold_conversation` (options: `--rounds N` (default 5),
//! `--steady N` (default 20), `--tokens N` (default 127000), `--verbose 1` (each steady
//! request's time and outcome); `BENCH_FOLDGATE_BIN=path`
//! measures another build). Targets: the cold first request adds at most 40 ms, a
//! steady one at most 5 ms.
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
use foldgate::compaction::tokens::{Encoding, message_tokens};
use foldgate::model::Message;
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
#[path = "support/traces.rs"]
mod traces;

const COMPLETION: &str = r#"{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// foldgate in its default configuration in front of the mock at `upstream`.
fn start_foldgate(upstream: SocketAddr) -> ChildGuard {
    foldgate_process::start_foldgate(FoldgateOptions {
        bin: std::env::var_os("BENCH_FOLDGATE_BIN")
            .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_foldgate")), PathBuf::from),
        upstream,
        compaction: true,
        env: Vec::new(),
        dir: None,
        log: None,
    })
}

/// Request `turn` of conversation `round`: its history and `turn` more exchanges.
fn body(history: &[Value], round: usize, turn: usize) -> Bytes {
    let mut messages = history.to_vec();
    let system = messages[0]["content"].as_str().unwrap_or_default();
    messages[0]["content"] = json!(format!("Conversation {round}.\n{system}"));
    for step in 0..turn {
        messages.push(json!({"role": "assistant", "content": format!("Step {step} done.")}));
        messages
            .push(json!({"role": "user", "content": format!("Continue with step {}.", step + 1)}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages, "max_tokens": 1024});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// Sends `body` to `addr`; the time to the last byte and foldgate's outcome header.
async fn send(client: &HttpClient, addr: SocketAddr, body: &Bytes) -> (Duration, String) {
    let started = Instant::now();
    let response = client
        .request(
            Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", "Bearer bench")
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let header = |name: &str| {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned()
    };
    let outcome = format!(
        "{}, tier {}, tokens {} -> {}",
        header("x-foldgate-outcome"),
        header("x-foldgate-tier"),
        header("x-foldgate-tokens-before"),
        header("x-foldgate-tokens-after")
    );
    response.into_body().collect().await.unwrap();
    (started.elapsed(), outcome)
}

/// Median time of `body` sent straight to the mock.
async fn direct(client: &HttpClient, mock: SocketAddr, body: &Bytes) -> Duration {
    let mut times = Vec::new();
    for _ in 0..5 {
        times.push(send(client, mock, body).await.0);
    }
    times.sort();
    times[2]
}

/// The first messages of `history` holding about `tokens` o200k tokens (at most), ending
/// on a user or tool message. The recorded sessions hold single messages of many
/// thousand tokens: the message that would overshoot, when its content is text (not
/// calls), is cut to the room left.
fn at_most(history: Vec<Value>, tokens: usize) -> Vec<Value> {
    let count =
        |m: &Value| message_tokens(Encoding::O200kBase, &Message::from_value(m.clone()).unwrap());
    let mut out = Vec::new();
    let mut total = 0;
    for m in history {
        let n = count(&m);
        if total + n <= tokens {
            total += n;
            out.push(m);
            continue;
        }
        let cuttable = m.get("tool_calls").is_none_or(Value::is_null);
        if let (true, Some(text)) = (cuttable, m["content"].as_str()) {
            let mut chars: Vec<char> = text.chars().collect();
            let mut cut = m.clone();
            while !chars.is_empty() {
                let room = (tokens - total) as f64 / count(&cut).max(1) as f64;
                chars.truncate((chars.len() as f64 * room.min(0.99)) as usize);
                cut["content"] = json!(chars.iter().collect::<String>());
                if total + count(&cut) <= tokens {
                    out.push(cut);
                    break;
                }
            }
        }
        break;
    }
    // A request ends on a user or tool message.
    if out.last().is_some_and(|m| m["role"] == "assistant") {
        out.push(json!({"role": "user", "content": "Go on."}));
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn added(through: Duration, direct: Duration) -> f64 {
    ms(through) - ms(direct)
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let rounds = arg("--rounds", 5);
    let steady = arg("--steady", 20);
    let tokens = arg("--tokens", 127_000);
    // `--verbose 1`: every steady request's added time and what foldgate did with it.
    let verbose = arg("--verbose", 0) != 0;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mock = mock_upstream::start(COMPLETION).await;
        let mut foldgate = start_foldgate(mock);
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let history = at_most(traces::conversation(tokens * 2), tokens);
        let first = body(&history, 0, 0);
        println!(
            "conversation: {} KiB, {} messages, at most {tokens} o200k tokens; gpt-4o (trigger 95,232)",
            first.len() / 1024,
            history.len()
        );
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let body0 = body(&history, round, 0);
            let base = direct(&client, mock, &body0).await;
            let (time, outcome) = send(&client, foldgate.addr, &body0).await;
            println!(
                "round {round}: cold first request {:.1} ms (direct {:.2} ms, added {:.1} ms), {outcome}",
                ms(time),
                ms(base),
                added(time, base)
            );
            cold.push(added(time, base));
            let mut steady_added = Vec::new();
            for turn in 1..=steady {
                let next = body(&history, round, turn);
                let base = direct(&client, mock, &next).await;
                let (time, outcome) = send(&client, foldgate.addr, &next).await;
                steady_added.push(added(time, base));
                if verbose {
                    println!("  request {turn}: added {:.1} ms, {outcome}", added(time, base));
                }
            }
            let shown: Vec<String> = steady_added.iter().take(5).map(|a| format!("{a:.1}")).collect();
            println!("  next requests added (ms): {} …", shown.join(", "));
            warm.extend(steady_added);
        }
        // A restart: the conversation of round 0 goes on, its counts are gone.
        drop(foldgate);
        foldgate = start_foldgate(mock);
        let next = body(&history, 0, steady + 1);
        let base = direct(&client, mock, &next).await;
        let (time, outcome) = send(&client, foldgate.addr, &next).await;
        let restarted = added(time, base);
        println!("after a restart: {:.1} ms (added {restarted:.1} ms), {outcome}", ms(time));

        cold.sort_by(f64::total_cmp);
        warm.sort_by(f64::total_cmp);
        println!();
        println!(
            "cold first request, added: median {:.1} ms, max {:.1} ms ({rounds} conversations; target ≤ 40 ms)",
            pct(&cold, 0.5),
            pct(&cold, 1.0)
        );
        println!("first request after a restart, added: {restarted:.1} ms");
        println!(
            "steady requests, added: p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms ({} requests; target ≤ 5 ms)",
            pct(&warm, 0.5),
            pct(&warm, 0.9),
            pct(&warm, 1.0),
            warm.len()
        );
    });
}
