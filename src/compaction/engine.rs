//! The engine: one call plans and applies the compaction of one request.

use std::sync::Arc;

use super::CompactionError;
use super::blocks::{FoldBlock, SessionState, applies, retain_matching, unfold_pinned};
use super::budget::{Budget, Options};
use super::forward::Forward;
use super::keep::Keep;
use super::pass::{Pass, Sources, Stored};
use super::report::Report;
use super::steer;
use super::tokens::count::{TOKENS_PER_MESSAGE, upper_bound_of};
use super::tokens::{Counter, REPLY_PRIMING, TokenCache};
use super::trail::{Kind as TrailKind, State as TrailState, Trail};
use super::units::units;
use crate::config::CompactionConfig;
use crate::model::{ChatRequest, Message, Role};
use crate::outline::Outline;
use crate::summarizer::Summarizer;

/// Why a fold is summarized outside the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// Ahead of need, past `prefetch_ratio`; `forwarded_tokens` is the prompt as forwarded.
    Prefetch {
        /// Prompt tokens of the request as forwarded.
        forwarded_tokens: usize,
    },
    /// Due now, postponed by a request that still fitted without it.
    Due,
}

/// What a scan that does not parse knows of a request's size: a bound no exact count
/// can exceed, a rough estimate, and how many messages it holds.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// At least the exact prompt tokens.
    pub upper: usize,
    /// A rough estimate of them.
    pub estimate: usize,
    /// Messages (for the report).
    pub messages: usize,
}

/// The compaction engine. Cheap to share: holds only its configuration.
#[derive(Debug, Clone)]
pub struct Engine {
    cfg: CompactionConfig,
}

impl Engine {
    /// An engine with `cfg` (validated by the config loader).
    pub fn new(cfg: CompactionConfig) -> Self {
        Self { cfg }
    }

    /// The configuration.
    pub fn config(&self) -> &CompactionConfig {
        &self.cfg
    }

    /// Parses `body` and compacts it (see [`Engine::compact_request`]).
    pub async fn compact(
        &self,
        body: &[u8],
        state: &mut SessionState,
        summarizer: &dyn Summarizer,
        opts: &Options,
    ) -> Result<Forward, CompactionError> {
        let request = ChatRequest::parse(body)?;
        self.compact_request(&request, state, summarizer, opts).await
    }

    /// A report of a request left unchanged, when its size, bounded from its text alone
    /// (its [`Outline`]), is below the trigger and below `prefetch_ratio` (where
    /// background folds start): compacting it could only forward it as it is, so the
    /// caller need not parse it or load its conversation. `None` when the request must
    /// go through [`Engine::compact_request`]. (A conversation with stored folds is
    /// always larger than the folds' range was when they were made, unless its model or
    /// reply reserve changed: then it fits as sent.)
    pub fn clearly_below(&self, outline: &Outline<'_>, opts: &Options) -> Option<Report> {
        let (mut upper, mut estimate, mut count) = (REPLY_PRIMING, REPLY_PRIMING, 0);
        for message in outline.messages() {
            if message.file_mentions > 0 {
                // Inline file data: a PDF is charged by its pages, which its bytes do
                // not bound.
                return None;
            }
            let len = message.range.len();
            let images = message.image_mentions.div_ceil(2);
            upper += upper_bound_of(len, images, message.call_mentions);
            estimate += len / 4 + TOKENS_PER_MESSAGE;
            count += 1;
        }
        let tools = outline.tools_raw().map_or(0, <[u8]>::len);
        let bound = Bound { upper: upper + tools, estimate: estimate + tools / 4, messages: count };
        self.below_bound(
            outline.model().map(std::borrow::Cow::into_owned),
            outline.max_reply_tokens(),
            bound,
            opts,
        )
    }

