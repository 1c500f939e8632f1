//! Prometheus metrics: one [`Metrics`] struct created at start-up, every name and help
//! text in this file, labels bounded by construction (typed label enums, normalised model
//! names; never sessions, tenants, paths with ids or prompt text). The values of the
//! labels every stage shares (outcome, tier, failure reason, store operation,
//! summarizer) are the words of [`crate::vocab`]; the labels only this module knows
//! (route, overflow retry, window event) are defined here.

use std::sync::OnceLock;

use crate::vocab::{
    CompactionApi, ContentCoding, FailureReason, InstructionSource, Outcome, RewriteReason,
    StoreOp, SummarizerKind, Tier,
};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The `encoding` label of a coding foldgate does not decode.
const UNKNOWN_CODING: &str = "unknown";

/// What became of a compressed request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeResult {
    /// Decoded, then read like any body.
    Decoded,
    /// Not decodable (unknown coding, invalid bytes): forwarded as received.
    Unreadable,
    /// Decoded past `server.max_body_size`: answered 413.
    TooLarge,
}

impl DecodeResult {
    /// Every result label.
    pub const ALL: [Self; 3] = [Self::Decoded, Self::Unreadable, Self::TooLarge];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decoded => "decoded",
            Self::Unreadable => "unreadable",
            Self::TooLarge => "too_large",
        }
    }
}

/// What became of a Responses chain (`previous_response_id`) at foldgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainResult {
    /// A request continuing a response foldgate stored: read as the whole conversation.
    Expanded,
    /// A request continuing a response foldgate does not know: forwarded as received.
    Unknown,
    /// An answer's response stored, so that the next request can continue it.
    Stored,
}

impl ChainResult {
    /// Every result label.
    pub const ALL: [Self; 3] = [Self::Expanded, Self::Unknown, Self::Stored];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expanded => "expanded",
            Self::Unknown => "unknown",
            Self::Stored => "stored",
        }
    }
}

/// Routes as metric labels (never raw paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// Any other `/v1/` request, forwarded as is.
    Passthrough,
    /// `/healthz`, `/readyz`, `/metrics`.
    Local,
    /// Anything else (404).
    Unknown,
}

impl Route {
    const COUNT: usize = 6;

    /// Every route.
    pub const ALL: [Self; Self::COUNT] = [
        Self::ChatCompletions,
        Self::Responses,
        Self::Messages,
        Self::Passthrough,
        Self::Local,
        Self::Unknown,
    ];

    /// The routes whose conversations foldgate compacts (the `route` label of the chat
    /// request and prompt token metrics).
    pub const COMPACTED: [Self; 3] = [Self::ChatCompletions, Self::Responses, Self::Messages];

    fn index(self) -> usize {
        match self {
            Self::ChatCompletions => 0,
            Self::Responses => 1,
            Self::Messages => 2,
            Self::Passthrough => 3,
            Self::Local => 4,
            Self::Unknown => 5,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat_completions",
            Self::Responses => "responses",
            Self::Messages => "messages",
            Self::Passthrough => "passthrough",
            Self::Local => "local",
            Self::Unknown => "unknown",
        }
    }
}

/// `1xx`..`5xx` for a status code.
pub fn status_class(status: u16) -> &'static str {
    STATUS_CLASSES[status_class_index(status)]
}

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The result of an overflow retry, the `result` label of `overflow_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowRetry {
    /// A deeper compaction was sent.
    Retried,
    /// Nothing more to take out (or observe mode): the upstream's answer stands.
    NothingToCompact,
}

impl OverflowRetry {
    /// Every result.
    pub const ALL: [Self; 2] = [Self::Retried, Self::NothingToCompact];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retried => "retried",
            Self::NothingToCompact => "nothing_to_compact",
        }
    }
}

/// The `event` label of `learned_windows_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEvent {
    /// A provider stated a smaller window than known.
    Learned,
    /// A chat request was planned against a learned window.
    Applied,
}

impl WindowEvent {
    /// Every event.
    pub const ALL: [Self; 2] = [Self::Learned, Self::Applied];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Learned => "learned",
            Self::Applied => "applied",
        }
    }
}

