//! The actions of a message: what a tool call or a text-mode command block did to which
//! files, and which command it ran. Only the agent's own calls and commands are read.

use serde_json::Value;

use super::words::{is_path_word, names_file};
use super::{MAX_COMMAND_LINES, MAX_RESULT_LINES, MAX_SUBJECT, clip};

/// What an action did to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileOp {
    /// Read, viewed, listed, searched or run.
    Read,
    /// Changed.
    Edit,
    /// Made (or overwritten).
    Create,
    /// Removed.
    Delete,
}

/// One action, before its result is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// A file read, changed, made or removed.
    File { path: String, op: FileOp },
    /// A command or call; `tests`: its result may name tests; `quiet`: it only looked at
    /// files, so it is recorded only when it failed (or to settle an earlier failure).
    Command { subject: String, tests: bool, quiet: bool },
    /// A text-mode editor opened this file.
    OpenFile(String),
}

/// Argument keys whose string value names a file or directory.
pub(super) const PATH_KEYS: &[&str] = &[
    "path",
    "file",
    "file_path",
    "filepath",
    "filename",
    "file_name",
    "target_file",
    "dir",
    "directory",
    "dir_path",
    "notebook_path",
];
/// Argument keys whose string value is a shell command.
pub(super) const COMMAND_KEYS: &[&str] = &["command", "cmd", "script"];
/// Argument keys of free text (thoughts, file contents, replacement text): never named.
pub(super) const TEXT_KEYS: &[&str] = &[
    "thought",
    "summary",
    "file_text",
    "old_str",
    "new_str",
    "content",
    "text",
    "contents",
    "new_string",
    "old_string",
    "insert_line",
    "view_range",
    "replacement_text",
    "replace",
    "search",
];
/// Longest argument value shown in a call's subject.
pub(super) const MAX_ARG: usize = 80;

/// The actions of one tool call.
pub(super) fn call_actions(name: &str, args: &str, open_file: &Option<String>) -> Vec<Action> {
    let parsed: Option<serde_json::Map<String, Value>> = match serde_json::from_str(args) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    };
    let Some(map) = parsed else {
        // A free-form tool input: a patch (`apply_patch`), or nothing foldgate reads.
        let files = patch_files(args);
        if !files.is_empty() {
            return files;
        }
        return vec![Action::Command { subject: format!("{name}()"), tests: false, quiet: false }];
    };
    let str_arg = |k: &str| map.get(k).and_then(Value::as_str);
    let path = PATH_KEYS.iter().find_map(|k| str_arg(k)).map(str::trim).filter(|p| !p.is_empty());
    // An editor tool: a sub-command and a path (str_replace_editor, text editors).
    if let (Some(sub), Some(path)) = (str_arg("command"), path) {
        if let Some(op) = editor_op(sub) {
            return vec![Action::File { path: path.to_owned(), op }];
        }
    }
    // A shell: its command line, parsed.
    if let Some(command) = shell_command_arg(&map) {
        let mut out = shell_actions(&command, open_file);
        if let Some(path) = path {
            out.push(Action::File { path: path.to_owned(), op: FileOp::Read });
        }
        return out;
    }
    if let Some(patch) = ["patch", "input", "diff"].iter().find_map(|k| str_arg(k)) {
        let files = patch_files(patch);
        if !files.is_empty() {
            return files;
        }
    }
    file_tool_actions(name, &map, open_file)
}

/// The shell command line of a call's arguments: the first [`COMMAND_KEYS`] value that is
/// a string, or an argument vector (joined with spaces).
fn shell_command_arg(map: &serde_json::Map<String, Value>) -> Option<String> {
    COMMAND_KEYS.iter().find_map(|k| match map.get(*k) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(argv)) => {
            let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
            (!words.is_empty()).then(|| words.join(" "))
        }
        _ => None,
    })
}

