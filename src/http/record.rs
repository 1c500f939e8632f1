//! The recorder: what foldgate writes about a request (metrics, the inspector entry,
//! the span, usage, calibration, the `x-foldgate-*` headers), written once, from what
//! the exchange learned on the way ([`Record`]). The headers go out with the answer's
//! head ([`Record::tag`]); everything else when the answer's last byte was sent or the
//! client left ([`Recorder`], which watches the answer's body), or when the request
//! failed before any answer ([`Record::failed`]). The only code of the edge that writes
//! metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http::header::HeaderMap;
use http_body_util::BodyExt;
use tracing::Span;

use crate::conversation::{Counted, Decision, Report};
use crate::http::body::{BodyEnd, BodyObserver, Observed, ProxyBody};
use crate::http::inspect::PendingRecord;
use crate::http::tags::Tags;
use crate::http::usage::UsageReader;
use crate::metrics::{
    ChainResult, DecodeResult, Metrics, OverflowRetry, Route, WindowEvent, model_label,
};
use crate::session::SessionKey;
use crate::telemetry::span::{self, TurnRecord, UsageRecord};
use crate::vocab::{CompactionApi, ContentCoding, Outcome};

/// What an exchange learned about its request, as it went.
pub struct Record {
    /// The request's route.
    pub route: Route,
    /// What the client asked: a chat turn, a compaction (`/v1/responses/compact`), or a
    /// request forwarded as it is.
    pub operation: Operation,
    /// The outcome of a request of a compacted route that no decision took (compaction
    /// off, a body foldgate does not understand); a decided request's is its decision's.
    pub untaken: Option<Outcome>,
    /// The conversation's decision, once made (boxed: the record moves with the answer,
    /// and most requests have one).
    pub decided: Option<Box<Decided>>,
    /// The request's team label (`metrics.team_header`), when usage is counted by team.
    pub team: Option<Arc<str>>,
    /// How the body's `Content-Encoding` was read, when it had one.
    pub encoded: Option<(Option<ContentCoding>, DecodeResult)>,
    /// A provider compaction API on this request, and whether foldgate served it.
    pub provider_api: Option<(CompactionApi, bool)>,
    /// Changes foldgate made besides the engine's compaction, in a few words each.
    pub notes: Vec<String>,
    /// What the overflow retry did, when there was an overflow.
    pub overflow: Option<OverflowRetry>,
    /// The overflow stated a window smaller than any known.
    pub learned_window: bool,
    /// What became of the Responses chain the request continued, if it named one.
    pub chain: Option<ChainResult>,
    /// The answer is foldgate's own (a provider compaction it served): the upstream was
    /// not asked (`x-foldgate-served-by: foldgate`).
    pub answered_here: bool,
    /// Set once the answer is stored as the end of its Responses chain.
    pub chain_stored: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// When foldgate began working on the request.
    pub started: Instant,
    /// Each send upstream (the first, and the retry after an overflow).
    sends: [Option<Sent>; 2],
}

/// What the client asked, as the request's span names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A chat turn of a compacted route.
    Chat,
    /// `POST /v1/responses/compact`.
    Compact,
    /// Any other request, forwarded as it is.
    Forward,
}

/// The conversation's decision on a request, and what it was made with.
pub struct Decided {
    /// The conversation.
    pub key: SessionKey,
    /// The request's `model`, as sent.
    pub model_name: String,
    /// Its label (see [`model_label`]), found once.
    pub model: &'static str,
    /// The window learned from an earlier overflow that the request was planned against.
    pub learned: Option<usize>,
    /// What the conversation stage decided (after the retry, the retry's).
    pub decision: Decision,
}

/// One send upstream: foldgate's time before it, and the upstream's until its head.
#[derive(Debug, Clone, Copy)]
struct Sent {
    overhead: Duration,
    ttfb: Duration,
}

impl Record {
    /// The record of a request of `route` that foldgate began working on at `started`.
    pub fn new(route: Route, operation: Operation, started: Instant) -> Self {
        Self {
            route,
            operation,
            untaken: None,
            decided: None,
            team: None,
            encoded: None,
            provider_api: None,
            notes: Vec::new(),
            overflow: None,
            learned_window: false,
            chain: None,
            answered_here: false,
            chain_stored: None,
            started,
            sends: [None, None],
        }
    }

