//! A chat request's outline: where its top-level fields and its messages lie in the body,
//! found by a structural scan that skips string contents with `memchr` instead of
//! parsing them. It is enough to tell that a request is far below the compaction
//! trigger (its model, reply reserve, tools and the size of each message), which is
//! most requests, at a fraction of the cost of [`crate::model::ChatRequest::parse`].
//!
//! The scan does not validate the JSON: the body is forwarded as received either way,
//! and the provider judges it. Anything unusual (a key with escapes, a body that is not
//! an object, unbalanced brackets) gives `None`, and the caller parses properly.

mod kept;

pub use kept::Memo;

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;

use crate::model::Role;

/// The outline of a chat-completions body.
pub struct Outline<'a> {
    body: &'a [u8],
    /// The top-level keys as written (not checked as UTF-8: a key that is not is no
    /// key foldgate reads) and where their values lie.
    fields: Vec<(&'a [u8], Range<usize>)>,
    messages: Vec<MessageOutline>,
    /// The kept outline the scan resumed from (see `kept`): how far the bodies agree,
    /// and its memo.
    resumed: Option<Resumed>,
    /// Where this outline was kept for the bodies that continue it.
    kept_at: Option<kept::KeptAt>,
    /// The `model` field's name, found with the fields (the decision, the budget and
    /// the session key all ask for it).
    model: ModelAt<'a>,
}

/// Where a body's model name lies.
#[derive(Debug, Clone)]
enum ModelAt<'a> {
    /// No `model` field, or a string of it that is not UTF-8.
    Absent,
    /// A string without escapes: the name is its text, checked once.
    Plain(&'a str),
    /// Anything else: the field's raw value, parsed each time.
    Raw(&'a [u8]),
}

/// What the body holds: its fields and messages (not how it was scanned, which a kept
/// and a fresh scan of the same body differ in).
impl std::fmt::Debug for Outline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outline")
            .field("fields", &self.fields)
            .field("messages", &self.messages)
            .finish_non_exhaustive()
    }
}

/// What the raw value of a `model` field names.
fn model_at(raw: &[u8]) -> ModelAt<'_> {
    // A name without escapes is its bytes between the quotes.
    let plain = raw.strip_prefix(b"\"").and_then(|r| r.strip_suffix(b"\""));
    let plain = plain.filter(|inner| !inner.iter().any(|&b| b == b'\\' || b == b'"' || b < 0x20));
    match plain.map(std::str::from_utf8) {
        Some(Ok(name)) => ModelAt::Plain(name),
        Some(Err(_)) => ModelAt::Absent,
        None => ModelAt::Raw(raw),
    }
}

/// What a resumed scan knows of the kept outline it resumed from.
#[derive(Debug, Clone, Copy)]
struct Resumed {
    /// The bodies' first `end` bytes are the same.
    end: usize,
    /// The kept outline's memo.
    memo: Option<Memo>,
}

/// Where one message lies, and what the scan saw of it.
#[derive(Debug, Clone)]
pub struct MessageOutline {
    /// Its extent in the body.
    pub range: Range<usize>,
    /// Its `role`, when it is a plain string.
    pub role: Option<Role>,
    /// Strings in it that are exactly `image_url` (an image part names it twice).
    pub image_mentions: usize,
    /// Strings in it that are exactly `arguments` (every call names it once).
    pub call_mentions: usize,
    /// Strings in it that are exactly `file_data` (a file part with inline data, which
    /// may be a PDF counted by its pages rather than its bytes).
    pub file_mentions: usize,
    /// Strings in it that are exactly `cache_control` (a prompt-cache breakpoint names
    /// it once).
    pub breakpoint_mentions: usize,
}

impl<'a> Outline<'a> {
    /// Scans `body`; `None` when it is not a JSON object with a `messages` array whose
    /// elements are objects, or when the scan meets anything it does not expect.
    pub fn scan(body: &'a [u8]) -> Option<Self> {
        Self::scan_with(body, true, None)
    }