/// What an editor tool's sub-command (`view`, `create`, `str_replace`, ...) does to its
/// path; `None` for one that is not an editor's.
fn editor_op(sub: &str) -> Option<FileOp> {
    match sub {
        "view" | "read" | "open" => Some(FileOp::Read),
        "create" | "write" => Some(FileOp::Create),
        "str_replace" | "insert" | "undo_edit" | "edit" | "replace" | "append" => {
            Some(FileOp::Edit)
        }
        "delete" | "remove" => Some(FileOp::Delete),
        _ => None,
    }
}

/// The actions of a call that is neither an editor, a shell nor a patch: what a file
/// tool's name says it does to the files its arguments name, and the call itself (its
/// name and short naming arguments) unless it changed files.
fn file_tool_actions(
    name: &str,
    map: &serde_json::Map<String, Value>,
    open_file: &Option<String>,
) -> Vec<Action> {
    let lower = name.to_ascii_lowercase();
    let str_arg = |k: &str| map.get(k).and_then(Value::as_str);
    let mut out = Vec::new();
    // A file tool: what its name says it does to the files its arguments name.
    let op = file_op_of_tool(&lower);
    let mut paths: Vec<&str> = PATH_KEYS.iter().filter_map(|k| str_arg(k)).collect();
    if let Some(Value::Array(list)) = map.get("paths").or_else(|| map.get("files")) {
        paths.extend(list.iter().filter_map(Value::as_str));
    }
    if ["open", "create"].contains(&lower.as_str()) {
        if let Some(p) = paths.first() {
            out.push(Action::OpenFile((*p).to_owned()));
        }
    }
    if matches!(lower.as_str(), "edit" | "insert") {
        if let Some(p) = open_file {
            out.push(Action::File { path: p.clone(), op: FileOp::Edit });
            return out;
        }
    }
    for p in paths.iter().map(|p| p.trim()).filter(|p| !p.is_empty() && p.len() <= MAX_SUBJECT) {
        out.push(Action::File { path: p.to_owned(), op });
    }
    if !out.is_empty() && op != FileOp::Read {
        return out;
    }
    // Any other call: its name and the short arguments that name things.
    let named = naming_args(map);
    if out.is_empty() || !named.is_empty() {
        out.push(Action::Command {
            subject: format!("{name}({})", named.join(", ")),
            tests: false,
            quiet: false,
        });
    }
    out
}

