//! The extractive summarizer: a deterministic digest built without a model.
//!
//! It lists what was done (tool calls with their key arguments and the first line of
//! each result, shell commands of text-mode agents), what failed, what the user asked
//! for and what I (the assistant) concluded, in the digest sections of DESIGN.md; the
//! engine adds the "Key artifacts" section from the work trail
//! (`crate::compaction::trail`). Every section has a share of a character budget derived from
//! the token cap, so the digest is bounded whatever the input.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use aho_corasick::AhoCorasick;
use async_trait::async_trait;
use serde_json::Value;

use super::artifacts;
use super::{DigestKind, Summarizer, SummarizerError, SummaryInput};
use crate::model::{Message, Role, call_parts, is_user_words};
use crate::vocab::Section;

/// Builds digests from the messages alone; never fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtractiveSummarizer;

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        crate::vocab::SummarizerKind::Extractive
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        let body = match input.kind {
            DigestKind::Fold => digest(input.messages, input.max_tokens),
            DigestKind::GoalBatch => goal_history(input.messages, input.max_tokens),
        };
        Ok(with_instruction_facts(body, input.kind, input.instructions))
    }
}

/// The bullet lines of `instructions` (`-`, `*`, `+` or a numbered item), without their
/// marker: what the extractive digest copies into its standing facts.
fn bullet_lines(instructions: &str) -> Vec<String> {
    instructions
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("- ")
                .or_else(|| line.strip_prefix("* "))
                .or_else(|| line.strip_prefix("+ "))
                .or_else(|| {
                    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
                    (digits > 0)
                        .then(|| &line[digits..])
                        .and_then(|r| r.strip_prefix(". ").or_else(|| r.strip_prefix(") ")))
                })?;
            Some(rest.trim().to_owned()).filter(|r| !r.is_empty())
        })
        .collect()
}

/// `body` with the bullet lines of the compaction instructions in force first among its
/// standing facts (a goal history's lasting constraints), in a section made for them
/// when it has none: the extractive digest cannot follow instructions, it keeps them.
pub fn with_instruction_facts(
    body: String,
    kind: DigestKind,
    instructions: Option<&str>,
) -> String {
    let lines = instructions.map(bullet_lines).unwrap_or_default();
    if lines.is_empty() {
        return body;
    }
    let title = match kind {
        DigestKind::Fold => Section::StandingFacts.heading(),
        DigestKind::GoalBatch => Section::LastingConstraints.heading(),
    };
    let facts: String = lines.iter().map(|l| format!("- {l}\n")).collect();
    let heading = format!("{title}\n");
    match body.find(&heading) {
        Some(at) => {
            let at = at + heading.len();
            format!("{}{facts}{}", &body[..at], &body[at..])
        }
        None if body.is_empty() => format!("{heading}{}", facts.trim_end()),
        None => format!("{heading}{facts}\n{body}"),
    }
}

const CONSTRAINT_CUES: &[&str] = &[
    "must",
    "never",
    "always",
    "prefer",
    "don't",
    "do not",
    "only",
    "need",
    "want",
    "should",
    "make sure",
    "please",
    "without",
    "instead",
];
const DECISION_CUES: &[&str] =
    &["because", "decided", "instead", "so that", "since", "I will", "I'll"];
/// User messages longer than this many characters are pastes or observations, not
/// statements of facts.
const USER_STATEMENT_MAX_CHARS: usize = 4000;

fn clip(s: &str, max: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn first_line(s: &str) -> &str {
    s.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("```")).unwrap_or("")
}

fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split(['\n', '.', '!']).map(str::trim).filter(|s| s.len() > 8)
}

fn key_args(args: &str) -> String {
    match serde_json::from_str::<Value>(args) {
        Ok(Value::Object(map)) => map
            .iter()
            .take(3)
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                format!("{k}={}", clip(first_line(&v), 48))
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => clip(first_line(args), 60),
    }
}

/// One thing that was done and what came back.
struct Action {
    what: String,
    result: String,
    failed: bool,
}

/// Whether a result reports an error (in its first lines), and the line to show.
fn outcome(result: &str) -> (bool, &str) {
    match result.lines().take(60).find(|l| artifacts::is_error_line(l)) {
        Some(line) => (true, line.trim()),
        None => (false, first_line(result)),
    }
}

