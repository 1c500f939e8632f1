//! Reads token usage from an answer as it streams by, without delaying or changing a
//! byte: from a JSON body, or from the SSE event that carries `usage` (usually the last
//! one). The [`UsageReader`] only reads; the exchange's recorder (`super::record`)
//! writes what it found once the answer ended.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;

use crate::metrics::PromptSplit;
use crate::session::record::UsageEntry;

/// JSON bodies larger than this are not parsed for usage.
const MAX_JSON: usize = 4 * 1024 * 1024;
/// An SSE line longer than this is skipped.
const MAX_LINE: usize = 1024 * 1024;

/// Token usage of one response.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens` (Anthropic: `input_tokens` plus the cache read and cache creation
    /// tokens, which it counts apart).
    pub prompt: u64,
    /// `completion_tokens`.
    pub completion: u64,
    /// `prompt_tokens_details.cached_tokens` (Anthropic: `cache_read_input_tokens`): the
    /// prompt tokens read from the provider's cache.
    pub cached: u64,
    /// Anthropic's `cache_creation_input_tokens`: the prompt tokens written to the cache
    /// (billed above uncached input). OpenAI reports none.
    pub cache_write: u64,
}

/// Reads a `usage` object: chat completions name the counts prompt/completion, the
/// Responses API and Anthropic's Messages input/output; Anthropic counts cached prompt
/// tokens apart from `input_tokens`. Read as a derived `serde` struct of optional `u64`
/// members would read it (the tests check it against one), without its visitor per
/// member: `None` for a member that is not a whole number nor `null`, or twice there.
fn usage_fields(raw: &[u8]) -> Option<Usage> {
    usage_fields_end(raw).map(|(usage, _)| usage)
}

/// [`usage_fields`] of the object that starts `json`, and where it ends (one past its
/// closing brace): what follows is not looked at.
fn usage_fields_end(json: &[u8]) -> Option<(Usage, usize)> {
    // prompt_tokens, input_tokens, completion_tokens, output_tokens,
    // cache_read_input_tokens, cache_creation_input_tokens.
    let mut counts = [None::<u64>; 6];
    // prompt_tokens_details, input_tokens_details: each when present (not null), with
    // its `cached_tokens`.
    let mut details = [None::<Option<u64>>; 2];
    let mut seen = 0u8;
    let end = each_member(json, |key, value| {
        let slot = match key {
            b"prompt_tokens" => 0,
            b"input_tokens" => 1,
            b"completion_tokens" => 2,
            b"output_tokens" => 3,
            b"cache_read_input_tokens" => 4,
            b"cache_creation_input_tokens" => 5,
            b"prompt_tokens_details" => 6,
            b"input_tokens_details" => 7,
            _ => return true,
        };
        if seen & (1 << slot) != 0 {
            return false;
        }
        seen |= 1 << slot;
        if value == b"null" {
            return true;
        }
        match slot {
            6 | 7 => cached_tokens(value).map(|cached| details[slot - 6] = Some(cached)),
            _ => whole_number(value).map(|count| counts[slot] = Some(count)),
        }
        .is_some()
    })?;
    let [prompt, input, completion, output, read, created] = counts;
    let cached = details[0].or(details[1]).flatten();
    let (read, created) = (read.unwrap_or(0), created.unwrap_or(0));
    let usage = Usage {
        // Saturating: the counts are the upstream's, any size.
        prompt: prompt.or(input).unwrap_or(0).saturating_add(read).saturating_add(created),
        completion: completion.or(output).unwrap_or(0),
        cached: cached.unwrap_or(0).saturating_add(read),
        cache_write: created,
    };
    Some((usage, end))
}

/// The `cached_tokens` of a `*_tokens_details` object (`Some(None)`: it has none);
/// `None` when it is not an object or the count is not a whole number.
fn cached_tokens(raw: &[u8]) -> Option<Option<u64>> {
    let (mut cached, mut seen) = (None, false);
    each_member(raw, |key, value| {
        if key != b"cached_tokens" {
            return true;
        }
        if std::mem::replace(&mut seen, true) {
            return false;
        }
        if value == b"null" {
            return true;
        }
        cached = whole_number(value);
        cached.is_some()
    })?;
    Some(cached)
}