fn status_class_index(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// A metric's name (after `foldgate_`), help text and label names.
struct Spec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

const REQUESTS: Spec = Spec {
    name: "requests_total",
    help: "Requests by route and status class.",
    labels: &["route", "status_class"],
};

const CHAT_REQUESTS: Spec = Spec {
    name: "chat_requests_total",
    help: "Requests of compacted routes (chat completions, responses, messages) by route and outcome.",
    labels: &["route", "outcome"],
};

const PROMPT_TOKENS_BEFORE: Spec = Spec {
    name: "prompt_tokens_before_total",
    help: "Prompt tokens of requests of compacted routes as received.",
    labels: &["route", "model"],
};

const PROMPT_TOKENS_REWRITTEN: Spec = Spec {
    name: "prompt_tokens_rewritten_total",
    help: "Prompt tokens forwarded from the first message where compaction made the prompt differ from the conversation as last forwarded: what the provider writes to its cache again (billed as cache writes where the provider bills them).",
    labels: &["route", "model"],
};

const PREFIX_REWRITES: Spec = Spec {
    name: "prefix_rewrites_total",
    help: "Requests whose forwarded prompt compaction made differ from the conversation as last forwarded, by why: fold, goal_batch, stub, cut, overflow (a retry after an overflow), history (stored folds or cut no longer matched the history sent).",
    labels: &["reason"],
};

const PREFIX_REWRITE_COST: Spec = Spec {
    name: "prefix_rewrite_cost_total",
    help: "Estimated cost of those rewrites beyond reading the same tokens from the provider's cache, in token-equivalents (rewritten tokens x (1 - compaction.cached_price)), by why.",
    labels: &["reason"],
};

const COMPACTION_INSTRUCTIONS: Spec = Spec {
    name: "conversations_with_instructions_total",
    help: "Conversations planned with compaction instructions in force, each counted once per source, by where they came from: config (summarizer.instructions), conversation (a Compact instructions section), header (x-foldgate-compact-instructions), request (a compaction API's own instructions).",
    labels: &["source"],
};

const PINNED_MESSAGES: Spec = Spec {
    name: "pinned_messages_total",
    help: "Messages pin patterns pinned (compaction.pin, x-foldgate-pin), summed over compacted requests: each forwarded byte for byte.",
    labels: &[],
};

const PROMPT_TOKENS_AFTER: Spec = Spec {
    name: "prompt_tokens_after_total",
    help: "Prompt tokens of requests of compacted routes as forwarded.",
    labels: &["route", "model"],
};

const TOKENS_SAVED: Spec = Spec {
    name: "tokens_saved_total",
    help: "Prompt tokens removed by compaction (before minus after).",
    labels: &["route", "model"],
};

const COMPACTION_RATIO: Spec = Spec {
    name: "compaction_ratio",
    help: "Forwarded over original prompt tokens of compacted requests.",
    labels: &[],
};

const COMPACTIONS: Spec = Spec {
    name: "compactions_total",
    help: "Compactions by highest tier applied and outcome.",
    labels: &["tier", "outcome"],
};

const FOLD_WAIT: Spec = Spec {
    name: "fold_wait_seconds",
    help: "How long compacted chat requests waited for a digest; 0 when they did not.",
    labels: &[],
};

const SUMMARIZER_DURATION: Spec = Spec {
    name: "summarizer_duration_seconds",
    help: "Duration of summarizer calls.",
    labels: &["summarizer"],
};

const SUMMARIZER_FAILURES: Spec = Spec {
    name: "summarizer_failures_total",
    help: "Summarizer failures by reason.",
    labels: &["reason"],
};

const ARTIFACT_RECALL: Spec = Spec {
    name: "artifact_recall",
    help: "Share of a fold's artifacts found in its digest before missing ones were appended.",
    labels: &[],
};

const UPSTREAM_TTFB: Spec = Spec {
    name: "upstream_ttfb_seconds",
    help: "Time from the upstream send to its response headers.",
    labels: &["route"],
};

const PROXY_OVERHEAD: Spec = Spec {
    name: "proxy_overhead_seconds",
    help: "Time spent before the upstream send (reading, compacting).",
    labels: &["route"],
};

const UPSTREAM_USAGE_TOKENS: Spec = Spec {
    name: "upstream_usage_tokens_total",
    help: "Token usage reported by the upstream, by kind: prompt (all input), uncached (input neither read from nor written to the provider's cache), cached (cache reads), cache_write (cache writes, Anthropic), completion.",
    labels: &["model", "kind"],
};

const STORE_ERRORS: Spec = Spec {
    name: "session_store_errors_total",
    help: "Session store failures by operation; the request went on without stored state.",
    labels: &["op"],
};

const STORE_DURATION: Spec = Spec {
    name: "session_store_duration_seconds",
    help: "Duration of session store operations (failed ones included), by operation.",
    labels: &["op"],
};

const OVERFLOW_RETRIES: Spec = Spec {
    name: "overflow_retries_total",
    help: "Retries after a context-length error, by result.",
    labels: &["result"],
};

const TRAIL_REREADS: Spec = Spec {
    name: "trail_rereads_total",
    help: "Reads of a file a fold already holds unchanged (the agent reading again what it had), by route.",
    labels: &["route"],
};

const STORE_FAILOVERS: Spec = Spec {
    name: "session_store_failovers_total",
    help: "Failovers of the shared session store seen by this process: a new primary named by the sentinels, or an outage of a Redis Cluster that ended.",
    labels: &[],
};

const TEAM_TOKENS: Spec = Spec {
    name: "team_tokens_total",
    help: "Token usage by team (the configured metrics.team_header; `other` past the allow-list or the cap, `none` without the header), by kind: prompt, uncached, cached, cache_write and completion as the upstream reported them, saved by compaction.",
    labels: &["team", "kind"],
};

const PROVIDER_COMPACTIONS: Spec = Spec {
    name: "provider_compactions_total",
    help: "Requests of the providers' own compaction APIs (Responses compact and context_management, Anthropic context_management edits) that compacted, by API and by who served them (upstream, foldgate).",
    labels: &["api", "served_by"],
};

const ENCODED_BODIES: Spec = Spec {
    name: "encoded_request_bodies_total",
    help: "Compressed request bodies of compacted routes, by Content-Encoding (gzip, deflate, br, zstd, unknown) and result: decoded (then read like any body), unreadable (an unknown coding or invalid bytes: forwarded as received, uncompacted), too_large (decoded past server.max_body_size: 413).",
    labels: &["encoding", "result"],
};

const RESPONSE_CHAINS: Spec = Spec {
    name: "response_chains_total",
    help: "Responses chains (previous_response_id): requests read as the whole conversation foldgate stored (expanded), requests naming a response foldgate does not know (unknown: forwarded as received), and answers stored to be continued (stored).",
    labels: &["result"],
};

const LEARNED_WINDOWS: Spec = Spec {
    name: "learned_windows_total",
    help: "Context windows learned from overflow errors (learned), and chat requests planned against one (applied).",
    labels: &["event"],
};

/// Creates metrics from their [`Spec`]s and registers them.
struct Registrar<'r> {
    registry: &'r Registry,
}

