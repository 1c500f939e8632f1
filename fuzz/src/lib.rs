//! The checks behind foldgate's fuzz targets, one per parser of untrusted bytes. Each
//! takes the fuzzer's input, runs the parser on it and asserts what must hold for every
//! input: no panic, and the parser's own promises (a request that is not compacted
//! renders byte for byte, a stream split anywhere reads the same, the outline and the
//! parse agree). A failed assertion is a crash the fuzzer keeps.
//!
//! The same checks replay every reproducer kept under `fuzz/regressions/` in the test
//! suite (`tests/fuzz_regressions.rs`), without libFuzzer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use foldgate::api::anthropic_edits::{self, apply_clearing, without_context_management};
use foldgate::api::compaction_item::take_trigger;
use foldgate::api::compaction_item::{Sealer, open_items, take_context_management};
use foldgate::api::event_stream::{Flow, Rewriting};
use foldgate::api::responses::{
    expand_chain, input_items, joined_items, previous_response, without_trigger,
};
use foldgate::api::responses_output::OutputItemInjector;
use foldgate::compaction::check::verify;
use foldgate::compaction::{Engine, Forward, Options, SessionState};
use foldgate::config::CompactionConfig;
use foldgate::conversation::Rewritten;
use foldgate::http::content_coding::{self, Coding};
use foldgate::http::dialect::overflow::MIN_STATED_WINDOW;
use foldgate::http::dialect::{ChatCompletions, Dialect, Messages, OverflowSignals, Responses};
use foldgate::http::provider_compaction::{CompactionFamily, MessagesContext, rejects_field};
use foldgate::http::session_key::SessionHeaders;
use foldgate::http::sse::Events;
use foldgate::http::usage::{Usage, UsageReader, response_output};
use foldgate::http::wire::codec::{Decoded, Decoder, parse_head};
use foldgate::http::wire::inbound::{Answering, parse_request_head, response_head};
use foldgate::model::{ChatRequest, Role};
use foldgate::outline::{Outline, array_elements};
use foldgate::summarizer::ExtractiveSummarizer;
use http::{HeaderMap, HeaderName, HeaderValue};

/// A target's check of one input.
pub type Check = fn(&[u8]);

/// Every check, by target name: what `tests/fuzz_regressions.rs` replays.
pub const CHECKS: &[(&str, Check)] = &[
    ("outline", outline),
    ("chat_request", chat_request),
    ("responses_request", responses_request),
    ("messages_request", messages_request),
    ("sse_events", sse_events),
    ("usage_tap", usage_tap),
    ("error_readers", error_readers),
    ("session_key", session_key),
    ("stored_state", stored_state),
    ("compaction_item", compaction_item),
    ("event_stream", event_stream),
    ("anthropic_edits", anthropic_edits),
    ("request_encoding", request_encoding),
    ("upstream_response", upstream_response),
    ("client_request", client_request),
];

/// The input's first bytes (up to eight) as chunk sizes, cycled, and the rest as the
/// bytes to split: where a network may cut a stream.
pub fn split(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let control = data.first().map_or(0, |b| usize::from(b % 8) + 1).min(data.len());
    let (sizes, rest) = data.split_at(control);
    let sizes = sizes.iter().map(|&b| usize::from(b % 97) + 1).collect();
    (sizes, rest)
}

/// The ends of the chunks `sizes` (cycled) cut `len` bytes into.
fn chunk_ends(sizes: &[usize], len: usize) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    for &size in sizes.iter().cycle() {
        if at >= len {
            break;
        }
        at = (at + size).min(len);
        ends.push(at);
    }
    ends
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap())
}

