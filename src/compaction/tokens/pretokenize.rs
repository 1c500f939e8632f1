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

use super::encoding::Encoding;

/// The pre-tokenization regex of one encoding: its patterns, and which of them ends with
/// a look-ahead character that is not part of the piece.
pub struct Pretokenizer {
    regex: Regex,
    lookahead: [bool; 3],
}

/// Builds a pretokenizer from its patterns; they are constants, known to compile.
fn build(patterns: [(&str, bool); 3]) -> Pretokenizer {
    let regex = Regex::new_many(&patterns.map(|(p, _)| p))
        .unwrap_or_else(|e| unreachable!("the pre-tokenization patterns compile: {e}"));
    Pretokenizer { regex, lookahead: patterns.map(|(_, l)| l) }
}

static CL100K_BASE: LazyLock<Pretokenizer> = LazyLock::new(|| {
    build([
        (
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+$",
            false,
        ),
        ("\\s+\\s", true),
        ("\\s+", false),
    ])
});

static O200K_BASE: LazyLock<Pretokenizer> = LazyLock::new(|| {
    let words = [
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "\\p{N}{1,3}",
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
        "\\s*[\\r\\n]+",
        "\\s+$",
    ]
    .join("|");
    build([(&words, false), ("\\s+\\s", true), ("\\s+", false)])
});

thread_local! {
    /// This thread's search state, one per encoding, made on first use.
    static CACHES: RefCell<[Option<Cache>; 2]> = const { RefCell::new([None, None]) };
}

impl Pretokenizer {
    /// The pretokenizer of `encoding`, built once per process.
    pub fn of(encoding: Encoding) -> &'static Self {
        match encoding {
            Encoding::O200kBase => &O200K_BASE,
            Encoding::Cl100kBase => &CL100K_BASE,
        }
    }

    /// Calls `f` on each piece of `text` in order, on this thread's search state. Text
    /// no pattern matches ends the pieces, as it does in bpe-openai (every character
    /// matches one of these patterns).
    pub fn for_each_piece(&self, encoding: Encoding, text: &str, mut f: impl FnMut(&str)) {
        let slot = match encoding {
            Encoding::O200kBase => 0,
            Encoding::Cl100kBase => 1,
        };
        CACHES.with(|caches| match caches.try_borrow_mut() {
            Ok(mut caches) => {
                let cache = caches[slot].get_or_insert_with(|| self.regex.create_cache());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(enc: Encoding, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        Pretokenizer::of(enc).for_each_piece(enc, text, |p| out.push(p.to_owned()));
        out
    }

    fn theirs(enc: Encoding, text: &str) -> Vec<String> {
        enc.tokenizer().split(text).map(str::to_owned).collect()
    }

    #[test]
    fn pieces_are_bpe_openais() {
        let texts = [
            "",
            " ",
            "Hello, world! It's 2026.\n\n  indented\tline\r\n",
            "don't STOP'S we'll 12345 3.14159 a/b/c\n/usr/bin",
            "    trailing spaces   ",
            "\n\n\n",
            "日本語のテキストと English mixed, ÉCOLE été 👍🏽 x̃",
            "fn main() {\n    println!(\"{}\", 42);\n}\n",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ];
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for text in texts {
                assert_eq!(ours(enc, text), theirs(enc, text), "{enc:?} {text:?}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn pieces_are_bpe_openais_for_any_text(text in "\\PC*|[ \\t\\r\\n a-zA-Z0-9'/.,]*") {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                proptest::prop_assert_eq!(ours(enc, &text), theirs(enc, &text));
            }
        }
    }
}