impl Registrar<'_> {
    fn counter(&self, spec: &Spec) -> Result<IntCounterVec, MetricsError> {
        let c = IntCounterVec::new(
            Opts::new(format!("foldgate_{}", spec.name), spec.help),
            spec.labels,
        )?;
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn histogram(&self, spec: &Spec, buckets: &[f64]) -> Result<HistogramVec, MetricsError> {
        let opts = HistogramOpts::new(format!("foldgate_{}", spec.name), spec.help)
            .buckets(buckets.to_vec());
        let h = HistogramVec::new(opts, spec.labels)?;
        self.registry.register(Box::new(h.clone()))?;
        Ok(h)
    }

    fn plain_histogram(&self, spec: &Spec, buckets: &[f64]) -> Result<Histogram, MetricsError> {
        let opts = HistogramOpts::new(format!("foldgate_{}", spec.name), spec.help)
            .buckets(buckets.to_vec());
        let h = Histogram::with_opts(opts)?;
        self.registry.register(Box::new(h.clone()))?;
        Ok(h)
    }
}

/// Children of the labelled metrics every request touches, looked up once each: a
/// lookup hashes the label values, which would otherwise happen on every request. Each
/// is resolved on first use, so the exposition still lists only series that occurred.
#[derive(Default)]
struct PerRequest {
    requests: [[OnceLock<IntCounter>; STATUS_CLASSES.len()]; Route::COUNT],
    upstream_ttfb: [OnceLock<Histogram>; Route::COUNT],
    proxy_overhead: [OnceLock<Histogram>; Route::COUNT],
    store_duration: [OnceLock<Histogram>; StoreOp::ALL.len()],
    store_errors: [OnceLock<IntCounter>; StoreOp::ALL.len()],
    chat_requests: [[OnceLock<IntCounter>; Outcome::ALL.len()]; Route::COUNT],
    /// `upstream_usage_tokens_total` by model slot and [`USAGE_KINDS`].
    usage: [[OnceLock<IntCounter>; USAGE_KINDS.len()]; MODEL_SLOTS],
    /// The prompt token counters (before, after, saved) by route and model slot.
    prompt: [[[OnceLock<IntCounter>; 3]; MODEL_SLOTS]; Route::COUNT],
}

/// Slots of the model labels: the families, then `other`.
const MODEL_SLOTS: usize = MODEL_FAMILIES.len() + 1;

/// The `kind` labels of token usage, in the order [`count_usage`] counts them.
const USAGE_KINDS: [&str; 5] = ["prompt", "uncached", "cached", "cache_write", "completion"];

/// The slot of a label [`model_label`] gave.
fn model_slot(label: &str) -> Option<usize> {
    MODEL_FAMILIES
        .iter()
        .position(|family| *family == label)
        .or_else(|| (label == "other").then_some(MODEL_FAMILIES.len()))
}

/// Model families reported as themselves; everything else is `other`.
const MODEL_FAMILIES: [&str; 24] = [
    "gpt-4o-mini",
    "gpt-4o",
    "gpt-4.1-nano",
    "gpt-4.1-mini",
    "gpt-4.1",
    "gpt-4-turbo",
    "gpt-4",
    "gpt-3.5-turbo",
    "gpt-5-nano",
    "gpt-5-mini",
    "gpt-5",
    "gpt-oss",
    "o1-mini",
    "o1",
    "o3-mini",
    "o3",
    "o4-mini",
    "claude",
    "gemini",
    "llama",
    "mistral",
    "qwen",
    "deepseek",
    "grok",
];

/// Maps a model name onto a bounded set: its family (longest known prefix, after any
/// `provider/` part), or `other`. The last name mapped on each thread is remembered:
/// most requests name the model the one before named.
pub fn model_label(model: &str) -> &'static str {
    thread_local! {
        static LAST: std::cell::RefCell<(String, &'static str)> =
            const { std::cell::RefCell::new((String::new(), "other")) };
    }
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else { return family_of(model) };
        if last.0 != model {
            let label = family_of(model);
            last.0.clear();
            last.0.push_str(model);
            last.1 = label;
        }
        last.1
    })
}