/// Up to four `key=value` arguments of a call that name things: short one-line strings,
/// numbers and booleans, neither free text nor paths.
fn naming_args(map: &serde_json::Map<String, Value>) -> Vec<String> {
    map.iter()
        .filter(|(k, _)| !TEXT_KEYS.contains(&k.as_str()) && !PATH_KEYS.contains(&k.as_str()))
        .filter_map(|(k, v)| {
            let v = match v {
                Value::String(s) if !s.contains('\n') && s.chars().count() <= MAX_ARG => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some(format!("{k}={v}"))
        })
        .take(4)
        .collect()
}

/// What a file tool does by its name (`write_file`, `delete_file`, `read_file`).
pub(super) fn file_op_of_tool(lower: &str) -> FileOp {
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if has(&["delete", "remove", "unlink"]) {
        FileOp::Delete
    } else if has(&["create", "write", "new_file", "save"]) {
        FileOp::Create
    } else if has(&["edit", "replace", "insert", "patch", "update", "modify", "append"]) {
        FileOp::Edit
    } else {
        FileOp::Read
    }
}

/// The files a patch names: `*** Add File:` / `*** Update File:` / `*** Delete File:`
/// (the `apply_patch` format) and unified diffs (`+++ b/path`).
pub(super) fn patch_files(patch: &str) -> Vec<Action> {
    let mut out = Vec::new();
    for line in patch.lines().take(MAX_RESULT_LINES) {
        let file = |op, rest: &str| Action::File { path: rest.trim().to_owned(), op };
        if let Some(rest) = line.strip_prefix("*** Add File: ") {
            out.push(file(FileOp::Create, rest));
        } else if let Some(rest) = line.strip_prefix("*** Update File: ") {
            out.push(file(FileOp::Edit, rest));
        } else if let Some(rest) = line.strip_prefix("*** Delete File: ") {
            out.push(file(FileOp::Delete, rest));
        } else if let Some(rest) = line.strip_prefix("*** Move to: ") {
            out.push(file(FileOp::Create, rest));
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            let path = rest.split('\t').next().unwrap_or("").trim();
            let path = path.strip_prefix("b/").unwrap_or(path);
            if path != "/dev/null" && !path.is_empty() {
                out.push(file(FileOp::Edit, path));
            }
        }
    }
    out.retain(
        |a| matches!(a, Action::File { path, .. } if !path.is_empty() && path.len() <= MAX_SUBJECT),
    );
    out
}

/// The command of a text-mode agent's message: its first fenced block that is a shell
/// block (```` ```bash ````, ```` ```sh ````, or no language), or a `<command>` element.
pub(super) fn command_block(text: &str) -> Option<String> {
    let mut lines = text.lines();
    let mut fenced: Option<Vec<&str>> = None;
    while let Some(l) = lines.next() {
        let t = l.trim();
        if let Some(lang) = t.strip_prefix("```") {
            let lang = lang.trim();
            if matches!(lang, "" | "bash" | "sh" | "shell" | "console" | "zsh") {
                let mut body = Vec::new();
                for b in lines.by_ref() {
                    if b.trim_start().starts_with("```") {
                        break;
                    }
                    body.push(b);
                }
                fenced = Some(body);
                break;
            }
            // Another language's block: skip it.
            for b in lines.by_ref() {
                if b.trim_start().starts_with("```") {
                    break;
                }
            }
        } else if t == "<command>" {
            let mut body = Vec::new();
            for b in lines.by_ref() {
                if b.trim() == "</command>" {
                    break;
                }
                body.push(b);
            }
            fenced = Some(body);
            break;
        }
    }
    let body = fenced?.join("\n");
    let body = body.trim_matches('\n');
    (!body.trim().is_empty()).then(|| body.to_owned())
}

/// The actions of a text-mode command block: an editor command of SWE-agent's interface
/// (`open`, `create`, `edit`, `goto`, `scroll_*`), else shell commands.
pub(super) fn text_actions(block: &str, open_file: &Option<String>) -> Vec<Action> {
    let first = block.lines().next().unwrap_or("").trim();
    let words: Vec<&str> = first.split_whitespace().collect();
    match words.as_slice() {
        ["open", path, ..] | ["create", path, ..] => {
            let path = unquote(path);
            let op = if words[0] == "create" { FileOp::Create } else { FileOp::Read };
            vec![Action::OpenFile(path.clone()), Action::File { path, op }]
        }
        ["edit", ..] | ["insert", ..] | ["append", ..] => open_file
            .as_ref()
            .map(|p| vec![Action::File { path: p.clone(), op: FileOp::Edit }])
            .unwrap_or_default(),
        ["goto", ..] | ["scroll_up"] | ["scroll_down"] | ["submit"] => Vec::new(),
        _ => shell_actions(block, open_file),
    }
}

pub(super) fn unquote(w: &str) -> String {
    w.trim_matches(|c| c == '"' || c == '\'').to_owned()
}

/// The actions of a shell command line (several lines, pipes and lists): the files its
/// simple commands read, write, create and delete, and the command itself (its first
/// line) unless all it did was look at files.
pub(super) fn shell_actions(command: &str, open_file: &Option<String>) -> Vec<Action> {
    let mut out = Vec::new();
    let mut only_looks = true;
    let mut tests = false;
    let mut heredoc: Option<String> = None;
    let mut pending = String::new();
    for raw in command.lines().take(MAX_COMMAND_LINES) {
        if let Some(end) = &heredoc {
            if raw.trim() == end {
                heredoc = None;
            }
            continue;
        }
        if let Some(stripped) = raw.strip_suffix('\\') {
            pending.push_str(stripped);
            pending.push(' ');
            continue;
        }
        pending.push_str(raw);
        let line = std::mem::take(&mut pending);
        let tokens = shell_tokens(&line);
        for simple in tokens.split(|t| matches!(t, Token::Sep)) {
            let summary = simple_command(simple, &line, open_file, &mut out, &mut heredoc);
            only_looks &= summary.looks;
            tests |= summary.tests;
        }
    }
    let first = command.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let subject = clip(first, MAX_SUBJECT);
    if !subject.is_empty() {
        out.push(Action::Command { subject, tests, quiet: only_looks });
    }
    out
}

/// A piece of a shell line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// A word, quotes removed.
    Word(String),
    /// `>`, `>>`, `<` or `<<` (with an optional file descriptor before it).
    Redirect(&'static str),
    /// `;`, `&&`, `||`, `|`, `&`: the end of a simple command.
    Sep,
}

/// Splits a shell line into words, redirections and separators (quotes, backslashes and
/// comments handled; expansions left as written).
pub(super) fn shell_tokens(line: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        chars: line.chars().peekable(),
        out: Vec::new(),
        word: String::new(),
        in_word: false,
    };
    while let Some(c) = lexer.chars.next() {
        match c {
            '\'' => lexer.single_quoted(),
            '"' => lexer.double_quoted(),
            '\\' => lexer.escaped(),
            '#' if !lexer.in_word => break,
            ' ' | '\t' => lexer.flush(),
            ';' | '|' | '&' => lexer.separator(c),
            '>' | '<' => lexer.redirection(c),
            '(' | ')' if !lexer.in_word => lexer.flush(),
            _ => {
                lexer.in_word = true;
                lexer.word.push(c);
            }
        }
    }
    lexer.flush();
    lexer.out
}

