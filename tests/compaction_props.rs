#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
//! Property tests of the engine's guarantees over generated conversations: tool calls
//! with reused ids, legacy function calls, long live turns, text-mode observations,
//! images, huge tool outputs, huge user pastes, string and part-array content.

use std::sync::Arc;

use foldgate::compaction::check::verify;
use foldgate::compaction::{Engine, Forward, Options, SessionState};
use foldgate::config::CompactionConfig;
use foldgate::model::{ChatRequest, DIGEST_MARKER, Message};
use foldgate::summarizer::ExtractiveSummarizer;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

const VOCAB: &[&str] = &[
    "the",
    "parser",
    "fails",
    "on",
    "src/app/main.py",
    "ValueError:",
    "retry",
    "user_id_42",
    "because",
    "never",
    "deploy",
    "eu-west-3",
    "test_roundtrip",
    "ok",
    "with",
    "flight",
    "HAT170",
    "$ pytest -x",
    "I",
    "prefer",
    "morning",
    "flights",
    "value",
    "=",
    "42;",
    "{",
    "}",
];

fn text(seed: usize, words: usize) -> String {
    let mut s = format!("m{seed}:");
    for i in 0..words {
        s.push(' ');
        s.push_str(VOCAB[(seed * 7 + i * 13 + i / 5) % VOCAB.len()]);
        if i % 17 == 16 {
            s.push('\n');
        }
    }
    s
}

#[derive(Debug, Clone)]
enum UserSpec {
    Plain(usize),
    Parts(usize, bool),
    Paste(usize),
}

#[derive(Debug, Clone)]
struct Round {
    calls: usize,
    results: Vec<usize>,
    legacy: bool,
}

#[derive(Debug, Clone)]
struct Turn {
    developer: bool,
    user: UserSpec,
    rounds: Vec<Round>,
    text_mode: bool,
    reply: Option<usize>,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 1usize..50, 1 => 300usize..1500]
}

fn user_spec() -> impl Strategy<Value = UserSpec> {
    prop_oneof![
        5 => (1usize..60).prop_map(UserSpec::Plain),
        2 => ((1usize..60), any::<bool>()).prop_map(|(n, img)| UserSpec::Parts(n, img)),
        1 => (400usize..1500).prop_map(UserSpec::Paste),
    ]
}

fn round() -> impl Strategy<Value = Round> {
    (1usize..4, prop::collection::vec(size(), 3), prop::bool::weighted(0.1))
        .prop_map(|(calls, results, legacy)| Round { calls, results, legacy })
}

fn turn() -> impl Strategy<Value = Turn> {
    (
        prop::bool::weighted(0.1),
        user_spec(),
        prop_oneof![3 => prop::collection::vec(round(), 0..3), 1 => prop::collection::vec(round(), 5..10)],
        prop::bool::weighted(0.2),
        prop::option::of(1usize..40),
    )
        .prop_map(|(developer, user, rounds, text_mode, reply)| Turn { developer, user, rounds, text_mode, reply })
}

fn build(system: bool, turns: &[Turn]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut seed = 0;
    let mut next = || {
        seed += 1;
        seed
    };
    if system {
        out.push(
            json!({"role": "system", "content": "You are a careful agent. Never delete data."}),
        );
    }
    for t in turns {
        if t.developer {
            out.push(json!({"role": "developer", "content": text(next(), 8)}));
        }
        let user = match &t.user {
            UserSpec::Plain(n) => json!({"role": "user", "content": text(next(), *n)}),
            UserSpec::Paste(n) => {
                json!({"role": "user", "content": text(next(), *n), "x_client": 1})
            }
            UserSpec::Parts(n, img) => {
                let mut parts = vec![
                    json!({"type": "text", "text": text(next(), *n), "cache_control": {"type": "ephemeral"}}),
                ];
                if *img {
                    parts.push(json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}));
                }
                json!({"role": "user", "content": parts})
            }
        };
        out.push(user);
        for (r, round) in t.rounds.iter().enumerate() {
            if round.legacy {
                out.push(json!({"role": "assistant", "content": null,
                    "function_call": {"name": "lookup", "arguments": format!("{{\"q\":\"{}\"}}", next())}}));
                out.push(json!({"role": "function", "name": "lookup", "content": text(next(), round.results[0])}));
                continue;
            }
            // Ids repeat across rounds and turns, as real agents do.
            let ids: Vec<String> =
                (0..round.calls).map(|j| format!("call_{}_{j}", r % 2)).collect();
            let calls: Vec<Value> = ids
                .iter()
                .map(|id| json!({"id": id, "type": "function", "function": {"name": "run", "arguments": format!("{{\"command\":\"ls {}\"}}", next())}, "x_vendor": true}))
                .collect();
            out.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for (j, id) in ids.iter().enumerate() {
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text(next(), round.results[j % 3])}));
            }
        }
        if t.text_mode {
            out.push(json!({"role": "assistant", "content": format!("Checking.\n```bash\ncat f{}.py\n```", next())}));
            out.push(json!({"role": "user", "content": text(next(), 30)}));
        }
        if let Some(n) = t.reply {
            out.push(json!({"role": "assistant", "content": text(next(), n)}));
        }
    }
    out
}

