#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]
//! Pinned content on the development traces: with a pin pattern matching one early
//! tool output of each conversation, that output is forwarded byte for byte in every
//! later request at 8k and 16k, every guarantee holds, and the cost is printed beside
//! the same run without pins. Compaction instructions reach the extractive digest.

mod common;

use std::sync::Arc;

use common::priced::dev_traces;
use foldgate::commands::replay::{Conversation, replay_conversation};
use foldgate::compaction::steer::Steer;
use foldgate::compaction::{Engine, Forward, Options, SessionState, TokenCache, check};
use foldgate::config::CompactionConfig;
use foldgate::model::{ChatRequest, Message, Role, is_observation};
use foldgate::summarizer::ExtractiveSummarizer;
use serde_json::Value;

/// The first tool output of 200 to 2,000 characters among the first third of the
/// conversation's messages, and a pattern that matches it (an escaped slice of its text).
fn early_output(msgs: &[Arc<Message>]) -> Option<(usize, String)> {
    let third = msgs.len() / 3;
    (0..third).find_map(|i| {
        let m = &msgs[i];
        let output = m.role() == Role::Tool || is_observation(msgs, i);
        let text = m.text();
        if !output || text.len() < 200 || text.len() > 2000 {
            return None;
        }
        let slice: String = text.chars().skip(20).take(60).collect();
        Some((i, regex::escape(&slice)))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_early_output_is_forwarded_byte_for_byte_in_every_later_request() {
    let text = std::fs::read_to_string(dev_traces()).unwrap();
    let engine = Engine::new(CompactionConfig::default());
    for window in [8_000, 16_000] {
        let (mut pinned_conversations, mut checked, mut compacted) = (0, 0, 0);
        let mut sent_whole = 0;
        let mut cost = (0.0, 0.0, 0.0);
        let (mut with_pins, mut without) = (0u64, 0u64);
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).unwrap();
            let mut conv = Conversation::from_record(&record, 0, None).unwrap();
            conv.fields.insert("max_tokens".into(), Value::from(1000));
            let Some((at, pattern)) = early_output(&conv.messages) else { continue };
            pinned_conversations += 1;
            let steer = Steer::new("", &[pattern]).unwrap();
            let pins = steer.pins.clone().unwrap();
            let pinned = Options { window_cap: Some(window), steer, ..Options::default() };
            let plain = Options { window_cap: Some(window), ..Options::default() };
            let s = ExtractiveSummarizer;
            let priced = replay_conversation(&engine, &conv, &s, &pinned).await.unwrap();
            assert_eq!(priced.violation_count(), 0, "{}: {:?}", conv.id, priced.first_violation);
            let plain_priced = replay_conversation(&engine, &conv, &s, &plain).await.unwrap();
            cost.0 += priced.cost(0.1);
            cost.1 += plain_priced.cost(0.1);
            cost.2 += priced.cost_whole(0.1);
            with_pins += priced.tokens_after;
            without += plain_priced.tokens_after;
            sent_whole += priced.sent_whole;
            let mut state = SessionState::default();
            for (i, m) in conv.messages.iter().enumerate() {
                if i <= at || m.role() != Role::Assistant {
                    continue;
                }
                let history = conv.messages[..i].to_vec();
                let request = ChatRequest::from_parts(&conv.fields, history).unwrap();
                let s = ExtractiveSummarizer;
                let out = engine.compact_request(&request, &mut state, &s, &pinned).await;
                let out = match out {
                    Ok(out) => out,
                    // Pins that do not fit at all: forwarded as sent, which keeps the pin too.
                    Err(e) => {
                        assert!(e.to_string().contains("pinned"), "{e}");
                        continue;
                    }
                };
                let Forward::Compacted { request: fwd, report, .. } = &out else { continue };
                compacted += 1;
                let raw = conv.messages[at].raw();
                assert!(
                    fwd.messages().iter().any(|f| f.raw() == raw),
                    "{}: request {i} at {window} lost the pinned output {at}",
                    conv.id
                );
                assert!(report.pinned.contains(&at), "{}: {:?}", conv.id, report.pinned);
                let mut cache = TokenCache::default();
                let (cfg, budget, pins) = (engine.config(), &report.budget, Some(&*pins));
                let violations = check::verify_pinned(&request, fwd, cfg, budget, &mut cache, pins);
                assert!(violations.is_empty(), "{}: {violations:?}", conv.id);
                checked += 1;
            }
        }
        println!(
            "{window}: {pinned_conversations} conversations pinned, {compacted} compacted \
             requests checked ({sent_whole} sent whole: pins do not fit); \
             forwarded tokens with pins {with_pins}, without {without} ({:.3}x); cost with \
             pins {:.0}, without {:.0} ({:.3}x), sending everything whole {:.0}",
            with_pins as f64 / without.max(1) as f64,
            cost.0,
            cost.1,
            cost.0 / cost.1,
            cost.2
        );
        assert!(pinned_conversations > 100 && checked > 300, "{pinned_conversations} {checked}");
    }
}
