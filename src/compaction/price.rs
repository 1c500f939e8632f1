//! What a plan costs the conversation under cached-prefix accounting, so that the pass
//! can pick the cheapest plan that keeps every guarantee.
//!
//! Providers bill the part of a prompt that repeats the start of the previous request at
//! `cached_price` (`compaction.cached_price`, 0.1 by default) and the rest in full. A
//! plan's cost is what the request costs now (its prompt from the first message where
//! it differs from the conversation as last forwarded is paid in full, plus the
//! summarizer call it needs) and what it leaves the requests after it to pay: its prompt
//! read from the cache by each of them, and the next rewrite, once the prompt has grown
//! past the window at the conversation's own pace (prompt tokens added per request so
//! far). While the request still fits as last forwarded, keeping it and rewriting now
//! are weighed by their worst cases (see [`Pricing::choose`]).
//!
//! How many requests are still to come is not known. To compare rewrites the estimate
//! is: a conversation that has made `R` requests makes a `k`-th more with likelihood
//! `R / (R + k)` (the longer a conversation has run, the longer it is likely to run), up
//! to `3R` more. Whether to rewrite at all while the prompt still fits depends on no
//! such estimate: the plan whose worst case costs least is taken.

use super::budget::Budget;

/// Input tokens of a summarizer call beyond the conversation it shares (its
/// instructions): paid in full.
pub const CALL_OVERHEAD: usize = 800;

/// How far ahead plans are priced, in multiples of the requests made so far.
const HORIZON: f64 = 3.0;

/// The plans a request over the trigger chooses among.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanKind {
    /// Forward as last forwarded, with what the client added since: no rewrite.
    Keep,
    /// Stub more tool output (tier 1): no summarizer call.
    Stub,
    /// Fold work into a digest (tier 2, or a digest written ahead), then as the tiers go.
    Fold,
    /// Cut old work to the target (the fallback) without a fold: what must stay is over
    /// the target without the fold's region, so the fallback would drop its digest again.
    Cut,
}

impl PlanKind {
    /// The plan's name, as the inspector and reports show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Stub => "stub",
            Self::Fold => "fold",
            Self::Cut => "cut",
        }
    }
}

/// One plan as priced: its prompt, the part of it the provider has cached, and whether
/// it needs a summarizer call.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Which plan.
    pub kind: PlanKind,
    /// Its prompt tokens.
    pub total: usize,
    /// Of those, the leading ones that repeat the conversation as last forwarded.
    pub common: usize,
    /// It needs a summarizer call (one not already made).
    pub calls: bool,
}

/// The plan chosen for a request and the runner-up, with their estimated costs (in
/// token-equivalents: an uncached prompt token is 1): between keeping and rewriting,
/// what each costs beyond the other in its worst case; among rewrites, what each costs
/// over the requests likely to come.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Choice {
    /// The plan taken.
    pub chosen: PlanKind,
    /// Its estimated cost.
    pub cost: f64,
    /// The next cheapest plan that was possible, if any.
    pub runner_up: Option<PlanKind>,
    /// Its estimated cost.
    pub runner_up_cost: f64,
}

/// How one request's plans are priced.
#[derive(Debug, Clone, Copy)]
pub struct Pricing {
    /// Price of a cached prompt token against an uncached one.
    cached: f64,
    /// Prompt tokens one request adds, on average so far.
    pace: f64,
    /// Requests the conversation has made, this one included.
    requests: f64,
    /// The prompt as last forwarded with what was added since: what a summarizer call
    /// sharing its prefix sends.
    previous: usize,
    /// Past this a request no longer fits: a rewrite is due at the latest there.
    limit: usize,
    /// What a rewrite then costs: a fold to the target, written again, and its call.
    next_rewrite: f64,
}

impl Pricing {
    /// Pricing for a request of `budget` whose messages have `tokens`, of which
    /// `assistant` are the model's replies (one per request made before this one), the
    /// first of them at `first_reply`; `previous` is the prompt as last forwarded with
    /// what was added since; `folds_call`: a fold calls a model summarizer.
    pub fn new(
        cached: f64,
        budget: &Budget,
        tokens: &[usize],
        (assistant, first_reply): (usize, Option<usize>),
        previous: usize,
        folds_call: bool,
    ) -> Self {
        let grown: usize = first_reply.map_or(0, |i| tokens[i..].iter().sum());
        let pace = (grown as f64 / assistant.max(1) as f64).max(1.0);
        let limit = budget.fit_limit();
        // A fold to the target, written again, and its call.
        let call = cached * limit as f64 + pace + CALL_OVERHEAD as f64;
        let next_rewrite =
            (1.0 - cached) * budget.target as f64 + if folds_call { call } else { 0.0 };
        Self { cached, pace, requests: (assistant + 1) as f64, previous, limit, next_rewrite }
    }

