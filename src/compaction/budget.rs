//! The token budget of one request.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::tokens::{Encoding, resolve};
use crate::config::CompactionConfig;
use crate::model::ChatRequest;

/// Per-call options of the engine.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Compact even below the trigger (used to retry after a context-length error).
    pub force: bool,
    /// Cap the context window at this many tokens (like `max_context_tokens`).
    pub window_cap: Option<usize>,
    /// Compact down to this share of the budget instead of `target_ratio`.
    pub target_ratio: Option<f64>,
    /// Assume this model instead of the request's `model`.
    pub model: Option<String>,
    /// While the request fits without it (see [`Budget::fit_limit`]), a fold due now is
    /// not made here: the request is forwarded with the folds already made, and the
    /// report says so ([`crate::compaction::Report::fold_postponed`]) so that the caller
    /// summarizes it in the background. Off: folds are made inline, as a request that
    /// does not fit needs.
    pub postpone_folds: bool,
    /// Prompt tokens the provider counts per token the engine counts, when the engine's
    /// encoder is not the provider's (Claude): a ratio above 1 shrinks the window (given
    /// in the provider's tokens) by it. A conversation's own measured ratio
    /// ([`crate::compaction::SessionState::token_ratio`]) takes its place.
    pub token_ratio: Option<f64>,
    /// What the client asked of a digest besides (a compaction API's `instructions`),
    /// for a whole fold ([`crate::compaction::Engine::fold_whole`]).
    pub summary_instructions: Option<String>,
    /// A fold summarized ahead of need (with `force`): made only when the plan would
    /// fold rather than stub more tool output once the trigger is reached.
    pub prefetch: bool,
    /// What the operator and the request ask of folds: instructions and pins.
    pub steer: super::steer::Steer,
}

impl Options {
    /// These options for a conversation whose own measured ratio is `measured` (see
    /// [`crate::compaction::SessionState::token_ratio`]): it takes the place of
    /// `token_ratio`.
    pub fn for_conversation(&self, measured: Option<TokenRatio>) -> Cow<'_, Self> {
        match measured {
            Some(ratio) => Cow::Owned(Self { token_ratio: Some(ratio.value), ..self.clone() }),
            None => Cow::Borrowed(self),
        }
    }

    /// Options for a retry after the provider rejected a request as too long: compact
    /// regardless of the trigger, to half the usual target.
    pub fn overflow_retry(cfg: &CompactionConfig) -> Self {
        Self { force: true, target_ratio: Some(cfg.target_ratio / 2.0), ..Self::default() }
    }
}

/// The budget a request is planned against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    /// Model name used for the table lookup.
    pub model: String,
    /// Encoding used for counting.
    pub encoding: Encoding,
    /// Context window after caps.
    pub window: usize,
    /// Tokens reserved for the reply (at most half the window).
    pub reserve: usize,
    /// `window - reserve`: what the prompt may take.
    pub budget: usize,
    /// Compaction starts above this many prompt tokens.
    pub trigger: usize,
    /// Compaction aims at this many prompt tokens.
    pub target: usize,
    /// Verbatim user messages are guaranteed while they take at most this many tokens.
    pub floor: usize,
    /// Provider tokens per engine token the window was shrunk by (1 when it was not).
    pub token_ratio: f64,
}

impl Budget {
    /// The most a request may take and still be forwarded without a fold that is due:
    /// `budget` less a safety margin of 2% for counting error (estimated token counts
    /// of other providers' models, framing).
    pub fn fit_limit(&self) -> usize {
        self.budget - self.budget / 50
    }

    /// The budget of `request` under `cfg` and `opts`.
    pub fn of(request: &ChatRequest, cfg: &CompactionConfig, opts: &Options) -> Self {
        Self::for_model(request.model(), request.max_reply_tokens(), cfg, opts)
    }

    /// The budget of a request for `model` asking for `max_reply` reply tokens.
    pub fn for_model(
        model: Option<String>,
        max_reply: Option<usize>,
        cfg: &CompactionConfig,
        opts: &Options,
    ) -> Self {
        let model = opts.model.clone().or(model).unwrap_or_default();
        let spec = resolve(&model, cfg);
        let mut window = spec.context_window;
        for cap in [cfg.max_context_tokens, opts.window_cap].into_iter().flatten() {
            window = window.min(cap);
        }
        // Windows and caps are in the provider's tokens; the engine plans in its own.
        let token_ratio = opts.token_ratio.filter(|r| *r > 1.0).unwrap_or(1.0);
        window = (window as f64 / token_ratio) as usize;
        let reserve = max_reply.unwrap_or(cfg.default_reserve_tokens).min(window / 2);
        let budget = window - reserve;
        let ratio = |r: f64| (budget as f64 * r.clamp(0.0, 1.0)) as usize;
        let target_ratio = opts.target_ratio.unwrap_or(cfg.target_ratio).min(cfg.trigger_ratio);
        Self {
            model,
            encoding: spec.encoding,
            window,
            reserve,
            budget,
            trigger: ratio(cfg.trigger_ratio),
            target: ratio(target_ratio),
            floor: ratio(cfg.floor_max_ratio),
            token_ratio,
        }
    }
}

