//! `foldgate replay`: feeds recorded conversations to the engine the way an agent sends
//! them (one request per assistant reply, holding the history before that reply),
//! carrying fold blocks and token counts from request to request, and checks the
//! guarantees of every forwarded request.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use async_trait::async_trait;

use super::cost::{Charge, Meter, Prompt};
use super::trail_check;
use crate::api::{self, Api};
use crate::cli::ReplayArgs;
use crate::compaction::check::verify;
use crate::compaction::tokens::Counter;
use crate::compaction::{Budget, Engine, Options, Outcome, SessionState, TokenCache};
use crate::model::{ChatRequest, Message, ModelError, Role, is_user_words};
use crate::summarizer::llm::LlmSummarizer;
use crate::summarizer::{
    ExtractiveSummarizer, ModelPrompt, Summarizer, SummarizerError, SummaryInput,
};

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

/// Results of one conversation (or, summed, of all).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayStats {
    /// Conversation id (`total` for the sum, the family for a family's sum).
    pub id: String,
    /// The trace family of the conversation (the record's `meta.family`), if any.
    pub family: String,
    /// Conversations replayed (1 for one conversation).
    pub conversations: usize,
    /// Requests sent (one per assistant reply).
    pub requests: usize,
    /// Requests the engine changed.
    pub compacted: usize,
    /// Largest prompt of the original requests.
    pub peak_before: usize,
    /// Largest prompt forwarded.
    pub peak_after: usize,
    /// Sum of original prompt tokens over all requests.
    pub tokens_before: u64,
    /// Sum of forwarded prompt tokens over all requests.
    pub tokens_after: u64,
    /// Fold blocks made.
    pub folds: usize,
    /// Requests by highest tier applied (0, 1, 2, 4).
    pub tiers: BTreeMap<u8, usize>,
    /// Violations of guarantees 1 to 4, by guarantee.
    pub violations: BTreeMap<u8, usize>,
    /// The first violation seen, for diagnosis.
    pub first_violation: Option<String>,
    /// Forwarded prompt tokens, by how the provider bills them.
    pub forwarded: Charge,
    /// The prompt tokens of every request sent whole (no compaction), likewise.
    pub whole: Charge,
    /// Requests whose forwarded prompt starts with the whole previous forwarded prompt.
    pub prefix_repeats: usize,
    /// Summarizer calls made to a model.
    pub summarizer_calls: usize,
    /// Their input tokens, by how the provider bills them.
    pub summarizer: Charge,
    /// Small user messages (the user's own words, at most `user_verbatim_max_tokens`)
    /// of a request that its forwarded request does not hold verbatim and in order,
    /// summed over requests: an observation, not a violation (guarantee 2 covers them
    /// only within the floor).
    pub user_words_lost: usize,
    /// Requests that lost at least one of them.
    pub requests_losing_user_words: usize,
    /// The first such loss, for diagnosis.
    pub first_user_words_lost: Option<String>,
    /// File paths the agent named in its messages (tool-call arguments and text), summed
    /// over compacted requests.
    pub paths_named: u64,
    /// Of those, the ones the forwarded request still names.
    pub paths_kept: u64,
    /// The first path a compacted request lost, for diagnosis.
    pub first_path_lost: Option<String>,
    /// Trail entries of forwarded digests that no action of the conversation produced,
    /// summed over compacted requests.
    pub trail_foreign: u64,
    /// The first such entry, for diagnosis.
    pub first_trail_foreign: Option<String>,
    /// SHA-256 (hex) of every body forwarded, in order (for the total: of the
    /// conversations' hashes, in order): two runs forwarded the same bytes exactly when
    /// their hashes are equal.
    pub forwarded_sha256: String,
}

impl ReplayStats {
    /// Forwarded tokens as a share of original tokens, summed over requests.
    pub fn ratio(&self) -> f64 {
        if self.tokens_before == 0 {
            1.0
        } else {
            self.tokens_after as f64 / self.tokens_before as f64
        }
    }

