//! The trail in a digest: the "Key artifacts" section, a summarizer's own lines checked
//! against the trail and completed from it.

use super::Trail;
use super::words::names_file;

/// The heading of the digest section the trail is written under.
pub const KEY_ARTIFACTS: &str = crate::vocab::Section::KeyArtifacts.heading();

/// The words of a digest line, without the punctuation around them.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| c.is_whitespace() || "`\"'(),;|:".contains(c))
        .map(|w| w.trim_end_matches(['.', ':', '!', '?']))
        .filter(|w| !w.is_empty())
}

/// `body` with its "Key artifacts" section checked against `trail` and completed from
/// it: a line of the summarizer's own that names a file no action named is dropped, as
/// is one that only repeats an entry; then the trail's `lines` follow, as the section's
/// end and the digest's.
pub fn complete(body: &str, trail: &Trail, lines: &[String]) -> String {
    let (rest, own) = take_section(body, KEY_ARTIFACTS);
    let named = |w: &str| trail.entries.iter().any(|e| e.subject.contains(w));
    let kept: Vec<&str> = own
        .iter()
        .copied()
        .filter(|l| {
            let text = l.trim().trim_start_matches(['-', '*']).trim();
            !text.is_empty()
                && words(text).all(|w| !names_file(w) || named(w))
                && !trail.entries.iter().any(|e| e.subject == text)
        })
        .collect();
    let mut out = rest.trim_end().to_owned();
    if kept.is_empty() && lines.is_empty() {
        return out;
    }
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(KEY_ARTIFACTS);
    for l in kept.iter().copied().chain(lines.iter().map(String::as_str)) {
        out.push('\n');
        out.push_str(l);
    }
    out
}

/// `body` without its section headed `heading` (up to the next `## ` heading), and that
/// section's lines.
fn take_section<'a>(body: &'a str, heading: &str) -> (String, Vec<&'a str>) {
    let mut rest = String::new();
    let mut section = Vec::new();
    let mut inside = false;
    for line in body.lines() {
        if line.starts_with("## ") {
            inside = line.trim_end() == heading;
            if inside {
                continue;
            }
        }
        if inside {
            section.push(line);
        } else {
            rest.push_str(line);
            rest.push('\n');
        }
    }
    (rest, section)
}

/// Share of the entries the trail shows since `since` that `body` (the summarizer's
/// digest) already named; `None` when it shows none.
pub fn recall(trail: &Trail, since: Option<&Trail>, body: &str) -> Option<f64> {
    let fresh = trail.changed_since(since);
    let named = fresh.iter().filter(|e| body.contains(e.subject.as_str())).count();
    (!fresh.is_empty()).then(|| named as f64 / fresh.len() as f64)
}
