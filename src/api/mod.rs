//! API shapes as bodies, without HTTP: each file converts one shape's request body into
//! the engine's neutral request (chat-completions messages, [`crate::model::ChatRequest`])
//! and writes the body to forward from the compacted neutral request. The proxy's
//! dialects (`http::dialect`) and the offline commands (`compact`, `replay`) share them.
//!
//! A shape other than chat completions keeps its own items: [`Origins`] remembers, per
//! neutral message, the original item(s) it came from, and rendering writes every
//! forwarded neutral message that is byte-identical to an original one as those items,
//! byte for byte. Only messages the engine wrote (digests, stubs of elided output) are
//! written in the shape's own form, and every other top-level field stays as received.

pub mod anthropic_edits;
pub mod chat;
pub mod compaction_item;
pub mod event_stream;
pub mod json_text;
pub mod messages;
pub mod responses;
pub mod responses_output;

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::model::Message;

/// An API shape foldgate can compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/responses`.
    Responses,
    /// Anthropic's `POST /v1/messages`.
    Messages,
}

impl Api {
    /// The shape's name, as `--api` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Responses => "responses",
            Self::Messages => "messages",
        }
    }
}

/// Where the neutral messages of a converted body came from.
///
/// The converted list (`input`, `messages`) is one value of the body (`list`); its items
/// lie at `items`; every neutral message names the items it came from. Several neutral
/// messages may share an item (a shape whose one item holds what chat completions spells
/// as several messages), and an empty range marks a message made of another field (e.g.
/// `instructions`), which rendering never writes into the list.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    /// The byte range of the converted list's value in the body.
    pub list: Range<usize>,
    /// The byte range of each of the list's items in the body, in order.
    pub items: Vec<Range<usize>>,
    /// One per neutral message, in order.
    pub messages: Vec<Origin>,
    /// The request relies on conversation state the provider keeps (e.g. a
    /// `previous_response_id`): it is forwarded as received, never compacted.
    pub server_state: bool,
}

/// Where one neutral message came from.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The neutral message as converted.
    pub message: Arc<Message>,
    /// Indices into [`Origins::items`]; empty for a message made of another field.
    pub items: Range<usize>,
}

impl Origins {
    /// For each message of `compacted`, the index of the original neutral message it is
    /// byte-identical to, or `None` for a message the engine wrote. Matched in order: the
    /// engine keeps the order of what it keeps, so the search starts after the last
    /// match (and only falls back to the whole list when that finds nothing). An original
    /// is matched at most once, so its items are never written twice.
    pub fn match_messages(&self, compacted: &[Arc<Message>]) -> Vec<Option<usize>> {
        let mut used = vec![false; self.messages.len()];
        let mut next = 0;
        compacted
            .iter()
            .map(|m| {
                let free = |k: &usize| {
                    let o = &self.messages[*k].message;
                    !used[*k] && o.hash() == m.hash() && o.raw() == m.raw()
                };
                let found = (next..self.messages.len()).find(free).or_else(|| (0..next).find(free));
                if let Some(k) = found {
                    used[k] = true;
                    next = k + 1;
                }
                found
            })
            .collect()
    }

    /// True when `matches` (from [`Origins::match_messages`]) is every original message,
    /// in order: the original body is then what is forwarded.
    pub fn all_unchanged(&self, matches: &[Option<usize>]) -> bool {
        matches.len() == self.messages.len()
            && matches.iter().enumerate().all(|(i, m)| *m == Some(i))
    }

    /// The raw text of item `i` in `body`.
    pub fn item<'a>(&self, body: &'a [u8], i: usize) -> &'a [u8] {
        self.items.get(i).and_then(|r| body.get(r.clone())).unwrap_or_default()
    }

    /// `body` with the converted list's value replaced by `list`: every other byte as
    /// received.
    pub fn splice(&self, body: &[u8], list: &[u8]) -> Bytes {
        let (Some(head), Some(tail)) = (body.get(..self.list.start), body.get(self.list.end..))
        else {
            return Bytes::copy_from_slice(body);
        };
        let mut out = Vec::with_capacity(head.len() + list.len() + tail.len());
        out.extend_from_slice(head);
        out.extend_from_slice(list);
        out.extend_from_slice(tail);
        Bytes::from(out)
    }
}

