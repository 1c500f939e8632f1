//! Anthropic Messages bodies (`POST /v1/messages`) as the engine's neutral chat request,
//! and back. Pure conversions over bytes: no HTTP types.
//!
//! Parsing maps the body onto chat-completions messages the engine understands:
//!
//! | Messages | neutral |
//! | --- | --- |
//! | top-level `system` (string or text blocks) | one pinned `system` message |
//! | `assistant` message | one `assistant` message: its `tool_use` blocks become `tool_calls` (`arguments` = the `input` JSON), every other block a content part (`thinking` / `redacted_thinking` as a part naming a hash of the block, never its signature) |
//! | `user` message | its `tool_result` blocks become `tool` messages (`tool_call_id` = `tool_use_id`), each run of other blocks one `user` message; a string content one `user` message |
//! | `system` message inside `messages` (Claude Code sends its environment so when it does not know the model id, as behind a gateway) | one pinned `system` message, kept in its place and forwarded as its original bytes |
//! | `image` block | an `image_url` part naming a hash of the block (counted like an image of unknown size) |
//! | `document` block | a base64 PDF: a `file` part naming a hash of the block and its pages (counted per page); a text document: a text part; others as they are |
//!
//! Rendering writes the `messages` array from the compacted neutral messages and leaves
//! every other byte of the body as received (`system`, `tools`, `thinking`,
//! `context_management`, ...). A neutral message identical to one parsed from the body is
//! written as the blocks it came from, byte for byte; when all of an original message's
//! blocks are forwarded together, the message is written as its original bytes. New
//! messages are written in the Messages form: a digest as `user` text, a stub of an
//! elided tool result as a `tool_result` block. Adjacent messages of one role are merged
//! (the API wants `user` first and the roles alternating), and the request keeps at most
//! [`MAX_BREAKPOINTS`] `cache_control` breakpoints: a breakpoint that was folded away
//! moves onto the newest digest only while the request stays within the limit.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use xxhash_rust::xxh3::xxh3_64;

use super::{Fields, ListWriter, Origin, Origins, range_in};
use crate::model::{ChatRequest, Message, Role};

/// The most `cache_control` breakpoints the Messages API accepts in one request,
/// counting those in `system`, `tools` and `messages`.
pub const MAX_BREAKPOINTS: usize = 4;

/// Written as the first message when compaction left an `assistant` message first (the
/// API requires the conversation to start with `user`).
pub const OMITTED_NOTE: &str = "[COMPACTED CONTEXT] Earlier turns of this conversation were left out to fit the context window.";

/// Reads a Messages request body into the neutral request (every top-level field as
/// received, `messages` replaced by the neutral messages) and where each neutral message
/// came from: the items of [`Origins`] are the body's messages; the `system` message names
/// no item. `None` when the body is not a Messages request foldgate understands (not
/// UTF-8 JSON, no `messages` array, a role other than `user` / `assistant` / `system`, a content
/// that is neither a string nor an array of objects).
pub fn parse(body: &[u8]) -> Option<(ChatRequest, Origins)> {
    let text = std::str::from_utf8(body).ok()?;
    let fields: Fields<'_> = serde_json::from_str(text).ok()?;
    let messages_raw = fields.last("messages")?;
    let list: Vec<&RawValue> = serde_json::from_str(messages_raw.get()).ok()?;
    let mut origins = Origins { list: range_in(body, messages_raw)?, ..Origins::default() };
    let mut neutral: Vec<String> = Vec::new();
    let mut items: Vec<Range<usize>> = Vec::new();
    if let Some(system) = fields.last("system").filter(|s| s.get().trim() != "null") {
        neutral.push(neutral_system(system.get())?);
        items.push(0..0);
    }
    for (index, raw) in list.iter().enumerate() {
        let message: Incoming<'_> = serde_json::from_str(raw.get()).ok()?;
        let made = match Speaker::of(&message.role)? {
            Speaker::System => vec![neutral_system(message.content.get())?],
            speaker => {
                let assistant = speaker == Speaker::Assistant;
                let made = neutral_messages(assistant, message.content.get())?;
                made.into_iter().map(|(m, _)| m).collect()
            }
        };
        for m in made {
            neutral.push(m);
            items.push(index..index + 1);
        }
        origins.items.push(range_in(body, raw)?);
    }
    // The neutral body: the top-level fields as received, `messages` in its place.
    let range = origins.list.clone();
    let mut neutral_body = String::with_capacity(text.len() + 64);
    neutral_body.push_str(text.get(..range.start)?);
    neutral_body.push('[');
    neutral_body.push_str(&neutral.join(","));
    neutral_body.push(']');
    neutral_body.push_str(text.get(range.end..)?);
    let request = ChatRequest::parse(neutral_body.as_bytes()).ok()?;
    if request.messages().len() != items.len() {
        return None;
    }
    origins.messages = request
        .messages()
        .iter()
        .zip(items)
        .map(|(message, items)| Origin { message: message.clone(), items })
        .collect();
    Some((request, origins))
}

/// The neutral `system` message of a `system` field's raw JSON (a string or an array of
/// text blocks, kept as parts).
pub fn neutral_system(raw: &str) -> Option<String> {
    let value: Value = serde_json::from_str(raw).ok()?;
    if !(value.is_string() || value.is_array()) {
        return None;
    }
    serde_json::to_string(&json!({"role": "system", "content": value})).ok()
}

