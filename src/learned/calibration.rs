//! Provider token counts per engine token, per model: the prior of conversations that
//! have no ratio of their own yet (each conversation keeps its own in its state, see
//! `SessionState::token_ratio`). Fed by every answer whose forwarded prompt the engine
//! counted exactly, for the API shapes whose provider counts with an encoder the engine
//! does not have (Anthropic's).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::compaction::TokenRatio;

/// Prompt tokens as the provider counts them per engine-counted token, per model: the
/// prior of conversations that have no ratio of their own yet. A bounded table of moving
/// averages, fed by every answer whose request the engine counted exactly.
#[derive(Debug, Default)]
pub struct Calibration {
    ratios: Mutex<HashMap<String, TokenRatio>>,
}

impl Calibration {
    /// At most this many models are kept (the table is cleared when a new one would
    /// exceed it: model names come from clients).
    pub const MAX_MODELS: usize = 256;

    /// Records that a prompt the engine counted as `counted` tokens was `reported` tokens
    /// for the provider.
    pub fn observe(&self, model: &str, counted: usize, reported: u64) {
        let Some(first) = TokenRatio::first(counted, reported) else { return };
        let Ok(mut ratios) = self.ratios.lock() else { return };
        if let Some(ratio) = ratios.get_mut(model) {
            ratio.observe(counted, reported);
            return;
        }
        if ratios.len() >= Self::MAX_MODELS {
            ratios.clear();
        }
        ratios.insert(model.to_owned(), first);
    }

    /// The provider's prompt tokens per engine-counted token for `model`, once measured.
    pub fn ratio(&self, model: &str) -> Option<f64> {
        self.ratios.lock().ok()?.get(model).map(|r| r.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_averages_per_model() {
        let d = Calibration::default();
        assert_eq!(d.ratio("claude-sonnet-4-5"), None);
        d.observe("claude-sonnet-4-5", 500, 900);
        assert_eq!(d.ratio("claude-sonnet-4-5"), None, "too small to tell");
        d.observe("claude-sonnet-4-5", 10_000, 12_000);
        d.observe("claude-sonnet-4-5", 10_000, 12_000);
        let ratio = d.ratio("claude-sonnet-4-5").unwrap();
        assert!((ratio - 1.2).abs() < 1e-9, "{ratio}");
        d.observe("claude-sonnet-4-5", 10_000, 15_000);
        let ratio = d.ratio("claude-sonnet-4-5").unwrap();
        assert!(ratio > 1.2 && ratio < 1.5, "a moving average: {ratio}");
        assert_eq!(d.ratio("claude-haiku-4-5"), None, "per model");
    }
}