    /// What the replay cost in token-equivalents (forwarded and summarizer input, a
    /// cached token at `cached_price`).
    pub fn cost(&self, cached_price: f64) -> f64 {
        self.forwarded.price(cached_price) + self.summarizer.price(cached_price)
    }

    /// What sending every request whole would have cost, priced the same way.
    pub fn cost_whole(&self, cached_price: f64) -> f64 {
        self.whole.price(cached_price)
    }

    /// All violations.
    pub fn violation_count(&self) -> usize {
        self.violations.values().sum()
    }

    fn add(&mut self, o: &Self) {
        self.conversations += o.conversations;
        self.requests += o.requests;
        self.compacted += o.compacted;
        self.peak_before = self.peak_before.max(o.peak_before);
        self.peak_after = self.peak_after.max(o.peak_after);
        self.tokens_before += o.tokens_before;
        self.tokens_after += o.tokens_after;
        self.folds += o.folds;
        for (k, v) in &o.tiers {
            *self.tiers.entry(*k).or_default() += v;
        }
        for (k, v) in &o.violations {
            *self.violations.entry(*k).or_default() += v;
        }
        if self.first_violation.is_none() {
            self.first_violation = o.first_violation.as_ref().map(|v| format!("{}: {v}", o.id));
        }
        self.forwarded.add(o.forwarded);
        self.whole.add(o.whole);
        self.prefix_repeats += o.prefix_repeats;
        self.summarizer_calls += o.summarizer_calls;
        self.summarizer.add(o.summarizer);
        self.user_words_lost += o.user_words_lost;
        self.requests_losing_user_words += o.requests_losing_user_words;
        if self.first_user_words_lost.is_none() {
            self.first_user_words_lost =
                o.first_user_words_lost.as_ref().map(|v| format!("{}: {v}", o.id));
        }
        self.paths_named += o.paths_named;
        self.paths_kept += o.paths_kept;
        if self.first_path_lost.is_none() {
            self.first_path_lost = o.first_path_lost.as_ref().map(|v| format!("{}: {v}", o.id));
        }
        self.trail_foreign += o.trail_foreign;
        if self.first_trail_foreign.is_none() {
            self.first_trail_foreign =
                o.first_trail_foreign.as_ref().map(|v| format!("{}: {v}", o.id));
        }
    }

    /// Share of the file paths named by the agent that compacted requests still named
    /// (1 when no compacted request had any).
    pub fn path_recall(&self) -> f64 {
        if self.paths_named == 0 { 1.0 } else { self.paths_kept as f64 / self.paths_named as f64 }
    }

    /// The sums of `all` per family, in the families' name order.
    pub fn by_family(all: &[Self]) -> BTreeMap<String, Self> {
        let mut out = BTreeMap::<String, Self>::new();
        for s in all {
            let family = if s.family.is_empty() { "unknown" } else { s.family.as_str() };
            out.entry(family.to_owned())
                .or_insert_with(|| Self {
                    id: family.to_owned(),
                    family: family.to_owned(),
                    ..Self::default()
                })
                .add(s);
        }
        out
    }
}

/// One recorded conversation.
pub struct Conversation {
    /// Its id (or its line number).
    pub id: String,
    /// Its trace family (`meta.family`), empty when not recorded.
    pub family: String,
    /// Top-level request fields: `model` and, if recorded, `tools`.
    pub fields: Map<String, Value>,
    /// The messages.
    pub messages: Vec<Arc<Message>>,
}

