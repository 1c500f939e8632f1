//! One request through the engine, phase by phase, in the order a request meets them
//! (see [`super::Engine::compact_request`]):
//!
//! 1. [`Pass::start`]: the stored fold blocks that still match, the current turn
//!    protected when it fits;
//! 2. [`Pass::reuse_cut`]: the last request's cut, while it keeps the prompt under the
//!    trigger;
//! 3. over the trigger: [`Pass::choose`] prices the plans that fit (forward as before,
//!    stub more tool output, fold) and takes the cheapest ([`super::price`]); keeping or
//!    stubbing ends the pass there;
//! 4. folding (or forced): [`Pass::apply_prefetched`] (a block summarized
//!    ahead of need), [`Pass::elide`] (tier 1), [`Pass::fold_or_postpone`] (tier 2, or
//!    the fold postponed to the background while the request still fits),
//!    [`Pass::goal_batch`] (tier 3), [`Pass::fallback`] (the cut: stubs, tier 1, then
//!    drops, tier 4);
//! 5. [`Pass::finish`]: the cut remembered, the report accounted with every change the
//!    final plan makes (the tier of a cut is what it did: stubs only are tier 1), the
//!    neutral request to forward.

use std::sync::Arc;

use super::CompactionError;
use super::blocks::{CutItem, FoldBlock, add_block, applies};
use super::budget::{Budget, Options};
use super::changes::{changes, cut_tier};
use super::fold::{FoldRules, Folded, Region, fold_after};
use super::forward::Forward;
use super::keep::Keep;
use super::plan::{Forwarded, Goals, Item, Kind, Plan};
use super::price::{Candidate, PlanKind, Pricing};
use super::report::{Report, Tier};
use super::steer;
use super::tokens::Counter;
use super::units::{Unit, group_tail_start, turn_tail_start};
use crate::config::CompactionConfig;
use crate::model::{ChatRequest, Message, ModelError};
use crate::summarizer::{DigestKind, Summarizer};

/// What a request's phases read: its messages, their units and token counts, the
/// tokens outside the messages, the verbatim rules.
pub(super) struct Sources<'a> {
    /// The original messages.
    pub msgs: &'a [Arc<Message>],
    /// Their safe boundaries.
    pub units: &'a [Unit],
    /// Their tokens.
    pub tokens: &'a [usize],
    /// Tool definitions and reply priming.
    pub fixed: usize,
    /// What stays verbatim.
    pub keep: &'a Keep<'a>,
}

impl Sources<'_> {
    /// The plan of `blocks` followed by the originals after them.
    pub fn plan(
        &self,
        blocks: &[FoldBlock],
        counter: &mut Counter<'_>,
    ) -> Result<Plan, ModelError> {
        Plan::build(blocks, self.msgs, self.units, self.tokens, self.fixed, self.keep, counter)
    }
}

/// The conversation's state a request works on (parts of
/// [`super::SessionState`], borrowed apart).
pub(super) struct Stored<'a> {
    /// Fold blocks that matched the request.
    pub blocks: &'a mut Vec<FoldBlock>,
    /// A block summarized ahead of need.
    pub pending: &'a mut Option<FoldBlock>,
    /// The last request's cut.
    pub cut: &'a mut Vec<CutItem>,
    /// That cut was made for a postponed fold.
    pub cut_postponed: &'a mut bool,
}

/// One request in progress: what it reads, the state it changes, the plan of what to
/// forward and the report of what was done.
pub(super) struct Pass<'a> {
    cfg: &'a CompactionConfig,
    opts: &'a Options,
    budget: Budget,
    summarizer: &'a dyn Summarizer,
    tools: Option<&'a str>,
    src: Sources<'a>,
    /// Where the current turn starts, when it fits and is forwarded intact: no stored
    /// block, prefetched block, fold or fallback may reach into it.
    protect: Option<usize>,
    /// Blocks end at most here (the protected turn's start, else the end).
    reach: usize,
    stored: Stored<'a>,
    counter: Counter<'a>,
    plan: Plan,
    report: Report,
    /// The conversation as last forwarded with what the client added since, once the
    /// request is over the trigger: where this request's prompt first differs from it,
    /// the provider's cache is written again.
    previous: Option<Forwarded>,
}