    /// [`Engine::clearly_below`] for a request of another API shape, known by a bound
    /// its dialect computed without parsing it: a report when `bound.upper` is at most
    /// the trigger and `prefetch_ratio` of the budget of `model` with `max_reply`.
    pub fn below_bound(
        &self,
        model: Option<String>,
        max_reply: Option<usize>,
        bound: Bound,
        opts: &Options,
    ) -> Option<Report> {
        let cfg = &self.cfg;
        if opts.force || !cfg.enabled {
            return None;
        }
        let budget = Budget::for_model(model, max_reply, cfg, opts);
        let prefetch = (budget.budget as f64 * cfg.prefetch_ratio) as usize;
        let limit = if cfg.prefetch { budget.trigger.min(prefetch) } else { budget.trigger };
        if bound.upper > limit {
            return None;
        }
        let mut report = Report::new(budget, false, bound.messages, 0, 0);
        report.tokens_before = bound.estimate.min(bound.upper);
        report.tokens_before_exact = false;
        report.tokens_after = report.tokens_before;
        report.fits = true;
        Some(report)
    }

    /// The report of `request` forwarded as it was sent (an error made the engine stop),
    /// planned with `opts`: its budget, its tokens left to count.
    pub fn unplanned(&self, request: &ChatRequest, opts: &Options) -> Report {
        let budget = Budget::of(request, &self.cfg, opts);
        Report::new(budget, opts.force, request.messages().len(), 0, 0)
    }

    /// Exact prompt tokens of `request` (messages, tool definitions, reply priming).
    pub fn count_prompt(
        &self,
        request: &ChatRequest,
        budget: &Budget,
        cache: &mut TokenCache,
    ) -> usize {
        let mut counter = Counter { encoding: budget.encoding, cache };
        let msgs: usize = counter.messages(request.messages()).iter().sum();
        msgs + counter.tools(request.tools_raw()) + REPLY_PRIMING
    }

    /// Compacts one request of a conversation whose earlier state is `state` (fold blocks
    /// and token cache, updated in place). Below the trigger, without stored blocks and
    /// without `force`, returns [`Forward::Unchanged`]. Otherwise applies the stored
    /// blocks that still match, then the tiers (1 elide, 2 fold, 4 fallback), each only
    /// while the prompt is over target.
    pub async fn compact_request(
        &self,
        request: &ChatRequest,
        state: &mut SessionState,
        summarizer: &dyn Summarizer,
        opts: &Options,
    ) -> Result<Forward, CompactionError> {
        let cfg = &self.cfg;
        let opts = &*opts.for_conversation(state.token_ratio);
        let budget = Budget::of(request, cfg, opts);
        if let Some(report) = self.below_trigger_unparsed(request, state, &budget, opts) {
            return Ok(Forward::Unchanged { report });
        }
        let msgs = request.messages();
        // Content foldgate cannot read is kept whole: the request goes as it was sent.
        request.readable()?;
        let units = units(msgs);
        let pinned = steer::pinned_units(opts.steer.pins.as_deref(), msgs, &units);
        let invalidated = retain_matching(&mut state.blocks, msgs, &units)
            + unfold_pinned(&mut state.blocks, &pinned);
        let mut report =
            Report::new(budget.clone(), opts.force, msgs.len(), state.blocks.len(), invalidated);
        report.rereads = rereads(&state.blocks, msgs);
        let SessionState { blocks, token_cache, pending, cut, cut_postponed, .. } = state;
        let mut counter = Counter { encoding: budget.encoding, cache: token_cache };
        let fixed = counter.tools(request.tools_raw()) + REPLY_PRIMING;
        let tokens = counter.messages(msgs);
        report.tokens_before = fixed + tokens.iter().sum::<usize>();
        let keep = Keep::new(msgs, cfg).with_pins(&pinned);
        let src = Sources { msgs, units: &units, tokens: &tokens, fixed, keep: &keep };
        let stored = Stored { blocks, pending, cut, cut_postponed };
        let mut pass = Pass::start(cfg, opts, request, summarizer, src, stored, counter, report)?;
        pass.run().await?;
        let mut out = pass.finish(request)?;
        let report = out.report_mut();
        for source in report.instructions.iter().map(|i| i.source) {
            let bit = 1u8 << source as u8;
            if state.instruction_sources & bit == 0 {
                state.instruction_sources |= bit;
                report.new_instruction_sources.push(source);
            }
        }
        Ok(out)
    }

