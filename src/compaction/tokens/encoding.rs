//! BPE encodings and bounded-work token counting.
//!
//! Counts come from bpe-openai's prebuilt encoders: tiktoken's counts, in time linear in
//! the text. Text is cut into chunks before it reaches the encoder, as it was when
//! tiktoken-rs counted (its merging is superlinear in the length of one pre-tokenized
//! piece, and an untrusted message can hold a single piece megabytes long: a run of
//! `a`s, of spaces, a base64 blob), so that every count, and so every forwarded byte, is
//! what it was: at points where the tokenizer's own pre-split always starts a new piece
//! (see `is_safe_split`), which keeps counts exact, and, in a run longer than [`MAX_RUN`]
//! bytes without such a point, at a character boundary every [`MAX_RUN`] bytes, at the
//! price of a count that may differ by about one token per cut inside that run.
//! `tests/compaction_tokens.rs` checks the counts against tiktoken-rs on every message
//! of the recorded conversations.

use std::sync::OnceLock;

use bpe_openai::Tokenizer;

use super::pretokenize::{self, Pretokenizer};
use serde::{Deserialize, Serialize};

/// Longest run of bytes without a safe split point that is tokenized in one piece.
pub const MAX_RUN: usize = 128;
/// Target size of the chunks handed to the tokenizer in one call.
const MAX_CHUNK: usize = 16 * 1024;

/// A tokenizer encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series.
    O200kBase,
    /// GPT-4 and GPT-3.5.
    Cl100kBase,
}

impl Encoding {
    /// Parses `o200k_base` or `cl100k_base`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "o200k_base" => Some(Self::O200kBase),
            "cl100k_base" => Some(Self::Cl100kBase),
            _ => None,
        }
    }

    /// The encoding's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
        }
    }

    /// The shared tokenizer, loaded once per process.
    pub fn tokenizer(self) -> &'static Tokenizer {
        match self {
            Self::O200kBase => bpe_openai::o200k_base(),
            Self::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    /// The encoding's pre-tokenization, built once per process.
    pub fn pretokenizer(self) -> &'static Pretokenizer {
        match self {
            Self::O200kBase => &pretokenize::O200K_BASE,
            Self::Cl100kBase => &pretokenize::CL100K_BASE,
        }
    }

    /// Tokens in `text` (special-token strings count as ordinary text), counted chunk by
    /// chunk (see the module docs): the counts tiktoken gives the same chunks.
    pub fn count(self, text: &str) -> usize {
        let bpe = &self.tokenizer().bpe;
        let pretokenizer = self.pretokenizer();
        let mut total = 0;
        for_each_chunk(text, |chunk| {
            pretokenizer.for_each_piece(chunk, |piece| total += bpe.count(piece.as_bytes()));
        });
        total
    }
}

/// The role names of chat messages, whose counts [`Encoding::count_role`] keeps.
const ROLES: [&str; 6] = ["system", "developer", "user", "assistant", "tool", "function"];

impl Encoding {
    /// Tokens of a message's role: [`Encoding::count`] of it, kept once per process for
    /// the role names of chat messages, which every message names.
    pub fn count_role(self, role: &str) -> usize {
        static COUNTS: [OnceLock<[usize; ROLES.len()]>; 2] = [OnceLock::new(), OnceLock::new()];
        let Some(at) = ROLES.iter().position(|r| *r == role) else {
            return self.count(role);
        };
        let slot = match self {
            Self::O200kBase => &COUNTS[0],
            Self::Cl100kBase => &COUNTS[1],
        };
        slot.get_or_init(|| ROLES.map(|r| self.count(r)))[at]
    }
}

/// Loads the encoder of current models (o200k_base; once per process), so that the
/// first request to count does not wait for it.
pub fn load_default() {
    Encoding::O200kBase.tokenizer();
    Encoding::O200kBase.pretokenizer();
}

/// True where the tokenizer's pre-split always starts a new piece at byte `i`: at a
/// space followed by a visible ASCII character (the space opens the next piece, or is a
/// piece of its own), and after a newline followed by a visible ASCII character other
/// than `/` (o200k lets a punctuation piece run on over newlines and slashes). Both
/// regexes (o200k_base, cl100k_base) agree on these points.
fn is_safe_split(bytes: &[u8], i: usize) -> bool {
    let visible = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_graphic);
    match bytes.get(i) {
        Some(b' ') => visible(i + 1),
        Some(&b) if b.is_ascii_graphic() && b != b'/' => i > 0 && bytes[i - 1] == b'\n',
        _ => false,
    }
}

/// Calls `f` on consecutive chunks of `text` that together make up all of it.
pub fn for_each_chunk(text: &str, mut f: impl FnMut(&str)) {
    let bytes = text.as_bytes();
    if bytes.len() <= MAX_RUN {
        if !text.is_empty() {
            f(text);
        }
        return;
    }
    let mut start = 0;
    let mut run_start = 0;
    for i in 1..bytes.len() {
        if is_safe_split(bytes, i) {
            run_start = i;
            if i - start >= MAX_CHUNK {
                f(&text[start..i]);
                start = i;
            }
        } else if i - run_start >= MAX_RUN && text.is_char_boundary(i) {
            f(&text[start..i]);
            start = i;
            run_start = i;
        }
    }
    if start < bytes.len() {
        f(&text[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(enc: Encoding, text: &str) -> usize {
        let bpe = match enc {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        };
        bpe.encode_ordinary(text).len()
    }

    #[test]
    fn a_role_counts_as_its_text() {
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for role in ROLES.iter().copied().chain(["critic", "", "User"]) {
                assert_eq!(enc.count_role(role), enc.count(role), "{role}");
                assert_eq!(enc.count_role(role), exact(enc, role), "{role}");
            }
        }
    }

    #[test]
    fn chunked_count_equals_exact_on_ordinary_text() {
        let mut text = String::new();
        for i in 0..4000 {
            text.push_str(&format!(
                "Line {i}: the quick brown Fox's (jumps) over {i}x lazy dogs.\n    fn call_{i}() -> Result<(), Error> {{ let  spaced   =  \"value\"; }}\n"
            ));
        }
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(enc.count(&text), exact(enc, &text), "{}", enc.name());
        }
    }

    #[test]
    fn chunks_cover_text_and_bound_runs() {
        let text = format!("start {} middle {} end", "a".repeat(10_000), "é".repeat(3000));
        let mut joined = String::new();
        let mut longest = 0;
        for_each_chunk(&text, |c| {
            joined.push_str(c);
            longest = longest.max(c.len());
        });
        assert_eq!(joined, text);
        assert!(longest <= 2 * MAX_RUN, "{longest}");
    }

    #[test]
    fn adversarial_runs_count_close_to_exact() {
        let text = "a".repeat(20_000);
        let exact = exact(Encoding::O200kBase, &text);
        let bounded = Encoding::O200kBase.count(&text);
        let diff = exact.abs_diff(bounded);
        assert!(diff <= text.len() / MAX_RUN + 1, "exact {exact} bounded {bounded}");
    }

    /// The pieces are bpe-openai's: `Pretokenizer` holds its patterns.
    mod pieces {
        use super::*;

        fn ours(enc: Encoding, text: &str) -> Vec<String> {
            let mut out = Vec::new();
            enc.pretokenizer().for_each_piece(text, |p| out.push(p.to_owned()));
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
}