/// The state of [`shell_tokens`] along a line: what is left of it, the tokens so far and
/// the word being read.
struct Lexer<'l> {
    /// The rest of the line.
    chars: std::iter::Peekable<std::str::Chars<'l>>,
    /// The tokens so far.
    out: Vec<Token>,
    /// The word being read, quotes removed.
    word: String,
    /// A word is being read (also an empty one, `''`).
    in_word: bool,
}

impl Lexer<'_> {
    /// Ends the word being read, if any.
    fn flush(&mut self) {
        if self.in_word {
            self.out.push(Token::Word(std::mem::take(&mut self.word)));
            self.in_word = false;
        }
    }

    /// After `'`: the text up to the closing quote, as it is.
    fn single_quoted(&mut self) {
        self.in_word = true;
        for q in self.chars.by_ref() {
            if q == '\'' {
                break;
            }
            self.word.push(q);
        }
    }

    /// After `"`: the text up to the closing quote, backslashes removed.
    fn double_quoted(&mut self) {
        self.in_word = true;
        while let Some(q) = self.chars.next() {
            match q {
                '"' => break,
                '\\' => {
                    if let Some(n) = self.chars.next() {
                        self.word.push(n);
                    }
                }
                _ => self.word.push(q),
            }
        }
    }

    /// After `\`: the next character, as it is.
    fn escaped(&mut self) {
        self.in_word = true;
        if let Some(n) = self.chars.next() {
            self.word.push(n);
        }
    }

    /// After `;`, `|` or `&` (`c`): a separator (doubled or not), or part of a
    /// redirection (`2>&1`, `&>`).
    fn separator(&mut self, c: char) {
        // `2>&1`, `&>`: part of a redirection, not a separator.
        if c == '&' && matches!(self.out.last(), Some(Token::Redirect(_))) && !self.in_word {
            while self.chars.peek().is_some_and(char::is_ascii_digit) {
                self.chars.next();
            }
            self.out.pop();
            return;
        }
        self.flush();
        if c == '&' && self.chars.peek() == Some(&'>') {
            self.chars.next();
            self.out.push(Token::Redirect(">"));
            return;
        }
        if self.chars.peek() == Some(&c) {
            self.chars.next();
        }
        self.out.push(Token::Sep);
    }

    /// After `>` or `<` (`c`): a redirection (`>`, `>>`, `<`, `<<`, `<<-`, or the
    /// here-string `<<<`).
    fn redirection(&mut self, c: char) {
        // A file descriptor right before it (`2>`) is not a word.
        if self.in_word && self.word.chars().all(|d| d.is_ascii_digit()) {
            self.word.clear();
            self.in_word = false;
        }
        self.flush();
        let op = if self.chars.peek() == Some(&c) {
            self.chars.next();
            if c == '>' { ">>" } else { "<<" }
        } else if c == '>' {
            ">"
        } else {
            "<"
        };
        if op == "<<" && self.chars.peek() == Some(&'<') {
            // A here-string: its word is text, not a file.
            self.chars.next();
            self.out.push(Token::Redirect("<<<"));
            return;
        }
        if self.chars.peek() == Some(&'-') && op == "<<" {
            self.chars.next();
        }
        self.out.push(Token::Redirect(op));
    }
}

