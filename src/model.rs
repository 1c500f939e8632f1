//! Chat-completions request and message types (serde only, no I/O).
//!
//! A request is kept as its ordered top-level fields, each as the raw JSON text the client
//! sent; only `messages` is parsed into values. Every message keeps its raw text too, so a
//! message foldgate does not change is written back byte for byte, and every field
//! foldgate does not use survives unchanged and in order at every level.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_64;

/// Errors of parsing or writing a chat request.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The body is not a JSON object.
    #[error("request is not a JSON object: {0}")]
    NotJson(#[source] serde_json::Error),
    /// `messages` is missing or not an array of objects.
    #[error("request has no `messages` array of objects")]
    NoMessages,
    /// A value could not be serialized.
    #[error("cannot serialize: {0}")]
    Serialize(#[source] serde_json::Error),
    /// A message is valid JSON that foldgate cannot read: nesting deeper than
    /// serde_json's limit (128 levels), or a number too large for a float.
    #[error("message {0} cannot be read (nested too deep or a number out of range)")]
    Unreadable(usize),
}

/// The role of a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `system`: pinned.
    System,
    /// `developer`: pinned.
    Developer,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
    /// `tool`: answers a `tool_calls` entry.
    Tool,
    /// `function`: legacy answer to a `function_call`.
    Function,
    /// Any other role string.
    Other,
}

impl Role {
    /// Parses a role string.
    pub fn parse(s: &str) -> Self {
        match s {
            "system" => Self::System,
            "developer" => Self::Developer,
            "user" => Self::User,
            "assistant" => Self::Assistant,
            "tool" => Self::Tool,
            "function" => Self::Function,
            _ => Self::Other,
        }
    }

    /// The role's name (`""` for [`Role::Other`], which stands for any other name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
            Self::Function => "function",
            Self::Other => "",
        }
    }

    /// System and developer messages are pinned: kept verbatim in place.
    pub fn is_pinned(self) -> bool {
        matches!(self, Self::System | Self::Developer)
    }

    /// Tool and function messages answer calls.
    pub fn is_tool_result(self) -> bool {
        matches!(self, Self::Tool | Self::Function)
    }
}

/// The marker that starts every digest message foldgate writes.
pub const DIGEST_MARKER: &str = "[COMPACTED CONTEXT]";

/// What the planner asks of a message, read once from its value.
#[derive(Debug, Clone, Copy)]
struct Kind {
    role: Role,
    /// A digest written by foldgate (see [`Message::is_digest`]).
    digest: bool,
    /// An assistant message that calls tools or a function.
    makes_calls: bool,
}

/// One chat message: the exact JSON text it came from, a hash of that text (the key of
/// the token cache and of fold block ranges), and what was read from it.
///
/// The text is read on first use: a request below the compaction trigger is hashed
/// and measured from its text alone, and most of its messages are never read.
#[derive(Debug, Clone)]
pub struct Message {
    /// The message as read (see [`Read`]).
    read: OnceLock<Read>,
    raw: Box<RawValue>,
    hash: u64,
    /// Whether the text reads as a command's output (see [`is_observation`]).
    output_like: OnceLock<bool>,
    /// What the planner asks of every message, many times over, read once.
    kind: OnceLock<Kind>,
}

/// What was read from a message's text.
#[derive(Debug, Clone)]
enum Read {
    /// A message of known role whose fields are all ones the engine reads (the
    /// commonest shape by far): those fields, without the message's JSON object, which
    /// takes about twice the memory and time to build. The object is parsed only when
    /// asked for ([`Message::value`]).
    Fields { fields: Fields, value: OnceLock<Box<Value>> },
    /// Any other message: its value (boxed, so that the commoner variant sets the
    /// size), and whether it read whole ([`Message::is_readable`]).
    Value(Box<Value>, bool),
}

