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

use serde::Deserialize;

use crate::model::Role;

/// The outline of a chat-completions body.
#[derive(Debug)]
pub struct Outline<'a> {
    body: &'a [u8],
    fields: Vec<(&'a str, Range<usize>)>,
    messages: Vec<Range<usize>>,
}

impl<'a> Outline<'a> {
    /// Scans `body`; `None` when it is not a JSON object with a `messages` array whose
    /// elements are objects, or when the scan meets anything it does not expect.
    pub fn scan(body: &'a [u8]) -> Option<Self> {
        let mut scan = Scanner { body, pos: 0 };
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
                messages = Some(scan.array_elements()?);
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
        let messages = messages?;
        let objects = messages.iter().all(|r| body.get(r.start) == Some(&b'{'));
        objects.then_some(Self { body, fields, messages })
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

    /// Each message's raw text, in order.
    pub fn messages(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.messages.iter().map(|r| &self.body[r.clone()])
    }

    /// The raw text of the first message with `role` (system also matches developer).
    pub fn first_with_role(&self, role: Role) -> Option<&'a [u8]> {
        #[derive(Deserialize)]
        struct Head<'s> {
            #[serde(borrow)]
            role: Option<std::borrow::Cow<'s, str>>,
        }
        self.messages().find(|raw| {
            let found = serde_json::from_slice::<Head<'_>>(raw)
                .ok()
                .and_then(|h| h.role)
                .map(|r| Role::parse(&r));
            found == Some(role) || (role == Role::System && found == Some(Role::Developer))
        })
    }
}

struct Scanner<'a> {
    body: &'a [u8],
    pos: usize,
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

    /// Skips a string whose opening quote is at `pos`.
    fn string(&mut self) -> Option<()> {
        self.pos += 1;
        loop {
            let at = self.pos + memchr::memchr2(b'"', b'\\', self.body.get(self.pos..)?)?;
            if self.body[at] == b'"' {
                self.pos = at + 1;
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

    /// The extents of the elements of the array starting at `pos`.
    fn array_elements(&mut self) -> Option<Vec<Range<usize>>> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        if self.peek()? == b']' {
            self.pos += 1;
            return Some(out);
        }
        loop {
            self.whitespace();
            let start = self.pos;
            self.value()?;
            out.push(start..self.pos);
            match self.next_byte()? {
                b',' => continue,
                b']' => return Some(out),
                _ => return None,
            }
        }
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
        let raws: Vec<&[u8]> = outline.messages().collect();
        let expected: Vec<&[u8]> = parsed.messages().iter().map(|m| m.raw().as_bytes()).collect();
        assert_eq!(raws, expected);
        assert_eq!(outline.first_with_role(Role::User), Some(expected[1]));
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
}
