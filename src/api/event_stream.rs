//! A server-sent event stream cut into whole event blocks as its bytes arrive, for the
//! answer rewriters that change some events and pass every other byte on as received.
//!
//! A block is the bytes of one event up to and including the blank line that ends it.
//! Lines end with `\n` or `\r\n` (a stream of lone `\r` line ends shows no block and is
//! passed on as it is, see [`Rewriting`]). This is not the edge's event reader
//! (`http::sse`): that one yields events to look at, this one yields the raw blocks to
//! write back, byte for byte or with their data replaced.

use std::borrow::Cow;

/// The most bytes a rewriter holds back waiting for the end of one block; past it the
/// rest of the stream passes through as received.
pub const MAX_PENDING: usize = 16 << 20;

/// What a rewriter does with the rest of the stream after a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep handing it whole blocks.
    Rewrite,
    /// Pass every later byte through as received.
    PassRest,
}

/// The driver of a block rewriter: buffers bytes into whole blocks, hands each to the
/// rewriter, and passes the stream through once the rewriter (or the stream's shape)
/// says so.
#[derive(Debug, Default)]
pub struct Rewriting {
    /// Bytes received and not yet handed on.
    buf: Vec<u8>,
    /// Where, in `buf`, the line being scanned begins.
    line: usize,
    /// Every later byte passes through.
    pass: bool,
    /// A block was handed on already.
    seen: bool,
}

impl Rewriting {
    /// Feeds `chunk`; `on_block` writes each whole block's bytes (changed or not) into the
    /// output. A stream whose first byte (after whitespace) opens a JSON value is not an
    /// event stream and passes through at once.
    pub fn push(
        &mut self,
        chunk: &[u8],
        mut on_block: impl FnMut(&[u8], &mut Vec<u8>) -> Flow,
    ) -> Vec<u8> {
        if self.pass {
            return chunk.to_vec();
        }
        self.buf.extend_from_slice(chunk);
        if !self.seen {
            if opens_json(&self.buf) {
                return self.pass_rest();
            }
            // Only whitespace so far: whether it is an event stream is not known yet
            // (found by fuzzing: a JSON answer cut after its leading newline was read as
            // a stream).
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                return Vec::new();
            }
        }
        let mut out = Vec::new();
        while let Some(end) = self.block_end() {
            let block: Vec<u8> = self.buf.drain(..end).collect();
            self.line = 0;
            self.seen = true;
            if on_block(&block, &mut out) == Flow::PassRest {
                out.extend(self.pass_rest());
                return out;
            }
        }
        if self.buf.len() > MAX_PENDING {
            out.extend(self.pass_rest());
        }
        out
    }

    /// The bytes still held at the end of the stream (an unfinished block), as received.
    pub fn finish(&mut self) -> Vec<u8> {
        self.line = 0;
        std::mem::take(&mut self.buf)
    }

    /// Switches to passing through and returns what was held.
    fn pass_rest(&mut self) -> Vec<u8> {
        self.pass = true;
        self.finish()
    }

    /// Where the first whole block of `buf` ends (after its blank line), if it is whole.
    fn block_end(&mut self) -> Option<usize> {
        while let Some(nl) = memchr::memchr(b'\n', self.buf.get(self.line..)?) {
            let end = self.line + nl;
            let line = &self.buf[self.line..end];
            self.line = end + 1;
            if line.is_empty() || line == b"\r" {
                return Some(self.line);
            }
        }
        None
    }
}

/// True when the first byte of `bytes` after whitespace opens a JSON object or array.
fn opens_json(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|b| b"{[".contains(b))
}

/// One block read: its `event` field and its data (`data` lines joined by `\n`).
#[derive(Debug, PartialEq, Eq)]
pub struct Block<'a> {
    /// Its `event` field, when it has one.
    pub name: Option<&'a str>,
    /// Its data, when it has any.
    pub data: Option<Cow<'a, str>>,
}

impl Block<'_> {
    /// The event's kind: its `event` field, else its data's `type` member.
    pub fn kind(&self) -> Option<String> {
        if let Some(name) = self.name {
            return Some(name.to_owned());
        }
        #[derive(serde::Deserialize)]
        struct Typed {
            #[serde(rename = "type")]
            kind: String,
        }
        let data = self.data.as_deref()?;
        serde_json::from_str::<Typed>(data).ok().map(|t| t.kind)
    }
}

/// The lines of a block, each with its line end.
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    block.split_inclusive(|b| *b == b'\n')
}

