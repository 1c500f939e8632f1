//! An output item foldgate adds in front of a Responses answer (`POST /v1/responses`),
//! such as the `compaction` item of a compaction it made: in a whole answer
//! ([`insert_output_item`]) and in an event stream ([`OutputItemInjector`]); and the
//! whole answer of a request foldgate compacts itself ([`compaction_answer`]).
//!
//! In a stream the item is announced right after the leading events
//! (`response.created`, `response.in_progress`, `response.queued`) as
//! `response.output_item.added` and `response.output_item.done` at `output_index` 0;
//! every later event's `output_index` moves up by one and its `sequence_number` by two
//! (the injected events take the two numbers after the last leading event's), and the
//! `response.output` of a later event that carries one (`response.completed`,
//! `response.incomplete`, `response.failed`) gets the item first. Leading events,
//! comments and what cannot be read pass through byte for byte; a changed event keeps
//! every byte but the numbers and the item it gains.

use super::event_stream::{self, Flow, Rewriting};
use super::json_text::{Object, edit_member, is_object, prepend_item, splice};

/// foldgate's whole answer to a request it compacts itself (Codex's `compaction_trigger`):
/// a Response of `model` whose `output` is `item` alone, with `input_tokens` and
/// `output_tokens` as its usage; as an event stream when `events` (`response.created`,
/// `response.in_progress`, the item's `response.output_item.added` and `done`,
/// `response.completed`), else one JSON object.
pub fn compaction_answer(
    item: &str,
    model: &str,
    (input_tokens, output_tokens): (u64, u64),
    events: bool,
) -> Vec<u8> {
    let item: serde_json::Value = serde_json::from_str(item).unwrap_or_default();
    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let usage = serde_json::json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    });
    let response = |status: &str, output: serde_json::Value, usage: serde_json::Value| {
        serde_json::json!({
            "id": id, "object": "response", "created_at": created, "status": status,
            "model": model, "output": output, "usage": usage,
        })
    };
    let done = response("completed", serde_json::json!([item]), usage);
    if !events {
        return done.to_string().into_bytes();
    }
    let started = response("in_progress", serde_json::json!([]), serde_json::Value::Null);
    let stream = [
        ("response.created", serde_json::json!({"response": started})),
        ("response.in_progress", serde_json::json!({"response": started})),
        ("response.output_item.added", serde_json::json!({"output_index": 0, "item": item})),
        ("response.output_item.done", serde_json::json!({"output_index": 0, "item": item})),
        ("response.completed", serde_json::json!({"response": done})),
    ];
    let mut out = Vec::new();
    for (number, (kind, mut data)) in stream.into_iter().enumerate() {
        if let Some(map) = data.as_object_mut() {
            map.insert("type".to_owned(), kind.into());
            map.insert("sequence_number".to_owned(), number.into());
        }
        out.extend(event_stream::event(kind, &data.to_string()));
    }
    out
}

/// The events that open a Responses stream, before any output.
const LEADING: [&str; 3] = ["response.created", "response.in_progress", "response.queued"];

/// The answer `body` (a Response object) with `item` (a JSON object text) as the first
/// element of its `output`, every other byte as received. `None` when `body` is not a
/// JSON object with an `output` array, or `item` is not a JSON object.
pub fn insert_output_item(body: &[u8], item: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    if !is_object(item) {
        return None;
    }
    let whole = 0..text.len();
    let out = edit_member(text, whole, "output", |output| prepend_item(output, item))?;
    Some(out.into_bytes())
}

/// Rewrites a Responses event stream, fed in chunks split anywhere, so that it carries
/// an item first (see the module documentation). A stream that is not an event stream,
/// or whose first event is not a leading one, passes through unchanged.
#[derive(Debug)]
pub struct OutputItemInjector {
    /// The item on one line; `None` (not a JSON object) passes everything through.
    item: Option<String>,
    stream: Rewriting,
    state: State,
}

/// Where the injector is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first event that is not a leading one: how many leading events were
    /// seen and the last one's `sequence_number`.
    Leading { count: u64, last: Option<u64> },
    /// The item was announced: later events are shifted.
    Shifting,
}

impl OutputItemInjector {
    /// An injector of `item` (a JSON object text).
    pub fn new(item: String) -> Self {
        let item = is_object(&item).then(|| event_stream::one_line(&item));
        Self { item, stream: Rewriting::default(), state: State::Leading { count: 0, last: None } }
    }

