//! Context windows learned from providers: when a provider rejects a prompt as too long
//! and states the model's window, that window is remembered for the model (and the
//! upstream it was served by), so that the conversation's later requests, and every
//! other conversation of that model, are compacted to fit it before they are sent. One
//! rejected request per model, not one per request.
//!
//! Bounded in memory; with a shared store the windows are written there too and read
//! back periodically, so replicas learn from each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// At most this many models' windows are remembered.
const MAX_MODELS: usize = 1024;

/// A learned window is forgotten this long after it was last confirmed (providers
/// change models' windows; a stale one only makes compaction start early).
pub const WINDOW_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Windows below this many tokens are not learned, whoever states them (an upstream's
/// error, a value read back from the store): no chat model has one, and learning one
/// (for a week, on every replica) would cut every request of the model to almost
/// nothing.
pub const MIN_WINDOW: usize = 1024;

/// The windows learned so far, by model key.
#[derive(Debug, Default)]
pub struct LearnedWindows {
    map: DashMap<String, (usize, Instant)>,
    /// True once a window was learned: until then a lookup (every request asks) reads
    /// this flag alone. Asking the map whether it is empty takes a lock of each of its
    /// shards, lines every connection thread would write to on every request.
    any: AtomicBool,
}

impl LearnedWindows {
    /// The learned window of `model`, if any and not expired.
    pub fn get(&self, model: &str) -> Option<usize> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.map.get(model).filter(|e| e.1.elapsed() < WINDOW_TTL).map(|e| e.0)
    }

    /// [`LearnedWindows::get`] of the key `model` makes, made only once any window was
    /// learned (most processes never learn one).
    pub fn get_by(&self, model: impl FnOnce() -> String) -> Option<usize> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.get(&model())
    }

    /// Remembers `window` for `model`; true when it is new or smaller than before (a
    /// window only shrinks: a larger stated one may come from another deployment).
    pub fn learn(&self, model: &str, window: usize) -> bool {
        if window < MIN_WINDOW {
            return false;
        }
        if let Some(mut entry) = self.map.get_mut(model) {
            let fresh = entry.1.elapsed() < WINDOW_TTL;
            let changed = !fresh || window < entry.0;
            if changed || window == entry.0 {
                *entry = (if fresh { entry.0.min(window) } else { window }, Instant::now());
            }
            return changed;
        }
        if self.map.len() >= MAX_MODELS {
            self.map.retain(|_, e| e.1.elapsed() < WINDOW_TTL);
            if self.map.len() >= MAX_MODELS {
                return false;
            }
        }
        self.map.insert(model.to_owned(), (window, Instant::now()));
        self.any.store(true, Ordering::Release);
        true
    }

    /// How many windows are known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when none is known.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The key of `model` as served by `upstream`: the same name may be another model (and
/// window) at another provider.
pub fn model_key(upstream: &str, model: &str) -> String {
    // At most 200 bytes is at most 200 characters: only a longer name is walked.
    let model = match model.len() <= 200 {
        true => model,
        false => model.char_indices().nth(200).map_or(model, |(end, _)| &model[..end]),
    };
    let mut key = String::with_capacity(upstream.len() + 1 + model.len());
    key.push_str(upstream);
    key.push('|');
    key.push_str(model);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_keys_name_the_upstream_and_at_most_200_characters_of_the_model() {
        assert_eq!(model_key("openai", "gpt-4o"), "openai|gpt-4o");
        assert_eq!(model_key("a", ""), "a|");
        let long = "é".repeat(250);
        assert_eq!(model_key("up", &long), format!("up|{}", "é".repeat(200)));
        assert_eq!(model_key("up", &long[..400]), format!("up|{}", "é".repeat(200)));
        assert_eq!(model_key("up", &"m".repeat(200)), format!("up|{}", "m".repeat(200)));
        assert_eq!(model_key("up", &"m".repeat(201)), format!("up|{}", "m".repeat(200)));
        let mixed = format!("{}{}", "m".repeat(150), "é".repeat(40));
        assert_eq!(model_key("up", &mixed), format!("up|{mixed}"), "190 characters in 230 bytes");
    }

    #[test]
    fn windows_are_learned_per_model_and_only_shrink() {
        let windows = LearnedWindows::default();
        assert_eq!(windows.get("a"), None);
        assert!(windows.learn("a", 16_000));
        assert_eq!(windows.get("a"), Some(16_000));
        assert!(!windows.learn("a", 32_000), "a larger window does not replace a smaller");
        assert_eq!(windows.get("a"), Some(16_000));
        assert!(windows.learn("a", 8_000));
        assert_eq!(windows.get("a"), Some(8_000));
        assert_eq!(windows.get("b"), None);
        assert!(!windows.learn("b", 0));
    }

    #[test]
    fn memory_is_bounded() {
        let windows = LearnedWindows::default();
        for i in 0..MAX_MODELS + 10 {
            windows.learn(&format!("m{i}"), 8_000);
        }
        assert_eq!(windows.len(), MAX_MODELS);
    }
}
