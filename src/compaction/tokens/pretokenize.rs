//! Pre-tokenization: text cut into the pieces the byte-pair encoder counts one by one.
//!
//! The patterns are bpe-openai's (tiktoken's, with each negative look-ahead written as a
//! pattern whose last character is dropped from the match), so the pieces are those of
//! `bpe_openai::Tokenizer::split`. The difference is where the regex keeps its search
//! state: bpe-openai takes it from a shared pool on every piece (a lock on any thread
//! but the pool's first), here each thread keeps its own for the whole text.

use std::cell::RefCell;
use std::sync::LazyLock;

use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};

/// The pre-tokenization regex of one encoding: its patterns, and which of them ends with
/// a look-ahead character that is not part of the piece.
pub struct Pretokenizer {
    regex: Regex,
    lookahead: [bool; 3],
    /// Which of this thread's search states is this regex's.
    slot: usize,
}

/// Builds a pretokenizer from its patterns; they are constants, known to compile.
fn build(slot: usize, patterns: [(&str, bool); 3]) -> Pretokenizer {
    let regex = Regex::new_many(&patterns.map(|(p, _)| p))
        .unwrap_or_else(|e| unreachable!("the pre-tokenization patterns compile: {e}"));
    Pretokenizer { regex, lookahead: patterns.map(|(_, l)| l), slot }
}

/// cl100k_base's pre-tokenization (GPT-4, GPT-3.5).
pub static CL100K_BASE: LazyLock<Pretokenizer> = LazyLock::new(|| {
    build(
        1,
        [
            (
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+$",
                false,
            ),
            ("\\s+\\s", true),
            ("\\s+", false),
        ],
    )
});

/// o200k_base's pre-tokenization (GPT-4o and later).
pub static O200K_BASE: LazyLock<Pretokenizer> = LazyLock::new(|| {
    let words = [
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "\\p{N}{1,3}",
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
        "\\s*[\\r\\n]+",
        "\\s+$",
    ]
    .join("|");
    build(0, [(&words, false), ("\\s+\\s", true), ("\\s+", false)])
});

thread_local! {
    /// This thread's search state, one per pretokenizer, made on first use.
    static CACHES: RefCell<[Option<Cache>; 2]> = const { RefCell::new([None, None]) };
}

impl Pretokenizer {
    /// Calls `f` on each piece of `text` in order, on this thread's search state. Text
    /// no pattern matches ends the pieces, as it does in bpe-openai (every character
    /// matches one of these patterns).
    pub fn for_each_piece(&self, text: &str, mut f: impl FnMut(&str)) {
        CACHES.with(|caches| match caches.try_borrow_mut() {
            Ok(mut caches) => {
                let cache = caches[self.slot].get_or_insert_with(|| self.regex.create_cache());
                self.pieces(cache, text, &mut f);
            }
            // Only a call from inside `f` finds the state taken: it gets a state of its own.
            Err(_) => self.pieces(&mut self.regex.create_cache(), text, &mut f),
        });
    }

    fn pieces(&self, cache: &mut Cache, text: &str, f: &mut impl FnMut(&str)) {
        let mut last = 0;
        while last < text.len() {
            let input = Input::new(&text[last..]).anchored(Anchored::Yes);
            let Some(m) = self.regex.search_with(cache, &input) else { return };
            let mut end = last + m.end();
            if self.lookahead.get(m.pattern().as_usize()).copied().unwrap_or(false) {
                // The look-ahead character is the match's last; the pattern consumed at
                // least one character before it.
                end -= text[last..end].chars().next_back().map_or(0, char::len_utf8);
            }
            if end <= last {
                return;
            }
            f(&text[last..end]);
            last = end;
        }
    }
}