/// The outline scanner: whatever it finds lies inside the body; where the full parse
/// also reads the body as a chat request, both see the same messages and model.
pub fn outline(data: &[u8]) {
    for element in array_elements(data).flatten() {
        assert!(within(data, element));
    }
    let Some(outline) = Outline::scan(data) else { return };
    // As a request's body, kept on this thread with its outline (and taken up again
    // when a body of another run starts the same): the same outline.
    let shared = Bytes::copy_from_slice(data);
    let kept = Outline::scan_kept(&shared).expect("a request's body scans as the bytes do");
    assert_eq!(format!("{kept:?}"), format!("{outline:?}"), "a kept scan");
    let again = Outline::scan_kept(&shared).expect("a body that scanned scans again");
    assert_eq!(format!("{again:?}"), format!("{outline:?}"), "a resumed scan");
    let _ = (outline.max_reply_tokens(), outline.tools_raw(), outline.first_with_role(Role::User));
    for m in outline.messages() {
        assert!(within(data, outline.raw(m)));
    }
    if let Ok(request) = ChatRequest::parse(data) {
        assert_eq!(outline.messages().len(), request.messages().len(), "messages");
        assert_eq!(outline.model().as_deref(), request.model().as_deref(), "model");
    }
}

/// True when `part` is a slice of `whole`.
fn within(whole: &[u8], part: &[u8]) -> bool {
    let (start, end) = (whole.as_ptr() as usize, whole.as_ptr() as usize + whole.len());
    let p = part.as_ptr() as usize;
    part.is_empty() || (p >= start && p + part.len() <= end)
}

/// Chat completions: a parsed request serializes to the same JSON, and serializing
/// that again gives the same bytes.
pub fn chat_request(data: &[u8]) {
    outline(data);
    let Some((request, ())) = ChatCompletions.parse(data) else { return };
    let body = request.to_vec();
    let again = ChatRequest::parse(&body).expect("a serialized request parses");
    assert_eq!(again.to_vec(), body, "serializing is a fixed point");
    if let (Ok(a), Ok(b)) = (
        serde_json::from_slice::<serde_json::Value>(data),
        serde_json::from_slice::<serde_json::Value>(&body),
    ) {
        assert_eq!(a, b, "the same JSON");
    }
}

/// A request of an API shape whose messages are rendered back from their original
/// items: with every message unchanged it renders byte for byte.
fn renders_unchanged<D: Dialect>(dialect: &D, data: &[u8]) {
    let original = Bytes::copy_from_slice(data);
    let _ = dialect.outline(&original).map(|o| dialect.outline_model(&o));
    let Some((request, origins)) = dialect.parse(data) else { return };
    let _ = dialect.server_state(&origins);
    let rewritten = Rewritten { body: Bytes::from(request.to_vec()), request: Arc::new(request) };
    let rendered = dialect.render(&original, &origins, &rewritten);
    assert_eq!(rendered, original, "an unchanged request renders byte for byte");
}

/// The Responses API: parse and render.
pub fn responses_request(data: &[u8]) {
    renders_unchanged(&Responses, data);
    responses_chains(data);
}

/// What Responses chains and Codex's `compaction_trigger` read of a body (and of stored
/// chain items, which come back from the session store): they only read.
fn responses_chains(data: &[u8]) {
    let _ = take_trigger(data);
    let _ = previous_response(data);
    if let Some(items) = input_items(data) {
        let _ = without_trigger(items.clone());
        let _ = joined_items(&[&items, &items]);
        let _ = expand_chain(data, items.as_bytes());
    }
    let _ = expand_chain(data, data);
}

/// Anthropic Messages: parse and render.
pub fn messages_request(data: &[u8]) {
    renders_unchanged(&Messages, data);
}

/// Server-sent events: the events of a stream are the same however it is split.
pub fn sse_events(data: &[u8]) {
    let (sizes, stream) = split(data);
    let owned = |e: foldgate::http::sse::Event<'_>| (e.name.map(<[u8]>::to_vec), e.data.to_vec());
    let mut whole = Vec::new();
    let mut events = Events::default();
    while let Some(e) = events.next(stream) {
        whole.push(owned(e));
    }
    let mut split = Vec::new();
    let mut events = Events::default();
    for end in chunk_ends(&sizes, stream.len()) {
        while let Some(e) = events.next(&stream[..end]) {
            split.push(owned(e));
        }
    }
    assert_eq!(split, whole, "the same events however the stream is split");
}