/// The fields of a [`Read::Fields`] message. A field absent is `None`; a field sent as
/// `null` is `Some(Value::Null)`, as in the message's object.
#[derive(Debug, Clone)]
struct Fields {
    role: Role,
    /// Boxed: the passes over a long history read the message's other parts (its kind,
    /// its hash) far more often than its content, and a smaller message keeps more of
    /// them in the cache.
    content: Option<Box<Value>>,
    /// The fields most messages lack, kept apart so that those messages stay small.
    calls: Option<Box<CallFields>>,
}

/// The fields of a [`Fields`] message other than its role and content (each boxed:
/// the struct is moved about while a message is read).
#[derive(Debug, Clone, Default, PartialEq)]
struct CallFields {
    name: Option<Box<Value>>,
    tool_calls: Option<Box<Value>>,
    tool_call_id: Option<Box<Value>>,
    function_call: Option<Box<Value>>,
    refusal: Option<Box<Value>>,
}

/// A message's fields as serde reads them (unknown or repeated fields rejected).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FieldsText {
    #[serde(deserialize_with = "known_role")]
    role: Role,
    #[serde(default, deserialize_with = "present_boxed")]
    content: Option<Box<Value>>,
    #[serde(default, deserialize_with = "present_boxed")]
    name: Option<Box<Value>>,
    #[serde(default, deserialize_with = "present_boxed")]
    tool_calls: Option<Box<Value>>,
    #[serde(default, deserialize_with = "present_boxed")]
    tool_call_id: Option<Box<Value>>,
    #[serde(default, deserialize_with = "present_boxed")]
    function_call: Option<Box<Value>>,
    #[serde(default, deserialize_with = "present_boxed")]
    refusal: Option<Box<Value>>,
}

impl From<FieldsText> for Fields {
    fn from(f: FieldsText) -> Self {
        let FieldsText { role, content, name, tool_calls, tool_call_id, function_call, refusal } =
            f;
        let calls = CallFields { name, tool_calls, tool_call_id, function_call, refusal };
        let calls = (calls != CallFields::default()).then(|| Box::new(calls));
        Self { role, content, calls }
    }
}

/// The fields besides the role that [`Fields`] holds, by name.
#[derive(Debug, Clone, Copy)]
enum Known {
    Content,
    Name,
    ToolCalls,
    ToolCallId,
    FunctionCall,
    Refusal,
}

impl Known {
    /// The field's key in the message's object.
    fn key(self) -> &'static str {
        match self {
            Self::Content => "content",
            Self::Name => "name",
            Self::ToolCalls => "tool_calls",
            Self::ToolCallId => "tool_call_id",
            Self::FunctionCall => "function_call",
            Self::Refusal => "refusal",
        }
    }
}

/// A role string other than [`Role::Other`] (a message of another role is read whole).
fn known_role<'de, D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
    match Role::parse(&Cow::<'de, str>::deserialize(d)?) {
        Role::Other => Err(de::Error::custom("not a known role")),
        known => Ok(known),
    }
}

/// A field's value, `null` included, boxed.
fn present_boxed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<Value>>, D::Error> {
    Value::deserialize(d).map(|v| Some(Box::new(v)))
}

/// Reads a message's text: its fields when they are all known ones (serde rejects an
/// unknown or repeated field, a role of no known name, and text that is no Unicode),
/// else its whole value.
fn read(raw: &str) -> Read {
    match serde_json::from_str::<FieldsText>(raw) {
        Ok(fields) => Read::Fields { fields: fields.into(), value: OnceLock::new() },
        Err(_) => {
            let (value, readable) = parse_value(raw);
            Read::Value(Box::new(value), readable)
        }
    }
}

/// A message's value, and whether it read whole. Text that a `RawValue` held parses,
/// but for two cases: an escaped lone UTF-16 surrogate (`"\udce1"`, valid JSON that is
/// no Unicode text) is read as U+FFFD, and a message that cannot be read at all reads
/// as an empty object.
fn parse_value(raw: &str) -> (Value, bool) {
    serde_json::from_str(raw)
        .or_else(|e| match lone_surrogates_replaced(raw) {
            Some(text) => serde_json::from_str(&text),
            None => Err(e),
        })
        .map_or_else(|_| (Value::Object(Map::new()), false), |value| (value, true))
}