    /// Notes a send upstream: foldgate had worked `overhead` on it, the upstream took
    /// `ttfb` to answer its head.
    pub fn sent(&mut self, overhead: Duration, ttfb: Duration) {
        let sent = Some(Sent { overhead, ttfb });
        match &mut self.sends {
            [first @ None, _] => *first = sent,
            [_, retry] => *retry = sent,
        }
    }

    /// The request's outcome, when it is a request of a compacted route.
    pub fn outcome(&self) -> Option<Outcome> {
        self.decided.as_ref().map(|d| d.decision.outcome).or(self.untaken)
    }

    /// True when the forwarded body is a retry after an overflow error.
    pub fn retried(&self) -> bool {
        self.overflow == Some(OverflowRetry::Retried)
    }

    /// The request's model label (`None`: unknown, the answer's is used).
    fn model(&self) -> Option<&'static str> {
        self.decided.as_ref().map(|d| d.model)
    }

    /// Says in `x-foldgate-*` tags what happened to a decided request.
    pub fn tag<B>(&self, response: &mut Response<B>) {
        let Some(decided) = &self.decided else { return };
        let decision = &decided.decision;
        let tags = Tags::on(response);
        tags.outcome = Some(decision.outcome.as_str());
        tags.session = Some(decided.key.clone());
        if let Some(Report { tokens_before, tokens_after, tier, .. }) = decision.report.as_deref() {
            tags.tokens = Some((*tokens_before, *tokens_after));
            tags.tier = Some(tier.as_str());
        }
        if !decision.fold_wait.is_zero() {
            tags.fold_wait_ms =
                Some(u64::try_from(decision.fold_wait.as_millis()).unwrap_or(u64::MAX));
        }
        tags.retried = self.retried();
        // The request was planned against a window learned from an earlier overflow error.
        tags.learned_window = decided.learned;
        tags.served_here = self.answered_here;
    }

    /// Records a request that failed before any answer (the upstream unreachable, a
    /// body refused): what was learned until then.
    pub fn failed(self, metrics: &Metrics) {
        self.write_request(metrics, &Span::none());
    }

    /// The recorder of this request's `answer`: everything else is written when its body
    /// ended. `read_usage`: the answer is the upstream's (foldgate's own carries no
    /// usage to count).
    pub fn watch(
        self,
        answer: Response<ProxyBody>,
        read_usage: bool,
        ends: AnswerEnds,
    ) -> Response<ProxyBody> {
        let usage = read_usage.then(|| UsageReader::for_answer(answer.headers()));
        let recorder = Recorder { record: self, usage, ends, span: span::current() };
        answer.map(|body| Observed::new(body, recorder).boxed_unsync())
    }

    /// Writes the metrics of the request itself, and its span's, once.
    fn write_request(&self, metrics: &Metrics, span: &Span) {
        for sent in self.sends.iter().flatten() {
            metrics.observe_proxy_overhead(self.route, sent.overhead.as_secs_f64());
            metrics.observe_upstream_ttfb(self.route, sent.ttfb.as_secs_f64());
        }
        if let Some((coding, result)) = self.encoded {
            metrics.encoded_body(coding, result);
        }
        let stored = self.chain_stored.as_ref().is_some_and(|s| s.load(Ordering::Acquire));
        for result in [self.chain, stored.then_some(ChainResult::Stored)].into_iter().flatten() {
            metrics.response_chain(result);
        }
        if let Some((api, by_foldgate)) = self.provider_api {
            metrics.provider_compaction(api, by_foldgate);
        }
        let Some(outcome) = self.outcome() else { return };
        metrics.chat_request(self.route, outcome);
        match &self.decided {
            Some(decided) => self.write_decided(metrics, decided, span),
            None => span::record_outcome(span, outcome),
        }
    }

    /// The metrics and span of a decided request.
    fn write_decided(&self, metrics: &Metrics, decided: &Decided, span: &Span) {
        let decision = &decided.decision;
        if !span.is_disabled() {
            let turn = TurnRecord {
                operation: if self.operation == Operation::Compact { "compact" } else { "chat" },
                model: &decided.model_name,
                outcome: decision.outcome,
                measured: decision
                    .report
                    .as_ref()
                    .map(|r| (r.tier, r.tokens_before, r.tokens_after)),
                fold_wait: decision.fold_wait,
                session: Some(decided.key.as_str()),
                retried: self.retried(),
                learned_window: decided.learned,
            };
            span::record_turn(span, &turn);
        }
        if decided.learned.is_some() {
            metrics.learned_window(WindowEvent::Applied);
        }
        if self.learned_window {
            metrics.learned_window(WindowEvent::Learned);
        }
        if let Some(result) = self.overflow {
            metrics.overflow_retry(result);
        }
        if let Some(report) = &decision.report {
            self.write_report(metrics, decision, report);
        }
    }

    /// The token figures of a decision's `report`.
    fn write_report(&self, metrics: &Metrics, decision: &Decision, report: &Report) {
        let (route, model) = (self.route, self.model().unwrap_or("other"));
        let before = report.tokens_before as u64;
        let forwarded =
            if decision.rewritten.is_some() { report.tokens_after as u64 } else { before };
        metrics.prompt_tokens(route, model, before, forwarded);
        if let Some(team) = &self.team {
            metrics.team_saved(team, before.saturating_sub(forwarded));
        }
        if decision.rewritten.is_some() {
            metrics.prompt_rewritten(route, model, report.rewritten_tokens as u64);
            if let Some(reason) = report.rewrite_reason() {
                metrics.prefix_rewrite(reason, report.rewrite_cost);
            }
        }
        let pinned = if decision.outcome.engine_compacted() { report.pinned.len() } else { 0 };
        metrics.steered(report.new_instruction_sources.iter().copied(), pinned);
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
}