/// What a simple command was.
#[derive(Debug, Clone, Copy)]
pub(super) struct Simple {
    /// It only looked at files (`cat`, `ls`, `sed -n`) or only changed them (`sed -i`,
    /// `touch`, `rm`): its file entries say it all, so it needs no command entry of its own
    /// unless it failed.
    looks: bool,
    /// It ran tests.
    tests: bool,
}

/// Commands that only look at the files they name.
pub(super) const LOOKERS: &[&str] = &[
    "cat", "head", "tail", "less", "more", "nl", "ls", "tree", "wc", "file", "stat", "bat", "view",
    "pwd", "echo", "cd",
];
/// Commands whose first operand is a pattern or program, not a file.
pub(super) const PATTERN_FIRST: &[&str] =
    &["grep", "egrep", "fgrep", "rg", "ag", "ack", "awk", "search_file", "search_dir"];
/// Commands that run tests.
pub(super) const TEST_RUNNERS: &[&str] =
    &["pytest", "py.test", "tox", "nosetests", "runtests.py", "test"];

/// Records the file actions of one simple command of `line` into `out`. A path is taken
/// only as `line` writes it (not one that quotes or escapes joined).
pub(super) fn simple_command(
    tokens: &[Token],
    line: &str,
    open_file: &Option<String>,
    out: &mut Vec<Action>,
    heredoc: &mut Option<String>,
) -> Simple {
    let words = command_words(tokens, line, out, heredoc);
    let words = &words[wrapper_words(&words)..];
    let Some((&verb, args)) = words.split_first() else {
        return Simple { looks: true, tests: false };
    };
    let base = verb.rsplit('/').next().unwrap_or(verb);
    let command = Invocation { base, args, operands: operands(base, args), line };
    let tests = runs_tests(base, args);
    let (looks, tests_named) = match file_changer(&command, out) {
        Some(looks) => (looks, false),
        None => other_command(&command, open_file, out),
    };
    Simple { looks, tests: tests || tests_named }
}

/// The words of a simple command, with the files its redirections read and write
/// recorded into `out` and the end word of a here-document into `heredoc`.
fn command_words<'t>(
    tokens: &'t [Token],
    line: &str,
    out: &mut Vec<Action>,
    heredoc: &mut Option<String>,
) -> Vec<&'t str> {
    let mut words: Vec<&str> = Vec::new();
    let mut redirect: Option<&str> = None;
    for t in tokens {
        match (t, redirect.take()) {
            (Token::Word(w), Some(op)) => match op {
                "<<" => *heredoc = Some(w.clone()),
                "<<<" => {}
                "<" if is_path_word(w) && line.contains(w.as_str()) => {
                    out.push(Action::File { path: w.clone(), op: FileOp::Read });
                }
                ">" | ">>" if is_path_word(w) && line.contains(w.as_str()) => {
                    let op = if op == ">" { FileOp::Create } else { FileOp::Edit };
                    out.push(Action::File { path: w.clone(), op });
                }
                _ => {}
            },
            (Token::Word(w), None) => words.push(w),
            (Token::Redirect(op), _) => redirect = Some(op),
            (Token::Sep, _) => {}
        }
    }
    words
}

