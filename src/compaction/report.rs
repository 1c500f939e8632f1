//! What the engine did to one request.

use serde::Serialize;

pub use crate::vocab::Tier;

use super::budget::Budget;
use super::changes::{Change, ChangeKind};
use super::plan::Plan;

/// The report of one `compact` call (serializable for `--report-json` and logs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The budget planned against.
    pub budget: Budget,
    /// Prompt tokens of the original request.
    pub tokens_before: usize,
    /// False when the request was far enough below the trigger that it was not
    /// tokenized: `tokens_before` (and `tokens_after`) are then an estimate (cached
    /// counts, about four bytes of JSON per token elsewhere).
    pub tokens_before_exact: bool,
    /// Prompt tokens of the forwarded request.
    pub tokens_after: usize,
    /// Highest tier applied: the deepest of the folds made and of the changes forwarded
    /// (see `super::changes`).
    pub tier: Tier,
    /// The call was forced (below the trigger).
    pub forced: bool,
    /// Messages in the original request.
    pub messages_before: usize,
    /// Messages forwarded.
    pub messages_after: usize,
    /// Original messages forwarded verbatim (in the tail or inside fold blocks).
    pub kept: usize,
    /// Original messages forwarded with their content replaced by a stub.
    pub elided: usize,
    /// Original messages folded into a digest.
    pub folded: usize,
    /// Original messages not forwarded in any form.
    pub dropped: usize,
    /// Stored fold blocks reused byte for byte.
    pub blocks_reused: usize,
    /// Fold blocks made by this call.
    pub blocks_new: usize,
    /// Stored fold blocks dropped because the history no longer matched.
    pub blocks_invalidated: usize,
    /// A block summarized ahead of need (prefetch) was applied, with no summarizer call.
    pub used_prefetched: bool,
    /// A fold was due but another process was summarizing this conversation: the request
    /// went on with the folds it had.
    pub fold_deferred: bool,
    /// A fold was due, and the request fitted without it: it was forwarded with the
    /// folds already made (and no new elision), for the caller to summarize the fold in
    /// the background and apply it to a later request.
    pub fold_postponed: bool,
    /// The previous request's cut was applied again (no new cut made).
    pub cut_reused: bool,
    /// Stored blocks a new block took the place of (its digest carries theirs): the
    /// forwarded prefix changes from their first digest on.
    pub blocks_absorbed: usize,
    /// Goal batches made (tier 3).
    pub goal_batches: usize,
    /// New blocks discarded because they would not have made the prompt smaller.
    pub folds_rejected: usize,
    /// Summarizer used for new blocks.
    pub summarizer: Option<String>,
    /// Why the summarizer failed, if it did (the extractive digest was used instead).
    pub summarizer_error: Option<String>,
    /// Share of the new digest's trail entries its summarizer named itself.
    pub artifact_recall: Option<f64>,
    /// Files the request's newest action reads again although a fold already holds them
    /// (read, edited or created) and nothing changed them since.
    pub rereads: usize,
    /// The forwarded prompt fits `window - reserve`.
    pub fits: bool,
    /// Prompt tokens forwarded from the first message where this request's compaction
    /// made the prompt differ from the conversation as last forwarded (with what the
    /// client added since): what the provider writes to its cache again.
    pub rewritten_tokens: usize,
    /// The plan priced cheapest and taken over the trigger, with the runner-up (see
    /// `super::price`); `None` below the trigger or when forced.
    pub plan: Option<super::Choice>,
    /// What the prefix rewrite costs beyond reading those tokens from the cache
    /// (`rewritten_tokens` at `1 - cached_price`), in token-equivalents.
    pub rewrite_cost: f64,
    /// The compaction instructions in force, in merge order, when the request was
    /// planned (see `super::steer`).
    pub instructions: Vec<super::steer::Instruction>,
    /// Of their sources, those the conversation had not had before (each is counted once
    /// per conversation).
    pub new_instruction_sources: Vec<super::steer::InstructionSource>,
    /// The messages pin patterns pinned in the request (by index), when it was planned:
    /// each forwarded byte for byte.
    pub pinned: Vec<usize>,
    /// Every change made to the original messages, in their order (see
    /// `super::changes`).
    pub changes: Vec<Change>,
}

impl Report {
    /// A report of nothing done yet: every message kept, `reused` stored blocks matching.
    pub fn new(
        budget: Budget,
        forced: bool,
        messages: usize,
        reused: usize,
        invalidated: usize,
    ) -> Self {
        Self {
            budget,
            tokens_before: 0,
            tokens_before_exact: true,
            tokens_after: 0,
            tier: Tier::Reuse,
            forced,
            messages_before: messages,
            messages_after: messages,
            kept: messages,
            elided: 0,
            folded: 0,
            dropped: 0,
            blocks_reused: reused,
            blocks_new: 0,
            blocks_invalidated: invalidated,
            used_prefetched: false,
            fold_deferred: false,
            fold_postponed: false,
            cut_reused: false,
            blocks_absorbed: 0,
            goal_batches: 0,
            folds_rejected: 0,
            summarizer: None,
            summarizer_error: None,
            artifact_recall: None,
            rereads: 0,
            fits: true,
            rewritten_tokens: 0,
            plan: None,
            rewrite_cost: 0.0,
            instructions: Vec::new(),
            new_instruction_sources: Vec::new(),
            pinned: Vec::new(),
            changes: Vec::new(),
        }
    }