fn cfg() -> CompactionConfig {
    CompactionConfig {
        user_verbatim_max_tokens: 120,
        elide_min_tokens: 150,
        digest_max_tokens: 250,
        trail_max_tokens: 60,
        default_reserve_tokens: 400,
        keep_last_tool_groups: 2,
        ..CompactionConfig::default()
    }
}

fn request(msgs: &[Value], upto: usize) -> ChatRequest {
    let fields = json!({"model": "gpt-4o", "temperature": 0.2, "stream": true});
    let messages =
        msgs[..upto].iter().map(|m| Arc::new(Message::from_value(m.clone()).unwrap())).collect();
    ChatRequest::from_parts(fields.as_object().unwrap(), messages).unwrap()
}

/// Cut points: every assistant message (the history before a reply), else the end.
fn cuts(msgs: &[Value]) -> Vec<usize> {
    let mut c: Vec<usize> = (1..msgs.len()).filter(|&i| msgs[i]["role"] == "assistant").collect();
    c.push(msgs.len());
    c
}

fn run(engine: &Engine, req: &ChatRequest, state: &mut SessionState, opts: &Options) -> Forward {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(engine.compact_request(req, state, &ExtractiveSummarizer, opts)).unwrap()
}

fn forwarded(out: &Forward, original: &ChatRequest) -> ChatRequest {
    match out {
        Forward::Unchanged { .. } => original.clone(),
        Forward::Compacted { request, body, .. } => {
            assert_eq!(&request.to_vec(), body);
            ChatRequest::parse(body).unwrap()
        }
    }
}

