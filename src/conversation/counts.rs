//! Per-conversation token counts kept in this process when the session store is shared:
//! they are recomputable, so they are never sent to the store, and a conversation served
//! here again tokenizes only its new messages.

use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::compaction::TokenCache;
use crate::session::SessionKey;

/// The local token caches, bounded by age and number.
pub struct LocalCounts {
    map: DashMap<SessionKey, (TokenCache, Instant)>,
    ttl: Duration,
    max: usize,
}

impl LocalCounts {
    /// Caches kept for `ttl` after use, at most `max` of them.
    pub fn new(ttl: Duration, max: usize) -> Self {
        Self { map: DashMap::new(), ttl, max: max.max(1) }
    }

    /// Takes the cache of `key` out (an empty one if none): the request owns it until
    /// [`LocalCounts::put`].
    pub fn take(&self, key: &SessionKey) -> TokenCache {
        self.map.remove(key).map(|(_, (cache, _))| cache).unwrap_or_default()
    }

    /// A copy of the cache of `key`, for background work beside the requests.
    pub fn copy(&self, key: &SessionKey) -> TokenCache {
        self.map.get(key).map(|e| e.0.clone()).unwrap_or_default()
    }

    /// Puts the cache of `key` back.
    pub fn put(&self, key: &SessionKey, cache: TokenCache) {
        if self.map.len() >= self.max && !self.map.contains_key(key) {
            let now = Instant::now();
            self.map.retain(|_, (_, seen)| now.duration_since(*seen) < self.ttl);
            if self.map.len() >= self.max {
                // Still full of live conversations: drop the oldest sixteenth at once.
                let mut ages: Vec<(Instant, SessionKey)> =
                    self.map.iter().map(|e| (e.1, e.key().clone())).collect();
                ages.sort_unstable();
                for (_, k) in ages.into_iter().take((self.max / 16).max(1)) {
                    self.map.remove(&k);
                }
            }
        }
        self.map.insert(key.clone(), (cache, Instant::now()));
    }
}