/// The family [`model_label`] gives `model`, found afresh.
fn family_of(model: &str) -> &'static str {
    // Compared byte by byte, ignoring ASCII case, without a lowercased copy.
    let name = model.rsplit('/').next().unwrap_or(model).as_bytes();
    let name = match name.get(..10) {
        Some(head) if head.eq_ignore_ascii_case(b"anthropic.") => &name[10..],
        _ => name,
    };
    let first = name.first().map(u8::to_ascii_lowercase);
    let mut best: Option<&'static str> = None;
    for family in MODEL_FAMILIES {
        let f = family.as_bytes();
        let prefix = name.get(..f.len()).is_some_and(|h| h.eq_ignore_ascii_case(f));
        if f.first().copied() != first || !prefix {
            continue;
        }
        let next = name.get(f.len());
        let boundary = next.is_none_or(|c| !c.is_ascii_alphanumeric() || f.len() > 4);
        if boundary && best.is_none_or(|b| b.len() < f.len()) {
            best = Some(family);
        }
    }
    best.unwrap_or("other")
}

/// Every metric foldgate exports.
pub struct Metrics {
    registry: Registry,
    /// Requests by route and status class.
    pub requests: IntCounterVec,
    /// Requests of compacted routes by route and outcome (`passthrough`, `compacted`,
    /// `observed`, `failed_open`, `not_chat`: a body foldgate does not understand,
    /// forwarded as is; `disabled`: compaction is off).
    pub chat_requests: IntCounterVec,
    /// Prompt tokens of requests of compacted routes as received, by route and model.
    pub prompt_tokens_before: IntCounterVec,
    /// Prompt tokens of requests of compacted routes as forwarded, by route and model.
    pub prompt_tokens_after: IntCounterVec,
    /// Prompt tokens removed by compaction (before − after), by route and model.
    pub tokens_saved: IntCounterVec,
    /// Forwarded / original prompt tokens of compacted requests.
    pub compaction_ratio: Histogram,
    /// Compactions by highest tier applied and outcome.
    pub compactions: IntCounterVec,
    /// Summarizer call duration, by summarizer.
    summarizer_duration: HistogramVec,
    /// How long compacted requests waited for a digest (0 when they did not).
    pub fold_wait: Histogram,
    /// Summarizer failures by reason.
    summarizer_failures: IntCounterVec,
    /// Share of a fold's artifacts the digest contained before any were appended.
    pub artifact_recall: Histogram,
    /// Time from sending upstream to response headers, by route.
    pub upstream_ttfb: HistogramVec,
    /// Time spent before the upstream send (reading, compacting), by route.
    pub proxy_overhead: HistogramVec,
    /// Usage reported by the upstream, by model and kind (`prompt`, `completion`, `cached`).
    pub upstream_usage_tokens: IntCounterVec,
    /// Conversations held by the session store.
    pub active_sessions: IntGauge,
    /// Session store failures, by operation (`load`, `save`, `lease`, `release`).
    pub store_errors: IntCounterVec,
    /// Duration of session store operations, failed ones included, by operation.
    pub store_duration: HistogramVec,
    /// Retries after a context-length error, by result (`retried`, `nothing_to_compact`).
    pub overflow_retries: IntCounterVec,
    /// Reads of a file whose content a fold already holds and that nothing changed since
    /// (the agent reading again what it had), by route.
    pub trail_rereads: IntCounterVec,
    /// Learned context windows: `learned` (a provider stated a smaller window than
    /// known), `applied` (a chat request was planned against a learned window).
    pub learned_windows: IntCounterVec,
    /// Requests of the providers' own compaction APIs, by API and by who served them.
    pub provider_compactions: IntCounterVec,
    /// Failovers of the shared session store seen (no labels).
    pub store_failovers: IntCounterVec,
    /// Compressed request bodies of compacted routes, by encoding and result.
    encoded_bodies: IntCounterVec,
    /// Responses chains, by result.
    response_chains: IntCounterVec,
    /// Prompt tokens compaction made the provider write to its cache again.
    pub prompt_tokens_rewritten: IntCounterVec,
    /// Prefix rewrites by reason.
    prefix_rewrites: IntCounterVec,
    /// `foldgate_conversations_with_instructions_total{source}`.
    compaction_instructions: IntCounterVec,
    /// `foldgate_pinned_messages_total`.
    pinned_messages: IntCounterVec,
    /// Their estimated cost by reason.
    prefix_rewrite_cost: IntCounterVec,
    /// Token usage by team, when counted by team.
    pub team_tokens: IntCounterVec,
    teams: Option<Teams>,
    per_request: PerRequest,
    /// The session store's figures, read at each scrape.
    at_scrape: std::sync::OnceLock<StoreFigures>,
}