/// The neutral `system` message of a body message's raw JSON, when it is a `system`
/// message (as Claude Code sends its environment inside `messages` for a model id it
/// does not know). The session fingerprint takes it when the body has no `system` field.
pub fn neutral_system_message(message_raw: &str) -> Option<String> {
    let message: Incoming<'_> = serde_json::from_str(message_raw).ok()?;
    if message.role != "system" {
        return None;
    }
    neutral_system(message.content.get())
}

/// The first neutral `user` message of a body message's raw JSON, if it makes one (a
/// message of `tool_result` blocks only does not). The session fingerprint is taken
/// from it, whether the body was parsed or only outlined.
pub fn neutral_first_user(message_raw: &str) -> Option<String> {
    let message: Incoming<'_> = serde_json::from_str(message_raw).ok()?;
    if message.role != "user" {
        return None;
    }
    let neutral = neutral_messages(false, message.content.get())?;
    neutral.into_iter().map(|(m, _)| m).find(|m| m.starts_with(r#"{"role":"user""#))
}

/// Who a body message is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaker {
    User,
    Assistant,
    /// A `system` message inside `messages`: pinned, never merged with a neighbour.
    System,
}

impl Speaker {
    /// The speaker of `role`; `None` for a role the API does not have.
    fn of(role: &str) -> Option<Self> {
        match role {
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            "system" => Some(Self::System),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::System => "system",
        }
    }
}

/// A message of the body: its role and the raw JSON of its content.
#[derive(Deserialize)]
struct Incoming<'a> {
    role: String,
    #[serde(borrow)]
    content: &'a RawValue,
}

/// The neutral messages (JSON text) of one body message's content, with the blocks
/// each came from.
fn neutral_messages(assistant: bool, content: &str) -> Option<Vec<(String, Range<usize>)>> {
    let role = if assistant { "assistant" } else { "user" };
    let value: Value = serde_json::from_str(content).ok()?;
    let blocks = match value {
        Value::String(_) => {
            let m = json!({"role": role, "content": value});
            return Some(vec![(serde_json::to_string(&m).ok()?, 0..1)]);
        }
        Value::Array(blocks) => blocks,
        _ => return None,
    };
    let raws: Vec<&RawValue> = serde_json::from_str(content).ok()?;
    if blocks.iter().any(|b| !b.is_object()) {
        return None;
    }
    let hash = |i: usize| format!("{:016x}", xxh3_64(raws[i].get().as_bytes()));
    if assistant {
        return Some(vec![(neutral_assistant(&blocks, &hash)?, 0..blocks.len())]);
    }
    neutral_user(&blocks, &hash)
}

