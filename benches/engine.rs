#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr, missing_docs)]
//! Engine benchmarks: JSON parsing, cold tokenization, planning a 100k-token
//! conversation cold and warm, bounded counting of a 5 MB adversarial message against
//! 5 MB of ordinary text, tiktoken-rs against bpe-openai, and compaction of 10,000 and
//! 100,000 short messages (linear time).
//!
//! Conversations come from `../shared/traces/dev.jsonl` (beside the repository): the
//! longest sessions are concatenated until they reach 100k tokens.
//!
//! Run: `cargo bench --bench engine -- --warm-up-time 1 --measurement-time 3`

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use foldgate::compaction::tokens::{Counter, Encoding, message_tokens};
use foldgate::compaction::{Budget, Engine, Forward, Options, SessionState, TokenCache};
use foldgate::config::CompactionConfig;
use foldgate::model::{ChatRequest, Message};
use foldgate::summarizer::ExtractiveSummarizer;
use serde_json::{Value, json};

/// The allocator the `foldgate` binary runs with: the engine is measured as it runs there.
#[global_allocator]
static ALLOCATOR: foldgate::allocator::Allocator = foldgate::allocator::Allocator;

#[path = "support/traces.rs"]
mod traces;
use traces::conversation;
#[path = "support/short_messages.rs"]
mod short;
use short::short_messages;

fn body(msgs: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "gpt-4o", "messages": msgs, "temperature": 0})).unwrap()
}

fn message_text(req: &ChatRequest) -> usize {
    req.messages().iter().map(|m| m.raw().len()).sum()
}

fn ordinary_text(bytes: usize) -> String {
    let msgs = conversation(100_000);
    let mut s = String::new();
    while s.len() < bytes {
        for m in &msgs {
            s.push_str(&Message::from_value(m.clone()).unwrap().text());
            s.push('\n');
            if s.len() >= bytes {
                break;
            }
        }
    }
    let mut end = bytes.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

/// The engine on a 100k-token agent conversation: parsing, cold counting, planning.
fn engine_benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let msgs = conversation(100_000);
    let full = body(&msgs);
    let req = ChatRequest::parse(&full).unwrap();
    let engine = Engine::new(CompactionConfig::default());
    let opts = Options::default();
    let budget = Budget::of(&req, engine.config(), &opts);
    let tokens = engine.count_prompt(&req, &budget, &mut TokenCache::default());
    eprintln!("conversation: {} messages, {} tokens, {} bytes", msgs.len(), tokens, full.len());
    parse_benches(c, &full, &req);
    plan_benches(c, &Planner { rt: &rt, engine: &engine, opts: &opts }, &req, &budget);
}

/// Parsing the 100k-token request (`full`), and counting the tokens of its messages
/// (`req`) cold.
fn parse_benches(c: &mut Criterion, full: &[u8], req: &ChatRequest) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Bytes(full.len() as u64));
    g.bench_function("request_100k_tokens", |b| b.iter(|| ChatRequest::parse(full).unwrap()));
    g.finish();

    let mut g = c.benchmark_group("tokenize_cold");
    g.throughput(Throughput::Bytes(message_text(req) as u64));
    g.sample_size(10);
    g.bench_function("messages_100k_tokens", |b| {
        b.iter(|| {
            req.messages().iter().map(|m| message_tokens(Encoding::O200kBase, m)).sum::<usize>()
        })
    });
    // As a request is counted: the uncounted messages on up to as many threads as cores.
    g.bench_function("messages_100k_tokens_parallel", |b| {
        b.iter(|| {
            let mut cache = TokenCache::default();
            let mut counter = Counter { encoding: Encoding::O200kBase, cache: &mut cache };
            counter.messages(req.messages()).iter().sum::<usize>()
        })
    });
    g.finish();
}

/// The engine as the benches call it: on `rt`, with the extractive summarizer and `opts`.
struct Planner<'a> {
    rt: &'a tokio::runtime::Runtime,
    engine: &'a Engine,
    opts: &'a Options,
}

impl Planner<'_> {
    /// Compacts `req` in the session `st`.
    fn compact(&self, req: &ChatRequest, st: &mut SessionState) -> Forward {
        self.rt
            .block_on(self.engine.compact_request(req, st, &ExtractiveSummarizer, self.opts))
            .unwrap()
    }
}

