#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
//! Scenarios of the engine: live-turn folds, elision, reuse and invalidation of blocks,
//! the summarizer fallback, the token cache and forced compaction.

mod common;

use async_trait::async_trait;
use common::sessions;
use foldgate::compaction::{Engine, Forward, Options, SessionState};
use foldgate::config::CompactionConfig;
use foldgate::model::{ChatRequest, DIGEST_MARKER, Role};
use foldgate::summarizer::{ExtractiveSummarizer, Summarizer, SummarizerError, SummaryInput};
use serde_json::{Value, json};

fn words(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{tag}{} ", i % 50)).collect()
}

/// A system prompt, one task, then `rounds` tool rounds whose results have `size` words,
/// all calls reusing the id `call_1`.
fn live_turn(rounds: usize, size: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent.", "x_sys": [1, 2]}),
        json!({"role": "user", "content": "Fix the failing test in src/lib.rs. Never change the public API."}),
    ];
    for r in 0..rounds {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/mod_{r}.rs\"}}")}}]}));
        m.push(json!({"role": "tool", "tool_call_id": "call_1", "content": format!("file {r}\n{}", words(size, "w"))}));
    }
    m
}

fn body(msgs: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "gpt-4o", "messages": msgs, "x_top": {"keep": true}}))
        .unwrap()
}

fn run(
    engine: &Engine,
    body: &[u8],
    state: &mut SessionState,
    s: &dyn Summarizer,
    opts: &Options,
) -> Forward {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(engine.compact(body, state, s, opts))
        .unwrap()
}

fn compacted(o: &Forward) -> ChatRequest {
    match o {
        Forward::Compacted { body, .. } => ChatRequest::parse(body).unwrap(),
        Forward::Unchanged { report } => panic!("unchanged: {report:?}"),
    }
}

/// The defaults with `keep_last_tool_groups` and tool output never stubbed: stubbing
/// large output is priced cheaper than folding it, so scenarios of folds switch it off.
fn folding(keep_last_tool_groups: usize) -> CompactionConfig {
    CompactionConfig { keep_last_tool_groups, elide_min_tokens: 1_000_000, ..Default::default() }
}

fn window(n: usize) -> Options {
    Options { window_cap: Some(n), ..Options::default() }
}

#[test]
fn live_turn_folds_at_tool_group_boundaries() {
    let engine = Engine::new(folding(2));
    let msgs = live_turn(12, 300);
    let out = run(
        &engine,
        &body(&msgs),
        &mut SessionState::default(),
        &ExtractiveSummarizer,
        &window(8000),
    );
    let report = out.report().clone();
    assert_eq!(report.tier, 2, "{report:?}");
    let fwd = compacted(&out);
    let m = fwd.messages();
    // system and task verbatim, then the digest, then the last two tool groups intact.
    assert_eq!(m[0].raw(), serde_json::to_string(&msgs[0]).unwrap());
    assert_eq!(m[1].raw(), serde_json::to_string(&msgs[1]).unwrap());
    assert_eq!(m[2].role(), Role::Assistant);
    assert!(m[2].text().starts_with(DIGEST_MARKER));
    assert!(m[2].text().contains("read_file(path=src/mod_0.rs)"), "{}", m[2].text());
    let tail: Vec<String> =
        msgs[msgs.len() - 4..].iter().map(|v| serde_json::to_string(v).unwrap()).collect();
    let fwd_tail: Vec<String> = m[3..].iter().map(|x| x.raw().to_owned()).collect();
    assert_eq!(fwd_tail, tail);
    assert!(report.tokens_after <= report.budget.target, "{report:?}");
    let v: Value = serde_json::from_slice(&fwd.to_vec()).unwrap();
    assert_eq!(v["x_top"], json!({"keep": true}));
}

#[test]
fn old_large_tool_results_are_elided_first() {
    // Two turns: an old large result, then a short recent turn.
    let mut msgs = live_turn(1, 2000);
    msgs.push(json!({"role": "assistant", "content": "Done reading."}));
    msgs.push(json!({"role": "user", "content": "Now run the tests."}));
    msgs.push(json!({"role": "assistant", "content": "Running."}));
    msgs.push(json!({"role": "user", "content": "And report back."}));
    let engine = Engine::new(CompactionConfig::default());
    let out = run(
        &engine,
        &body(&msgs),
        &mut SessionState::default(),
        &ExtractiveSummarizer,
        &window(8000),
    );
    assert_eq!(out.report().tier, 1, "{:?}", out.report());
    assert_eq!(out.report().elided, 1);
    let fwd = compacted(&out);
    let stub = &fwd.messages()[3];
    assert_eq!(stub.tool_call_id(), Some("call_1"));
    assert!(
        stub.text().contains("`read_file`") && stub.text().contains("first line: file 0"),
        "{}",
        stub.text()
    );
    assert_eq!(fwd.messages().len(), msgs.len());
}

