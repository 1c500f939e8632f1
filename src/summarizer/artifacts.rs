//! Deterministic extraction of artifacts: exact strings (file paths, commands, error
//! lines, test names, identifiers) that an agent may need again after its history is
//! folded. Used to check a digest's recall and to append what it missed.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::model::{Message, call_parts};

/// What kind of exact string an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    /// A file path.
    Path,
    /// A shell command.
    Command,
    /// An error line.
    Error,
    /// A test name.
    Test,
    /// An identifier or record id.
    Identifier,
}

impl ArtifactKind {
    /// A label for digests.
    pub fn label(self) -> &'static str {
        match self {
            Self::Path => "Files",
            Self::Command => "Commands",
            Self::Error => "Errors",
            Self::Test => "Tests",
            Self::Identifier => "Identifiers",
        }
    }

    fn cap(self) -> usize {
        match self {
            Self::Path | Self::Identifier => 30,
            Self::Command | Self::Error | Self::Test => 12,
        }
    }
}

/// One artifact.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Artifact {
    /// Its kind.
    pub kind: ArtifactKind,
    /// The exact string.
    pub text: String,
}

/// Lines of one message scanned at most (bounds the work on huge outputs).
const MAX_LINES: usize = 400;
/// Artifacts one tool result may add.
const PER_RESULT: usize = 6;
/// Longest artifact kept, in characters.
const MAX_LEN: usize = 160;

const ERROR_CUES: &[&str] = &[
    "Error: ",
    "error: ",
    "Exception: ",
    "FAILED",
    "panicked at",
    "No such file",
    "command not found",
    "Permission denied",
    "not found",
];

/// True for a line that reports an error (a failing test, an exception, a shell error),
/// and not for code or file listings that merely mention one (`errors.py`,
/// `except ValueError:`).
pub fn is_error_line(line: &str) -> bool {
    let t = line.trim_start();
    ["Traceback", "Error:", "Error ", "error:", "error[", "ERROR", "E   ", "fatal:"]
        .iter()
        .any(|p| t.starts_with(p))
        || ERROR_CUES.iter().any(|cue| line.contains(cue))
}
const SOURCE_EXTS: &[&str] = &[
    "py", "rs", "js", "ts", "tsx", "jsx", "go", "java", "c", "h", "cc", "cpp", "hpp", "rb", "php",
    "cs", "kt", "swift", "json", "toml", "yaml", "yml", "md", "txt", "cfg", "ini", "sh", "html",
    "css", "sql", "lock", "xml", "rst",
];

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

struct Collector {
    seen: HashSet<(ArtifactKind, String)>,
    out: Vec<Artifact>,
    /// Scanning tool results: bare file names (listings) are noise there.
    strict: bool,
}

impl Collector {
    fn add(&mut self, kind: ArtifactKind, text: &str) {
        let text = truncate(text.trim(), MAX_LEN);
        if text.len() < 3 {
            return;
        }
        let count = self.out.iter().filter(|a| a.kind == kind).count();
        if count >= kind.cap() || !self.seen.insert((kind, text.clone())) {
            return;
        }
        self.out.push(Artifact { kind, text });
    }
}

fn is_path(w: &str) -> bool {
    if w.starts_with("http") || w.len() > 200 || !w.chars().any(|c| c.is_ascii_alphabetic()) {
        return false;
    }
    if !w.chars().all(|c| c.is_ascii_alphanumeric() || "_./-~".contains(c)) {
        return false;
    }
    let has_ext = w.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && !stem.ends_with('/') && SOURCE_EXTS.contains(&ext)
    });
    let slashes = w.matches('/').count();
    has_ext || (!w.ends_with('/') && (slashes >= 2 || (slashes == 1 && w.starts_with('/'))))
}

fn is_test(w: &str) -> bool {
    (w.starts_with("test_") || w.contains("::test"))
        && w.len() > 6
        && w.chars().all(|c| c.is_ascii_alphanumeric() || "_:./[]-".contains(c))
}