    /// [`Outline::scan`] of a request's body, which this thread keeps with its outline
    /// for the bodies that continue it: a body that starts as a kept one, up to the end
    /// of its last message, is scanned only from there (see `kept`). The same outline
    /// as [`Outline::scan`]'s.
    pub fn scan_kept(body: &'a Bytes) -> Option<Self> {
        Self::scan_with(body, true, Some(body))
    }

    /// Scans the top-level fields of a JSON object body of another shape (no `messages`
    /// are read: [`Outline::messages`] is empty); `None` when the scan meets anything it
    /// does not expect.
    pub fn scan_fields(body: &'a [u8]) -> Option<Self> {
        Self::scan_with(body, false, None)
    }

    fn scan_with(body: &'a [u8], read_messages: bool, shared: Option<&Bytes>) -> Option<Self> {
        let mut scan = Scanner { body, pos: 0, mentions: Mentions::default() };
        // Room for a request's usual top-level fields: grown once, not three times.
        let mut fields = Vec::with_capacity(8);
        let mut messages = None;
        // Where the `messages` array opened, and the fields before it (see `kept`).
        let mut opened = None;
        // A body that starts as one scanned before on this thread, up to the end of that
        // one's last message: its scan goes on from there.
        let resumed = if read_messages && shared.is_some() { kept::resume(body) } else { None };
        let mut resuming = resumed.is_some();
        let agreed = resumed.as_ref().map(|r| Resumed { end: r.end, memo: r.memo });
        if let Some(resumed) = resumed {
            for (key, value) in resumed.fields {
                fields.push((&body[key], value));
            }
            scan.pos = resumed.end;
            opened = Some((resumed.opened, fields.len()));
            messages = Some(scan.messages_from(resumed.messages)?);
            fields.push((b"messages", resumed.opened..scan.pos));
        } else {
            scan.expect(b'{')?;
            if scan.peek()? == b'}' {
                return None;
            }
        }
        loop {
            if resuming {
                resuming = false;
            } else {
                let key = scan.key()?;
                scan.expect(b':')?;
                scan.whitespace();
                let start = scan.pos;
                if read_messages && key == b"messages" {
                    opened = Some((start, fields.len()));
                    messages = Some(scan.messages()?);
                } else {
                    scan.value()?;
                }
                // The last of duplicate keys wins, as with a parser.
                fields.retain(|(k, _)| *k != key);
                fields.push((key, start..scan.pos));
            }
            match scan.next_byte()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
        if scan.peek().is_some() {
            return None;
        }
        if read_messages && messages.is_none() {
            return None;
        }
        let messages = messages.unwrap_or_default();
        let model = ModelAt::Absent;
        let mut outline = Self { body, fields, messages, resumed: agreed, kept_at: None, model };
        outline.model = outline.field("model").map_or(ModelAt::Absent, model_at);
        if let (Some((opened, before)), Some(shared)) = (opened, shared) {
            outline.kept_at = kept::keep(&outline, shared, opened, before);
        }
        Some(outline)
    }

    /// `derive()`, a value that depends only on the body's first `upto` bytes and on
    /// `inputs` (a digest of its other inputs): taken from the kept outline this body
    /// continues when that one's was derived from the same, else derived and kept with
    /// this body's outline for the bodies that continue it.
    pub fn memoized(&self, upto: usize, inputs: u128, derive: impl FnOnce() -> u128) -> u128 {
        if let Some(Resumed { end, memo: Some(memo) }) = self.resumed {
            if memo.upto == upto && memo.inputs == inputs && upto <= end {
                return memo.value;
            }
        }
        let value = derive();
        if let Some(at) = self.kept_at {
            kept::remember(at, Memo { upto, inputs, value });
        }
        value
    }

    /// The raw text of a top-level field.
    pub fn field(&self, key: &str) -> Option<&'a [u8]> {
        let key = key.as_bytes();
        self.fields.iter().rev().find(|(k, _)| *k == key).map(|(_, r)| &self.body[r.clone()])
    }

