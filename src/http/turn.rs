//! One request of a compacted route at the edge, whatever its API shape: the dialect
//! reads the body (its outline first: a request far below the trigger is decided from
//! it, unparsed, on the connection's thread), the conversation stage compacts it, the
//! dialect renders what to forward; after an overflow error the conversation compacts
//! deeper. [`Turn::finish`] is the one place a request's metrics, inspector record and
//! `x-foldgate-*` headers are written. The handler (`super::handler`) does the sending.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::body::ProxyBody;
use super::compaction_apis::CompactionApis;
use super::dialect::Dialect;
use super::inspect::{EdgeFacts, Inspector};
use super::session_key::SessionHeaders;
use super::usage_tap::{OnUsage, UsageSlot, team_of};
use crate::conversation::{Caller, Conversations, Decision, Overflow};
use crate::conversation::{FoldWhen, Options, Report, WholeFold};
use crate::learned::model_key;
use crate::metrics::{Metrics, OverflowRetry, Route, WindowEvent, model_label};
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::{ClientHeaders, Credential};
use crate::vocab::{CompactionApi, Outcome};

/// What the edge's compacted routes share. Cheap to clone: every connection thread
/// holds one.
#[derive(Clone)]
pub struct Turns {
    /// The conversation stage.
    pub conversations: Conversations,
    /// The headers naming a conversation (`session.header`).
    pub session_header: SessionHeaders,
    /// `compaction.enabled`.
    pub enabled: bool,
    /// The session inspector, when on (`admin.listen`): every request is recorded.
    pub inspector: Option<Arc<Inspector>>,
    /// Who serves the providers' own compaction APIs.
    pub provider: Arc<CompactionApis>,
}

/// One request of a conversation, from its decision to its recorded outcome.
pub struct Turn<'a, D: Dialect> {
    turns: &'a Turns,
    dialect: &'a D,
    metrics: &'a Arc<Metrics>,
    headers: &'a HeaderMap,
    original: &'a Bytes,
    /// The parsed request and the origins of its messages; `None` when it was decided
    /// from its outline.
    parsed: Option<(Arc<ChatRequest>, D::Origins)>,
    key: SessionKey,
    model: &'static str,
    /// The request's `model`, as sent.
    model_name: String,
    model_key: String,
    learned: Option<usize>,
    decision: Decision,
    /// What the overflow retry did, when there was an overflow.
    overflow: Option<OverflowRetry>,
    /// The overflow stated a window smaller than any known.
    learned_window: bool,
    /// The provider compaction API foldgate served on this request, when it changed it.
    provider_api: Option<CompactionApi>,
    /// Where the usage of the answer being sent arrives when it ends (while the
    /// inspector is on: the request is recorded with it).
    answer: Option<UsageSlot>,
    /// What foldgate changed besides the engine's compaction (a provider's edits it
    /// served), in a few words each: recorded with why the request got its tier.
    notes: Vec<String>,
}

/// A deeper compaction to send after an overflow error.
pub struct Retry {
    /// The body to send.
    pub body: Bytes,
    /// When the retry's work began (for the overhead metric).
    pub started: Instant,
}

/// Counts a request of a compacted route that no turn took (`Disabled`, `NotChat`).
pub fn record_untaken(metrics: &Metrics, route: Route, outcome: Outcome) {
    metrics.chat_request(route, outcome);
    super::trace::record_outcome(outcome);
}