    /// Likelihood that the conversation makes `k` more requests.
    fn reaches(&self, k: f64) -> f64 {
        if k > HORIZON * self.requests { 0.0 } else { self.requests / (self.requests + k) }
    }

    /// Requests expected after this one (the sum of [`Pricing::reaches`] over the horizon).
    fn expected_requests(&self) -> f64 {
        let n = (HORIZON * self.requests) as usize;
        (1..=n).map(|k| self.reaches(k as f64)).sum()
    }

    /// What `plan` costs this request: its prompt from where it differs from the
    /// conversation as last forwarded paid in full, the rest from the cache, and the
    /// summarizer call it needs.
    fn now(&self, plan: &Candidate) -> f64 {
        let c = self.cached;
        let common = plan.common.min(plan.total) as f64;
        let mut now = c * common + (plan.total as f64 - common);
        if plan.calls {
            // The call shares the prompt last sent (cached); what the client added since
            // (about one request's worth) and the instructions are paid in full.
            let added = self.pace.min(self.previous as f64);
            now += c * (self.previous as f64 - added) + added + CALL_OVERHEAD as f64;
        }
        now
    }

    /// Requests from this one on until a prompt of `total` tokens no longer fits, at the
    /// conversation's pace (this one counts as the first).
    fn fits_for(&self, total: usize) -> f64 {
        (self.limit.saturating_sub(total) as f64 / self.pace).floor() + 1.0
    }

    /// The estimated cost of rewriting to `plan`: now, and what it leaves the later
    /// requests to pay: its prompt read from the cache by each of them (what each adds
    /// is the same whatever the plan), and the next rewrite, due where the prompt no
    /// longer fits.
    pub fn cost(&self, plan: &Candidate) -> f64 {
        let carried = self.cached * plan.total as f64 * self.expected_requests();
        self.now(plan) + carried + self.reaches(self.fits_for(plan.total)) * self.next_rewrite
    }

    /// What `plan` costs the next `requests` requests (this one included), each of them
    /// made: this one as [`Pricing::now`], the later ones reading its prompt from the cache.
    fn certain_cost(&self, plan: &Candidate, requests: f64) -> f64 {
        self.now(plan) + self.cached * plan.total as f64 * (requests - 1.0).max(0.0)
    }

