//! The Responses API (`POST /v1/responses`) as neutral chat messages, and back.
//!
//! `instructions` becomes a pinned `system` message made of that field (it is never
//! written into `input`). `input` is a string (one user message) or a list of items:
//!
//! - `message` items (roles `user`, `assistant`, `system`, `developer`) become messages of
//!   that role; `input_text` / `output_text` parts become text parts, `input_image` image
//!   parts (for token counting), any other part a text part holding its JSON.
//! - A call (`function_call`, or any `*_call` item with a `call_id`: custom tools, local
//!   shell, computer use) becomes a `tool_calls` entry of an assistant message: calls in a
//!   row share one, and so does an assistant `message` right before them. Its output
//!   (`*_call_output` with the same `call_id`) becomes a `tool` message. An output whose
//!   call is not in the run of calls right before it makes the body one foldgate does not
//!   understand (it is forwarded as received), so a call and its output are never split.
//! - `reasoning` items and items foldgate cannot read (unknown types, server-side tool
//!   calls without a `call_id`) travel inside the neutral message of the item after them
//!   (the last ones inside the message before them): kept or dropped with it, never
//!   edited. `compaction` items are pinned (`developer` messages holding their JSON).
//! - `item_reference` items, `previous_response_id` and `conversation` rely on state the
//!   provider keeps: such a request is forwarded as received ([`Origins::server_state`]).
//!
//! Rendering writes every kept neutral message as its original items, byte for byte;
//! digests become assistant `message` items, a stub of elided output becomes its original
//! output item with `output` replaced.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::{ListWriter, Origin, Origins, range_in};
use crate::model::{ChatRequest, Message, Role, call_parts, content_text};

/// The top-level fields conversion reads; every other field stays as received.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow)]
    conversation: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
}

/// The body as a neutral request and the origins of its messages; `None` when it is not
/// a Responses request foldgate understands (forwarded as received then).
pub fn parse(body: &[u8]) -> Option<(ChatRequest, Origins)> {
    let top: Top<'_> = serde_json::from_slice(body).ok()?;
    let input = top.input?;
    let mut origins = Origins { list: range_in(body, input)?, ..Origins::default() };
    origins.server_state = top.previous_response_id.is_some() || top.conversation.is_some();
    let mut builder = Builder::default();
    if let Some(instructions) = top.instructions {
        builder.messages.push((instructions_message(instructions.get())?, 0..0));
    }
    if input.get().starts_with('"') {
        origins.items.push(origins.list.clone());
        builder.messages.push((text_input_message(input.get())?, 0..1));
    } else {
        let items: Vec<&RawValue> = serde_json::from_str(input.get()).ok()?;
        for (i, raw) in items.iter().enumerate() {
            origins.items.push(range_in(body, raw)?);
            let item: Value = serde_json::from_str(raw.get()).ok()?;
            match builder.item(i, &item)? {
                Seen::Converted => {}
                Seen::Reference => origins.server_state = true,
            }
        }
        builder.finish(&items)?;
    }
    for (value, items) in builder.messages {
        let message = Arc::new(Message::from_value(value).ok()?);
        origins.messages.push(Origin { message, items });
    }
    let mut fields = Vec::new();
    let raw = |v: &RawValue| v.to_owned();
    if let Some(model) = top.model {
        fields.push(("model".to_owned(), raw(model)));
    }
    if let Some(max) = top.max_output_tokens {
        fields.push(("max_completion_tokens".to_owned(), raw(max)));
    }
    if let Some(tools) = top.tools.and_then(neutral_tools) {
        fields.push(("tools".to_owned(), tools));
    }
    // What names the conversation beside its first messages (the session key's scope).
    for (name, value) in [("prompt_cache_key", top.prompt_cache_key), ("metadata", top.metadata)] {
        if let Some(value) = value {
            fields.push((name.to_owned(), raw(value)));
        }
    }
    let messages = origins.messages.iter().map(|o| o.message.clone()).collect();
    let request = ChatRequest::from_raw_fields(fields, messages).ok()?;
    Some((request, origins))
}