fn conversation() -> impl Strategy<Value = (bool, Vec<Turn>)> {
    (prop::bool::weighted(0.8), prop::collection::vec(turn(), 1..8))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Guarantees (1)-(5) and (6) on every request of a replayed conversation, with
    /// blocks carried from request to request.
    #[test]
    fn guarantees_hold_across_a_session((system, turns) in conversation(), window in 1500usize..12000) {
        let msgs = build(system, &turns);
        let engine = Engine::new(cfg());
        let opts = Options { window_cap: Some(window), ..Options::default() };
        let mut state = SessionState::default();
        for upto in cuts(&msgs) {
            let req = request(&msgs, upto);
            let had_blocks = !state.blocks.is_empty();
            let out = run(&engine, &req, &mut state, &opts);
            let report = out.report().clone();
            let fwd = forwarded(&out, &req);
            let violations = verify(&req, &fwd, engine.config(), &report.budget, &mut state.token_cache);
            if !violations.is_empty() {
                let shape: Vec<String> = fwd
                    .messages()
                    .iter()
                    .map(|m| format!("{:?}:{}B", m.role(), m.raw().len()))
                    .collect();
                prop_assert!(false, "request {upto}: {violations:?}\n{report:?}\n{shape:?}");
            }
            // (6) below the trigger, without stored blocks, nothing changes.
            let exact = engine.count_prompt(&req, &report.budget, &mut state.token_cache);
            if exact <= report.budget.trigger && !had_blocks {
                prop_assert!(matches!(out, Forward::Unchanged { .. }), "request {upto} changed below the trigger");
            }
            if let Forward::Compacted { body, .. } = &out {
                // Unknown fields survive: request level, message level, parts, calls.
                let v: Value = serde_json::from_slice(body).unwrap();
                prop_assert_eq!(&v["temperature"], &json!(0.2));
                let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
                prop_assert_eq!(keys, vec!["model", "temperature", "stream", "messages"]);
            }
        }
    }

    /// (7) Same input and same blocks give the same output, byte for byte.
    #[test]
    fn deterministic((system, turns) in conversation(), window in 1500usize..8000, at in any::<Index>()) {
        let msgs = build(system, &turns);
        let c = cuts(&msgs);
        let upto = c[at.index(c.len())];
        let engine = Engine::new(cfg());
        let opts = Options { window_cap: Some(window), ..Options::default() };
        let mut warm = SessionState::default();
        let first = c[0];
        run(&engine, &request(&msgs, first), &mut warm, &opts);
        let req = request(&msgs, upto);
        let mut a = warm.clone();
        let mut b = warm.clone();
        b.token_cache = Default::default();
        let body = |o: &Forward| match o {
            Forward::Unchanged { .. } => None,
            Forward::Compacted { body, .. } => Some(body.clone()),
        };
        let oa = run(&engine, &req, &mut a, &opts);
        let ob = run(&engine, &req, &mut b, &opts);
        prop_assert_eq!(body(&oa), body(&ob));
        prop_assert_eq!(a.blocks, b.blocks);
    }

    /// (8) A later request reuses the stored blocks: its forwarded prefix is the earlier
    /// request's forwarded prefix, byte for byte; a block that absorbs the stored ones
    /// rewrites it only from their first digest on.
    #[test]
    fn stored_blocks_reproduce_the_prefix((system, turns) in conversation(), window in 1500usize..8000) {
        let msgs = build(system, &turns);
        let engine = Engine::new(cfg());
        let opts = Options { window_cap: Some(window), ..Options::default() };
        let mut state = SessionState::default();
        let mut previous: Option<(Vec<String>, usize, u8)> = None;
        for upto in cuts(&msgs) {
            let req = request(&msgs, upto);
            let out = run(&engine, &req, &mut state, &opts);
            let tier = out.report().tier.number();
            let fwd: Vec<String> = forwarded(&out, &req).messages().iter().map(|m| m.raw().to_owned()).collect();
            if let Some((prev, prefix_len, prev_tier)) = &previous {
                if *prev_tier != 4 && tier != 4 && out.report().blocks_invalidated == 0 {
                    let kept = if out.report().blocks_absorbed > 0 {
                        prev[..*prefix_len].iter().position(|m| m.contains(DIGEST_MARKER)).unwrap_or(*prefix_len)
                    } else {
                        *prefix_len
                    };
                    prop_assert!(fwd.len() >= kept);
                    prop_assert_eq!(&fwd[..kept], &prev[..kept]);
                }
            }
            let prefix_len: usize = state.blocks.iter().map(|b| b.messages.len()).sum();
            previous = Some((fwd, prefix_len, tier));
        }
    }
}

#[test]
fn below_trigger_returns_unchanged() {
    let msgs = build(
        true,
        &[Turn {
            developer: false,
            user: UserSpec::Plain(5),
            rounds: vec![],
            text_mode: false,
            reply: None,
        }],
    );
    let req = request(&msgs, msgs.len());
    let out = run(&Engine::new(cfg()), &req, &mut SessionState::default(), &Options::default());
    assert!(matches!(out, Forward::Unchanged { .. }));
}

/// Settings a deployment may choose, generated.
fn settings() -> impl Strategy<Value = CompactionConfig> {
    (40usize..300, 50usize..500, 0usize..4, 0usize..4, 150usize..700, 0.1f64..0.5).prop_map(
        |(small, elide, turns, groups, digest, floor)| CompactionConfig {
            user_verbatim_max_tokens: small,
            elide_min_tokens: elide,
            keep_last_turns: turns,
            keep_last_tool_groups: groups,
            digest_max_tokens: digest,
            trail_max_tokens: digest / 4,
            floor_max_ratio: floor,
            default_reserve_tokens: 400,
            ..CompactionConfig::default()
        },
    )
}

/// A conversation that already holds digests of earlier folds (a client that compacted
/// before, or foldgate's own digest sent back), at the head and between turns.
fn with_digests(msgs: Vec<Value>, every: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len() + 4);
    for (i, m) in msgs.into_iter().enumerate() {
        if m["role"] == "user" && i % every == 1 {
            out.push(json!({"role": "assistant", "content": format!("{DIGEST_MARKER}\n## Milestones\n- {}", text(i, 40))}));
        }
        out.push(m);
    }
    out
}