/// The one neutral `assistant` message of an assistant message's `blocks`: its
/// `tool_use` blocks as `tool_calls`, every other block a content part (`hash(i)`: the
/// hash of block `i`).
fn neutral_assistant(blocks: &[Value], hash: &impl Fn(usize) -> String) -> Option<String> {
    let (mut parts, mut calls) = (Vec::new(), Vec::new());
    for (i, block) in blocks.iter().enumerate() {
        if block_type(block) == "tool_use" {
            let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
            calls.push(json!({
                "id": block.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": block.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": input.to_string(),
                },
            }));
        } else {
            parts.push(neutral_part(block, || hash(i)));
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert("content".into(), if parts.is_empty() { Value::Null } else { parts.into() });
    if !calls.is_empty() {
        m.insert("tool_calls".into(), calls.into());
    }
    serde_json::to_string(&m).ok()
}

/// The neutral messages of a user message's `blocks`: each `tool_result` a tool message,
/// each run of other blocks one user message, with the blocks each came from.
fn neutral_user(
    blocks: &[Value],
    hash: &impl Fn(usize) -> String,
) -> Option<Vec<(String, Range<usize>)>> {
    let mut out = Vec::new();
    let mut run: Option<(Vec<Value>, usize)> = None;
    let flush = |run: &mut Option<(Vec<Value>, usize)>, end: usize, out: &mut Vec<_>| {
        if let Some((parts, start)) = run.take() {
            let m = json!({"role": "user", "content": parts});
            out.push((serde_json::to_string(&m).ok()?, start..end));
        }
        Some(())
    };
    for (i, block) in blocks.iter().enumerate() {
        if block_type(block) == "tool_result" {
            flush(&mut run, i, &mut out)?;
            out.push((neutral_tool_result(block, || hash(i))?, i..i + 1));
        } else {
            run.get_or_insert_with(|| (Vec::new(), i)).0.push(neutral_part(block, || hash(i)));
        }
    }
    flush(&mut run, blocks.len(), &mut out)?;
    if out.is_empty() {
        // An empty content array: one empty user message, so that nothing is lost.
        out.push((serde_json::to_string(&json!({"role": "user", "content": []})).ok()?, 0..0));
    }
    Some(out)
}

/// The neutral `tool` message of a `tool_result` block (`hash`: the block's hash).
fn neutral_tool_result(block: &Value, hash: impl Fn() -> String) -> Option<String> {
    let mut m = Map::new();
    m.insert("role".into(), json!("tool"));
    m.insert("tool_call_id".into(), block.get("tool_use_id").cloned().unwrap_or(Value::Null));
    let content = match block.get("content") {
        Some(Value::Array(parts)) => {
            Value::Array(parts.iter().map(|p| neutral_part(p, &hash)).collect())
        }
        Some(Value::String(s)) => Value::String(s.clone()),
        _ => Value::String(String::new()),
    };
    m.insert("content".into(), content);
    for key in ["is_error", "cache_control"] {
        if let Some(v) = block.get(key) {
            m.insert(key.into(), v.clone());
        }
    }
    serde_json::to_string(&m).ok()
}

/// The `type` of a block.
fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The neutral content part of a block: text and unknown blocks as they are; an image
/// as an `image_url` part naming the block's hash (the engine charges it as an image of
/// unknown size instead of its base64 text); thinking as its text, naming the block's
/// hash instead of its signature.
fn neutral_part(block: &Value, hash: impl Fn() -> String) -> Value {
    match block_type(block) {
        "image" => json!({
            "type": "image_url",
            "image_url": {"url": format!("anthropic-image:{}", hash()), "detail": "auto"},
        }),
        "thinking" => json!({
            "type": "thinking",
            "thinking": block.get("thinking").cloned().unwrap_or(Value::Null),
            "block": hash(),
        }),
        "redacted_thinking" => json!({"type": "redacted_thinking", "block": hash()}),
        "document" => neutral_document(block, hash),
        _ => block.clone(),
    }
}

/// A `document` block's neutral part: a base64 PDF as a `file` part naming the block's
/// hash and the PDF's pages (the engine charges it by page instead of its base64 text),
/// a plain-text document as a text part; any other (a URL, a file id, a PDF whose pages
/// cannot be counted) as it is.
fn neutral_document(block: &Value, hash: impl Fn() -> String) -> Value {
    let source = |key: &str| block.pointer(&format!("/source/{key}")).and_then(Value::as_str);
    match (source("type"), source("media_type"), source("data")) {
        (Some("base64"), Some("application/pdf"), Some(data)) => {
            match crate::compaction::tokens::count::base64_pdf_pages(data) {
                Some(pages) => json!({"type": "file", "file": {
                    "filename": format!("anthropic-document:{}", hash()), "pages": pages}}),
                None => block.clone(),
            }
        }
        (Some("text"), _, Some(text)) => json!({"type": "text", "text": text}),
        _ => block.clone(),
    }
}

/// The body to forward: `original` with its `messages` written from `compacted` (see the
/// module documentation); the original bytes when every message is forwarded as parsed.
/// Should the original not parse again (it always does: it was parsed into `origins`),
/// the original bytes too: forwarding them is never worse than no proxy.
pub fn render(original: &[u8], origins: &Origins, compacted: &ChatRequest) -> Bytes {
    let matches = origins.match_messages(compacted.messages());
    if origins.all_unchanged(&matches) {
        return Bytes::copy_from_slice(original);
    }
    match render_list(original, origins, compacted, &matches) {
        Some(list) => origins.splice(original, &list),
        None => Bytes::copy_from_slice(original),
    }
}

/// One block of a rendered message.
#[derive(Debug)]
enum Block<'a> {
    /// A block of the body, as received.
    Raw(&'a str),
    /// A string content of the body (its JSON string), as a text block.
    Text(&'a str),
    /// A block written here.
    New(Value),
}

/// A rendered message: consecutive pieces of one role (a `system` message alone).
#[derive(Debug)]
struct Group<'a> {
    speaker: Speaker,
    /// Per piece, the body message and blocks it came from (`None`: written here).
    pieces: Vec<Option<(usize, Range<usize>)>>,
    blocks: Vec<Block<'a>>,
    /// Index into `blocks` of a digest written here, if any.
    digest: Option<usize>,
}

/// A body message read again for rendering: its role, its content and the block range of
/// each neutral message it made (as [`neutral_messages`] made them).
struct Item<'a> {
    speaker: Speaker,
    content: Vec<Block<'a>>,
    runs: Vec<Range<usize>>,
}

/// Reads body message `raw` again.
fn item(raw: &str) -> Option<Item<'_>> {
    let message: Incoming<'_> = serde_json::from_str(raw).ok()?;
    let speaker = Speaker::of(&message.role)?;
    let content = message.content.get();
    if content.starts_with('"') {
        return Some(Item {
            speaker,
            content: vec![Block::Text(content)],
            runs: std::iter::once(0..1).collect(),
        });
    }
    let blocks: Vec<&RawValue> = serde_json::from_str(content).ok()?;
    let results = blocks
        .iter()
        .map(|b| serde_json::from_str::<Typed<'_>>(b.get()).map(|t| t.kind == "tool_result"))
        .collect::<Result<Vec<bool>, _>>()
        .ok()?;
    Some(Item {
        speaker,
        content: blocks.iter().map(|b| Block::Raw(b.get())).collect(),
        runs: runs(speaker != Speaker::User, &results),
    })
}

/// A block's `type` alone.
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Cow<'a, str>,
}