/// The body to forward for `compacted` (the neutral request the engine wrote from the
/// one [`parse`] gave): the original body with `input` rewritten, every kept message as
/// its original items, byte for byte. When every original message is kept, in order,
/// `original` itself.
pub fn render(original: &Bytes, origins: &Origins, compacted: &ChatRequest) -> Bytes {
    let messages = compacted.messages();
    let matches = origins.match_messages(messages);
    if origins.all_unchanged(&matches) {
        return original.clone();
    }
    let text_input = original.get(origins.list.start) == Some(&b'"');
    let mut list = ListWriter::with_capacity(origins.list.len());
    let mut next = 0;
    for (message, found) in messages.iter().zip(&matches) {
        match found {
            Some(k) => {
                let origin = &origins.messages[*k];
                if text_input && !origin.items.is_empty() {
                    // `input` was a string: the same text as a user message item.
                    let mut item = b"{\"role\":\"user\",\"content\":".to_vec();
                    item.extend_from_slice(origins.item(original, 0));
                    item.push(b'}');
                    list.push(&item);
                } else {
                    list.push_items(origins, original, origin.items.clone());
                }
                next = k + 1;
            }
            None => write_new(&mut list, origins, original, message, next),
        }
    }
    origins.splice(original, &list.finish())
}

/// The neutral JSON text of a body's first system (or developer) message and of its first
/// user message, from the raw `instructions` and `input`, as [`parse`] makes them, reading
/// only the first items: the session fingerprint of a request known by its outline.
/// `None` when that takes more (a `compaction` item before any system message, an
/// `item_reference`, no user message): the body is parsed then.
///
/// Its parts are made by the given functions, which a caller may answer from what it made
/// for the same text before: the neutral text of `instructions` ([`instructions_text`]),
/// of an `input` that is a string ([`text_input`]), and what the fingerprint reads of
/// each item ([`first_item`]).
pub fn fingerprint_messages<S>(
    instructions: Option<&str>,
    input: &str,
    instructions_text: impl FnOnce(&str) -> Option<S>,
    text_input: impl FnOnce(&str) -> Option<S>,
    mut item: impl FnMut(&[u8]) -> Option<FirstItem<S>>,
) -> Option<(Option<S>, Option<S>)> {
    let mut system = match instructions {
        Some(raw) => Some(instructions_text(raw)?),
        None => None,
    };
    if input.starts_with('"') {
        return Some((system, Some(text_input(input)?)));
    }
    let mut user = None;
    for raw in crate::outline::array_elements(input.as_bytes()) {
        if system.is_some() && user.is_some() {
            break;
        }
        match item(raw?)? {
            FirstItem::User(text) if user.is_none() => user = Some(text?),
            FirstItem::System(text) if system.is_none() => system = Some(text?),
            // A pinned item is a developer message of its own.
            FirstItem::Pinned if system.is_none() => return None,
            _ => {}
        }
    }
    user.is_some().then_some((system, user))
}

/// What the session fingerprint reads of one item of `input`, the neutral JSON text of a
/// message as `S` (`None`: the message does not convert).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstItem<S> {
    /// A `user` message.
    User(Option<S>),
    /// A `system` or `developer` message.
    System(Option<S>),
    /// A `compaction` item: the first system message when none came before it.
    Pinned,
    /// Anything else: read past.
    Other,
}

impl<S> FirstItem<S> {
    /// The same item with its text made into `T`.
    pub fn map<T>(self, f: impl Fn(S) -> T) -> FirstItem<T> {
        match self {
            FirstItem::User(text) => FirstItem::User(text.map(f)),
            FirstItem::System(text) => FirstItem::System(text.map(f)),
            FirstItem::Pinned => FirstItem::Pinned,
            FirstItem::Other => FirstItem::Other,
        }
    }
}

/// [`FirstItem`] of one raw item of `input`; `None` when the fingerprint needs the whole
/// parse (an `item_reference`, an item that does not read).
pub fn first_item(raw: &[u8]) -> Option<FirstItem<String>> {
    let item: Value = serde_json::from_slice(raw).ok()?;
    Some(match kind(&item)? {
        Kind::Message("user") => FirstItem::User(neutral_text(item_message("user", &item))),
        Kind::Message(role @ ("system" | "developer")) => {
            FirstItem::System(neutral_text(item_message(role, &item)))
        }
        Kind::Pinned => FirstItem::Pinned,
        Kind::Reference => return None,
        _ => FirstItem::Other,
    })
}