/// The team labels of token usage: a bounded set, whatever clients send. With an
/// allow-list, its names and `other`; without, the first `cap` values seen and `other`.
/// A request without the header counts as `none`; a value longer than 64 bytes or with
/// characters other than letters, digits, `-`, `_` and `.` as `other`.
#[derive(Debug)]
pub struct Teams {
    header: String,
    allowed: Vec<String>,
    cap: usize,
    seen: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<str>>>,
}

impl Teams {
    /// Teams named by request header `header`, limited to `allowed` (when not empty) or
    /// else to the first `cap` seen.
    pub fn new(header: &str, allowed: &[String], cap: usize) -> Self {
        Self {
            header: header.to_ascii_lowercase(),
            allowed: allowed.to_vec(),
            cap,
            seen: std::sync::Mutex::default(),
        }
    }

    /// The label of a request whose header is `value`.
    pub fn label(&self, value: Option<&str>) -> std::sync::Arc<str> {
        let Some(value) = value.map(str::trim) else { return "none".into() };
        let well_formed = !value.is_empty()
            && value.len() <= 64
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        let listed = self.allowed.is_empty() || self.allowed.iter().any(|t| t == value);
        if !well_formed || !listed || ["none", "other"].contains(&value) {
            return "other".into();
        }
        let Ok(mut seen) = self.seen.lock() else { return "other".into() };
        if let Some(label) = seen.get(value) {
            return label.clone();
        }
        if self.allowed.is_empty() && seen.len() >= self.cap {
            return "other".into();
        }
        let label: std::sync::Arc<str> = value.into();
        seen.insert(value.to_owned(), label.clone());
        label
    }
}

/// Counts one answer's usage into `counters`, labelled `first` (a model, a team) and the
/// kind of tokens: the prompt whole and split by cache use, the completion.
fn count_usage(counters: &IntCounterVec, first: &str, prompt: PromptSplit, completion: u64) {
    for (kind, count) in USAGE_KINDS.into_iter().zip(usage_counts(prompt, completion)) {
        counters.with_label_values(&[first, kind]).inc_by(count);
    }
}

/// An answer's usage in the order of [`USAGE_KINDS`].
fn usage_counts(prompt: PromptSplit, completion: u64) -> [u64; USAGE_KINDS.len()] {
    [prompt.total, prompt.uncached(), prompt.cache_read, prompt.cache_write, completion]
}

/// An answer's prompt tokens as the provider's cache treated them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptSplit {
    /// Every prompt token.
    pub total: u64,
    /// Read from the cache.
    pub cache_read: u64,
    /// Written to the cache.
    pub cache_write: u64,
}

impl PromptSplit {
    /// Neither read from nor written to the cache.
    pub fn uncached(&self) -> u64 {
        self.total.saturating_sub(self.cache_read).saturating_sub(self.cache_write)
    }
}

/// Reads the session store's figures for a scrape: conversations held and failovers
/// seen (see [`Metrics::read_at_scrape`]).
pub type StoreFigures = Box<dyn Fn() -> Option<(usize, u64)> + Send + Sync>;

/// Metric creation failed (a programming error: duplicate or invalid names).
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const STORE_BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
const WAIT_BUCKETS: [f64; 12] =
    [0.0, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];