#[test]
fn blocks_are_reused_then_dropped_when_history_is_edited() {
    let engine = Engine::new(folding(2));
    let mut msgs = live_turn(12, 300);
    let mut state = SessionState::default();
    let first =
        compacted(&run(&engine, &body(&msgs), &mut state, &ExtractiveSummarizer, &window(8000)));
    assert_eq!(state.blocks.len(), 1);
    // One more round: the stored block is reused byte for byte.
    msgs.extend(live_turn(13, 300).split_off(msgs.len()));
    let out = run(&engine, &body(&msgs), &mut state, &ExtractiveSummarizer, &window(8000));
    assert_eq!(out.report().blocks_reused, 1, "{:?}", out.report());
    let second = compacted(&out);
    for k in 0..3 {
        assert_eq!(first.messages()[k].raw(), second.messages()[k].raw());
    }
    // The client edits an early message: the block no longer matches and is redone.
    msgs[3]["content"] = json!("edited");
    let out = run(&engine, &body(&msgs), &mut state, &ExtractiveSummarizer, &window(8000));
    assert_eq!(out.report().blocks_invalidated, 1);
    assert_eq!(out.report().blocks_new, 1);
}

struct Failing;

#[async_trait]
impl Summarizer for Failing {
    fn kind(&self) -> foldgate::summarizer::SummarizerKind {
        foldgate::summarizer::SummarizerKind::Llm
    }
    async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
        Err(SummarizerError::Timeout)
    }
}

#[test]
fn failing_summarizer_falls_back_to_extractive() {
    let engine = Engine::new(folding(4));
    let out = run(
        &engine,
        &body(&live_turn(12, 300)),
        &mut SessionState::default(),
        &Failing,
        &window(8000),
    );
    let r = out.report();
    assert_eq!(r.summarizer.as_deref(), Some("extractive"));
    assert_eq!(r.summarizer_error.as_deref(), Some("summarizer timed out"));
    assert!(r.artifact_recall.is_some());
}

#[test]
fn resent_conversation_tokenizes_only_the_new_message() {
    let engine = Engine::new(CompactionConfig::default());
    let mut msgs = live_turn(6, 50);
    let mut state = SessionState::default();
    let opts = Options { force: true, ..Options::default() };
    run(&engine, &body(&msgs), &mut state, &ExtractiveSummarizer, &opts);
    let (_, misses_before) = state.token_cache.stats();
    msgs.push(json!({"role": "assistant", "content": "All done."}));
    let out = run(&engine, &body(&msgs), &mut state, &ExtractiveSummarizer, &opts);
    let (_, misses_after) = state.token_cache.stats();
    assert_eq!(misses_after - misses_before, 1, "{:?}", out.report());
}

#[test]
fn force_compacts_below_the_trigger() {
    let engine = Engine::new(CompactionConfig {
        keep_last_tool_groups: 2,
        keep_last_turns: 1,
        ..Default::default()
    });
    // A finished turn of work, then the current turn, which fits and stays intact.
    let mut msgs = live_turn(12, 300);
    msgs.push(json!({"role": "user", "content": "Now update the changelog."}));
    let b = body(&msgs);
    let plain =
        run(&engine, &b, &mut SessionState::default(), &ExtractiveSummarizer, &Options::default());
    assert!(matches!(plain, Forward::Unchanged { .. }));
    let opts = Options { force: true, target_ratio: Some(0.01), ..Options::default() };
    let forced = run(&engine, &b, &mut SessionState::default(), &ExtractiveSummarizer, &opts);
    assert!(forced.report().forced);
    assert!(
        forced.report().tokens_after < forced.report().tokens_before / 2,
        "{:?}",
        forced.report()
    );
}

