//! The work trail: what the agent did, derived from its actions alone.
//!
//! A fold takes the agent's old work out of its context; the trail keeps the exact
//! strings it needs to go on without redoing that work: the files it read, edited,
//! created and deleted, the commands it ran and how they ended, the tests it ran and
//! their last result, and the errors still open. Every entry comes from an action (a tool
//! call of any API, or a text-mode agent's command block) and that action's result, never
//! from system prompts, instructions or examples quoted in the task.
//!
//! One [`Trail`] per conversation is carried forward: each fold block stores the trail
//! of everything up to its end, and the next fold merges its region's actions into it
//! ([`Trail::record`]): a file keeps its last state, a command its last exit status, a
//! test its last result, an error stays until a later run of the same action succeeds.
//! [`Trail::render`] writes it as digest lines, one exact string per line, within a cap
//! that gives up read-only files (summarized by directory) first, then the oldest
//! commands, and edited files, failing tests and open errors last.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod action_result;
mod actions;
mod digest;
mod words;

pub use digest::{KEY_ARTIFACTS, complete, recall};

use action_result::ActionResult;
use actions::{Action, FileOp, call_actions, command_block, file_words, strings_of, text_actions};

use crate::model::{Message, Role, call_parts, is_observation};

/// What an entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A file or directory, as the agent wrote its path.
    File,
    /// A shell command (its first line), or a tool call with the arguments that name things.
    Command,
    /// A test, as the test runner named it.
    Test,
}

/// An entry's last state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// A file the agent named in its own words (its reasoning, code it wrote) without an
    /// action on it.
    Named,
    /// A file the agent read (viewed, listed, searched or ran).
    Read,
    /// A file the agent changed.
    Edited,
    /// A file the agent created (later edits leave it created).
    Created,
    /// A file the agent deleted.
    Deleted,
    /// A command that ended with this exit status.
    Exit(i64),
    /// A command whose result reported an error, without an exit status.
    Failed,
    /// A command whose result told neither status nor error.
    Ran,
    /// A test that passed.
    Passed,
    /// A test that failed (or errored).
    TestFailed,
}

impl State {
    /// True for the states that matter most: changed files and failing tests.
    fn is_lasting(self) -> bool {
        matches!(self, Self::Edited | Self::Created | Self::Deleted | Self::TestFailed)
    }
}

/// One entry of the trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// What it names.
    pub kind: Kind,
    /// The exact string: a path, a command's first line, a call, a test name.
    pub subject: String,
    /// Its last state.
    pub state: State,
    /// The first error line of its last action, while no later action superseded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The action that first named it (a sequence number of the conversation's actions).
    pub first: u32,
    /// The action that last touched it.
    pub last: u32,
}

/// The work trail of a conversation up to some message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trail {
    /// Entries in the order they were first named.
    pub entries: Vec<Entry>,
    /// Actions recorded so far (the next action's sequence number).
    #[serde(default)]
    pub actions: u32,
    /// The file a text-mode editor has open (SWE-agent's `open` / `create`), as the agent
    /// named it: its `edit` commands change that file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_file: Option<String>,
}

/// Entries a stored trail holds at most; past it the oldest read-only files, passing
/// tests and settled commands are forgotten first.
const MAX_ENTRIES: usize = 1500;
/// Longest subject kept, in characters.
pub(super) const MAX_SUBJECT: usize = 200;
/// Longest error line kept, in characters.
pub(super) const MAX_ERROR: usize = 160;
/// Lines of one result scanned for its status, error and tests.
pub(super) const MAX_RESULT_LINES: usize = 2000;
/// Passing tests one result may add (failing ones are all kept).
pub(super) const MAX_PASSED_PER_RESULT: usize = 30;
/// Lines of one command block parsed for the files it names.
pub(super) const MAX_COMMAND_LINES: usize = 200;

impl Trail {
    /// The trail of `msgs[..end]`, from nothing.
    pub fn of(msgs: &[Arc<Message>], end: usize) -> Self {
        let mut trail = Self::default();
        trail.record(msgs, 0, end);
        trail
    }

