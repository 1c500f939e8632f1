//! Which words name a file: a shell word of a command, or a word of a digest's prose.
//! Shared by the actions read off tool calls and the digest's check of its artifacts.

use super::MAX_SUBJECT;

/// File extensions that make a word of a digest line a file path.
const FILE_EXTS: &[&str] = &[
    "py", "rs", "js", "ts", "tsx", "jsx", "go", "java", "c", "h", "cc", "cpp", "hpp", "rb", "php",
    "cs", "kt", "swift", "json", "toml", "yaml", "yml", "md", "txt", "cfg", "ini", "sh", "html",
    "css", "sql", "lock", "xml", "rst", "ipynb", "csv", "log", "patch", "diff",
];

/// Characters of shell syntax (globs, expansions, redirections, quotes) that no path word
/// holds.
const SHELL_SYNTAX: &[u8] = b"*?[]{}$`=<>|;&(),\"'";

/// True for a shell word that names a file or directory: a path with a `/`, or a file
/// name with an extension; no option, URL, glob, expansion or assignment.
pub(super) fn is_path_word(w: &str) -> bool {
    // Only a `/` or an extension's `.` makes a path: most words of prose end here.
    if w.len() < 2 || w.len() > MAX_SUBJECT || !w.bytes().any(|b| b == b'/' || b == b'.') {
        return false;
    }
    if w.starts_with('-')
        || w.contains("://")
        || w == "/dev/null"
        || !w.chars().any(|c| c.is_ascii_alphabetic())
        || w.chars().any(|c| {
            c.is_whitespace() || (c.is_ascii_punctuation() && SHELL_SYNTAX.contains(&(c as u8)))
        })
    {
        return false;
    }
    if w.contains('/') {
        return true;
    }
    w.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=8).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphanumeric())
            && ext.chars().any(|c| c.is_ascii_alphabetic())
    })
}

/// True for a word of prose that names a file: a path with a `/`, or a name with a file
/// extension.
pub(super) fn names_file(w: &str) -> bool {
    if !is_path_word(w) {
        return false;
    }
    w.contains('/')
        || w.rsplit_once('.')
            .is_some_and(|(_, ext)| FILE_EXTS.contains(&ext.to_ascii_lowercase().as_str()))
}