/// The usage reader: the usage it reads is the same however the body is split; JSON or
/// SSE by the input's first byte.
pub fn usage_tap(data: &[u8]) {
    let (sizes, body) = split(data);
    let content_type = match sizes.first() {
        Some(n) if n % 2 == 0 => "application/json",
        _ => "text/event-stream",
    };
    let _ = response_output(body);
    let whole = tap(content_type, body, &[body.len().max(1)]);
    let split = tap(content_type, body, &sizes);
    assert_eq!(split, whole, "the same usage however the body is split");
}

/// The usage a reader finds in `body` read in chunks of `sizes`.
fn tap(content_type: &str, body: &[u8], sizes: &[usize]) -> Option<Usage> {
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
    let mut reader = UsageReader::for_answer(&headers);
    let mut start = 0;
    for end in chunk_ends(sizes, body.len()) {
        reader.observe(&Bytes::copy_from_slice(&body[start..end]));
        start = end;
    }
    // The same usage whether the answering model is read or not.
    let usage = reader.finish(true).map(|(usage, _)| usage);
    assert_eq!(reader.finish(false).map(|(usage, _)| usage), usage, "usage without the model");
    usage
}

/// The readers of upstream error answers: overflow, the window stated, and a field
/// rejected; they only read.
pub fn error_readers(data: &[u8]) {
    for overflow in [
        ChatCompletions.overflow().is_overflow(data),
        Responses.overflow().is_overflow(data),
        Messages.overflow().is_overflow(data),
    ] {
        let _ = overflow;
    }
    for window in [
        ChatCompletions.overflow().stated_window(data),
        Responses.overflow().stated_window(data),
        Messages.overflow().stated_window(data),
    ]
    .into_iter()
    .flatten()
    {
        assert!(window >= MIN_STATED_WINDOW, "a stated window is a plausible size: {window}");
    }
    let _ = rejects_field(data, "context_management");
    let _ = MessagesContext.refuses(http::StatusCode::BAD_REQUEST, data);
    for name in [&b"message_start"[..], b"message_delta", b"error"] {
        let event = foldgate::http::sse::Event { name: Some(name), data: data.into() };
        let _ = Messages.overflow().stream_event(&event);
    }
}

/// The session key: the input's first line is headers (`name: value` separated by
/// `\x1f`), the rest a body. Where a dialect finds the key from the outline and from
/// the parsed request, the two are the same key.
pub fn session_key(data: &[u8]) {
    let (head, body) = match memchr_newline(data) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let headers = headers_of(head);
    same_key(&ChatCompletions, &headers, body);
    same_key(&Responses, &headers, body);
    same_key(&Messages, &headers, body);
}

fn memchr_newline(data: &[u8]) -> Option<usize> {
    data.iter().position(|&b| b == b'\n')
}