/// The neutral JSON text of the system message `instructions` (raw JSON) makes.
pub fn instructions_text(raw: &str) -> Option<String> {
    neutral_text(instructions_message(raw)?)
}

/// The neutral JSON text of the user message an `input` that is a string (raw JSON)
/// makes.
pub fn text_input(raw: &str) -> Option<String> {
    neutral_text(text_input_message(raw)?)
}

/// A neutral message's JSON text, as the parsed request holds it.
fn neutral_text(message: Value) -> Option<String> {
    Message::from_value(message).ok().map(|m| m.raw().to_owned())
}

/// The neutral system message of `instructions` (raw JSON): its text, or the JSON of
/// anything else.
fn instructions_message(raw: &str) -> Option<Value> {
    let content = match serde_json::from_str::<Value>(raw).ok()? {
        Value::String(s) => Value::String(s),
        other => Value::String(other.to_string()),
    };
    Some(json!({"role": "system", "content": content}))
}

/// The neutral user message of an `input` that is a string (raw JSON).
fn text_input_message(raw: &str) -> Option<Value> {
    let text: String = serde_json::from_str(raw).ok()?;
    Some(json!({"role": "user", "content": text}))
}

/// The neutral message of a `message` item with `role`.
fn item_message(role: &str, item: &Value) -> Value {
    json!({"role": role, "content": neutral_content(item.get("content"))})
}

/// What an item was, beyond its conversion.
enum Seen {
    Converted,
    /// An `item_reference`: the request relies on items the provider stored.
    Reference,
}

/// The kinds of items.
enum Kind<'a> {
    /// A `message` (or an item with a `role` and no `type`).
    Message(&'a str),
    /// A call with a `call_id`.
    Call { call_id: &'a str },
    /// A call's output.
    Output { call_id: &'a str },
    /// Kept pinned in place (`compaction`).
    Pinned,
    /// `reasoning`, and anything foldgate cannot read: carried by a neighbour.
    Carried,
    /// `item_reference`.
    Reference,
}

fn kind(item: &Value) -> Option<Kind<'_>> {
    let object = item.as_object()?;
    let str_of = |k: &str| object.get(k).and_then(Value::as_str);
    let kind = str_of("type");
    let call_id = str_of("call_id");
    Some(match (kind, call_id) {
        (None | Some("message"), _) => match str_of("role") {
            Some(role @ ("user" | "assistant" | "system" | "developer")) => Kind::Message(role),
            _ => Kind::Carried,
        },
        (Some("item_reference"), _) => Kind::Reference,
        (Some(t), _) if t.starts_with("compaction") => Kind::Pinned,
        (Some(t), Some(call_id)) if t.ends_with("_call_output") => Kind::Output { call_id },
        (Some(t), Some(call_id)) if t.ends_with("_call") => Kind::Call { call_id },
        _ => Kind::Carried,
    })
}

/// The neutral messages being built, each with the items it came from.
#[derive(Default)]
struct Builder {
    messages: Vec<(Value, Range<usize>)>,
    /// The first item waiting to travel with the next message.
    pending: Option<usize>,
    /// The assistant message that calls in a row join, with the `call_id`s it made and
    /// whether outputs have started (a call after an output starts a new message).
    open: Option<(usize, Vec<String>, bool)>,
}

impl Builder {
    fn item(&mut self, i: usize, item: &Value) -> Option<Seen> {
        match kind(item)? {
            Kind::Reference => {
                self.pending.get_or_insert(i);
                return Some(Seen::Reference);
            }
            Kind::Carried => {
                self.pending.get_or_insert(i);
            }
            Kind::Pinned => {
                let content = item.to_string();
                self.push(json!({"role": "developer", "content": content}), i);
                self.open = None;
            }
            Kind::Message(role) => {
                let at = self.push(item_message(role, item), i);
                self.open = (role == "assistant").then(|| (at, Vec::new(), false));
            }
            Kind::Call { call_id } => {
                let (name, arguments) = call_of(item);
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                });
                let start = self.pending.take().unwrap_or(i);
                match &mut self.open {
                    Some((at, calls, false)) if self.messages[*at].1.end == start => {
                        let (message, items) = &mut self.messages[*at];
                        let object = message.as_object_mut()?;
                        let list = object.entry("tool_calls").or_insert_with(|| json!([]));
                        list.as_array_mut()?.push(call);
                        items.end = i + 1;
                        calls.push(call_id.to_owned());
                    }
                    _ => {
                        let message =
                            json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        self.messages.push((message, start..i + 1));
                        self.open =
                            Some((self.messages.len() - 1, vec![call_id.to_owned()], false));
                    }
                }
            }
            Kind::Output { call_id } => {
                let (_, calls, answered) = self.open.as_mut()?;
                if !calls.iter().any(|c| c == call_id) {
                    return None;
                }
                *answered = true;
                let content = neutral_output(item.get("output"));
                let message = json!({"role": "tool", "tool_call_id": call_id, "content": content});
                let start = self.pending.take().unwrap_or(i);
                self.messages.push((message, start..i + 1));
            }
        }
        Some(Seen::Converted)
    }

    /// Pushes a message made of item `i` and the items waiting before it; its index.
    fn push(&mut self, message: Value, i: usize) -> usize {
        let start = self.pending.take().unwrap_or(i);
        self.messages.push((message, start..i + 1));
        self.messages.len() - 1
    }

    /// Items still waiting at the end travel with the last message (or, when there is
    /// none, are pinned together).
    fn finish(&mut self, items: &[&RawValue]) -> Option<()> {
        let Some(start) = self.pending.take() else { return Some(()) };
        let end = items.len();
        match self.messages.iter_mut().rev().find(|(_, r)| !r.is_empty()) {
            Some((_, range)) if range.end == start => range.end = end,
            _ => {
                let text: Vec<&str> = items.get(start..end)?.iter().map(|r| r.get()).collect();
                let message = json!({"role": "developer", "content": text.join("\n")});
                self.messages.push((message, start..end));
            }
        }
        Some(())
    }
}