impl Conversation {
    /// Reads one record: `messages`, optional `tools`, `model`, `id`, `meta.family`.
    pub fn from_record(
        record: &Value,
        line: usize,
        model: Option<&str>,
    ) -> Result<Self, ReplayError> {
        let err = |message: String| ReplayError::Record { line, message };
        let msgs = record
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| err("no messages".into()))?;
        let messages = msgs
            .iter()
            .map(|m| Message::from_value(m.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, ModelError>>()
            .map_err(|e| err(e.to_string()))?;
        let mut fields = Map::new();
        let model = model
            .map(str::to_owned)
            .or_else(|| record.get("model").and_then(Value::as_str).map(str::to_owned));
        fields.insert("model".into(), Value::String(model.unwrap_or_default()));
        if let Some(tools) = record.get("tools").filter(|t| !t.is_null()) {
            fields.insert("tools".into(), tools.clone());
        }
        let (id, family) = record_names(record, line);
        Ok(Self { id, family, fields, messages })
    }

    /// The conversation of a request another API shape was read into: its neutral
    /// messages, model (or `model`, when given) and tools.
    fn of_neutral(request: &ChatRequest, record: &Value, line: usize, model: Option<&str>) -> Self {
        let mut fields = Map::new();
        let model = model.map(str::to_owned).or_else(|| request.model());
        fields.insert("model".into(), Value::String(model.unwrap_or_default()));
        if let Some(tools) = request.tools() {
            fields.insert("tools".into(), tools);
        }
        let (id, family) = record_names(record, line);
        Self { id, family, fields, messages: request.messages().to_vec() }
    }
}

/// A record's `id` (else `line-N`) and `meta.family` (else empty).
fn record_names(record: &Value, line: usize) -> (String, String) {
    let id = record
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("line-{line}"), str::to_owned);
    let family =
        record.pointer("/meta/family").and_then(Value::as_str).unwrap_or_default().to_owned();
    (id, family)
}

impl Conversation {
    /// Reads one record that is a request body of another API shape (a Responses body:
    /// `input`, `instructions`, `tools`, `model`; an Anthropic Messages body: `system`,
    /// `messages`, `tools`, `model`; with optional `id` and `meta.family`) through that
    /// shape's conversion (`parse`, named `shape`): the conversation is its neutral
    /// messages.
    pub fn from_converted(
        line_text: &str,
        record: &Value,
        line: usize,
        model: Option<&str>,
        shape: &str,
        parse: fn(&[u8]) -> Option<(ChatRequest, api::Origins)>,
    ) -> Result<Self, ReplayError> {
        let err = |message: String| ReplayError::Record { line, message };
        let (request, origins) = parse(line_text.as_bytes())
            .ok_or_else(|| err(format!("not a {shape} request foldgate understands")))?;
        if origins.server_state {
            return Err(err("relies on state the provider keeps (previous_response_id)".into()));
        }
        Ok(Self::of_neutral(&request, record, line, model))
    }
}

/// Records what a model summarizer sends, for pricing.
struct Metered<'a> {
    inner: &'a dyn Summarizer,
    prompts: Mutex<Vec<ModelPrompt>>,
}

#[async_trait]
impl Summarizer for Metered<'_> {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        self.inner.kind()
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        if let Some(prompt) = self.inner.prompt(&input) {
            if let Ok(mut prompts) = self.prompts.lock() {
                prompts.push(prompt);
            }
        }
        self.inner.summarize(input).await
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<ModelPrompt> {
        self.inner.prompt(input)
    }
}

