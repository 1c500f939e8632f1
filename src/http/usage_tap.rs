//! Reads token usage from a chat response as it streams by, without delaying or
//! changing a byte: from a JSON body, or from the SSE event that carries `usage`
//! (usually the last one). Recorded once, after the body ended and its bytes went out:
//! in the metrics, and (traces exported) on the span of the request the response answers,
//! which the tap keeps open until then.

use std::sync::{Arc, Mutex};

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

use super::body::{BodyEnd, BodyObserver, Observed, ProxyBody};
use crate::metrics::{Metrics, PromptSplit, model_label};
use crate::session::record::UsageEntry;
use crate::telemetry::span::{self, UsageRecord};

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

/// A `usage` object: chat completions name the counts prompt/completion, the Responses
/// API and Anthropic's Messages input/output; Anthropic counts cached prompt tokens
/// apart from `input_tokens`.
#[derive(Deserialize)]
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

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

impl Usage {
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

impl From<UsageFields> for Usage {
    fn from(u: UsageFields) -> Self {
        let details = u.prompt_tokens_details.or(u.input_tokens_details);
        let read = u.cache_read_input_tokens.unwrap_or(0);
        let created = u.cache_creation_input_tokens.unwrap_or(0);
        Self {
            prompt: u.prompt_tokens.or(u.input_tokens).unwrap_or(0) + read + created,
            completion: u.completion_tokens.or(u.output_tokens).unwrap_or(0),
            cached: details.and_then(|d| d.cached_tokens).unwrap_or(0) + read,
            cache_write: created,
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

/// Called once after a response's body ended (completely, failed or dropped), with the
/// usage it carried, if any.
pub type OnUsage = Box<dyn FnOnce(Option<Usage>) + Send>;

/// Where the usage of a request's answer meets whoever needs it once the answer ended:
/// the tap ends it ([`UsageSlot::end`], through [`UsageSlot::on_usage`]); what is to
/// run then ([`UsageSlot::then`]) runs once, at the end or at once if that was earlier.
#[derive(Clone, Default)]
pub struct UsageSlot(Arc<Mutex<Slot>>);

/// What a [`UsageSlot`] holds.
#[derive(Default)]
enum Slot {
    /// Neither the end nor a waiter yet.
    #[default]
    Open,
    /// The answer ended, with this usage.
    Ended(Option<Usage>),
    /// Runs when the answer ends.
    Waiting(OnUsage),
    /// Done.
    Spent,
}

impl UsageSlot {
    /// The answer ended with `usage`: runs the waiter, if one is registered.
    pub fn end(&self, usage: Option<Usage>) {
        let Ok(mut slot) = self.0.lock() else { return };
        match std::mem::take(&mut *slot) {
            Slot::Waiting(waiter) => {
                *slot = Slot::Spent;
                drop(slot);
                waiter(usage);
            }
            Slot::Open => *slot = Slot::Ended(usage),
            done => *slot = done,
        }
    }

    /// Runs `waiter` with the answer's usage when the answer ends, or now if it has.
    pub fn then(&self, waiter: OnUsage) {
        let Ok(mut slot) = self.0.lock() else { return };
        match std::mem::take(&mut *slot) {
            Slot::Ended(usage) => {
                *slot = Slot::Spent;
                drop(slot);
                waiter(usage);
            }
            Slot::Open => *slot = Slot::Waiting(waiter),
            done => *slot = done,
        }
    }

    /// The tap's side: ends this slot, after `also` (if any) saw the usage.
    pub fn on_usage(&self, also: Option<OnUsage>) -> OnUsage {
        let slot = self.clone();
        Box::new(move |usage| {
            if let Some(also) = also {
                also(usage);
            }
            slot.end(usage);
        })
    }
}

/// Records upstream usage into metrics when the response body it watches ends.
pub struct UsageTap {
    format: Format,
    metrics: Arc<Metrics>,
    model: Option<&'static str>,
    /// The team label of the request (see [`team_of`]), when usage is counted by team.
    team: Option<Arc<str>>,
    on_usage: Option<OnUsage>,
    /// The span of the request answered (the current one when the tap was made): kept
    /// open until the body ends, its usage recorded on it.
    span: tracing::Span,
}

impl UsageTap {
    /// Watches `inner`; `content_type` and `content_encoding` decide how it is read.
    /// Usage is labelled with `model` (the request's, normalised) or else the response's.
    pub fn wrap(
        inner: ProxyBody,
        content_type: Option<&str>,
        encoded: bool,
        metrics: Arc<Metrics>,
        model: Option<&'static str>,
    ) -> Observed<Self> {
        Self::wrap_with(inner, content_type, encoded, metrics, model, None, None)
    }

    /// [`UsageTap::wrap`], also handing the usage found (if any) to `on_usage` at the end.
    pub fn wrap_with(
        inner: ProxyBody,
        content_type: Option<&str>,
        encoded: bool,
        metrics: Arc<Metrics>,
        model: Option<&'static str>,
        team: Option<Arc<str>>,
        on_usage: Option<OnUsage>,
    ) -> Observed<Self> {
        let format = match content_type.unwrap_or("") {
            _ if encoded => Format::Ignored,
            t if t.starts_with("text/event-stream") => {
                Format::Sse { line: BytesMut::new(), first: None, last: None }
            }
            t if t.starts_with("application/json") => Format::Json { frames: Vec::new(), len: 0 },
            _ => Format::Ignored,
        };
        let span = span::current();
        Observed::new(inner, Self { format, metrics, model, team, on_usage, span })
    }

    fn observe(&mut self, data: &Bytes) {
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

    fn finish(&mut self) {
        let joined: Vec<u8>;
        let found = match &mut self.format {
            Format::Json { frames, .. } => match frames.as_slice() {
                [one] => usage_in(one),
                many => {
                    joined = many.concat();
                    usage_in(&joined)
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
        };
        if let Some(on_usage) = self.on_usage.take() {
            // What it does (a calibration stored) is part of the request's trace.
            let _request = self.span.enter();
            on_usage(found.as_ref().map(|(usage, _)| *usage));
        }
        let Some((usage, answered_by)) = found else { return };
        let record = UsageRecord {
            input: usage.prompt,
            output: usage.completion,
            cache_read: usage.cached,
            cache_creation: usage.cache_write,
            response_model: answered_by.as_deref(),
        };
        span::record_usage(&self.span, &record);
        let model =
            self.model.unwrap_or_else(|| answered_by.as_deref().map_or("other", model_label));
        let prompt = PromptSplit {
            total: usage.prompt,
            cache_read: usage.cached,
            cache_write: usage.cache_write,
        };
        self.metrics.upstream_usage(model, prompt, usage.completion);
        if let Some(team) = &self.team {
            self.metrics.team_usage(team, prompt, usage.completion);
        }
    }
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
    line.starts_with(b"data:") && line.windows(7).any(|w| w == b"\"usage\"")
}

/// The usage in a JSON answer (top-level, under `response` in Responses API events, or
/// under `message` in Anthropic's `message_start`) and the model that answered, as named.
fn usage_in(json: &[u8]) -> Option<(Usage, Option<Cow<'_, str>>)> {
    let top = Members::of(json)?;
    let holder = match (top.usage, top.response, top.message) {
        (Some(_), _, _) => top,
        (None, Some(response), _) => Members::of(response)?,
        (None, None, message) => Members::of(message?)?,
    };
    let usage: UsageFields = serde_json::from_slice(holder.usage?).ok()?;
    let model = holder.model.and_then(|raw| serde_json::from_slice::<Cow<'_, str>>(raw).ok());
    Some((usage.into(), model))
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
}

impl<'a> Members<'a> {
    /// `None` when `json` is not an object (or is malformed before its end).
    fn of(json: &'a [u8]) -> Option<Self> {
        let mut members = Self::default();
        let mut i = skip_space(json, 0);
        if json.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_space(json, i + 1);
        if json.get(i) == Some(&b'}') {
            return Some(members);
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
            let value = Some(&json[i..value_end]).filter(|v| *v != b"null");
            match key {
                b"usage" => members.usage = value,
                b"model" => members.model = value,
                b"response" => members.response = value,
                b"message" => members.message = value,
                _ => {}
            }
            i = skip_space(json, value_end);
            match json.get(i)? {
                b',' => i = skip_space(json, i + 1),
                b'}' => return Some(members),
                _ => return None,
            }
        }
    }
}

fn skip_space(json: &[u8], from: usize) -> usize {
    from + json
        .get(from..)
        .map_or(0, |rest| rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len()))
}

/// The end (one past the closing quote) of the string whose opening quote is at `start`.
fn string_end(json: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', json.get(i..)?)?;
        if json[i] == b'\\' {
            i += 2;
        } else {
            return Some(i + 1);
        }
    }
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

impl BodyObserver for UsageTap {
    fn data(&mut self, data: &Bytes) {
        self.observe(data);
    }

    fn end(&mut self, _: BodyEnd) {
        self.finish();
    }
}

/// Wraps a response's body in a [`UsageTap`], handing the usage found (if any) to
/// `on_usage` when the body ends.
pub fn tapped(
    response: http::Response<ProxyBody>,
    metrics: &Arc<Metrics>,
    model: Option<&'static str>,
    team: Option<Arc<str>>,
    on_usage: Option<OnUsage>,
) -> http::Response<ProxyBody> {
    let headers = response.headers();
    let content_type =
        headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let encoded = headers.contains_key(http::header::CONTENT_ENCODING);
    response.map(|body| {
        let tap = UsageTap::wrap_with(
            body,
            content_type.as_deref(),
            encoded,
            metrics.clone(),
            model,
            team,
            on_usage,
        );
        http_body_util::BodyExt::boxed_unsync(tap)
    })
}

/// The team label of a request: the value of the configured team header
/// (`metrics.team_header`), bounded by [`Metrics::team`]; `None` when usage is not
/// counted by team.
pub fn team_of(metrics: &Metrics, headers: &http::HeaderMap) -> Option<Arc<str>> {
    let header = metrics.team_header()?;
    metrics.team(headers.get(header).and_then(|v| v.to_str().ok()))
}

#[cfg(test)]
mod tests {
    use http_body::{Body, Frame};
    use http_body_util::BodyExt;

    use super::*;
    use crate::http::body::BoxError;
    use crate::http::body::full;

    /// Lets the task that records usage (spawned when the body ends) run.
    async fn recorded() {
        tokio::task::yield_now().await;
    }

    async fn usage_of(content_type: &str, chunks: &[&str]) -> String {
        let metrics = Arc::new(Metrics::new().unwrap());
        let stream = futures_util::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c.to_string()))))
                .collect::<Vec<_>>(),
        );
        let body = http_body_util::StreamBody::new(stream).boxed_unsync();
        let tap = UsageTap::wrap(body, Some(content_type), false, metrics.clone(), Some("gpt-4o"));
        let bytes = tap.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, chunks.concat(), "bytes pass unchanged");
        recorded().await;
        String::from_utf8(metrics.render()).unwrap()
    }

