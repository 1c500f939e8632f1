//! `[compaction]`: budget, tiers and the model table of the compaction engine.

use serde::{Deserialize, Serialize};

/// Settings of the compaction engine (see DESIGN.md, "Compaction engine").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    /// Compact chat requests at all; `false` forwards every request unchanged.
    pub enabled: bool,
    /// Compact when prompt tokens exceed this share of `window - reserve`.
    pub trigger_ratio: f64,
    /// Compact down to this share of `window - reserve`.
    pub target_ratio: f64,
    /// Verbatim user messages plus digests may take at most this share of the budget.
    pub floor_max_ratio: f64,
    /// The last N turns (a turn starts at a user message) are never folded.
    pub keep_last_turns: usize,
    /// Inside a long live turn, the last N tool groups are never folded.
    pub keep_last_tool_groups: usize,
    /// User messages up to this many tokens are kept verbatim when their region is folded.
    pub user_verbatim_max_tokens: usize,
    /// The task statement (first user message) up to this many tokens stays verbatim too.
    pub task_verbatim_max_tokens: usize,
    /// Tool results above this many tokens are elided (tier 1) outside the kept tail.
    pub elide_min_tokens: usize,
    /// Context window assumed for models missing from the model table.
    pub default_context_window: usize,
    /// Encoding for models missing from the model table (`o200k_base` or `cl100k_base`).
    pub default_encoding: String,
    /// Reply reserve when the request sets neither `max_tokens` nor `max_completion_tokens`.
    pub default_reserve_tokens: usize,
    /// Caps every model's window (unset: the model's own window).
    pub max_context_tokens: Option<usize>,
    /// A new digest may take about this many tokens.
    pub digest_max_tokens: usize,
    /// The work trail (files, commands, tests, errors) a digest carries takes at most
    /// about this many tokens; past it, read-only files are summarized by directory first.
    #[serde(alias = "artifact_max_tokens")]
    pub trail_max_tokens: usize,
    /// Extra model table entries, matched before the built-in table.
    pub models: Vec<ModelEntry>,
    /// `enforce` forwards compacted requests; `observe` computes everything
    /// (plan, digests, metrics, headers) but forwards the original request.
    pub mode: CompactionMode,
    /// Summarize the next fold in the background once past `prefetch_ratio`.
    pub prefetch: bool,
    /// Past this share of the budget the next fold is summarized in the background.
    pub prefetch_ratio: f64,
    /// What a prompt token the provider serves from its cache costs against one it
    /// does not: the engine prices each plan with it and takes the cheapest.
    pub cached_price: f64,
    /// Pin patterns (regular expressions, at most 64 of at most 1024 bytes): a message
    /// whose text matches is never elided, folded or dropped; it is forwarded byte for
    /// byte at its place, with the tool call or results it belongs with.
    pub pin: Vec<String>,
}

/// What foldgate does with a compaction it computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompactionMode {
    /// Forward the compacted request.
    Enforce,
    /// Forward the original request (shadow mode); report what would have been done.
    Observe,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            trigger_ratio: 0.75,
            target_ratio: 0.5,
            floor_max_ratio: 0.5,
            keep_last_turns: 2,
            keep_last_tool_groups: 4,
            user_verbatim_max_tokens: 1000,
            task_verbatim_max_tokens: 4000,
            elide_min_tokens: 500,
            default_context_window: 128_000,
            default_encoding: "o200k_base".to_owned(),
            default_reserve_tokens: 4096,
            max_context_tokens: None,
            digest_max_tokens: 1200,
            trail_max_tokens: 1500,
            models: Vec::new(),
            mode: CompactionMode::Enforce,
            prefetch: true,
            prefetch_ratio: 0.6,
            cached_price: 0.1,
            pin: Vec::new(),
        }
    }
}

/// One model table entry: a name pattern and what it implies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Model name pattern; `*` matches any run of characters (e.g. `gpt-4o*`).
    pub pattern: String,
    /// Tokenizer encoding: `o200k_base` or `cl100k_base`.
    pub encoding: String,
    /// Context window in tokens.
    pub context_window: usize,
}

impl CompactionConfig {
    /// Checks ranges; the error names the key.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        let in_unit = |v: f64| v > 0.0 && v < 1.0;
        if !in_unit(self.trigger_ratio) {
            return Err((
                "compaction.trigger_ratio",
                format!("{} is outside 0..1", self.trigger_ratio),
            ));
        }
        if !in_unit(self.target_ratio) {
            return Err((
                "compaction.target_ratio",
                format!("{} is outside 0..1", self.target_ratio),
            ));
        }
        if self.target_ratio > self.trigger_ratio {
            return Err((
                "compaction.target_ratio",
                format!("{} is above trigger_ratio {}", self.target_ratio, self.trigger_ratio),
            ));
        }
        if !in_unit(self.prefetch_ratio) || self.prefetch_ratio > self.trigger_ratio {
            return Err((
                "compaction.prefetch_ratio",
                format!("{} must be in 0..1 and at most trigger_ratio", self.prefetch_ratio),
            ));
        }
        if !(0.0..=1.0).contains(&self.cached_price) {
            return Err((
                "compaction.cached_price",
                format!("{} is outside 0..=1", self.cached_price),
            ));
        }
        if let Err(e) = super::pins::compile(&self.pin) {
            return Err(("compaction.pin", e.to_string()));
        }
        if !in_unit(self.floor_max_ratio) {
            return Err((
                "compaction.floor_max_ratio",
                format!("{} is outside 0..1", self.floor_max_ratio),
            ));
        }
        if self.default_context_window == 0 {
            return Err(("compaction.default_context_window", "must be greater than 0".to_owned()));
        }
        if self.digest_max_tokens == 0 {
            return Err(("compaction.digest_max_tokens", "must be greater than 0".to_owned()));
        }
        if self.max_context_tokens == Some(0) {
            return Err(("compaction.max_context_tokens", "must be greater than 0".to_owned()));
        }
        if !is_known_encoding(&self.default_encoding) {
            return Err((
                "compaction.default_encoding",
                format!("`{}` is not o200k_base or cl100k_base", self.default_encoding),
            ));
        }
        for m in &self.models {
            if !is_known_encoding(&m.encoding) {
                return Err((
                    "compaction.models",
                    format!(
                        "`{}`: encoding `{}` is not o200k_base or cl100k_base",
                        m.pattern, m.encoding
                    ),
                ));
            }
            if m.context_window == 0 {
                return Err((
                    "compaction.models",
                    format!("`{}`: context_window must be greater than 0", m.pattern),
                ));
            }
        }
        Ok(())
    }
}

fn is_known_encoding(name: &str) -> bool {
    matches!(name, "o200k_base" | "cl100k_base")
}