impl Message {
    /// Wraps one message's JSON text (valid JSON, as a `RawValue` is); it must be an
    /// object.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Self, ModelError> {
        if !raw.get().trim_start().starts_with('{') {
            return Err(ModelError::NoMessages);
        }
        let hash = xxh3_64(raw.get().as_bytes());
        Ok(Self {
            read: OnceLock::new(),
            raw,
            hash,
            output_like: OnceLock::new(),
            kind: OnceLock::new(),
        })
    }

    /// Wraps a value (serializing it once for its raw text and hash).
    pub fn from_value(value: Value) -> Result<Self, ModelError> {
        let text = serde_json::to_string(&value).map_err(ModelError::Serialize)?;
        let raw = RawValue::from_string(text).map_err(ModelError::Serialize)?;
        let hash = xxh3_64(raw.get().as_bytes());
        let read = OnceLock::from(Read::Value(Box::new(value), true));
        Ok(Self { read, raw, hash, output_like: OnceLock::new(), kind: OnceLock::new() })
    }

    fn read(&self) -> &Read {
        self.read.get_or_init(|| read(self.raw.get()))
    }

    /// The parsed message (parsed now if it was not yet), as [`parse_value`] reads it:
    /// an escaped lone surrogate reads as U+FFFD, and a message that cannot be read at
    /// all as an empty object (see [`Message::is_readable`]). The raw text, forwarded,
    /// is never changed.
    pub fn value(&self) -> &Value {
        match self.read() {
            Read::Fields { value, .. } => value.get_or_init(|| Box::new(parse_value(self.raw()).0)),
            Read::Value(value, _) => value,
        }
    }

    /// False for valid JSON that foldgate cannot read: nesting deeper than serde_json's
    /// limit, or a number too large for a float. The engine leaves a request holding
    /// such a message as it is.
    pub fn is_readable(&self) -> bool {
        match self.read() {
            Read::Fields { .. } => true,
            Read::Value(_, readable) => *readable,
        }
    }

    /// Field `which` as the message's object has it.
    fn known_field(&self, which: Known) -> Option<&Value> {
        let Read::Fields { fields, .. } = self.read() else {
            return field(self.value(), which.key());
        };
        let calls = fields.calls.as_deref();
        match which {
            Known::Content => fields.content.as_deref(),
            Known::Name => calls?.name.as_deref(),
            Known::ToolCalls => calls?.tool_calls.as_deref(),
            Known::ToolCallId => calls?.tool_call_id.as_deref(),
            Known::FunctionCall => calls?.function_call.as_deref(),
            Known::Refusal => calls?.refusal.as_deref(),
        }
    }

    /// The `role` string, if the message has one.
    pub fn role_text(&self) -> Option<&str> {
        match self.read() {
            Read::Fields { fields, .. } => Some(fields.role.as_str()),
            Read::Value(value, _) => field(value, "role").and_then(Value::as_str),
        }
    }

    /// The JSON text of the message as received (or as serialized, if built here).
    pub fn raw(&self) -> &str {
        self.raw.get()
    }

    /// xxh3 of the raw text.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The object's fields (empty if, impossibly, not an object).
    pub fn fields(&self) -> Option<&Map<String, Value>> {
        self.value().as_object()
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.kind().role
    }

    fn kind(&self) -> Kind {
        *self.kind.get_or_init(|| {
            let role = Role::parse(self.role_text().unwrap_or(""));
            let first = match self.content() {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Array(parts)) => {
                    parts.iter().find_map(|p| field(p, "text").and_then(Value::as_str))
                }
                _ => None,
            };
            let calls = !self.tool_calls().is_empty() || self.function_call().is_some();
            Kind {
                role,
                digest: first.is_some_and(|t| t.trim_start().starts_with(DIGEST_MARKER)),
                makes_calls: role == Role::Assistant && calls,
            }
        })
    }

    /// The `name` field, if any.
    pub fn name(&self) -> Option<&str> {
        self.known_field(Known::Name).and_then(Value::as_str)
    }

    /// The `content` field (string, array of parts, or null/absent).
    pub fn content(&self) -> Option<&Value> {
        self.known_field(Known::Content)
    }

    /// All text of the content: the string (borrowed), or the `text` of every text part
    /// joined by newlines.
    pub fn text(&self) -> Cow<'_, str> {
        content_text(self.content())
    }

    /// The `tool_calls` entries (empty when absent).
    pub fn tool_calls(&self) -> &[Value] {
        self.known_field(Known::ToolCalls)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The `refusal` text, if any.
    pub fn refusal(&self) -> Option<&str> {
        self.known_field(Known::Refusal).and_then(Value::as_str)
    }

    /// The legacy `function_call`, if any.
    pub fn function_call(&self) -> Option<&Value> {
        self.known_field(Known::FunctionCall).filter(|v| v.is_object())
    }

    /// True for an assistant message that calls tools or a function.
    pub fn makes_calls(&self) -> bool {
        self.kind().makes_calls
    }

    /// `tool_call_id` of a tool message.
    pub fn tool_call_id(&self) -> Option<&str> {
        self.known_field(Known::ToolCallId).and_then(Value::as_str)
    }

    /// True for a digest written by foldgate (content starts with [`DIGEST_MARKER`]).
    pub fn is_digest(&self) -> bool {
        self.kind().digest
    }

    /// True when the text has the shape of a command's output as text-mode agents send
    /// it back ([`OUTPUT_OPENINGS`], or SWE-agent's closing prompt); the position that
    /// makes it an observation is checked by [`is_observation`].
    fn reads_as_output(&self) -> bool {
        *self.output_like.get_or_init(|| {
            let text = self.text();
            let text = text.trim();
            OUTPUT_OPENINGS.iter().any(|o| text.starts_with(o))
                || (text.ends_with("bash-$") && text.contains("(Current directory: "))
        })
    }
}

