//! Server-sent events read from a stream's bytes as they arrive: the whole events, one
//! after another, each with its `event` field and its data. For a handler that must look
//! at a stream's first events before passing it on (`super::overflow`); the usage tap
//! reads the lines it needs its own way ([`super::usage`]).
//!
//! Lines end with `\n` or `\r\n`; a stream that ends its lines with a lone `\r` shows no
//! event (it is then passed on as it is).

use std::borrow::Cow;

/// One whole event.
#[derive(Debug, PartialEq, Eq)]
pub struct Event<'a> {
    /// Its `event` field, when it has one.
    pub name: Option<&'a [u8]>,
    /// Its `data` lines, joined by `\n`.
    pub data: Cow<'a, [u8]>,
}

/// Finds the whole events in the bytes of a stream as more of them arrive.
#[derive(Debug, Default)]
pub struct Events {
    /// Where the next event begins.
    start: usize,
    /// Where the first line not yet read to its end begins.
    line: usize,
}

impl Events {
    /// The next whole event of `stream` (every byte of the stream so far) after the ones
    /// already returned; `None` until another is complete. Blocks of comments only, and
    /// blocks without data, are not events (as for a browser's `EventSource`).
    pub fn next<'a>(&mut self, stream: &'a [u8]) -> Option<Event<'a>> {
        while let Some(end) = stream.get(self.line..).and_then(|rest| memchr::memchr(b'\n', rest)) {
            let line_end = self.line + end;
            let line = trim_cr(&stream[self.line..line_end]);
            let block = self.start..self.line;
            self.line = line_end + 1;
            if !line.is_empty() {
                continue;
            }
            self.start = self.line;
            if let Some(event) = parse_block(&stream[block]) {
                return Some(event);
            }
        }
        None
    }
}

/// The event of a block of lines (each ending with `\n`), if it has data.
fn parse_block(block: &[u8]) -> Option<Event<'_>> {
    let mut name = None;
    let mut data: Option<Cow<'_, [u8]>> = None;
    for line in block.split(|b| *b == b'\n').map(trim_cr) {
        let (field, value) = field(line);
        match field {
            b"event" => name = Some(value),
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(before) => {
                        let mut joined = before.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                });
            }
            _ => {}
        }
    }
    Some(Event { name, data: data? })
}

/// A line's field name and value (one space after the colon is not part of the value); a
/// comment (`: ...`) has an empty name.
fn field(line: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b':', line) {
        Some(colon) => {
            let value = &line[colon + 1..];
            (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &[]),
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(stream: &[u8]) -> Vec<Event<'_>> {
        let mut events = Events::default();
        std::iter::from_fn(|| events.next(stream)).collect()
    }

    #[test]
    fn reads_named_and_unnamed_events_and_skips_comments() {
        let stream = b": keep-alive\n\nevent: response.created\ndata: {\"a\":1}\n\r\ndata: x\r\ndata: y\n\nevent: only-a-name\n\n";
        let events = all(stream);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].name, Some(&b"response.created"[..]));
        assert_eq!(events[0].data, &b"{\"a\":1}"[..]);
        assert_eq!(events[1].name, None);
        assert_eq!(events[1].data, &b"x\ny"[..]);
    }

    #[test]
    fn an_event_is_returned_once_it_is_complete_however_the_bytes_arrive() {
        let stream = b"event: e\ndata: one\n\nevent: f\ndata: two\n\n";
        for split in 0..stream.len() {
            let mut events = Events::default();
            let mut seen = Vec::new();
            for end in [split, stream.len()] {
                while let Some(event) = events.next(&stream[..end]) {
                    seen.push(event.data.into_owned());
                }
            }
            assert_eq!(seen, [b"one".to_vec(), b"two".to_vec()], "split at {split}");
        }
        assert!(Events::default().next(b"event: e\ndata: unfinished\n").is_none());
    }
}