/// Replays one conversation through `engine`.
pub async fn replay_conversation(
    engine: &Engine,
    conv: &Conversation,
    summarizer: &dyn Summarizer,
    opts: &Options,
) -> Result<ReplayStats, ReplayError> {
    let mut stats = ReplayStats {
        id: conv.id.clone(),
        family: conv.family.clone(),
        conversations: 1,
        ..ReplayStats::default()
    };
    let mut state = SessionState::default();
    let engine_err = |source| ReplayError::Engine { id: conv.id.clone(), source };
    let metered = Metered { inner: summarizer, prompts: Mutex::new(Vec::new()) };
    let (mut sent, mut whole) = (Meter::default(), Meter::default());
    let mut prices = TokenCache::default();
    let mut named = std::collections::BTreeSet::new();
    let mut bodies = Sha256::new();
    for (i, m) in conv.messages.iter().enumerate() {
        if i > 0 {
            trail_check::add_paths_named(&conv.messages[i - 1], &mut named);
        }
        if i == 0 || m.role() != Role::Assistant {
            continue;
        }
        let request = ChatRequest::from_parts(&conv.fields, conv.messages[..i].to_vec())
            .map_err(|e| engine_err(e.into()))?;
        let outcome = engine
            .compact_request(&request, &mut state, &metered, opts)
            .await
            .map_err(engine_err)?;
        let report = outcome.report();
        let budget: Budget = report.budget.clone();
        let before = if report.tokens_before_exact {
            report.tokens_before
        } else {
            engine.count_prompt(&request, &budget, &mut state.token_cache)
        };
        let (forwarded, after) = match &outcome {
            Outcome::Unchanged { .. } => {
                let body = request.to_vec();
                bodies.update((body.len() as u64).to_le_bytes());
                bodies.update(body);
                (&request, before)
            }
            Outcome::Compacted { request: fwd, report, body } => {
                bodies.update((body.len() as u64).to_le_bytes());
                bodies.update(body);
                (fwd, report.tokens_after)
            }
        };
        let encoding = budget.encoding;
        // Summarizer calls go out before the request they compact, after the previous one.
        let calls = std::mem::take(&mut *metered.prompts.lock().unwrap_or_else(|e| e.into_inner()));
        for call in &calls {
            let prompt = Prompt::of(&call.messages, call.tools.as_deref(), encoding, &mut prices);
            stats.summarizer.add(sent.side_call(&prompt));
            stats.summarizer_calls += 1;
        }
        let (charge, repeats) = sent.send(Prompt::of(
            forwarded.messages(),
            forwarded.tools_raw(),
            encoding,
            &mut prices,
        ));
        stats.forwarded.add(charge);
        stats.prefix_repeats += usize::from(repeats);
        stats.whole.add(
            whole
                .send(Prompt::of(request.messages(), request.tools_raw(), encoding, &mut prices))
                .0,
        );
        stats.requests += 1;
        stats.compacted += usize::from(matches!(outcome, Outcome::Compacted { .. }));
        stats.peak_before = stats.peak_before.max(before);
        stats.peak_after = stats.peak_after.max(after);
        stats.tokens_before += before as u64;
        stats.tokens_after += after as u64;
        stats.folds += report.blocks_new;
        *stats.tiers.entry(report.tier.number()).or_default() += 1;
        for v in verify(&request, forwarded, engine.config(), &budget, &mut state.token_cache) {
            *stats.violations.entry(v.check).or_default() += 1;
            if stats.first_violation.is_none() {
                stats.first_violation =
                    Some(format!("request {i}: check {}: {}", v.check, v.detail));
            }
        }
        if let Outcome::Compacted { request: fwd, .. } = &outcome {
            let still = trail_check::with_suffixes(trail_check::paths_anywhere(fwd.messages()));
            stats.paths_named += named.len() as u64;
            let lost: Vec<&String> = named.iter().filter(|p| !still.contains(*p)).collect();
            stats.paths_kept += (named.len() - lost.len()) as u64;
            let lost = lost.first();
            if let (Some(lost), None) = (lost, &stats.first_path_lost) {
                stats.first_path_lost = Some(format!("request {i}: {lost}"));
            }
            let foreign = trail_check::foreign_entries(request.messages(), fwd.messages());
            stats.trail_foreign += foreign.len() as u64;
            if let (Some(first), None) = (foreign.first(), &stats.first_trail_foreign) {
                stats.first_trail_foreign = Some(format!("request {i}: {first}"));
            }
        }
        let mut counter = Counter { encoding, cache: &mut state.token_cache };
        let small = engine.config().user_verbatim_max_tokens;
        let lost = user_words_lost(request.messages(), forwarded.messages(), small, &mut counter);
        if let Some(&first) = lost.first() {
            stats.user_words_lost += lost.len();
            stats.requests_losing_user_words += 1;
            if stats.first_user_words_lost.is_none() {
                stats.first_user_words_lost =
                    Some(format!("request {i}: user message {first} not forwarded verbatim"));
            }
        }
    }
    stats.forwarded_sha256 = hex(&bodies.finalize());
    Ok(stats)
}

