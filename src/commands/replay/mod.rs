//! `foldgate replay`: feeds recorded conversations to the engine the way an agent sends
//! them (one request per assistant reply, holding the history before that reply),
//! carrying fold blocks and token counts from request to request, and checks the
//! guarantees of every forwarded request.
//!
//! By job: `record` reads records into conversations, `requests` replays
//! one conversation request by request, `stats` sums the results and `print` writes
//! them; this file reads the file and runs the command.

mod print;
mod record;
mod requests;
mod stats;

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::Api;
use crate::cli::ReplayArgs;
use crate::compaction::{Engine, Options};
use crate::config::Config;
use crate::summarizer::llm::LlmSummarizer;
use crate::summarizer::{ExtractiveSummarizer, Summarizer};

pub use print::{cost_line, family_table};
pub use record::Conversation;
pub use requests::replay_conversation;
pub use stats::ReplayStats;

use requests::hex;

/// Errors of reading recorded conversations.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a conversation.
    #[error("line {line}: {message}")]
    Record {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The engine failed.
    #[error("{id}: {source}")]
    Engine {
        /// Conversation id.
        id: String,
        /// The engine's error.
        source: crate::compaction::CompactionError,
    },
}

/// Replays every conversation of a JSON Lines file; returns per-conversation stats and
/// the total.
pub async fn replay_file(
    path: &std::path::Path,
    engine: &Engine,
    summarizer: &SummarizerFor<'_>,
    opts: &ReplayOptions,
) -> Result<(Vec<ReplayStats>, ReplayStats), ReplayError> {
    replay_file_as(Api::Chat, path, engine, summarizer, opts).await
}

/// [`replay_file`] for records of the API shape `api`: chat records (`messages`), or
/// Responses or Anthropic Messages request bodies read through their conversion.
pub async fn replay_file_as(
    api: Api,
    path: &std::path::Path,
    engine: &Engine,
    summarizer: &SummarizerFor<'_>,
    opts: &ReplayOptions,
) -> Result<(Vec<ReplayStats>, ReplayStats), ReplayError> {
    let read_err = |source| ReplayError::Read { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut all = Vec::new();
    let mut total = ReplayStats { id: "total".into(), ..ReplayStats::default() };
    let mut hashes = Sha256::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(read_err)?;
        if line.trim().is_empty() {
            continue;
        }
        let model = opts.engine.model.as_deref();
        let mut conv = Conversation::from_line(api, &line, n + 1, model)?;
        if let Some(max) = opts.max_tokens {
            conv.fields.insert("max_tokens".into(), Value::from(max));
        }
        let model = conv.fields.get("model").and_then(Value::as_str).unwrap_or_default();
        let summarizer = summarizer(model);
        let stats = replay_conversation(engine, &conv, summarizer.as_ref(), &opts.engine).await?;
        total.add(&stats);
        hashes.update(stats.forwarded_sha256.as_bytes());
        all.push(stats);
    }
    total.forwarded_sha256 = hex(&hashes.finalize());
    Ok((all, total))
}

/// The summarizer for a conversation of the given model.
pub type SummarizerFor<'a> = dyn Fn(&str) -> Box<dyn Summarizer> + 'a;

/// How a file is replayed.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// The engine's options for every request.
    pub engine: Options,
    /// `max_tokens` set on every request (the reply reserve), when given.
    pub max_tokens: Option<usize>,
}

impl ReplayOptions {
    /// The options the command line asks for: `--window`, `--model`, `--max-tokens`.
    fn of_args(args: &ReplayArgs) -> Self {
        Self {
            engine: Options {
                window_cap: args.window,
                model: args.model.clone(),
                ..Options::default()
            },
            max_tokens: args.max_tokens,
        }
    }
}

/// Runs `foldgate replay`.
pub fn run(args: &ReplayArgs) -> ExitCode {
    let api = super::api_of(args.api);
    let config = match super::load_config(args.config.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => return failure(&e),
    };
    let llm = match llm_summarizer(args.llm, &config, &rt) {
        Ok(llm) => llm,
        Err(code) => return code,
    };
    let summarizer = |model: &str| -> Box<dyn Summarizer> {
        match &llm {
            Some(s) => Box::new(s.bind(None, model)),
            None => Box::new(ExtractiveSummarizer),
        }
    };
    let mut opts = ReplayOptions::of_args(args);
    opts.engine.steer = match super::steer_of(&config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let engine = Engine::new(config.compaction);
    let replay = replay_file_as(api, &args.file, &engine, &summarizer, &opts);
    let (all, total) = match rt.block_on(replay) {
        Ok(r) => r,
        Err(e) => return failure(&e),
    };
    if args.json {
        print::json(&all, &total, args.cached_price);
    } else {
        print::text(&all, &total, args.cached_price);
    }
    if total.violation_count() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// The configured model summarizer (`summarizer.kind = "llm"`, called with
/// `summarizer.api_key` and each conversation's model unless `summarizer.model` is set)
/// when `--llm` asks for it (`wanted`); `None` for the extractive one.
fn llm_summarizer(
    wanted: bool,
    config: &Config,
    rt: &tokio::runtime::Runtime,
) -> Result<Option<Arc<LlmSummarizer>>, ExitCode> {
    if !wanted {
        return Ok(None);
    }
    let built = rt.block_on(async { LlmSummarizer::new(&config.summarizer, &config.upstream) });
    built.map(Some).map_err(|e| failure(&e))
}

/// Prints `error` as the command's and fails.
#[allow(clippy::print_stderr)]
fn failure(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("foldgate replay: {error}");
    ExitCode::FAILURE
}