/// How the text of a command's output starts in the text-mode agents foldgate knows:
/// mini-swe-agent (`<returncode>`, and its notices about a malformed or timed-out
/// action), ReAct-style agents (`Observation:`) and generic `<output>` /
/// `<observation>` wrappers.
pub const OUTPUT_OPENINGS: [&str; 7] = [
    "<returncode>",
    "<output>",
    "<observation>",
    "Observation:",
    "OBSERVATION:",
    "Please always provide EXACTLY ONE action in triple backticks",
    "The last command <command>",
];

/// True when `msgs[i]` is a text-mode agent's tool output: a `user` message that answers
/// the assistant message right before it (one that made no tool call, so it issued its
/// command as text) and whose text reads as a command's output: it starts with one of
/// [`OUTPUT_OPENINGS`], or ends with SWE-agent's `bash-$` prompt after a
/// `(Current directory: …)` line. Such a message is the environment speaking, not the
/// user: it is compacted as a tool result and never counts as the user's words.
pub fn is_observation(msgs: &[Arc<Message>], i: usize) -> bool {
    let Some(m) = msgs.get(i) else { return false };
    i > 0
        && m.role() == Role::User
        && msgs[i - 1].role() == Role::Assistant
        && !msgs[i - 1].makes_calls()
        && !msgs[i - 1].is_digest()
        && m.reads_as_output()
}

/// True when `msgs[i]` holds the user's own words: a `user` message that is neither a
/// digest written by foldgate nor a text-mode tool output ([`is_observation`]).
pub fn is_user_words(msgs: &[Arc<Message>], i: usize) -> bool {
    msgs[i].role() == Role::User && !msgs[i].is_digest() && !is_observation(msgs, i)
}

/// The text of a `content` value: a string (borrowed), or the text parts of an array
/// joined by newlines.
pub fn content_text(content: Option<&Value>) -> Cow<'_, str> {
    match content {
        Some(Value::String(s)) => Cow::Borrowed(s),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                if let Some(t) = field(p, "text").and_then(Value::as_str) {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(t);
                }
            }
            Cow::Owned(out)
        }
        _ => Cow::Borrowed(""),
    }
}