/// Headers from `name: value` pairs separated by `\x1f`; unusable ones are skipped.
fn headers_of(head: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for pair in head.split(|&b| b == 0x1f) {
        let Some(colon) = pair.iter().position(|&b| b == b':') else { continue };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&pair[..colon]),
            HeaderValue::from_bytes(pair[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

fn same_key<D: Dialect>(dialect: &D, headers: &HeaderMap, body: &[u8]) {
    // The default headers: foldgate's own and Codex's.
    let named_by = SessionHeaders::default();
    let shared = Bytes::copy_from_slice(body);
    let outline = dialect.outline(&shared);
    let from_outline =
        outline.as_ref().and_then(|o| dialect.outline_session_key(headers, &named_by, o));
    // Again, from the parts the thread kept the first time.
    let again = outline.as_ref().and_then(|o| dialect.outline_session_key(headers, &named_by, o));
    assert_eq!(from_outline, again, "the kept parts give the key they gave");
    let Some((request, _)) = dialect.parse(body) else { return };
    let parsed = dialect.session_key(headers, &named_by, &request);
    if let Some(from_outline) = from_outline {
        assert_eq!(from_outline, parsed, "the outline's key is the parsed request's");
    }
}

/// A stored session value read back: any bytes are either refused or a state the
/// engine runs a request on without a panic and without breaking a guarantee. The input
/// is read as a stored value, and also as edits of a real state (made by the engine for
/// the request it then runs), so that blocks whose hashes still match the history carry
/// forged indices, ranges, messages and cuts.
pub fn stored_state(data: &[u8]) {
    if let Ok(state) = serde_json::from_slice::<SessionState>(data) {
        run_on_state(state);
    }
    run_on_state(edited(base_state().clone(), data));
}

/// The request the stored-state target runs, parsed.
fn stored_state_request() -> &'static ChatRequest {
    static REQUEST: OnceLock<ChatRequest> = OnceLock::new();
    REQUEST.get_or_init(|| ChatRequest::parse(STORED_STATE_REQUEST.as_bytes()).unwrap())
}

fn stored_state_options() -> Options {
    Options { window_cap: Some(1_500), ..Options::default() }
}

/// The state the engine leaves after the stored-state request, without its last turn.
fn base_state() -> &'static SessionState {
    static STATE: OnceLock<SessionState> = OnceLock::new();
    STATE.get_or_init(|| {
        let full = stored_state_request();
        let earlier = full.with_messages(full.messages()[..full.messages().len() - 1].to_vec());
        let mut state = SessionState::default();
        let engine = Engine::new(CompactionConfig::default());
        let opts = stored_state_options();
        let run = engine.compact_request(&earlier, &mut state, &ExtractiveSummarizer, &opts);
        runtime().block_on(run).unwrap();
        state
    })
}

/// `state` with the edits `data` spells, four bytes each: what, where, and a value.
fn edited(mut state: SessionState, data: &[u8]) -> SessionState {
    for edit in data.chunks_exact(4) {
        let (at, value) =
            (usize::from(edit[1]), usize::from(u16::from_le_bytes([edit[2], edit[3]])));
        let n = state.blocks.len().max(1);
        let block = state.blocks.get_mut(at % n);
        match (edit[0] % 9, block) {
            (0, Some(b)) => b.verbatim.push(value),
            (1, Some(b)) if !b.verbatim.is_empty() => {
                let i = at % b.verbatim.len();
                b.verbatim[i] = value;
            }
            (2, Some(b)) => b.start = value,
            (3, Some(b)) => b.end = value,
            (4, Some(b)) => b.messages.truncate(at % (b.messages.len() + 1)),
            (5, _) if !state.cut.is_empty() => {
                let i = at % state.cut.len();
                state.cut[i].pos = value;
            }
            (6, _) if !state.cut.is_empty() => {
                let i = at % state.cut.len();
                let item = &mut state.cut[i];
                item.messages = item.messages.take().filter(|_| value % 2 == 0).map(|mut m| {
                    m.truncate(value % (m.len() + 1));
                    m
                });
            }
            (7, Some(b)) => {
                let mut pending = b.clone();
                pending.end = value;
                state.pending = Some(pending);
            }
            (8, _) => state.cut_postponed = value % 2 == 1,
            _ => {}
        }
    }
    state
}

/// Runs the stored-state request on `state`; checks the guarantees of what it forwards.
fn run_on_state(mut state: SessionState) {
    let engine = Engine::new(CompactionConfig::default());
    let request = stored_state_request();
    let opts = stored_state_options();
    let out = runtime().block_on(engine.compact_request(
        request,
        &mut state,
        &ExtractiveSummarizer,
        &opts,
    ));
    let Ok(out) = out else { return };
    let (forwarded, report) = match &out {
        Forward::Unchanged { report } => (request.clone(), report),
        Forward::Compacted { request: forwarded, report, .. } => (forwarded.clone(), report),
    };
    let violations =
        verify(request, &forwarded, engine.config(), &report.budget, &mut state.token_cache);
    assert!(violations.is_empty(), "{violations:?}");
}

/// The conversation the stored-state target runs: large enough to compact at a 1,500
/// token window, with a tool round and small user turns.
const STORED_STATE_REQUEST: &str = r#"{"model":"gpt-4o","messages":[
{"role":"system","content":"You are careful."},
{"role":"user","content":"Fix the parser in src/parse.rs."},
{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"src/parse.rs\"}"}}]},
{"role":"tool","tool_call_id":"c1","content":"fn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\nfn parse() {}\n"},
{"role":"assistant","content":"The parser reads one item at a time; I will make it read lists."},
{"role":"user","content":"Keep the public API unchanged."},
{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/parse.rs\"}"}},{"id":"c3","type":"function","function":{"name":"run","arguments":"{\"cmd\":\"cargo test\"}"}}]},
{"role":"tool","tool_call_id":"c2","content":"edited"},
{"role":"tool","tool_call_id":"c3","content":"test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.31s"},
{"role":"user","content":"Now add a test for empty input."}]}"#;