/// A measured ratio of prompt tokens as the provider reports them to tokens as the engine
/// counted them for the same forwarded prompt: a moving average of the samples, which
/// stays near the latest ones as a conversation's content changes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenRatio {
    /// The average.
    pub value: f64,
    /// Samples taken.
    pub samples: u32,
}

impl TokenRatio {
    /// Prompts the engine counted below this many tokens are not samples (framing the
    /// engine does not see weighs too much in them).
    pub const MIN_TOKENS: usize = 1_000;
    /// Weight of a new sample in the average.
    const WEIGHT: f64 = 0.3;
    /// Samples after which a sample that agrees with the average need not be stored.
    const SETTLED_SAMPLES: u32 = 3;

    /// The first sample of a prompt the engine counted as `counted` tokens and the
    /// provider as `reported`; `None` when it is no sample (see [`Self::MIN_TOKENS`]).
    pub fn first(counted: usize, reported: u64) -> Option<Self> {
        Some(Self { value: Self::sample(counted, reported)?, samples: 1 })
    }

    /// Adds a sample (see [`Self::first`]); returns whether it was one.
    pub fn observe(&mut self, counted: usize, reported: u64) -> bool {
        let Some(sample) = Self::sample(counted, reported) else { return false };
        self.value += Self::WEIGHT * (sample - self.value);
        self.samples = self.samples.saturating_add(1);
        true
    }

    /// True when a sample would leave the average as good as it is: it has a few
    /// samples, and this one is within 1% of it (storing it would move the average by
    /// less than a third of that).
    pub fn settled_by(&self, counted: usize, reported: u64) -> bool {
        Self::sample(counted, reported).is_none_or(|sample| {
            self.samples >= Self::SETTLED_SAMPLES && (sample / self.value - 1.0).abs() < 0.01
        })
    }

    /// [`Self::observe`] on an optional ratio, starting it with its first sample.
    pub fn observe_into(ratio: &mut Option<Self>, counted: usize, reported: u64) -> bool {
        match ratio {
            Some(r) => r.observe(counted, reported),
            None => {
                *ratio = Self::first(counted, reported);
                ratio.is_some()
            }
        }
    }

    fn sample(counted: usize, reported: u64) -> Option<f64> {
        (counted >= Self::MIN_TOKENS && reported > 0)
            .then(|| (reported as f64 / counted as f64).clamp(0.25, 4.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(opts: &Options) -> usize {
        let cfg = CompactionConfig::default();
        Budget::for_model(Some("claude-sonnet-4-5".into()), None, &cfg, opts).window
    }

    #[test]
    fn a_token_ratio_above_one_shrinks_the_window() {
        let full = window(&Options::default());
        let ratio = |r: f64| Options { token_ratio: Some(r), ..Options::default() };
        assert_eq!(window(&ratio(1.25)), (full as f64 / 1.25) as usize);
        // A cap is in the provider's tokens too.
        let capped = Options { window_cap: Some(12_000), ..ratio(1.2) };
        assert_eq!(window(&capped), 10_000);
        // A provider that counts fewer tokens than the engine leaves the window alone.
        assert_eq!(window(&ratio(0.8)), full);
    }

    #[test]
    fn a_ratio_is_a_moving_average_of_samples_large_enough_to_tell() {
        assert_eq!(TokenRatio::first(999, 2_000), None);
        assert_eq!(TokenRatio::first(1_000, 0), None);
        let mut ratio = None;
        assert!(TokenRatio::observe_into(&mut ratio, 10_000, 12_000));
        assert!(!TokenRatio::observe_into(&mut ratio, 10, 12_000));
        let r = ratio.unwrap();
        assert_eq!((r.value, r.samples), (1.2, 1));
        assert!(TokenRatio::observe_into(&mut ratio, 10_000, 22_000));
        let r = ratio.unwrap();
        assert!((r.value - (1.2 + 0.3 * 1.0)).abs() < 1e-9, "{r:?}");
        assert_eq!(r.samples, 2);
        // A sample that agrees with a settled average is not worth storing.
        let young = TokenRatio { value: 1.2, samples: 2 };
        assert!(!young.settled_by(10_000, 12_050));
        let settled = TokenRatio { value: 1.2, samples: 3 };
        assert!(settled.settled_by(10_000, 12_050));
        assert!(!settled.settled_by(10_000, 12_500));
        assert!(settled.settled_by(10, 99), "no sample at all");
        // Outliers are bounded.
        assert_eq!(TokenRatio::first(1_000, 1_000_000).unwrap().value, 4.0);
    }
}