fn shell_command(text: &str) -> Option<&str> {
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if matches!(l.trim(), "```bash" | "```sh" | "```shell") {
            return lines.next().map(str::trim).filter(|c| !c.is_empty());
        }
    }
    None
}

fn actions(msgs: &[Arc<Message>]) -> Vec<Action> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        if m.makes_calls() {
            let calls: Vec<&Value> = m.tool_calls().iter().chain(m.function_call()).collect();
            let mut j = i + 1;
            let mut results: Vec<&Message> = Vec::new();
            while j < msgs.len() && msgs[j].role().is_tool_result() {
                results.push(&msgs[j]);
                j += 1;
            }
            for (k, call) in calls.iter().enumerate() {
                let (id, name, args) = call_parts(call);
                let result = results
                    .iter()
                    .find(|r| !id.is_empty() && r.tool_call_id() == Some(id))
                    .or_else(|| results.get(k))
                    .map(|r| r.text())
                    .unwrap_or_default();
                let (failed, shown) = outcome(&result);
                out.push(Action {
                    what: format!("{name}({})", key_args(args)),
                    result: clip(shown, 120),
                    failed,
                });
            }
            i = j;
            continue;
        }
        if m.role() == Role::Assistant {
            if let Some(cmd) = shell_command(&m.text()) {
                let obs = msgs.get(i + 1).filter(|n| n.role() == Role::User).map(|n| n.text());
                let obs = obs.unwrap_or_default();
                let (failed, shown) = outcome(&obs);
                out.push(Action {
                    what: format!("`{}`", clip(cmd, 100)),
                    result: clip(shown, 120),
                    failed,
                });
            }
        }
        i += 1;
    }
    out
}

/// Adds lines to a section while its character share lasts; the lines after are never
/// made (`lines` is drawn as they are needed). No line, no section.
fn section<S: AsRef<str>>(
    out: &mut String,
    title: &str,
    lines: impl IntoIterator<Item = S>,
    budget: usize,
) {
    let mut body = String::new();
    for l in lines {
        let l = l.as_ref();
        let clipped;
        let l = if l.len() > budget {
            clipped = clip(l, budget.saturating_sub(4).max(40));
            clipped.as_str()
        } else {
            l
        };
        if body.len() + l.len() + 3 > budget && !body.is_empty() {
            break;
        }
        body.push_str("- ");
        body.push_str(l);
        body.push('\n');
    }
    if body.is_empty() {
        return;
    }
    out.push_str("## ");
    out.push_str(title);
    out.push('\n');
    out.push_str(&body);
    out.push('\n');
}

fn keep_ends(items: Vec<String>, head: usize, tail: usize) -> Vec<String> {
    if items.len() <= head + tail {
        return items;
    }
    keep_ends_of(&items, head, tail, String::clone)
}

/// The lines of the first `head` and the last `tail` of `items` (`line` of each), with
/// how many were left out between them; the items left out are never made into lines.
fn keep_ends_of<T>(
    items: &[T],
    head: usize,
    tail: usize,
    line: impl Fn(&T) -> String,
) -> Vec<String> {
    if items.len() <= head + tail {
        return items.iter().map(line).collect();
    }
    let omitted = items.len() - head - tail;
    let mut out: Vec<String> = items[..head].iter().map(&line).collect();
    out.push(format!("({omitted} more steps in between)"));
    out.extend(items[items.len() - tail..].iter().map(&line));
    out
}

/// The extractive digest body of `msgs`, within about `max_tokens` tokens.
pub fn digest(msgs: &[Arc<Message>], max_tokens: usize) -> String {
    let budget = max_tokens.max(64) * 3;
    let share = |pct: usize| budget * pct / 100;
    let work: Vec<&Arc<Message>> = msgs.iter().filter(|m| !m.is_digest()).collect();
    let user_words: Vec<&Arc<Message>> =
        (0..msgs.len()).filter(|&i| is_user_words(msgs, i)).map(|i| &msgs[i]).collect();
    let facts = user_constraints(&user_words);
    let acts = actions(msgs);
    let milestones = milestone_lines(&acts);
    let abandoned =
        acts.iter().filter(|a| a.failed).map(|a| format!("{} failed: {}", a.what, a.result));
    let assistant_texts: Vec<Cow<'_, str>> = work
        .iter()
        .filter(|m| m.role() == Role::Assistant)
        .map(|m| m.text())
        .filter(|t| !t.trim().is_empty())
        .collect();
    let decisions = decision_sentences(&assistant_texts);
    let findings =
        keep_ends_of(&assistant_texts, 2, 8, |t| format!("I said: {}", clip(first_line(t), 200)));
    let state = current_state(msgs.len(), &acts, user_words.len());
    let open = open_questions(&assistant_texts);

    let mut out = String::new();
    section(&mut out, Section::StandingFacts.title(), facts, share(14));
    section(&mut out, Section::Milestones.title(), &milestones, share(8));
    section(&mut out, Section::KeyDecisions.title(), decisions, share(8));
    section(&mut out, Section::Findings.title(), &findings, share(10));
    section(&mut out, Section::Attempted.title(), abandoned, share(8));
    section(&mut out, Section::CurrentState.title(), &state, share(5));
    section(&mut out, Section::OpenItems.title(), &open, share(5));
    out.trim_end().to_owned()
}