/// foldgate's own compaction items in a Responses body, opened with a key the input
/// does not know: any body is left alone or refused with an error, never a panic; the
/// `context_management` field comes off leaving valid JSON.
pub fn compaction_item(data: &[u8]) {
    static SEALER: OnceLock<Sealer> = OnceLock::new();
    let sealer = SEALER.get_or_init(|| Sealer::new(&[7; 32]));
    if let Ok(Some(opened)) = open_items(data, sealer) {
        assert!(is_json(&opened), "opened bodies are JSON");
    }
    if let Ok(Some((stripped, _))) = take_context_management(data) {
        assert!(is_json(&stripped), "the body without context_management is JSON");
    }
}

/// True when `text` is JSON text (its syntax: numbers are not converted, so one too
/// large for a float still is).
fn is_json(text: &[u8]) -> bool {
    serde_json::from_slice::<Box<serde_json::value::RawValue>>(text).is_ok()
}

/// The rewriters of answers foldgate changes (a Responses stream getting its compaction
/// item first): the output is the same however the upstream's stream is split, and the
/// block driver alone, changing nothing, passes every byte through.
pub fn event_stream(data: &[u8]) {
    let (sizes, stream) = split(data);
    let ends = chunk_ends(&sizes, stream.len());
    let item = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"fgc1.x"}"#;
    let run = |ends: &[usize]| {
        let mut injector = OutputItemInjector::new(item.to_owned());
        let mut driver = Rewriting::default();
        let (mut injected, mut passed, mut start) = (Vec::new(), Vec::new(), 0);
        for &end in ends {
            injected.extend(injector.push(&stream[start..end]));
            passed.extend(driver.push(&stream[start..end], |block, out| {
                out.extend_from_slice(block);
                Flow::Rewrite
            }));
            start = end;
        }
        injected.extend(injector.finish());
        passed.extend(driver.finish());
        (injected, passed)
    };
    let (whole, passed_whole) = run(&[stream.len()]);
    let (split, passed) = run(&ends);
    assert_eq!(passed_whole, stream, "a driver that changes nothing passes every byte");
    assert_eq!(passed, stream, "however the stream is split");
    assert_eq!(split, whole, "the same rewritten stream however it is split");
}