/// How many leading words only wrap the command: assignments, sudo, env, timeout N,
/// time, nohup.
fn wrapper_words(words: &[&str]) -> usize {
    let mut k = 0;
    while k < words.len() {
        let w = words[k];
        let assignment = w.contains('=') && !w.starts_with('-') && !w.starts_with('=');
        if assignment || matches!(w, "sudo" | "env" | "time" | "nohup" | "exec" | "command") {
            k += 1;
        } else if w == "timeout" {
            k += 2;
        } else {
            break;
        }
    }
    k.min(words.len())
}

/// The operands of a command `base` called with `args`: the words that are not options
/// nor an option's value.
fn operands<'a>(base: &str, args: &[&'a str]) -> Vec<&'a str> {
    let valued: &[&str] = match base {
        _ if PATTERN_FIRST.contains(&base) => &["-A", "-B", "-C", "-m", "--max-count", "-g", "-t"],
        "head" | "tail" => &["-n", "-c"],
        "sed" => &["-l"],
        "git" => &["-C", "-c"],
        "find" => &[],
        _ => &[],
    };
    let mut operands: Vec<&str> = Vec::new();
    let mut skip_next = false;
    for a in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        if a.starts_with('-') {
            skip_next = valued.contains(a);
        } else {
            operands.push(a);
        }
    }
    operands
}

/// True for a command that runs tests by its name and first arguments (`pytest`,
/// `python -m pytest`, `cargo test`).
fn runs_tests(base: &str, args: &[&str]) -> bool {
    TEST_RUNNERS.contains(&base)
        || (base.starts_with("python") && args.windows(2).any(|w| w == ["-m", "pytest"]))
        || (matches!(base, "cargo" | "go" | "npm" | "yarn" | "make")
            && args.first() == Some(&"test"))
}

/// One simple command: its verb's base name, its arguments and operands, and the line
/// it was written on.
struct Invocation<'a> {
    /// The verb without its directory (`python3`, not `/usr/bin/python3`).
    base: &'a str,
    /// The words after the verb.
    args: &'a [&'a str],
    /// The arguments that are neither options nor an option's value.
    operands: Vec<&'a str>,
    /// The line the command was written on.
    line: &'a str,
}

impl Invocation<'_> {
    /// Records into `out` the words of `paths` that name files as `line` writes them,
    /// each as done by `op`.
    fn files(&self, paths: &[&str], op: FileOp, out: &mut Vec<Action>) {
        for p in paths.iter().filter(|p| is_path_word(p) && self.line.contains(**p)) {
            out.push(Action::File { path: (*p).to_owned(), op });
        }
    }

    /// The operands after the first `skip`.
    fn operands_after(&self, skip: usize) -> Vec<&str> {
        self.operands.iter().skip(skip).copied().collect()
    }
}

/// Records the files of a command that only changes files or looks at them with a
/// script (`sed`, `perl`, `touch`, `rm`, `mkdir`, `mv`, `cp`, `tee`); whether it only
/// looks, or `None` for any other command.
fn file_changer(c: &Invocation<'_>, out: &mut Vec<Action>) -> Option<bool> {
    match c.base {
        "sed" | "perl" => {
            let in_place = c
                .args
                .iter()
                .any(|a| a.starts_with("-i") || a.starts_with("-pi") || *a == "--in-place");
            let scripted = c.args.iter().any(|a| *a == "-e" || *a == "-f");
            let rest = c.operands_after(usize::from(!scripted));
            c.files(&rest, if in_place { FileOp::Edit } else { FileOp::Read }, out);
        }
        "touch" => c.files(&c.operands, FileOp::Create, out),
        "rm" | "unlink" => c.files(&c.operands, FileOp::Delete, out),
        "mkdir" | "chmod" | "chown" => {}
        "mv" | "cp" => {
            if let Some((last, sources)) = c.operands.split_last() {
                c.files(sources, if c.base == "mv" { FileOp::Delete } else { FileOp::Read }, out);
                c.files(&[last], FileOp::Create, out);
            }
        }
        "tee" => c.files(&c.operands, FileOp::Edit, out),
        _ => return None,
    }
    Some(true)
}

