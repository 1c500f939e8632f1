//! A chat request's outline: where its top-level fields and its messages lie in the body,
//! found by a structural scan that skips string contents with `memchr` instead of
//! parsing them. It is enough to tell that a request is far below the compaction
//! trigger (its model, reply reserve, tools and the size of each message), which is
//! most requests, at a fraction of the cost of [`crate::model::ChatRequest::parse`].
//!
//! The scan does not validate the JSON: the body is forwarded as received either way,
//! and the provider judges it. Anything unusual (a key with escapes, a body that is not
//! an object, unbalanced brackets) gives `None`, and the caller parses properly.

use std::ops::Range;

use crate::model::Role;

/// The outline of a chat-completions body.
#[derive(Debug)]
pub struct Outline<'a> {
    body: &'a [u8],
    fields: Vec<(&'a str, Range<usize>)>,
    messages: Vec<MessageOutline>,
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
}

impl<'a> Outline<'a> {
    /// Scans `body`; `None` when it is not a JSON object with a `messages` array whose
    /// elements are objects, or when the scan meets anything it does not expect.
    pub fn scan(body: &'a [u8]) -> Option<Self> {
        let mut scan = Scanner { body, pos: 0, mentions: (0, 0) };
        let mut fields = Vec::new();
        let mut messages = None;
        scan.expect(b'{')?;
        if scan.peek()? == b'}' {
            return None;
        }
        loop {
            let key = scan.key()?;
            scan.expect(b':')?;
            scan.whitespace();
            let start = scan.pos;
            if key == "messages" {
                messages = Some(scan.messages()?);
            } else {
                scan.value()?;
            }
            // The last of duplicate keys wins, as with a parser.
            fields.retain(|(k, _): &(&str, Range<usize>)| *k != key);
            fields.push((key, start..scan.pos));
            match scan.next_byte()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
        if scan.peek().is_some() {
            return None;
        }
        Some(Self { body, fields, messages: messages? })
    }

    /// The raw text of a top-level field.
    pub fn field(&self, key: &str) -> Option<&'a [u8]> {
        self.fields.iter().rev().find(|(k, _)| *k == key).map(|(_, r)| &self.body[r.clone()])
    }

    /// The `model` field.
    pub fn model(&self) -> Option<String> {
        serde_json::from_slice(self.field("model")?).ok()
    }

    /// The reply reserve asked for: `max_completion_tokens`, else `max_tokens`.
    pub fn max_reply_tokens(&self) -> Option<usize> {
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| {
            serde_json::from_slice::<u64>(self.field(k)?).ok().and_then(|n| usize::try_from(n).ok())
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
        self.messages
            .iter()
            .find(|m| {
                m.role == Some(role) || (role == Role::System && m.role == Some(Role::Developer))
            })
            .map(|m| self.raw(m))
    }
}

struct Scanner<'a> {
    body: &'a [u8],
    pos: usize,
    /// Strings seen that are exactly `image_url`, and exactly `arguments`.
    mentions: (usize, usize),
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
    fn key(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.pos;
        let len = memchr::memchr2(b'"', b'\\', &self.body[start..])?;
        if self.body[start + len] != b'"' {
            return None;
        }
        self.pos = start + len + 1;
        std::str::from_utf8(&self.body[start..start + len]).ok()
    }

    /// Skips a string whose opening quote is at `pos`, counting the mentions.
    fn string(&mut self) -> Option<()> {
        let start = self.pos + 1;
        self.pos = start;
        loop {
            let at = self.pos + memchr::memchr2(b'"', b'\\', self.body.get(self.pos..)?)?;
            if self.body[at] == b'"' {
                self.pos = at + 1;
                match &self.body[start..at] {
                    b"image_url" => self.mentions.0 += 1,
                    b"arguments" => self.mentions.1 += 1,
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

    /// The messages of the array starting at `pos`: each an object, scanned key by key
    /// so that its role is known.
    fn messages(&mut self) -> Option<Vec<MessageOutline>> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        if self.peek()? == b']' {
            self.pos += 1;
            return Some(out);
        }
        loop {
            out.push(self.message()?);
            match self.next_byte()? {
                b',' => continue,
                b']' => return Some(out),
                _ => return None,
            }
        }
    }

    fn message(&mut self) -> Option<MessageOutline> {
        self.whitespace();
        let start = self.pos;
        let before = self.mentions;
        let mut role = None;
        self.expect(b'{')?;
        if self.peek()? == b'}' {
            self.pos += 1;
        } else {
            loop {
                let key = self.key()?;
                self.expect(b':')?;
                self.whitespace();
                let value = self.pos;
                self.value()?;
                if key == "role" {
                    // Escapes make a borrowed read fail; an owned one decodes them.
                    let raw = &self.body[value..self.pos];
                    role = match serde_json::from_slice::<&str>(raw) {
                        Ok(text) => Some(Role::parse(text)),
                        Err(_) => {
                            serde_json::from_slice::<String>(raw).ok().map(|t| Role::parse(&t))
                        }
                    };
                }
                match self.next_byte()? {
                    b',' => continue,
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        Some(MessageOutline {
            range: start..self.pos,
            role,
            image_mentions: self.mentions.0 - before.0,
            call_mentions: self.mentions.1 - before.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChatRequest;

    #[test]
    fn finds_what_the_parser_finds() {
        let body = br#" { "model" : "gpt-4o", "x" : {"a":[1,{"b":"]}\"{"}], "c": null},
            "messages": [ {"role":"system","content":"be \"brief\" {"},
              {"role":"user","content":[{"type":"text","text":"hi ]"}]} ],
            "max_tokens": 50, "tools": null, "stream": true } "#;
        let outline = Outline::scan(body).unwrap();
        let parsed = ChatRequest::parse(body).unwrap();
        assert_eq!(outline.model(), parsed.model());
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
            {"role":"user","content":[{"type":"text","text":"see \"image_url\" and arguments"},
                {"type":"image_url","image_url":{"url":"https://x/y.png"}}]},
            {"role":"assistant","content":null,"tool_calls":[
                {"id":"a","type":"function","function":{"name":"f","arguments":"{\"arguments\":1}"}},
                {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},
            {"role":{"not":"a string"},"content":"x"},
            {"role":"\u0073ystem","content":"escaped"}]}"#;
        let outline = Outline::scan(body).unwrap();
        let counts: Vec<(usize, usize)> =
            outline.messages().iter().map(|m| (m.image_mentions, m.call_mentions)).collect();
        assert_eq!(counts, [(2, 0), (0, 2), (0, 0), (0, 0)]);
        for m in outline.messages() {
            let raw = outline.raw(m);
            let search = |needle: &[u8]| memchr::memmem::find_iter(raw, needle).count();
            assert_eq!(
                (m.image_mentions, m.call_mentions),
                (search(b"\"image_url\""), search(b"\"arguments\""))
            );
        }
        assert_eq!(outline.messages()[2].role, None);
        assert_eq!(outline.messages()[3].role, Some(Role::System));
        assert_eq!(
            outline.first_with_role(Role::Assistant),
            Some(outline.raw(&outline.messages()[1]))
        );
    }
}