/// The sentences of the user's own messages (not pastes) that state a constraint, quoted;
/// made as they are drawn.
fn user_constraints<'a>(user_words: &'a [&Arc<Message>]) -> impl Iterator<Item = String> + 'a {
    user_words.iter().flat_map(|m| {
        let text = m.text();
        let mut facts = Vec::new();
        if text.len() <= USER_STATEMENT_MAX_CHARS {
            for s in sentences(&text) {
                if states_constraint(s) {
                    facts.push(format!("The user: \"{}\"", clip(s, 200)));
                }
            }
        }
        facts
    })
}

/// True when `sentence`, lowercased, holds one of [`CONSTRAINT_CUES`].
fn states_constraint(sentence: &str) -> bool {
    static CUES: LazyLock<AhoCorasick> = LazyLock::new(|| {
        AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(CONSTRAINT_CUES)
            .unwrap_or_else(|e| unreachable!("the cues are plain words: {e}"))
    });
    if sentence.is_ascii() {
        // Lowercasing ASCII text is ASCII case folding, and the cues are lowercase ASCII.
        CUES.is_match(sentence)
    } else {
        let lower = sentence.to_lowercase();
        CONSTRAINT_CUES.iter().any(|c| lower.contains(c))
    }
}

/// Every action with what came back, the first two and the last eight.
fn milestone_lines(acts: &[Action]) -> Vec<String> {
    keep_ends_of(acts, 2, 8, |a| {
        if a.result.is_empty() { a.what.clone() } else { format!("{} → {}", a.what, a.result) }
    })
}

/// The sentences of the assistant's texts that give a reason or a choice, made as they
/// are drawn.
fn decision_sentences<'a>(
    assistant_texts: &'a [Cow<'_, str>],
) -> impl Iterator<Item = String> + 'a {
    static CUES: LazyLock<AhoCorasick> = LazyLock::new(|| {
        AhoCorasick::new(DECISION_CUES)
            .unwrap_or_else(|e| unreachable!("the cues are plain words: {e}"))
    });
    assistant_texts
        .iter()
        .flat_map(|t| sentences(t).filter(|s| CUES.is_match(*s)).map(|s| clip(s, 200)))
}

/// What the fold covers (`messages` messages, `users` of them the user's words) and the
/// last action in it.
fn current_state(messages: usize, acts: &[Action], users: usize) -> Vec<String> {
    let calls = acts.len();
    let mut state = vec![format!(
        "This folds {messages} earlier messages: {calls} actions, {users} user messages."
    )];
    if let Some(last) = acts.last() {
        state.push(format!("My last action here: {}", last.what));
    }
    state
}

