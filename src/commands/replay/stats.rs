//! The results of replaying conversations: [`ReplayStats`], summed per family and in
//! total, and what they come to in cost.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::commands::cost::Charge;

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
    /// Requests sent as they were because their pinned messages could not fit.
    pub sent_whole: usize,
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

    /// Adds the results of `o` (a conversation, or a sum) to these.
    pub(super) fn add(&mut self, o: &Self) {
        self.conversations += o.conversations;
        self.requests += o.requests;
        self.compacted += o.compacted;
        self.sent_whole += o.sent_whole;
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
