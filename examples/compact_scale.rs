#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]
//! Compacts a history of N short messages RUNS times, as `cargo bench --bench engine --
//! scale` does, printing each run's time: a steady process to profile or to count
//! instructions of (`valgrind --tool=callgrind --toggle-collect='*Engine*compact*'`).
//!
//! Run: `cargo run --release --example compact_scale -- [N (10000)] [RUNS (1)]`

use foldgate::compaction::{Engine, Options, SessionState};
use foldgate::config::CompactionConfig;
use foldgate::summarizer::ExtractiveSummarizer;

#[path = "../benches/support/short_messages.rs"]
mod short;

/// The allocator the `foldgate` binary runs with.
#[global_allocator]
static ALLOCATOR: foldgate::allocator::Allocator = foldgate::allocator::Allocator;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let n = args.next().and_then(Result::ok).unwrap_or(10_000);
    let runs = args.next().and_then(Result::ok).unwrap_or(1);
    let body = short::short_messages(n);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let engine = Engine::new(CompactionConfig::default());
    // As the bench: a 16,000-token window, so that the goal batch and the cut apply.
    let opts = Options { window_cap: Some(16_000), ..Options::default() };
    foldgate::compaction::tokens::encoding::load_default();
    for _ in 0..runs {
        let started = std::time::Instant::now();
        let mut state = SessionState::default();
        let forward =
            rt.block_on(engine.compact(&body, &mut state, &ExtractiveSummarizer, &opts)).unwrap();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        eprintln!("{n} short messages: {ms:.1} ms, tier {}", forward.report().tier);
    }
}