/// `(name, arguments)` of a call item: a function's name and arguments; for other calls
/// the item's `name` or type, and its `input`, `arguments` or `action` as text.
fn call_of(item: &Value) -> (String, String) {
    let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
    let name = text("name").or_else(|| text("type")).unwrap_or_default();
    let arguments = text("arguments")
        .or_else(|| text("input"))
        .or_else(|| item.get("action").map(Value::to_string))
        .unwrap_or_default();
    (name, arguments)
}

/// A message item's content as chat content.
fn neutral_content(content: Option<&Value>) -> Value {
    match content {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => Value::Array(parts.iter().map(neutral_part).collect()),
        Some(Value::Null) | None => Value::Null,
        Some(other) => Value::String(other.to_string()),
    }
}

/// A call output as chat tool content.
fn neutral_output(output: Option<&Value>) -> Value {
    match output {
        Some(Value::Null) | None => Value::String(String::new()),
        other => neutral_content(other),
    }
}

fn neutral_part(part: &Value) -> Value {
    let field = |k: &str| part.get(k).cloned().unwrap_or_else(|| Value::String(String::new()));
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => {
            json!({"type": "text", "text": field("text")})
        }
        Some("refusal") => json!({"type": "text", "text": field("refusal")}),
        Some("input_image") => {
            let url = part.get("image_url").or_else(|| part.get("file_id"));
            let mut image = Map::new();
            image.insert("url".to_owned(), url.cloned().unwrap_or_else(|| json!("")));
            if let Some(detail) = part.get("detail") {
                image.insert("detail".to_owned(), detail.clone());
            }
            json!({"type": "image_url", "image_url": image})
        }
        _ => json!({"type": "text", "text": part.to_string()}),
    }
}

/// The `tools` as chat-completions function tools, for counting and for a summarizer
/// call that shares the conversation's prefix: function tools as themselves, any other
/// tool as a function named after it whose description is its JSON (so it is counted).
/// `None` when `tools` is not a list.
fn neutral_tools(raw: &RawValue) -> Option<Box<RawValue>> {
    let tools: Vec<Value> = serde_json::from_str(raw.get()).ok()?;
    let mut names = HashSet::new();
    let converted: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let text = |k: &str| tool.get(k).and_then(Value::as_str);
            let function = text("type") == Some("function");
            let base = text("name").or_else(|| text("server_label")).or_else(|| text("type"));
            let mut name = base.unwrap_or("tool").to_owned();
            if !names.insert(name.clone()) {
                name = format!("{name}_{i}");
                names.insert(name.clone());
            }
            let mut f = Map::new();
            f.insert("name".to_owned(), Value::String(name));
            if function {
                for key in ["description", "parameters", "strict"] {
                    if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                        f.insert(key.to_owned(), v.clone());
                    }
                }
            } else {
                f.insert("description".to_owned(), Value::String(tool.to_string()));
            }
            json!({"type": "function", "function": f})
        })
        .collect();
    RawValue::from_string(serde_json::to_string(&converted).ok()?).ok()
}