/// A line without its line end.
fn content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A line's field name and where its value begins (one space after the colon is not
/// part of the value).
fn field(line: &[u8]) -> (&[u8], usize) {
    match memchr::memchr(b':', line) {
        Some(colon) => {
            let skip = usize::from(line.get(colon + 1) == Some(&b' '));
            (&line[..colon], colon + 1 + skip)
        }
        None => (line, line.len()),
    }
}

/// Reads a block; data that is not UTF-8 reads as none (such an event is never changed).
pub fn read(block: &[u8]) -> Block<'_> {
    let mut name = None;
    let mut data: Option<Cow<'_, str>> = None;
    let mut utf8 = true;
    for line in lines(block).map(content) {
        let (key, at) = field(line);
        let Ok(value) = std::str::from_utf8(&line[at..]) else {
            utf8 = false;
            continue;
        };
        match key {
            b"event" => name = Some(value),
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(before) => Cow::Owned(format!("{before}\n{value}")),
                });
            }
            _ => {}
        }
    }
    Block { name, data: data.filter(|_| utf8) }
}

/// `block` with its data replaced by `data`: the first data line keeps its place, its
/// `data:` prefix and its line end; every other line stays as received.
pub fn with_data(block: &[u8], data: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 16);
    let mut written = false;
    for line in lines(block) {
        let (key, at) = field(content(line));
        if key != b"data" {
            out.extend_from_slice(line);
            continue;
        }
        if written {
            continue;
        }
        written = true;
        let end = &line[content(line).len()..];
        for part in data.split('\n') {
            out.extend_from_slice(&line[..at]);
            out.extend_from_slice(part.as_bytes());
            out.extend_from_slice(if end.is_empty() { b"\n" } else { end });
        }
    }
    out
}

/// A new event block: `event: <name>`, its data, a blank line.
pub fn event(name: &str, data: &str) -> Vec<u8> {
    let mut out = format!("event: {name}\n").into_bytes();
    for part in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(part.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

/// A JSON text on one line: outside strings (which cannot hold a raw line break) a line
/// break is whitespace, so it becomes a space.
pub fn one_line(json: &str) -> String {
    json.replace(['\r', '\n'], " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn blocks(stream: &[u8], split: usize) -> Vec<Vec<u8>> {
        let mut r = Rewriting::default();
        let mut seen = Vec::new();
        for part in [&stream[..split], &stream[split..]] {
            r.push(part, |b, _| {
                seen.push(b.to_vec());
                Flow::Rewrite
            });
        }
        seen.push(r.finish());
        seen
    }

    #[test]
    fn blocks_are_whole_however_the_bytes_arrive() {
        let stream = b": hi\n\nevent: a\r\ndata: 1\r\n\r\ndata: 2\ndata: 3\n\nevent: tail\n";
        for split in 0..=stream.len() {
            let seen = blocks(stream, split);
            assert_eq!(seen.len(), 4, "split at {split}");
            assert_eq!(seen[1], b"event: a\r\ndata: 1\r\n\r\n");
            assert_eq!(seen.concat(), stream);
        }
    }

    #[test]
    fn reads_names_and_joined_data() {
        let b = read(b"event: x\ndata:{\"type\":\"y\"}\ndata: z\n\n");
        assert_eq!(b.name, Some("x"));
        assert_eq!(b.data.as_deref(), Some("{\"type\":\"y\"}\nz"));
        assert_eq!(read(b"data: {\"type\":\"y\"}\n\n").kind().as_deref(), Some("y"));
        assert_eq!(read(b": comment\n\n").data, None);
        assert_eq!(read(b"data: \xff\n\n").data, None);
    }

    #[test]
    fn data_is_replaced_in_place() {
        let block = b"id: 7\r\nevent: x\r\ndata:{\"a\":1}\r\ndata: more\r\n\r\n";
        let out = with_data(block, "{\"a\":2}");
        assert_eq!(out, b"id: 7\r\nevent: x\r\ndata:{\"a\":2}\r\n\r\n");
        assert_eq!(with_data(b"data: 1\n\n", "a\nb"), b"data: a\ndata: b\n\n");
        assert_eq!(event("e", "{}"), b"event: e\ndata: {}\n\n");
    }

    #[test]
    fn json_and_endless_lines_pass_through() {
        let mut r = Rewriting::default();
        let out = r.push(b" {\"error\":{}}\n\n", |_, _| Flow::Rewrite);
        assert_eq!(out, b" {\"error\":{}}\n\n");
        assert_eq!(r.push(b"more", |_, _| Flow::Rewrite), b"more");
        let mut r = Rewriting::default();
        assert!(r.push(b"data: x\rdata: y\r\r", |_, _| Flow::Rewrite).is_empty());
        assert_eq!(r.finish(), b"data: x\rdata: y\r\r");
    }
}