/// A JSON number that a `u64` deserializes from: digits without a sign, a leading zero,
/// a fraction or an exponent, within range.
fn whole_number(raw: &[u8]) -> Option<u64> {
    match raw {
        b"0" => Some(0),
        [b'1'..=b'9', ..] => raw.iter().try_fold(0u64, |n, &b| {
            let digit = b.is_ascii_digit().then(|| u64::from(b - b'0'))?;
            n.checked_mul(10)?.checked_add(digit)
        }),
        _ => None,
    }
}

/// A JSON string's text when it needs no unescaping (else parsed).
fn string_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.iter().all(|&b| b >= 0x20 && b != b'\\' && b != b'"') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice(raw).ok()
}

impl Usage {
    /// The prompt's tokens, split by how the provider's cache served them.
    pub fn prompt_split(&self) -> PromptSplit {
        PromptSplit { total: self.prompt, cache_read: self.cached, cache_write: self.cache_write }
    }

    /// As the session inspector records it.
    pub fn entry(self) -> UsageEntry {
        UsageEntry {
            prompt: self.prompt,
            cache_read: self.cached,
            cache_write: self.cache_write,
            completion: self.completion,
        }
    }
}

enum Format {
    /// The body's frames so far: most JSON answers arrive in one, which is then parsed
    /// where it lies instead of being copied.
    Json {
        frames: Vec<Bytes>,
        len: usize,
    },
    /// The line being read, and the first and last complete lines that mention `usage`
    /// (parsed only at the end, so no chunk waits for JSON parsing). Anthropic states the
    /// prompt's usage in the first (`message_start`) and the reply's in the last
    /// (`message_delta`).
    Sse {
        line: BytesMut,
        first: Option<Bytes>,
        last: Option<Bytes>,
    },
    Ignored,
}

/// Reads the usage of one answer from its bytes as they pass.
pub struct UsageReader {
    format: Format,
}

impl UsageReader {
    /// A reader for an answer with `headers`: its `Content-Type` says how it is read;
    /// a compressed answer is not read.
    pub fn for_answer(headers: &HeaderMap) -> Self {
        let content_type = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        let encoded = headers.contains_key(http::header::CONTENT_ENCODING);
        let format = match content_type.unwrap_or("") {
            _ if encoded => Format::Ignored,
            t if t.starts_with("text/event-stream") => {
                Format::Sse { line: BytesMut::new(), first: None, last: None }
            }
            t if t.starts_with("application/json") => Format::Json { frames: Vec::new(), len: 0 },
            _ => Format::Ignored,
        };
        Self { format }
    }

    /// Reads `data`, the answer's next bytes.
    pub fn observe(&mut self, data: &Bytes) {
        self.read(data);
    }

    /// The usage the answer carried, and (when `model`) the model it names as having
    /// answered: without it, a JSON answer is not looked at from its start.
    pub fn finish(&mut self, model: bool) -> Option<(Usage, Option<String>)> {
        self.found(model).map(|(usage, named)| (usage, named.map(Cow::into_owned)))
    }

    fn read(&mut self, data: &Bytes) {
        match &mut self.format {
            Format::Json { frames, len } => {
                *len += data.len();
                if *len > MAX_JSON {
                    self.format = Format::Ignored;
                } else {
                    frames.push(data.clone());
                }
            }
            Format::Sse { line, first, last } => {
                for piece in data.split_inclusive(|b| *b == b'\n') {
                    if line.len() + piece.len() <= MAX_LINE {
                        line.extend_from_slice(piece);
                    }
                    if piece.ends_with(b"\n") {
                        if mentions_usage(line) {
                            let complete = line.split().freeze();
                            if first.is_none() {
                                *first = Some(complete.clone());
                            }
                            *last = Some(complete);
                        }
                        line.clear();
                    }
                }
            }
            Format::Ignored => {}
        }
    }