/// Anthropic's `context_management` read from a Messages body and its clearing edits
/// applied: any body is refused or edited into JSON whose thinking blocks are ones the
/// client sent, unchanged, with every tool use still present.
pub fn anthropic_edits(data: &[u8]) {
    let _ = anthropic_edits::parse_summarize(data);
    let _ = anthropic_edits::without_summarize(data);
    let _ =
        without_context_management(data).map(|b| assert!(is_json(&b), "JSON without the field"));
    let Ok(Some(config)) = anthropic_edits::parse(data) else { return };
    let count = |text: &str| text.len() / 4;
    let cleared = apply_clearing(data, &config, data.len() / 4, &count);
    if cleared.applied.is_empty() {
        assert_eq!(cleared.body, data, "no edit, no change");
        return;
    }
    assert!(is_json(&cleared.body), "the edited body is JSON");
    // Numbers too large for a float are JSON, but no `Value`: nothing more to compare.
    let (Ok(before), Ok(after)) = (
        serde_json::from_slice::<serde_json::Value>(data),
        serde_json::from_slice::<serde_json::Value>(&cleared.body),
    ) else {
        return;
    };
    let blocks = |v: &serde_json::Value, kind: &str| -> Vec<serde_json::Value> {
        v["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == kind)
            .collect()
    };
    for kind in ["thinking", "redacted_thinking"] {
        let sent = blocks(&before, kind);
        for block in blocks(&after, kind) {
            assert!(sent.contains(&block), "{kind} block changed: {block}");
        }
    }
    let ids = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        blocks(v, "tool_use").iter().map(|b| b["id"].clone()).collect()
    };
    assert_eq!(ids(&after), ids(&before), "every tool use stays");
}

/// A compressed request body: the first byte picks the codings (one or two of gzip,
/// deflate, br, zstd), the rest is the body. Decoding ends in bytes within the limit or
/// an error, never a panic, and never holds more than the limit.
pub fn request_encoding(data: &[u8]) {
    const CODINGS: [Coding; 4] = [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd];
    const LIMIT: u64 = 1 << 20;
    let Some((&pick, body)) = data.split_first() else { return };
    let first = CODINGS[usize::from(pick & 3)];
    let codings = if pick & 4 == 0 {
        vec![first]
    } else {
        vec![first, CODINGS[usize::from((pick >> 3) & 3)]]
    };
    if let Ok(decoded) = content_coding::decode(body, &codings, LIMIT) {
        assert!(decoded.len() as u64 <= LIMIT, "decoded past the limit");
    }
}

/// The upstream's HTTP/1.1 answer as foldgate reads it off the connection: the head
/// (for a `GET`, `HEAD` or `POST`, chosen by the input), then the body as its framing
/// says. Read in the input's chunks, it gives what it gives read whole: the same head,
/// body bytes, end and leftover, or an error either way.
pub fn upstream_response(data: &[u8]) {
    let (sizes, wire) = split(data);
    let method = match sizes.first().map_or(0, |s| s % 3) {
        0 => http::Method::GET,
        1 => http::Method::HEAD,
        _ => http::Method::POST,
    };
    let whole = read_response(wire, &[wire.len().max(1)], &method);
    let split = read_response(wire, &sizes, &method);
    assert_eq!(split, whole, "the same answer however the bytes arrive");
}

/// `wire` handed out in chunks ending at the offsets `sizes` give.
struct Feed<'a> {
    wire: &'a [u8],
    ends: std::vec::IntoIter<usize>,
    fed: usize,
}

impl<'a> Feed<'a> {
    fn new(wire: &'a [u8], sizes: &[usize]) -> Self {
        Self { wire, ends: chunk_ends(sizes, wire.len()).into_iter(), fed: 0 }
    }

    /// Appends the next chunk to `buf`; false when none is left.
    fn next(&mut self, buf: &mut bytes::BytesMut) -> bool {
        match self.ends.next() {
            Some(end) => {
                buf.extend_from_slice(&self.wire[self.fed..end]);
                self.fed = end;
                true
            }
            None => false,
        }
    }

    /// Bytes not handed out yet.
    fn unread(&self) -> usize {
        self.wire.len() - self.fed
    }
}