/// The block range of each neutral message of a content of blocks (`results`: which are
/// `tool_result` blocks): an assistant or system message is one (`whole`); a user
/// message makes one per `tool_result` and one per run of other blocks (one empty message
/// when it has none).
fn runs(whole: bool, results: &[bool]) -> Vec<Range<usize>> {
    if whole {
        return std::iter::once(0..results.len()).collect();
    }
    let mut out = Vec::new();
    let mut start = None;
    for (i, &result) in results.iter().enumerate() {
        if result {
            if let Some(s) = start.take() {
                out.push(s..i);
            }
            out.push(i..i + 1);
        } else {
            start.get_or_insert(i);
        }
    }
    if let Some(s) = start {
        out.push(s..results.len());
    }
    if out.is_empty() {
        out.push(0..0);
    }
    out
}

/// The messages array for `compacted`, given which of its messages match parsed ones.
fn render_list(
    original: &[u8],
    origins: &Origins,
    compacted: &ChatRequest,
    matches: &[Option<usize>],
) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(original).ok()?;
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (m, found) in compacted.messages().iter().zip(matches) {
        let (speaker, piece, blocks, digest) = match found {
            Some(i) => {
                let Origin { items, .. } = origins.messages.get(*i)?;
                if items.is_empty() {
                    continue; // The `system` message: the field goes as received.
                }
                let k = items.start;
                // Which of the item's neutral messages this is.
                let first = origins.messages[..*i]
                    .iter()
                    .rposition(|o| o.items != *items)
                    .map_or(0, |p| p + 1);
                let read = item(std::str::from_utf8(origins.item(original, k)).ok()?)?;
                let run = read.runs.get(*i - first)?.clone();
                let blocks: Vec<Block<'_>> =
                    read.content.into_iter().skip(run.start).take(run.len()).collect();
                (read.speaker, Some((k, run)), blocks, false)
            }
            None => match written(m) {
                Some((assistant, blocks, digest)) => {
                    let speaker = if assistant { Speaker::Assistant } else { Speaker::User };
                    (speaker, None, blocks, digest)
                }
                None => continue,
            },
        };
        if blocks.is_empty() && piece.as_ref().is_none_or(|(_, r)| !r.is_empty()) {
            continue;
        }
        let group = match groups.last_mut() {
            Some(g) if g.speaker == speaker && speaker != Speaker::System => g,
            _ => {
                groups.push(Group {
                    speaker,
                    pieces: Vec::new(),
                    blocks: Vec::new(),
                    digest: None,
                });
                groups.last_mut()?
            }
        };
        if digest && !blocks.is_empty() {
            group.digest = Some(group.blocks.len() + blocks.len() - 1);
        }
        group.pieces.push(piece);
        group.blocks.extend(blocks);
    }
    // The conversation starts with a user message (`system` ones aside).
    let first = groups.iter().position(|g| g.speaker != Speaker::System);
    if first.is_none_or(|f| groups[f].speaker == Speaker::Assistant) {
        let note = json!({"type": "text", "text": OMITTED_NOTE});
        groups.insert(
            first.unwrap_or(groups.len()),
            Group {
                speaker: Speaker::User,
                pieces: vec![None],
                blocks: vec![Block::New(note)],
                digest: None,
            },
        );
    }
    let fields: Fields<'_> = serde_json::from_str(text).ok()?;
    let listed = text.get(origins.list.clone())?;
    move_breakpoint(&fields, listed, &mut groups);

    let mut list = ListWriter::with_capacity(original.len());
    for group in &groups {
        match whole_original(origins, original, group) {
            Some(raw) => list.push(raw),
            None => list.push(&group_json(group)?),
        }
    }
    Some(list.finish())
}

/// A message the engine wrote, in the Messages form: (assistant, blocks, is a digest).
/// A digest becomes `user` text; a tool result a `tool_result` block; a pinned message
/// nothing (the `system` field goes as received).
fn written(m: &Message) -> Option<(bool, Vec<Block<'static>>, bool)> {
    let text_block = |t: String| Block::New(json!({"type": "text", "text": t}));
    match m.role() {
        Role::Assistant if m.is_digest() => {
            Some((false, vec![text_block(m.text().into_owned())], true))
        }
        Role::Assistant => {
            let mut blocks = content_blocks(m.content());
            for call in m.tool_calls() {
                let (id, name, arguments) = crate::model::call_parts(call);
                let input: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
                blocks.push(Block::New(
                    json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                ));
            }
            Some((true, blocks, false))
        }
        Role::Tool | Role::Function => {
            let content = match m.content() {
                Some(Value::Array(parts)) => Value::Array(
                    parts.iter().filter(|p| block_type(p) == "text").cloned().collect(),
                ),
                Some(Value::String(s)) => Value::String(s.clone()),
                _ => Value::String(String::new()),
            };
            let mut block = Map::new();
            block.insert("type".into(), json!("tool_result"));
            block.insert("tool_use_id".into(), json!(m.tool_call_id().unwrap_or_default()));
            block.insert("content".into(), content);
            for key in ["is_error", "cache_control"] {
                if let Some(v) = m.fields().and_then(|f| f.get(key)) {
                    block.insert(key.into(), v.clone());
                }
            }
            Some((false, vec![Block::New(Value::Object(block))], false))
        }
        Role::User => Some((false, content_blocks(m.content()), m.is_digest())),
        Role::System | Role::Developer | Role::Other => None,
    }
}