/// Writes a JSON array item by item (`[`, the items separated by commas, `]`); an
/// original item that consecutive neutral messages share is written once.
#[derive(Debug)]
pub struct ListWriter {
    out: Vec<u8>,
    /// The original items of the last [`ListWriter::push_items`].
    last: Range<usize>,
    empty: bool,
}

impl ListWriter {
    /// An empty list with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        let mut out = Vec::with_capacity(capacity + 2);
        out.push(b'[');
        Self { out, last: 0..0, empty: true }
    }

    /// Appends one item's JSON text.
    pub fn push(&mut self, item: &[u8]) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out.extend_from_slice(item);
    }

    /// Appends the original items `range` of `origins` from `body`, skipping those the
    /// previous call wrote (a neutral message sharing an item with the one before it).
    pub fn push_items(&mut self, origins: &Origins, body: &[u8], range: Range<usize>) {
        for i in range.clone() {
            if !self.last.contains(&i) {
                self.push(origins.item(body, i));
            }
        }
        self.last = range;
    }

    /// Appends a value the renderer built.
    pub fn push_value(&mut self, value: &serde_json::Value) {
        // A `Value` always serializes.
        if let Ok(text) = serde_json::to_vec(value) {
            self.push(&text);
        }
    }

    /// The finished array.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        self.out
    }
}

/// A JSON object's members as borrowed raw values, in order (duplicates kept).
pub struct Fields<'a>(pub Vec<(String, &'a RawValue)>);

impl<'a> Fields<'a> {
    /// The last member named `key` (the one a parser keeps).
    pub fn last(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut fields = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    fields.push((k, map.next_value::<&'de RawValue>()?));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(V)
    }
}

/// The byte range of `raw` inside `body`, when `raw` was borrowed from it (as serde_json
/// borrows a `&RawValue` from the slice it parses).
pub fn range_in(body: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    slice_range(body, raw.get().as_bytes())
}

/// The byte range of `part` inside `body`, when `part` was borrowed from it.
pub fn slice_range(body: &[u8], part: &[u8]) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= body.len()).then_some(start..end)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(text: &str) -> Arc<Message> {
        Arc::new(Message::from_value(json!({"role": "user", "content": text})).unwrap())
    }

    fn origins(texts: &[&str]) -> Origins {
        let messages = texts
            .iter()
            .enumerate()
            .map(|(i, t)| Origin { message: message(t), items: i..i + 1 })
            .collect();
        Origins { messages, ..Origins::default() }
    }

    #[test]
    fn messages_match_in_order_and_new_ones_do_not() {
        let o = origins(&["a", "b", "a", "c"]);
        let kept = [message("a"), message("digest"), message("a"), message("c")];
        assert_eq!(o.match_messages(&kept), [Some(0), None, Some(2), Some(3)]);
        let all = [message("a"), message("b"), message("a"), message("c")];
        assert!(o.all_unchanged(&o.match_messages(&all)));
        assert!(!o.all_unchanged(&o.match_messages(&all[..3])));
        // An original is matched once: a second copy is a new message.
        let twice = [message("b"), message("b")];
        assert_eq!(o.match_messages(&twice), [Some(1), None]);
    }

    #[test]
    fn shared_items_are_written_once_and_the_list_is_spliced_in() {
        let body = br#"{"x":1,"list":[{"a":1},{"b":2}],"y":2}"#;
        let list = 14..31;
        let o = Origins { list, items: vec![15..22, 23..30], ..Origins::default() };
        let mut w = ListWriter::with_capacity(16);
        w.push_items(&o, body, 0..2);
        w.push_items(&o, body, 1..2);
        w.push_value(&json!({"c": 3}));
        let out = o.splice(body, &w.finish());
        assert_eq!(&out[..], br#"{"x":1,"list":[{"a":1},{"b":2},{"c":3}],"y":2}"#);
    }
}
