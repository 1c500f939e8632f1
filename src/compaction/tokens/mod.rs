//! Token counting: encodings with bounded work, OpenAI's message accounting, the model
//! table and the per-session cache.

pub mod cache;
pub mod count;
pub mod encoding;
pub mod models;
pub mod parallel;
pub mod pretokenize;

pub use cache::TokenCache;
pub use count::{
    REPLY_PRIMING, message_tokens, message_tokens_by, message_upper_bound, tools_tokens,
};
pub use encoding::Encoding;
pub use models::{ModelSpec, resolve};

use crate::model::Message;

/// Counts messages for one encoding through a session's cache.
pub struct Counter<'a> {
    /// The encoding.
    pub encoding: Encoding,
    /// The session's cache.
    pub cache: &'a mut TokenCache,
}

impl Counter<'_> {
    /// Exact tokens of a message (cached).
    pub fn message(&mut self, msg: &Message) -> usize {
        let enc = self.encoding;
        self.cache.get_or_insert(enc, msg.hash(), || message_tokens(enc, msg))
    }

    /// Exact tokens of each message of `msgs`, in order (cached); the messages not in the
    /// cache are counted together, on several threads when their text is large (see
    /// [`parallel`]).
    pub fn messages(&mut self, msgs: &[std::sync::Arc<Message>]) -> Vec<usize> {
        let enc = self.encoding;
        self.cache.hold(msgs.len());
        let missing: Vec<bool> =
            msgs.iter().map(|m| self.cache.peek(enc, m.hash()).is_none()).collect();
        let uncounted: Vec<&std::sync::Arc<Message>> =
            msgs.iter().zip(&missing).filter_map(|(m, &miss)| miss.then_some(m)).collect();
        let mut fresh = parallel::count_messages(enc, &uncounted).into_iter();
        msgs.iter()
            .zip(missing)
            .map(|(m, miss)| {
                let counted = if miss { fresh.next() } else { None };
                // A count evicted since it was looked up is counted again here.
                self.cache.get_or_insert(enc, m.hash(), || {
                    counted.unwrap_or_else(|| message_tokens(enc, m))
                })
            })
            .collect()
    }

    /// Exact tokens of the tool definitions (cached by the hash of their text).
    pub fn tools(&mut self, tools_raw: Option<&str>) -> usize {
        let Some(raw) = tools_raw else { return 0 };
        let enc = self.encoding;
        let hash = xxhash_rust::xxh3::xxh3_64(raw.as_bytes()) ^ 0x5555;
        self.cache.get_or_insert(enc, hash, || tools_tokens(enc, raw))
    }

    /// Upper bound of the prompt: cached counts where known, cheap bounds elsewhere.
    pub fn message_upper_bound_total(
        &self,
        msgs: &[std::sync::Arc<Message>],
        tools_raw: Option<&str>,
    ) -> usize {
        msgs.iter().map(|m| self.message_upper(m)).sum::<usize>()
            + tools_raw.map_or(0, str::len)
            + REPLY_PRIMING
    }

    /// A quick estimate of the prompt for reports: cached counts where known, about four
    /// bytes of JSON per token elsewhere.
    pub fn estimate_total(
        &self,
        msgs: &[std::sync::Arc<Message>],
        tools_raw: Option<&str>,
    ) -> usize {
        msgs.iter()
            .map(|m| {
                self.cache
                    .peek(self.encoding, m.hash())
                    .unwrap_or_else(|| m.raw().len() / 4 + count::TOKENS_PER_MESSAGE)
            })
            .sum::<usize>()
            + tools_raw.map_or(0, |t| t.len() / 4)
            + REPLY_PRIMING
    }

    /// The cached count if known, else the cheap upper bound.
    pub fn message_upper(&self, msg: &Message) -> usize {
        self.cache.peek(self.encoding, msg.hash()).unwrap_or_else(|| message_upper_bound(msg))
    }
}