/// Planning the 100k-token request `req`: cold (a new session), warm (its history
/// compacted before, one new message), and warm with the new message's tokens counted.
fn plan_benches(c: &mut Criterion, planner: &Planner<'_>, req: &ChatRequest, budget: &Budget) {
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    g.bench_function("cold_100k_tokens", |b| {
        b.iter_batched(
            SessionState::default,
            |mut st| planner.compact(req, &mut st),
            BatchSize::LargeInput,
        )
    });
    let (next, warm) = warm_session(planner, req);
    g.sample_size(50);
    g.bench_function("warm_100k_tokens_one_new_message", |b| {
        b.iter_batched(
            || warm.clone(),
            |mut st| planner.compact(&next, &mut st),
            BatchSize::LargeInput,
        )
    });
    // The same, with the new message's count already cached: planning alone.
    let mut counted = warm.clone();
    planner.engine.count_prompt(&next, budget, &mut counted.token_cache);
    g.bench_function("warm_100k_tokens_new_message_counted", |b| {
        b.iter_batched(
            || counted.clone(),
            |mut st| planner.compact(&next, &mut st),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Warm: the conversation without its last message was compacted before; the request
/// adds that message (the newest user turn). The request and the session before it.
fn warm_session(planner: &Planner<'_>, req: &ChatRequest) -> (ChatRequest, SessionState) {
    let last = req.messages().len() - 1;
    let earlier = req.with_messages(req.messages()[..last].to_vec());
    let next = req.clone();
    let mut warm = SessionState::default();
    let first = planner.compact(&earlier, &mut warm);
    let out = planner.compact(&next, &mut warm.clone());
    eprintln!(
        "warm setup: new message {} bytes; first tier {} blocks {}; warm tier {} reused {} new {}",
        req.messages()[last].raw().len(),
        first.report().tier,
        warm.blocks.len(),
        out.report().tier,
        out.report().blocks_reused,
        out.report().blocks_new
    );
    (next, warm)
}

fn counting_benches(c: &mut Criterion) {
    const SIZE: usize = 5 * 1024 * 1024;
    let ordinary = ordinary_text(SIZE);
    let adversarial = "a".repeat(SIZE);
    let spaces = " ".repeat(SIZE);
    let mut g = c.benchmark_group("count_5mb");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(SIZE as u64));
    for (name, text) in
        [("ordinary", &ordinary), ("adversarial_a", &adversarial), ("adversarial_spaces", &spaces)]
    {
        g.bench_function(name, |b| b.iter(|| Encoding::O200kBase.count(text)));
    }
    g.bench_function("bpe_openai_ordinary", |b| {
        b.iter(|| bpe_openai::o200k_base().count(ordinary.as_str()))
    });
    g.bench_function("bpe_openai_adversarial_a", |b| {
        b.iter(|| bpe_openai::o200k_base().count(adversarial.as_str()))
    });
    g.finish();

    // foldgate's count (bpe-openai, bounded) against tiktoken-rs and bpe-openai unbounded,
    // on 1 MB of ordinary text.
    let text = ordinary_text(1024 * 1024);
    let ours = Encoding::O200kBase.count(&text);
    let tiktoken = tiktoken_rs::o200k_base_singleton().encode_ordinary(&text).len();
    let bpe = bpe_openai::o200k_base().count(text.as_str());
    eprintln!(
        "1 MB ordinary text: foldgate (bounded) {ours}, tiktoken-rs {tiktoken}, bpe-openai {bpe} tokens"
    );
    let mut g = c.benchmark_group("tokenizer_1mb");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("foldgate_bounded", |b| b.iter(|| Encoding::O200kBase.count(&text)));
    g.bench_function("tiktoken_rs", |b| {
        b.iter(|| tiktoken_rs::o200k_base_singleton().encode_ordinary(&text).len())
    });
    g.bench_function("bpe_openai", |b| b.iter(|| bpe_openai::o200k_base().count(text.as_str())));
    g.finish();
}

/// Parse and compact one request of 10,000 and of 100,000 short messages at a
/// 16,000-token window (tier 4 applies): the time must grow linearly with the messages.
fn scaling_benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let engine = Engine::new(CompactionConfig::default());
    let opts = Options { window_cap: Some(16_000), ..Options::default() };
    let compact = |body: &[u8]| {
        let mut state = SessionState::default();
        rt.block_on(engine.compact(body, &mut state, &ExtractiveSummarizer, &opts)).unwrap()
    };
    let sizes = [10_000, 100_000];
    let bodies: Vec<Vec<u8>> = sizes.iter().map(|&n| short_messages(n)).collect();
    // The tokenizer tables load once per process, outside any measurement.
    compact(&bodies[0]);
    // Runs of the two sizes alternate, so that a slower spell of the machine falls on
    // both; each figure is the median of its runs, and the ratio is also taken per round
    // (a 10k run and the 100k run after it), whose median a drift of the machine's speed
    // between rounds moves least.
    const ROUNDS: usize = 15;
    let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (times, body) in runs.iter_mut().zip(&bodies) {
            let t = std::time::Instant::now();
            compact(body);
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per_round = median(runs[1].iter().zip(&runs[0]).map(|(big, small)| big / small).collect());
    let mut medians = Vec::new();
    for ((n, body), times) in sizes.iter().zip(&bodies).zip(&runs) {
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        let m = median(times.clone());
        let tier = compact(body).report().tier;
        eprintln!(
            "{n} short messages ({} bytes): median of {ROUNDS} {:.1} ms (fastest {:.1}), tier {tier}",
            body.len(),
            m * 1e3,
            fastest * 1e3
        );
        medians.push(m);
    }
    eprintln!(
        "100k / 10k messages: {:.2}x the time for 10x the messages (ratio of the medians); \
         per round: median {per_round:.2}x",
        medians[1] / medians[0]
    );

    let mut g = c.benchmark_group("scale");
    g.sample_size(10);
    for (n, body) in sizes.iter().zip(&bodies) {
        g.throughput(Throughput::Elements(*n as u64));
        g.bench_function(format!("compact_{n}_short_messages"), |b| b.iter(|| compact(body)));
    }
    g.finish();
}

criterion_group!(benches, engine_benches, counting_benches, scaling_benches);
criterion_main!(benches);
