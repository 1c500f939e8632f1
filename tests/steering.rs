#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]
//! Compaction instructions and pins through the proxy, on recorded conversations: each
//! source of instructions reaches the model summarizer's request in merge order, a
//! header adds to the others and changes nothing that is kept verbatim, the extractive
//! digest lists them, a bad pin pattern gets a 400 (a header) or stops start-up (the
//! configuration), and pinned messages are counted.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::agent::{ProviderStats, chat_config, chat_request, provider};
use common::priced::dev_traces;
use common::{MockUpstream, Proxy, send};
use foldgate::commands::replay::Conversation;
use foldgate::compaction::steer::Steer;
use foldgate::compaction::{Engine, FoldWhen, Forward, Options, SessionState};
use foldgate::config::{CompactionConfig, Config, Secret};
use foldgate::model::{ChatRequest, Role};
use foldgate::summarizer::ExtractiveSummarizer;
use http::StatusCode;
use serde_json::{Value, json};

const OPERATOR: &str = "OPERATOR-RULE: name every failing test.";
const SECTION: &str = "- CONVERSATION-RULE: keep the issue number.";
const HEADER: &str = "HEADER-RULE: keep the exact error text.";

/// The first recorded conversation of `family`, its system message given a "Compact
/// instructions" section.
fn recorded(family: &str) -> Value {
    let text = std::fs::read_to_string(dev_traces()).unwrap();
    let mut record: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["meta"]["family"] == family)
        .unwrap();
    let system = &mut record["messages"][0];
    assert_eq!(system["role"], "system");
    let content = system["content"].as_str().unwrap().to_owned();
    system["content"] =
        json!(format!("{content}\n\n## Compact instructions\n{SECTION}\n\n## Other notes\nnone"));
    record
}