/// Field `key` of `value` when it is an object. A message's objects hold a handful of
/// fields: they are compared in order, which costs less than hashing the key (the map
/// keeps insertion order and hashes with SipHash); larger objects are looked up.
pub fn field<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
    /// Objects up to this many fields are searched in order.
    const SCAN_MAX: usize = 8;
    let map = value.as_object()?;
    if map.len() <= SCAN_MAX {
        map.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    } else {
        map.get(key)
    }
}

/// `(id, name, arguments)` of one `tool_calls` entry (or of a `function_call`).
pub fn call_parts(call: &Value) -> (&str, &str, &str) {
    let f = field(call, "function").unwrap_or(call);
    fn s(v: Option<&Value>) -> &str {
        v.and_then(Value::as_str).unwrap_or("")
    }
    (s(field(call, "id")), s(field(f, "name")), s(field(f, "arguments")))
}

/// A chat-completions request: ordered top-level fields (raw JSON text) with the
/// `messages` parsed.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Top-level fields in order; the value of `messages` is not used (see `messages`).
    fields: Vec<(String, Box<RawValue>)>,
    messages: Vec<Arc<Message>>,
}

impl ChatRequest {
    /// Parses a request body.
    pub fn parse(body: &[u8]) -> Result<Self, ModelError> {
        let top: TopLevel = serde_json::from_slice(body).map_err(ModelError::NotJson)?;
        let list = top.messages.ok_or(ModelError::NoMessages)?;
        // Sized at once: a long history's list would otherwise be copied as it grows.
        let mut messages = Vec::with_capacity(list.len());
        for m in list {
            messages.push(Arc::new(Message::from_raw(m)?));
        }
        Ok(Self { fields: top.fields, messages })
    }

    /// Builds a request from top-level fields (every field but `messages`) and messages.
    pub fn from_parts(
        fields: &Map<String, Value>,
        messages: Vec<Arc<Message>>,
    ) -> Result<Self, ModelError> {
        let mut out = Vec::with_capacity(fields.len() + 1);
        let mut has_messages = false;
        for (k, v) in fields {
            let text = serde_json::to_string(v).map_err(ModelError::Serialize)?;
            out.push((k.clone(), RawValue::from_string(text).map_err(ModelError::Serialize)?));
            has_messages |= k == "messages";
        }
        if !has_messages {
            let empty = RawValue::from_string("[]".to_owned()).map_err(ModelError::Serialize)?;
            out.push(("messages".to_owned(), empty));
        }
        Ok(Self { fields: out, messages })
    }

    /// Builds a request from top-level fields as raw JSON text, in order (`messages` is
    /// added last unless one of them names its place), and messages: how other API shapes
    /// make their neutral request.
    pub fn from_raw_fields(
        mut fields: Vec<(String, Box<RawValue>)>,
        messages: Vec<Arc<Message>>,
    ) -> Result<Self, ModelError> {
        if !fields.iter().any(|(k, _)| k == "messages") {
            let empty = RawValue::from_string("[]".to_owned()).map_err(ModelError::Serialize)?;
            fields.push(("messages".to_owned(), empty));
        }
        Ok(Self { fields, messages })
    }

    /// The messages.
    pub fn messages(&self) -> &[Arc<Message>] {
        &self.messages
    }

    /// `Err` naming the first message foldgate cannot read ([`Message::is_readable`]):
    /// such a request is forwarded as it was sent, never compacted.
    pub fn readable(&self) -> Result<(), ModelError> {
        match self.messages.iter().position(|m| !m.is_readable()) {
            Some(index) => Err(ModelError::Unreadable(index)),
            None => Ok(()),
        }
    }