    /// The usage found in what was read.
    fn found(&mut self, model: bool) -> Option<(Usage, Option<Cow<'_, str>>)> {
        match &mut self.format {
            Format::Json { frames, .. } => match frames.as_slice() {
                [one] => usage_in_with(one, model),
                many => {
                    let joined = many.concat();
                    let (usage, model) = usage_in_with(&joined, model)?;
                    Some((usage, model.map(|m| Cow::Owned(m.into_owned()))))
                }
            },
            Format::Sse { line, first, last } => {
                let last = sse_usage(line).or_else(|| last.as_deref().and_then(sse_usage));
                // A last event without the prompt's usage (Anthropic's `message_delta`):
                // the prompt's is in the first (`message_start`).
                match (last, first.as_deref().and_then(sse_usage)) {
                    (Some((mut usage, model)), Some((start, _))) if usage.prompt == 0 => {
                        usage.prompt = start.prompt;
                        usage.cached = start.cached;
                        usage.cache_write = start.cache_write;
                        Some((usage, model))
                    }
                    (last, start) => last.or(start),
                }
            }
            Format::Ignored => None,
        }
    }
}

/// A Responses answer's id and `output` (a JSON array text): from the whole JSON answer
/// `answer`, or from the `response.completed` event of an event stream.
pub fn response_output(answer: &[u8]) -> Option<(String, String)> {
    let trimmed = answer.trim_ascii_start();
    let json = match trimmed.first()? {
        b'{' => trimmed,
        _ => answer
            .split(|b| *b == b'\n')
            .filter_map(|line| line.strip_prefix(b"data:"))
            .find(|data| memchr::memmem::find(data, b"\"response.completed\"").is_some())?
            .trim_ascii(),
    };
    let top = Members::of(json)?;
    let response = match top.response {
        Some(response) => Members::of(response)?,
        None => top,
    };
    let id: String = serde_json::from_slice(response.id?).ok()?;
    let output = std::str::from_utf8(response.output?).ok()?;
    output.starts_with('[').then(|| (id, output.to_owned()))
}

/// Usage in one SSE line `data: {...}`, if it carries any, and the model it names.
fn sse_usage(line: &[u8]) -> Option<(Usage, Option<Cow<'_, str>>)> {
    if !mentions_usage(line) {
        return None;
    }
    usage_in(line.strip_prefix(b"data:")?.trim_ascii())
}

/// A cheap filter: most SSE lines carry no usage.
fn mentions_usage(line: &[u8]) -> bool {
    line.starts_with(b"data:") && memchr::memmem::find(line, b"\"usage\"").is_some()
}

/// The usage in a JSON answer (top-level, under `response` in Responses API events, or
/// under `message` in Anthropic's `message_start`) and the model that answered, as named.
fn usage_in(json: &[u8]) -> Option<(Usage, Option<Cow<'_, str>>)> {
    usage_in_with(json, true)
}

/// [`usage_in`], the model looked for only when `model` (it may still be named when the
/// usage was not found from the end).
fn usage_in_with(json: &[u8], model: bool) -> Option<(Usage, Option<Cow<'_, str>>)> {
    // Most answers end with their usage (chat completions, Messages, Responses): found
    // from the end, only the model is looked for from the start. The answer's text, in
    // between, is not walked.
    if let Some(start) = last_key_value_start(json, b"\"usage\"") {
        // Read as it is walked: the object is not walked once more to find its end,
        // except when it does not read as usage (then only its place decides).
        let read = usage_fields_end(&json[start..]).map(|(usage, len)| (usage, start + len));
        let end = read.as_ref().map(|&(_, end)| end).or_else(|| value_end(json, start));
        let top = end.filter(|&end| closes_outermost(json, end));
        if top.is_some_and(|end| &json[start..end] != b"null") {
            if !model {
                return Some((read?.0, None));
            }
            let model = first_member(json, b"model").filter(|m| *m != b"null");
            return Some((read?.0, model.and_then(string_value)));
        }
    }
    usage_in_members(json)
}

/// [`usage_in`] by walking the answer's members from the start.
fn usage_in_members(json: &[u8]) -> Option<(Usage, Option<Cow<'_, str>>)> {
    let top = Members::of(json)?;
    let holder = match (top.usage, top.response, top.message) {
        (Some(_), _, _) => top,
        (None, Some(response), _) => Members::of(response)?,
        (None, None, message) => Members::of(message?)?,
    };
    let usage = usage_fields(holder.usage?)?;
    let model = holder.model.and_then(string_value);
    Some((usage, model))
}