#[test]
fn not_a_chat_request_is_an_error() {
    let engine = Engine::new(CompactionConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let r = rt.block_on(engine.compact(
        b"{\"input\": 1}",
        &mut SessionState::default(),
        &ExtractiveSummarizer,
        &Options::default(),
    ));
    assert!(r.is_err());
}

/// What the outline says is clearly below the trigger, the engine forwards unchanged, and
/// its estimate is never above the exact count's upper bound: checked on every request of
/// growing sessions, at a window where they cross the prefetch point and the trigger.
#[tokio::test]
async fn a_request_clearly_below_the_trigger_is_one_the_engine_leaves_unchanged() {
    let config =
        CompactionConfig { max_context_tokens: Some(64_000), ..CompactionConfig::default() };
    let engine = Engine::new(config);
    let mut quick = 0;
    let mut full = 0;
    for seed in 1..=3 {
        let bodies = sessions::session_requests(sessions::Shape::CodingAgent, seed, 40_000);
        for request in bodies {
            let outline = foldgate::outline::Outline::scan(&request.body).expect("an outline");
            let Some(report) = engine.clearly_below(&outline, &Options::default()) else {
                full += 1;
                continue;
            };
            quick += 1;
            let parsed = ChatRequest::parse(&request.body).unwrap();
            let mut state = SessionState::default();
            let outcome = engine
                .compact_request(&parsed, &mut state, &ExtractiveSummarizer, &Options::default())
                .await
                .unwrap();
            assert!(
                matches!(outcome, Forward::Unchanged { .. }),
                "compacted although clearly below"
            );
            let exact = engine.count_prompt(&parsed, &report.budget, &mut state.token_cache);
            assert!(exact <= report.budget.trigger, "{exact} tokens over the trigger");
        }
    }
    assert!(quick > 10 && full > 10, "both sides were exercised: {quick} quick, {full} full");
}

/// A PDF in a file part is charged by its pages, which its bytes do not bound: such a
/// request is always counted, never decided from its outline.
#[test]
fn a_request_with_inline_file_data_is_always_counted() {
    let engine = Engine::new(CompactionConfig::default());
    // A two-page PDF in a few dozen bytes of base64.
    let pdf = "JVBERi0xLjcKPDwgL1R5cGUgL1BhZ2UgPj4KPDwgL1R5cGUgL1BhZ2UgPj4K";
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Summarize this."},
        {"type": "file", "file": {"filename": "a.pdf",
            "file_data": format!("data:application/pdf;base64,{pdf}")}}]}]});
    let body = serde_json::to_vec(&body).unwrap();
    let outline = foldgate::outline::Outline::scan(&body).expect("an outline");
    assert!(engine.clearly_below(&outline, &Options::default()).is_none());
    let parsed = ChatRequest::parse(&body).unwrap();
    let budget = foldgate::compaction::Budget::of(&parsed, engine.config(), &Options::default());
    let mut cache = foldgate::compaction::TokenCache::default();
    let exact = engine.count_prompt(&parsed, &budget, &mut cache);
    assert!(exact >= 2 * foldgate::compaction::tokens::count::PDF_PAGE_TOKENS, "{exact}");
}

/// A customer-service style session: many short user turns, each with one tool round and
/// a reply, user messages of 100 to 190 tokens.
fn many_turns(turns: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": "You are an airline agent."})];
    for t in 0..turns {
        m.push(json!({"role": "user", "content": format!("Turn {t}: I prefer a seat by the window. {}", words(30 + (t * 37) % 40, "u"))}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{t}"), "type": "function",
            "function": {"name": "get_reservation", "arguments": format!("{{\"id\":\"R{t}\"}}")}}]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t}"), "content": words(300, "r")}));
        m.push(json!({"role": "assistant", "content": format!("Reservation R{t} is confirmed.")}));
    }
    m
}

fn goal_cfg() -> CompactionConfig {
    CompactionConfig {
        user_verbatim_max_tokens: 200,
        floor_max_ratio: 0.3,
        digest_max_tokens: 150,
        trail_max_tokens: 40,
        default_reserve_tokens: 500,
        ..CompactionConfig::default()
    }
}