    #[tokio::test]
    async fn reads_usage_from_json_split_across_frames() {
        let text = usage_of("application/json", &[r#"{"choices":[],"usage":{"prompt_"#, r#"tokens":120,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}"#]).await;
        assert!(
            text.contains(
                r#"foldgate_upstream_usage_tokens_total{kind="prompt",model="gpt-4o"} 120"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"foldgate_upstream_usage_tokens_total{kind="cached",model="gpt-4o"} 64"#
            )
        );
        assert!(text.contains(
            r#"foldgate_upstream_usage_tokens_total{kind="completion",model="gpt-4o"} 7"#
        ));
    }

    #[tokio::test]
    async fn reads_usage_from_the_final_sse_chunk() {
        let text = usage_of(
            "text/event-stream",
            &[
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
                "data: {\"choices\":[],\"us",
                "age\":{\"prompt_tokens\":50,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
            ],
        )
        .await;
        assert!(
            text.contains(
                r#"foldgate_upstream_usage_tokens_total{kind="prompt",model="gpt-4o"} 50"#
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn records_when_the_body_reports_its_end_without_a_final_poll() {
        // hyper stops polling once `is_end_stream()` is true, as for a complete
        // content-length body, and drops the body: usage is recorded then, after the
        // last bytes went out, never before.
        let metrics = Arc::new(Metrics::new().unwrap());
        let json = r#"{"usage":{"prompt_tokens":9,"completion_tokens":1}}"#;
        let mut tap = UsageTap::wrap(
            full(json),
            Some("application/json"),
            false,
            metrics.clone(),
            Some("o3"),
        );
        let frame = tap.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), json);
        assert!(tap.is_end_stream());
        drop(tap);
        recorded().await;
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(
            text.contains(r#"foldgate_upstream_usage_tokens_total{kind="prompt",model="o3"} 9"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn other_bodies_are_ignored() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let tap = UsageTap::wrap(full("plain"), Some("text/plain"), false, metrics.clone(), None);
        assert_eq!(tap.collect().await.unwrap().to_bytes(), "plain");
        assert!(
            !String::from_utf8(metrics.render()).unwrap().contains("upstream_usage_tokens_total{")
        );
    }

    #[tokio::test]
    async fn without_a_request_model_the_answering_model_labels_usage() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let json = r#"{"object":"response","model":"gpt-4.1-mini-2025-04-14","usage":{"input_tokens":30,"output_tokens":4,"input_tokens_details":{"cached_tokens":10}}}"#;
        let tap =
            UsageTap::wrap(full(json), Some("application/json"), false, metrics.clone(), None);
        tap.collect().await.unwrap();
        recorded().await;
        let text = String::from_utf8(metrics.render()).unwrap();
        let line = |kind: &str, n: u32| {
            format!(
                r#"foldgate_upstream_usage_tokens_total{{kind="{kind}",model="gpt-4.1-mini"}} {n}"#
            )
        };
        assert!(text.contains(&line("prompt", 30)), "{text}");
        assert!(text.contains(&line("completion", 4)));
        assert!(text.contains(&line("cached", 10)));
        assert!(text.contains(&line("uncached", 20)));
        assert!(text.contains(&line("cache_write", 0)), "OpenAI reports no cache writes");
    }

    #[tokio::test]
    async fn reads_anthropic_usage_from_message_start_and_message_delta() {
        let text = usage_of(
            "text/event-stream",
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{\"input_tokens\":40,\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":50,\"output_tokens\":1}}}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ],
        )
        .await;
        let line = |kind: &str, n: u32| {
            format!(r#"foldgate_upstream_usage_tokens_total{{kind="{kind}",model="gpt-4o"}} {n}"#)
        };
        assert!(text.contains(&line("prompt", 100)), "{text}");
        assert!(text.contains(&line("cached", 50)), "{text}");
        assert!(text.contains(&line("cache_write", 10)), "{text}");
        assert!(text.contains(&line("uncached", 40)), "{text}");
        assert!(text.contains(&line("completion", 12)), "{text}");
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
}