    /// The plan to take among `plans` and the runner-up; `None` when there is none.
    ///
    /// The rewrites (stub, fold, cut) are compared by [`Pricing::cost`]. While the
    /// request still fits as last forwarded (`Keep` is among `plans`), whether the
    /// cheapest rewrite pays depends on how long the conversation goes on, which is not
    /// known; the plan whose worst case is least bad is taken, each plan's cost being
    /// what it costs beyond the other in its worst case:
    /// - rewriting now is worst when this request is the conversation's last: it then
    ///   costs what the rewrite costs beyond forwarding the prompt as before;
    /// - keeping is worst when the conversation goes on until the prompt no longer fits:
    ///   the requests until then read the larger prompt, and the rewrite made then also
    ///   rewrites what they added.
    ///
    /// So a conversation that crosses the trigger close to where its prompt stops fitting
    /// is rewritten early, and one with room left is rewritten only if that costs little.
    pub fn choose(&self, plans: &[Candidate]) -> Option<Choice> {
        let mut rewrites: Vec<(PlanKind, f64, &Candidate)> = plans
            .iter()
            .filter(|p| p.kind != PlanKind::Keep)
            .map(|p| (p.kind, self.cost(p), p))
            .collect();
        rewrites.sort_by(|a, b| a.1.total_cmp(&b.1));
        let keep = plans.iter().find(|p| p.kind == PlanKind::Keep);
        let Some(keep) = keep else {
            let (chosen, cost, _) = *rewrites.first()?;
            let runner = rewrites.get(1);
            return Some(Choice {
                chosen,
                cost,
                runner_up: runner.map(|r| r.0),
                runner_up_cost: runner.map_or(0.0, |r| r.1),
            });
        };
        let Some(&(kind, _, best)) = rewrites.first() else {
            let choice =
                Choice { chosen: PlanKind::Keep, cost: 0.0, runner_up: None, runner_up_cost: 0.0 };
            return Some(choice);
        };
        let window = self.fits_for(keep.total);
        let grown = (1.0 - self.cached) * self.pace * (window - 1.0).max(0.0);
        let rewrite_then = self.now(best) + grown;
        let rewrite_worst = self.now(best) - self.now(keep);
        let keep_worst =
            self.certain_cost(keep, window) + rewrite_then - self.certain_cost(best, window);
        let (chosen, cost, runner_up, runner_up_cost) = if rewrite_worst < keep_worst {
            (kind, rewrite_worst, PlanKind::Keep, keep_worst)
        } else {
            (PlanKind::Keep, keep_worst, kind, rewrite_worst)
        };
        Some(Choice { chosen, cost, runner_up: Some(runner_up), runner_up_cost })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::Options;
    use crate::config::CompactionConfig;

    fn budget() -> Budget {
        let cfg = CompactionConfig { max_context_tokens: Some(16_000), ..Default::default() };
        Budget::for_model(Some("gpt-4o".into()), Some(1000), &cfg, &Options::default())
    }

    /// A conversation of `requests` requests, each adding `pace` tokens.
    fn pricing(requests: usize, pace: usize) -> Pricing {
        let tokens = vec![pace; requests];
        Pricing::new(0.1, &budget(), &tokens, (requests - 1, Some(1)), 11_500, true)
    }

    fn keep() -> Candidate {
        Candidate { kind: PlanKind::Keep, total: 11_500, common: 11_000, calls: false }
    }

    #[test]
    fn a_long_conversation_folds_and_a_young_one_close_to_the_window_too() {
        let fold = Candidate { kind: PlanKind::Fold, total: 6_000, common: 1_000, calls: true };
        assert_eq!(pricing(40, 300).choose(&[keep(), fold]).unwrap().chosen, PlanKind::Fold);
    }

    #[test]
    fn a_rewrite_that_saves_little_is_not_made_while_the_request_fits() {
        // Stubbing 300 tokens early in the prompt rewrites nearly all of it.
        let stub = Candidate { kind: PlanKind::Stub, total: 11_200, common: 500, calls: false };
        let choice = pricing(20, 400).choose(&[keep(), stub]).unwrap();
        assert_eq!(choice.chosen, PlanKind::Keep);
        assert_eq!(choice.runner_up, Some(PlanKind::Stub));
        assert!(choice.runner_up_cost > choice.cost);
    }

    #[test]
    fn stubbing_is_preferred_to_a_fold_that_saves_about_as_much() {
        let stub = Candidate { kind: PlanKind::Stub, total: 7_000, common: 1_000, calls: false };
        let fold = Candidate { kind: PlanKind::Fold, total: 6_800, common: 1_000, calls: true };
        assert_eq!(pricing(30, 300).choose(&[fold, stub]).unwrap().chosen, PlanKind::Stub);
    }

    #[test]
    fn a_rewrite_is_made_early_only_when_keeping_risks_more() {
        let fold = Candidate { kind: PlanKind::Fold, total: 6_000, common: 1_000, calls: true };
        // Room for ten more requests: keeping until then reads 5,500 more tokens each time.
        let slow = pricing(10, 300).choose(&[keep(), fold]).unwrap();
        assert_eq!(slow.chosen, PlanKind::Fold, "{slow:?}");
        // Two more requests and the prompt no longer fits: if this is the last, the fold
        // was wasted; if not, little was lost by waiting.
        let fast = pricing(10, 1_500).choose(&[keep(), fold]).unwrap();
        assert_eq!(fast.chosen, PlanKind::Keep, "{fast:?}");
        assert!(fast.cost < fast.runner_up_cost);
    }

    #[test]
    fn the_expected_requests_grow_with_the_conversation() {
        assert!(pricing(40, 300).expected_requests() > pricing(5, 300).expected_requests());
        assert!((pricing(10, 300).reaches(1.0) - 10.0 / 11.0).abs() < 1e-9);
        assert_eq!(pricing(10, 300).reaches(31.0), 0.0);
    }
}