/// Writes a message the engine wrote as Responses items.
fn write_new(
    list: &mut ListWriter,
    origins: &Origins,
    original: &[u8],
    message: &Message,
    next: usize,
) {
    let role = message.value().get("role").and_then(Value::as_str).unwrap_or("user");
    match message.role() {
        Role::Tool | Role::Function => write_output(list, origins, original, message, next),
        Role::Assistant if message.makes_calls() => {
            let text = message.text();
            if !text.is_empty() {
                list.push_value(&json!({"type": "message", "role": "assistant", "content": text}));
            }
            for call in message.tool_calls() {
                let (id, name, arguments) = call_parts(call);
                list.push_value(&json!({
                    "type": "function_call",
                    "call_id": id,
                    "name": name,
                    "arguments": arguments,
                }));
            }
        }
        Role::Assistant => {
            let text = message.text();
            list.push_value(&json!({"type": "message", "role": "assistant", "content": text}));
        }
        _ => {
            let content = input_content(message.content());
            list.push_value(&json!({"type": "message", "role": role, "content": content}));
        }
    }
}

/// Writes a tool message the engine changed (a stub of elided output): the items of the
/// original output it replaces, with that output item's `output` replaced; without one,
/// a `function_call_output`.
fn write_output(
    list: &mut ListWriter,
    origins: &Origins,
    original: &[u8],
    message: &Message,
    next: usize,
) {
    let id = message.tool_call_id().unwrap_or_default();
    let output = match message.content() {
        Some(Value::String(s)) => s.clone(),
        other => content_text(other).into_owned(),
    };
    let answers = |k: &usize| {
        let m = &origins.messages[*k].message;
        m.role() == Role::Tool && m.tool_call_id() == Some(id)
    };
    let n = origins.messages.len();
    let template = (next..n).find(answers).or_else(|| (0..next.min(n)).rev().find(answers));
    let Some(k) = template else {
        list.push_value(&json!({"type": "function_call_output", "call_id": id, "output": output}));
        return;
    };
    for i in origins.messages[k].items.clone() {
        let raw = origins.item(original, i);
        let replaced = serde_json::from_slice::<Value>(raw).ok().and_then(|mut item| {
            let is_output = item.get("call_id").and_then(Value::as_str) == Some(id)
                && item.get("type").and_then(Value::as_str).is_some_and(|t| t.ends_with("_output"));
            is_output.then(|| {
                item["output"] = Value::String(output.clone());
                item
            })
        });
        match replaced {
            Some(item) => list.push_value(&item),
            None => list.push(raw),
        }
    }
}

/// Chat content as the content of a Responses input message.
fn input_content(content: Option<&Value>) -> Value {
    let Some(Value::Array(parts)) = content else {
        return Value::String(content_text(content).into_owned());
    };
    let parts = parts
        .iter()
        .map(|part| match part.get("type").and_then(Value::as_str) {
            Some("text") => json!({"type": "input_text", "text": part.get("text")}),
            Some("image_url") => {
                let image = part.get("image_url");
                let url = image.and_then(|i| i.get("url")).cloned().unwrap_or(Value::Null);
                let detail = image.and_then(|i| i.get("detail")).cloned();
                json!({"type": "input_image", "image_url": url, "detail": detail.unwrap_or_else(|| json!("auto"))})
            }
            _ => part.clone(),
        })
        .collect();
    Value::Array(parts)
}

/// The `previous_response_id` a body names, if any (a string).
pub fn previous_response(body: &[u8]) -> Option<String> {
    memchr::memmem::find(body, b"previous_response_id")?;
    let text = std::str::from_utf8(body).ok()?;
    let object = super::json_text::Object::parse(text)?;
    let raw = object.value(text, "previous_response_id")?;
    serde_json::from_str::<String>(raw).ok()
}