/// What is done with an answer's usage when it ends, besides counting it.
pub struct AnswerEnds {
    /// Every metric.
    pub metrics: Arc<Metrics>,
    /// The request's inspector entry, to write with the usage (inspector on).
    pub inspection: Option<Box<PendingRecord>>,
    /// The token count to calibrate against the usage the upstream reports.
    pub calibration: Option<Counted>,
}

impl AnswerEnds {
    /// Nothing but the metrics.
    pub fn metrics(metrics: &Arc<Metrics>) -> Self {
        Self { metrics: metrics.clone(), inspection: None, calibration: None }
    }
}

/// Watches a request's answer and writes its record when the answer ended (its last
/// byte sent, failed, or the client gone). It holds the request's span open until then.
pub struct Recorder {
    record: Record,
    usage: Option<UsageReader>,
    ends: AnswerEnds,
    span: Span,
}

impl BodyObserver for Recorder {
    fn data(&mut self, data: &Bytes) {
        if let Some(usage) = &mut self.usage {
            usage.observe(data);
        }
    }

    fn end(&mut self, _: BodyEnd) {
        // The answering model names the usage's label when the request has no model of
        // its own, and goes in the span.
        let model = self.record.model().is_none() || !self.span.is_disabled();
        let found = self.usage.as_mut().and_then(|usage| usage.finish(model));
        let AnswerEnds { metrics, inspection, calibration } = &mut self.ends;
        self.record.write_request(metrics, &self.span);
        let usage = found.as_ref().map(|(usage, _)| *usage);
        if let Some(calibration) = calibration.take() {
            // What it does (a calibration stored) is part of the request's trace.
            let _request = self.span.enter();
            if let Some(usage) = usage {
                calibration.observe(usage.prompt);
            }
        }
        if let Some(inspection) = inspection.take() {
            inspection.write(usage.map(crate::http::usage::Usage::entry));
        }
        let Some((usage, answered_by)) = found else { return };
        let record = UsageRecord {
            input: usage.prompt,
            output: usage.completion,
            cache_read: usage.cached,
            cache_creation: usage.cache_write,
            response_model: answered_by.as_deref(),
        };
        span::record_usage(&self.span, &record);
        let model = self
            .record
            .model()
            .unwrap_or_else(|| answered_by.as_deref().map_or("other", model_label));
        metrics.upstream_usage(model, usage.prompt_split(), usage.completion);
        if let Some(team) = &self.record.team {
            metrics.team_usage(team, usage.prompt_split(), usage.completion);
        }
    }
}

/// The team label of a request with `headers`: the value of the configured team header
/// (`metrics.team_header`), bounded by [`Metrics::team`]; `None` when usage is not
/// counted by team.
pub fn team_of(metrics: &Metrics, headers: &HeaderMap) -> Option<Arc<str>> {
    let header = metrics.team_header()?;
    metrics.team(headers.get(header).and_then(|v| v.to_str().ok()))
}

/// Counts a request's answer by route and status (every request, local ones too).
pub fn answered(metrics: &Metrics, route: Route, status: u16) {
    metrics.request(route, status);
}