    /// The raw JSON text of a top-level field.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.get())
    }

    /// The `model` field.
    pub fn model(&self) -> Option<String> {
        self.field("model").and_then(|raw| serde_json::from_str::<String>(raw).ok())
    }

    /// The `tools` field parsed, if present and not null.
    pub fn tools(&self) -> Option<Value> {
        self.field("tools")
            .and_then(|raw| serde_json::from_str::<Value>(raw).ok())
            .filter(|v| !v.is_null())
    }

    /// The raw text of `tools` (for hashing), if present.
    pub fn tools_raw(&self) -> Option<&str> {
        self.field("tools").filter(|raw| raw.trim() != "null")
    }

    /// The reply reserve the request asks for: `max_completion_tokens`, else `max_tokens`.
    pub fn max_reply_tokens(&self) -> Option<usize> {
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| {
            self.field(k)
                .and_then(|raw| serde_json::from_str::<u64>(raw).ok())
                .and_then(|n| usize::try_from(n).ok())
        })
    }

    /// The same request with other messages (every other field unchanged, in order).
    pub fn with_messages(&self, messages: Vec<Arc<Message>>) -> Self {
        Self { fields: self.fields.clone(), messages }
    }

    /// Serializes the request: every top-level field as received, in order; every message
    /// as its raw text.
    pub fn to_vec(&self) -> Vec<u8> {
        let size: usize =
            self.fields.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum::<usize>()
                + self.messages.iter().map(|m| m.raw().len() + 1).sum::<usize>();
        let mut out = Vec::with_capacity(size + 2);
        out.push(b'{');
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_string(&mut out, k);
            out.push(b':');
            if k == "messages" {
                write_messages(&mut out, &self.messages);
            } else {
                out.extend_from_slice(v.get().as_bytes());
            }
        }
        out.push(b'}');
        out
    }
}

/// Appends `messages` to `out` as a JSON array of their exact text.
pub fn write_messages(out: &mut Vec<u8>, messages: &[Arc<Message>]) {
    out.push(b'[');
    for (j, m) in messages.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m.raw().as_bytes());
    }
    out.push(b']');
}

fn write_json_string(out: &mut Vec<u8>, s: &str) {
    // A `String` always serializes.
    match serde_json::to_vec(s) {
        Ok(bytes) => out.extend_from_slice(&bytes),
        Err(_) => out.extend_from_slice(b"\"\""),
    }
}