/// A body's `input` as a JSON array text of items: as sent when it is a list, a user
/// message when it is a string; `None` when it has none.
pub fn input_items(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let object = super::json_text::Object::parse(text)?;
    input_as_items(object.value(text, "input")?)
}

/// An `input` value (its JSON text) as a JSON array text of items: a list as it is, a
/// string as a user message; `None` for anything else.
pub fn input_as_items(raw: &str) -> Option<String> {
    let raw = raw.trim();
    match raw.as_bytes().first()? {
        b'[' => Some(raw.to_owned()),
        b'"' => Some(format!(r#"[{{"type":"message","role":"user","content":{raw}}}]"#)),
        _ => None,
    }
}

/// The items a chain keeps for `body` (its input, a string input as a user message, no
/// trailing `compaction_trigger`), read in one pass; `None` when it has no input, or it
/// asks the provider not to store the answer (`"store": false`) and continues nothing
/// (`continued` false): such an answer is not continued by id.
pub fn chain_input(body: &[u8], continued: bool) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    // The two fields from a scan of the top level that does not parse the values (the
    // input is most of a long body); a body the scan does not read (a key with an
    // escape) is parsed.
    let (store, input) = match crate::outline::Outline::scan_fields(body) {
        Some(fields) => {
            let text_of = |raw| text.get(super::slice_range(body, raw)?);
            (fields.field("store").and_then(text_of), fields.field("input").and_then(text_of))
        }
        None => {
            let object = super::json_text::Object::parse(text)?;
            (object.value(text, "store"), object.value(text, "input"))
        }
    };
    let unstored = store.is_some_and(|v| v.trim() == "false");
    if unstored && !continued {
        return None;
    }
    input_as_items(input?).map(without_trigger)
}

/// `items` (a JSON array text) without a `compaction_trigger` item at its end: what a
/// chain keeps (the trigger asks for a compaction; it is never part of the conversation).
pub fn without_trigger(items: String) -> String {
    if !super::compaction_item::names_trigger(items.as_bytes()) {
        return items;
    }
    let Ok(mut list) = serde_json::from_str::<Vec<&RawValue>>(&items) else { return items };
    let last = list.last().and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
    if last.is_some_and(|item| item["type"] == "compaction_trigger") {
        list.pop();
        return serde_json::to_string(&list).unwrap_or(items);
    }
    items
}

/// The JSON arrays `lists` as one array, their items in order; `None` when one is not an
/// array.
pub fn joined_items(lists: &[&str]) -> Option<String> {
    let mut out = String::from("[");
    for list in lists {
        let inner = list.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
        if inner.is_empty() {
            continue;
        }
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(inner);
    }
    out.push(']');
    Some(out)
}

/// `body`, which continues a response, as the whole conversation: `items` (the stored
/// conversation up to that response's output) then its own `input`, and no
/// `previous_response_id`; every other field as received.
pub fn expand_chain(body: &[u8], items: &[u8]) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    let stored = std::str::from_utf8(items).ok()?;
    let own = input_items(body).unwrap_or_else(|| "[]".to_owned());
    let input = joined_items(&[stored, &own])?;
    let with = super::json_text::set_member(text, "input", &input)?;
    let without = super::json_text::remove_members(&with, "previous_response_id")?;
    Some(Bytes::from(without))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn round_trip(body: &[u8]) -> (ChatRequest, Origins) {
        let (request, origins) = parse(body).expect("parses");
        let original = Bytes::copy_from_slice(body);
        assert_eq!(render(&original, &origins, &request), original);
        (request, origins)
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let (request, origins) =
            round_trip(br#"{"model":"gpt-5","instructions":"Be brief.","input":"hi"}"#);
        let roles: Vec<Role> = request.messages().iter().map(|m| m.role()).collect();
        assert_eq!(roles, [Role::System, Role::User]);
        assert_eq!(request.messages()[1].text(), "hi");
        assert!(!origins.server_state);
        assert_eq!(request.model().as_deref(), Some("gpt-5"));
    }

    #[test]
    fn calls_outputs_and_reasoning_map_to_units() {
        let body = br#"{"model":"gpt-5","max_output_tokens":500,"input":[
            {"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"}]},
            {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"},
            {"type":"function_call","call_id":"c1","name":"sh","arguments":"{\"cmd\":\"ls\"}"},
            {"type":"function_call","call_id":"c2","name":"sh","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"a.rs"},
            {"type":"function_call_output","call_id":"c2","output":"b.rs"},
            {"type":"web_search_call","id":"ws_1","status":"completed"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]},
            {"type":"custom_tool_call","call_id":"c3","name":"apply_patch","input":"*** Begin"},
            {"type":"custom_tool_call_output","call_id":"c3","output":"ok"}
        ],"tools":[{"type":"function","name":"sh","parameters":{}},{"type":"web_search"}],"store":false}"#;
        let (request, origins) = round_trip(body);
        let m = request.messages();
        let roles: Vec<Role> = m.iter().map(|m| m.role()).collect();
        use Role::{Assistant, Tool, User};
        assert_eq!(roles, [User, Assistant, Tool, Tool, Assistant, Tool]);
        assert_eq!(m[1].tool_calls().len(), 2);
        assert_eq!(origins.messages[1].items, 1..4, "reasoning travels with its calls");
        assert_eq!(origins.messages[4].items, 6..9, "unknown item and message and call");
        assert_eq!(m[4].tool_calls().len(), 1);
        assert_eq!(request.max_reply_tokens(), Some(500));
        assert!(request.tools_raw().unwrap().contains("\"function\":{\"name\":\"sh\""));
    }

    #[test]
    fn an_output_without_its_call_is_not_understood() {
        assert!(
            parse(br#"{"input":[{"type":"function_call_output","call_id":"x","output":""}]}"#)
                .is_none()
        );
        assert!(parse(br#"{"model":"m"}"#).is_none());
        assert!(parse(b"[]").is_none());
    }

    #[test]
    fn server_state_is_recognised() {
        let (_, o) = parse(br#"{"previous_response_id":"resp_1","input":"go on"}"#).unwrap();
        assert!(o.server_state);
        let (_, o) = parse(br#"{"input":[{"type":"item_reference","id":"msg_1"}]}"#).unwrap();
        assert!(o.server_state);
        let (_, o) = parse(br#"{"previous_response_id":null,"input":"hi"}"#).unwrap();
        assert!(!o.server_state);
    }

    #[test]
    fn compaction_items_are_pinned_and_kept_byte_for_byte() {
        let body = br#"{"input":[ {"type":"compaction","id":"cmp_1","encrypted_content":"zzz"} ,{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let (request, origins) = round_trip(body);
        assert_eq!(request.messages()[0].role(), Role::Developer);
        // Drop the middle two: the pinned item and the last user message stay as received.
        let kept = vec![request.messages()[0].clone(), request.messages()[3].clone()];
        let out = render(&Bytes::copy_from_slice(body), &origins, &request.with_messages(kept));
        assert_eq!(
            &out[..],
            br#"{"input":[{"type":"compaction","id":"cmp_1","encrypted_content":"zzz"},{"role":"user","content":"c"}]}"#
        );
    }

    #[test]
    fn new_messages_are_written_as_items_and_stubs_keep_their_output_item() {
        let body = br#"{"model":"m","input":[{"role":"user","content":"go"},{"type":"function_call","call_id":"c1","name":"sh","arguments":"{}","id":"fc_1"},{"type":"function_call_output","call_id":"c1","output":"long output","id":"fco_1"},{"role":"user","content":"next"}],"stream":true}"#;
        let (request, origins) = parse(body).unwrap();
        let m = request.messages();
        let digest = Message::from_value(
            json!({"role":"assistant","content":"[COMPACTED CONTEXT] I ran sh."}),
        )
        .unwrap();
        let stub =
            Message::from_value(json!({"role":"tool","tool_call_id":"c1","content":"[elided]"}))
                .unwrap();
        let forwarded =
            vec![m[0].clone(), Arc::new(digest), m[1].clone(), Arc::new(stub), m[3].clone()];
        let out =
            render(&Bytes::copy_from_slice(body), &origins, &request.with_messages(forwarded));
        let expected = br#"{"model":"m","input":[{"role":"user","content":"go"},{"type":"message","role":"assistant","content":"[COMPACTED CONTEXT] I ran sh."},{"type":"function_call","call_id":"c1","name":"sh","arguments":"{}","id":"fc_1"},{"type":"function_call_output","call_id":"c1","output":"[elided]","id":"fco_1"},{"role":"user","content":"next"}],"stream":true}"#;
        assert_eq!(std::str::from_utf8(&out).unwrap(), std::str::from_utf8(expected).unwrap());
    }

    #[test]
    fn trailing_unreadable_items_stay_with_the_message_before_them() {
        let body = br#"{"input":[{"role":"user","content":"a"},{"type":"reasoning","id":"rs"}]}"#;
        let (_, origins) = round_trip(body);
        assert_eq!(origins.messages[0].items, 0..2);
        let (request, origins) = round_trip(br#"{"input":[{"type":"mystery"}]}"#);
        assert_eq!(request.messages()[0].role(), Role::Developer);
        assert_eq!(origins.messages[0].items, 0..1);
    }

    #[test]
    fn a_chained_body_is_read_as_the_whole_conversation() {
        let body = br#"{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c1","output":"ok"}],"store":true}"#;
        assert_eq!(previous_response(body).as_deref(), Some("resp_1"));
        assert_eq!(previous_response(br#"{"input":"previous_response_id"}"#), None);
        let stored = br#"[{"role":"user","content":"task"}, {"type":"function_call","call_id":"c1","name":"sh","arguments":"{}"}]"#;
        let expanded = expand_chain(body, stored).unwrap();
        let value: Value = serde_json::from_slice(&expanded).unwrap();
        assert!(value.get("previous_response_id").is_none());
        assert_eq!(value["store"], true, "every other field as received");
        let types: Vec<&str> = value["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap_or("message"))
            .collect();
        assert_eq!(types, ["message", "function_call", "function_call_output"]);
        // A string input is a user message; empty lists join to nothing.
        assert_eq!(
            input_items(br#"{"input":"hi"}"#).as_deref(),
            Some(r#"[{"type":"message","role":"user","content":"hi"}]"#)
        );
        assert_eq!(joined_items(&["[]", " [1] ", "[ ]", "[2,3]"]).as_deref(), Some("[1,2,3]"));
        assert_eq!(joined_items(&["[1]", "{}"]), None);
        let triggered = r#"[{"role":"user","content":"x"},{"type":"compaction_trigger"}]"#;
        assert_eq!(without_trigger(triggered.to_owned()), r#"[{"role":"user","content":"x"}]"#);
        let named = r#"[{"role":"user","content":"compaction_trigger"}]"#;
        assert_eq!(without_trigger(named.to_owned()), named, "only an item of that type");
    }

    #[test]
    fn a_chain_keeps_the_input_a_parser_reads() {
        let user = r#"[{"role":"user","content":"hi"}]"#;
        let chain = |body: &str, continued| chain_input(body.as_bytes(), continued);
        assert_eq!(
            chain(&format!(r#"{{"model":"m","input":{user}}}"#), false).as_deref(),
            Some(user)
        );
        // The last of duplicate keys, as a parser keeps it.
        let twice = format!(r#"{{"input":"first","model":"m","input":{user}}}"#);
        assert_eq!(chain(&twice, false).as_deref(), Some(user));
        // Not stored, and continuing nothing: not kept.
        let unstored = format!(r#"{{"store":false,"input":{user}}}"#);
        assert_eq!(chain(&unstored, false), None);
        assert_eq!(chain(&unstored, true).as_deref(), Some(user));
        let stored_twice = format!(r#"{{"store":false,"input":{user},"store":true}}"#);
        assert_eq!(chain(&stored_twice, false).as_deref(), Some(user));
        // A key with an escape is read as a parser reads it.
        let escaped = format!(r#"{{"st\u006fre":false,"inp\u0075t":{user}}}"#);
        assert_eq!(chain(&escaped, false), None);
        assert_eq!(chain(&escaped, true).as_deref(), Some(user));
        let text = r#"{"input":"hi \"there\""}"#;
        let message = r#"[{"type":"message","role":"user","content":"hi \"there\""}]"#;
        assert_eq!(chain(text, false).as_deref(), Some(message));
        let triggered =
            r#"{"input":[{"role":"user","content":"hi"},{"type":"compaction_trigger"}]}"#;
        assert_eq!(chain(triggered, false).as_deref(), Some(user));
        assert_eq!(chain(r#"{"model":"m"}"#, false), None);
        assert_eq!(chain("{}", false), None);
        assert_eq!(chain(r#"{"input":[1,"#, false), None);
        assert_eq!(chain("\u{ff}", false), None);
    }
}