/// Tier 3: once small user messages and digests pass the floor, the oldest turns become
/// one goal history (its own sections, the user's words past the floor in its human
/// direction), and later requests forward it byte for byte.
#[test]
fn a_goal_batch_is_reused_byte_for_byte() {
    let msgs = many_turns(60);
    let engine = Engine::new(goal_cfg());
    let opts = window(6000);
    let mut state = SessionState::default();
    let mut goal: Option<Vec<String>> = None;
    let (mut reused, mut batches) = (0, 0);
    for end in (5..=msgs.len()).step_by(2) {
        let out = run(&engine, &body(&msgs[..end]), &mut state, &ExtractiveSummarizer, &opts);
        let report = out.report().clone();
        let forwarded: Vec<String> = match &out {
            Forward::Compacted { .. } => {
                compacted(&out).messages().iter().map(|m| m.raw().to_owned()).collect()
            }
            Forward::Unchanged { .. } => continue,
        };
        if report.goal_batches > 0 {
            batches += 1;
            let block = &state.blocks[0];
            let text: Vec<String> = block.messages.iter().map(|m| m.get().to_owned()).collect();
            let digest = text.last().unwrap();
            assert!(
                digest.contains(DIGEST_MARKER) && digest.contains("## Human direction"),
                "{digest}"
            );
            assert!(digest.contains("## Goal arc"), "{digest}");
            assert_eq!(&forwarded[..text.len()], &text[..], "forwarded as stored");
            goal = Some(text);
        } else if let Some(text) = &goal {
            // Past the floor the fallback may drop small user messages the block kept;
            // otherwise (also under the last request's cut, which starts after the
            // blocks) the block is forwarded as stored.
            let cut_anew = report.tier == 4 && !report.cut_reused;
            if report.blocks_absorbed == 0 && report.blocks_invalidated == 0 && !cut_anew {
                reused += usize::from(forwarded.get(..text.len()) == Some(&text[..]));
            }
        }
    }
    assert!(batches >= 1, "a goal batch was made");
    assert!(reused >= 1, "it was reused on later requests ({reused})");
}

/// A text-mode session (mini-swe-agent: every command's output arrives as a `user`
/// message) replayed through the engine at a 16k window, one request per assistant
/// message: the outputs are recognised as tool output, stubbed or folded as the priced
/// plan takes them, so drops (tier 4) serve few of the compacted requests and folds are
/// made. Taken for the user's words, the outputs could be neither stubbed nor folded: they
/// would fill the verbatim floor and the fallback would serve most of them.
#[test]
fn a_text_mode_session_rarely_falls_back_to_tier_4() {
    let msgs = sessions::text_mode_session(5, 60_000);
    let engine = Engine::new(CompactionConfig::default());
    let opts = window(16_000);
    let mut state = SessionState::default();
    let mut tiers = std::collections::BTreeMap::<u8, usize>::new();
    let mut compacted = 0;
    for end in (2..msgs.len()).filter(|&i| msgs[i]["role"] == "assistant") {
        let out = run(&engine, &body(&msgs[..end]), &mut state, &ExtractiveSummarizer, &opts);
        if matches!(out, Forward::Compacted { .. }) {
            compacted += 1;
            *tiers.entry(out.report().tier.number()).or_default() += 1;
        }
    }
    println!("{compacted} compacted requests by tier: {tiers:?}");
    let dropped = tiers.get(&4).copied().unwrap_or(0);
    assert!(compacted >= 40, "the session was compacted: {compacted} requests ({tiers:?})");
    assert!(tiers.get(&2).copied().unwrap_or(0) > 0, "no fold: {tiers:?}");
    assert!(
        dropped * 5 <= compacted,
        "drops served {dropped} of {compacted} compacted requests: {tiers:?}"
    );
}

