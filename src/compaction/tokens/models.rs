//! The model table: model name patterns → encoding and context window.

use super::encoding::Encoding;
use crate::config::CompactionConfig;

/// What the engine assumes about a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Tokenizer encoding.
    pub encoding: Encoding,
    /// Context window in tokens (prompt and reply together).
    pub context_window: usize,
}

/// Built-in entries, first match wins; each pattern is a prefix followed by `*` (any run
/// of characters), and nothing else: they are matched as prefixes.
const BUILTIN: &[(&str, Encoding, usize)] = &[
    ("gpt-5*", Encoding::O200kBase, 400_000),
    ("gpt-4.1*", Encoding::O200kBase, 1_047_576),
    ("gpt-4o*", Encoding::O200kBase, 128_000),
    ("chatgpt-4o*", Encoding::O200kBase, 128_000),
    ("gpt-4.5*", Encoding::O200kBase, 128_000),
    ("o1-mini*", Encoding::O200kBase, 128_000),
    ("o1-preview*", Encoding::O200kBase, 128_000),
    ("o1*", Encoding::O200kBase, 200_000),
    ("o3*", Encoding::O200kBase, 200_000),
    ("o4*", Encoding::O200kBase, 200_000),
    ("gpt-oss*", Encoding::O200kBase, 131_072),
    ("gpt-4-turbo*", Encoding::Cl100kBase, 128_000),
    ("gpt-4-1106*", Encoding::Cl100kBase, 128_000),
    ("gpt-4-0125*", Encoding::Cl100kBase, 128_000),
    ("gpt-4-32k*", Encoding::Cl100kBase, 32_768),
    ("gpt-4*", Encoding::Cl100kBase, 8_192),
    ("gpt-3.5-turbo*", Encoding::Cl100kBase, 16_385),
    // Claude's tokenizer is not public: o200k counts, calibrated per conversation from
    // the usage Anthropic reports (see `http::dialect::messages`).
    ("claude*", Encoding::O200kBase, 200_000),
];

/// The model resolved last on this thread by the built-in table and the defaults: its
/// name, the defaults it was resolved with, and what it resolved to.
struct LastResolved {
    model: String,
    default_encoding: String,
    default_context_window: usize,
    spec: ModelSpec,
}

thread_local! {
    static LAST: std::cell::RefCell<Option<LastResolved>> = const { std::cell::RefCell::new(None) };
}

/// Looks a model up: configured entries first, then the built-in table, then the
/// configured defaults. A provider prefix (`openai/gpt-4o`) is ignored.
///
/// This runs for every request: without configured entries, the answer depends only on
/// the name and the defaults, and the thread's last one is reused when they match.
pub fn resolve(model: &str, cfg: &CompactionConfig) -> ModelSpec {
    if !cfg.models.is_empty() {
        return look_up(model, cfg);
    }
    LAST.with_borrow_mut(|last| {
        if let Some(last) = last.as_ref().filter(|last| {
            last.model == model
                && last.default_context_window == cfg.default_context_window
                && last.default_encoding == cfg.default_encoding
        }) {
            return last.spec;
        }
        let spec = look_up(model, cfg);
        let entry = last.get_or_insert_with(|| LastResolved {
            model: String::new(),
            default_encoding: String::new(),
            default_context_window: 0,
            spec,
        });
        entry.model.clear();
        entry.model.push_str(model);
        entry.default_encoding.clear();
        entry.default_encoding.push_str(&cfg.default_encoding);
        entry.default_context_window = cfg.default_context_window;
        entry.spec = spec;
        spec
    })
}