/// A body read with `decoder` from `buf`, fed as it asks: its bytes and whether it had
/// trailers; `None` for an error. `close_ends`: the end of the input ends a body
/// delimited by the close (a response's), instead of being an error.
fn read_body(
    mut decoder: Decoder,
    buf: &mut bytes::BytesMut,
    feed: &mut Feed<'_>,
    close_ends: bool,
) -> Option<(Vec<u8>, bool)> {
    let (mut body, mut trailers) = (Vec::new(), false);
    loop {
        match decoder.decode(buf) {
            Err(_) => return None,
            Ok(Decoded::Data(data)) => {
                assert!(!data.is_empty(), "no empty data frames");
                body.extend_from_slice(&data);
            }
            Ok(Decoded::Trailers(_)) => trailers = true,
            Ok(Decoded::End) => return Some((body, trailers)),
            Ok(Decoded::More) if feed.next(buf) => {}
            Ok(Decoded::More) if close_ends => {
                decoder.closed().ok()?;
                return Some((body, trailers));
            }
            Ok(Decoded::More) => return None,
        }
    }
}

/// A client's HTTP/1.1 request as foldgate's server reads it off the connection: the
/// head, then the body as its framing says. Read in the input's chunks, it gives what it
/// gives read whole: the same request, body bytes, trailers and leftover (a pipelined
/// request), or an error either way. The head of an answer to it states one framing.
pub fn client_request(data: &[u8]) {
    let (sizes, wire) = split(data);
    let whole = read_request(wire, &[wire.len().max(1)]);
    let split = read_request(wire, &sizes);
    assert_eq!(split, whole, "the same request however the bytes arrive");
}

/// What reading `wire` in chunks of `sizes` gives: method, target, body, trailers seen
/// and leftover bytes at its end, or `None` for an error.
fn read_request(wire: &[u8], sizes: &[usize]) -> Option<(String, String, Vec<u8>, bool, usize)> {
    let mut feed = Feed::new(wire, sizes);
    let mut buf = bytes::BytesMut::new();
    let head = loop {
        match parse_request_head(&mut buf) {
            Err(_) => return None,
            Ok(Some(head)) => break head,
            Ok(None) if !feed.next(&mut buf) => return None,
            Ok(None) => {}
        }
    };
    let headers = head.request.headers();
    assert!(
        !(headers.contains_key("transfer-encoding") && headers.contains_key("content-length")),
        "one framing reaches the service"
    );
    let mut answer_headers = http::HeaderMap::new();
    let answering = Answering::of(&head.request, head.keep_alive);
    let answer = response_head(
        http::StatusCode::OK,
        None,
        &mut answer_headers,
        None,
        answering,
        false,
        None,
    );
    let text = String::from_utf8_lossy(&answer.bytes).to_string();
    assert!(
        !(text.contains("content-length:") && text.contains("transfer-encoding:")),
        "one framing in the answer: {text}"
    );
    // A request body is never delimited by the close.
    let (body, trailers) = read_body(Decoder::new(head.framing), &mut buf, &mut feed, false)?;
    let left = buf.len() + feed.unread();
    let request = &head.request;
    Some((request.method().to_string(), request.uri().to_string(), body, trailers, left))
}

/// What reading `wire` in chunks of `sizes` gives: status, body, trailers seen and
/// leftover bytes at its end, or `None` for an error.
fn read_response(
    wire: &[u8],
    sizes: &[usize],
    method: &http::Method,
) -> Option<(u16, Vec<u8>, bool, usize)> {
    let mut feed = Feed::new(wire, sizes);
    let mut buf = bytes::BytesMut::new();
    let head = loop {
        match parse_head(&mut buf, method) {
            Err(_) => return None,
            Ok(Some(head)) => break head,
            Ok(None) if !feed.next(&mut buf) => return None,
            Ok(None) => {}
        }
    };
    let (body, trailers) = read_body(Decoder::new(head.framing), &mut buf, &mut feed, true)?;
    let left = buf.len() + feed.unread();
    Some((head.response.status().as_u16(), body, trailers, left))
}