/// The questions (up to three) of the assistant's last text.
fn open_questions(assistant_texts: &[Cow<'_, str>]) -> Vec<String> {
    assistant_texts
        .last()
        .map(|t| {
            t.split_inclusive('?')
                .filter(|s| s.ends_with('?'))
                .map(|s| clip(s, 200))
                .take(3)
                .collect()
        })
        .unwrap_or_default()
}

/// The extractive goal history of `msgs` (whole turns, earlier digests included), within
/// about `max_tokens` tokens: the goal (the first user message), every user message in
/// order (human direction), the lines earlier digests recorded as achieved, as dead ends
/// and as constraints, and the actions of the turns (the engine adds the work trail).
pub fn goal_history(msgs: &[Arc<Message>], max_tokens: usize) -> String {
    let budget = max_tokens.max(64) * 3;
    let share = |pct: usize| budget * pct / 100;
    let users = || {
        (0..msgs.len())
            .filter(|&i| is_user_words(msgs, i))
            .map(|i| msgs[i].text())
            .filter(|t| t.len() <= USER_STATEMENT_MAX_CHARS)
            .map(|t| format!("The user: \"{}\"", clip(&t, 300)))
    };
    let goal = users().next();
    // What earlier digests recorded, by the section it was under.
    let (mut achieved, mut dead_ends, mut lasting) = (Vec::new(), Vec::new(), Vec::new());
    for m in msgs.iter().filter(|m| m.is_digest()) {
        let text = m.text();
        let mut into: Option<&mut Vec<String>> = None;
        for line in text.lines() {
            if let Some(title) = line.strip_prefix("## ") {
                use Section::*;
                into = match Section::from_title(title.trim()) {
                    Some(Milestones | Achieved | CurrentState) => Some(&mut achieved),
                    Some(Attempted | DeadEnds) => Some(&mut dead_ends),
                    Some(StandingFacts | LastingConstraints | HumanDirection) => Some(&mut lasting),
                    _ => None,
                };
            } else if let Some(list) = into.as_deref_mut() {
                let item = line.trim().trim_start_matches("- ").trim();
                if !item.is_empty() && !list.iter().any(|l: &String| l == item) {
                    list.push(item.to_owned());
                }
            }
        }
    }
    let acts = actions(msgs);
    let done: Vec<&Action> = acts.iter().filter(|a| !a.failed).collect();
    achieved.extend(keep_ends_of(&done, 2, 8, |a| format!("{} → {}", a.what, a.result)));
    dead_ends.extend(
        acts.iter().filter(|a| a.failed).map(|a| format!("{} failed: {}", a.what, a.result)),
    );

    let mut out = String::new();
    section(&mut out, Section::GoalArc.title(), goal, share(10));
    section(&mut out, Section::HumanDirection.title(), users(), share(30));
    section(&mut out, Section::Achieved.title(), keep_ends(achieved, 4, 12), share(22));
    section(&mut out, Section::DeadEnds.title(), keep_ends(dead_ends, 2, 6), share(10));
    section(&mut out, Section::LastingConstraints.title(), &lasting, share(10));
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn bullet_lines_lose_their_markers() {
        let got =
            bullet_lines("Keep:\n- test names\n* ids\n+ paths\n1. errors\n2) commands\nprose");
        assert_eq!(got, ["test names", "ids", "paths", "errors", "commands"]);
    }

    use super::*;
    use serde_json::json;

    use crate::model::messages_from as msgs;

    #[test]
    fn digest_lists_calls_failures_and_facts_in_order() {
        let m = msgs(json!([
            {"role":"user","content":"Fix the parser. Never touch the public API."},
            {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"run","arguments":"{\"command\":\"pytest tests/test_parser.py\"}"}}]},
            {"role":"tool","tool_call_id":"1","content":"FAILED tests/test_parser.py::test_empty - ValueError: empty"},
            {"role":"assistant","content":"The bug is in src/parser.py because empty input is not handled. Should I add a test?"}
        ]));
        let d = digest(&m, 800);
        let order = [
            "## Standing facts",
            "## Milestones",
            "## Key decisions",
            "## Findings",
            "## Attempted & abandoned",
            "## Current state",
            "## Open items",
        ];
        let mut last = 0;
        for title in order {
            let at = d.find(title).unwrap_or_else(|| panic!("{title} missing in\n{d}"));
            assert!(at >= last, "{title} out of order");
            last = at;
        }
        assert!(d.contains("Never touch the public API"));
        assert!(d.contains("run(command=pytest tests/test_parser.py)"));
        assert_eq!(d, digest(&m, 800), "deterministic");
    }

    #[test]
    fn digest_is_bounded() {
        let mut v = vec![json!({"role":"user","content":"go"})];
        for i in 0..500 {
            v.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"read","arguments":format!("{{\"path\":\"src/file_{i}.py\"}}")}}]}));
            v.push(json!({"role":"tool","tool_call_id":"x","content":format!("line one of {i}\n{}", "z ".repeat(2000))}));
        }
        let d = digest(&msgs(serde_json::Value::Array(v)), 500);
        assert!(d.len() <= 500 * 3 + 400, "{}", d.len());
        let empty = digest(&[], 500);
        assert!(!empty.contains("## Milestones"));
    }
}
