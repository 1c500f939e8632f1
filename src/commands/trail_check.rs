//! How well a forwarded request keeps the agent's work trail, measured from outside the
//! trail's own code: which file paths the agent named in its messages (tool-call
//! arguments and text) the forwarded request still names, and which trail entries of
//! its digests no action of the conversation produced.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::compaction::trail::KEY_ARTIFACTS;
use crate::model::{Message, Role, call_parts};

/// File extensions that make a word a file name.
const EXTS: &[&str] = &[
    "py", "rs", "js", "ts", "tsx", "jsx", "go", "java", "c", "h", "cc", "cpp", "hpp", "rb", "php",
    "cs", "kt", "swift", "json", "toml", "yaml", "yml", "md", "txt", "cfg", "ini", "sh", "html",
    "css", "sql", "lock", "xml", "rst", "ipynb", "csv", "log", "patch", "diff", "pyx", "pyi",
];

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./-~+@".contains(c)
}

/// True for a word that is a file path: a name with a file extension, or a path that
/// starts at a root (`/`, `./`, `~/`) or has at least two `/`.
pub fn is_file_path(w: &str) -> bool {
    if w.len() < 3 || w.len() > 300 || !w.chars().all(path_char) || w.contains("//") {
        return false;
    }
    if !w.chars().any(|c| c.is_ascii_alphabetic()) || w.starts_with('-') || w.starts_with('@') {
        return false;
    }
    let last = w.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let has_ext = last.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && EXTS.contains(&ext.to_ascii_lowercase().as_str())
    });
    if w.starts_with("s/") || ["/g", "/p", "/d", "/i", "/gp"].iter().any(|end| w.ends_with(end)) {
        // A sed script (`s/old/new/g`, `/pattern/p`), not a file.
        return false;
    }
    let segments = w.split('/').filter(|s| !s.is_empty()).count();
    has_ext
        || (segments >= 2 && w.matches('/').count() >= 2)
        || (w.starts_with("./") && segments >= 2)
}

/// The words of a text that are file paths.
fn paths_in(text: &str, out: &mut BTreeSet<String>) {
    let mut start: Option<usize> = None;
    let take = |from: usize, to: usize, out: &mut BTreeSet<String>| {
        // `</code>`: a closing tag, not a path.
        if text[..from].ends_with('<') {
            return;
        }
        let w = text[from..to].trim_end_matches(['.', '-']);
        if is_file_path(w) {
            out.insert(w.to_owned());
        }
    };
    for (i, c) in text.char_indices() {
        match (path_char(c), start) {
            (true, None) => start = Some(i),
            (false, Some(from)) => {
                take(from, i, out);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        take(from, text.len(), out);
    }
}

/// Every string inside a JSON value (a call's arguments).
fn strings_of(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings_of(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings_of(x, out)),
        _ => {}
    }
}

/// The text an assistant message writes: its text and its calls' argument strings.
fn agent_text(m: &Message) -> String {
    let mut text = m.text().into_owned();
    for call in m.tool_calls().iter().chain(m.function_call()) {
        let (_, name, args) = call_parts(call);
        text.push('\n');
        text.push_str(name);
        match serde_json::from_str::<Value>(args) {
            Ok(v) => {
                let mut strings = Vec::new();
                strings_of(&v, &mut strings);
                for s in strings {
                    text.push('\n');
                    text.push_str(&s);
                }
            }
            Err(_) => {
                text.push('\n');
                text.push_str(args);
            }
        }
    }
    text
}

/// The file paths the agent named in `msgs`: in the text and call arguments of its
/// assistant messages (foldgate's digests left out).
pub fn paths_named(msgs: &[Arc<Message>]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for m in msgs {
        add_paths_named(m, &mut out);
    }
    out
}

/// The file paths `msgs` name anywhere (any role, text and call arguments).
pub fn paths_anywhere(msgs: &[Arc<Message>]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for m in msgs {
        paths_in(&agent_text(m), &mut out);
    }
    out
}

/// `paths` with every shorter path each ends with after a `/` (`a/b.py`: also `b.py`):
/// a request that names `src/a.py` names `a.py` too.
pub fn with_suffixes(paths: BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for p in paths {
        let mut rest = p.as_str();
        while let Some(at) = rest.find('/') {
            let tail = &rest[at + 1..];
            if !tail.is_empty() {
                out.insert(tail.to_owned());
            }
            rest = tail;
        }
        out.insert(p);
    }
    out
}

/// The paths of one assistant message, added to `out` (for counting incrementally).
pub fn add_paths_named(m: &Message, out: &mut BTreeSet<String>) {
    if m.role() == Role::Assistant && !m.is_digest() {
        paths_in(&agent_text(m), out);
    }
}

/// True when `hay` holds `word` with no path character right before or after it.
pub fn names(hay: &str, word: &str) -> bool {
    let mut from = 0;
    while let Some(at) = hay[from..].find(word) {
        let start = from + at;
        let end = start + word.len();
        let before = hay[..start].chars().next_back();
        let after = hay[end..].chars().next();
        if !before.is_some_and(path_char) && !after.is_some_and(|c| path_char(c) && c != '.') {
            return true;
        }
        from = start + word.len().max(1);
    }
    false
}

/// One trail line of a digest: its kind (`file`, `command`, `test`, `directory`) and
/// subject.
fn trail_line(line: &str) -> Option<(&'static str, &str)> {
    let line = line.strip_prefix("- ")?;
    for (prefix, kind) in [
        ("edited: ", "file"),
        ("created: ", "file"),
        ("deleted: ", "file"),
        ("read: ", "file"),
        ("test failed: ", "test"),
        ("test passed: ", "test"),
        ("ran: ", "command"),
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            return Some(match kind {
                "file" => match rest.split_once(" (") {
                    Some((dir, n)) if n.ends_with(" files)") => ("directory", dir),
                    Some((path, _)) => ("file", path),
                    None => ("file", rest),
                },
                "command" => ("command", rest.split(" → ").next().unwrap_or(rest)),
                _ => (kind, rest),
            });
        }
    }
    None
}