    /// Below the trigger without stored blocks (or with compaction off), measured from
    /// the messages' text (and cached counts) alone: nothing is parsed. `None` when the
    /// request must be planned.
    fn below_trigger_unparsed(
        &self,
        request: &ChatRequest,
        state: &mut SessionState,
        budget: &Budget,
        opts: &Options,
    ) -> Option<Report> {
        let cfg = &self.cfg;
        if opts.force || (!state.blocks.is_empty() && cfg.enabled) {
            return None;
        }
        let (msgs, tools_raw) = (request.messages(), request.tools_raw());
        let counter = Counter { encoding: budget.encoding, cache: &mut state.token_cache };
        let upper = counter.message_upper_bound_total(msgs, tools_raw);
        if upper > budget.trigger && cfg.enabled {
            return None;
        }
        let mut report = Report::new(budget.clone(), opts.force, msgs.len(), 0, 0);
        let estimate = counter.estimate_total(msgs, tools_raw).min(upper);
        report.tokens_before = estimate;
        report.tokens_before_exact = false;
        report.tokens_after = estimate;
        report.fits = upper <= report.budget.budget;
        Some(report)
    }

    /// Summarizes the next fold outside the request path and keeps it as
    /// `state.pending`, leaving the forwarded request unchanged; the first request that
    /// needs it applies it. `Ahead::Prefetch`: past `prefetch_ratio`, so that the
    /// request that crosses the trigger finds its digest ready. `Ahead::Due`: the fold
    /// a request postponed because it still fitted (see [`Options::postpone_folds`]).
    /// A prefetched fold is made only when the plan would fold rather than stub more
    /// tool output (see [`Options::prefetch`]).
    /// `request`'s own options (window cap, token ratio, model) plan it as they planned
    /// the request. Returns whether a pending block was made.
    pub async fn prefetch(
        &self,
        request: &ChatRequest,
        state: &mut SessionState,
        summarizer: &dyn Summarizer,
        ahead: Ahead,
        request_opts: &Options,
    ) -> Result<bool, CompactionError> {
        let cfg = &self.cfg;
        let base = Options {
            window_cap: request_opts.window_cap,
            model: request_opts.model.clone(),
            token_ratio: request_opts.token_ratio,
            steer: request_opts.steer.clone(),
            ..Options::default()
        }
        .for_conversation(state.token_ratio)
        .into_owned();
        let budget = Budget::of(request, cfg, &base);
        let msgs = request.messages();
        let units = units(msgs);
        retain_matching(&mut state.blocks, msgs, &units);
        if state.pending.as_ref().is_some_and(|p| applies(p, &state.blocks, msgs, &units)) {
            return Ok(false);
        }
        let opts = match ahead {
            Ahead::Prefetch { forwarded_tokens } => {
                // Below the trigger without blocks the caller only has an upper bound.
                let tokens = if state.blocks.is_empty() {
                    self.count_prompt(request, &budget, &mut state.token_cache)
                } else {
                    forwarded_tokens
                };
                let threshold = (budget.budget as f64 * cfg.prefetch_ratio) as usize;
                if tokens <= threshold {
                    return Ok(false);
                }
                // Aim as deep, relative to the prompt, as the compaction at the trigger.
                let target = cfg.target_ratio * cfg.prefetch_ratio / cfg.trigger_ratio;
                Options { force: true, prefetch: true, target_ratio: Some(target), ..base }
            }
            Ahead::Due => Options { force: true, ..base },
        };
        let mut trial = SessionState {
            blocks: state.blocks.clone(),
            token_cache: std::mem::take(&mut state.token_cache),
            pending: None,
            cut: state.cut.clone(),
            cut_postponed: state.cut_postponed,
            token_ratio: state.token_ratio,
            // A trial counts no conversation's instructions: its request did.
            instruction_sources: u8::MAX,
        };
        let result = self.compact_request(request, &mut trial, summarizer, &opts).await;
        state.token_cache = trial.token_cache;
        result?;
        // The first block the trial made: after the stored ones, or in their place when it
        // absorbed them.
        state.pending = trial
            .blocks
            .into_iter()
            .enumerate()
            .find(|(i, b)| state.blocks.get(*i) != Some(b))
            .map(|(_, b)| b);
        Ok(state.pending.is_some())
    }
}

