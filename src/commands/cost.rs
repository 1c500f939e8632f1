//! Prices prompts the way providers bill input with prompt caching: the part of a
//! request that repeats the start of the conversation's previous request is served from
//! the provider's cache at a discount (`--cached-price`, 0.1 by default), the rest is
//! paid in full. Summarizer calls are priced the same way, against the conversation's
//! last forwarded request (the prefix a shared-prefix summarizer call reuses).
//!
//! A prompt is compared as a sequence of entries: the tool definitions first (providers
//! put them before the messages), then one entry per message; the common prefix of two
//! prompts is the run of leading entries with the same text. Providers cache in blocks
//! of a few hundred tokens; at message granularity the difference is small against the
//! sizes compared here.

use std::sync::Arc;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::compaction::tokens::{Counter, Encoding, REPLY_PRIMING, TokenCache};
use crate::model::Message;

/// One entry of a prompt: a hash of its exact text and its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Hash of the text (xxh3 of the message's JSON; of the raw `tools` value).
    pub hash: u64,
    /// Its tokens.
    pub tokens: usize,
}

/// A prompt as priced: its entries in order and the tokens outside them (reply priming).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// Tool definitions (when present), then the messages.
    pub entries: Vec<Entry>,
    /// Tokens that are never cached (reply priming).
    pub other: usize,
}

impl Prompt {
    /// A request's prompt as priced: its tool definitions, then its messages, each with
    /// its tokens (counted with `encoding`, through `cache`).
    pub fn of(
        messages: &[Arc<Message>],
        tools: Option<&str>,
        encoding: Encoding,
        cache: &mut TokenCache,
    ) -> Self {
        let mut counter = Counter { encoding, cache };
        let mut entries = Vec::with_capacity(messages.len() + 1);
        if let Some(tools) = tools {
            let tokens = counter.tools(Some(tools));
            entries.push(Entry { hash: xxh3_64(tools.as_bytes()), tokens });
        }
        entries
            .extend(messages.iter().map(|m| Entry { hash: m.hash(), tokens: counter.message(m) }));
        Self { entries, other: REPLY_PRIMING }
    }

    /// All its tokens.
    pub fn tokens(&self) -> usize {
        self.other + self.entries.iter().map(|e| e.tokens).sum::<usize>()
    }

    /// Tokens of the leading entries it shares with `previous`.
    pub fn common_prefix(&self, previous: &Self) -> usize {
        self.entries
            .iter()
            .zip(&previous.entries)
            .take_while(|(a, b)| a == b)
            .map(|(a, _)| a.tokens)
            .sum()
    }

    /// True when it starts with every entry of `previous`.
    pub fn extends(&self, previous: &Self) -> bool {
        self.entries.len() >= previous.entries.len()
            && self.entries.iter().zip(&previous.entries).all(|(a, b)| a == b)
    }
}

/// Input tokens, split by how they are billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Charge {
    /// Served from the provider's prompt cache.
    pub cached: u64,
    /// Paid in full.
    pub uncached: u64,
}

impl Charge {
    /// Token-equivalents at `cached_price` per cached token (1 per uncached token).
    pub fn price(&self, cached_price: f64) -> f64 {
        self.uncached as f64 + self.cached as f64 * cached_price
    }

    /// All tokens.
    pub fn tokens(&self) -> u64 {
        self.cached + self.uncached
    }

    /// Adds `other`.
    pub fn add(&mut self, other: Self) {
        self.cached += other.cached;
        self.uncached += other.uncached;
    }
}

/// The prompt cache of one conversation: remembers the last request sent.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    previous: Option<Prompt>,
}

impl Meter {
    /// Charges `prompt` as the conversation's next request and remembers it. The flag
    /// says whether it starts with the whole previous request (the cache served all of
    /// it).
    pub fn send(&mut self, prompt: Prompt) -> (Charge, bool) {
        let (charge, repeats) = match &self.previous {
            Some(prev) => (charge(&prompt, prev), prompt.extends(prev)),
            None => (Charge { cached: 0, uncached: prompt.tokens() as u64 }, false),
        };
        self.previous = Some(prompt);
        (charge, repeats)
    }

    /// Charges a side call (a summarizer call) against the last request sent, without
    /// making it the conversation's last request.
    pub fn side_call(&self, prompt: &Prompt) -> Charge {
        match &self.previous {
            Some(prev) => charge(prompt, prev),
            None => Charge { cached: 0, uncached: prompt.tokens() as u64 },
        }
    }
}

fn charge(prompt: &Prompt, previous: &Prompt) -> Charge {
    let cached = prompt.common_prefix(previous);
    Charge { cached: cached as u64, uncached: (prompt.tokens() - cached) as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(entries: &[(u64, usize)]) -> Prompt {
        Prompt {
            entries: entries.iter().map(|&(hash, tokens)| Entry { hash, tokens }).collect(),
            other: 3,
        }
    }

    #[test]
    fn the_repeated_prefix_is_cached_and_the_rest_paid() {
        let mut meter = Meter::default();
        let (first, repeats) = meter.send(prompt(&[(1, 100), (2, 50)]));
        assert_eq!((first, repeats), (Charge { cached: 0, uncached: 153 }, false));
        let (grown, repeats) = meter.send(prompt(&[(1, 100), (2, 50), (3, 20)]));
        assert_eq!((grown, repeats), (Charge { cached: 150, uncached: 23 }, true));
        let (edited, repeats) = meter.send(prompt(&[(1, 100), (9, 10), (3, 20)]));
        assert_eq!((edited, repeats), (Charge { cached: 100, uncached: 33 }, false));
        let side = meter.side_call(&prompt(&[(1, 100), (9, 10), (7, 40)]));
        assert_eq!(side, Charge { cached: 110, uncached: 43 });
        assert!((side.price(0.1) - 54.0).abs() < 1e-9);
    }
}