    /// The bytes to send for `chunk` (possibly fewer or more: whole events only).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let Some(item) = self.item.as_deref() else { return chunk.to_vec() };
        let state = &mut self.state;
        self.stream.push(chunk, |block, out| on_block(item, state, block, out))
    }

    /// The bytes still held at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        self.stream.finish()
    }
}

/// Writes one whole event block of the stream.
fn on_block(item: &str, state: &mut State, block: &[u8], out: &mut Vec<u8>) -> Flow {
    let read = event_stream::read(block);
    let Some(data) = read.data.as_deref() else {
        out.extend_from_slice(block); // A comment, or data that is not text.
        return Flow::Rewrite;
    };
    if let State::Leading { count, last } = *state {
        let kind = read.kind();
        if kind.as_deref().is_some_and(|k| LEADING.contains(&k)) {
            let seq = number(data, "sequence_number").or(last);
            *state = State::Leading { count: count + 1, last: seq };
            out.extend_from_slice(block);
            return Flow::Rewrite;
        }
        if count == 0 {
            out.extend_from_slice(block);
            return Flow::PassRest;
        }
        let first = last.map_or(count, |n| n.saturating_add(1));
        out.extend(announce(item, first));
        *state = State::Shifting;
    }
    match shifted(data, item) {
        Some(data) => out.extend(event_stream::with_data(block, &data)),
        None => out.extend_from_slice(block),
    }
    Flow::Rewrite
}

/// The two events that announce `item` at `output_index` 0, numbered from `seq`.
fn announce(item: &str, seq: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, kind) in ["response.output_item.added", "response.output_item.done"].iter().enumerate()
    {
        let seq = seq.saturating_add(i as u64);
        let data = format!(
            r#"{{"type":"{kind}","output_index":0,"item":{item},"sequence_number":{seq}}}"#
        );
        out.extend(event_stream::event(kind, &data));
    }
    out
}

/// A later event's data with its top-level `output_index` one up, `sequence_number` two
/// up and `response.output` starting with `item`; `None` when nothing changes.
fn shifted(data: &str, item: &str) -> Option<String> {
    let mut text = data.to_owned();
    let mut changed = false;
    for (name, by) in [("output_index", 1), ("sequence_number", 2)] {
        if let Some(next) = add_to(&text, name, by) {
            text = next;
            changed = true;
        }
    }
    let response = Object::parse(&text).and_then(|o| o.get("response").map(|m| m.value.clone()));
    if let Some(range) = response {
        let with_item = edit_member(&text, range, "output", |output| prepend_item(output, item));
        if let Some(next) = with_item {
            text = next;
            changed = true;
        }
    }
    changed.then_some(text)
}

/// The top-level member `name` of the object `text`, when it is a whole number.
fn number(text: &str, name: &str) -> Option<u64> {
    Object::parse(text)?.value(text, name)?.parse().ok()
}