/// Where the value of the last occurrence of `quoted_key` in `json` starts, when that
/// occurrence is a key (unescaped, followed by a colon); see [`closes_outermost`] for
/// whether it is a member of the outermost object.
///
/// An unescaped quote followed by a name and a quote opens a string (one that closed a
/// string would have to be followed by punctuation), so the key found is a key; and an
/// object that closes where the text ends is the outermost one.
fn last_key_value_start(json: &[u8], quoted_key: &[u8]) -> Option<usize> {
    let at = rfind_quoted(json, quoted_key)?;
    let backslashes = json[..at].iter().rev().take_while(|&&b| b == b'\\').count();
    if backslashes % 2 == 1 {
        return None;
    }
    let i = skip_space(json, at + quoted_key.len());
    if json.get(i) != Some(&b':') {
        return None;
    }
    Some(skip_space(json, i + 1))
}

/// Where the last occurrence of `quoted` (a key with its quotes) in `json` starts, found
/// from the end by the key's first letter: the key sits a few dozen bytes from the end
/// of most answers, closer than a substring searcher's setup pays for, and its first
/// letter (`u`) is rarer there than quotes.
fn rfind_quoted(json: &[u8], quoted: &[u8]) -> Option<usize> {
    let &anchor = quoted.get(1)?;
    let mut end = json.len();
    while let Some(i) = memchr::memrchr(anchor, &json[..end]) {
        if let Some(start) = i.checked_sub(1) {
            if json[start..].starts_with(quoted) {
                return Some(start);
            }
        }
        end = i;
    }
    None
}

/// True when only whole members and the closing brace of an object that ends the text
/// follow a member value that ends at `end`.
fn closes_outermost(json: &[u8], end: usize) -> bool {
    let mut i = skip_space(json, end);
    loop {
        match json.get(i) {
            Some(b'}') => return skip_space(json, i + 1) == json.len(),
            Some(b',') => {
                i = skip_space(json, i + 1);
                if json.get(i) != Some(&b'"') {
                    return false;
                }
                let Some(key_end) = string_end(json, i) else { return false };
                i = skip_space(json, key_end);
                if json.get(i) != Some(&b':') {
                    return false;
                }
                let Some(value_end) = value_end(json, skip_space(json, i + 1)) else {
                    return false;
                };
                i = skip_space(json, value_end);
            }
            _ => return false,
        }
    }
}

/// The raw value of the first member named `key` of the JSON object `json`, walking its
/// members only as far as that one.
fn first_member<'a>(json: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut found = None;
    each_member(json, |name, value| {
        if name == key {
            found = Some(value);
        }
        found.is_none()
    });
    found
}

/// The raw values of a JSON object's `usage`, `model` and `response` members, found
/// without parsing the others: an answer's text is skipped with `memchr`, not read
/// character by character. Nested members of the same names are not taken; a `null`
/// counts as absent.
#[derive(Default)]
struct Members<'a> {
    usage: Option<&'a [u8]>,
    model: Option<&'a [u8]>,
    response: Option<&'a [u8]>,
    message: Option<&'a [u8]>,
    id: Option<&'a [u8]>,
    output: Option<&'a [u8]>,
}

impl<'a> Members<'a> {
    /// `None` when `json` is not an object (or is malformed before its end).
    fn of(json: &'a [u8]) -> Option<Self> {
        let mut members = Self::default();
        each_member(json, |key, value| {
            let value = Some(value).filter(|v| *v != b"null");
            match key {
                b"usage" => members.usage = value,
                b"model" => members.model = value,
                b"response" => members.response = value,
                b"message" => members.message = value,
                b"id" => members.id = value,
                b"output" => members.output = value,
                _ => {}
            }
            true
        })?;
        Some(members)
    }
}