    /// The `model` field: borrowed from the body unless it has escapes.
    pub fn model(&self) -> Option<Cow<'a, str>> {
        match self.model {
            ModelAt::Absent => None,
            ModelAt::Plain(name) => Some(Cow::Borrowed(name)),
            ModelAt::Raw(raw) => serde_json::from_slice::<String>(raw).ok().map(Cow::Owned),
        }
    }

    /// The reply reserve asked for: `max_completion_tokens`, else `max_tokens`.
    pub fn max_reply_tokens(&self) -> Option<usize> {
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| {
            let raw = self.field(k)?;
            // Plain digits (what clients send) read as they are; anything else as serde
            // reads a `u64`.
            let plain = match raw {
                [b'1'..=b'9', rest @ ..]
                    if rest.len() < 18 && rest.iter().all(u8::is_ascii_digit) =>
                {
                    Some(raw.iter().fold(0u64, |n, &b| n * 10 + u64::from(b - b'0')))
                }
                _ => None,
            };
            let n = plain.or_else(|| serde_json::from_slice::<u64>(raw).ok())?;
            usize::try_from(n).ok()
        })
    }

    /// The raw text of `tools`, if present and not null.
    pub fn tools_raw(&self) -> Option<&'a [u8]> {
        self.field("tools").filter(|raw| raw.trim_ascii() != b"null")
    }

    /// The messages, in order.
    pub fn messages(&self) -> &[MessageOutline] {
        &self.messages
    }

    /// A message's raw text.
    pub fn raw(&self, message: &MessageOutline) -> &'a [u8] {
        &self.body[message.range.clone()]
    }

    /// The raw text of the first message with `role` (system also matches developer).
    pub fn first_with_role(&self, role: Role) -> Option<&'a [u8]> {
        self.first_message_with_role(role).map(|m| self.raw(m))
    }

    /// The outline of the first message with `role` (see [`Outline::first_with_role`]).
    pub fn first_message_with_role(&self, role: Role) -> Option<&MessageOutline> {
        self.messages.iter().find(|m| {
            m.role == Some(role) || (role == Role::System && m.role == Some(Role::Developer))
        })
    }
}

/// The elements of a JSON array (its raw text), one at a time, found by the scan without
/// reading further than asked: an element is `None` (and the last) where the scan meets
/// anything it does not expect.
pub fn array_elements(raw: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
    let mut scan = Scanner { body: raw, pos: 0, mentions: Mentions::default() };
    let mut state = scan.expect(b'[').map(|()| false);
    std::iter::from_fn(move || {
        // `Some(false)`: before the first element; `Some(true)`: after one; `None`: done.
        let after_one = state?;
        if scan.peek() == Some(b']') && !after_one {
            state = None;
            return None;
        }
        let element = (|| {
            scan.whitespace();
            let start = scan.pos;
            scan.value()?;
            let end = scan.pos;
            match scan.next_byte()? {
                b',' => state = Some(true),
                b']' => state = None,
                _ => return None,
            }
            Some(&raw[start..end])
        })();
        if element.is_none() {
            state = None;
        }
        Some(element)
    })
}

struct Scanner<'a> {
    body: &'a [u8],
    pos: usize,
    mentions: Mentions,
}

/// Strings seen so far that are exactly `image_url`, `arguments`, `file_data` and
/// `cache_control`.
#[derive(Debug, Clone, Copy, Default)]
struct Mentions {
    images: usize,
    calls: usize,
    files: usize,
    breakpoints: usize,
}