const SLOW_BUCKETS: [f64; 12] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];
const RATIO_BUCKETS: [f64; 11] = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let r = Registrar { registry: &registry };
        let active_sessions =
            IntGauge::new("foldgate_active_sessions", "Conversations held by the session store.")?;
        registry.register(Box::new(active_sessions.clone()))?;
        Ok(Self {
            requests: r.counter(&REQUESTS)?,
            chat_requests: r.counter(&CHAT_REQUESTS)?,
            prompt_tokens_before: r.counter(&PROMPT_TOKENS_BEFORE)?,
            prompt_tokens_after: r.counter(&PROMPT_TOKENS_AFTER)?,
            tokens_saved: r.counter(&TOKENS_SAVED)?,
            compaction_ratio: r.plain_histogram(&COMPACTION_RATIO, &RATIO_BUCKETS)?,
            compactions: r.counter(&COMPACTIONS)?,
            fold_wait: r.plain_histogram(&FOLD_WAIT, &WAIT_BUCKETS)?,
            summarizer_duration: r.histogram(&SUMMARIZER_DURATION, &SLOW_BUCKETS)?,
            summarizer_failures: r.counter(&SUMMARIZER_FAILURES)?,
            artifact_recall: r.plain_histogram(&ARTIFACT_RECALL, &RATIO_BUCKETS)?,
            upstream_ttfb: r.histogram(&UPSTREAM_TTFB, &SLOW_BUCKETS)?,
            proxy_overhead: r.histogram(&PROXY_OVERHEAD, &LATENCY_BUCKETS)?,
            upstream_usage_tokens: r.counter(&UPSTREAM_USAGE_TOKENS)?,
            active_sessions,
            store_errors: r.counter(&STORE_ERRORS)?,
            store_duration: r.histogram(&STORE_DURATION, &STORE_BUCKETS)?,
            overflow_retries: r.counter(&OVERFLOW_RETRIES)?,
            trail_rereads: r.counter(&TRAIL_REREADS)?,
            learned_windows: r.counter(&LEARNED_WINDOWS)?,
            provider_compactions: r.counter(&PROVIDER_COMPACTIONS)?,
            store_failovers: r.counter(&STORE_FAILOVERS)?,
            encoded_bodies: r.counter(&ENCODED_BODIES)?,
            response_chains: r.counter(&RESPONSE_CHAINS)?,
            team_tokens: r.counter(&TEAM_TOKENS)?,
            prompt_tokens_rewritten: r.counter(&PROMPT_TOKENS_REWRITTEN)?,
            prefix_rewrites: r.counter(&PREFIX_REWRITES)?,
            compaction_instructions: r.counter(&COMPACTION_INSTRUCTIONS)?,
            pinned_messages: r.counter(&PINNED_MESSAGES)?,
            prefix_rewrite_cost: r.counter(&PREFIX_REWRITE_COST)?,
            teams: None,
            registry,
            per_request: PerRequest::default(),
            at_scrape: std::sync::OnceLock::new(),
        }
        .with_known_labels())
    }

    /// Creates the series of every known label value at zero, so that counters of rare
    /// events (errors by route and status class, compactions by tier, store errors,
    /// overflow retries, summarizer failures) are exported from start-up: `rate()` then
    /// reads 0 instead of "no data", and the first increment is not lost to a series that
    /// did not exist at the previous scrape. Every label set here is closed and small.
    fn with_known_labels(self) -> Self {
        for route in Route::ALL {
            for class in STATUS_CLASSES {
                self.requests.with_label_values(&[route.as_str(), class]);
            }
        }
        for tier in Tier::ALL {
            for outcome in [Outcome::Compacted, Outcome::Observed] {
                self.compactions.with_label_values(&[tier.as_str(), outcome.as_str()]);
            }
        }
        for summarizer in SummarizerKind::ALL {
            self.summarizer_duration.with_label_values(&[summarizer.as_str()]);
        }
        for route in Route::COMPACTED {
            for outcome in Outcome::ALL {
                self.chat_requests.with_label_values(&[route.as_str(), outcome.as_str()]);
            }
            self.trail_rereads.with_label_values(&[route.as_str()]);
        }
        for reason in FailureReason::ALL {
            self.summarizer_failures.with_label_values(&[reason.as_str()]);
        }
        for result in OverflowRetry::ALL {
            self.overflow_retries.with_label_values(&[result.as_str()]);
        }
        for event in WindowEvent::ALL {
            self.learned_windows.with_label_values(&[event.as_str()]);
        }
        self.store_failovers.with_label_values(&[] as &[&str]);
        let encodings = ContentCoding::ALL.map(|c| c.as_str());
        for encoding in encodings.into_iter().chain([UNKNOWN_CODING]) {
            for result in DecodeResult::ALL {
                self.encoded_bodies.with_label_values(&[encoding, result.as_str()]);
            }
        }
        for result in ChainResult::ALL {
            self.response_chains.with_label_values(&[result.as_str()]);
        }
        for reason in RewriteReason::ALL {
            self.prefix_rewrites.with_label_values(&[reason.as_str()]);
            self.prefix_rewrite_cost.with_label_values(&[reason.as_str()]);
        }
        for source in InstructionSource::ALL {
            self.compaction_instructions.with_label_values(&[source.as_str()]);
        }
        self.pinned_messages.with_label_values(&[] as &[&str]);
        for api in CompactionApi::ALL {
            for served_by in ["upstream", "foldgate"] {
                self.provider_compactions.with_label_values(&[api.as_str(), served_by]);
            }
        }
        for op in StoreOp::ALL {
            self.store_errors.with_label_values(&[op.as_str()]);
            self.store_duration.with_label_values(&[op.as_str()]);
        }
        self
    }

    /// Reads the session store's figures (conversations held, failovers seen) when the
    /// metrics are scraped, with `figures` (`None` once the store is gone): the gauges
    /// of a state, read when they are asked for instead of by every request. The first
    /// call sets it.
    pub fn read_at_scrape(&self, figures: StoreFigures) {
        let _ = self.at_scrape.set(figures);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        if let Some((active, failovers)) = self.at_scrape.get().and_then(|figures| figures()) {
            self.active_sessions.set(i64::try_from(active).unwrap_or(i64::MAX));
            self.store_failovers_seen(failovers);
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "cannot render metrics");
        }
        out
    }

    /// Counts one finished request.
    pub fn request(&self, route: Route, status: u16) {
        let class = status_class_index(status);
        self.per_request.requests[route.index()][class]
            .get_or_init(|| {
                self.requests.with_label_values(&[route.as_str(), STATUS_CLASSES[class]])
            })
            .inc();
    }

    /// Records the time from the upstream send to the response headers.
    pub fn observe_upstream_ttfb(&self, route: Route, seconds: f64) {
        self.per_request.upstream_ttfb[route.index()]
            .get_or_init(|| self.upstream_ttfb.with_label_values(&[route.as_str()]))
            .observe(seconds);
    }

    /// Records the time spent before the upstream send.
    pub fn observe_proxy_overhead(&self, route: Route, seconds: f64) {
        self.per_request.proxy_overhead[route.index()]
            .get_or_init(|| self.proxy_overhead.with_label_values(&[route.as_str()]))
            .observe(seconds);
    }

    /// Counts the usage an upstream reported for one answer of `model`: the prompt split
    /// by what the provider's cache did with it, and the completion.
    pub fn upstream_usage(&self, model: &str, prompt: PromptSplit, completion: u64) {
        let Some(slot) = model_slot(model) else {
            return count_usage(&self.upstream_usage_tokens, model, prompt, completion);
        };
        let counters = &self.per_request.usage[slot];
        for (kind, count) in usage_counts(prompt, completion).into_iter().enumerate() {
            counters[kind]
                .get_or_init(|| {
                    self.upstream_usage_tokens.with_label_values(&[model, USAGE_KINDS[kind]])
                })
                .inc_by(count);
        }
    }

    /// These metrics, counting token usage by the team `teams` names.
    pub fn with_teams(mut self, teams: Option<Teams>) -> Self {
        self.teams = teams;
        self
    }

    /// The request header naming a team, when usage is counted by team.
    pub fn team_header(&self) -> Option<&str> {
        self.teams.as_ref().map(|t| t.header.as_str())
    }

    /// The team label of a request whose team header is `value` (see [`Teams`]); `None`
    /// when usage is not counted by team.
    pub fn team(&self, value: Option<&str>) -> Option<std::sync::Arc<str>> {
        self.teams.as_ref().map(|t| t.label(value))
    }

    /// Counts `team`'s share of an upstream answer's usage.
    pub fn team_usage(&self, team: &str, prompt: PromptSplit, completion: u64) {
        count_usage(&self.team_tokens, team, prompt, completion);
    }

    /// Counts the prompt tokens compaction saved `team`.
    pub fn team_saved(&self, team: &str, saved: u64) {
        self.team_tokens.with_label_values(&[team, "saved"]).inc_by(saved);
    }

    /// Brings the store failover counter up to `seen`, the store's own count.
    pub fn store_failovers_seen(&self, seen: u64) {
        let counter = self.store_failovers.with_label_values(&[] as &[&str]);
        let counted = counter.get();
        if seen > counted {
            counter.inc_by(seen - counted);
        }
    }

    /// Counts a request of the providers' compaction API `api`, served by foldgate or
    /// by the upstream.
    pub fn provider_compaction(&self, api: CompactionApi, by_foldgate: bool) {
        let served_by = if by_foldgate { "foldgate" } else { "upstream" };
        self.provider_compactions.with_label_values(&[api.as_str(), served_by]).inc();
    }

    /// Counts what became of a Responses chain.
    pub fn response_chain(&self, result: ChainResult) {
        self.response_chains.with_label_values(&[result.as_str()]).inc();
    }

    /// Counts a compressed request body of a compacted route by its (outermost) coding,
    /// `None` for one foldgate does not know, and what became of it.
    pub fn encoded_body(&self, coding: Option<ContentCoding>, result: DecodeResult) {
        let encoding = coding.map_or(UNKNOWN_CODING, ContentCoding::as_str);
        self.encoded_bodies.with_label_values(&[encoding, result.as_str()]).inc();
    }

    /// Counts `files` re-read on `route` (see [`Metrics::trail_rereads`]).
    pub fn trail_rereads(&self, route: Route, files: usize) {
        if files > 0 {
            self.trail_rereads.with_label_values(&[route.as_str()]).inc_by(files as u64);
        }
    }

    /// Counts one request of a compacted route by what happened to it.
    pub fn chat_request(&self, route: Route, outcome: Outcome) {
        self.per_request.chat_requests[route.index()][outcome.index()]
            .get_or_init(|| {
                self.chat_requests.with_label_values(&[route.as_str(), outcome.as_str()])
            })
            .inc();
    }

    /// Counts the prompt tokens of one request of a compacted route: as received
    /// (`before`) and as forwarded.
    pub fn prompt_tokens(&self, route: Route, model: &str, before: u64, forwarded: u64) {
        let labels = [route.as_str(), model];
        let vectors = [&self.prompt_tokens_before, &self.prompt_tokens_after, &self.tokens_saved];
        let counts = [before, forwarded, before.saturating_sub(forwarded)];
        let slots = model_slot(model).map(|slot| &self.per_request.prompt[route.index()][slot]);
        for (i, (vector, count)) in vectors.into_iter().zip(counts).enumerate() {
            match slots {
                Some(slots) => {
                    slots[i].get_or_init(|| vector.with_label_values(&labels)).inc_by(count)
                }
                None => vector.with_label_values(&labels).inc_by(count),
            }
        }
    }

    /// Counts `tokens` of a compacted request's prompt the provider caches again (see
    /// [`Metrics::prompt_tokens_rewritten`]).
    pub fn prompt_rewritten(&self, route: Route, model: &str, tokens: u64) {
        self.prompt_tokens_rewritten.with_label_values(&[route.as_str(), model]).inc_by(tokens);
    }

    /// Counts one prefix rewrite for `reason` and its estimated `cost` (token-equivalents).
    pub fn prefix_rewrite(&self, reason: RewriteReason, cost: f64) {
        let label = [reason.as_str()];
        self.prefix_rewrites.with_label_values(&label).inc();
        self.prefix_rewrite_cost.with_label_values(&label).inc_by(cost.max(0.0).round() as u64);
    }

    /// Counts the sources of compaction instructions a conversation has for the first
    /// time, and the messages pins kept in one request.
    pub fn steered(&self, sources: impl Iterator<Item = InstructionSource>, pinned: usize) {
        for source in sources {
            self.compaction_instructions.with_label_values(&[source.as_str()]).inc();
        }
        if pinned > 0 {
            self.pinned_messages.with_label_values(&[] as &[&str]).inc_by(pinned as u64);
        }
    }

    /// Counts one compaction by highest tier applied and outcome.
    pub fn compaction(&self, tier: Tier, outcome: Outcome) {
        self.compactions.with_label_values(&[tier.as_str(), outcome.as_str()]).inc();
    }

    /// Records one summarizer call: its duration, and why it failed when it did.
    pub fn summarizer_call(
        &self,
        summarizer: SummarizerKind,
        seconds: f64,
        failure: Option<FailureReason>,
    ) {
        self.summarizer_duration.with_label_values(&[summarizer.as_str()]).observe(seconds);
        if let Some(reason) = failure {
            self.summarizer_failures.with_label_values(&[reason.as_str()]).inc();
        }
    }

    /// Counts one overflow retry by result.
    pub fn overflow_retry(&self, result: OverflowRetry) {
        self.overflow_retries.with_label_values(&[result.as_str()]).inc();
    }

    /// Counts one learned-window event.
    pub fn learned_window(&self, event: WindowEvent) {
        self.learned_windows.with_label_values(&[event.as_str()]).inc();
    }

    /// Records one session store operation: its duration, and whether it failed.
    pub fn observe_store(&self, op: StoreOp, elapsed: std::time::Duration, failed: bool) {
        let per = &self.per_request;
        per.store_duration[op.index()]
            .get_or_init(|| self.store_duration.with_label_values(&[op.as_str()]))
            .observe(elapsed.as_secs_f64());
        if failed {
            per.store_errors[op.index()]
                .get_or_init(|| self.store_errors.with_label_values(&[op.as_str()]))
                .inc();
        }
    }
}