impl Turns {
    /// Decides what to forward for `original` (the body as received); `None` when the
    /// dialect does not understand it (it is then forwarded as it is). A request far
    /// below the trigger is decided from its outline on the calling task, without
    /// parsing or conversation state; any other goes to the conversation stage.
    pub async fn begin<'a, D: Dialect>(
        &'a self,
        dialect: &'a D,
        upstream: &str,
        headers: &'a HeaderMap,
        original: &'a Bytes,
        metrics: &'a Arc<Metrics>,
    ) -> Option<Turn<'a, D>> {
        let outline = dialect.outline(original);
        let mut parsed = None;
        let model_name = match &outline {
            Some(outline) => dialect.outline_model(outline),
            None => parsed.insert(parse(dialect, original)?).0.model(),
        };
        let model_name = model_name.unwrap_or_default();
        let model_key = model_key(upstream, &model_name);
        let learned = self.conversations.learned_window(&model_key);
        let options = Options {
            window_cap: learned,
            token_ratio: self.token_ratio(dialect, &model_name),
            ..Options::default()
        };
        let session_header = &self.session_header;
        // Far below the trigger (most requests of most conversations) the request goes as
        // it is: not parsed, no conversation state, no hop to the compaction runtime.
        let quick = outline.as_ref().and_then(|outline| {
            let report = self.conversations.clearly_below(dialect.measure(outline)?, &options)?;
            let key = dialect.outline_session_key(headers, session_header, outline)?;
            Some((Decision::unchanged(report), key))
        });
        drop(outline);
        let (decision, key) = match quick {
            Some(quick) => quick,
            None => {
                let (request, origins) = match parsed.take() {
                    Some(parsed) => parsed,
                    None => parse(dialect, original)?,
                };
                let key = dialect.session_key(headers, session_header, &request);
                let decision = if dialect.server_state(&origins) {
                    // The provider holds the conversation: nothing here to compact.
                    Decision::passthrough()
                } else {
                    let caller = caller(dialect, headers);
                    self.conversations.compact(&key, &request, &caller, &options).await
                };
                parsed = Some((request, origins));
                (decision, key)
            }
        };
        log_decision(&decision, false);
        let edge = Edge { turns: self, dialect, metrics, headers, original };
        Some(Turn::new(edge, parsed, key, (model_name, model_key), learned, decision))
    }

    /// A turn for a request foldgate answers itself from the whole conversation (a
    /// provider compaction API it serves, such as `POST /v1/responses/compact`): parsed
    /// and keyed, nothing compacted; it is recorded as forwarded unchanged until
    /// [`Turn::folded`] says otherwise. `None` when the dialect does not understand it.
    pub fn begin_whole<'a, D: Dialect>(
        &'a self,
        dialect: &'a D,
        upstream: &str,
        headers: &'a HeaderMap,
        original: &'a Bytes,
        metrics: &'a Arc<Metrics>,
    ) -> Option<Turn<'a, D>> {
        let (request, origins) = parse(dialect, original)?;
        let model_name = request.model().unwrap_or_default();
        let key = dialect.session_key(headers, &self.session_header, &request);
        let model_key = model_key(upstream, &model_name);
        let edge = Edge { turns: self, dialect, metrics, headers, original };
        let parsed = Some((request, origins));
        Some(Turn::new(edge, parsed, key, (model_name, model_key), None, Decision::passthrough()))
    }

    /// Provider tokens per engine token for a conversation of `model` without a ratio of
    /// its own, for a dialect whose provider counts with an encoder the engine lacks.
    fn token_ratio<D: Dialect>(&self, dialect: &D, model: &str) -> Option<f64> {
        dialect.calibrated().then(|| self.conversations.token_ratio(model)).flatten()
    }
}

/// Who sent the request, as the conversation stage needs it.
pub fn caller<D: Dialect>(dialect: &D, headers: &HeaderMap) -> Caller {
    Caller {
        credential: Credential::from_headers(headers),
        summary_api: dialect.summary_api(headers),
        summary_headers: ClientHeaders::from_request(headers),
    }
}

/// Where a turn's request came from: what every turn of the edge shares, its dialect,
/// and the request's headers and body as received.
struct Edge<'a, D> {
    turns: &'a Turns,
    dialect: &'a D,
    metrics: &'a Arc<Metrics>,
    headers: &'a HeaderMap,
    original: &'a Bytes,
}

