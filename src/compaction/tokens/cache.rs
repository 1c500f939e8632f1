//! A bounded per-session cache of message token counts.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::encoding::Encoding;

/// The maps of counts: keys are hashes of message text, hashed again with foldhash
/// (seeded per process, so that a client cannot choose where its messages land; a few
/// instructions a key, where the standard library's SipHash takes tens).
type Counts = HashMap<u64, u32, foldhash::fast::RandomState>;

/// Token counts of messages, keyed by the hash of a message's JSON text and the encoding.
///
/// Bounded by two generations: when the current map is full it becomes the previous one
/// and the oldest generation is dropped; a hit in the previous generation is promoted.
/// The caller keeps one per session, so a conversation sent again with one new message
/// tokenizes only that message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCache {
    capacity: usize,
    current: Counts,
    previous: Counts,
    #[serde(skip)]
    hits: u64,
    #[serde(skip)]
    misses: u64,
}

/// The most counts one generation of a cache grows to hold (see [`TokenCache::hold`]).
pub const MAX_CAPACITY: usize = 1 << 20;

impl Default for TokenCache {
    fn default() -> Self {
        Self::new(8192)
    }
}

impl TokenCache {
    /// A cache holding at least `capacity` and at most twice `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            current: Counts::default(),
            previous: Counts::default(),
            hits: 0,
            misses: 0,
        }
    }

    fn key(encoding: Encoding, hash: u64) -> u64 {
        match encoding {
            Encoding::O200kBase => hash,
            Encoding::Cl100kBase => hash.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Grows the cache to hold `entries` counts in one generation (at most
    /// [`MAX_CAPACITY`]), so that a request of that many messages, counted once, stays
    /// counted while it is planned.
    pub fn hold(&mut self, entries: usize) {
        let entries = entries.min(MAX_CAPACITY);
        self.capacity = self.capacity.max(entries);
        // Room made at once, not by doubling as they come.
        self.current.reserve(entries.saturating_sub(self.current.len()));
    }

    /// The cached count, or `compute()` stored under the key.
    pub fn get_or_insert(
        &mut self,
        encoding: Encoding,
        hash: u64,
        compute: impl FnOnce() -> usize,
    ) -> usize {
        let key = Self::key(encoding, hash);
        if let Some(&n) = self.current.get(&key) {
            self.hits += 1;
            return n as usize;
        }
        let n = match self.previous.get(&key) {
            Some(&n) => {
                self.hits += 1;
                n as usize
            }
            None => {
                self.misses += 1;
                compute()
            }
        };
        if self.current.len() >= self.capacity {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, u32::try_from(n).unwrap_or(u32::MAX));
        n
    }

    /// The cached count, if any (no insertion, no statistics).
    pub fn peek(&self, encoding: Encoding, hash: u64) -> Option<usize> {
        let key = Self::key(encoding, hash);
        self.current.get(&key).or_else(|| self.previous.get(&key)).map(|&n| n as usize)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(hits, misses)` since creation (not persisted).
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_and_stays_bounded() {
        let mut c = TokenCache::new(4);
        let mut calls = 0;
        for round in 0..2 {
            for h in 0..3u64 {
                let n = c.get_or_insert(Encoding::O200kBase, h, || {
                    calls += 1;
                    h as usize * 10
                });
                assert_eq!(n, h as usize * 10, "round {round}");
            }
        }
        assert_eq!(calls, 3);
        for h in 100..200u64 {
            c.get_or_insert(Encoding::O200kBase, h, || 1);
        }
        assert!(c.len() <= 8);
        assert_eq!(c.peek(Encoding::Cl100kBase, 199), None);
    }
}