/// The trail entries of the digests in `forwarded` that no action of `original`
/// produced: a file, directory or command the agent's own messages do not name, a call
/// of a tool it never called with those values, a test no tool result names.
pub fn foreign_entries(original: &[Arc<Message>], forwarded: &[Arc<Message>]) -> Vec<String> {
    let agent: Vec<&Arc<Message>> =
        original.iter().filter(|m| m.role() == Role::Assistant && !m.is_digest()).collect();
    let said: String = agent.iter().map(|m| agent_text(m) + "\n").collect();
    let results: String = original
        .iter()
        .filter(|m| m.role() != Role::Assistant && m.role() != Role::System)
        .map(|m| m.text() + "\n")
        .collect();
    let called = |subject: &str| -> bool {
        let Some((name, args)) = subject.strip_suffix(')').and_then(|s| s.split_once('(')) else {
            return false;
        };
        agent.iter().any(|m| {
            m.tool_calls().iter().chain(m.function_call()).any(|c| {
                let (_, n, a) = call_parts(c);
                n == name
                    && args
                        .split(", ")
                        .filter(|kv| !kv.is_empty())
                        .all(|kv| kv.split_once('=').is_some_and(|(_, v)| a.contains(v)))
            })
        })
    };
    let mut out = Vec::new();
    for m in forwarded.iter().filter(|m| m.is_digest()) {
        let text = m.text();
        let Some(at) = text.find(KEY_ARTIFACTS) else { continue };
        for line in text[at..].lines().skip(1) {
            let Some((kind, subject)) = trail_line(line) else { continue };
            let produced = match kind {
                "file" => names(&said, subject),
                "directory" => said.contains(subject),
                "command" => said.contains(subject.trim_end_matches('…')) || called(subject),
                _ => results.contains(subject),
            };
            if !produced {
                out.push(line.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_told_from_other_words() {
        for yes in ["src/_pytest/nodes.py", "/workspace/a", "reproduce.py", "./run.sh", "a/b/c"] {
            assert!(is_file_path(yes), "{yes}");
        }
        for no in ["and/or", "https://x.org/a.py", "1.5", "-v", "e.g", "fields.TimeDelta"] {
            assert!(!is_file_path(no), "{no}");
        }
        assert!(names("open src/a.py now", "src/a.py"));
        assert!(!names("open src/a.pyc now", "src/a.py"));
    }
}
