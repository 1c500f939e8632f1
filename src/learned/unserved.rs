//! The providers' APIs an upstream does not serve: learned from its answers (a 404 or
//! 405 for an endpoint, an unknown-parameter error for a field), so that foldgate serves
//! them itself from then on (see `[responses]`, `[messages]` in the configuration) and
//! asks the upstream only once. Bounded; with a shared store read back periodically, so
//! replicas learn from each other.

use std::time::{Duration, Instant};

use dashmap::DashMap;

pub use crate::vocab::CompactionApi;

/// At most this many (API, upstream) pairs are remembered.
const MAX_ENTRIES: usize = 256;

/// A pair is asked again this long after it was learned (an upstream may be upgraded).
pub const UNSERVED_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The name of `api` at `upstream`, as kept and shared.
pub fn unserved_name(api: CompactionApi, upstream: &str) -> String {
    let upstream: String = upstream.chars().take(300).collect();
    format!("{}|{upstream}", api.as_str())
}

/// The (API, upstream) pairs learned unserved.
#[derive(Debug, Default)]
pub struct Unserved {
    map: DashMap<String, Instant>,
}

impl Unserved {
    /// True when `name` (see [`unserved_name`]) was learned unserved and not long ago.
    pub fn contains(&self, name: &str) -> bool {
        !self.map.is_empty() && self.map.get(name).is_some_and(|at| at.elapsed() < UNSERVED_TTL)
    }

    /// Remembers `name`; true when it was not known.
    pub fn learn(&self, name: &str) -> bool {
        if self.contains(name) {
            return false;
        }
        if self.map.len() >= MAX_ENTRIES {
            self.map.retain(|_, at| at.elapsed() < UNSERVED_TTL);
            if self.map.len() >= MAX_ENTRIES {
                return false;
            }
        }
        self.map.insert(name.to_owned(), Instant::now());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_remembered_per_upstream() {
        let unserved = Unserved::default();
        let a = unserved_name(CompactionApi::ResponsesCompact, "http://a/v1");
        let b = unserved_name(CompactionApi::ResponsesCompact, "http://b/v1");
        assert!(!unserved.contains(&a));
        assert!(unserved.learn(&a));
        assert!(!unserved.learn(&a));
        assert!(unserved.contains(&a) && !unserved.contains(&b));
    }
}