impl<'a> Scanner<'a> {
    fn whitespace(&mut self) {
        while self.body.get(self.pos).is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.body.get(self.pos).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next_byte()? == byte).then_some(())
    }

    /// An object key without escapes.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.pos;
        let len = quote_or_backslash(&self.body[start..])?;
        if self.body[start + len] != b'"' {
            return None;
        }
        self.pos = start + len + 1;
        Some(&self.body[start..start + len])
    }

    /// Skips a string whose opening quote is at `pos`, counting the mentions.
    fn string(&mut self) -> Option<()> {
        let start = self.pos + 1;
        self.pos = start;
        loop {
            let at = self.pos + quote_or_backslash(self.body.get(self.pos..)?)?;
            if self.body[at] == b'"' {
                self.pos = at + 1;
                match &self.body[start..at] {
                    b"image_url" => self.mentions.images += 1,
                    b"arguments" => self.mentions.calls += 1,
                    b"file_data" => self.mentions.files += 1,
                    b"cache_control" => self.mentions.breakpoints += 1,
                    _ => {}
                }
                return Some(());
            }
            self.pos = at + 2;
        }
    }

    /// Skips one value starting at `pos`.
    fn value(&mut self) -> Option<()> {
        match *self.body.get(self.pos)? {
            b'"' => self.string(),
            b'{' | b'[' => self.container(),
            _ => {
                let rest = &self.body[self.pos..];
                let len = rest
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())
                    .unwrap_or(rest.len());
                (len > 0).then(|| self.pos += len)
            }
        }
    }

    /// Skips an object or array starting at `pos`, strings included.
    fn container(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            let rest = self.body.get(self.pos..)?;
            let at = rest.iter().position(|b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))?;
            self.pos += at;
            match self.body[self.pos] {
                b'"' => self.string()?,
                b'{' | b'[' => {
                    depth += 1;
                    self.pos += 1;
                }
                _ => {
                    depth = depth.checked_sub(1)?;
                    self.pos += 1;
                    if depth == 0 {
                        return Some(());
                    }
                }
            }
        }
    }

    /// The messages of the array starting at `pos`, each an object. One pass over the
    /// array: strings are skipped with `memchr2`, brackets track the depth, and the only
    /// key read is a message's own `role` (a chat body is mostly strings, and a
    /// key-by-key walk of every message cost three times as much).
    fn messages(&mut self) -> Option<Vec<MessageOutline>> {
        self.expect(b'[')?;
        self.messages_from(Vec::new())
    }

    /// The rest of a messages array, from `pos` between two of its elements (or after
    /// its `[`), after the messages `out` already found.
    fn messages_from(&mut self, mut out: Vec<MessageOutline>) -> Option<Vec<MessageOutline>> {
        let body = self.body;
        // Depth 0: between messages; 1: directly inside a message object; deeper: inside
        // one of its values.
        let mut depth = 0usize;
        let mut start = 0;
        let mut role = None;
        // Where the message's `role` key was: its value is the next token.
        let mut role_key = false;
        let mut before = self.mentions;
        loop {
            let b = *body.get(self.pos)?;
            match b {
                b'"' => {
                    let at = self.pos;
                    if depth == 0 {
                        return None;
                    }
                    self.string()?;
                    if depth == 1 {
                        let text = &body[at + 1..self.pos - 1];
                        if role_key {
                            role = role_of(&body[at..self.pos]);
                            role_key = false;
                        } else if text == b"role" && self.peek() == Some(b':') {
                            role_key = true;
                            self.pos += 1;
                        }
                    }
                    continue;
                }
                b'{' | b'[' => {
                    if depth == 0 {
                        if b == b'[' {
                            return None;
                        }
                        (start, role, before) = (self.pos, None, self.mentions);
                    }
                    role_key = false;
                    depth += 1;
                }
                b'}' | b']' => {
                    if depth == 0 {
                        if b == b'}' {
                            return None;
                        }
                        self.pos += 1;
                        return Some(out);
                    }
                    depth -= 1;
                    if depth == 0 {
                        out.push(MessageOutline {
                            range: start..self.pos + 1,
                            role,
                            image_mentions: self.mentions.images - before.images,
                            call_mentions: self.mentions.calls - before.calls,
                            file_mentions: self.mentions.files - before.files,
                            breakpoint_mentions: self.mentions.breakpoints - before.breakpoints,
                        });
                    }
                }
                b' ' | b'\n' | b'\r' | b'\t' | b',' | b':' => {}
                _ if depth == 0 => return None,
                _ => role_key = false,
            }
            self.pos += 1;
        }
    }
}