/// Lower-case hexadecimal of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The indices of the user's own small messages of `original` (at most `max_tokens`
/// tokens, neither digests nor text-mode tool output) that `forwarded` does not hold
/// verbatim, in order.
fn user_words_lost(
    original: &[Arc<Message>],
    forwarded: &[Arc<Message>],
    max_tokens: usize,
    counter: &mut Counter<'_>,
) -> Vec<usize> {
    let mut lost = Vec::new();
    let mut from = 0;
    for (i, m) in original.iter().enumerate() {
        if !is_user_words(original, i) || counter.message(m) > max_tokens {
            continue;
        }
        let same = |f: &Arc<Message>| f.hash() == m.hash() && f.raw() == m.raw();
        match forwarded[from..].iter().position(same) {
            Some(at) => from += at + 1,
            None => lost.push(i),
        }
    }
    lost
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

fn line(s: &ReplayStats) -> String {
    let tiers: Vec<String> = s.tiers.iter().map(|(t, n)| format!("t{t}:{n}")).collect();
    let viol: Vec<String> = s.violations.iter().map(|(c, n)| format!("({c}):{n}")).collect();
    format!(
        "{:<52} {:>5} {:>5} {:>8} {:>8} {:>6.1}% {:>5}  {:<24} {}",
        s.id,
        s.requests,
        s.compacted,
        s.peak_before,
        s.peak_after,
        s.ratio() * 100.0,
        s.folds,
        tiers.join(" "),
        if viol.is_empty() { "0".to_owned() } else { viol.join(" ") }
    )
}

/// One family's line: its conversations, requests (compacted), peak prompt in and out,
/// share of prompt tokens sent, requests by tier, cost against no compaction, prefix
/// repeats, summarizer calls and small user messages lost.
fn family_line(s: &ReplayStats, price: f64) -> String {
    let tiers: Vec<String> = s.tiers.iter().map(|(t, n)| format!("t{t}:{n}")).collect();
    let (cost, whole) = (s.cost(price), s.cost_whole(price));
    format!(
        "{:<16} {:>5} {:>6} {:>6} {:>8} {:>8} {:>6.1}%  {:<30} {:>7.2}M {:>7.2}M {:>6.3}x \
         {:>7.1}% {:>6} {:>5}",
        s.id,
        s.conversations,
        s.requests,
        s.compacted,
        s.peak_before,
        s.peak_after,
        s.ratio() * 100.0,
        tiers.join(" "),
        cost / 1e6,
        whole / 1e6,
        if whole > 0.0 { cost / whole } else { 1.0 },
        100.0 * s.prefix_repeats as f64 / s.requests.max(1) as f64,
        s.summarizer_calls,
        s.user_words_lost,
    )
}

/// The per-family table: one line per family under a header, then the total.
pub fn family_table(all: &[ReplayStats], total: &ReplayStats, price: f64) -> String {
    let mut out = format!(
        "{:<16} {:>5} {:>6} {:>6} {:>8} {:>8} {:>7}  {:<30} {:>8} {:>8} {:>7} {:>8} {:>6} {:>5}\n",
        "family",
        "convs",
        "reqs",
        "comp",
        "peak_in",
        "peak_out",
        "sent",
        "requests by tier",
        "cost",
        "whole",
        "ratio",
        "repeats",
        "calls",
        "lost"
    );
    for s in ReplayStats::by_family(all).values() {
        out.push_str(&family_line(s, price));
        out.push('\n');
    }
    out.push_str(&family_line(total, price));
    out
}

/// The cost summary: the replay's cost against sending every request whole, the share
/// of requests whose prefix repeats the previous one, and the summarizer's input.
pub fn cost_line(total: &ReplayStats, price: f64) -> String {
    let (cost, whole) = (total.cost(price), total.cost_whole(price));
    format!(
        "cost (uncached input x1, cached prefix x{price}): {:.2}M token-equivalents, \
         no compaction {:.2}M ({:.3}x); prefix repeats the previous request on {} of {} \
         requests ({:.1}%); summarizer: {} calls, {} input tokens ({} cached)",
        cost / 1e6,
        whole / 1e6,
        if whole > 0.0 { cost / whole } else { 1.0 },
        total.prefix_repeats,
        total.requests,
        100.0 * total.prefix_repeats as f64 / total.requests.max(1) as f64,
        total.summarizer_calls,
        total.summarizer.tokens(),
        total.summarizer.cached,
    )
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