/// Calls `visit` with each member of the JSON object that starts `json`: its key as
/// written (between the quotes, escapes left as they are) and its raw value. Where the
/// object ends (one past its closing brace; what follows is not looked at), or `None`
/// when `json` does not start with an object, it is malformed before its end, or
/// `visit` says stop (false).
fn each_member<'a>(
    json: &'a [u8],
    mut visit: impl FnMut(&'a [u8], &'a [u8]) -> bool,
) -> Option<usize> {
    let mut i = skip_space(json, 0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_space(json, i + 1);
    if json.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if json.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(json, i)?;
        let key = &json[i + 1..key_end - 1];
        i = skip_space(json, key_end);
        if json.get(i) != Some(&b':') {
            return None;
        }
        i = skip_space(json, i + 1);
        let value_end = value_end(json, i)?;
        if !visit(key, &json[i..value_end]) {
            return None;
        }
        i = skip_space(json, value_end);
        match json.get(i)? {
            b',' => i = skip_space(json, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

fn skip_space(json: &[u8], from: usize) -> usize {
    // Most values and keys follow their punctuation directly.
    if json.get(from).is_some_and(|&b| b > b' ') {
        return from;
    }
    from + json
        .get(from..)
        .map_or(0, |rest| rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len()))
}

/// The end (one past the closing quote) of the string whose opening quote is at `start`.
/// Inlined: called for every key and string value, mostly a word or two long, where a
/// call costs as much as the scan.
#[inline(always)]
fn string_end(json: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    // Keys and short values end within a few words: eight bytes at a time while none is
    // a quote or a backslash, cheaper there than `memchr`'s setup; then `memchr`.
    let near = json.len().min(start + 64);
    while i + 8 <= near {
        let word = u64::from_le_bytes(json[i..i + 8].try_into().ok()?);
        let hits = has_byte(word, b'"') | has_byte(word, b'\\');
        if hits == 0 {
            i += 8;
            continue;
        }
        // The lowest flagged byte is a true one: false flags only spill upwards.
        i += (hits.trailing_zeros() / 8) as usize;
        if json[i] == b'"' {
            return Some(i + 1);
        }
        i += 2;
    }
    while i < near {
        match json[i] {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    loop {
        i += memchr::memchr2(b'"', b'\\', json.get(i..)?)?;
        if json[i] == b'\\' {
            i += 2;
        } else {
            return Some(i + 1);
        }
    }
}

/// Non-zero when a byte of `word` is `byte` (the high bit of each such byte set, and
/// maybe of bytes above it: only "any" is read).
const fn has_byte(word: u64, byte: u8) -> u64 {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let x = word ^ (ONES * byte as u64);
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The end of the JSON value starting at `start`.
fn value_end(json: &[u8], start: usize) -> Option<usize> {
    match json.get(start)? {
        b'"' => string_end(json, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            loop {
                match json.get(i)? {
                    b'"' => {
                        i = string_end(json, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let rest = &json[start..];
            let len = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())
                .unwrap_or(rest.len());
            (len > 0).then_some(start + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raw value of the JSON object `json`'s member whose key (with its quotes)
    /// `quoted_key` finds, when its last occurrence in the text is a member of the outermost object:
    /// after its value come only whole members and the object's closing brace. `None`
    /// otherwise (the key nested deeper, escaped, or absent): the caller walks the members.
    fn last_member_from_end<'a>(json: &'a [u8], quoted_key: &[u8]) -> Option<&'a [u8]> {
        let start = last_key_value_start(json, quoted_key)?;
        let end = value_end(json, start)?;
        closes_outermost(json, end).then(|| &json[start..end])
    }

    /// What a reader of an answer of `content_type` arriving as `chunks` finds.
    fn usage_of(content_type: &str, chunks: &[&str]) -> Option<(Usage, Option<String>)> {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        let mut reader = UsageReader::for_answer(&headers);
        for chunk in chunks {
            reader.observe(&Bytes::copy_from_slice(chunk.as_bytes()));
        }
        reader.finish(true)
    }

    #[test]
    fn reads_usage_from_json_split_across_frames() {
        let (usage, _) = usage_of("application/json", &[r#"{"choices":[],"usage":{"prompt_"#, r#"tokens":120,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}"#]).unwrap();
        assert_eq!(usage, Usage { prompt: 120, completion: 7, cached: 64, cache_write: 0 });
    }

    #[test]
    fn reads_usage_from_the_final_sse_chunk() {
        let (usage, _) = usage_of(
            "text/event-stream",
            &[
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
                "data: {\"choices\":[],\"us",
                "age\":{\"prompt_tokens\":50,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
            ],
        )
        .unwrap();
        assert_eq!(usage.prompt, 50);
        assert_eq!(usage.completion, 2);
    }

    #[test]
    fn other_and_compressed_bodies_are_ignored() {
        assert_eq!(usage_of("text/plain", &[r#"{"usage":{"prompt_tokens":1}}"#]), None);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
        headers.insert(http::header::CONTENT_ENCODING, "gzip".parse().unwrap());
        let mut reader = UsageReader::for_answer(&headers);
        reader.observe(&Bytes::from_static(br#"{"usage":{"prompt_tokens":1}}"#));
        assert_eq!(reader.finish(true), None);
    }

    #[test]
    fn names_the_answering_model() {
        let json = r#"{"object":"response","model":"gpt-4.1-mini-2025-04-14","usage":{"input_tokens":30,"output_tokens":4,"input_tokens_details":{"cached_tokens":10}}}"#;
        let (usage, model) = usage_of("application/json", &[json]).unwrap();
        assert_eq!(usage, Usage { prompt: 30, completion: 4, cached: 10, cache_write: 0 });
        assert_eq!(model.as_deref(), Some("gpt-4.1-mini-2025-04-14"));
        assert_eq!(usage.prompt_split().uncached(), 20);
    }

    #[test]
    fn reads_anthropic_usage_from_message_start_and_message_delta() {
        let (usage, model) = usage_of(
            "text/event-stream",
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{\"input_tokens\":40,\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":50,\"output_tokens\":1}}}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ],
        )
        .unwrap();
        assert_eq!(usage, Usage { prompt: 100, completion: 12, cached: 50, cache_write: 10 });
        assert_eq!(usage.prompt_split().uncached(), 40);
        assert_eq!(model, None, "message_delta names no model");
        // A JSON answer: the cache tokens count as prompt tokens.
        let json = r#"{"type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":3,"cache_creation_input_tokens":5,"output_tokens":2}}"#;
        assert_eq!(
            usage_in(json.as_bytes()).unwrap().0,
            Usage { prompt: 15, completion: 2, cached: 3, cache_write: 5 }
        );
    }

    #[test]
    fn finds_top_level_usage_and_model_and_skips_everything_else() {
        let usage = r#"{"prompt_tokens":11,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":5}}"#;
        // Decoys: nested members of the same names, quotes, braces and backslashes
        // inside strings, numbers, literals, whitespace everywhere.
        let answer = format!(
            r#" {{ "id" : "c\"}}{{[", "choices": [{{"message": {{"content": "say \"usage\": {{}} \\", "usage": 1}},
                "logprobs": null, "n": [1.5e3, -2, true, false]}}], "x_groq": {{"usage": {{"prompt_tokens": 99}}}},
                "model" : "gpt-4o-2024-08-06", "usage" : {usage} }} "#
        );
        let (found, model) = usage_in(answer.as_bytes()).unwrap();
        assert_eq!(found, Usage { prompt: 11, completion: 2, cached: 5, cache_write: 0 });
        assert_eq!(model.as_deref(), Some("gpt-4o-2024-08-06"));
        // The Responses API puts both under `response`; a null usage counts as absent.
        let event = format!(
            r#"{{"type":"response.completed","usage":null,"response":{{"model":"o3","usage":{usage}}}}}"#
        );
        assert_eq!(usage_in(event.as_bytes()).unwrap().0.prompt, 11);
        let unnamed = format!(r#"{{"usage":{usage}}}"#);
        assert_eq!(usage_in(unnamed.as_bytes()).unwrap().1, None);
        for no_usage in [
            "",
            "[]",
            "{}",
            r#"{"choices":[{"usage":{"prompt_tokens":1}}]}"#,
            r#"{"usage":{"prompt_tokens":1}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a" 1}"#,
            r#"{"usage":"#,
        ] {
            assert!(usage_in(no_usage.as_bytes()).is_none(), "{no_usage}");
        }
    }

    /// The `usage` object as `serde` reads it: the reference `usage_fields` must match.
    #[derive(serde::Deserialize)]
    struct UsageFields {
        prompt_tokens: Option<u64>,
        input_tokens: Option<u64>,
        completion_tokens: Option<u64>,
        output_tokens: Option<u64>,
        prompt_tokens_details: Option<Details>,
        input_tokens_details: Option<Details>,
        cache_read_input_tokens: Option<u64>,
        cache_creation_input_tokens: Option<u64>,
    }

    #[derive(serde::Deserialize)]
    struct Details {
        cached_tokens: Option<u64>,
    }

    fn by_serde(raw: &[u8]) -> Option<Usage> {
        let u: UsageFields = serde_json::from_slice(raw).ok()?;
        let details = u.prompt_tokens_details.or(u.input_tokens_details);
        let read = u.cache_read_input_tokens.unwrap_or(0);
        let created = u.cache_creation_input_tokens.unwrap_or(0);
        let prompt = u.prompt_tokens.or(u.input_tokens).unwrap_or(0);
        Some(Usage {
            prompt: prompt.saturating_add(read).saturating_add(created),
            completion: u.completion_tokens.or(u.output_tokens).unwrap_or(0),
            cached: details.and_then(|d| d.cached_tokens).unwrap_or(0).saturating_add(read),
            cache_write: created,
        })
    }

    /// A JSON value a usage member may hold, counts and what is not one (valid JSON:
    /// the reader does not validate members it skips, `serde` does).
    fn member_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..1_000_000).prop_map(|n| n.to_string()),
            1 => Just(u64::MAX.to_string()),
            1 => prop_oneof![
                Just("null"), Just("-0"), Just("-3"), Just("1.0"), Just("2e3"),
                Just("18446744073709551616"), Just("\"7\""), Just("true"), Just("[]"),
            ]
            .prop_map(str::to_owned),
        ]
    }

    proptest::proptest! {
        #[test]
        fn usage_is_read_as_serde_reads_it(
            members in proptest::collection::vec(
                (0usize..11, member_value(), proptest::option::of(member_value()), 0usize..3),
                0..9,
            ),
        ) {
            const KEYS: [&str; 11] = [
                "prompt_tokens", "input_tokens", "completion_tokens", "output_tokens",
                "cache_read_input_tokens", "cache_creation_input_tokens",
                "prompt_tokens_details", "input_tokens_details", "total_tokens",
                "cached_tokens", "reasoning",
            ];
            let spaces = ["", " ", "\n  "];
            let fields: Vec<String> = members
                .iter()
                .map(|(key, value, cached, space)| {
                    let pad = spaces[*space];
                    let value = match (*key, cached) {
                        // Details objects: with a count, or empty, or not an object.
                        (6 | 7, Some(cached)) => format!("{{{pad}\"cached_tokens\"{pad}:{cached}}}"),
                        (6 | 7, None) if value.len() % 2 == 0 => "{}".to_owned(),
                        _ => value.clone(),
                    };
                    format!("{pad}\"{}\"{pad}:{pad}{value}{pad}", KEYS[*key])
                })
                .collect();
            let raw = format!("{{{}}}", fields.join(","));
            proptest::prop_assert_eq!(usage_fields(raw.as_bytes()), by_serde(raw.as_bytes()), "{}", raw);
        }
    }

    /// JSON values with the members usage is looked for in, decoys of them nested at
    /// any depth, and texts that mention them with quotes and backslashes.
    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::{Value, json};
        let leaf = prop_oneof![
            Just(Value::Null),
            (0u64..5000).prop_map(|n| json!(n)),
            Just(json!(1.5)),
            "[a-z \"\\\\:{}\\[\\],]{0,12}".prop_map(Value::String),
            Just(json!("say \"usage\": {} \\")),
            Just(json!({"prompt_tokens": 7, "completion_tokens": 2})),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            let key = prop_oneof![
                Just("usage"),
                Just("model"),
                Just("response"),
                Just("message"),
                Just("choices"),
                Just("id"),
                Just("x"),
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((key, inner), 0..5).prop_map(|members| {
                    Value::Object(members.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Usage found from the answer's end is what walking its members finds.
        #[test]
        fn usage_from_the_end_is_usage_from_the_members(
            value in json_value(),
            pretty in proptest::bool::ANY,
        ) {
            let text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let json = text.as_bytes();
            proptest::prop_assert_eq!(usage_in(json), usage_in_members(json), "{}", text);
            // Without the model, the same usage.
            let usage = usage_in(json).map(|(usage, _)| usage);
            proptest::prop_assert_eq!(usage_in_with(json, false).map(|(u, _)| u), usage);
        }
    }

    proptest::proptest! {
        /// A JSON string ends at its closing quote, however long, whatever it escapes.
        #[test]
        fn strings_end_at_their_closing_quote(
            before in "[ ,:{]{0,9}",
            text in "[a\"\\\\\n/é]{0,80}|[a-z_]{0,90}",
            after in "[,:}\\]\"]{0,3}",
        ) {
            let quoted = serde_json::to_string(&text).unwrap();
            let json = format!("{before}{quoted}{after}");
            let end = string_end(json.as_bytes(), before.len());
            proptest::prop_assert_eq!(end, Some(before.len() + quoted.len()));
            // Cut anywhere before its closing quote, it has no end.
            let cut = &json.as_bytes()[..before.len() + quoted.len() - 1];
            proptest::prop_assert_eq!(string_end(cut, before.len()), None);
        }

        /// The last occurrence found from the end by its first letter is the last one;
        /// SSE lines mention usage exactly when they hold the quoted key.
        #[test]
        fn the_last_key_found_from_the_end_is_the_last(text in "[\"usage:a]{0,60}") {
            let key = b"\"usage\"";
            proptest::prop_assert_eq!(mentions_usage(format!("data:{text}").as_bytes()), text.contains("\"usage\""));
            let naive = text.as_bytes().windows(key.len()).rposition(|w| w == key);
            proptest::prop_assert_eq!(rfind_quoted(text.as_bytes(), key), naive);
        }
    }

    #[test]
    fn usage_found_from_the_end_only_at_the_top() {
        let top = br#"{"id":"c","model":"m","choices":[{"usage":{"prompt_tokens":1}}],"usage":{"prompt_tokens":9},"x":[1,{"a":"}"}]}"#;
        let usage = b"\"usage\"";
        assert_eq!(last_member_from_end(top, usage), Some(&br#"{"prompt_tokens":9}"#[..]));
        assert_eq!(usage_in(top).unwrap().0.prompt, 9);
        for nested in [
            &br#"{"a":{"usage":{"prompt_tokens":1}}}"#[..],
            br#"{"a":[{"usage":1}]}"#,
            br#"{"a":"x\"usage\":1"}"#,
            br#"[{"usage":1}]"#,
        ] {
            assert_eq!(last_member_from_end(nested, usage), None);
        }
    }

    #[test]
    fn model_names_read_as_json_strings() {
        assert_eq!(string_value(br#""gpt-4o""#).as_deref(), Some("gpt-4o"));
        assert_eq!(string_value(br#""a\u00e9b""#).as_deref(), Some("a\u{e9}b"));
        assert_eq!(string_value(b"7"), None);
        assert_eq!(usage_fields(br#"{"prompt_tokens":01}"#), None);
        assert_eq!(string_value(b"\"x"), None);
    }

    #[test]
    fn a_responses_answer_gives_its_id_and_output() {
        let json = br#"{"id":"resp_7","object":"response","output":[{"type":"message","content":[]}],"usage":{"input_tokens":1}}"#;
        let (id, output) = response_output(json).unwrap();
        assert_eq!(
            (id.as_str(), output.as_str()),
            ("resp_7", r#"[{"type":"message","content":[]}]"#)
        );
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_8\",\"output\":[]}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_8\",\"output\":[{\"type\":\"function_call\"}]}}\n\n";
        let (id, output) = response_output(stream).unwrap();
        assert_eq!((id.as_str(), output.as_str()), ("resp_8", r#"[{"type":"function_call"}]"#));
        assert_eq!(response_output(br#"{"error":{"message":"no"}}"#), None);
        assert_eq!(response_output(b"event: response.failed\ndata: {}\n\n"), None);
    }
}