    /// Merges the actions of `msgs[start..end]` (and their results) into the trail.
    /// `msgs` is the whole conversation, so that a text-mode observation is known by the
    /// message before it.
    pub fn record(&mut self, msgs: &[Arc<Message>], start: usize, end: usize) {
        let end = end.min(msgs.len());
        let mut index: HashMap<(Kind, String), usize> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| ((e.kind, e.subject.clone()), i))
            .collect();
        let mut i = start;
        while i < end {
            let m = &msgs[i];
            if m.role() != Role::Assistant || m.is_digest() {
                i += 1;
                continue;
            }
            self.note_paths(m, &mut index);
            if m.makes_calls() {
                let mut j = i + 1;
                while j < msgs.len() && msgs[j].role().is_tool_result() {
                    j += 1;
                }
                let results = &msgs[i + 1..j.min(end).max(i + 1)];
                for (k, call) in m.tool_calls().iter().chain(m.function_call()).enumerate() {
                    let (id, name, args) = call_parts(call);
                    let result = results
                        .iter()
                        .find(|r| !id.is_empty() && r.tool_call_id() == Some(id))
                        .or_else(|| results.get(k))
                        .map(|r| r.text());
                    let actions = call_actions(name, args, &self.open_file);
                    let sole = actions.len() == 1;
                    for action in actions {
                        self.apply(action, result.as_deref(), sole, &mut index);
                    }
                }
                i = j;
                continue;
            }
            if let Some(block) = command_block(&m.text()) {
                let result =
                    (i + 1 < end && is_observation(msgs, i + 1)).then(|| msgs[i + 1].text());
                let actions = text_actions(&block, &self.open_file);
                let sole = actions.len() == 1;
                for action in actions {
                    self.apply(action, result.as_deref(), sole, &mut index);
                }
            }
            i += 1;
        }
        self.bound();
    }

    /// Adds the files an assistant message names in its own words (text and call
    /// arguments) and that no entry holds yet, as [`State::Named`].
    fn note_paths(&mut self, m: &Message, index: &mut HashMap<(Kind, String), usize>) {
        let mut text = m.text().into_owned();
        for call in m.tool_calls().iter().chain(m.function_call()) {
            let (_, _, args) = call_parts(call);
            match serde_json::from_str::<Value>(args) {
                Ok(v) => strings_of(&v, &mut text),
                Err(_) => text.push_str(args),
            }
            text.push('\n');
        }
        let seq = self.actions;
        for path in file_words(&text) {
            if !index.contains_key(&(Kind::File, path.to_owned())) {
                let entry = self.touch(Kind::File, path.to_owned(), seq, index);
                entry.state = State::Named;
            }
        }
    }

    /// The entry for `subject` of `kind`, if any.
    pub fn get(&self, kind: Kind, subject: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.kind == kind && e.subject == subject)
    }

    /// The files an assistant message reads, as its actions name them (for counting
    /// re-reads of folded files).
    pub fn reads_of(message: &Message, open_file: Option<&str>) -> Vec<String> {
        let open = open_file.map(str::to_owned);
        let actions = if message.makes_calls() {
            let calls = message.tool_calls().iter().chain(message.function_call());
            calls
                .flat_map(|c| {
                    let (_, name, args) = call_parts(c);
                    call_actions(name, args, &open)
                })
                .collect()
        } else {
            command_block(&message.text()).map(|b| text_actions(&b, &open)).unwrap_or_default()
        };
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::File { path, op: FileOp::Read } => Some(path),
                _ => None,
            })
            .collect()
    }

    /// Applies one action with its result text; `sole`: the result answers this action
    /// alone (a failed result then means its file change did not happen).
    fn apply(
        &mut self,
        action: Action,
        result: Option<&str>,
        sole: bool,
        index: &mut HashMap<(Kind, String), usize>,
    ) {
        let seq = self.actions;
        self.actions = self.actions.saturating_add(1);
        let outcome = result.map(ActionResult::of);
        match action {
            Action::OpenFile(path) => self.open_file = Some(path),
            Action::File { path, op } => {
                let failed =
                    sole && outcome.as_ref().is_some_and(|o| o.failed) && op != FileOp::Read;
                let error =
                    if failed { outcome.as_ref().and_then(|o| o.error.clone()) } else { None };
                let entry = self.touch(Kind::File, path, seq, index);
                entry.state = match (op, entry.state) {
                    _ if failed => entry.state,
                    (FileOp::Read, s @ (State::Edited | State::Created)) => s,
                    (FileOp::Read, _) => State::Read,
                    (FileOp::Edit, State::Created) => State::Created,
                    (FileOp::Edit, _) => State::Edited,
                    (FileOp::Create, _) => State::Created,
                    (FileOp::Delete, _) => State::Deleted,
                };
                if failed {
                    entry.error = error.or_else(|| Some("the change failed".to_owned()));
                } else if op != FileOp::Read {
                    entry.error = None;
                }
            }
            Action::Command { subject, tests, quiet } => {
                let outcome = outcome.unwrap_or_default();
                if quiet
                    && !outcome.failed
                    && !index.contains_key(&(Kind::Command, subject.clone()))
                {
                    return;
                }
                let state = match (outcome.exit, outcome.failed) {
                    (Some(code), _) => State::Exit(code),
                    (None, true) => State::Failed,
                    (None, false) => State::Ran,
                };
                let entry = self.touch(Kind::Command, subject, seq, index);
                entry.state = state;
                entry.error = if outcome.failed { outcome.error.clone() } else { None };
                if tests {
                    for (name, passed) in outcome.tests {
                        let entry = self.touch(Kind::Test, name, seq, index);
                        entry.state = if passed { State::Passed } else { State::TestFailed };
                    }
                }
            }
        }
    }

    /// The entry of `(kind, subject)`, inserted (state [`State::Ran`]) when new; its
    /// `last` set to `seq`.
    fn touch(
        &mut self,
        kind: Kind,
        subject: String,
        seq: u32,
        index: &mut HashMap<(Kind, String), usize>,
    ) -> &mut Entry {
        let at = match index.get(&(kind, subject.clone())) {
            Some(&at) => at,
            None => {
                let state = match kind {
                    Kind::File => State::Read,
                    Kind::Command => State::Ran,
                    Kind::Test => State::Passed,
                };
                self.entries.push(Entry {
                    kind,
                    subject: subject.clone(),
                    state,
                    error: None,
                    first: seq,
                    last: seq,
                });
                index.insert((kind, subject), self.entries.len() - 1);
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[at];
        entry.last = seq;
        entry
    }

    /// Forgets the least useful entries past [`MAX_ENTRIES`].
    fn bound(&mut self) {
        if self.entries.len() <= MAX_ENTRIES {
            return;
        }
        let mut order: Vec<usize> = (0..self.entries.len()).collect();
        order.sort_by_key(|&i| (priority(&self.entries[i]), self.entries[i].last));
        let excess = self.entries.len() - MAX_ENTRIES;
        let mut drop = vec![false; self.entries.len()];
        for &i in order.iter().take(excess) {
            drop[i] = true;
        }
        let mut k = 0;
        self.entries.retain(|_| {
            k += 1;
            !drop[k - 1]
        });
    }

    /// The entries that `since` does not hold with the same state and error (all of them
    /// without `since`).
    pub fn changed_since(&self, since: Option<&Trail>) -> Vec<&Entry> {
        let Some(since) = since else { return self.entries.iter().collect() };
        let old: HashMap<(Kind, &str), &Entry> =
            since.entries.iter().map(|e| ((e.kind, e.subject.as_str()), e)).collect();
        self.entries
            .iter()
            .filter(|e| {
                old.get(&(e.kind, e.subject.as_str()))
                    .is_none_or(|o| o.state != e.state || o.error != e.error)
            })
            .collect()
    }

    /// The digest lines of the entries that `since` (the trail the digests before this
    /// one carried) does not hold as they are now; every entry without `since`. Within
    /// about `max_chars`: over it, read-only files are summarized by directory (oldest
    /// first), then the oldest settled commands, passing tests, and at last changed
    /// files, failing tests and open errors are left out (oldest first), each with a line
    /// that says how many.
    pub fn render(&self, since: Option<&Trail>, max_chars: usize) -> Vec<String> {
        let fresh = self.changed_since(since);
        let mut shown: Vec<Shown<'_>> = fresh.iter().map(|e| Shown::Entry(e)).collect();
        let total = |shown: &[Shown<'_>]| shown.iter().map(|s| s.line().len() + 1).sum::<usize>();
        if total(&shown) > max_chars {
            shown = summarize_reads(shown, &|s| total(s) <= max_chars);
        }
        // Then leave out, oldest first, by priority.
        let mut omitted = [0usize; 3];
        while total(&shown) > max_chars {
            let victim = shown
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.entry().map(|e| (i, priority(e), e.last)))
                .min_by_key(|&(_, p, last)| (p, last));
            let Some((at, p, _)) = victim else { break };
            shown.remove(at);
            omitted[usize::from(p.min(2))] += 1;
            if !shown.iter().any(|s| matches!(s, Shown::Omitted(..))) {
                shown.push(Shown::Omitted(0, 0, 0));
            }
            if let Some(Shown::Omitted(a, b, c)) =
                shown.iter_mut().find(|s| matches!(s, Shown::Omitted(..)))
            {
                (*a, *b, *c) = (omitted[0], omitted[1], omitted[2]);
            }
            if shown.iter().all(|s| matches!(s, Shown::Omitted(..))) {
                break;
            }
        }
        // Files only named go on one line, after the files read.
        let named: Vec<&str> = shown
            .iter()
            .filter_map(Shown::entry)
            .filter(|e| e.kind == Kind::File && e.state == State::Named && e.error.is_none())
            .map(|e| e.subject.as_str())
            .collect();
        shown.retain(|s| {
            s.entry().is_none_or(|e| {
                !(e.kind == Kind::File && e.state == State::Named && e.error.is_none())
            })
        });
        if !named.is_empty() {
            shown.push(Shown::Named(named));
        }
        shown.sort_by_key(Shown::order);
        shown.iter().map(Shown::line).collect()
    }
}

/// How long an entry is kept when space is short: 0 goes first (read-only files, settled
/// commands, passing tests), 2 last (changed files, failing tests, open errors).
fn priority(e: &Entry) -> u8 {
    if e.error.is_some() || e.state.is_lasting() {
        2
    } else if e.kind == Kind::Command && matches!(e.state, State::Exit(c) if c != 0) {
        1
    } else {
        0
    }
}

/// One rendered line: an entry, a directory summary of read files, or a count of what
/// was left out.
enum Shown<'a> {
    Entry(&'a Entry),
    /// A directory, how many read files of it, the oldest's `first`.
    Directory(String, usize, u32),
    /// Left out: settled, failed commands, lasting entries.
    Omitted(usize, usize, usize),
    /// Files only named, on one line.
    Named(Vec<&'a str>),
}

impl<'a> Shown<'a> {
    fn entry(&self) -> Option<&'a Entry> {
        match self {
            Self::Entry(e) => Some(*e),
            _ => None,
        }
    }

    /// Where the line goes: changed files, failing tests, commands, read files and
    /// directories, passing tests; then the count of what was left out.
    fn order(&self) -> (u8, u32) {
        match self {
            Self::Entry(e) => {
                let group = match (e.kind, e.state) {
                    (Kind::File, State::Edited | State::Created | State::Deleted) => 0,
                    (Kind::File, _) if e.error.is_some() => 0,
                    (Kind::Test, State::TestFailed) => 1,
                    (Kind::Command, _) => 2,
                    (Kind::File, _) => 3,
                    (Kind::Test, _) => 4,
                };
                (group, e.first)
            }
            Self::Directory(_, _, first) => (3, *first),
            Self::Named(_) => (3, u32::MAX),
            Self::Omitted(..) => (5, 0),
        }
    }

    fn line(&self) -> String {
        match self {
            Self::Entry(e) => entry_line(e),
            Self::Directory(dir, n, _) => format!("- read: {dir} ({n} files)"),
            Self::Named(paths) => format!("- named: {}", paths.join(" ")),
            Self::Omitted(a, b, c) => {
                let mut parts = Vec::new();
                if *a > 0 {
                    parts.push(format!("{a} settled"));
                }
                if *b > 0 {
                    parts.push(format!("{b} failed commands"));
                }
                if *c > 0 {
                    parts.push(format!("{c} changed files, failing tests or errors"));
                }
                format!("- ({} older entries left out: {})", a + b + c, parts.join(", "))
            }
        }
    }
}

/// One entry as a digest line.
fn entry_line(e: &Entry) -> String {
    let mut line = match (e.kind, e.state) {
        (Kind::File, State::Edited) => format!("- edited: {}", e.subject),
        (Kind::File, State::Created) => format!("- created: {}", e.subject),
        (Kind::File, State::Deleted) => format!("- deleted: {}", e.subject),
        (Kind::File, _) => format!("- read: {}", e.subject),
        (Kind::Test, State::TestFailed) => format!("- test failed: {}", e.subject),
        (Kind::Test, _) => format!("- test passed: {}", e.subject),
        (Kind::Command, State::Exit(code)) => format!("- ran: {} → exit {code}", e.subject),
        (Kind::Command, State::Failed) => format!("- ran: {} → failed", e.subject),
        (Kind::Command, _) => format!("- ran: {}", e.subject),
    };
    if let Some(error) = &e.error {
        if e.kind == Kind::File {
            line.push_str(" (last change failed: ");
            line.push_str(error);
            line.push(')');
        } else {
            line.push_str(": ");
            line.push_str(error);
        }
    }
    line
}

/// Replaces read-only files by one line per directory, the directories of the oldest
/// reads first, until `fits`.
fn summarize_reads<'a>(
    mut shown: Vec<Shown<'a>>,
    fits: &dyn Fn(&[Shown<'a>]) -> bool,
) -> Vec<Shown<'a>> {
    let read_only = |s: &Shown<'_>| {
        s.entry().is_some_and(|e| {
            e.kind == Kind::File
                && matches!(e.state, State::Read | State::Named)
                && e.error.is_none()
        })
    };
    loop {
        if fits(&shown) {
            return shown;
        }
        let oldest = shown
            .iter()
            .filter(|s| read_only(s) && s.entry().is_some_and(|e| e.subject.contains('/')))
            .filter_map(Shown::entry)
            .min_by_key(|e| e.last)
            .map(|e| directory(&e.subject));
        let Some(dir) = oldest else { return shown };
        let (mut n, mut first) = (0, u32::MAX);
        shown.retain(|s| match s.entry() {
            Some(e) if read_only(s) && directory(&e.subject) == dir => {
                n += 1;
                first = first.min(e.first);
                false
            }
            _ => true,
        });
        match shown.iter_mut().find(|s| matches!(s, Shown::Directory(d, ..) if *d == dir)) {
            Some(Shown::Directory(_, count, f)) => {
                *count += n;
                *f = (*f).min(first);
            }
            _ => shown.push(Shown::Directory(dir, n, first)),
        }
    }
}

