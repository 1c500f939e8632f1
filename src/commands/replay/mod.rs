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

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::ExitCode;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::{self, Api};
use crate::cli::ReplayArgs;
use crate::compaction::{Engine, Options};
use crate::summarizer::llm::LlmSummarizer;
use crate::summarizer::{ExtractiveSummarizer, Summarizer};

pub use print::{cost_line, family_table};
pub use record::Conversation;
pub use requests::replay_conversation;
pub use stats::ReplayStats;

use print::line;
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
        let record: Value = serde_json::from_str(&line)
            .map_err(|e| ReplayError::Record { line: n + 1, message: e.to_string() })?;
        let model = opts.engine.model.as_deref();
        let mut conv = match api {
            Api::Responses => {
                let parse = api::responses::parse;
                Conversation::from_converted(&line, &record, n + 1, model, "Responses", parse)?
            }
            Api::Messages => {
                let parse = api::messages::parse;
                Conversation::from_converted(&line, &record, n + 1, model, "Messages", parse)?
            }
            Api::Chat => Conversation::from_record(&record, n + 1, model)?,
        };
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

/// Runs `foldgate replay`.
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn run(args: &ReplayArgs) -> ExitCode {
    let api = super::api_of(args.api);
    let config = match super::load_config(args.config.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("foldgate replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The configured summarizer: a model (`summarizer.kind = "llm"`, called with
    // `summarizer.api_key` and each conversation's model unless `summarizer.model` is
    // set) only when asked for with `--llm`, else the extractive one.
    let llm = if args.llm {
        let built = rt.block_on(async { LlmSummarizer::new(&config.summarizer, &config.upstream) });
        match built {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("foldgate replay: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let summarizer = |model: &str| -> Box<dyn Summarizer> {
        match &llm {
            Some(s) => Box::new(s.bind(None, model)),
            None => Box::new(ExtractiveSummarizer),
        }
    };
    let engine = Engine::new(config.compaction);
    let opts = ReplayOptions {
        engine: Options {
            window_cap: args.window,
            model: args.model.clone(),
            ..Options::default()
        },
        max_tokens: args.max_tokens,
    };
    let replay = replay_file_as(api, &args.file, &engine, &summarizer, &opts);
    let (all, total) = match rt.block_on(replay) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("foldgate replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    let price = args.cached_price;
    if args.json {
        let families: BTreeMap<String, Value> = ReplayStats::by_family(&all)
            .into_iter()
            .map(|(family, s)| {
                let priced = serde_json::json!({
                    "stats": s,
                    "cost": s.cost(price),
                    "cost_no_compaction": s.cost_whole(price),
                });
                (family, priced)
            })
            .collect();
        let out = serde_json::json!({
            "conversations": all,
            "families": families,
            "total": total,
            "ratio": total.ratio(),
            "cached_price": price,
            "cost": total.cost(price),
            "cost_no_compaction": total.cost_whole(price),
        });
        println!("{out}");
    } else {
        println!(
            "{:<52} {:>5} {:>5} {:>8} {:>8} {:>7} {:>5}  {:<24} violations",
            "conversation", "reqs", "comp", "peak_in", "peak_out", "sent", "folds", "tiers"
        );
        for s in &all {
            println!("{}", line(s));
        }
        println!("{}", line(&total));
        let count = |c: u8| total.violations.get(&c).copied().unwrap_or(0);
        println!(
            "checks: (1) tool calls answered: {} violations, (2) small user messages verbatim: {}, \
             (3) pinned unchanged: {}, (4) fits window - reserve: {}, (5) current turn intact: {}",
            count(1),
            count(2),
            count(3),
            count(4),
            count(5)
        );
        println!(
            "total: {} conversations, {} requests ({} compacted), peak {} -> {} tokens, \
             {:.1}% of prompt tokens sent, {} folds",
            all.len(),
            total.requests,
            total.compacted,
            total.peak_before,
            total.peak_after,
            total.ratio() * 100.0,
            total.folds
        );
        println!("{}", cost_line(&total, price));
        println!(
            "small user messages (the user's own words) not forwarded verbatim: {} in {} \
             requests",
            total.user_words_lost, total.requests_losing_user_words
        );
        println!(
            "work trail: {:.1}% of the file paths the agent named still named by compacted \
             requests ({} of {}); {} trail entries no action produced",
            total.path_recall() * 100.0,
            total.paths_kept,
            total.paths_named,
            total.trail_foreign
        );
        println!(
            "\nper family (cost in token-equivalents, cached prefix x{price}; whole: no \
             compaction; repeats: requests whose prefix repeats the previous one; calls: \
             summarizer calls; lost: small user messages not forwarded verbatim):"
        );
        println!("{}", family_table(&all, &total, price));
        println!("forwarded bodies: sha256 {}", total.forwarded_sha256);
        if let Some(v) = &total.first_violation {
            println!("first violation: {v}");
        }
        if let Some(v) = &total.first_user_words_lost {
            println!("first small user message lost: {v}");
        }
        if let Some(v) = &total.first_path_lost {
            println!("first file path lost: {v}");
        }
        if let Some(v) = &total.first_trail_foreign {
            println!("first trail entry no action produced: {v}");
        }
    }
    if total.violation_count() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
