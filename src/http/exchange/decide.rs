//! The exchange's phases that ask the conversation stage: the decision (phase 3), the
//! whole fold a provider compaction asks for (phase 4), the deeper compaction after an
//! overflow (phase 7), and the token count to calibrate when the answer ends.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::{Exchange, answers_whole, out_of_line};
use crate::conversation::{Caller, Counted, Decision, FoldWhen, Options, Overflow, WholeFold};
use crate::http::dialect::{Dialect, OverflowSignals};
use crate::http::record::Decided;
use crate::learned::model_key;
use crate::metrics::{OverflowRetry, model_label};
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::{ClientHeaders, Credential};
use crate::vocab::Outcome;

impl<D: Dialect> Exchange<'_, D> {
    /// Phase 3: decides what to forward for the prepared body; false when the dialect
    /// does not understand it (it is then forwarded as received). A request far below
    /// the trigger is decided from its outline on the calling task, without parsing or
    /// conversation state; any other goes to the conversation stage. A request foldgate
    /// answers from the whole conversation (`/v1/responses/compact`, a served provider
    /// compaction that answers here) is parsed and keyed, nothing compacted.
    pub(super) async fn decide(&mut self) -> bool {
        let (dialect, routes) = (self.place.dialect, self.place.routes);
        let original = &self.prepared.body;
        self.parsed = None;
        // Answered here from the whole conversation: parsed and keyed, never compacted.
        let whole = answers_whole(dialect)
            || self.prepared.served.as_ref().is_some_and(|served| served.answered_here());
        let outline = if whole { None } else { dialect.outline(original) };
        let model_name = match &outline {
            Some(outline) => dialect.outline_model(outline),
            None => match parse(dialect, original) {
                Some(parsed) => self.parsed.insert(parsed).0.model(),
                None => return false,
            },
        };
        let model_name = model_name.unwrap_or_default();
        let upstream = self.place.upstream.name();
        let learned = routes.conversations.learned_window_by(|| model_key(upstream, &model_name));
        let steer = self.steer.clone().unwrap_or_else(|| routes.steer.clone());
        let options = Options {
            window_cap: learned,
            token_ratio: self.token_ratio(&model_name),
            steer,
            ..Options::default()
        };
        let headers = &self.headers;
        // Far below the trigger (most requests of most conversations) the request goes as
        // it is: not parsed, no conversation state, no hop to the compaction runtime.
        let quick = outline.as_ref().and_then(|outline| {
            let report = routes.conversations.clearly_below(dialect.measure(outline)?, &options)?;
            let key = dialect.outline_session_key(headers, &routes.session_header, outline)?;
            Some((report, key))
        });
        drop(outline);
        let (decision, key) = match quick {
            Some((report, key)) => (Decision::unchanged(report), key),
            None => match out_of_line(self.decide_parsed(whole, options)).await {
                Some(decided) => decided,
                None => return false,
            },
        };
        log_decision(&decision, false);
        let model = model_label(&model_name);
        let decided = Decided { key, model_name, model, learned, decision };
        self.record.decided = Some(Box::new(decided));
        true
    }

    /// Phase 3 for a request not clearly below the trigger: parsed (unless it was),
    /// keyed, and given to the conversation stage; `None` when the dialect does not
    /// understand it.
    async fn decide_parsed(
        &mut self,
        whole: bool,
        options: Options,
    ) -> Option<(Decision, SessionKey)> {
        let (dialect, routes) = (self.place.dialect, self.place.routes);
        if self.parsed.is_none() {
            self.parsed = Some(parse(dialect, &self.prepared.body)?);
        }
        let (request, origins) = self.parsed.as_ref()?;
        let headers = &self.headers;
        let key = dialect.session_key(headers, &routes.session_header, request);
        let decision = if whole || dialect.server_state(origins) {
            // Answered from the whole conversation, or the provider holds it: nothing
            // here to compact.
            Decision::passthrough()
        } else {
            let caller = caller(dialect, headers);
            routes.conversations.compact(&key, request, &caller, &options).await
        };
        Some((decision, key))
    }

    /// The body to forward: the prepared body (as it was before a chain was expanded
    /// into it), or the rendered compaction.
    pub(super) fn body(&self) -> Bytes {
        let rewritten = self.record.decided.as_ref().and_then(|d| d.decision.rewritten.as_ref());
        match (rewritten, &self.parsed, &self.continued) {
            (Some(compacted), Some((_, origins)), _) => {
                self.place.dialect.render(&self.prepared.body, origins, compacted)
            }
            _ if self.as_received.is_some() => self.as_received.clone().unwrap_or_default(),
            (_, _, Some((before, _))) => before.clone(),
            _ => self.prepared.body.clone(),
        }
    }

    /// True when the request asks for an event stream (`"stream": true`).
    pub(super) fn streams(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Stream {
            #[serde(default)]
            stream: bool,
        }
        serde_json::from_slice::<Stream>(&self.prepared.body).is_ok_and(|s| s.stream)
    }

    /// False when an overflow could not be retried: the request relies on conversation
    /// state the provider keeps, is answered from the whole conversation, or is already
    /// the retry.
    pub(super) fn retryable(&self) -> bool {
        let dialect = self.place.dialect;
        let server_state = self.parsed.as_ref().is_some_and(|(_, o)| dialect.server_state(o));
        !server_state && !answers_whole(dialect) && !self.record.retried()
    }

    /// Phase 7: after an error answer with `error_body`, when it is a context overflow,
    /// the conversation learns the window it states and compacts deeper, forced: the body
    /// to send again. `None` when the answer stands (not an overflow, or nothing more to
    /// take out).
    pub(super) async fn retry_after_overflow(&mut self, error_body: &[u8]) -> Option<Bytes> {
        let (dialect, routes) = (self.place.dialect, self.place.routes);
        if !dialect.overflow().is_overflow(error_body) || answers_whole(dialect) {
            return None;
        }
        let stated = dialect.overflow().stated_window(error_body);
        let conversations = &routes.conversations;
        if let Some(window) = stated {
            let model_name = self.record.decided.as_ref().map_or("", |d| &d.model_name);
            let model_key = model_key(self.place.upstream.name(), model_name);
            if conversations.learn_window(&model_key, window).await {
                self.record.learned_window = true;
                tracing::info!(model = %model_key, window, "context window learned from an overflow error");
            }
        }
        if !self.parsed_here() {
            return None;
        }
        let (request, origins) = self.parsed.as_ref()?;
        let token_ratio = self.token_ratio(&self.record.decided.as_ref()?.model_name);
        let decided = self.record.decided.as_mut()?;
        let steer = self.steer.as_ref().unwrap_or(&self.place.routes.steer);
        let planned = decided.decision.report.as_deref();
        let overflow = Overflow { stated, planned, token_ratio, steer };
        self.record.started = std::time::Instant::now();
        let caller = caller(dialect, &self.headers);
        let retry = conversations.retry(&decided.key, request, &caller, overflow).await;
        log_decision(&retry, true);
        let Some(compacted) = &retry.rewritten else {
            // Nothing more to take out (or observe mode): the upstream's answer stands.
            self.record.overflow = Some(OverflowRetry::NothingToCompact);
            return None;
        };
        let body = dialect.render(&self.prepared.body, origins, compacted);
        self.record.overflow = Some(OverflowRetry::Retried);
        decided.decision = retry;
        Some(body)
    }

    /// Folds the whole request for a provider compaction foldgate serves, when it is as
    /// large as `when` says: what is forwarded becomes the kept messages and the digest
    /// (written with the client's `instructions`, if any). `None` when it was not folded
    /// (smaller, nothing to fold, the provider keeps the conversation, or the fold failed:
    /// the request goes on as decided).
    pub(super) async fn fold_whole(
        &mut self,
        when: FoldWhen,
        instructions: Option<String>,
    ) -> Option<WholeFold> {
        let (dialect, routes) = (self.place.dialect, self.place.routes);
        if !self.parsed_here() {
            return None;
        }
        let (request, _) = self.parsed.as_ref()?;
        let token_ratio = self.token_ratio(&self.record.decided.as_ref()?.model_name);
        let decided = self.record.decided.as_mut()?;
        let steer = self.steer.clone().unwrap_or_else(|| routes.steer.clone());
        let options = Options {
            window_cap: decided.learned,
            token_ratio,
            summary_instructions: instructions,
            steer,
            ..Options::default()
        };
        let caller = caller(dialect, &self.headers);
        match routes.conversations.fold_whole(request, &caller, &options, when).await {
            Ok(Some(fold)) => {
                decided.decision = Decision::folded_whole(request, &fold);
                log_decision(&decided.decision, false);
                Some(fold)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::warn!(%error, "provider compaction failed; the request goes on as decided");
                None
            }
        }
    }

    /// Parses the prepared body if it is not yet; true when it is a request of the
    /// dialect whose conversation foldgate holds (not one the provider keeps).
    fn parsed_here(&mut self) -> bool {
        let dialect = self.place.dialect;
        if self.parsed.is_none() {
            self.parsed = parse(dialect, &self.prepared.body);
        }
        self.parsed.as_ref().is_some_and(|(_, origins)| !dialect.server_state(origins))
    }

    /// For a dialect whose provider counts tokens with an encoder the engine does not
    /// have, and a forwarded prompt the engine counted exactly: the count to calibrate
    /// against the usage the upstream reports (the model's and the conversation's ratio).
    pub(super) fn calibration(&self) -> Option<Counted> {
        if !self.place.dialect.calibrated() {
            return None;
        }
        let decided = self.record.decided.as_ref()?;
        let decision = &decided.decision;
        let report = decision.report.as_ref().filter(|r| r.tokens_before_exact)?;
        let tokens = match decision.rewritten {
            Some(_) => report.tokens_after,
            None => report.tokens_before,
        };
        let conversations = &self.place.routes.conversations;
        Some(conversations.counted(&decided.key, &decided.model_name, tokens, decision.token_ratio))
    }

    /// Provider tokens per engine token for a conversation of `model` without a ratio of
    /// its own, for a dialect whose provider counts with an encoder the engine lacks.
    fn token_ratio(&self, model: &str) -> Option<f64> {
        let conversations = &self.place.routes.conversations;
        self.place.dialect.calibrated().then(|| conversations.token_ratio(model)).flatten()
    }
}

/// Who sent the request, as the conversation stage needs it.
fn caller<D: Dialect>(dialect: &D, headers: &HeaderMap) -> Caller {
    Caller {
        credential: Credential::from_headers(headers),
        summary_api: dialect.summary_api(headers),
        summary_headers: ClientHeaders::from_request(headers),
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