/// The offset of the first `"` or `\\` in `hay`. Most strings of a chat body are short
/// (keys, roles, ids, names), and `memchr2` costs more to set up than they take to read,
/// so the first 16 bytes are tested eight at a time in a word, then `memchr2` takes over.
fn quote_or_backslash(hay: &[u8]) -> Option<usize> {
    const WORD: usize = 8;
    const WORDS: usize = 2;
    for w in 0..WORDS {
        let Some(chunk) = hay.get(w * WORD..(w + 1) * WORD) else {
            // Fewer than eight bytes left: test them one by one.
            let rest = hay.get(w * WORD..)?;
            return rest.iter().position(|&b| b == b'"' || b == b'\\').map(|at| at + w * WORD);
        };
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let found =
            zero_byte(word ^ 0x2222_2222_2222_2222) | zero_byte(word ^ 0x5c5c_5c5c_5c5c_5c5c);
        if found != 0 {
            return Some(w * WORD + found.trailing_zeros() as usize / 8);
        }
    }
    let skip = WORD * WORDS;
    memchr::memchr2(b'"', b'\\', &hay[skip..]).map(|at| at + skip)
}

/// The high bit of the lowest zero byte of `word` set (bits above it may be set too,
/// which is why only the lowest one is used).
fn zero_byte(word: u64) -> u64 {
    word.wrapping_sub(0x0101_0101_0101_0101) & !word & 0x8080_8080_8080_8080
}