/// Anthropic Messages from a generated conversation: tool calls as `tool_use` blocks after
/// a signed `thinking` block (a `redacted_thinking` one every third call), results as
/// `tool_result` blocks, images as base64 blocks; consecutive messages of one role merged.
fn as_messages(msgs: &[Value]) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut system = None;
    let push = |out: &mut Vec<Value>, role: &str, blocks: Vec<Value>| match out.last_mut() {
        Some(last) if last["role"] == role => {
            last["content"].as_array_mut().unwrap().extend(blocks);
        }
        _ => out.push(json!({"role": role, "content": blocks})),
    };
    for (i, m) in msgs.iter().enumerate() {
        let text_of = |v: &Value| match v {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(" ")
            }
            _ => String::new(),
        };
        match m["role"].as_str().unwrap() {
            "system" if system.is_none() => system = Some(text_of(&m["content"])),
            "system" | "developer" | "user" => {
                let mut blocks = vec![json!({"type": "text", "text": text_of(&m["content"])})];
                if m["content"].to_string().contains("image_url") {
                    blocks.push(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}));
                }
                push(&mut out, "user", blocks);
            }
            "assistant" => {
                let mut blocks = Vec::new();
                let calls: Vec<(String, String)> = match (&m["tool_calls"], &m["function_call"]) {
                    (Value::Array(calls), _) => calls
                        .iter()
                        .map(|c| {
                            (
                                c["id"].as_str().unwrap().to_owned(),
                                c["function"]["name"].as_str().unwrap().to_owned(),
                            )
                        })
                        .collect(),
                    (_, Value::Object(f)) => {
                        vec![(format!("fn_{i}"), f["name"].as_str().unwrap().to_owned())]
                    }
                    _ => Vec::new(),
                };
                if !calls.is_empty() {
                    blocks.push(match i % 3 {
                        0 => json!({"type": "redacted_thinking", "data": format!("EmwKAhgB{i}")}),
                        _ => json!({"type": "thinking", "thinking": format!("Step {i}."), "signature": format!("EqQBCkYIBxgCKkB{i}")}),
                    });
                }
                let text = text_of(&m["content"]);
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for (id, name) in calls {
                    blocks.push(
                        json!({"type": "tool_use", "id": id, "name": name, "input": {"n": i}}),
                    );
                }
                push(&mut out, "assistant", blocks);
            }
            _ => {
                let id = m["tool_call_id"].as_str().map_or(format!("fn_{}", i - 1), str::to_owned);
                let block = json!({"type": "tool_result", "tool_use_id": id, "content": text_of(&m["content"])});
                push(&mut out, "user", vec![block]);
            }
        }
    }
    let mut body = json!({"model": "claude-sonnet-4-5", "max_tokens": 512, "messages": out});
    if let Some(system) = system {
        body["system"] = json!(system);
    }
    body
}

/// The Responses API from a generated conversation: calls as `function_call` items after
/// a `reasoning` item with encrypted content, results as `function_call_output` items.
fn as_responses(msgs: &[Value]) -> Value {
    let mut items = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let content = &m["content"];
        let text = match content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(" ")
            }
            _ => String::new(),
        };
        match m["role"].as_str().unwrap() {
            "assistant" => {
                let calls: Vec<(String, String)> = match (&m["tool_calls"], &m["function_call"]) {
                    (Value::Array(calls), _) => calls
                        .iter()
                        .map(|c| (c["id"].as_str().unwrap().to_owned(), c["function"]["name"].as_str().unwrap().to_owned()))
                        .collect(),
                    (_, Value::Object(f)) => vec![(format!("fn_{i}"), f["name"].as_str().unwrap().to_owned())],
                    _ => Vec::new(),
                };
                if !calls.is_empty() {
                    items.push(json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [], "encrypted_content": format!("gAAAAB{i}")}));
                }
                if !text.is_empty() {
                    items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
                }
                for (id, name) in calls {
                    items.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": "{}"}));
                }
            }
            "tool" | "function" => {
                let id = m["tool_call_id"].as_str().map_or(format!("fn_{}", i - 1), str::to_owned);
                items.push(json!({"type": "function_call_output", "call_id": id, "output": text}));
            }
            role => items.push(json!({"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]})),
        }
    }
    json!({"model": "gpt-4.1", "input": items, "store": false})
}

/// The blocks or items of `kinds` anywhere in a body's list `list` (their JSON values).
fn opaque(body: &Value, list: &str, kinds: &[&str]) -> Vec<Value> {
    let mut found = Vec::new();
    for entry in body[list].as_array().into_iter().flatten() {
        let inner = entry["content"].as_array().cloned().unwrap_or_default();
        for v in std::iter::once(entry).chain(inner.iter()) {
            if v["type"].as_str().is_some_and(|t| kinds.contains(&t)) {
                found.push(v.clone());
            }
        }
    }
    found
}