/// The object `text` with its top-level whole number `name` increased by `by`.
fn add_to(text: &str, name: &str, by: u64) -> Option<String> {
    let object = Object::parse(text)?;
    let member = object.get(name)?;
    let value: u64 = text.get(member.value.clone())?.parse().ok()?;
    splice(text, member.value.clone(), &value.saturating_add(by).to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const ITEM: &str = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"abc"}"#;

    fn stream() -> String {
        let events = [
            (
                "response.created",
                r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#,
            ),
            (
                "response.in_progress",
                r#"{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#,
            ),
            (
                "response.output_item.added",
                r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","content":[],"status":"in_progress"}}"#,
            ),
            (
                "response.output_text.delta",
                r#"{"type":"response.output_text.delta","sequence_number":3,"output_index":0,"item_id":"msg_1","content_index":0,"delta":"Hi"}"#,
            ),
            (
                "response.output_item.done",
                r#"{"type":"response.output_item.done","sequence_number":4,"output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}],"status":"completed"}}"#,
            ),
            (
                "response.completed",
                r#"{"type":"response.completed","sequence_number":5,"response":{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}],"status":"completed"}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}"#,
            ),
        ];
        let mut out = String::from(": keep-alive\n\n");
        for (name, data) in events {
            out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        }
        out
    }

    fn run(stream: &[u8], splits: &[usize]) -> Vec<u8> {
        let mut injector = OutputItemInjector::new(ITEM.to_owned());
        let mut out = Vec::new();
        let mut at = 0;
        for &split in splits.iter().chain(std::iter::once(&stream.len())) {
            out.extend(injector.push(&stream[at..split]));
            at = split;
        }
        out.extend(injector.finish());
        out
    }

    fn events(stream: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8(stream.to_vec())
            .unwrap()
            .split("\n\n")
            .filter_map(|block| {
                let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
                let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
                Some((name.to_owned(), serde_json::from_str(data).unwrap()))
            })
            .collect()
    }

    #[test]
    fn the_item_comes_first_and_later_events_shift() {
        let out = run(stream().as_bytes(), &[]);
        let events = events(&out);
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.output_item.added",
                "response.output_text.delta",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let seqs: Vec<u64> =
            events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (0..8).collect::<Vec<_>>());
        let item: Value = serde_json::from_str(ITEM).unwrap();
        assert_eq!(events[2].1["item"], item);
        assert_eq!(events[3].1["item"], item);
        assert_eq!(events[2].1["output_index"], 0);
        for (_, d) in &events[4..7] {
            assert_eq!(d["output_index"], 1);
        }
        let output = &events[7].1["response"]["output"];
        assert_eq!(output[0], item);
        assert_eq!(output[1]["id"], "msg_1");
        // Leading events and comments byte for byte; a shifted event only in its numbers.
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(&stream()[..stream().find("event: response.output").unwrap()]));
        assert!(text.contains(r#"data: {"type":"response.output_text.delta","sequence_number":5,"output_index":1,"item_id":"msg_1","content_index":0,"delta":"Hi"}"#));
    }

    #[test]
    fn chunks_split_at_every_byte_give_the_same_stream() {
        let stream = stream();
        let whole = run(stream.as_bytes(), &[]);
        for split in 0..=stream.len() {
            assert_eq!(run(stream.as_bytes(), &[split]), whole, "split at {split}");
        }
        let every: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(run(stream.as_bytes(), &every), whole);
    }

    #[test]
    fn streams_it_must_not_touch_pass_through() {
        let no_leading = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":0,\"output_index\":0}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"output\":[]}}\n\n";
        let error = "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\"}}";
        for stream in [no_leading, error, "", "data: [DONE]\n\n", "not sse at all"] {
            for split in 0..=stream.len() {
                assert_eq!(run(stream.as_bytes(), &[split]), stream.as_bytes(), "{stream}");
            }
        }
        // An item that is not an object changes nothing.
        let mut injector = OutputItemInjector::new("[1]".into());
        assert_eq!(injector.push(stream().as_bytes()), stream().as_bytes());
    }

    #[test]
    fn a_failed_stream_gets_the_item_too_and_crlf_is_kept() {
        let stream = "event: response.created\r\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[]}}\r\n\r\nevent: response.failed\r\ndata: {\"type\":\"response.failed\",\"sequence_number\":1,\"response\":{\"status\":\"failed\",\"output\":[]}}\r\n\r\n";
        let out = String::from_utf8(run(stream.as_bytes(), &[])).unwrap();
        assert!(out.ends_with("event: response.failed\r\ndata: {\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{\"status\":\"failed\",\"output\":[{\"type\":\"compaction\",\"id\":\"cmp_1\",\"encrypted_content\":\"abc\"}]}}\r\n\r\n"), "{out}");
        assert!(out.contains("\"sequence_number\":1}\n\nevent: response.output_item.done"));
    }

    #[test]
    fn a_whole_answer_gets_the_item_first() {
        let body = br#"{"id":"resp_1", "object":"response","output": [ {"type":"message"} ],"usage":null}"#;
        let out = insert_output_item(body, ITEM).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                r#"{{"id":"resp_1", "object":"response","output": [{ITEM}, {{"type":"message"}} ],"usage":null}}"#
            )
        );
        let empty = insert_output_item(br#"{"output":[]}"#, ITEM).unwrap();
        let value: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(value, json!({"output": [serde_json::from_str::<Value>(ITEM).unwrap()]}));
        assert!(insert_output_item(br#"{"output":{}}"#, ITEM).is_none());
        assert!(insert_output_item(br#"{"id":1}"#, ITEM).is_none());
        assert!(insert_output_item(b"\xff", ITEM).is_none());
        assert!(insert_output_item(br#"{"output":[]}"#, "1").is_none());
    }
}
