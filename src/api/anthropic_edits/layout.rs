//! A Messages body's `messages` and their blocks as they lie in the body's text, for the
//! edits that rewrite some blocks and keep every other byte.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::json_text::{Object, array_items};

/// The layout of a body's messages: where each message and block lies in its text.
#[derive(Debug)]
pub struct Layout<'a> {
    /// Where the `messages` array lies in the body.
    pub list: Range<usize>,
    /// The messages, in order.
    pub messages: Vec<Msg<'a>>,
}

/// One message.
#[derive(Debug)]
pub struct Msg<'a> {
    /// Its whole text.
    pub raw: &'a str,
    /// True for `assistant`, false for `user`.
    pub assistant: bool,
    /// Where its `content` value lies in the body.
    pub content: Range<usize>,
    /// A string content (its JSON string text), or the blocks.
    pub body: Content<'a>,
}

/// A message's content.
#[derive(Debug)]
pub enum Content<'a> {
    /// A string, as its JSON text (quotes and escapes included).
    Text(&'a str),
    /// Blocks.
    Blocks(Vec<Blk<'a>>),
}

/// One block: its text, where it lies in the body, and the members the edits read.
#[derive(Debug)]
pub struct Blk<'a> {
    /// Its whole text.
    pub raw: &'a str,
    /// Where it lies in the body.
    pub range: Range<usize>,
    /// The members the edits read.
    pub head: Head<'a>,
}

/// The members of a block the edits read.
#[derive(Debug, Default, Deserialize)]
pub struct Head<'a> {
    /// `type`.
    #[serde(rename = "type", borrow, default)]
    pub kind: Cow<'a, str>,
    /// `id` of a `tool_use`.
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// `name` of a `tool_use`.
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    /// `tool_use_id` of a `tool_result`.
    #[serde(borrow, default)]
    pub tool_use_id: Option<Cow<'a, str>>,
    /// `content` of a `tool_result` or `compaction`.
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    /// `input` of a `tool_use`.
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
}

impl Blk<'_> {
    /// A `thinking` or `redacted_thinking` block.
    pub fn is_thinking(&self) -> bool {
        matches!(&*self.head.kind, "thinking" | "redacted_thinking")
    }
}

impl<'a> Msg<'a> {
    /// Its blocks (none for a string content).
    pub fn blocks(&self) -> &[Blk<'a>] {
        match &self.body {
            Content::Blocks(blocks) => blocks,
            Content::Text(_) => &[],
        }
    }

    /// A user message whose content is `tool_result` blocks only (an empty list too).
    pub fn results_only(&self) -> bool {
        !self.assistant
            && matches!(&self.body, Content::Blocks(b) if b.iter().all(|b| b.head.kind == "tool_result"))
    }
}

/// Reads the messages of the body `text`; `None` when it is not a Messages body this
/// understands (no `messages` array, a role other than `user` / `assistant`, a content
/// that is neither a string nor an array of objects).
pub fn read(text: &str) -> Option<Layout<'_>> {
    let top = Object::parse(text)?;
    let list = top.get("messages")?.value.clone();
    let mut messages = Vec::new();
    for (raw, range) in array_items(text.get(list.clone())?)? {
        messages.push(message(raw, list.start + range.start)?);
    }
    Some(Layout { list, messages })
}

/// One message whose text `raw` starts at `at` in the body.
fn message(raw: &str, at: usize) -> Option<Msg<'_>> {
    let object = Object::parse(raw)?;
    let assistant = match serde_json::from_str::<&str>(object.value(raw, "role")?).ok()? {
        "assistant" => true,
        "user" => false,
        _ => return None,
    };
    let range = object.get("content")?.value.clone();
    let content = at + range.start..at + range.end;
    let value = raw.get(range)?;
    let body = if value.starts_with('"') {
        Content::Text(value)
    } else {
        let mut blocks = Vec::new();
        for (block, r) in array_items(value)? {
            if !block.starts_with('{') {
                return None;
            }
            let head: Head<'_> = serde_json::from_str(block).ok()?;
            let range = content.start + r.start..content.start + r.end;
            blocks.push(Blk { raw: block, range, head });
        }
        Content::Blocks(blocks)
    };
    Some(Msg { raw, assistant, content, body })
}

/// A replacement of a range of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    /// The range replaced.
    pub range: Range<usize>,
    /// What replaces it.
    pub text: String,
}

/// `text` with `splices` (in any order) applied; `None` when two overlap.
pub fn apply(text: &str, mut splices: Vec<Splice>) -> Option<String> {
    splices.sort_by_key(|s| s.range.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for s in splices {
        out.push_str(text.get(at..s.range.start)?);
        out.push_str(&s.text);
        at = s.range.end;
    }
    out.push_str(text.get(at..)?);
    Some(out)
}