fn is_identifier(w: &str) -> bool {
    let alnum = w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let digits = w.chars().any(|c| c.is_ascii_digit());
    let letters = w.chars().any(|c| c.is_ascii_alphabetic());
    if !alnum || !digits || !letters || w.len() < 5 || w.len() > 40 {
        return false;
    }
    // snake_case with a number (user_id_1234) or a short upper-case code (ZFA04Y, HAT123).
    w.contains('_')
        || (w.len() <= 10 && w.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
}

fn scan_text(c: &mut Collector, text: &str) {
    let mut in_shell = false;
    for line in text.lines().take(MAX_LINES) {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_shell = matches!(trimmed, "```bash" | "```sh" | "```shell" | "```console");
            continue;
        }
        if in_shell {
            c.add(ArtifactKind::Command, trimmed);
            in_shell = false;
        } else if let Some(cmd) = trimmed.strip_prefix("$ ") {
            c.add(ArtifactKind::Command, cmd);
        }
        if is_error_line(line) {
            c.add(ArtifactKind::Error, trimmed);
        }
        for raw in line.split(|ch: char| ch.is_whitespace() || "\"'`()[]{},;<>=|".contains(ch)) {
            let w = raw.trim_end_matches(['.', ':', '!', '?']);
            if w.len() < 3 {
                continue;
            }
            // In tool results, bare file names and directories are listings, not
            // things the agent worked on.
            let bare = !w.contains('/') && !w.contains("::");
            let directory =
                w.contains('/') && !w.rsplit('/').next().is_some_and(|f| f.contains('.'));
            if c.strict && ((bare && w.contains('.')) || directory) {
                continue;
            }
            if is_test(w) {
                c.add(ArtifactKind::Test, w);
            } else if is_path(w) {
                c.add(ArtifactKind::Path, w);
            } else if is_identifier(w) {
                c.add(ArtifactKind::Identifier, w);
            }
        }
    }
}

fn scan_call(c: &mut Collector, call: &Value) {
    let (_, _, args) = call_parts(call);
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(args) {
        for (k, v) in &map {
            let Some(s) = v.as_str() else { continue };
            // A command has arguments; a bare word is a sub-command (`view`, `create`).
            if matches!(k.as_str(), "command" | "cmd" | "script") {
                if let Some(first) = s.lines().next().filter(|l| l.trim().contains(' ')) {
                    c.add(ArtifactKind::Command, first);
                }
            }
            if matches!(k.as_str(), "path" | "file" | "file_path" | "filename") {
                c.add(ArtifactKind::Path, s);
            }
        }
    }
    scan_text(c, args);
}

/// Artifacts of `messages`, deduplicated and capped per kind: first those of what the
/// user and the assistant wrote (messages and call arguments), in order, then those
/// seen in tool results, which are long and noisy (file listings, source code).
pub fn extract(messages: &[Arc<Message>]) -> Vec<Artifact> {
    let mut c = Collector { seen: HashSet::new(), out: Vec::new(), strict: false };
    let (results, written): (Vec<_>, Vec<_>) =
        messages.iter().filter(|m| !m.is_digest()).partition(|m| m.role().is_tool_result());
    for m in written.iter().chain(&results) {
        c.strict = m.role().is_tool_result();
        let before = c.out.len();
        scan_text(&mut c, &m.text());
        if c.strict {
            // One tool result may add a few artifacts, not flood the list.
            c.out.truncate(before + PER_RESULT);
        }
        for call in m.tool_calls().iter().chain(m.function_call()) {
            scan_call(&mut c, call);
        }
    }
    c.out
}

/// The artifacts `digest` does not contain verbatim.
pub fn missing<'a>(artifacts: &'a [Artifact], digest: &str) -> Vec<&'a Artifact> {
    artifacts.iter().filter(|a| !digest.contains(&a.text)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_lines() {
        for yes in [
            "Traceback (most recent call last):",
            "ValueError: bad input",
            "E   assert 1 == 2",
            "FAILED tests/a.py::t",
            "bash: foo: command not found",
        ] {
            assert!(is_error_line(yes), "{yes}");
        }
        for no in [
            "errors.py  solar_system.py",
            "    except ValueError:",
            "raise ModelDefinitionError(",
            "all good",
        ] {
            assert!(!is_error_line(no), "{no}");
        }
    }

    #[test]
    fn finds_paths_commands_errors_tests_ids() {
        let m = Message::from_value(json!({"role":"user","content":
            "Ran it:\n```bash\npytest tests/test_io.py -x\n```\nE   ValueError: bad input in src/pkg/io.py\nFAILED tests/test_io.py::test_roundtrip\nreservation ZFA04Y for mia_li_3668"}))
        .unwrap();
        let a = extract(&[Arc::new(m)]);
        let has = |k: ArtifactKind, t: &str| a.iter().any(|x| x.kind == k && x.text == t);
        assert!(has(ArtifactKind::Command, "pytest tests/test_io.py -x"), "{a:?}");
        assert!(has(ArtifactKind::Path, "src/pkg/io.py"), "{a:?}");
        assert!(has(ArtifactKind::Error, "E   ValueError: bad input in src/pkg/io.py"), "{a:?}");
        assert!(has(ArtifactKind::Test, "tests/test_io.py::test_roundtrip"), "{a:?}");
        assert!(has(ArtifactKind::Identifier, "ZFA04Y"), "{a:?}");
        assert!(has(ArtifactKind::Identifier, "mia_li_3668"), "{a:?}");
        let miss = missing(&a, "I looked at src/pkg/io.py");
        assert!(!a.iter().any(|x| x.kind == ArtifactKind::Command && x.text == "view"));
        assert_eq!(miss.len(), a.len() - 1);
    }
}
