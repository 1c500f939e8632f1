//! What a tool result says about the action it answers: its exit status, its first
//! error line, and the tests it names with their outcome.

use super::{MAX_ERROR, MAX_PASSED_PER_RESULT, MAX_RESULT_LINES, MAX_SUBJECT, clip};
use crate::summarizer::artifacts::is_error_line;

/// What a result says.
#[derive(Debug, Default)]
pub(super) struct ActionResult {
    /// The exit status it states.
    pub exit: Option<i64>,
    /// The action failed (a non-zero status, or an error line without one).
    pub failed: bool,
    /// Its first error line, when it failed.
    pub error: Option<String>,
    /// Tests it names, with whether each passed.
    pub tests: Vec<(String, bool)>,
}

impl ActionResult {
    /// What `text` says.
    pub fn of(text: &str) -> Self {
        let lines: Vec<&str> = text.lines().take(MAX_RESULT_LINES).collect();
        let exit = exit_status(&lines);
        let error = first_error(&lines);
        let failed = match exit {
            Some(code) => code != 0,
            None => error.is_some(),
        };
        let tests = tests_in(&lines);
        Self { exit, failed, error: if failed { error } else { None }, tests }
    }
}

/// The exit status a result states (mini-swe-agent's `<returncode>`, OpenHands'
/// `[Command finished with exit code N]`, `Exit code: N`).
pub(super) fn exit_status(lines: &[&str]) -> Option<i64> {
    let number = |s: &str| -> Option<i64> {
        let s = s.trim_start();
        let end = s
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
            .map_or(s.len(), |(i, _)| i);
        s[..end].parse().ok()
    };
    let ends = lines.iter().take(3).chain(lines.iter().rev().take(4));
    for line in ends {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("<returncode>") {
            return number(rest);
        }
        for cue in ["exit code ", "Exit code: ", "exit code: ", "exit status ", "returncode: "] {
            if let Some(at) = l.find(cue) {
                if let Some(code) = number(&l[at + cue.len()..]) {
                    return Some(code);
                }
            }
        }
    }
    None
}

/// The first error line of a result; for a Python traceback, the exception line that
/// ends it.
pub(super) fn first_error(lines: &[&str]) -> Option<String> {
    let at = lines.iter().position(|l| is_error_line(l))?;
    let mut line = lines[at].trim();
    if line.starts_with("Traceback") {
        if let Some(exc) = lines[at + 1..]
            .iter()
            .find(|l| !l.starts_with(char::is_whitespace) && !l.trim().is_empty())
        {
            line = exc.trim();
        }
    }
    Some(clip(line, MAX_ERROR))
}

/// Tests a result names with their outcome: pytest (`PASSED a.py::t`, `a.py::t FAILED`),
/// unittest and Django (`test_x (mod.Class) ... ok`), cargo (`test m::t ... ok`), go
/// (`--- FAIL: TestX`).
pub(super) fn tests_in(lines: &[&str]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let mut passed = 0;
    let verdict = |w: &str| match w {
        "PASSED" | "ok" | "PASS" | "passed" => Some(true),
        "FAILED" | "FAIL" | "ERROR" | "failed" | "error" => Some(false),
        _ => None,
    };
    for line in lines {
        let l = line.trim();
        let found = if let Some(rest) = l.strip_prefix("--- ") {
            // go test
            rest.split_once(": ").and_then(|(v, name)| {
                verdict(v).map(|ok| (name.split_whitespace().next().unwrap_or("").to_owned(), ok))
            })
        } else if let Some((head, tail)) = l.split_once(" ... ") {
            // unittest, Django, cargo
            let name = head.strip_prefix("test ").unwrap_or(head).trim();
            let ok = verdict(tail.split_whitespace().next().unwrap_or(""));
            ok.filter(|_| !name.is_empty() && (head.starts_with("test")))
                .map(|ok| (name.to_owned(), ok))
        } else {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.as_slice() {
                [v, name, ..] if name.contains("::") => {
                    verdict(v).map(|ok| ((*name).to_owned(), ok))
                }
                [name, v, ..] if name.contains("::") => {
                    verdict(v).map(|ok| ((*name).to_owned(), ok))
                }
                _ => None,
            }
        };
        let Some((name, ok)) = found else { continue };
        if name.is_empty() || name.len() > MAX_SUBJECT {
            continue;
        }
        if ok {
            if passed >= MAX_PASSED_PER_RESULT {
                continue;
            }
            passed += 1;
        }
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(t) => t.1 = ok,
            None => out.push((name, ok)),
        }
    }
    out
}
