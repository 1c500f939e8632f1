//! Recorded conversations sent through running proxies the way their agents sent them
//! (one request per assistant reply, holding the history before it), and what reached
//! the provider priced the way providers bill input with prompt caching: the part of a
//! request repeating the start of the conversation's previous one at `cached_price`, the
//! rest in full; summarizer calls against the last forwarded request.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use foldgate::commands::cost::{Charge, Meter, Prompt};
use foldgate::compaction::check::verify;
use foldgate::compaction::{Budget, Options, TokenCache};
use foldgate::config::Config;
use foldgate::model::ChatRequest;
use serde_json::{Value, json};

use super::agent::chat_request;
use super::{MockUpstream, Proxy, send};

/// The development traces (`../shared/traces/dev.jsonl`).
pub fn dev_traces() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    assert!(path.exists(), "{} is missing: clone shared/ beside the repository", path.display());
    path
}

/// The `per_family` longest conversations of each of `families` in the dev traces.
pub fn longest_sessions(families: &[&str], per_family: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(dev_traces()).unwrap();
    let mut sessions: Vec<Value> =
        text.lines().map(|line| serde_json::from_str::<Value>(line).unwrap()).collect();
    sessions.sort_by_key(|r| std::cmp::Reverse(r["messages"].as_array().unwrap().len()));
    let mut sample = Vec::new();
    for family in families {
        let of_family = sessions.iter().filter(|r| r["meta"]["family"] == *family);
        sample.extend(of_family.take(per_family).cloned());
    }
    sample
}

/// What a run cost and did.
#[derive(Debug, Default)]
pub struct Priced {
    /// The forwarded requests and the summarizer calls.
    pub forwarded: Charge,
    /// Every request sent whole.
    pub whole: Charge,
    /// Requests sent.
    pub requests: usize,
    /// Of those, compacted.
    pub compacted: usize,
    /// Summarizer calls that reached the provider.
    pub summarizer_calls: usize,
    /// Forwarded requests that do not start with the whole previous forwarded request.
    pub rewrites: usize,
    /// Broken guarantees, one line each.
    pub violations: Vec<String>,
}

impl Priced {
    /// The forwarded cost at `cached_price`, in token-equivalents.
    pub fn cost(&self, cached_price: f64) -> f64 {
        self.forwarded.price(cached_price)
    }

    /// The cost of sending everything whole at `cached_price`.
    pub fn cost_whole(&self, cached_price: f64) -> f64 {
        self.whole.price(cached_price)
    }
}

/// How the conversations are sent.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Pause after each answer (the agent's model thinking).
    pub between: Duration,
    /// Pause after each conversation (its background folds land).
    pub after: Duration,
}

/// Sends every conversation of `sessions` through `proxies` in turn (request `i` of the
/// run to `proxies[i % len]`), each under its own session header with `credential`,
/// `max_tokens` 1000, and prices what reached `mock` (configured as `config`: its
/// engine settings count the tokens). Every answer must be a 200.
pub async fn send_priced(
    proxies: &[&Proxy],
    mock: &MockUpstream,
    sessions: &[Value],
    credential: &str,
    pace: Pace,
    config: &Config,
) -> Priced {
    let mut priced = Priced::default();
    let mut cache = TokenCache::default();
    let mut sent_so_far = 0;
    for (n, record) in sessions.iter().enumerate() {
        let messages = record["messages"].as_array().unwrap();
        let seen = mock.recorded().len();
        let mut originals = Vec::new();
        for end in 1..messages.len() {
            if messages[end]["role"] != "assistant" {
                continue;
            }
            let body = json!({"model": record["model"], "messages": &messages[..end],
                "max_tokens": 1000});
            let body = Bytes::from(serde_json::to_vec(&body).unwrap());
            let proxy = proxies[sent_so_far % proxies.len()];
            sent_so_far += 1;
            let session = format!("{}-{n}", record["id"].as_str().unwrap_or("s"));
            let (status, headers, _) =
                send(chat_request(proxy, body.clone(), credential, &session)).await;
            assert_eq!(status, 200);
            priced.compacted += usize::from(headers["x-foldgate-outcome"] == "compacted");
            originals.push(ChatRequest::parse(&body).unwrap());
            tokio::time::sleep(pace.between).await;
        }
        tokio::time::sleep(pace.after).await;
        let (mut sent, mut whole) = (Meter::default(), Meter::default());
        // The conversation's calls in the order they reached the provider.
        let mut chats = 0;
        for rec in &mock.recorded()[seen..] {
            let request = ChatRequest::parse(&rec.body).unwrap();
            let budget = Budget::of(&request, &config.compaction, &Options::default());
            let prompt =
                Prompt::of(request.messages(), request.tools_raw(), budget.encoding, &mut cache);
            if rec.headers.contains_key("x-foldgate-summary") {
                priced.summarizer_calls += 1;
                priced.forwarded.add(sent.side_call(&prompt));
                continue;
            }
            let original = &originals[chats];
            chats += 1;
            let (charge, repeats) = sent.send(prompt);
            priced.forwarded.add(charge);
            priced.rewrites += usize::from(chats > 1 && !repeats);
            let whole_prompt =
                Prompt::of(original.messages(), original.tools_raw(), budget.encoding, &mut cache);
            priced.whole.add(whole.send(whole_prompt).0);
            let budget = Budget::of(original, &config.compaction, &Options::default());
            for v in verify(original, &request, &config.compaction, &budget, &mut cache) {
                let id = &record["id"];
                priced.violations.push(format!("{id} request {chats}: ({}) {}", v.check, v.detail));
            }
        }
        assert_eq!(chats, originals.len(), "one forwarded request per request");
        priced.requests += chats;
    }
    priced
}