/// A growing customer-service session (short user turns, one tool round each) that
/// stays in tier 4: with every turn and every tool group kept from folding, only the
/// fallback can make room. Its cut goes down to the target and is reapplied while the
/// prompt stays under the trigger, so the forwarded prefix (what the previous request
/// forwarded) is unchanged on most requests and changes only where a new cut is made.
/// Cut only to the trigger, or made afresh on every request, it changes on most.
#[test]
fn tier_4_cuts_keep_the_prefix_stable_between_drops() {
    let config = CompactionConfig {
        keep_last_turns: 10_000,
        keep_last_tool_groups: 10_000,
        ..CompactionConfig::default()
    };
    let engine = Engine::new(config);
    let opts = window(16_000);
    let mut state = SessionState::default();
    let mut previous: Option<Vec<String>> = None;
    let (mut fallback, mut breaks, mut cuts) = (0, 0, 0);
    let msgs = many_turns(150);
    for end in (2..msgs.len()).filter(|&i| msgs[i]["role"] == "assistant") {
        let body = body(&msgs[..end]);
        let out = run(&engine, &body, &mut state, &ExtractiveSummarizer, &opts);
        let report = out.report().clone();
        let forwarded: Vec<String> = match &out {
            Forward::Compacted { request, .. } => {
                request.messages().iter().map(|m| m.raw().to_owned()).collect()
            }
            Forward::Unchanged { .. } => ChatRequest::parse(&body)
                .unwrap()
                .messages()
                .iter()
                .map(|m| m.raw().to_owned())
                .collect(),
        };
        let in_tier_4 = report.tier == 4;
        let kept_prefix = previous.as_ref().is_some_and(|p| forwarded.starts_with(p));
        if in_tier_4 && previous.is_some() {
            fallback += 1;
            cuts += usize::from(!report.cut_reused);
            if !kept_prefix {
                breaks += 1;
                assert!(!report.cut_reused, "the prefix changed without a new cut: {report:?}");
            }
        }
        previous = in_tier_4.then_some(forwarded);
    }
    println!(
        "{fallback} requests in tier 4 after one in tier 4: {cuts} new cuts, {breaks} prefix changes"
    );
    assert!(fallback >= 30, "the session stayed in tier 4: {fallback} requests");
    assert!(breaks * 5 <= fallback, "the prefix changed on {breaks} of {fallback} requests");
}

/// A prompt over the trigger that is all one current turn which fits: no tier may touch
/// it, so it is forwarded unchanged, and the report says no tier was applied (not tier 4,
/// as if the fallback had cut something).
#[test]
fn a_current_turn_the_fallback_cannot_cut_is_not_reported_as_tier_4() {
    let engine = Engine::new(CompactionConfig::default());
    let msgs = live_turn(10, 300);
    let out = run(
        &engine,
        &body(&msgs),
        &mut SessionState::default(),
        &ExtractiveSummarizer,
        &window(12_000),
    );
    let report = out.report();
    let budget = &report.budget;
    assert!(
        report.tokens_before > budget.trigger && report.tokens_before <= budget.budget,
        "between the trigger and the budget: {report:?}"
    );
    assert!(matches!(out, Forward::Unchanged { .. }), "{report:?}");
    assert_eq!((report.tier.number(), report.dropped, report.elided), (0, 0, 0), "{report:?}");
}

/// Counts its calls; its digests are short.
struct Counting(std::sync::atomic::AtomicUsize);

#[async_trait]
impl Summarizer for Counting {
    fn kind(&self) -> foldgate::summarizer::SummarizerKind {
        foldgate::summarizer::SummarizerKind::Llm
    }
    async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok("## Milestones\n- I read the modules.".to_owned())
    }
}

#[test]
fn a_fold_whose_digest_the_fallback_would_drop_is_not_summarized() {
    // Early work, then a live turn that is over the target by itself but fits: folding
    // the early work would leave the prompt over the target, and the fallback would drop
    // the new digest with it. The early work is cut, and no summarizer is called.
    let mut msgs = live_turn(5, 300);
    msgs.push(
        json!({"role": "user", "content": "Now run the whole test suite and fix what fails."}),
    );
    for r in 0..7 {
        msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_2", "type": "function",
            "function": {"name": "run", "arguments": format!("{{\"cmd\":\"cargo test part_{r}\"}}")}}]}));
        msgs.push(json!({"role": "tool", "tool_call_id": "call_2", "content": words(300, "t")}));
    }
    let body =
        serde_json::to_vec(&json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 1000}))
            .unwrap();
    let engine = Engine::new(folding(2));
    let counting = Counting(std::sync::atomic::AtomicUsize::new(0));
    let out = run(&engine, &body, &mut SessionState::default(), &counting, &window(8000));
    let report = out.report();
    assert!(report.tokens_before > report.budget.fit_limit(), "{report:?}");
    assert!(report.fits, "{report:?}");
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 0, "{report:?}");
    assert_eq!(report.blocks_new, 0);
    let forwarded = compacted(&out);
    // The live turn is forwarded whole.
    let turn = msgs.len() - 15;
    assert!(forwarded.messages().len() >= 15);
    let tail = &forwarded.messages()[forwarded.messages().len() - 15..];
    for (m, original) in tail.iter().zip(&msgs[turn..]) {
        assert_eq!(serde_json::from_str::<Value>(m.raw()).unwrap(), *original);
    }
}