/// Runs `body` through `dialect` and the engine at `window`; the body to forward.
fn through<D: foldgate::http::dialect::Dialect>(
    dialect: &D,
    body: &Value,
    engine: &Engine,
    state: &mut SessionState,
    window: usize,
) -> Value {
    let bytes = bytes::Bytes::from(body.to_string());
    let (request, origins) = dialect.parse(&bytes).expect("the dialect reads the generated body");
    let opts = Options { window_cap: Some(window), ..Options::default() };
    match run(engine, &request, state, &opts) {
        Forward::Unchanged { .. } => body.clone(),
        Forward::Compacted { request, body: neutral, .. } => {
            let rewritten = foldgate::conversation::Rewritten {
                body: neutral.into(),
                request: Arc::new(request),
            };
            serde_json::from_slice(&dialect.render(&bytes, &origins, &rewritten)).unwrap()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Guarantees (1)-(5) hold at generated settings too, with digests of earlier folds
    /// in the history; the same input gives the same output.
    #[test]
    fn guarantees_hold_at_any_settings(
        (system, turns) in conversation(),
        window in 1500usize..12000,
        config in settings(),
        every in 2usize..6,
    ) {
        let msgs = with_digests(build(system, &turns), every);
        let engine = Engine::new(config);
        let opts = Options { window_cap: Some(window), ..Options::default() };
        let mut state = SessionState::default();
        for upto in cuts(&msgs) {
            let req = request(&msgs, upto);
            let before = state.clone();
            let out = run(&engine, &req, &mut state, &opts);
            let report = out.report().clone();
            let fwd = forwarded(&out, &req);
            let violations = verify(&req, &fwd, engine.config(), &report.budget, &mut state.token_cache);
            prop_assert!(violations.is_empty(), "request {upto}: {violations:?}\n{report:?}");
            let mut again = before;
            let repeat = run(&engine, &req, &mut again, &opts);
            prop_assert_eq!(forwarded(&repeat, &req).to_vec(), fwd.to_vec(), "request {}: not deterministic", upto);
        }
    }

    /// What foldgate cannot read is kept whole through the Messages and Responses
    /// dialects: every signed or redacted thinking block and every encrypted reasoning
    /// item forwarded is one the client sent, unchanged, and calls stay answered.
    #[test]
    fn unreadable_content_is_kept_whole((system, turns) in conversation(), window in 1500usize..8000) {
        let msgs = build(system, &turns);
        let engine = Engine::new(cfg());
        let (mut anthropic, mut openai) = (SessionState::default(), SessionState::default());
        for upto in cuts(&msgs) {
            let sent = as_messages(&msgs[..upto]);
            if sent["messages"].as_array().is_none_or(Vec::is_empty) {
                continue;
            }
            let out = through(&foldgate::http::dialect::Messages, &sent, &engine, &mut anthropic, window);
            let kinds = ["thinking", "redacted_thinking"];
            let original = opaque(&sent, "messages", &kinds);
            for block in opaque(&out, "messages", &kinds) {
                prop_assert!(original.contains(&block), "request {upto}: {block} was not sent");
            }
            let messages = out["messages"].as_array().unwrap();
            for (i, m) in messages.iter().enumerate() {
                let ids = |m: &Value, kind: &str, key: &str| -> Vec<Value> {
                    m["content"].as_array().into_iter().flatten().filter(|b| b["type"] == kind).map(|b| b[key].clone()).collect()
                };
                for id in ids(m, "tool_result", "tool_use_id") {
                    prop_assert!(i > 0 && ids(&messages[i - 1], "tool_use", "id").contains(&id), "request {upto}: {id} unanswered");
                }
            }

            let sent = as_responses(&msgs[..upto]);
            let out = through(&foldgate::http::dialect::Responses, &sent, &engine, &mut openai, window);
            let original = opaque(&sent, "input", &["reasoning"]);
            let forwarded = opaque(&out, "input", &["reasoning"]);
            for item in &forwarded {
                prop_assert!(original.contains(item), "request {upto}: {item} was not sent");
            }
            let items = out["input"].as_array().unwrap();
            for (i, item) in items.iter().enumerate().filter(|(_, it)| it["type"] == "function_call_output") {
                let called = items[..i].iter().rev().take_while(|it| it["type"] != "message").any(|it| it["type"] == "function_call" && it["call_id"] == item["call_id"]);
                prop_assert!(called, "request {upto}: output {} without its call", item["call_id"]);
            }
        }
    }
}