impl<'a, D: Dialect> Turn<'a, D> {
    /// A turn of the request from `edge`, decided as `decision`; `names` are its model
    /// as sent and its key among learned windows.
    fn new(
        edge: Edge<'a, D>,
        parsed: Option<(Arc<ChatRequest>, D::Origins)>,
        key: SessionKey,
        names: (String, String),
        learned: Option<usize>,
        decision: Decision,
    ) -> Self {
        let Edge { turns, dialect, metrics, headers, original } = edge;
        let (model_name, model_key) = names;
        Self {
            turns,
            dialect,
            metrics,
            headers,
            original,
            parsed,
            key,
            model: model_label(&model_name),
            model_name,
            model_key,
            learned,
            decision,
            overflow: None,
            learned_window: false,
            provider_api: None,
            answer: None,
            notes: Vec::new(),
        }
    }
}

impl<D: Dialect> Turn<'_, D> {
    /// The body to forward: the original bytes, or the rendered compaction.
    pub fn body(&self) -> Bytes {
        match (&self.decision.rewritten, &self.parsed) {
            (Some(compacted), Some((_, origins))) => {
                self.dialect.render(self.original, origins, compacted)
            }
            _ => self.original.clone(),
        }
    }

    /// The request's model label.
    pub fn model(&self) -> &'static str {
        self.model
    }

    /// The request's `model`, as sent.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// True when the request asks for an event stream (`"stream": true`).
    pub fn streams(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Stream {
            #[serde(default)]
            stream: bool,
        }
        serde_json::from_slice::<Stream>(self.original).is_ok_and(|s| s.stream)
    }

    /// What to do when the answer about to be sent ends, with the usage it reported:
    /// record the request in the inspector, and calibrate token counts (see
    /// [`Turn::calibration`]). Call once per answer sent: the last one is recorded.
    pub fn on_usage(&mut self) -> Option<OnUsage> {
        let calibration = self.calibration();
        if self.turns.inspector.is_none() {
            return calibration;
        }
        let slot = UsageSlot::default();
        let on_usage = slot.on_usage(calibration);
        self.answer = Some(slot);
        Some(on_usage)
    }

    /// For a dialect whose provider counts tokens with an encoder the engine does not
    /// have, and a forwarded prompt the engine counted exactly: what to do with the usage
    /// the upstream reports (calibrate the model's and the conversation's ratio).
    fn calibration(&self) -> Option<OnUsage> {
        if !self.dialect.calibrated() {
            return None;
        }
        let report = self.decision.report.as_ref().filter(|r| r.tokens_before_exact)?;
        let tokens = match self.decision.rewritten {
            Some(_) => report.tokens_after,
            None => report.tokens_before,
        };
        let conversations = &self.turns.conversations;
        let counted =
            conversations.counted(&self.key, &self.model_name, tokens, self.decision.token_ratio);
        Some(Box::new(move |usage: Option<super::usage_tap::Usage>| {
            if let Some(usage) = usage {
                counted.observe(usage.prompt);
            }
        }))
    }

    /// False when an overflow could not be retried: the request relies on conversation
    /// state the provider keeps, or is already the retry.
    pub fn retryable(&self) -> bool {
        let server_state = self.parsed.as_ref().is_some_and(|(_, o)| self.dialect.server_state(o));
        !server_state && !self.retried()
    }

    /// After an error answer with `error_body`: when it is a context overflow, the
    /// conversation learns the window it states and compacts deeper, forced. `None` when
    /// the answer stands (not an overflow, or nothing more to take out).
    pub async fn retry_after(&mut self, error_body: &[u8]) -> Option<Retry> {
        if !self.dialect.is_overflow(error_body) {
            return None;
        }
        let stated = self.dialect.stated_window(error_body);
        let conversations = &self.turns.conversations;
        if let Some(window) = stated {
            if conversations.learn_window(&self.model_key, window).await {
                self.learned_window = true;
                tracing::info!(model = %self.model_key, window, "context window learned from an overflow error");
            }
        }
        if self.parsed.is_none() {
            self.parsed = Some(parse(self.dialect, self.original)?);
        }
        let (request, origins) = self.parsed.as_ref()?;
        if self.dialect.server_state(origins) {
            return None;
        }
        let overflow = Overflow {
            stated,
            planned: self.decision.report.as_ref(),
            token_ratio: self.turns.token_ratio(self.dialect, &self.model_name),
        };
        let started = Instant::now();
        let caller = caller(self.dialect, self.headers);
        let retry = conversations.retry(&self.key, request, &caller, overflow).await;
        log_decision(&retry, true);
        let Some(compacted) = &retry.rewritten else {
            // Nothing more to take out (or observe mode): the upstream's answer stands.
            self.overflow = Some(OverflowRetry::NothingToCompact);
            return None;
        };
        let body = self.dialect.render(self.original, origins, compacted);
        self.overflow = Some(OverflowRetry::Retried);
        self.decision = retry;
        Some(Retry { body, started })
    }

    /// Folds the whole request for a provider compaction foldgate serves, when it is as
    /// large as `when` says: what is forwarded becomes the kept messages and the digest
    /// (written with the client's `instructions`, if any). `None` when it was not folded
    /// (smaller, nothing to fold, the provider keeps the conversation, or the fold failed:
    /// the request goes on as decided).
    pub async fn fold_whole(
        &mut self,
        when: FoldWhen,
        instructions: Option<String>,
    ) -> Option<WholeFold> {
        if self.parsed.is_none() {
            self.parsed = Some(parse(self.dialect, self.original)?);
        }
        let (request, origins) = self.parsed.as_ref()?;
        if self.dialect.server_state(origins) {
            return None;
        }
        let options = Options {
            window_cap: self.learned,
            token_ratio: self.turns.token_ratio(self.dialect, &self.model_name),
            summary_instructions: instructions,
            ..Options::default()
        };
        let caller = caller(self.dialect, self.headers);
        let conversations = &self.turns.conversations;
        match conversations.fold_whole(request, &caller, &options, when).await {
            Ok(Some(fold)) => {
                self.folded(&fold);
                Some(fold)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::warn!(%error, "provider compaction failed; the request goes on as decided");
                None
            }
        }
    }

    /// The parsed request and where its messages came from, when the turn has them (a
    /// turn decided from its outline does not).
    pub fn parsed(&self) -> Option<&(Arc<ChatRequest>, D::Origins)> {
        self.parsed.as_ref()
    }

    /// Records that the whole request was folded as `fold` (it is forwarded, or
    /// answered, as the kept messages and the digest).
    pub fn folded(&mut self, fold: &WholeFold) {
        if let Some((request, _)) = &self.parsed {
            self.decision = Decision::folded_whole(request, fold);
            log_decision(&self.decision, false);
        }
    }

    /// Notes that foldgate served `api` on this request (it is recorded with it).
    pub fn served(&mut self, api: CompactionApi) {
        self.provider_api = Some(api);
    }

    /// Notes a change foldgate made to the request besides the engine's compaction (it
    /// is recorded with why the request got its tier).
    pub fn note(&mut self, change: String) {
        self.notes.push(change);
    }

    /// True when the forwarded body is a retry after an overflow error.
    fn retried(&self) -> bool {
        self.overflow == Some(OverflowRetry::Retried)
    }

    /// Records what happened to the request (metrics, the session inspector, its span
    /// when traces are exported) and says it in `x-foldgate-*` headers of `response`.
    pub fn finish(&self, mut response: Response<ProxyBody>) -> Response<ProxyBody> {
        self.record();
        let (key, model, learned) = (self.key.as_str(), &self.model_name, self.learned);
        super::trace::record_turn(&self.decision, key, model, self.retried(), learned);
        self.tag(response.headers_mut());
        response
    }

    /// Records what happened to the request in the metrics and the session inspector.
    fn record(&self) {
        let (metrics, decision) = (self.metrics, &self.decision);
        if let Some(inspector) = &self.turns.inspector {
            let (key, model, api) = (&self.key, self.model, self.provider_api);
            let edge = EdgeFacts { retried: self.retried(), api, notes: &self.notes };
            let entry = inspector.entry(self.headers, key, model, decision, edge);
            match &self.answer {
                Some(answer) => answer.then(Box::new(move |usage| {
                    entry.write(usage.map(super::usage_tap::Usage::entry));
                })),
                None => entry.write(None),
            }
        }
        let route = self.dialect.route();
        metrics.chat_request(route, decision.outcome);
        let store = self.turns.conversations.store();
        metrics.active_sessions.set(i64::try_from(store.active_sessions()).unwrap_or(i64::MAX));
        metrics.store_failovers_seen(store.failovers_seen());
        if self.learned.is_some() {
            metrics.learned_window(WindowEvent::Applied);
        }
        if self.learned_window {
            metrics.learned_window(WindowEvent::Learned);
        }
        if let Some(result) = self.overflow {
            metrics.overflow_retry(result);
        }
        let Some(report) = &decision.report else { return };
        let before = report.tokens_before as u64;
        let forwarded =
            if decision.rewritten.is_some() { report.tokens_after as u64 } else { before };
        metrics.prompt_tokens(route, self.model, before, forwarded);
        if let Some(team) = team_of(metrics, self.headers) {
            metrics.team_saved(&team, before.saturating_sub(forwarded));
        }
        if decision.rewritten.is_some() {
            metrics.prompt_rewritten(route, self.model, report.rewritten_tokens as u64);
        }
        if decision.outcome.engine_compacted() && before > 0 {
            metrics.compaction_ratio.observe(report.tokens_after as f64 / before as f64);
            metrics.fold_wait.observe(decision.fold_wait.as_secs_f64());
            metrics.compaction(report.tier, decision.outcome);
        }
        if let Some(recall) = report.artifact_recall {
            metrics.artifact_recall.observe(recall);
        }
        metrics.trail_rereads(route, report.rereads);
    }

    /// Says in `x-foldgate-*` headers what happened.
    fn tag(&self, headers: &mut HeaderMap) {
        let decision = &self.decision;
        let mut set = |name: &'static str, value: HeaderValue| {
            headers.insert(HeaderName::from_static(name), value);
        };
        set("x-foldgate-outcome", HeaderValue::from_static(decision.outcome.as_str()));
        if let Ok(value) = HeaderValue::from_str(self.key.as_str()) {
            set("x-foldgate-session", value);
        }
        if let Some(Report { tokens_before, tokens_after, tier, .. }) = &decision.report {
            set("x-foldgate-tokens-before", HeaderValue::from(*tokens_before));
            set("x-foldgate-tokens-after", HeaderValue::from(*tokens_after));
            set("x-foldgate-tier", HeaderValue::from(u16::from(tier.number())));
        }
        if !decision.fold_wait.is_zero() {
            let millis = u64::try_from(decision.fold_wait.as_millis()).unwrap_or(u64::MAX);
            set("x-foldgate-fold-wait-ms", HeaderValue::from(millis));
        }
        if self.retried() {
            set("x-foldgate-retried", HeaderValue::from_static("1"));
        }
        // The request was planned against a window learned from an earlier overflow error.
        if let Some(window) = self.learned {
            set("x-foldgate-learned-window", HeaderValue::from(window));
        }
    }
}

/// `body` parsed by `dialect`, the request shared with the compaction runtime.
fn parse<D: Dialect>(dialect: &D, body: &[u8]) -> Option<(Arc<ChatRequest>, D::Origins)> {
    dialect.parse(body).map(|(request, origins)| (Arc::new(request), origins))
}

fn log_decision(decision: &Decision, retry: bool) {
    let Some(report) = &decision.report else { return };
    if decision.outcome == Outcome::Passthrough && !retry {
        tracing::debug!(tokens = report.tokens_before, "below the trigger");
        return;
    }
    tracing::info!(
        outcome = decision.outcome.as_str(),
        retry,
        tier = report.tier.number(),
        why = %report.why(),
        tokens_before = report.tokens_before,
        tokens_after = report.tokens_after,
        folded = report.folded,
        elided = report.elided,
        dropped = report.dropped,
        blocks_reused = report.blocks_reused,
        fold_postponed = report.fold_postponed,
        fold_wait_ms = decision.fold_wait.as_millis() as u64,
        blocks_new = report.blocks_new,
        summarizer = report.summarizer.as_deref().unwrap_or("-"),
        summarizer_error = report.summarizer_error.as_deref().unwrap_or("-"),
        "compaction"
    );
}
