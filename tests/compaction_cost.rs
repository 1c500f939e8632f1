#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]
//! What long sessions cost with foldgate, priced the way providers bill (cached prefix
//! x0.1): the dev traces replayed at 16k and 32k windows with `max_tokens` 1000 and the
//! model summarizer (real HTTP to a mock that answers digests of about 900 tokens) must
//! cost at most 0.75x (16k) and 0.9x (32k) sending every conversation whole, no family
//! more than sending it whole, without a violation, keeping every
//! small user message of the tau sessions verbatim, and with few mini-swe-agent requests
//! left to the fallback; the longest sessions sent through the proxy itself (background
//! folds) at most 0.88x; thirty large outputs in one turn with few summarizer calls;
//! text-mode tool output is recognised as such on every trace family.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::priced::{Pace, dev_traces, longest_sessions, send_priced};
use common::{MockUpstream, Proxy, Recorded, response};
use foldgate::commands::replay::{self, ReplayOptions, ReplayStats, replay_file};
use foldgate::compaction::{Engine, Options};
use foldgate::config::SummarizerKind;
use foldgate::model::{Message, Role, is_observation};
use foldgate::summarizer::Summarizer;
use foldgate::summarizer::llm::LlmSummarizer;
use serde_json::{Value, json};

fn traces() -> PathBuf {
    dev_traces()
}

const SENTENCE: &str =
    "I edited the parser module and ran the unit tests again, which passed after the fix. ";