    /// Fills in what `plan` forwards out of `original` messages.
    pub fn account(&mut self, plan: &Plan, original: usize) {
        self.tokens_after = plan.total();
        self.fits = self.tokens_after <= self.budget.budget;
        let live: Vec<_> = plan.items.iter().filter(|i| !i.dropped).collect();
        self.messages_after = live.iter().map(|i| i.msgs.len()).sum();
        self.kept = live.iter().map(|i| i.originals - i.elided).sum();
        self.elided = live.iter().map(|i| i.elided).sum();
        self.folded = live.iter().map(|i| i.folds).sum();
        self.dropped = original.saturating_sub(self.kept + self.elided + self.folded);
    }

    /// Why the prompt was rewritten (see [`Report::rewritten_tokens`]), when it was: the
    /// deepest thing done, from what the report records.
    pub fn rewrite_reason(&self) -> Option<crate::vocab::RewriteReason> {
        use crate::vocab::RewriteReason as R;
        if self.rewritten_tokens == 0 {
            return None;
        }
        let cut = |kind| self.changes.iter().any(|c: &Change| c.kind == kind);
        Some(if self.forced {
            R::Overflow
        } else if self.goal_batches > 0 {
            R::GoalBatch
        } else if self.blocks_new > 0 {
            R::Fold
        } else if cut(ChangeKind::Dropped) {
            R::Cut
        } else if cut(ChangeKind::Elided) {
            R::Stub
        } else {
            R::History
        })
    }

    /// Why the request got its tier, in a few words: what was reused, folded, postponed,
    /// cut or dropped, or why nothing was (e.g. "fold postponed, tool output cut to fit").
    pub fn why(&self) -> String {
        let mut why: Vec<String> = Vec::new();
        let mut say = |text: &str| why.push(text.to_owned());
        if self.forced {
            say("forced after a context overflow");
        }
        if self.blocks_reused > 0 {
            say(&format!("{} stored fold block(s) reused", self.blocks_reused));
        }
        if self.blocks_invalidated > 0 {
            say(&format!("{} stored fold block(s) no longer matched", self.blocks_invalidated));
        }
        if self.used_prefetched {
            say("a digest written in the background applied");
        }
        let made = self.blocks_new - usize::from(self.used_prefetched);
        if self.goal_batches > 0 {
            say("old turns and digests batched into a goal history");
        } else if made > 0 {
            say("old work folded into a digest");
        }
        if self.fold_postponed {
            say("fold postponed to the background");
        }
        if self.fold_deferred {
            say("fold deferred: another request is writing this conversation's digest");
        }
        if self.folds_rejected > 0 {
            say("a fold that would not have made the prompt smaller discarded");
        }
        if self.cut_reused {
            say("the previous request's cut reused");
        }
        let cut = |kind| self.changes.iter().any(|c: &Change| c.kind == kind);
        if cut(ChangeKind::Elided) {
            say("tool output cut to stubs to fit");
        }
        if cut(ChangeKind::Dropped) {
            say("messages dropped to fit");
        }
        if !self.fits {
            say("still over the window");
        }
        if let Some(plan) = &self.plan {
            let mut text = format!("plan: {} (est. {:.0})", plan.chosen.as_str(), plan.cost);
            if let Some(runner_up) = plan.runner_up {
                let runner =
                    format!(", runner-up {} ({:.0})", runner_up.as_str(), plan.runner_up_cost);
                text.push_str(&runner);
            }
            if plan.chosen == super::PlanKind::Keep {
                text.push_str(": a rewrite would not pay for itself yet");
            }
            say(&text);
        }
        if why.is_empty() {
            let over = self.tokens_before > self.budget.trigger;
            let nothing =
                if over { "over the trigger, nothing to take out" } else { "below the trigger" };
            return nothing.to_owned();
        }
        why.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::{Choice, Options, PlanKind};
    use crate::config::CompactionConfig;
    use crate::vocab::RewriteReason;

    fn report() -> Report {
        let cfg = CompactionConfig { max_context_tokens: Some(16_000), ..Default::default() };
        let budget =
            Budget::for_model(Some("gpt-4o".into()), Some(1000), &cfg, &Options::default());
        Report::new(budget, false, 10, 0, 0)
    }

    #[test]
    fn why_names_the_plan_taken_and_the_runner_up() {
        let mut kept = report();
        kept.tokens_before = 12_000;
        kept.plan = Some(Choice {
            chosen: PlanKind::Keep,
            cost: 3376.2,
            runner_up: Some(PlanKind::Fold),
            runner_up_cost: 8008.0,
        });
        assert_eq!(
            kept.why(),
            "plan: keep (est. 3376), runner-up fold (8008): a rewrite would not pay for itself yet"
        );
        assert_eq!(kept.rewrite_reason(), None, "nothing was rewritten");
    }

    #[test]
    fn a_rewrite_is_counted_for_the_deepest_thing_done() {
        let mut folded = report();
        folded.rewritten_tokens = 900;
        assert_eq!(folded.rewrite_reason(), Some(RewriteReason::History));
        folded.blocks_new = 1;
        assert_eq!(folded.rewrite_reason(), Some(RewriteReason::Fold));
        folded.goal_batches = 1;
        assert_eq!(folded.rewrite_reason(), Some(RewriteReason::GoalBatch));
        folded.forced = true;
        assert_eq!(folded.rewrite_reason(), Some(RewriteReason::Overflow));
    }
}