/// How many files the newest assistant message of `msgs` reads that the stored `blocks`
/// folded after it had read, edited or created them, and that no action after the
/// blocks touched since: the agent reading again what it already had.
fn rereads(blocks: &[FoldBlock], msgs: &[Arc<Message>]) -> usize {
    let Some(last) = blocks.last() else { return 0 };
    let Some(newest) = msgs.iter().rposition(|m| m.role() == Role::Assistant) else { return 0 };
    if newest < last.end {
        return 0;
    }
    let folded = match &last.trail {
        Some(trail) => std::borrow::Cow::Borrowed(trail),
        None => std::borrow::Cow::Owned(Trail::of(msgs, last.end)),
    };
    // Only files the fold held are candidates; the messages since are read only for them.
    let mut reads = Trail::reads_of(&msgs[newest], folded.open_file.as_deref());
    reads.retain(|path| {
        folded.get(TrailKind::File, path).is_some_and(|e| {
            matches!(e.state, TrailState::Read | TrailState::Edited | TrailState::Created)
        })
    });
    if reads.is_empty() {
        return 0;
    }
    let mut since = Trail::default();
    since.record(msgs, last.end, newest);
    reads
        .iter()
        .filter(|path| {
            since.get(TrailKind::File, path).is_none_or(|e| e.state == TrailState::Named)
        })
        .count()
}

#[cfg(test)]
mod trail_tests {
    use super::*;
    use crate::model::messages_from;
    use serde_json::{Value, json};

    fn call(id: &str, path: &str) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"str_replace_editor","arguments":
                json!({"command":"view","path":path}).to_string()}}]})
    }

    #[test]
    fn a_read_of_a_folded_unchanged_file_is_a_reread() {
        let msgs = messages_from(json!([
            {"role":"user","content":"go"},
            call("1","src/a.py"), {"role":"tool","tool_call_id":"1","content":"a"},
            call("2","src/b.py"), {"role":"tool","tool_call_id":"2","content":"b"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"3","type":"function",
                "function":{"name":"execute_bash","arguments":"{\"command\":\"sed -i s/x/y/ src/b.py\"}"}}]},
            {"role":"tool","tool_call_id":"3","content":"[Command finished with exit code 0]"},
            call("4","src/a.py"), {"role":"tool","tool_call_id":"4","content":"a"},
        ]));
        let block = |end: usize| FoldBlock {
            start: 0,
            end,
            range_hash: 0,
            messages: Vec::new(),
            verbatim: Vec::new(),
            summarizer: "extractive".into(),
            artifact_recall: None,
            trail: Some(Trail::of(&msgs, end)),
            goal_batch: false,
        };
        // src/a.py was read before the fold and nothing changed it: a re-read.
        assert_eq!(rereads(&[block(5)], &msgs[..8]), 1);
        // Without a fold, or when the read is of a file changed since, it is none.
        assert_eq!(rereads(&[], &msgs[..8]), 0);
        let again = messages_from(json!([call("5", "src/b.py")]));
        let mut changed = msgs.clone();
        changed.extend(again);
        assert_eq!(rereads(&[block(5)], &changed), 0);
    }
}
