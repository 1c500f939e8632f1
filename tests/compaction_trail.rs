#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]
//! The work trail on the recorded traces (`../shared/traces/dev.jsonl`, every agent
//! family): replayed at 16k and 32k windows, every compacted request still names at
//! least 98 % of the file paths the agent named in its messages (tool-call arguments and
//! text), and no trail entry of a digest names a file, command or test that no action of
//! the session produced. The same holds with the conversations sent as Responses and as
//! Anthropic Messages request bodies, read through those dialects.

use std::io::Write;
use std::path::{Path, PathBuf};

use foldgate::api::Api;
use foldgate::commands::replay::{ReplayOptions, ReplayStats, replay_file_as};
use foldgate::compaction::{Engine, Options};
use foldgate::config::CompactionConfig;
use foldgate::model::content_text;
use foldgate::summarizer::{ExtractiveSummarizer, Summarizer};
use serde_json::{Map, Value, json};

fn traces() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dev.jsonl");
    assert!(path.exists(), "{} is missing: clone shared/ beside the repository", path.display());
    path
}

/// The text of a chat `content` (a string or text parts).
fn text_of(content: &Value) -> String {
    content_text(Some(content)).into_owned()
}

/// A chat record as a Responses request body: messages as `message` items, calls as
/// `function_call` items, results as `function_call_output` items.
fn as_responses(record: &Value) -> Value {
    let mut input = Vec::new();
    for m in record["messages"].as_array().unwrap() {
        let role = m["role"].as_str().unwrap();
        let text = text_of(&m["content"]);
        match role {
            "tool" => input.push(json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": text})),
            "assistant" => {
                if !text.is_empty() {
                    input.push(json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    input.push(json!({"type": "function_call", "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"]}));
                }
            }
            _ => input.push(json!({"type": "message", "role": role, "content": text})),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), record["model"].clone());
    body.insert("input".into(), Value::Array(input));
    if let Some(tools) = record["tools"].as_array() {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t["function"]["name"],
                    "parameters": t["function"]["parameters"]})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    Value::Object(body)
}

/// A chat record as an Anthropic Messages request body: system messages as `system`,
/// calls as `tool_use` blocks, results as `tool_result` blocks of a user message.
fn as_messages(record: &Value) -> Value {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    let push = |role: &str, blocks: Vec<Value>, messages: &mut Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match messages.last_mut() {
            Some(last) if last["role"] == role => {
                last["content"].as_array_mut().unwrap().extend(blocks);
            }
            _ => messages.push(json!({"role": role, "content": blocks})),
        }
    };
    for m in record["messages"].as_array().unwrap() {
        let role = m["role"].as_str().unwrap();
        let text = text_of(&m["content"]);
        match role {
            "system" => system.push(text),
            "tool" => push(
                "user",
                vec![json!({"type": "tool_result", "tool_use_id": m["tool_call_id"],
                    "content": text})],
                &mut messages,
            ),
            "assistant" => {
                let mut blocks = Vec::new();
                if !text.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let args = call["function"]["arguments"].as_str().unwrap_or("{}");
                    let input = serde_json::from_str::<Value>(args)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({"input": args}));
                    blocks.push(json!({"type": "tool_use", "id": call["id"],
                        "name": call["function"]["name"], "input": input}));
                }
                if blocks.is_empty() {
                    blocks.push(json!({"type": "text", "text": "(no text)"}));
                }
                push("assistant", blocks, &mut messages);
            }
            _ => push("user", vec![json!({"type": "text", "text": text})], &mut messages),
        }
    }
    json!({"model": "claude-sonnet-4-5", "system": system.join("\n\n"), "messages": messages,
        "max_tokens": 1000})
}

/// The dev traces rewritten as request bodies of `api`, in a file of the test's
/// temporary directory.
fn converted(api: Api) -> PathBuf {
    let text = std::fs::read_to_string(traces()).unwrap();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("trail-{api:?}.jsonl"));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let mut body = match api {
            Api::Responses => as_responses(&record),
            Api::Messages => as_messages(&record),
            Api::Chat => record.clone(),
        };
        body["id"] = record["id"].clone();
        body["meta"] = json!({"family": record["meta"]["family"]});
        writeln!(file, "{body}").unwrap();
    }
    file.flush().unwrap();
    path
}

async fn replay(api: Api, path: &Path, window: usize) -> (Vec<ReplayStats>, ReplayStats) {
    let engine = Engine::new(CompactionConfig::default());
    let opts = ReplayOptions {
        engine: Options { window_cap: Some(window), ..Options::default() },
        max_tokens: None,
    };
    let summarizer = |_: &str| -> Box<dyn Summarizer> { Box::new(ExtractiveSummarizer) };
    replay_file_as(api, path, &engine, &summarizer, &opts).await.unwrap()
}

fn check(what: &str, window: usize, convs: &[ReplayStats], total: &ReplayStats) {
    println!(
        "{what} at {window}: {:.2}% of {} paths kept, {} foreign trail entries, {} compacted \
         requests",
        total.path_recall() * 100.0,
        total.paths_named,
        total.trail_foreign,
        total.compacted
    );
    for (family, s) in ReplayStats::by_family(convs) {
        println!("  {family}: {:.2}% of {} paths", s.path_recall() * 100.0, s.paths_named);
    }
    assert_eq!(convs.len(), 184);
    assert!(total.compacted > 1000, "{what} {window}: {total:?}");
    assert!(total.paths_named > 10_000, "{what} {window}: {}", total.paths_named);
    // The cut drops a live turn's old work before its digests, which hold the trail of
    // the work they folded: 98.9 % kept at 16k, 99.7 % at 32k.
    assert!(
        total.path_recall() >= 0.985,
        "{what} {window}: {:.4} of the agent's paths kept; first lost: {:?}",
        total.path_recall(),
        total.first_path_lost
    );
    assert_eq!(total.trail_foreign, 0, "{what} {window}: first: {:?}", total.first_trail_foreign);
    assert_eq!(total.violation_count(), 0, "{what} {window}: {:?}", total.first_violation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fold_keeps_the_paths_the_agent_named_in_chat_completions() {
    for window in [16_000, 32_000] {
        let (convs, total) = replay(Api::Chat, &traces(), window).await;
        check("chat", window, &convs, &total);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fold_keeps_the_paths_the_agent_named_in_the_responses_api() {
    let file = converted(Api::Responses);
    for window in [16_000, 32_000] {
        let (convs, total) = replay(Api::Responses, &file, window).await;
        check("responses", window, &convs, &total);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fold_keeps_the_paths_the_agent_named_in_anthropic_messages() {
    let file = converted(Api::Messages);
    for window in [16_000, 32_000] {
        let (convs, total) = replay(Api::Messages, &file, window).await;
        check("messages", window, &convs, &total);
    }
}