/// The text blocks of a neutral content (a string, or its text parts).
fn content_blocks(content: Option<&Value>) -> Vec<Block<'static>> {
    match content {
        Some(Value::String(s)) if !s.is_empty() => {
            vec![Block::New(json!({"type": "text", "text": s}))]
        }
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| block_type(p) == "text")
            .map(|p| Block::New(p.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

/// A rendered message written here: `{"role":…,"content":[…]}` of its blocks.
fn group_json(group: &Group<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(br#"{"role":""#);
    out.extend_from_slice(group.speaker.as_str().as_bytes());
    out.extend_from_slice(br#"","content":["#);
    for (i, block) in group.blocks.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match block {
            Block::Raw(raw) => out.extend_from_slice(raw.as_bytes()),
            Block::Text(string) => {
                out.extend_from_slice(br#"{"type":"text","text":"#);
                out.extend_from_slice(string.as_bytes());
                out.push(b'}');
            }
            Block::New(value) => out.extend_from_slice(&serde_json::to_vec(value).ok()?),
        }
    }
    out.extend_from_slice(b"]}");
    Some(out)
}

/// The body's bytes of the message a group is, when its pieces are exactly all the
/// blocks of one body message in order and nothing was written into it.
fn whole_original<'b>(origins: &Origins, body: &'b [u8], group: &Group<'_>) -> Option<&'b [u8]> {
    if group.blocks.iter().any(|b| matches!(b, Block::New(_))) {
        return None;
    }
    let (first, _) = group.pieces.first()?.as_ref()?;
    let raw = origins.item(body, *first);
    let total = item(std::str::from_utf8(raw).ok()?)?.content.len();
    let mut next = 0;
    for piece in &group.pieces {
        let (message, blocks) = piece.as_ref()?;
        if message != first || blocks.start != next {
            return None;
        }
        next = blocks.end;
    }
    (next == total).then_some(raw)
}

/// Moves a breakpoint that was folded away onto the newest digest, while the request
/// keeps at most [`MAX_BREAKPOINTS`]. The digest takes the `cache_control` of the next
/// breakpoint after it (so no longer-lived entry follows a shorter one), else a plain
/// ephemeral one.
fn move_breakpoint(fields: &Fields<'_>, messages_raw: &str, groups: &mut [Group<'_>]) {
    let fixed: usize = ["system", "tools"]
        .iter()
        .filter_map(|k| fields.last(k))
        .map(|raw| breakpoints(raw.get()))
        .sum();
    let in_blocks = |b: &Block<'_>| match b {
        Block::Raw(raw) => breakpoints(raw),
        Block::Text(_) => 0,
        Block::New(v) => serde_json::to_string(v).map_or(0, |s| breakpoints(&s)),
    };
    let rendered: usize = groups.iter().flat_map(|g| &g.blocks).map(in_blocks).sum();
    let lost = breakpoints(messages_raw).saturating_sub(rendered);
    if lost == 0 || fixed + rendered >= MAX_BREAKPOINTS {
        return;
    }
    let Some(g) = groups.iter().rposition(|g| g.digest.is_some()) else { return };
    let Some(d) = groups[g].digest else { return };
    let after = groups[g].blocks[d + 1..]
        .iter()
        .chain(groups[g + 1..].iter().flat_map(|g| &g.blocks))
        .find_map(|b| match b {
            Block::Raw(raw) if breakpoints(raw) > 0 => serde_json::from_str::<Value>(raw)
                .ok()
                .and_then(|v| v.get("cache_control").cloned()),
            _ => None,
        });
    if let Some(Block::New(Value::Object(block))) = groups[g].blocks.get_mut(d) {
        block.insert("cache_control".into(), after.unwrap_or_else(|| json!({"type": "ephemeral"})));
    }
}

/// The `cache_control` breakpoints in a JSON text: members named `cache_control` whose
/// value is not `null`. A member name follows `{` or `,`; inside a string the quotes of
/// `"cache_control"` are escaped, so such text is not counted.
pub fn breakpoints(json: &str) -> usize {
    const KEY: &str = "\"cache_control\"";
    json.match_indices(KEY)
        .filter(|(i, _)| json[..*i].trim_end().ends_with(['{', ',']))
        .filter(|(i, _)| {
            let rest = json[i + KEY.len()..].trim_start();
            rest.strip_prefix(':').is_some_and(|v| !v.trim_start().starts_with("null"))
        })
        .count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::DIGEST_MARKER;

    const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";

    /// A Claude Code-like body: system blocks with a breakpoint, tools, thinking, a tool
    /// loop, odd spacing and unknown fields.
    fn body() -> String {
        format!(
            r#"{{"model":"claude-sonnet-4-5","max_tokens":2048,
  "system":[{{"type":"text","text":"You are a coding agent.","cache_control":{{"type":"ephemeral"}}}}],
  "tools":[{{"name":"read","description":"Read a file","input_schema":{{"type":"object"}}}}],
  "thinking":{{"type":"enabled","budget_tokens":1024}},
  "messages":[
    {{"role":"user","content":"Fix the failing test in src/lib.rs"}},
    {{"role":"assistant","content":[{{"type":"thinking","thinking":"I should read it.","signature":"{SIGNATURE}"}},{{"type":"text","text":"Reading."}},{{"type":"tool_use","id":"toolu_1","name":"read","input":{{"path":"src/lib.rs"}}}}]}},
    {{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_1","content":"fn main() {{}}\nline 2"}},{{"type":"text","text":"also check the docs","cache_control":{{"type":"ephemeral"}}}}]}},
    {{"role":"assistant","content":[{{"type":"redacted_thinking","data":"opaque"}},{{"type":"text","text":"Done."}}]}},
    {{"role":"user","content":[{{"type":"text","text":"thanks"}},{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}}}]}}
  ],
  "context_management":{{"edits":[{{"type":"clear_tool_uses_20250919"}}]}},"stream":true}}"#
        )
    }

    fn roles(request: &ChatRequest) -> Vec<Role> {
        request.messages().iter().map(|m| m.role()).collect()
    }

    #[test]
    fn maps_blocks_onto_neutral_messages() {
        let body = body();
        let (request, origins) = parse(body.as_bytes()).unwrap();
        assert_eq!(
            roles(&request),
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::User,
                Role::Assistant,
                Role::User
            ]
        );
        let m = request.messages();
        assert_eq!(m[0].text(), "You are a coding agent.");
        assert!(m[2].makes_calls());
        let (id, name, arguments) = crate::model::call_parts(&m[2].tool_calls()[0]);
        assert_eq!((id, name, arguments), ("toolu_1", "read", r#"{"path":"src/lib.rs"}"#));
        assert_eq!(m[2].text(), "Reading.", "thinking is not the assistant's text");
        assert!(!m[2].raw().contains(SIGNATURE), "the signature stays out of the neutral form");
        assert_eq!(m[3].tool_call_id(), Some("toolu_1"));
        assert_eq!(m[3].text(), "fn main() {}\nline 2");
        assert_eq!(m[4].text(), "also check the docs");
        assert!(m[6].raw().contains("image_url"), "an image is counted as an image");
        assert!(!m[6].raw().contains("iVBORw0KGgo="));
        assert_eq!(origins.messages.len(), 7);
        assert_eq!(origins.items.len(), 5);
        assert!(origins.messages[0].items.is_empty());
        assert_eq!(origins.messages[3].items, 2..3);
        assert_eq!(origins.messages[4].items, 2..3);
        // The neutral request keeps the fields the engine reads.
        assert_eq!(request.model().as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(request.max_reply_tokens(), Some(2048));
        assert!(request.tools_raw().is_some());
    }

    #[test]
    fn a_pdf_document_is_counted_by_its_pages_and_forwarded_as_sent() {
        use base64::Engine as _;
        let mut pdf = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 3 >> endobj\n".to_vec();
        for n in 0..3 {
            pdf.extend(format!("{} 0 obj << /Type /Page /Parent 1 0 R >> endobj\n", n + 2).bytes());
        }
        pdf.extend(std::iter::repeat_n(b'x', 300_000));
        let data = base64::engine::general_purpose::STANDARD.encode(&pdf);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"document","source":{{"type":"base64","media_type":"application/pdf","data":"{data}"}}}},{{"type":"document","source":{{"type":"text","media_type":"text/plain","data":"Plain notes."}}}},{{"type":"text","text":"Summarize it."}}]}}]}}"#
        );
        let (request, origins) = parse(body.as_bytes()).unwrap();
        let parts = request.messages()[0].value()["content"].clone();
        assert_eq!(parts[0]["type"], "file");
        assert_eq!(parts[0]["file"]["pages"], 3);
        assert_eq!(parts[1], json!({"type": "text", "text": "Plain notes."}));
        let tokens = crate::compaction::tokens::message_tokens(
            crate::compaction::tokens::Encoding::O200kBase,
            &request.messages()[0],
        );
        let pages = 3 * crate::compaction::tokens::count::PDF_PAGE_TOKENS;
        assert!(tokens > pages && tokens < pages + 100, "{tokens}, not the base64 text");
        assert_eq!(render(body.as_bytes(), &origins, &request), body.as_bytes());
    }

    #[test]
    fn round_trip_without_compaction_gives_the_original_bytes() {
        let bodies = [
            body(),
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#.into(),
            r#"{"messages":[{"role":"user","content":[]},{"role":"assistant","content":"x"}],"model":"m"}"#.into(),
            r#"{"system":"s","messages":[]}"#.into(),
        ];
        for body in bodies {
            let (request, origins) = parse(body.as_bytes()).unwrap();
            assert_eq!(render(body.as_bytes(), &origins, &request), body.as_bytes(), "{body}");
            // The same messages, newly allocated, render the same bytes too.
            let copies: Vec<Arc<Message>> = request
                .messages()
                .iter()
                .map(|m| {
                    Arc::new(
                        Message::from_raw(RawValue::from_string(m.raw().into()).unwrap()).unwrap(),
                    )
                })
                .collect();
            let again = request.with_messages(copies);
            assert_eq!(render(body.as_bytes(), &origins, &again), body.as_bytes());
        }
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for body in [
            &b"not json"[..],
            br#"{"model":"m"}"#,
            br#"{"messages":[{"role":"tool","content":"x"}]}"#,
            br#"{"messages":[{"role":"system","content":7}]}"#,
            br#"{"messages":[{"role":"user","content":[1]}]}"#,
            br#"{"messages":[{"role":"user"}]}"#,
        ] {
            assert!(parse(body).is_none(), "{}", String::from_utf8_lossy(body));
        }
    }

    fn digest(text: &str) -> Arc<Message> {
        Arc::new(
            Message::from_value(
                json!({"role": "assistant", "content": format!("{DIGEST_MARKER}\n{text}")}),
            )
            .unwrap(),
        )
    }

    fn rendered(body: &str, messages: Vec<Arc<Message>>) -> Value {
        let (request, origins) = parse(body.as_bytes()).unwrap();
        let out = render(body.as_bytes(), &origins, &request.with_messages(messages));
        serde_json::from_slice(&out).unwrap()
    }

    /// Roles alternate, user first, and every tool_use is answered in the next message.
    fn assert_valid(value: &Value) {
        let messages = value["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "user");
        for pair in messages.windows(2) {
            assert_ne!(pair[0]["role"], pair[1]["role"], "{value:#}");
        }
        for (i, m) in messages.iter().enumerate() {
            let Some(blocks) = m["content"].as_array() else { continue };
            for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                let next = messages[i + 1]["content"].as_array().unwrap();
                assert!(next.iter().any(|r| r["tool_use_id"] == b["id"]), "{value:#}");
            }
        }
        assert!(breakpoints(&value.to_string()) <= MAX_BREAKPOINTS);
    }

    #[test]
    fn a_fold_renders_the_digest_as_user_text_and_keeps_the_rest_byte_for_byte() {
        let body = body();
        let (request, _) = parse(body.as_bytes()).unwrap();
        let m = request.messages();
        // Folded: the first tool loop; kept: the task, the user's words, the tail.
        let compacted = vec![
            m[0].clone(),
            m[1].clone(),
            digest("I read src/lib.rs."),
            m[4].clone(),
            m[5].clone(),
            m[6].clone(),
        ];
        let value = rendered(&body, compacted);
        assert_valid(&value);
        let messages = value["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{value:#}");
        let first = messages[0]["content"].as_array().unwrap();
        assert_eq!(first[0]["text"], "Fix the failing test in src/lib.rs");
        assert!(first[1]["text"].as_str().unwrap().starts_with(DIGEST_MARKER));
        assert_eq!(first[2]["text"], "also check the docs");
        // Every other field as received; the thinking assistant message whole.
        for field in ["system", "tools", "thinking", "context_management", "stream"] {
            let original: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(value[field], original[field], "{field}");
        }
        let out = {
            let (request, origins) = parse(body.as_bytes()).unwrap();
            let m = request.messages();
            let c = vec![
                m[0].clone(),
                m[1].clone(),
                digest("x"),
                m[4].clone(),
                m[5].clone(),
                m[6].clone(),
            ];
            String::from_utf8(render(body.as_bytes(), &origins, &request.with_messages(c)).to_vec())
                .unwrap()
        };
        assert!(out.contains(r#"{"role":"assistant","content":[{"type":"redacted_thinking","data":"opaque"},{"type":"text","text":"Done."}]}"#));
        assert!(out.contains(r#"{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}"#));
    }

    #[test]
    fn thinking_blocks_and_tool_pairs_stay_byte_identical() {
        let body = body();
        let (request, origins) = parse(body.as_bytes()).unwrap();
        let m = request.messages();
        // Only the closing user message dropped: the tool loop is forwarded as it was.
        let compacted = request.with_messages(m[..6].to_vec());
        let out =
            String::from_utf8(render(body.as_bytes(), &origins, &compacted).to_vec()).unwrap();
        let thinking = format!(
            r#"{{"role":"assistant","content":[{{"type":"thinking","thinking":"I should read it.","signature":"{SIGNATURE}"}},{{"type":"text","text":"Reading."}},{{"type":"tool_use","id":"toolu_1","name":"read","input":{{"path":"src/lib.rs"}}}}]}}"#
        );
        assert!(out.contains(&thinking), "{out}");
        assert!(out.contains(r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"fn main() {}\nline 2"},{"type":"text","text":"also check the docs","cache_control":{"type":"ephemeral"}}]}"#), "{out}");
    }

    #[test]
    fn a_stub_is_a_tool_result_with_the_same_id() {
        let body = body();
        let (request, _) = parse(body.as_bytes()).unwrap();
        let m = request.messages();
        let stub = Arc::new(
            Message::from_value(json!({"role":"tool","tool_call_id":"toolu_1","content":"[elided: output of `read`]"}))
                .unwrap(),
        );
        let compacted = vec![
            m[0].clone(),
            m[1].clone(),
            m[2].clone(),
            stub,
            m[4].clone(),
            m[5].clone(),
            m[6].clone(),
        ];
        let value = rendered(&body, compacted);
        assert_valid(&value);
        let results = value["messages"][2]["content"].as_array().unwrap();
        assert_eq!(results[0]["type"], "tool_result");
        assert_eq!(results[0]["tool_use_id"], "toolu_1");
        assert_eq!(results[0]["content"], "[elided: output of `read`]");
        assert_eq!(results[1]["text"], "also check the docs");
    }

    #[test]
    fn a_folded_breakpoint_moves_onto_the_digest_within_the_limit() {
        let body = body();
        let (request, _) = parse(body.as_bytes()).unwrap();
        let m = request.messages();
        // The user text that held a breakpoint is folded with the tool loop.
        let compacted =
            vec![m[0].clone(), m[1].clone(), digest("folded"), m[5].clone(), m[6].clone()];
        let value = rendered(&body, compacted);
        assert_valid(&value);
        let first = value["messages"][0]["content"].as_array().unwrap();
        assert_eq!(first[1]["cache_control"], json!({"type": "ephemeral"}), "{value:#}");
        assert_eq!(breakpoints(&value.to_string()), 2);

        // At the limit already: nothing is added.
        let tool = |n: &str| {
            format!(
                r#"{{"name":"{n}","input_schema":{{}},"cache_control":{{"type":"ephemeral"}}}},"#
            )
        };
        let full = body.replace(
            r#""tools":["#,
            &format!(r#""tools":[{}{}{}"#, tool("a"), tool("b"), tool("c")),
        );
        let (request, origins) = parse(full.as_bytes()).unwrap();
        let m = request.messages();
        let c = vec![m[0].clone(), m[1].clone(), digest("folded"), m[5].clone(), m[6].clone()];
        let out = render(full.as_bytes(), &origins, &request.with_messages(c));
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert!(value["messages"][0]["content"][1].get("cache_control").is_none());
    }

    #[test]
    fn an_assistant_left_first_gets_a_note_before_it() {
        let body = body();
        let (request, _) = parse(body.as_bytes()).unwrap();
        let m = request.messages();
        let value = rendered(&body, vec![m[0].clone(), m[5].clone(), m[6].clone()]);
        assert_valid(&value);
        assert_eq!(value["messages"][0]["content"][0]["text"], OMITTED_NOTE);
    }

    #[test]
    fn counts_breakpoints_not_mentions() {
        assert_eq!(breakpoints(r#"{"cache_control":{"type":"ephemeral"}}"#), 1);
        assert_eq!(breakpoints(r#"{"a":1, "cache_control" : null}"#), 0);
        assert_eq!(breakpoints(r#"{"text":"say {\"cache_control\": 1}"}"#), 0);
    }

    #[test]
    fn the_fingerprint_messages_match_the_parsed_ones() {
        let body = body();
        let (request, _) = parse(body.as_bytes()).unwrap();
        let value: Value = serde_json::from_str(&body).unwrap();
        let system = neutral_system(&value["system"].to_string()).unwrap();
        assert_eq!(system, request.messages()[0].raw());
        let user = neutral_first_user(&value["messages"][0].to_string()).unwrap();
        assert_eq!(user, request.messages()[1].raw());
    }

    #[test]
    fn system_messages_inside_messages_are_pinned_in_place_and_forwarded_whole() {
        // As Claude Code sends a model id it does not know: its environment as `system`
        // messages between the turns.
        let body = r#"{"model":"gateway-claude","max_tokens":10,"messages":[{"role":"system","content":"<env>cwd: /repo</env>"},{"role":"user","content":"Fix the bug."},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a.rs\nb.rs"}]},{"role":"system","content":[{"type":"text","text":"Reminder: be brief."}]},{"role":"user","content":"go on"},{"role":"assistant","content":"Done."},{"role":"user","content":"thanks"}]}"#;
        let (request, origins) = parse(body.as_bytes()).unwrap();
        let roles: Vec<Role> = request.messages().iter().map(|m| m.role()).collect();
        use Role::*;
        assert_eq!(roles, [System, User, Assistant, Tool, System, User, Assistant, User]);
        // Unchanged: the body as received.
        assert_eq!(render(body.as_bytes(), &origins, &request), body.as_bytes());
        // The tool loop folded: both system messages stay whole, in their places.
        let m = request.messages();
        let compacted = vec![
            m[0].clone(),
            m[1].clone(),
            digest("I listed the files."),
            m[4].clone(),
            m[5].clone(),
            m[6].clone(),
            m[7].clone(),
        ];
        let out = render(body.as_bytes(), &origins, &request.with_messages(compacted));
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains(r#"{"role":"system","content":"<env>cwd: /repo</env>"}"#), "{text}");
        assert!(text.contains(
            r#"{"role":"system","content":[{"type":"text","text":"Reminder: be brief."}]}"#
        ));
        let value: Value = serde_json::from_str(text).unwrap();
        let roles: Vec<&str> = value["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "system", "user", "assistant", "user"]);
        assert!(text.contains("I listed the files."));
        // A tail that starts with the assistant gets the note after the system message.
        let tail = vec![m[0].clone(), m[6].clone(), m[7].clone()];
        let value = rendered(body, tail);
        assert_eq!(value["messages"][0]["role"], "system");
        assert_eq!(value["messages"][1]["content"][0]["text"], OMITTED_NOTE);
        assert_eq!(value["messages"][2]["role"], "assistant");
    }
}
