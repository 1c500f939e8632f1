#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]
//! Replays the dev traces (`../shared/traces/dev.jsonl`, beside the repository) through
//! the engine with a 16k window and requires zero violations of guarantees 1-4.

use std::path::Path;

use foldgate::commands::replay::{ReplayOptions, replay_file};
use foldgate::compaction::{Engine, Options};
use foldgate::config::CompactionConfig;
use foldgate::summarizer::ExtractiveSummarizer;

#[tokio::test]
async fn dev_traces_replay_without_violations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    assert!(path.exists(), "{} is missing: clone shared/ beside the repository", path.display());
    let engine = Engine::new(CompactionConfig::default());
    let opts = ReplayOptions {
        engine: Options { window_cap: Some(16_000), ..Options::default() },
        max_tokens: None,
    };
    let (convs, total) =
        replay_file(&path, &engine, &|_| Box::new(ExtractiveSummarizer), &opts).await.unwrap();
    println!("{total:?}");
    assert_eq!(convs.len(), 184);
    assert_eq!(total.violation_count(), 0, "first: {:?}", total.first_violation);
    assert!(total.compacted > 1000, "{total:?}");
    assert!(total.peak_after <= 16_000 - 4096, "{total:?}");
    assert!(total.ratio() < 0.6, "{}", total.ratio());
}