/// The role a `role` value names, when it is a string (escapes decoded).
fn role_of(raw: &[u8]) -> Option<Role> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') {
        return serde_json::from_slice::<String>(raw).ok().map(|t| Role::parse(&t));
    }
    Some(std::str::from_utf8(inner).map_or(Role::Other, Role::parse))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChatRequest;

    #[test]
    fn array_elements_are_read_one_at_a_time() {
        let all = |raw: &str| -> Vec<Option<String>> {
            array_elements(raw.as_bytes())
                .map(|e| e.map(|e| String::from_utf8(e.to_vec()).unwrap()))
                .collect()
        };
        let some = |v: &[&str]| v.iter().map(|e| Some((*e).to_owned())).collect::<Vec<_>>();
        assert_eq!(all("[]"), some(&[]));
        assert_eq!(all(" [ ] "), some(&[]));
        assert_eq!(
            all(r#"[{"a":"x]"} , "s\"]" ,[1,[2]],3, null]"#),
            some(&[r#"{"a":"x]"}"#, r#""s\"]""#, "[1,[2]]", "3", "null"])
        );
        assert_eq!(all("[1,]"), vec![Some("1".to_owned()), None]);
        assert_eq!(all("[1 2]"), vec![None]);
        assert_eq!(all("{}"), Vec::<Option<String>>::new());
        // Only what is asked for is read: a broken tail is not seen.
        let first = array_elements(br#"[{"role":"user"}, {"#).next();
        assert_eq!(first, Some(Some(&br#"{"role":"user"}"#[..])));
    }

    #[test]
    fn reply_reserves_read_as_serde_reads_a_count() {
        let numbers = [
            "0",
            "7",
            "50",
            "05",
            "-1",
            "1.0",
            "1e3",
            "\"5\"",
            "null",
            "true",
            "99999999999999999",
            "999999999999999999",
            "18446744073709551615",
            "18446744073709551616",
        ];
        for raw in numbers {
            let body = format!(r#"{{"model":"m","messages":[],"max_tokens":{raw}}}"#);
            let outline = Outline::scan(body.as_bytes()).unwrap();
            let serde = serde_json::from_str::<u64>(raw).ok().and_then(|n| usize::try_from(n).ok());
            assert_eq!(outline.max_reply_tokens(), serde, "{raw}");
        }
    }

    #[test]
    fn finds_what_the_parser_finds() {
        let body = br#" { "model" : "gpt-4o", "x" : {"a":[1,{"b":"]}\"{"}], "c": null},
            "messages": [ {"role":"system","content":"be \"brief\" {"},
              {"role":"user","content":[{"type":"text","text":"hi ]"}]},
              {"role" : "tool" ,"content":"C:\\dir\\","tool_call_id":"x\"}"} ],
            "max_tokens": 50, "tools": null, "stream": true } "#;
        let outline = Outline::scan(body).unwrap();
        let parsed = ChatRequest::parse(body).unwrap();
        assert_eq!(outline.model().as_deref(), parsed.model().as_deref());
        assert_eq!(outline.max_reply_tokens(), Some(50));
        assert_eq!(outline.tools_raw(), None);
        let raws: Vec<&[u8]> = outline.messages().iter().map(|m| outline.raw(m)).collect();
        let expected: Vec<&[u8]> = parsed.messages().iter().map(|m| m.raw().as_bytes()).collect();
        assert_eq!(raws, expected);
        assert_eq!(outline.first_with_role(Role::User), Some(expected[1]));
        assert_eq!(outline.first_with_role(Role::System), Some(expected[0]));
        assert_eq!(outline.field("x"), Some(&br#"{"a":[1,{"b":"]}\"{"}], "c": null}"#[..]));
    }

    #[test]
    fn quotes_and_backslashes_are_found_at_every_offset() {
        for len in 0..40 {
            for at in 0..=len {
                for mark in [b'"', b'\\'] {
                    let mut hay = vec![b'a'; len];
                    if at < len {
                        hay[at] = mark;
                        hay.extend_from_slice(b"\"\\");
                    }
                    let expected = memchr::memchr2(b'"', b'\\', &hay);
                    assert_eq!(quote_or_backslash(&hay), expected, "{len} {at}");
                }
            }
        }
        // Bytes that differ from a quote by the carry of the word test.
        assert_eq!(quote_or_backslash(b"\x23\x21\x01\x22"), Some(3));
        assert_eq!(quote_or_backslash("é€\"".as_bytes()), Some(5));
    }

    #[test]
    fn anything_unexpected_gives_none() {
        for body in [
            &b"[]"[..],
            b"{}",
            b"{\"model\":\"m\"}",
            b"{\"messages\":[1]}",
            b"{\"messages\":[{}]",
            b"{\"mes\\u0073ages\":[]}",
            b"{\"messages\":[{\"a\":\"unterminated}]}",
            b"{\"messages\":[]} trailing",
            b"{\"messages\":[]]}",
        ] {
            assert!(Outline::scan(body).is_none(), "{}", String::from_utf8_lossy(body));
        }
        assert!(Outline::scan(b"{\"messages\":[]}").is_some());
    }

    #[test]
    fn mentions_are_what_a_search_of_the_text_finds() {
        let body = br#"{"model":"gpt-4o","messages":[
            {"role":"user","content":[{"type":"text","text":"see \"image_url\" and arguments","cache_control":{"type":"ephemeral"}},
                {"type":"image_url","image_url":{"url":"https://x/y.png"}},
                {"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERi0="}}]},
            {"role":"assistant","content":null,"tool_calls":[
                {"id":"a","type":"function","function":{"name":"f","arguments":"{\"arguments\":1}"}},
                {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},
            {"role":{"not":"a string"},"content":"x"},
            {"role":"\u0073ystem","content":"escaped"}]}"#;
        let outline = Outline::scan(body).unwrap();
        let counts: Vec<(usize, usize, usize)> = outline
            .messages()
            .iter()
            .map(|m| (m.image_mentions, m.call_mentions, m.file_mentions))
            .collect();
        assert_eq!(counts, [(2, 0, 1), (0, 2, 0), (0, 0, 0), (0, 0, 0)]);
        assert_eq!(outline.messages()[0].breakpoint_mentions, 1);
        for m in outline.messages() {
            let raw = outline.raw(m);
            let search = |needle: &[u8]| memchr::memmem::find_iter(raw, needle).count();
            assert_eq!(
                (m.image_mentions, m.call_mentions, m.file_mentions),
                (search(b"\"image_url\""), search(b"\"arguments\""), search(b"\"file_data\""))
            );
            assert_eq!(m.breakpoint_mentions, search(b"\"cache_control\""));
        }
        assert_eq!(outline.messages()[2].role, None);
        assert_eq!(outline.messages()[3].role, Some(Role::System));
        assert_eq!(
            outline.first_with_role(Role::Assistant),
            Some(outline.raw(&outline.messages()[1]))
        );
    }
}