#[cfg(test)]
mod team_tests {
    use super::Teams;

    #[test]
    fn team_labels_stay_a_bounded_set() {
        let listed = Teams::new("X-Team", &["a".to_owned()], 10);
        assert_eq!(&*listed.label(Some("a")), "a");
        assert_eq!(&*listed.label(Some("b")), "other");
        assert_eq!(&*listed.label(None), "none");
        let capped = Teams::new("x-team", &[], 2);
        assert_eq!(&*capped.label(Some("one")), "one");
        assert_eq!(&*capped.label(Some("two")), "two");
        assert_eq!(&*capped.label(Some("three")), "other", "past the cap");
        assert_eq!(&*capped.label(Some("one")), "one", "a team seen keeps its name");
        for bad in ["", "spaces here", "none", "other", &"x".repeat(65), "naïve"] {
            assert_eq!(&*capped.label(Some(bad)), "other", "{bad:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_normalised_into_a_bounded_set() {
        // The last name is remembered: asked again, or after another, the same answer.
        for _ in 0..2 {
            assert_eq!(model_label("claude-sonnet-4-5"), "claude");
            assert_eq!(model_label("claude-sonnet-4-5"), "claude");
            assert_eq!(model_label("openai/GPT-4o-mini"), "gpt-4o-mini");
        }
        assert_eq!(model_label("gpt-4o-2024-08-06"), "gpt-4o");
        assert_eq!(model_label("gpt-4o-mini"), "gpt-4o-mini");
        assert_eq!(model_label("openai/gpt-4.1-mini"), "gpt-4.1-mini");
        assert_eq!(model_label("gpt-4.1"), "gpt-4.1");
        assert_eq!(model_label("o3"), "o3");
        assert_eq!(model_label("o3-mini-high"), "o3-mini");
        assert_eq!(model_label("claude-3-5-sonnet-20241022"), "claude");
        assert_eq!(model_label("anthropic/claude-opus-4"), "claude");
        assert_eq!(model_label("gpt-5"), "gpt-5");
        assert_eq!(model_label("o1x"), "other");
        assert_eq!(model_label("my-finetune-123"), "other");
        assert_eq!(model_label(""), "other");
    }

    #[test]
    fn renders_registered_metrics() {
        let m = Metrics::new().unwrap();
        m.request(Route::ChatCompletions, 200);
        m.chat_request(Route::Responses, Outcome::Compacted);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains(
            "foldgate_requests_total{route=\"chat_completions\",status_class=\"2xx\"} 1"
        ));
        assert!(
            text.contains(
                "foldgate_chat_requests_total{outcome=\"compacted\",route=\"responses\"} 1"
            )
        );
    }
}