/// The directory of a path, with its trailing slash (empty for a bare name, which is
/// never summarized).
fn directory(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) => "/".to_owned(),
        Some(i) => format!("{}/", &trimmed[..i]),
        None => String::new(),
    }
}

pub(super) fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::messages_from as msgs;
    use serde_json::{Value, json};

    fn call(id: &str, name: &str, args: Value) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":name,"arguments":args.to_string()}}]})
    }

    fn result(id: &str, text: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":text})
    }

    fn state(trail: &Trail, kind: Kind, subject: &str) -> Option<State> {
        trail.get(kind, subject).map(|e| e.state)
    }

    #[test]
    fn a_file_keeps_its_last_state_and_an_edit_outlives_a_read() {
        let m = msgs(json!([
            {"role":"user","content":"Fix it. Example: cat file.txt"},
            call("1","str_replace_editor",json!({"command":"view","path":"src/a.py"})),
            result("1","def f(): pass"),
            call("2","str_replace_editor",json!({"command":"str_replace","path":"src/a.py","old_str":"x","new_str":"y"})),
            result("2","The file src/a.py has been edited."),
            call("3","str_replace_editor",json!({"command":"view","path":"src/a.py"})),
            result("3","def f(): return 1"),
            call("4","str_replace_editor",json!({"command":"create","path":"new.py","file_text":"x"})),
            result("4","File created successfully at: new.py"),
            call("5","str_replace_editor",json!({"command":"str_replace","path":"new.py","old_str":"x","new_str":"z"})),
            result("5","ok"),
            call("6","execute_bash",json!({"command":"rm old.py"})),
            result("6","[Command finished with exit code 0]"),
        ]));
        let t = Trail::of(&m, m.len());
        assert_eq!(state(&t, Kind::File, "src/a.py"), Some(State::Edited));
        assert_eq!(state(&t, Kind::File, "new.py"), Some(State::Created));
        assert_eq!(state(&t, Kind::File, "old.py"), Some(State::Deleted));
        // Nothing from the user's instructions.
        assert_eq!(t.get(Kind::File, "file.txt"), None);
    }

    #[test]
    fn a_rerun_command_keeps_its_last_status_and_a_fixed_test_its_last_result() {
        let m = msgs(json!([
            {"role":"user","content":"go"},
            call("1","bash",json!({"command":"pytest tests/test_a.py"})),
            result("1","FAILED tests/test_a.py::test_x - ValueError: bad\nE   ValueError: bad\n[Command finished with exit code 1]"),
            call("2","bash",json!({"command":"sed -i 's/a/b/' src/a.py"})),
            result("2","[Command finished with exit code 0]"),
            call("3","bash",json!({"command":"pytest tests/test_a.py"})),
            result("3","tests/test_a.py::test_x PASSED\n[Command finished with exit code 0]"),
        ]));
        let first = Trail::of(&m, 3);
        let cmd = first.get(Kind::Command, "pytest tests/test_a.py").unwrap();
        assert_eq!(cmd.state, State::Exit(1));
        assert!(cmd.error.as_deref().is_some_and(|e| e.contains("ValueError")), "{cmd:?}");
        assert_eq!(state(&first, Kind::Test, "tests/test_a.py::test_x"), Some(State::TestFailed));
        // Merged forward from the first trail, as a later fold does.
        let mut t = first.clone();
        t.record(&m, 3, m.len());
        assert_eq!(t, Trail::of(&m, m.len()), "merging equals recording at once");
        let cmd = t.get(Kind::Command, "pytest tests/test_a.py").unwrap();
        assert_eq!((cmd.state, cmd.error.clone()), (State::Exit(0), None), "the error is settled");
        assert_eq!(state(&t, Kind::Test, "tests/test_a.py::test_x"), Some(State::Passed));
        assert_eq!(state(&t, Kind::File, "src/a.py"), Some(State::Edited));
        // The sed script is not a file, and an edit needs no command line of its own.
        assert_eq!(t.get(Kind::File, "s/a/b/"), None);
        assert!(t.get(Kind::Command, "sed -i 's/a/b/' src/a.py").is_none());
        // Only what changed since the first trail is shown after it.
        let lines = t.render(Some(&first), 10_000);
        assert!(lines.contains(&"- ran: pytest tests/test_a.py → exit 0".to_owned()), "{lines:?}");
        assert!(lines.contains(&"- test passed: tests/test_a.py::test_x".to_owned()), "{lines:?}");
        assert!(lines.contains(&"- edited: src/a.py".to_owned()), "{lines:?}");
    }

    #[test]
    fn text_mode_commands_and_their_observations_are_actions() {
        let m = msgs(json!([
            {"role":"system","content":"Reply with one ```bash block, e.g.\n```bash\nyour_command_here newfile.py\n```"},
            {"role":"user","content":"<pr_description>Fix it</pr_description>"},
            {"role":"assistant","content":"THOUGHT: look at `src/pkg/io.py` first.\n\n```bash\ncat src/pkg/io.py | head -n 20\n```"},
            {"role":"user","content":"<returncode>0</returncode>\n<output>\nimport os\n</output>"},
            {"role":"assistant","content":"THOUGHT: write a script.\n\n```bash\ncat <<'EOF' > repro.py\nopen('/etc/placeholder.txt')\nEOF\npython repro.py\n```"},
            {"role":"user","content":"<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"repro.py\", line 1\nFileNotFoundError: no such file\n</output>"},
            {"role":"assistant","content":"Now edit.\n<command>\nopen src/pkg/io.py\n</command>"},
            {"role":"user","content":"[File: /repo/src/pkg/io.py (1 lines total)]\n(Open file: /repo/src/pkg/io.py)\n(Current directory: /repo)\nbash-$"},
            {"role":"assistant","content":"```\nedit 1:1\nimport sys\nend_of_edit\n```"},
            {"role":"user","content":"File updated.\n(Open file: /repo/src/pkg/io.py)\n(Current directory: /repo)\nbash-$"},
        ]));
        let t = Trail::of(&m, m.len());
        assert_eq!(state(&t, Kind::File, "repro.py"), Some(State::Created));
        assert_eq!(state(&t, Kind::File, "src/pkg/io.py"), Some(State::Edited));
        let run = t.get(Kind::Command, "cat <<'EOF' > repro.py").unwrap();
        assert_eq!(run.state, State::Exit(1));
        assert_eq!(run.error.as_deref(), Some("FileNotFoundError: no such file"));
        // The system prompt's example is nothing; a path in the code the agent wrote is
        // only named.
        for absent in ["newfile.py", "your_command_here"] {
            assert!(t.entries.iter().all(|e| !e.subject.contains(absent)), "{absent}: {t:?}");
        }
        assert_eq!(state(&t, Kind::File, "/etc/placeholder.txt"), Some(State::Named));
        assert!(t.get(Kind::Command, "cat src/pkg/io.py | head -n 20").is_none(), "a look");
    }

    #[test]
    fn calls_without_files_are_named_by_their_identifying_arguments() {
        let m = msgs(json!([
            {"role":"user","content":"cancel it"},
            call("1","cancel_reservation",json!({"reservation_id":"ZFA04Y"})),
            result("1","Error: reservation not found"),
            call("2","think",json!({"thought":"long thoughts"})),
            result("2",""),
        ]));
        let t = Trail::of(&m, m.len());
        let c = t.get(Kind::Command, "cancel_reservation(reservation_id=ZFA04Y)").unwrap();
        assert_eq!(c.state, State::Failed);
        assert_eq!(c.error.as_deref(), Some("Error: reservation not found"));
        assert!(t.get(Kind::Command, "think()").is_some());
    }

    fn entry(kind: Kind, subject: &str, state: State, error: Option<&str>, seq: u32) -> Entry {
        Entry {
            kind,
            subject: subject.to_owned(),
            state,
            error: error.map(str::to_owned),
            first: seq,
            last: seq,
        }
    }

    #[test]
    fn the_cap_summarizes_reads_by_directory_then_drops_old_commands_and_keeps_changes() {
        let mut t = Trail::default();
        for i in 0..20 {
            t.entries.push(entry(
                Kind::File,
                &format!("pkg/deep/mod_{i}.py"),
                State::Read,
                None,
                i,
            ));
        }
        for i in 20..40 {
            let cmd = format!("python -m pytest tests/test_{i}.py -x -q");
            t.entries.push(entry(Kind::Command, &cmd, State::Exit(0), None, i));
        }
        t.entries.push(entry(Kind::File, "pkg/core.py", State::Edited, None, 40));
        t.entries.push(entry(Kind::Test, "tests/t.py::test_y", State::TestFailed, None, 41));
        t.entries.push(entry(Kind::Command, "make", State::Exit(2), Some("error: boom"), 42));
        let full = t.render(None, usize::MAX);
        assert_eq!(full.len(), 43);
        let size = |lines: &[String]| lines.iter().map(|l| l.len() + 1).sum::<usize>();
        // A little over: the reads become one directory line, every command stays.
        let lines = t.render(None, size(&full) - 100);
        assert!(lines.contains(&"- read: pkg/deep/ (20 files)".to_owned()), "{lines:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("- ran: python")).count(), 20);
        // Much tighter: the oldest settled commands go, the newest stay.
        let lines = t.render(None, 700);
        assert!(size(&lines) <= 700, "{}", size(&lines));
        assert!(!lines.iter().any(|l| l.contains("tests/test_20.py")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("tests/test_39.py")), "{lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("- (") && l.contains("settled")), "{lines:?}");
        // Changed files, failing tests and open errors are the last to go.
        for kept in [
            "- edited: pkg/core.py",
            "- test failed: tests/t.py::test_y",
            "- ran: make → exit 2: error: boom",
        ] {
            assert!(lines.contains(&kept.to_owned()), "{kept}: {lines:?}");
        }
        let lines = t.render(None, 160);
        assert!(lines.contains(&"- ran: make → exit 2: error: boom".to_owned()), "{lines:?}");
        assert!(
            !lines.contains(&"- edited: pkg/core.py".to_owned()),
            "oldest lasting first: {lines:?}"
        );
    }

    #[test]
    fn a_summarizer_s_key_artifacts_are_checked_against_the_trail() {
        let mut t = Trail::default();
        t.entries.push(entry(Kind::File, "src/real.py", State::Edited, None, 0));
        let body = "## Findings\n- x\n\n## Key artifacts\n- src/real.py\n- /returncode\n- file.txt\n- `parse_config` raises KeyError\n- see src/real.py:10";
        let out = complete(body, &t, &["- edited: src/real.py".to_owned()]);
        assert!(out.starts_with("## Findings\n- x\n\n## Key artifacts\n"), "{out}");
        assert!(out.contains("- `parse_config` raises KeyError"), "{out}");
        assert!(out.contains("- see src/real.py:10"), "{out}");
        assert!(!out.contains("file.txt") && !out.contains("/returncode"), "{out}");
        assert!(out.ends_with("- edited: src/real.py"), "{out}");
        assert_eq!(out.matches(KEY_ARTIFACTS).count(), 1);
    }
}