/// A summarizer endpoint: a digest of about three quarters of `max_tokens`, and a
/// record of what each call sent.
fn digests(calls: Arc<AtomicUsize>, shared: Arc<AtomicUsize>) -> common::Handler {
    Arc::new(move |rec: Recorded| {
        let (calls, shared) = (calls.clone(), shared.clone());
        Box::pin(async move {
            let body: Value = serde_json::from_slice(&rec.body).unwrap();
            calls.fetch_add(1, Ordering::SeqCst);
            assert!(!body["model"].as_str().unwrap_or("").is_empty(), "the conversation's model");
            let messages = body["messages"].as_array().unwrap();
            let last = messages.last().unwrap()["content"].as_str().unwrap_or("");
            if last.starts_with("Pause the task") {
                shared.fetch_add(1, Ordering::SeqCst);
                if body.get("tools").is_some() {
                    assert_eq!(body["tool_choice"], "none", "a digest, never a tool call");
                }
            }
            let chars = body["max_tokens"].as_u64().unwrap_or(1000) as usize * 3;
            let text: String = SENTENCE.chars().cycle().take(chars).collect();
            let answer = json!({"choices": [{"index": 0, "message": {"role": "assistant",
                "content": format!("## Milestones\n{text}")}}]});
            response(200, answer.to_string())
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_traces_cost_less_than_no_compaction_at_16k_and_32k() {
    let (calls, shared) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mock = MockUpstream::start(digests(calls.clone(), shared.clone())).await;
    let mut config = common::config_for(&mock.url());
    config.summarizer.kind = SummarizerKind::Llm;
    let llm = LlmSummarizer::new(&config.summarizer, &config.upstream).unwrap();
    let summarizer = |model: &str| -> Box<dyn Summarizer> { Box::new(llm.bind(None, model)) };
    for window in [16_000, 32_000] {
        let engine = Engine::new(config.compaction.clone());
        let opts = ReplayOptions {
            engine: Options { window_cap: Some(window), ..Options::default() },
            max_tokens: Some(1000),
        };
        let (convs, total) = replay_file(&traces(), &engine, &summarizer, &opts).await.unwrap();
        let (cost, whole) = (total.cost(0.1), total.cost_whole(0.1));
        println!("{window}: {}", replay::cost_line(&total, 0.1));
        println!("{}", replay::family_table(&convs, &total, 0.1));
        assert_eq!(convs.len(), 184);
        assert_eq!(total.violation_count(), 0, "first: {:?}", total.first_violation);
        // The late user constraints of the tau sessions are kept: every small message of
        // the user's own words of every request is in its forwarded request, verbatim.
        let families = ReplayStats::by_family(&convs);
        for family in ["tau-bench", "tau2-bench"] {
            let stats = &families[family];
            assert!(stats.requests > 500, "{window}: {family} replayed: {stats:?}");
            assert_eq!(
                stats.user_words_lost,
                0,
                "{window}: {family}: {} small user messages lost in {} requests; first: {:?}",
                stats.user_words_lost,
                stats.requests_losing_user_words,
                stats.first_user_words_lost
            );
        }
        // Its command outputs folded like tool results, mini-swe-agent (text mode) is
        // compacted by folds: cuts alone (stubs, tier 1, or drops, tier 4) serve few of
        // its compacted requests.
        let mini = &families["mini-swe-agent"];
        let fallback =
            [1, 4].iter().map(|t| mini.tiers.get(t).copied().unwrap_or(0)).sum::<usize>();
        assert!(mini.compacted > 300, "{window}: mini-swe-agent compacted: {mini:?}");
        assert!(
            fallback * 4 <= mini.compacted,
            "{window}: cuts alone served {fallback} of mini-swe-agent's {} compacted requests",
            mini.compacted
        );
        // Priced plans: at most 0.75x (16k) and 0.9x (32k) of sending everything, and no
        // family costing more than that.
        let most = if window == 16_000 { 0.75 } else { 0.9 };
        assert!(
            cost <= most * whole,
            "{window}: {cost:.0} against {whole:.0} ({:.3}x)",
            cost / whole
        );
        for (family, stats) in &families {
            let (cost, whole) = (stats.cost(0.1), stats.cost_whole(0.1));
            assert!(cost <= whole, "{window}: {family} {cost:.0} against {whole:.0}");
        }
        assert!(total.summarizer_calls > 0, "{window}: digests were written by the model");
        assert!(
            total.summarizer.cached * 2 > total.summarizer.tokens(),
            "{window}: the summarizer shares the cached prefix: {:?}",
            total.summarizer
        );
        assert!(total.prefix_repeats * 100 > total.requests * 85, "{window}: {total:?}");
    }
    let (calls, shared) = (calls.load(Ordering::SeqCst), shared.load(Ordering::SeqCst));
    assert!(shared * 10 >= calls * 9, "{shared} of {calls} calls shared the prefix");
}

/// Every user message of the text-mode families that answers a command is recognised
/// as tool output; no user message of the tool-calling families is.
#[test]
fn text_mode_tool_output_is_recognised_per_family() {
    let text = std::fs::read_to_string(traces()).unwrap();
    let mut seen = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let family = record["meta"]["family"].as_str().unwrap().to_owned();
        let msgs: Vec<Arc<Message>> = record["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Arc::new(Message::from_value(m.clone()).unwrap()))
            .collect();
        let entry = seen.entry(family.clone()).or_default();
        for i in 0..msgs.len() {
            if msgs[i].role() != Role::User {
                continue;
            }
            let observation = is_observation(&msgs, i);
            let answers_text_command =
                i > 0 && msgs[i - 1].role() == Role::Assistant && !msgs[i - 1].makes_calls();
            entry.0 += usize::from(answers_text_command);
            entry.1 += usize::from(observation);
            match family.as_str() {
                "tau-bench" | "tau2-bench" | "openhands" => {
                    assert!(!observation, "{family} user message {i} is the user's words")
                }
                _ => {}
            }
        }
    }
    println!("{seen:?}");
    // mini-swe-agent: every message after a text command is its output.
    let (answers, observations) = seen["mini-swe-agent"];
    assert_eq!(observations, answers, "mini-swe-agent");
    // SWE-agent: the text-mode runs end their observations with the shell prompt.
    assert!(seen["swe-agent"].1 * 10 >= seen["swe-agent"].0 * 9, "{:?}", seen["swe-agent"]);
}

/// The chat answer of the mock provider.
const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}"#;

/// A provider answering `ANSWER` and ~900-token digests, and a proxy in front of it with
/// the model summarizer and a `window`; the count of summarizer calls.
async fn model_summarized_proxy(
    window: usize,
) -> (Arc<AtomicUsize>, MockUpstream, foldgate::config::Config, Proxy) {
    let (calls, shared) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let summaries = digests(calls.clone(), shared);
    let mock = MockUpstream::start(Arc::new(move |rec: Recorded| {
        if rec.headers.contains_key("x-foldgate-summary") {
            return summaries(rec);
        }
        Box::pin(async move { response(200, ANSWER) })
    }))
    .await;
    let mut config = common::config_for(&mock.url());
    config.summarizer.kind = SummarizerKind::Llm;
    config.compaction.max_context_tokens = Some(window);
    let proxy = Proxy::start(config.clone()).await;
    (calls, mock, config, proxy)
}

/// The longest sessions of the families that outgrow a 16k window, sent through the
/// proxy as their agents sent them (the model summarizer folds in the background while
/// a request still fits), priced like `replay`: the forwarded requests and the
/// summarizer calls cost at most 0.88x sending every request whole, and no forwarded
/// request breaks a guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_dev_sessions_cost_less_through_the_proxy() {
    let (calls, mock, config, proxy) = model_summarized_proxy(16_000).await;

    let sample = longest_sessions(&["mini-swe-agent", "openhands"], 2);
    // The agent's model takes its time to answer: background folds land.
    let pace = Pace { between: Duration::from_millis(20), after: Duration::from_millis(300) };
    let priced = send_priced(&[&proxy], &mock, &sample, "Bearer sk-cost", pace, &config).await;
    let (cost, whole) = (priced.cost(0.1), priced.cost_whole(0.1));
    let (requests, compacted) = (priced.requests, priced.compacted);
    println!(
        "through the proxy, {} sessions, {requests} requests ({compacted} compacted), {} \
         summarizer calls: {cost:.0} against {whole:.0} sent whole ({:.3}x)",
        sample.len(),
        calls.load(Ordering::SeqCst),
        cost / whole
    );
    let failures = &priced.violations;
    assert!(failures.is_empty(), "{} violations:\n{}", failures.len(), failures.join("\n"));
    assert!(compacted * 2 > requests, "most requests were compacted: {compacted} of {requests}");
    assert!(calls.load(Ordering::SeqCst) > 0, "digests were written by the model");
    assert!(cost <= 0.88 * whole, "{cost:.0} against {whole:.0} ({:.3}x)", cost / whole);
}

/// One long turn of an agent reading 30 large files (about 6k tokens of output each),
/// as a recorded conversation: a request per assistant reply.
fn thirty_large_outputs() -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Use the tools."}),
        json!({"role": "user", "content": "Audit every module of the service for unsafe SQL."}),
    ];
    for i in 0..30 {
        let id = format!("call_{i}");
        let path = format!("src/service/module_{i}.py");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "read_file",
            "arguments": json!({"path": path}).to_string()}}]}));
        let output: String = (0..170)
            .map(|line| {
                format!(
                    "{path}:{line}: row_{line} = cursor.execute(query_{i}_{line}, (user_{}, \
                     limit_{})) # checked {}\n",
                    (line * 7 + i) % 97,
                    (line * 13 + i) % 89,
                    (line * 31 + i * 17) % 1009
                )
            })
            .collect();
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    messages.push(json!({"role": "assistant", "content": "I found two unsafe queries."}));
    json!({"id": "thirty-large-outputs", "model": "gpt-4o", "messages": messages})
}