/// [`resolve`], from the tables.
fn look_up(model: &str, cfg: &CompactionConfig) -> ModelSpec {
    // This runs per request: nothing is copied unless something is in uppercase.
    let lower = if model.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(model.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(model)
    };
    let lower = lower.as_ref();
    // A byte loop: model names are short, a searcher's setup costs more.
    let slash = lower.bytes().rposition(|b| b == b'/');
    let bare = slash.map_or(lower, |slash| &lower[slash + 1..]);
    // Patterns are compared lowercased; most already are.
    let matches = |pattern: &str| {
        let p = if pattern.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(pattern.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(pattern)
        };
        glob(&p, lower) || (bare.len() < lower.len() && glob(&p, bare))
    };
    for entry in &cfg.models {
        if matches(&entry.pattern) {
            if let Some(encoding) = Encoding::parse(&entry.encoding) {
                return ModelSpec { encoding, context_window: entry.context_window };
            }
        }
    }
    for (pattern, encoding, window) in BUILTIN {
        let prefix = pattern.strip_suffix('*').unwrap_or(pattern);
        if lower.starts_with(prefix) || bare.starts_with(prefix) {
            return ModelSpec { encoding: *encoding, context_window: *window };
        }
    }
    ModelSpec {
        encoding: Encoding::parse(&cfg.default_encoding).unwrap_or(Encoding::O200kBase),
        context_window: cfg.default_context_window,
    }
}

/// Glob match where `*` matches any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else { return pattern == text };
    let Some(mut text) = text.strip_prefix(first) else { return false };
    // `rest` is what follows the first `*`: parts between stars, then the last part,
    // which must end the text.
    let (middle, last) = rest.rsplit_once('*').unwrap_or(("", rest));
    for part in middle.split('*').filter(|p| !p.is_empty()) {
        match text.find(part) {
            Some(i) => text = &text[i + part.len()..],
            None => return false,
        }
    }
    text.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelEntry;

    #[test]
    fn families_map_to_encodings() {
        let cfg = CompactionConfig::default();
        for m in
            ["gpt-4o", "gpt-4o-mini-2024-07-18", "gpt-4.1", "gpt-5", "o1", "o3-mini", "o4-mini"]
        {
            assert_eq!(resolve(m, &cfg).encoding, Encoding::O200kBase, "{m}");
        }
        for m in ["gpt-4", "gpt-4-0613", "gpt-3.5-turbo", "gpt-4-turbo-preview"] {
            assert_eq!(resolve(m, &cfg).encoding, Encoding::Cl100kBase, "{m}");
        }
        assert_eq!(resolve("gpt-4", &cfg).context_window, 8_192);
        assert_eq!(resolve("openai/gpt-4o", &cfg).context_window, 128_000);
        assert_eq!(resolve("llama-3", &cfg).context_window, cfg.default_context_window);
    }

    #[test]
    fn the_last_model_resolved_is_reused_only_with_the_same_defaults() {
        let mut cfg = CompactionConfig::default();
        for round in 0..2 {
            for m in ["gpt-4o", "llama-3", "gpt-4", "llama-3", "LLAMA-3", "openai/gpt-4o"] {
                assert_eq!(resolve(m, &cfg), look_up(m, &cfg), "{m} {round}");
            }
            cfg.default_context_window = 4_096;
            assert_eq!(resolve("llama-3", &cfg).context_window, 4_096);
            cfg.default_encoding = "cl100k_base".into();
            assert_eq!(resolve("llama-3", &cfg).encoding, Encoding::Cl100kBase);
        }
    }

    #[test]
    fn configured_entries_come_first() {
        let mut cfg = CompactionConfig::default();
        cfg.models.push(ModelEntry {
            pattern: "gpt-4o*".into(),
            encoding: "cl100k_base".into(),
            context_window: 1000,
        });
        let spec = resolve("gpt-4o", &cfg);
        assert_eq!(spec, ModelSpec { encoding: Encoding::Cl100kBase, context_window: 1000 });
        // Names and patterns match whatever their case.
        cfg.models.push(ModelEntry {
            pattern: "Local-Llama*".into(),
            encoding: "o200k_base".into(),
            context_window: 4096,
        });
        assert_eq!(resolve("vendor/LOCAL-llama-3", &cfg).context_window, 4096);
        assert_eq!(resolve("GPT-4o-mini", &cfg).context_window, 1000);
    }

    #[test]
    fn built_in_patterns_are_prefixes() {
        for (pattern, _, _) in BUILTIN {
            let prefix = pattern.strip_suffix('*').unwrap();
            assert!(!prefix.contains('*') && prefix == prefix.to_ascii_lowercase(), "{pattern}");
        }
    }

    #[test]
    fn glob_matches() {
        assert!(glob("a*c", "abbc"));
        assert!(glob("a*", "a"));
        assert!(!glob("a*c", "abcd"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
    }
}