/// Records the files of any other command (interpreters, `find`, `git`, an editor's
/// commands, searches, lookers); whether it only looks, and whether its operands name a
/// test runner.
fn other_command(
    c: &Invocation<'_>,
    open_file: &Option<String>,
    out: &mut Vec<Action>,
) -> (bool, bool) {
    let (base, args) = (c.base, c.args);
    match base {
        "python" | "python3" | "python2" | "node" | "ruby" | "bash" | "sh" => {
            if args.first().is_some_and(|a| *a == "-c" || *a == "-m" || *a == "-e") {
                c.files(&c.operands_after(1), FileOp::Read, out);
            } else {
                c.files(&c.operands, FileOp::Read, out);
            }
        }
        "find" => {
            let roots: Vec<&str> =
                args.iter().take_while(|a| !a.starts_with('-')).copied().collect();
            c.files(&roots, FileOp::Read, out);
        }
        "git" => {
            let sub = c.operands.first().copied().unwrap_or("");
            let op = match sub {
                "checkout" | "restore" => FileOp::Edit,
                "rm" => FileOp::Delete,
                _ => FileOp::Read,
            };
            c.files(&c.operands_after(1), op, out);
            return (matches!(sub, "diff" | "status" | "log" | "show"), false);
        }
        "open" | "create" if !args.is_empty() => {
            let op = if base == "create" { FileOp::Create } else { FileOp::Read };
            let path = c.operands.first().copied().unwrap_or(args[0]).to_owned();
            out.push(Action::OpenFile(path.clone()));
            out.push(Action::File { path, op });
            return (base == "open", false);
        }
        "edit" | "insert" | "append" => {
            if let Some(p) = open_file {
                out.push(Action::File { path: p.clone(), op: FileOp::Edit });
            }
        }
        "goto" | "scroll_up" | "scroll_down" | "submit" => return (true, false),
        _ if PATTERN_FIRST.contains(&base) => {
            let scripted = args.iter().any(|a| *a == "-e" || *a == "-f");
            c.files(&c.operands_after(usize::from(!scripted)), FileOp::Read, out);
        }
        _ => {
            c.files(&c.operands, FileOp::Read, out);
            let tests =
                c.operands.iter().any(|o| o.ends_with("runtests.py") || o.ends_with("bin/test"));
            return (LOOKERS.contains(&base), tests);
        }
    }
    (false, false)
}

/// Every string inside a JSON value, appended to `out` one per line.
pub(super) fn strings_of(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(a) => a.iter().for_each(|x| strings_of(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings_of(x, out)),
        _ => {}
    }
}

/// The words of `text` that name files (see [`names_file`]), in order, each once; not a
/// closing tag (`</code>`) nor a URL.
pub(super) fn file_words(text: &str) -> Vec<&str> {
    let path_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '~' | '+' | '@');
    let mut out: Vec<&str> = Vec::new();
    let mut start: Option<usize> = None;
    fn take<'t>(text: &'t str, from: usize, to: usize, out: &mut Vec<&'t str>) {
        if text[..from].ends_with('<')
            || text[to..].starts_with("://")
            || text[..from].ends_with(':')
        {
            return;
        }
        let w = text[from..to].trim_end_matches(['.', '-']);
        if names_file(w) && !is_script(w) && w.len() <= MAX_SUBJECT && !out.contains(&w) {
            out.push(w);
        }
    }
    for (i, c) in text.char_indices() {
        match (path_char(c), start) {
            (true, None) => start = Some(i),
            (false, Some(from)) => {
                take(text, from, i, &mut out);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        take(text, from, text.len(), &mut out);
    }
    out
}

/// True for a `sed` or `ed` script rather than a path: `s/old/new/g`, `/pattern/p`.
pub(super) fn is_script(w: &str) -> bool {
    w.starts_with("s/") || ["/g", "/p", "/d", "/i", "/gp"].iter().any(|end| w.ends_with(end))
}