/// What the request's phases share once it is over the trigger.
struct Over<'p> {
    /// The conversation as last forwarded (the stored blocks and cut) with what the
    /// client added since: a shared-prefix summarizer sends it whole, so that its call
    /// starts with the previous forwarded request.
    previous: &'p Forwarded,
    /// The last request's cut applied to this request, when there was one.
    recut: Option<&'p Plan>,
}

impl<'a> Pass<'a> {
    /// The request with the stored blocks that end before the protected turn.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: &'a CompactionConfig,
        opts: &'a Options,
        request: &'a ChatRequest,
        summarizer: &'a dyn Summarizer,
        src: Sources<'a>,
        stored: Stored<'a>,
        mut counter: Counter<'a>,
        mut report: Report,
    ) -> Result<Self, CompactionError> {
        let budget = report.budget.clone();
        let protect = src.keep.protected_turn(src.msgs, src.tokens, src.fixed, &budget);
        let reach = protect.unwrap_or(src.msgs.len());
        let matching = stored.blocks.len();
        stored.blocks.truncate(stored.blocks.iter().take_while(|b| b.end <= reach).count());
        report.blocks_reused = stored.blocks.len();
        report.blocks_invalidated += matching - stored.blocks.len();
        let plan = src.plan(stored.blocks, &mut counter)?;
        let tools = request.tools_raw();
        Ok(Self {
            cfg,
            opts,
            budget,
            summarizer,
            tools,
            src,
            protect,
            reach,
            stored,
            counter,
            plan,
            report,
            previous: None,
        })
    }

    /// Runs the phases the request needs.
    pub async fn run(&mut self) -> Result<(), CompactionError> {
        self.steered()?;
        let recut = self.reuse_cut()?;
        if !self.opts.force && self.plan.total() <= self.budget.trigger {
            return Ok(());
        }
        let recut = match recut {
            None if self.opts.force && !self.stored.cut.is_empty() => self.apply_cut()?,
            recut => recut,
        };
        let previous = recut.as_ref().unwrap_or(&self.plan).forwarded();
        // A cut made for a postponed fold: that fold was the plan; it stays due.
        let fold_due = *self.stored.cut_postponed && !self.opts.prefetch;
        if (!self.opts.force || self.opts.prefetch) && !fold_due {
            let chosen = self.choose(&previous, recut.as_ref())?;
            if matches!(chosen, PlanKind::Keep | PlanKind::Stub) {
                self.previous = Some(previous);
                return Ok(());
            }
        }
        let over = Over { previous: &previous, recut: recut.as_ref() };
        self.apply_prefetched()?;
        let tail0 =
            turn_tail_start(self.src.units, self.cfg.keep_last_turns).max(self.blocks_end());
        let unelided = self.elide(tail0)?;
        self.fold_or_postpone(tail0, unelided, &over).await?;
        self.goal_batch(&over).await?;
        self.fallback()?;
        self.previous = Some(previous);
        Ok(())
    }

    /// The instructions in force and the pinned messages, into the report; an error
    /// when, past the trigger, the pinned messages beside what no compaction takes out
    /// (tools, system messages, the last user message) do not fit the budget: the
    /// request then goes as sent.
    fn steered(&mut self) -> Result<(), CompactionError> {
        let src = &self.src;
        let summary = self.opts.summary_instructions.as_deref();
        self.report.instructions = self.opts.steer.instructions(src.msgs, summary);
        self.report.pinned =
            (src.keep.pinned.iter().enumerate()).filter(|(_, p)| **p).map(|(i, _)| i).collect();
        let pinned = src.keep.pattern_pinned_tokens(src.tokens);
        let essentials = src.keep.essentials(src.msgs, src.tokens, src.fixed);
        let over = self.opts.force || self.report.tokens_before > self.budget.trigger;
        if over && pinned > 0 && essentials > self.budget.budget {
            let budget = self.budget.budget;
            return Err(CompactionError::PinsDoNotFit { pinned, essentials, budget });
        }
        Ok(())
    }

    /// The merged instructions for a digest (see [`super::steer::merged`]).
    fn instructions(&self) -> Option<String> {
        steer::merged(&self.report.instructions)
    }

    /// Where the stored blocks end.
    fn blocks_end(&self) -> usize {
        self.stored.blocks.last().map_or(0, |b| b.end)
    }

    /// Prices the plans this request may take and takes the cheapest (see
    /// [`super::price`]): forwarding as last forwarded (`recut`, or the stored blocks and
    /// the originals) while that fits, stubbing more tool output (up to the kept tool
    /// groups of a live turn) while that fits, or folding (with the block summarized
    /// ahead of need, when there is one, else predicted from the fold's region). Keeping
    /// or stubbing is applied here; a fold is left to the tiers. A fold summarized ahead
    /// of need is priced against stubbing only, as the request reaching the trigger will
    /// price it.
    fn choose(
        &mut self,
        previous: &Forwarded,
        recut: Option<&Plan>,
    ) -> Result<PlanKind, CompactionError> {
        let limit = self.budget.fit_limit();
        let base = recut.unwrap_or(&self.plan).clone();
        let previous_tokens = self.cover(previous);
        let mut plans: Vec<(Candidate, Option<Plan>)> = Vec::new();
        if base.total() <= limit && !self.opts.prefetch {
            let common = self.common(&base, previous);
            let keep =
                Candidate { kind: PlanKind::Keep, total: base.total(), common, calls: false };
            plans.push((keep, Some(base.clone())));
        }
        let blocks_end = self.blocks_end();
        let tail0 = turn_tail_start(self.src.units, self.cfg.keep_last_turns).max(blocks_end);
        let (units, groups) = (self.src.units, self.cfg.keep_last_tool_groups);
        let tail1 = group_tail_start(units, tail0, groups).min(self.reach).max(tail0);
        // Stubs outside the last `keep_last_turns` turns, and, when the current turn is
        // too long to be protected (a live turn that only grows), inside them up to its
        // last `keep_last_tool_groups` tool groups. (Stubs inside a turn that a later
        // request protects would not be reapplied there: the prefix would change again.)
        let (min, target) = (self.cfg.elide_min_tokens, self.budget.target);
        let stub_tail = if self.protect.is_none() { tail1 } else { tail0 };
        for before in [tail0, stub_tail] {
            let mut stub = base.clone();
            let changed = stub.elide_before(before, min, target, &mut self.counter)?;
            if changed && stub.total() <= limit {
                let common = self.common(&stub, previous);
                let total = stub.total();
                let candidate = Candidate { kind: PlanKind::Stub, total, common, calls: false };
                plans.push((candidate, Some(stub)));
            }
            if stub_tail <= tail0 {
                break;
            }
        }
        if let Some(fold) = self.fold_candidate(previous, tail0, tail1)? {
            plans.push((fold, None));
        }
        let candidates: Vec<Candidate> = plans.iter().map(|(c, _)| *c).collect();
        let is_reply = |m: &Arc<Message>| m.role() == crate::model::Role::Assistant;
        let msgs = self.src.msgs;
        let replies = (msgs.iter().filter(|m| is_reply(m)).count(), msgs.iter().position(is_reply));
        let pricing = Pricing::new(
            self.cfg.cached_price,
            &self.budget,
            self.src.tokens,
            replies,
            previous_tokens,
            self.folds_call(),
        );
        let Some(choice) = pricing.choose(&candidates) else { return Ok(PlanKind::Fold) };
        self.report.plan = Some(choice);
        if matches!(choice.chosen, PlanKind::Keep | PlanKind::Stub) {
            // The cheapest of its kind (two stubs may be priced).
            let cost = |c: &Candidate| pricing.cost(c);
            let taken = plans
                .into_iter()
                .filter(|(c, _)| c.kind == choice.chosen)
                .min_by(|a, b| cost(&a.0).total_cmp(&cost(&b.0)));
            if let Some((_, Some(plan))) = taken {
                self.report.cut_reused |= recut.is_some() && choice.chosen == PlanKind::Keep;
                self.plan = plan;
            }
        }
        Ok(choice.chosen)
    }

    /// The fold this request would make, as priced: with the block summarized ahead of
    /// need when one applies (no call), else predicted from its region (a digest of
    /// `digest_max_tokens` in place of its work, and a call). `None` when no fold is
    /// worth making, or when stubbing before the turn tail reaches the target (the tiers
    /// would then fold nothing: that is the stub plan).
    fn fold_candidate(
        &mut self,
        previous: &Forwarded,
        tail0: usize,
        tail1: usize,
    ) -> Result<Option<Candidate>, CompactionError> {
        let Stored { blocks, pending, .. } = &self.stored;
        let ready = pending
            .as_ref()
            .filter(|b| b.end <= self.reach && applies(b, blocks, self.src.msgs, self.src.units));
        if let Some(block) = ready {
            let mut with = blocks.to_vec();
            add_block(&mut with, block.clone());
            let mut plan = self.src.plan(&with, &mut self.counter)?;
            let tail0 = tail0.max(block.end);
            let (min, target) = (self.cfg.elide_min_tokens, self.budget.target);
            plan.elide_before(tail0, min, target, &mut self.counter)?;
            let common = self.common(&plan, previous);
            let total = plan.total();
            return Ok(Some(Candidate { kind: PlanKind::Fold, total, common, calls: false }));
        }
        let blocks_end = self.blocks_end();
        let end = self.fold_end(blocks_end, tail0, tail1);
        let src = &self.src;
        let min_work = (self.budget.trigger - self.budget.target) / 2;
        let work = src.keep.work_tokens(src.msgs, src.tokens, blocks_end, end);
        if end <= blocks_end || work < min_work.max(1) {
            return Ok(None);
        }
        let (min, target) = (self.cfg.elide_min_tokens, self.budget.target);
        let mut stubbed = self.plan.clone();
        stubbed.elide_before(tail0, min, target, &mut self.counter)?;
        if stubbed.total() <= target {
            // The tiers stub to the target and fold nothing: a stub plan, priced as one.
            return Ok(None);
        }
        let calls = self.folds_call();
        if calls && self.fold_is_dropped(blocks_end, end, tail0)? {
            // The fallback would drop the digest at once (what must stay is over the
            // target without the region's work): the tiers cut without folding.
            let (cut, _) = self.simulate_fold(blocks_end, end, tail0, 0)?;
            let (total, common) = (cut.total(), self.common(&cut, previous));
            return Ok(Some(Candidate { kind: PlanKind::Cut, total, common, calls: false }));
        }
        let digest = self.cfg.digest_max_tokens;
        let (folded, kept) = self.simulate_fold(blocks_end, end, tail0, digest)?;
        // A digest of the full size may not fit where a shorter one would: counted.
        let total = folded.total() + if kept { 0 } else { digest };
        // Its prompt differs where the digest goes in, at the latest.
        let before_digest: usize = (folded.items.iter())
            .take_while(|i| !(i.kind == Kind::Digest && i.msgs.is_empty()))
            .filter(|i| !i.dropped)
            .map(|i| i.tokens)
            .sum();
        let common = self.common(&folded, previous).min(folded.fixed + before_digest);
        Ok(Some(Candidate { kind: PlanKind::Fold, total, common, calls }))
    }

    /// True when a fold of `[start, end)` is dropped by the cut whatever its digest's
    /// size: what must stay is over the target without the region's work.
    fn fold_is_dropped(
        &mut self,
        start: usize,
        end: usize,
        tail: usize,
    ) -> Result<bool, CompactionError> {
        Ok(!self.simulate_fold(start, end, tail, 1)?.1)
    }

    /// The fold of the work in `[start, end)` as the tiers would make it, simulated on
    /// the plan: the region's work out and, in its place after what the fold keeps
    /// verbatim, a digest of `digest` tokens (an item without messages; none for 0); then
    /// stubs before `tail` and the fallback to the target. Also whether the digest is
    /// still there: the fallback drops digests too, once dropping older work and the
    /// small user messages past the floor is not enough, and a fold it drops at once buys
    /// nothing but its summarizer call.
    fn simulate_fold(
        &mut self,
        start: usize,
        end: usize,
        tail: usize,
        digest: usize,
    ) -> Result<(Plan, bool), CompactionError> {
        let in_region = |i: &Item| i.pos >= start && i.pos < end && i.kind == Kind::Work;
        let items = &self.plan.items;
        let at = items.iter().position(|i| i.pos >= end).unwrap_or(items.len());
        let digest_item = Item {
            msgs: Arc::from([]),
            tokens: digest,
            kind: Kind::Digest,
            pos: start,
            originals: 0,
            elided: 0,
            folds: end - start,
            dropped: digest == 0,
        };
        // The plan's items with the region's work dropped and the digest in its place,
        // built in one pass (a clone and an insert copied a long plan twice).
        let mut folded =
            Plan { items: Vec::with_capacity(items.len() + 1), fixed: self.plan.fixed };
        let copy = |i: &Item| Item { dropped: i.dropped || in_region(i), ..i.clone() };
        folded.items.extend(items[..at].iter().map(copy));
        folded.items.push(digest_item);
        folded.items.extend(items[at..].iter().map(copy));
        let (min, target) = (self.cfg.elide_min_tokens, self.budget.target);
        folded.elide_before(tail.max(end), min, target, &mut self.counter)?;
        let goals = self.goals(target, self.budget.budget);
        folded.fallback(goals, self.protect, &mut self.counter)?;
        let kept = !folded.items[at].dropped;
        Ok((folded, kept))
    }

    /// A fold calls a model (the extractive digest is written here, without a call).
    fn folds_call(&self) -> bool {
        self.summarizer.kind() == crate::vocab::SummarizerKind::Llm
    }

    /// Tokens of `plan`'s prompt that repeat `previous` from its start (the tool
    /// definitions among them).
    fn common(&mut self, plan: &Plan, previous: &Forwarded) -> usize {
        let forwarded = plan.messages();
        let same = forwarded
            .iter()
            .zip(&previous.messages)
            .take_while(|(a, b)| a.hash() == b.hash() && a.raw() == b.raw())
            .count();
        plan.fixed + forwarded[..same].iter().map(|m| self.counter.message(m)).sum::<usize>()
    }

    /// Prompt tokens of `previous` (the tool definitions among them).
    fn cover(&mut self, previous: &Forwarded) -> usize {
        self.plan.fixed + previous.messages.iter().map(|m| self.counter.message(m)).sum::<usize>()
    }

    /// The last request's cut applied to this request's plan.
    fn apply_cut(&mut self) -> Result<Option<Plan>, CompactionError> {
        let (msgs, protect) = (self.src.msgs, self.protect);
        Ok(self.plan.apply_cut(self.stored.cut, msgs, protect, &mut self.counter)?)
    }

    /// Reuse: the last request's cut, while it still keeps the prompt under the trigger.
    /// The prefix stays as it was forwarded, also when the prompt without it would now be
    /// under the trigger (stubs are not taken back one request after they were made). A
    /// cut made for a postponed fold is reused only where that fold is made, so the fold
    /// stays due. Returns the cut applied, when it was not reused.
    fn reuse_cut(&mut self) -> Result<Option<Plan>, CompactionError> {
        if self.opts.force || self.stored.cut.is_empty() {
            return Ok(None);
        }
        let applied = self.apply_cut()?;
        match applied {
            Some(kept) if kept.total() <= self.budget.trigger && !*self.stored.cut_postponed => {
                self.plan = kept;
                self.report.cut_reused = true;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// A block summarized ahead of need is applied first: no summarizer call. One that
    /// no longer matches is dropped; one that reaches into a protected turn waits for a
    /// later request.
    fn apply_prefetched(&mut self) -> Result<(), CompactionError> {
        let Stored { blocks, pending, .. } = &mut self.stored;
        if pending.as_ref().is_some_and(|b| !applies(b, blocks, self.src.msgs, self.src.units)) {
            **pending = None;
        }
        let reach = self.reach;
        let Some(block) = pending.take_if(|b: &mut FoldBlock| b.end <= reach) else {
            return Ok(());
        };
        if block.start == 0 {
            self.report.blocks_absorbed += blocks.len();
        }
        add_block(blocks, block);
        self.plan = self.src.plan(self.stored.blocks, &mut self.counter)?;
        self.report.used_prefetched = true;
        self.report.blocks_new += 1;
        self.report.tier = Tier::Fold;
        Ok(())
    }

    /// Tier 1: old tool output and content before `tail0` elided to stubs, while over
    /// target. Returns what to forward if the fold is postponed (no elision either, so
    /// that the prefix is rewritten once, when the digest lands), when that fits.
    fn elide(&mut self, tail0: usize) -> Result<Option<Plan>, CompactionError> {
        let unelided = (self.opts.postpone_folds && self.plan.total() <= self.budget.fit_limit())
            .then(|| self.plan.clone());
        let (min, target) = (self.cfg.elide_min_tokens, self.budget.target);
        self.plan.elide_before(tail0, min, target, &mut self.counter)?;
        Ok(unelided)
    }

    /// Tier 2: while over target, the work after the stored blocks up to the tail folded
    /// into a digest, when that is worth it; or, for a model summarizer while the request
    /// still fits, the fold postponed to the background and the request forwarded as
    /// before (`unelided`), or with the previous cut, or cut to the trigger.
    async fn fold_or_postpone(
        &mut self,
        tail0: usize,
        unelided: Option<Plan>,
        over: &Over<'_>,
    ) -> Result<(), CompactionError> {
        if self.plan.total() <= self.budget.target {
            return Ok(());
        }
        let blocks_end = self.blocks_end();
        let (units, groups) = (self.src.units, self.cfg.keep_last_tool_groups);
        let tail1 = group_tail_start(units, tail0, groups).min(self.reach).max(tail0);
        let end = self.fold_end(blocks_end, tail0, tail1);
        // A fold worth making recovers at least half the gap between trigger and target;
        // smaller ones would be redone on the next request.
        let min_work = (self.budget.trigger - self.budget.target) / 2;
        let src = &self.src;
        if end <= blocks_end
            || src.keep.work_tokens(src.msgs, src.tokens, blocks_end, end) < min_work.max(1)
        {
            return Ok(());
        }
        if self.folds_call() && self.fold_is_dropped(blocks_end, end, tail0)? {
            // Its digest would be dropped at once: no model is asked for it, the fallback
            // cuts instead. (An extractive digest costs no call: it is made and stored,
            // for the later requests it fits.)
            return Ok(());
        }
        let absorb = self.digests_outgrown(blocks_end);
        let folded = match self.postponed(unelided, over.recut)? {
            Some(forwarded) => {
                self.plan = forwarded;
                self.report.fold_postponed = true;
                None
            }
            None => {
                let region = self.region(blocks_end, end, over.previous);
                let rules = self.rules(DigestKind::Fold, None);
                let instructions = self.instructions();
                let blocks = &mut *self.stored.blocks;
                let summarizer = self.summarizer;
                let asked = instructions.as_deref();
                Some(fold_after(blocks, absorb, region, summarizer, rules, asked).await?)
            }
        };
        match folded.flatten() {
            Some(folded) => {
                self.add_fold(folded, Tier::Fold)?;
            }
            None => self.report.fold_deferred |= !self.report.fold_postponed,
        }
        Ok(())
    }

    /// Digests do not pile up: once the stored ones outgrow one digest's size (and a
    /// quarter more for the trail entries each added), the new digest takes their place
    /// and carries what they held.
    fn digests_outgrown(&self, blocks_end: usize) -> bool {
        let items = self.plan.items.iter();
        let stored_digests: usize =
            items.filter(|i| i.kind == Kind::Digest && i.pos < blocks_end).map(|i| i.tokens).sum();
        stored_digests > self.cfg.digest_max_tokens * 5 / 4
    }

    /// What to forward instead of folding now, when the fold is postponed: as the
    /// previous requests were forwarded when that fits, else with old work cut to fit,
    /// as long as no user message and nothing of the current turn is lost. `None`: fold
    /// now.
    fn postponed(
        &mut self,
        unelided: Option<Plan>,
        recut: Option<&Plan>,
    ) -> Result<Option<Plan>, CompactionError> {
        if unelided.is_some() || !self.opts.postpone_folds {
            return Ok(unelided);
        }
        // The cut made while this fold was first postponed, as long as it still fits:
        // the prefix stays as forwarded until the digest lands.
        if let Some(kept) = recut.filter(|kept| kept.total() <= self.budget.fit_limit()) {
            self.report.cut_reused = true;
            return Ok(Some(kept.clone()));
        }
        // Cut to the trigger, not just under the limit, so that the requests until the
        // digest lands fit the same cut.
        let goals = self.goals(self.budget.trigger, self.budget.fit_limit());
        let cut = self.plan.cut_to_fit(goals, self.protect, &mut self.counter)?;
        Ok(cut)
    }

    /// Tier 3: while small user messages and digests take more than the floor, the
    /// oldest whole turns (user messages included) and every stored block become one goal
    /// history. The last `keep_last_turns` turns (the current one among them) never take
    /// part.
    async fn goal_batch(&mut self, over: &Over<'_>) -> Result<(), CompactionError> {
        let floor_used: usize = (self.plan.items.iter())
            .filter(|i| !i.dropped && matches!(i.kind, Kind::User | Kind::Digest))
            .map(|i| i.tokens)
            .sum();
        let report = &self.report;
        if report.fold_deferred
            || report.fold_postponed
            || self.plan.total() <= self.budget.target
            || floor_used <= self.budget.floor
        {
            return Ok(());
        }
        let end = turn_tail_start(self.src.units, self.cfg.keep_last_turns).min(self.reach);
        let blocks_end = self.blocks_end();
        // Every small user message a later request may still have to forward stays
        // verbatim: the guarantee grows when the last user message shrinks.
        let src = &self.src;
        let guarantee = src.keep.lasting_guarantee(src.msgs, src.tokens, src.fixed, &self.budget);
        let goal_keeps = guarantee.max_tokens;
        let min_work = (self.budget.trigger - self.budget.target) / 2;
        if end < blocks_end || self.batched_work(end, goal_keeps) < min_work.max(1) {
            return Ok(());
        }
        let region = self.region(blocks_end, end, over.previous);
        let rules = self.rules(DigestKind::GoalBatch, goal_keeps);
        let instructions = self.instructions();
        let blocks = &mut *self.stored.blocks;
        let asked = instructions.as_deref();
        match fold_after(blocks, true, region, self.summarizer, rules, asked).await? {
            Some(folded) => {
                if self.add_fold(folded, Tier::GoalBatch)? {
                    self.report.goal_batches += 1;
                }
            }
            None => self.report.fold_deferred = true,
        }
        Ok(())
    }

    /// What a goal batch up to `end` takes out of the prompt: the work of its turns, the
    /// user messages past the floor and the digests, less the goal history that replaces
    /// them. Like a fold, it must be worth making.
    fn batched_work(&self, end: usize, goal_keeps: Option<usize>) -> usize {
        let batched = |i: &&Item| {
            i.pos < end
                && !i.dropped
                && match i.kind {
                    Kind::Work | Kind::Digest => true,
                    Kind::User => goal_keeps.is_none_or(|max| i.tokens > max),
                    _ => false,
                }
        };
        let taken: usize = self.plan.items.iter().filter(batched).map(|i| i.tokens).sum();
        taken.saturating_sub(self.cfg.digest_max_tokens + self.cfg.trail_max_tokens)
    }

    /// Tier 4: cut what is still over target, only as far as needed. While another
    /// process summarizes this conversation (or the fold is postponed), the request goes
    /// on with the folds it has and is cut only as far as it must be to fit: its prefix
    /// changes once, when the digest lands, not twice.
    fn fallback(&mut self) -> Result<(), CompactionError> {
        let target = if self.report.fold_deferred || self.report.fold_postponed {
            self.budget.budget
        } else {
            self.budget.target
        };
        if self.plan.total() <= target {
            return Ok(());
        }
        let goals = self.goals(target, self.budget.budget);
        // The tier is what the cut did (see `finish`): a prompt over target that it
        // cannot cut (all of it a current turn that fits) is forwarded as it was.
        self.plan.fallback(goals, self.protect, &mut self.counter)?;
        Ok(())
    }

    /// The cut's goals: down to `target`, never over `limit`.
    fn goals(&self, target: usize, limit: usize) -> Goals {
        Goals {
            target,
            limit,
            floor: self.budget.floor,
            small_max: self.cfg.user_verbatim_max_tokens,
            min_tokens: self.cfg.elide_min_tokens,
        }
    }

    /// The fold region `[start, end)`.
    fn region<'r>(&self, start: usize, end: usize, previous: &'r Forwarded) -> Region<'r>
    where
        'a: 'r,
    {
        let src = &self.src;
        Region {
            msgs: src.msgs,
            tokens: src.tokens,
            start,
            end,
            tools: self.tools,
            forwarded: previous,
        }
    }

    /// How a new block of `kind` is made.
    fn rules(&self, kind: DigestKind, goal_keeps: Option<usize>) -> FoldRules<'a> {
        FoldRules {
            max_tokens: self.cfg.digest_max_tokens,
            trail_tokens: self.cfg.trail_max_tokens,
            keep: *self.src.keep,
            kind,
            goal_keeps,
        }
    }

    /// Adds `folded`'s block (in place of the blocks it absorbed) when it makes the
    /// prompt smaller, and raises the tier to `tier`; false, leaving the blocks as they
    /// were, when it would not.
    fn add_fold(&mut self, folded: Folded, tier: Tier) -> Result<bool, CompactionError> {
        let blocks = &mut *self.stored.blocks;
        let saved = blocks.clone();
        add_block(blocks, folded.block.clone());
        let built = self.src.plan(blocks, &mut self.counter)?;
        let report = &mut self.report;
        if built.total() >= self.plan.total() {
            *blocks = saved;
            report.folds_rejected += 1;
            return Ok(false);
        }
        if folded.block.start == 0 {
            report.blocks_absorbed += saved.len();
        }
        report.summarizer = Some(folded.block.summarizer.clone());
        report.summarizer_error = folded.error;
        report.artifact_recall = folded.block.artifact_recall;
        report.blocks_new += 1;
        self.plan = built;
        report.tier = tier;
        Ok(true)
    }

    /// Where the new fold ends: the turn tail, or deeper inside a live turn when folding
    /// up to the turn tail would predictably still miss the target.
    fn fold_end(&self, blocks_end: usize, tail0: usize, tail1: usize) -> usize {
        if tail1 <= tail0 {
            return tail0;
        }
        let (msgs, tokens) = (self.src.msgs, self.src.tokens);
        let keep = *self.src.keep;
        let plan = &self.plan;
        let before_blocks: usize =
            plan.items.iter().filter(|i| i.pos < blocks_end).map(|i| i.tokens).sum();
        let kept_in_region: usize = (blocks_end..tail0)
            .filter(|&i| keep.is_verbatim(msgs, tokens, i))
            .map(|i| tokens[i])
            .sum();
        let rest: usize = tokens[tail0..].iter().sum();
        let predicted =
            plan.fixed + before_blocks + kept_in_region + self.cfg.digest_max_tokens + rest;
        if predicted > self.budget.target { tail1 } else { tail0 }
    }

    /// Finish: the cut remembered for the next request, the report accounted, and the
    /// request to forward (unchanged when every message is the original).
    pub fn finish(mut self, request: &ChatRequest) -> Result<Forward, CompactionError> {
        let msgs = self.src.msgs;
        *self.stored.cut = self.plan.cut_items(msgs)?;
        *self.stored.cut_postponed = self.report.fold_postponed && !self.stored.cut.is_empty();
        let forwarded = self.plan.messages();
        self.report.account(&self.plan, msgs.len());
        let blocks = &*self.stored.blocks;
        let changes = changes(&self.plan, blocks, msgs, self.src.tokens, &mut self.counter);
        self.report.tier = self.report.tier.max(cut_tier(&changes));
        self.report.changes = changes;
        if let Some(previous) = &self.previous {
            self.report.rewritten_tokens =
                rewritten(&forwarded, &previous.messages, &mut self.counter);
            self.report.rewrite_cost =
                self.report.rewritten_tokens as f64 * (1.0 - self.cfg.cached_price);
        }
        let report = self.report;
        if same_messages(&forwarded, msgs) {
            return Ok(Forward::Unchanged { report });
        }
        let out = request.with_messages(forwarded);
        Ok(Forward::Compacted { body: out.to_vec(), request: out, report })
    }
}

/// The tokens of `forwarded` from the first message that differs from `previous` (the
/// conversation as last forwarded, with what the client added since) on: what the
/// provider writes to its cache again because of this request's compaction. None when
/// `previous` is a prefix of `forwarded`.
fn rewritten(
    forwarded: &[Arc<Message>],
    previous: &[Arc<Message>],
    counter: &mut Counter<'_>,
) -> usize {
    let same = |(a, b): (&Arc<Message>, &Arc<Message>)| a.hash() == b.hash() && a.raw() == b.raw();
    let common = forwarded.iter().zip(previous).take_while(|&pair| same(pair)).count();
    if common >= previous.len() {
        return 0;
    }
    forwarded[common..].iter().map(|m| counter.message(m)).sum()
}

/// True when `a` and `b` are byte-identical messages, in order.
fn same_messages(a: &[Arc<Message>], b: &[Arc<Message>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.hash() == y.hash() && x.raw() == y.raw())
}
