//! The engine: one call plans and applies the compaction of one request.

use std::sync::Arc;

use super::CompactionError;
use super::blocks::{FoldBlock, SessionState, add_block, applies, retain_matching};
use super::budget::{Budget, Options};
use super::fold::{FoldRules, Folded, Region, fold_after};
use super::keep::Keep;
use super::plan::{Goals, Item, Kind, Plan};
use super::report::{Report, Tier};
use super::tokens::count::{TOKENS_PER_MESSAGE, upper_bound_of};
use super::tokens::{Counter, REPLY_PRIMING, TokenCache};
use super::trail::{Kind as TrailKind, State as TrailState, Trail};
use super::units::{Unit, group_tail_start, turn_tail_start, units};
use crate::config::CompactionConfig;
use crate::model::{ChatRequest, Message, ModelError, Role};
use crate::outline::Outline;
use crate::summarizer::{DigestKind, Summarizer};

/// What to forward.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Forward the original bytes untouched.
    Unchanged {
        /// What was measured.
        report: Report,
    },
    /// Forward `body` instead.
    Compacted {
        /// The serialized request to forward.
        body: Vec<u8>,
        /// The same request, structured.
        request: ChatRequest,
        /// What was done.
        report: Report,
    },
}

impl Outcome {
    /// The report.
    pub fn report(&self) -> &Report {
        match self {
            Self::Unchanged { report } | Self::Compacted { report, .. } => report,
        }
    }
}

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
    ) -> Result<Outcome, CompactionError> {
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
        self.below_bound(outline.model(), outline.max_reply_tokens(), bound, opts)
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

    /// Exact prompt tokens of `request` (messages, tool definitions, reply priming).
    pub fn count_prompt(
        &self,
        request: &ChatRequest,
        budget: &Budget,
        cache: &mut TokenCache,
    ) -> usize {
        let mut counter = Counter { encoding: budget.encoding, cache };
        let msgs: usize = request.messages().iter().map(|m| counter.message(m)).sum();
        msgs + counter.tools(request.tools_raw()) + REPLY_PRIMING
    }

    /// Compacts one request of a conversation whose earlier state is `state` (fold blocks
    /// and token cache, updated in place). Below the trigger, without stored blocks and
    /// without `force`, returns [`Outcome::Unchanged`]. Otherwise applies the stored
    /// blocks that still match, then the tiers (1 elide, 2 fold, 4 fallback), each only
    /// while the prompt is over target.
    pub async fn compact_request(
        &self,
        request: &ChatRequest,
        state: &mut SessionState,
        summarizer: &dyn Summarizer,
        opts: &Options,
    ) -> Result<Outcome, CompactionError> {
        let cfg = &self.cfg;
        let opts = &*opts.for_conversation(state.token_ratio);
        let budget = Budget::of(request, cfg, opts);
        let msgs = request.messages();
        let tools_raw = request.tools_raw();

        // Below the trigger without stored blocks, measured from the messages' text (and
        // cached counts) alone: nothing is parsed.
        if !opts.force && (state.blocks.is_empty() || !cfg.enabled) {
            let counter = Counter { encoding: budget.encoding, cache: &mut state.token_cache };
            let upper = counter.message_upper_bound_total(msgs, tools_raw);
            if upper <= budget.trigger || !cfg.enabled {
                let mut report = Report::new(budget, opts.force, msgs.len(), 0, 0);
                let estimate = counter.estimate_total(msgs, tools_raw).min(upper);
                report.tokens_before = estimate;
                report.tokens_before_exact = false;
                report.tokens_after = estimate;
                report.fits = upper <= report.budget.budget;
                return Ok(Outcome::Unchanged { report });
            }
        }

        let units = units(msgs);
        let invalidated = retain_matching(&mut state.blocks, msgs, &units);
        let mut report =
            Report::new(budget.clone(), opts.force, msgs.len(), state.blocks.len(), invalidated);
        report.rereads = rereads(&state.blocks, msgs);
        let SessionState { blocks, token_cache, pending, cut, cut_postponed, .. } = state;
        let mut counter = Counter { encoding: budget.encoding, cache: token_cache };

        let fixed = counter.tools(tools_raw) + REPLY_PRIMING;
        let tokens: Vec<usize> = msgs.iter().map(|m| counter.message(m)).collect();
        report.tokens_before = fixed + tokens.iter().sum::<usize>();
        let keep = Keep::new(msgs, cfg);
        // The current turn, when it fits, is forwarded intact: no stored block, prefetched
        // block, fold or fallback may reach into it.
        let protect = keep.protected_turn(msgs, &tokens, fixed, &budget);
        let reach = protect.unwrap_or(msgs.len());
        let matching = blocks.len();
        blocks.truncate(blocks.iter().take_while(|b| b.end <= reach).count());
        report.blocks_reused = blocks.len();
        report.blocks_invalidated += matching - blocks.len();
        let src = Sources { msgs, units: &units, tokens: &tokens, fixed, keep: &keep };
        let mut plan = src.plan(blocks, &mut counter)?;
        // The last request's cut, while it still keeps the prompt under the trigger: the
        // prefix stays as it was forwarded, also when the prompt without it would now be
        // under the trigger (stubs are not taken back one request after they were made).
        // A cut made for a postponed fold is reused only where that fold is made (below),
        // so the fold stays due.
        let blocks_end = blocks.last().map_or(0, |b| b.end);
        let mut recut = None;
        if !opts.force && !cut.is_empty() {
            match plan.apply_cut(cut, msgs, blocks_end, protect, &mut counter)? {
                Some(kept) if kept.total() <= budget.trigger && !*cut_postponed => {
                    plan = kept;
                    report.tier = Tier::Fallback;
                    report.cut_reused = true;
                }
                other => recut = other,
            }
        }

        if opts.force || plan.total() > budget.trigger {
            // The conversation as last forwarded (the stored blocks and cut), with what
            // the client added since: a shared-prefix summarizer sends it whole, so that
            // its call starts with the previous forwarded request.
            let recut = match recut {
                None if opts.force && !cut.is_empty() => {
                    plan.apply_cut(cut, msgs, blocks_end, protect, &mut counter)?
                }
                recut => recut,
            };
            let previous = recut.as_ref().unwrap_or(&plan).forwarded();
            // A block summarized ahead of need is applied first: no summarizer call. One
            // that reaches into a protected turn waits for a later request.
            if pending.as_ref().is_some_and(|b| !applies(b, blocks, msgs, &units)) {
                *pending = None;
            }
            let usable = |b: &mut FoldBlock| b.end <= reach;
            if let Some(block) = pending.take_if(usable) {
                if block.start == 0 {
                    report.blocks_absorbed += blocks.len();
                }
                add_block(blocks, block);
                plan = src.plan(blocks, &mut counter)?;
                report.used_prefetched = true;
                report.blocks_new += 1;
                report.tier = Tier::Fold;
            }
            let blocks_end = blocks.last().map_or(0, |b| b.end);
            let tail0 = turn_tail_start(&units, cfg.keep_last_turns).max(blocks_end);
            // What to forward if the fold is postponed: no elision either, so that the
            // prefix is rewritten once, when the digest lands.
            let unelided = (opts.postpone_folds && plan.total() <= budget.fit_limit())
                .then(|| (plan.clone(), report.tier));
            if plan.elide_before(tail0, cfg.elide_min_tokens, budget.target, &mut counter)? {
                report.tier = report.tier.max(Tier::Elide);
            }
            if plan.total() > budget.target {
                let tail1 = group_tail_start(&units, tail0, cfg.keep_last_tool_groups)
                    .min(reach)
                    .max(tail0);
                let end = self.fold_end(msgs, &tokens, &plan, blocks_end, tail0, tail1, &budget);
                // A fold worth making recovers at least half the gap between trigger and
                // target; smaller ones would be redone on the next request.
                let min_work = (budget.trigger - budget.target) / 2;
                if end > blocks_end
                    && keep.work_tokens(msgs, &tokens, blocks_end, end) >= min_work.max(1)
                {
                    let rules = FoldRules {
                        max_tokens: cfg.digest_max_tokens,
                        trail_tokens: cfg.trail_max_tokens,
                        keep,
                        kind: DigestKind::Fold,
                        goal_keeps: None,
                    };
                    let region = Region {
                        msgs,
                        tokens: &tokens,
                        start: blocks_end,
                        end,
                        tools: tools_raw,
                        forwarded: &previous,
                    };
                    // Digests do not pile up: once the stored ones outgrow one digest's
                    // size (and a quarter more for the trail entries each added), the new
                    // digest takes their place and carries what they held.
                    let stored_digests: usize = plan
                        .items
                        .iter()
                        .filter(|i| i.kind == Kind::Digest && i.pos < blocks_end)
                        .map(|i| i.tokens)
                        .sum();
                    let absorb = stored_digests > cfg.digest_max_tokens * 5 / 4;
                    // Postponed: as the previous requests were forwarded when that fits,
                    // else with old work cut to fit, as long as no user message and
                    // nothing of the current turn is lost.
                    let reusable = recut.as_ref().filter(|kept| kept.total() <= budget.fit_limit());
                    let postponed = match unelided {
                        Some(unfolded) => Some(unfolded),
                        // The cut made while this fold was first postponed, as long as it
                        // still fits: the prefix stays as forwarded until the digest lands.
                        None if opts.postpone_folds && reusable.is_some() => {
                            report.cut_reused = true;
                            reusable.cloned().map(|kept| (kept, Tier::Fallback))
                        }
                        None if opts.postpone_folds => {
                            // Cut to the trigger, not just under the limit, so that the
                            // requests until the digest lands fit the same cut.
                            let goals = Goals {
                                target: budget.trigger,
                                limit: budget.fit_limit(),
                                floor: budget.floor,
                                small_max: cfg.user_verbatim_max_tokens,
                                min_tokens: cfg.elide_min_tokens,
                            };
                            plan.cut_to_fit(goals, protect, &mut counter)?
                                .map(|cut| (cut, Tier::Fallback))
                        }
                        None => None,
                    };
                    let folded = match postponed {
                        Some((forwarded, tier)) => {
                            plan = forwarded;
                            report.tier = report.tier.max(tier);
                            report.fold_postponed = true;
                            None
                        }
                        None => Some(fold_after(blocks, absorb, region, summarizer, rules).await?),
                    };
                    match folded.flatten() {
                        Some(folded) => {
                            let built =
                                with_block(blocks, folded, &plan, &src, &mut counter, &mut report)?;
                            if let Some(built) = built {
                                plan = built;
                                report.tier = Tier::Fold;
                            }
                        }
                        None => report.fold_deferred |= !report.fold_postponed,
                    }
                }
            }
            // Tier 3: while small user messages and digests take more than the floor,
            // the oldest whole turns (user messages included) and every stored block
            // become one goal history. The last `keep_last_turns` turns (the current one
            // among them) never take part.
            let floor_used: usize = plan
                .items
                .iter()
                .filter(|i| !i.dropped && matches!(i.kind, Kind::User | Kind::Digest))
                .map(|i| i.tokens)
                .sum();
            if !report.fold_deferred
                && !report.fold_postponed
                && plan.total() > budget.target
                && floor_used > budget.floor
            {
                let end = turn_tail_start(&units, cfg.keep_last_turns).min(reach);
                let blocks_end = blocks.last().map_or(0, |b| b.end);
                // Every small user message a later request may still have to forward stays
                // verbatim: the guarantee grows when the last user message shrinks.
                let goal_keeps = keep.lasting_guarantee(msgs, &tokens, fixed, &budget).max_tokens;
                // What the batch takes out of the prompt: the work of its turns, the user
                // messages past the floor and the digests, less the goal history that
                // replaces them. Like a fold, it must be worth making.
                let batched = |i: &&Item| {
                    i.pos < end
                        && !i.dropped
                        && match i.kind {
                            Kind::Work | Kind::Digest => true,
                            Kind::User => goal_keeps.is_none_or(|max| i.tokens > max),
                            _ => false,
                        }
                };
                let work = plan
                    .items
                    .iter()
                    .filter(batched)
                    .map(|i| i.tokens)
                    .sum::<usize>()
                    .saturating_sub(cfg.digest_max_tokens + cfg.trail_max_tokens);
                let min_work = (budget.trigger - budget.target) / 2;
                if end >= blocks_end && work >= min_work.max(1) {
                    let rules = FoldRules {
                        max_tokens: cfg.digest_max_tokens,
                        trail_tokens: cfg.trail_max_tokens,
                        keep,
                        kind: DigestKind::GoalBatch,
                        goal_keeps,
                    };
                    let region = Region {
                        msgs,
                        tokens: &tokens,
                        start: blocks_end,
                        end,
                        tools: tools_raw,
                        forwarded: &previous,
                    };
                    match fold_after(blocks, true, region, summarizer, rules).await? {
                        Some(folded) => {
                            let built =
                                with_block(blocks, folded, &plan, &src, &mut counter, &mut report)?;
                            if let Some(built) = built {
                                plan = built;
                                report.tier = Tier::GoalBatch;
                                report.goal_batches += 1;
                            }
                        }
                        None => report.fold_deferred = true,
                    }
                }
            }
            // While another process summarizes this conversation, the request goes on
            // with the folds it has and is cut only as far as it must be to fit: its
            // prefix changes once, when the digest lands, not twice.
            let target = if report.fold_deferred || report.fold_postponed {
                budget.budget
            } else {
                budget.target
            };
            if plan.total() > target {
                let goals = Goals {
                    target,
                    limit: budget.budget,
                    floor: budget.floor,
                    small_max: cfg.user_verbatim_max_tokens,
                    min_tokens: cfg.elide_min_tokens,
                };
                // Tier 4 only when it cut something: a prompt over target that it cannot
                // cut (all of it a current turn that fits) is forwarded as it was.
                if plan.fallback(goals, protect, &mut counter)? {
                    report.tier = Tier::Fallback;
                }
            }
        }

        *cut = plan.cut_items(msgs, blocks.last().map_or(0, |b| b.end))?;
        *cut_postponed = report.fold_postponed && !cut.is_empty();
        let forwarded = plan.messages();
        report.account(&plan, msgs.len());
        if same_messages(&forwarded, msgs) {
            return Ok(Outcome::Unchanged { report });
        }
        let out = request.with_messages(forwarded);
        Ok(Outcome::Compacted { body: out.to_vec(), request: out, report })
    }

    /// Summarizes the next fold outside the request path and keeps it as
    /// `state.pending`, leaving the forwarded request unchanged; the first request that
    /// needs it applies it. [`Ahead::Prefetch`]: past `prefetch_ratio`, so that the
    /// request that crosses the trigger finds its digest ready. [`Ahead::Due`]: the fold
    /// a request postponed because it still fitted (see [`Options::postpone_folds`]).
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
                if tokens <= threshold || tokens > budget.trigger {
                    return Ok(false);
                }
                // Aim as deep, relative to the prompt, as the compaction at the trigger.
                let target = cfg.target_ratio * cfg.prefetch_ratio / cfg.trigger_ratio;
                Options { force: true, target_ratio: Some(target), ..base }
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

    /// Where the new fold ends: the turn tail, or deeper inside a live turn when folding
    /// up to the turn tail would predictably still miss the target.
    #[allow(clippy::too_many_arguments)]
    fn fold_end(
        &self,
        msgs: &[Arc<Message>],
        tokens: &[usize],
        plan: &Plan,
        blocks_end: usize,
        tail0: usize,
        tail1: usize,
        budget: &Budget,
    ) -> usize {
        if tail1 <= tail0 {
            return tail0;
        }
        let keep = Keep::new(msgs, &self.cfg);
        let before_blocks: usize =
            plan.items.iter().filter(|i| i.pos < blocks_end).map(|i| i.tokens).sum();
        let kept_in_region: usize = (blocks_end..tail0)
            .filter(|&i| keep.is_verbatim(msgs, tokens, i))
            .map(|i| tokens[i])
            .sum();
        let rest: usize = tokens[tail0..].iter().sum();
        let predicted =
            plan.fixed + before_blocks + kept_in_region + self.cfg.digest_max_tokens + rest;
        if predicted > budget.target { tail1 } else { tail0 }
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

fn same_messages(a: &[Arc<Message>], b: &[Arc<Message>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.hash() == y.hash() && x.raw() == y.raw())
}

/// What every plan of one request is built from.
struct Sources<'a> {
    msgs: &'a [Arc<Message>],
    units: &'a [Unit],
    tokens: &'a [usize],
    fixed: usize,
    keep: &'a Keep,
}

impl Sources<'_> {
    /// The plan of `blocks` followed by the originals after them.
    fn plan(&self, blocks: &[FoldBlock], counter: &mut Counter<'_>) -> Result<Plan, ModelError> {
        Plan::build(blocks, self.msgs, self.units, self.tokens, self.fixed, self.keep, counter)
    }
}

/// The plan with `folded`'s block added to `blocks` (in place of the blocks it absorbed),
/// or `None`, leaving `blocks` as they were, when the block would not make the prompt
/// smaller than `plan`.
fn with_block(
    blocks: &mut Vec<FoldBlock>,
    folded: Folded,
    plan: &Plan,
    src: &Sources<'_>,
    counter: &mut Counter<'_>,
    report: &mut Report,
) -> Result<Option<Plan>, CompactionError> {
    let saved = blocks.clone();
    add_block(blocks, folded.block.clone());
    let built = src.plan(blocks, counter)?;
    if built.total() >= plan.total() {
        *blocks = saved;
        report.folds_rejected += 1;
        return Ok(None);
    }
    if folded.block.start == 0 {
        report.blocks_absorbed += saved.len();
    }
    report.summarizer = Some(folded.block.summarizer.clone());
    report.summarizer_error = folded.error;
    report.artifact_recall = folded.block.artifact_recall;
    report.blocks_new += 1;
    Ok(Some(built))
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