/// A JSON object read as ordered `(key, raw value)` pairs.
/// A request body read in one pass: every top-level field as raw text in order, except
/// `messages`, whose elements are read as raw text each (its slot in `fields` holds a
/// placeholder that keeps its position).
struct TopLevel {
    fields: Vec<(String, Box<RawValue>)>,
    messages: Option<Vec<Box<RawValue>>>,
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel, A::Error> {
                let mut top = TopLevel { fields: Vec::new(), messages: None };
                while let Some(k) = map.next_key::<String>()? {
                    let v = if k == "messages" {
                        top.messages = Some(map.next_value::<Vec<Box<RawValue>>>()?);
                        RawValue::from_string("[]".to_owned()).map_err(de::Error::custom)?
                    } else {
                        map.next_value::<Box<RawValue>>()?
                    };
                    if let Some(slot) = top.fields.iter_mut().find(|(key, _)| *key == k) {
                        // Duplicate key: the last one wins, as with serde_json's Map.
                        slot.1 = v;
                    } else {
                        top.fields.push((k, v));
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(V).map_err(de::Error::custom)
    }
}

/// `text` (JSON) with every escaped lone UTF-16 surrogate (a `\\uD800`-`\\uDFFF` escape
/// not in a high-low pair) written as `\\uFFFD`; `None` when it has none.
fn lone_surrogates_replaced(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let unit = |at: usize| -> Option<u16> {
        let hex = bytes.get(at + 2..at + 6)?;
        (bytes.get(at..at + 2) == Some(b"\\u".as_slice()))
            .then(|| u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok())
            .flatten()
    };
    let (mut out, mut copied, mut i, mut changed) = (String::new(), 0, 0, false);
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(first) = unit(i) else {
            i += 2; // another escape: its next byte is not a quote or a backslash
            continue;
        };
        let high = (0xD800..0xDC00).contains(&first);
        let paired = high && unit(i + 6).is_some_and(|low| (0xDC00..0xE000).contains(&low));
        if paired {
            i += 12;
        } else if (0xD800..0xE000).contains(&first) {
            out.push_str(&text[copied..i]);
            out.push_str("\\ufffd");
            (copied, changed) = (i + 6, true);
            i += 6;
        } else {
            i += 6;
        }
    }
    changed.then(|| out + &text[copied..])
}

/// Messages from a JSON array of message objects (unit-test fixture).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn messages_from(v: Value) -> Vec<Arc<Message>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| Arc::new(Message::from_value(m.clone()).unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_surrogate_escape_reads_as_a_replacement_character() {
        // Found by fuzzing: valid JSON, but no Unicode text; the message kept its role.
        let raw =
            r#"{"role":"system","content":"Wi-Fi \ud66d\udce1 and \ud83d\udcf6 \\udce1 \ud800"}"#;
        let m = Message::from_raw(RawValue::from_string(raw.to_owned()).unwrap()).unwrap();
        assert_eq!(m.role(), Role::System);
        assert_eq!(m.text(), "Wi-Fi \u{d66d}\u{fffd} and \u{1f4f6} \\udce1 \u{fffd}");
        assert_eq!(m.raw(), raw, "forwarded as received");
        assert_eq!(lone_surrogates_replaced(r#"{"a":"\ud83d\udcf6"}"#), None);
    }

    #[test]
    fn a_message_nested_too_deep_or_with_a_huge_number_is_unreadable() {
        let deep = format!(
            r#"{{"role":"system","content":"be brief","x":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        for raw in [deep.as_str(), r#"{"role":"system","content":"be brief","x":1e999}"#] {
            let m = Message::from_raw(RawValue::from_string(raw.to_owned()).unwrap()).unwrap();
            assert!(!m.is_readable(), "{raw}");
            assert_eq!(m.raw(), raw, "forwarded as received");
        }
        let m = Message::from_raw(RawValue::from_string(r#"{"role":"user"}"#.into()).unwrap());
        assert!(m.unwrap().is_readable());
    }

    /// Every accessor of `m` (read as fields or whole) as the message's whole value
    /// gives it.
    fn assert_reads_as_its_value(m: &Message) {
        let whole = Message::from_value(parse_value(m.raw()).0).unwrap();
        let v = whole.value();
        assert_eq!(m.value(), v, "{}", m.raw());
        assert_eq!(m.role_text(), field(v, "role").and_then(Value::as_str), "{}", m.raw());
        assert_eq!(m.role(), whole.role());
        assert_eq!(m.content(), field(v, "content"));
        assert_eq!(m.text(), whole.text());
        assert_eq!(m.name(), field(v, "name").and_then(Value::as_str));
        assert_eq!(m.tool_calls(), whole.tool_calls());
        assert_eq!(m.function_call(), whole.function_call());
        assert_eq!(m.tool_call_id(), field(v, "tool_call_id").and_then(Value::as_str));
        assert_eq!(m.refusal(), field(v, "refusal").and_then(Value::as_str));
        assert_eq!(m.is_digest(), whole.is_digest());
        assert_eq!(m.makes_calls(), whole.makes_calls());
    }

    #[test]
    fn a_message_read_as_fields_reads_as_its_value() {
        // Each message, and whether it reads as fields (else whole).
        for (raw, as_fields) in [
            (r#"{"role":"user","content":"hi"}"#, true),
            (r#"{"content":"[COMPACTED CONTEXT] x","role":"assistant"}"#, true),
            (
                r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
                true,
            ),
            (r#"{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}"#, true),
            (r#"{"role":"assistant","function_call":"none","refusal":"no"}"#, true),
            (
                r#"{"role":"tool","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"tool_call_id":"c"}"#,
                true,
            ),
            (r#"{"role":"user","content":"one","content":"two"}"#, false),
            (r#"{"role":"user","name":7,"content":"x"}"#, true),
            (r#"{"role":"critic","content":"x"}"#, false),
            (r#"{"role":"user","content":"x","cache_control":{"type":"ephemeral"}}"#, false),
            (r#"{"role":"user","content":"\ud800 lone"}"#, false),
            (r#"{"role":"\u0075ser","content":"escaped \"role\"\n"}"#, true),
            (r#"{"content":"no role"}"#, false),
            (r#"{"role":"user","content":1e999}"#, false),
        ] {
            let m = Message::from_raw(RawValue::from_string(raw.to_owned()).unwrap()).unwrap();
            assert_reads_as_its_value(&m);
            assert_eq!(matches!(m.read(), Read::Fields { .. }), as_fields, "{raw}");
        }
    }

    #[test]
    fn a_message_stays_small() {
        // A long history holds one per message: the 100k-message compaction's time
        // follows its memory (docs/PERFORMANCE.md).
        assert!(size_of::<Message>() <= 96, "{}", size_of::<Message>());
        assert!(size_of::<Fields>() <= 24, "{}", size_of::<Fields>());
    }

    fn field_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("null".to_owned()),
            Just("7".to_owned()),
            Just(r#""user""#.to_owned()),
            Just(r#""[COMPACTED CONTEXT] earlier""#.to_owned()),
            "[a-z \\\"]{0,8}".prop_map(|t| format!("\"{t}\"")),
            Just(r#"[{"type":"text","text":"a"},{"type":"image_url"}]"#.to_owned()),
            Just(r#"[{"id":"c1","function":{"name":"f","arguments":"{}"}}]"#.to_owned()),
            Just(r#"{"name":"f","arguments":"{\"a\":1}"}"#.to_owned()),
            Just("[]".to_owned()),
        ]
    }

    proptest::proptest! {
        #[test]
        fn any_message_reads_as_its_value(
            fields in proptest::collection::vec(
                (proptest::sample::select(&["role", "content", "name", "tool_calls",
                    "tool_call_id", "function_call", "refusal", "other"][..]), field_value()),
                0..6,
            ),
            role in proptest::sample::select(&["user", "assistant", "tool", "system",
                "function", "developer", "critic"][..]),
        ) {
            let mut raw = format!(r#"{{"role":"{role}""#);
            for (key, value) in &fields {
                raw.push_str(&format!(r#","{key}":{value}"#));
            }
            raw.push('}');
            let Ok(raw) = RawValue::from_string(raw) else { return Ok(()) };
            assert_reads_as_its_value(&Message::from_raw(raw).unwrap());
        }
    }

    #[test]
    fn round_trip_is_byte_exact() {
        let body = br#"{"model":"gpt-4o","x_unknown":{"b":1,"a":[1.0,2]},"messages":[{"role":"user","zz":1,"content":[{"type":"text","text":"hi","extra":true}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"},"vendor":7}]}],"stream":true}"#;
        let r = ChatRequest::parse(body).unwrap();
        assert_eq!(r.to_vec(), body.to_vec());
        assert_eq!(r.model().as_deref(), Some("gpt-4o"));
        assert_eq!(r.messages().len(), 2);
        assert_eq!(r.messages()[0].text(), "hi");
        assert!(r.messages()[1].makes_calls());
    }

    #[test]
    fn replaced_messages_keep_other_fields_in_order() {
        let body = br#"{"a":1,"messages":[{"role":"user","content":"x"}],"max_tokens":50}"#;
        let r = ChatRequest::parse(body).unwrap();
        assert_eq!(r.max_reply_tokens(), Some(50));
        let m = Message::from_value(serde_json::json!({"role":"user","content":"y"})).unwrap();
        let out = r.with_messages(vec![Arc::new(m)]).to_vec();
        assert_eq!(out, br#"{"a":1,"messages":[{"role":"user","content":"y"}],"max_tokens":50}"#);
    }

    #[test]
    fn rejects_non_chat_bodies() {
        assert!(ChatRequest::parse(b"[1]").is_err());
        assert!(ChatRequest::parse(br#"{"model":"x"}"#).is_err());
        assert!(ChatRequest::parse(br#"{"messages":[1]}"#).is_err());
    }
}
