//! The token budget of one request.

use serde::Serialize;

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
}

impl Options {
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
        }
    }
}