/// The request bodies of `record`: one per assistant reply, the history before it.
fn bodies(record: &Value) -> Vec<Bytes> {
    let messages = record["messages"].as_array().unwrap();
    (1..messages.len())
        .filter(|&i| messages[i]["role"] == "assistant")
        .map(|i| {
            let mut body = json!({"model": "gpt-4o", "messages": messages[..i], "max_tokens": 512});
            if let Some(tools) = record.get("tools") {
                body["tools"] = tools.clone();
            }
            Bytes::from(body.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_source_of_instructions_reaches_the_summarizer_in_merge_order() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let mut config = chat_config(&mock.url());
    config.summarizer.instructions = OPERATOR.to_owned();
    let proxy = Proxy::start(config).await;
    let record = recorded("mini-swe-agent");
    let system = record["messages"][0].clone();
    for body in bodies(&record) {
        let mut request = chat_request(&proxy, body, "Bearer sk-steer", "steer-1");
        let headers = request.headers_mut();
        headers.insert("x-foldgate-compact-instructions", HEADER.parse().unwrap());
        let (status, _, _) = send(request).await;
        assert_eq!(status, StatusCode::OK);
    }
    // Background folds land shortly after the request that postponed them.
    for _ in 0..100 {
        if stats.summaries.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls: Vec<Value> = (mock.recorded().into_iter())
        .filter(|r| r.headers.contains_key("x-foldgate-summary"))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert!(!calls.is_empty(), "no summarizer call");
    for call in &calls {
        let messages = call["messages"].as_array().unwrap();
        let prompt = messages.last().unwrap()["content"].as_str().unwrap();
        let at = |marker: &str| prompt.find(marker).unwrap_or_else(|| panic!("{marker}: {prompt}"));
        assert!(at(OPERATOR) < at(SECTION) && at(SECTION) < at(HEADER), "{prompt}");
        assert!(prompt.contains("take precedence"), "{prompt}");
    }
    // The header adds to the instructions; what is kept verbatim is the same: the system
    // message is forwarded byte for byte in every request.
    let forwarded = mock.forwarded_bodies();
    assert!(!forwarded.is_empty());
    for body in forwarded {
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["messages"][0], system);
    }
}

#[tokio::test]
async fn the_extractive_digest_lists_the_instructions_as_standing_facts() {
    let record = recorded("mini-swe-agent");
    let conv = Conversation::from_record(&record, 0, None).unwrap();
    let engine = Engine::new(CompactionConfig::default());
    let steer = Steer::new(&format!("- {OPERATOR}"), &[]).unwrap();
    let steer = steer.with_request(Some(&format!("* {HEADER}")), None).unwrap();
    let opts = Options { window_cap: Some(16_000), steer, ..Options::default() };
    let mut state = SessionState::default();
    let mut digests = 0;
    for (i, m) in conv.messages.iter().enumerate() {
        if i == 0 || m.role() != Role::Assistant {
            continue;
        }
        let request = ChatRequest::from_parts(&conv.fields, conv.messages[..i].to_vec()).unwrap();
        let out = engine.compact_request(&request, &mut state, &ExtractiveSummarizer, &opts);
        let Forward::Compacted { request: fwd, report, .. } = out.await.unwrap() else { continue };
        let sources: Vec<&str> = report.instructions.iter().map(|i| i.source.as_str()).collect();
        assert_eq!(sources, ["config", "conversation", "header"]);
        for digest in fwd.messages().iter().filter(|m| m.is_digest()) {
            let text = digest.text();
            let facts = text.find("## Standing facts").expect(&text);
            for rule in [OPERATOR, &SECTION[2..], HEADER] {
                let at = text.find(rule).unwrap_or_else(|| panic!("{rule}: {text}"));
                assert!(at > facts, "{text}");
            }
            digests += 1;
        }
    }
    assert!(digests > 0, "no digest was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_pin_pattern_in_a_header_gets_a_400_naming_it() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let proxy = Proxy::start(chat_config(&mock.url())).await;
    let body = bodies(&recorded("tau-bench")).remove(0);
    let mut request = chat_request(&proxy, body, "Bearer sk-steer", "steer-2");
    request.headers_mut().insert("x-foldgate-pin", "[\"(unclosed\"]".parse().unwrap());
    let (status, _, answer) = send(request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert!(answer["error"]["message"].as_str().unwrap().contains("(unclosed"), "{answer}");
    assert!(mock.recorded().is_empty(), "nothing went upstream");
}

#[test]
fn a_bad_pin_pattern_in_the_configuration_stops_start_up() {
    let err = Config::from_toml_str("[compaction]\npin = [\"a(\"]\n", "test", &[]).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("compaction.pin") && message.contains("a("), "{message}");
    let text = "[compaction]\npin = [\"SPEC-[0-9]+\"]\n[summarizer]\ninstructions = \"keep ids\"\n";
    let config = Config::from_toml_str(text, "test", &[]).unwrap();
    assert_eq!(config.compaction.pin, ["SPEC-[0-9]+"]);
    assert_eq!(config.summarizer.instructions, "keep ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_messages_and_instructions_are_counted() {
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats.clone())).await;
    let record = recorded("mini-swe-agent");
    // The first command output: a slice of its text, escaped.
    let output = record["messages"][3]["content"].as_str().unwrap();
    let slice: String = output.chars().skip(10).take(50).collect();
    let mut config = chat_config(&mock.url());
    config.compaction.pin = vec![regex::escape(&slice)];
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Secret::new("admin-token");
    let proxy = Proxy::start(config).await;
    let mut key = String::new();
    for body in bodies(&record) {
        let request = chat_request(&proxy, body, "Bearer sk-steer", "steer-3");
        let (status, headers, _) = send(request).await;
        assert_eq!(status, StatusCode::OK);
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
    }
    // The inspector shows the instructions in force and the pinned messages (the
    // command's output and the command itself, one unit).
    let url = format!("http://{}/sessions/{key}", proxy.admin_addr.unwrap());
    let inspect = http::Request::get(url).header("authorization", "Bearer admin-token");
    let (status, _, session) = send(inspect.body(common::full("")).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let session: Value = serde_json::from_slice(&session).unwrap();
    let recent = session["recent"].as_array().unwrap();
    let planned = recent.iter().rfind(|r| r.get("pinned").is_some()).expect("a planned request");
    assert_eq!(planned["pinned"], json!([2, 3]), "{planned}");
    assert_eq!(planned["instructions"][0]["source"], "conversation", "{planned}");
    assert_eq!(planned["instructions"][0]["text"], SECTION);
    let scrape = http::Request::get(proxy.url("/metrics")).body(common::full("")).unwrap();
    let (_, _, text) = send(scrape).await;
    let text = String::from_utf8(text.to_vec()).unwrap();
    let value = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("foldgate_pinned_messages_total") > 0.0, "{text}");
    let conversations = "foldgate_conversations_with_instructions_total{source=\"conversation\"}";
    assert_eq!(value(conversations), 1.0, "one conversation, counted once");
    let by_header = "foldgate_conversations_with_instructions_total{source=\"header\"}";
    assert_eq!(value(by_header), 0.0);
}

#[tokio::test]
async fn a_compaction_api_s_whole_fold_uses_the_same_merge_with_its_own_instructions_last() {
    let record = recorded("tau-bench");
    let conv = Conversation::from_record(&record, 0, None).unwrap();
    let request = ChatRequest::from_parts(&conv.fields, conv.messages.clone()).unwrap();
    let engine = Engine::new(CompactionConfig::default());
    let steer = Steer::new(&format!("- {OPERATOR}"), &[]).unwrap();
    let steer = steer.with_request(Some(&format!("- {HEADER}")), None).unwrap();
    let opts = Options {
        steer,
        summary_instructions: Some("- REQUEST-RULE: keep the booking ids.".to_owned()),
        ..Options::default()
    };
    let fold = engine.fold_whole(&request, &ExtractiveSummarizer, &opts, FoldWhen::Always).await;
    let fold = fold.unwrap().expect("folded");
    let at =
        |rule: &str| fold.digest.find(rule).unwrap_or_else(|| panic!("{rule}: {}", fold.digest));
    let order = [OPERATOR, &SECTION[2..], HEADER, "REQUEST-RULE"].map(at);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}: {}", fold.digest);
}