/// What [`thirty_large_outputs_in_one_turn_make_few_summarizer_calls`]'s run cost before
/// plans were priced (at `bb1232c`: 23 summarizer calls, 23 prefix rewrites), in
/// token-equivalents.
const THIRTY_OUTPUTS_UNPRICED: f64 = 1_424_470.0;

/// Thirty large tool outputs in one turn, a 48k window, through the proxy with the model
/// summarizer: stubbing older outputs serves most requests that cross the trigger, so at
/// most one request in three makes a summarizer call, every guarantee holds, and the run
/// costs less than it did before plans were priced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_large_outputs_in_one_turn_make_few_summarizer_calls() {
    let (_, mock, config, proxy) = model_summarized_proxy(48_000).await;
    let pace = Pace { between: Duration::from_millis(20), after: Duration::from_millis(300) };
    let session = [thirty_large_outputs()];
    let priced = send_priced(&[&proxy], &mock, &session, "Bearer sk-large", pace, &config).await;
    let (cost, whole) = (priced.cost(0.1), priced.cost_whole(0.1));
    println!(
        "30 large outputs: {} requests ({} compacted), {} summarizer calls, {} rewrites: \
         {cost:.0} against {whole:.0} sent whole ({:.3}x)",
        priced.requests,
        priced.compacted,
        priced.summarizer_calls,
        priced.rewrites,
        cost / whole
    );
    let failures = &priced.violations;
    assert!(failures.is_empty(), "{} violations:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(priced.requests, 31);
    assert!(priced.compacted > 0, "the turn outgrew the window");
    assert!(
        priced.summarizer_calls * 3 <= priced.requests,
        "{} summarizer calls for {} requests",
        priced.summarizer_calls,
        priced.requests
    );
    assert!(cost < THIRTY_OUTPUTS_UNPRICED, "{cost:.0} against {THIRTY_OUTPUTS_UNPRICED:.0}");
}
