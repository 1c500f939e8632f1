//! How far the engine's token counts of Claude conversations are from a Claude
//! tokenizer's, before and after calibration (see `scripts/claude-token-error.sh`, which
//! fetches the tokenizer and runs this, and `docs/COMPACTION.md`, which reports it).
//!
//! The engine counts Claude prompts with o200k_base and calibrates them against the
//! `usage` Anthropic reports. Claude 3 and later use a tokenizer that is not public; the
//! one Anthropic published (`@anthropic-ai/tokenizer` on npm, `claude.json`, from the
//! Claude 2 generation) stands in for it here as "the provider's count". For every prompt
//! of every recorded conversation (the messages before each assistant turn, with the
//! tools), both tokenizers count the same texts under the engine's framing; the
//! calibration then runs as in the proxy: [`TokenRatio`] samples from every earlier
//! answer of the conversation (per conversation), or of the whole file (per model).
//!
//! Usage: `claude_token_error <claude.json> <traces.jsonl> [<checks.json>]`, where
//! `checks.json` lists `{"text": …, "tokens": n}` counted by the npm package itself:
//! each must match this program's count, or it stops.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::process::ExitCode;

use base64::Engine as _;
use foldgate::commands::replay::Conversation;
use foldgate::compaction::TokenRatio;
use foldgate::compaction::tokens::{Encoding, message_tokens_by};
use serde_json::Value;
use tiktoken_rs::CoreBPE;
use unicode_normalization::UnicodeNormalization;

/// Errors of estimates, as estimate / provider count - 1.
#[derive(Default)]
struct Errors(Vec<f64>);

impl Errors {
    fn add(&mut self, estimate: f64, reported: usize) {
        self.0.push(estimate / reported as f64 - 1.0);
    }

    fn line(&mut self, name: &str) -> String {
        let e = &mut self.0;
        e.sort_by(f64::total_cmp);
        let n = e.len();
        if n == 0 {
            return format!("| {name} | 0 | | | | | |");
        }
        let mut abs: Vec<f64> = e.iter().map(|x| x.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let at = |v: &[f64], q: f64| v[((n - 1) as f64 * q).round() as usize] * 100.0;
        let under = e.iter().filter(|x| **x < -0.02).count() as f64 / n as f64 * 100.0;
        format!(
            "| {name} | {n} | {:.1}% | {:.1}% | {:.1}% | {:+.1}% | {under:.1}% |",
            at(&abs, 0.5),
            at(&abs, 0.9),
            at(&abs, 0.99),
            e[0] * 100.0,
        )
    }
}

/// The tokenizer of `claude.json`: its `bpe_ranks` are lines of `<prefix> <first rank>
/// <base64 token>…` (ranks counting up from the first), its `pat_str` the pre-split.
fn claude_bpe(json: &str) -> Result<CoreBPE, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let field = |name: &str| v.get(name).ok_or(format!("claude.json has no {name}"));
    let ranks = field("bpe_ranks")?.as_str().ok_or("bpe_ranks is not a string")?;
    let mut encoder = HashMap::new();
    for line in ranks.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.split(' ').skip(1);
        let first: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or("bad bpe_ranks line")?;
        for (i, token) in parts.enumerate() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(token)
                .map_err(|e| format!("bad token {token}: {e}"))?;
            encoder.insert(bytes, first + i as u32);
        }
    }
    let special = field("special_tokens")?
        .as_object()
        .ok_or("special_tokens is not an object")?
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)));
    let pattern = field("pat_str")?.as_str().ok_or("pat_str is not a string")?;
    CoreBPE::new(encoder.into_iter().collect(), special.collect(), pattern)
        .map_err(|e| e.to_string())
}

/// Claude's count of `text`, as the npm package counts it (NFKC first).
fn claude_count(bpe: &CoreBPE, text: &str) -> usize {
    let normalized: String = text.nfkc().collect();
    bpe.encode_ordinary(&normalized).len()
}

fn run(args: &[String]) -> Result<(), String> {
    let [ranks, traces, rest @ ..] = args else {
        return Err("usage: claude_token_error <claude.json> <traces.jsonl> [<checks.json>]".into());
    };
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"));
    let bpe = claude_bpe(&read(ranks)?)?;
    if let Some(checks) = rest.first() {
        let checks: Vec<Value> = serde_json::from_str(&read(checks)?).map_err(|e| e.to_string())?;
        for check in &checks {
            let text = check["text"].as_str().unwrap_or_default();
            let expected = check["tokens"].as_u64().unwrap_or(u64::MAX) as usize;
            let ours = claude_count(&bpe, text);
            if ours != expected {
                return Err(format!("{ours} tokens here, {expected} in the npm package: {text:?}"));
            }
        }
        println!("{} texts counted as the npm package counts them", checks.len());
    }
    let o200k = |text: &str| Encoding::O200kBase.count(text);
    let claude = |text: &str| claude_count(&bpe, text);
    let (mut raw, mut session, mut model) =
        (Errors::default(), Errors::default(), Errors::default());
    let mut model_ratio: Option<TokenRatio> = None;
    let (mut conversations, mut ratios) = (0, Vec::new());
    for (line, text) in read(traces)?.lines().enumerate() {
        let record: Value = serde_json::from_str(text).map_err(|e| format!("line {line}: {e}"))?;
        let conv = Conversation::from_record(&record, line + 1, None).map_err(|e| e.to_string())?;
        conversations += 1;
        let tools = conv.fields.get("tools").map(Value::to_string).unwrap_or_default();
        let (mut counted, mut reported) = (o200k(&tools) + 3, claude(&tools) + 3);
        let mut session_ratio: Option<TokenRatio> = None;
        for (i, message) in conv.messages.iter().enumerate() {
            if i > 0 && message.role() == foldgate::model::Role::Assistant {
                // The prompt of this assistant turn: every message before it.
                raw.add(counted as f64, reported);
                let planned = |r: Option<TokenRatio>| counted as f64 * r.map_or(1.0, |r| r.value);
                if session_ratio.is_some() {
                    session.add(planned(session_ratio), reported);
                }
                if model_ratio.is_some() {
                    model.add(planned(model_ratio), reported);
                }
                TokenRatio::observe_into(&mut session_ratio, counted, reported as u64);
                TokenRatio::observe_into(&mut model_ratio, counted, reported as u64);
            }
            counted += message_tokens_by(&o200k, message);
            reported += message_tokens_by(&claude, message);
        }
        ratios.extend(session_ratio.map(|r| r.value));
    }
    ratios.sort_by(f64::total_cmp);
    let quantile = |q: f64| ratios.get(((ratios.len().max(1) - 1) as f64 * q) as usize).copied();
    println!("{conversations} conversations");
    println!(
        "conversations' own ratios (Claude tokens per o200k token): min {:.3}, median {:.3}, max {:.3}",
        quantile(0.0).unwrap_or(f64::NAN),
        quantile(0.5).unwrap_or(f64::NAN),
        quantile(1.0).unwrap_or(f64::NAN),
    );
    println!();
    println!(
        "| estimate of the prompt | prompts | median error | p90 | p99 | most under | under by >2% |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!("{}", raw.line("o200k count, uncalibrated"));
    println!("{}", model.line("calibrated per model (all conversations)"));
    println!("{}", session.line("calibrated per conversation"));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claude_token_error: {e}");
            ExitCode::FAILURE
        }
    }
}
