//! The clearing edits on a request body: `clear_tool_uses_20250919` (old tool results,
//! and optionally their inputs, replaced by a placeholder; every pairing and id kept)
//! and `clear_thinking_20251015` (thinking blocks of older assistant turns removed
//! whole). Only the changed blocks' bytes change.

use std::collections::HashMap;

use super::config::{ClearThinking, ClearToolUses, ThinkingKeep, Trigger};
use super::layout::{Blk, Layout, Msg, Splice, apply, read};
use crate::api::json_text::{Object, splice};

/// What a cleared `tool_result`'s content becomes.
pub const CLEARED: &str = "[cleared to save context]";

/// What one edit did, as the answer reports it in `context_management.applied_edits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppliedEdit {
    /// `clear_tool_uses_20250919`.
    ClearToolUses {
        /// Tool uses whose result (or input) was cleared.
        cleared_tool_uses: usize,
        /// Input tokens removed.
        cleared_input_tokens: usize,
    },
    /// `clear_thinking_20251015`.
    ClearThinking {
        /// Assistant turns whose thinking was removed.
        cleared_thinking_turns: usize,
        /// Input tokens removed.
        cleared_input_tokens: usize,
    },
}

impl AppliedEdit {
    /// What the edit did, in a few words (for the request's record).
    pub fn describe(&self) -> String {
        match *self {
            Self::ClearToolUses { cleared_tool_uses, cleared_input_tokens } => format!(
                "clear_tool_uses_20250919 cleared {cleared_tool_uses} tool use(s), {cleared_input_tokens} input tokens"
            ),
            Self::ClearThinking { cleared_thinking_turns, cleared_input_tokens } => format!(
                "clear_thinking_20251015 removed the thinking of {cleared_thinking_turns} turn(s), {cleared_input_tokens} input tokens"
            ),
        }
    }

    /// Input tokens the edit removed.
    pub fn cleared_input_tokens(&self) -> usize {
        match *self {
            Self::ClearToolUses { cleared_input_tokens, .. }
            | Self::ClearThinking { cleared_input_tokens, .. } => cleared_input_tokens,
        }
    }

    /// The entry of `applied_edits`, as the SDK's `BetaClearToolUses20250919EditResponse`
    /// / `BetaClearThinking20251015EditResponse`.
    pub fn to_json(&self) -> String {
        match *self {
            Self::ClearToolUses { cleared_tool_uses, cleared_input_tokens } => format!(
                r#"{{"type":"clear_tool_uses_20250919","cleared_tool_uses":{cleared_tool_uses},"cleared_input_tokens":{cleared_input_tokens}}}"#
            ),
            Self::ClearThinking { cleared_thinking_turns, cleared_input_tokens } => format!(
                r#"{{"type":"clear_thinking_20251015","cleared_thinking_turns":{cleared_thinking_turns},"cleared_input_tokens":{cleared_input_tokens}}}"#
            ),
        }
    }
}

/// One tool use of the conversation: where its block and its result's block are.
struct ToolUse<'c, 'a> {
    name: &'c str,
    block: &'c Blk<'a>,
    result: Option<&'c Blk<'a>>,
}

/// `clear_tool_uses_20250919` on `text` (a request of `input_tokens`): the new body and
/// what it did, or `None` when it does not apply (not triggered, nothing to clear, less
/// than `clear_at_least` cleared, or not a body it understands). `count` counts the
/// tokens of a JSON text.
pub fn clear_tool_uses(
    text: &str,
    edit: &ClearToolUses,
    input_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> Option<(String, AppliedEdit)> {
    let conversation = read(text)?;
    let uses = tool_uses(&conversation);
    let triggered = match edit.trigger {
        Trigger::InputTokens(n) => input_tokens as u64 > n,
        Trigger::ToolUses(n) => uses.len() as u64 > n,
    };
    if !triggered {
        return None;
    }
    let old = uses.len().saturating_sub(edit.keep);
    let (mut splices, mut cleared, mut tokens) = (Vec::new(), 0, 0);
    for used in uses.iter().take(old).filter(|u| !edit.exclude_tools.iter().any(|t| t == u.name)) {
        let mut changed = false;
        let result = used.result.and_then(|r| cleared_result(r));
        let input = edit.clear_tool_inputs.covers(used.name).then(|| cleared_input(used.block));
        for (block, new) in [(used.result, result), (Some(used.block), input.flatten())] {
            if let (Some(block), Some(new)) = (block, new) {
                tokens += count(block.raw).saturating_sub(count(&new));
                splices.push(Splice { range: block.range.clone(), text: new });
                changed = true;
            }
        }
        cleared += usize::from(changed);
    }
    if splices.is_empty() || edit.clear_at_least.is_some_and(|n| (tokens as u64) < n) {
        return None;
    }
    let body = apply(text, splices)?;
    Some((
        body,
        AppliedEdit::ClearToolUses { cleared_tool_uses: cleared, cleared_input_tokens: tokens },
    ))
}

/// Every `tool_use` of the assistant messages, in order, with the first `tool_result`
/// that answers it in a later user message.
fn tool_uses<'c, 'a>(conversation: &'c Layout<'a>) -> Vec<ToolUse<'c, 'a>> {
    let mut results: HashMap<&str, &Blk<'a>> = HashMap::new();
    for m in conversation.messages.iter().filter(|m| !m.assistant) {
        for b in m.blocks().iter().filter(|b| b.head.kind == "tool_result") {
            if let Some(id) = b.head.tool_use_id.as_deref() {
                results.entry(id).or_insert(b);
            }
        }
    }
    let mut uses = Vec::new();
    for m in conversation.messages.iter().filter(|m| m.assistant) {
        for b in m.blocks().iter().filter(|b| b.head.kind == "tool_use") {
            let id = b.head.id.as_deref().unwrap_or_default();
            let name = b.head.name.as_deref().unwrap_or_default();
            uses.push(ToolUse { name, block: b, result: results.get(id).copied() });
        }
    }
    uses
}

/// A `tool_result` block with its content replaced by [`CLEARED`]; `None` when it is
/// cleared already or has no content.
fn cleared_result(block: &Blk<'_>) -> Option<String> {
    let content = block.head.content?.get();
    if content == format!("\"{CLEARED}\"") {
        return None;
    }
    replace_member(block.raw, "content", &format!("\"{CLEARED}\""))
}

/// A `tool_use` block with its input replaced by `{}`; `None` when it is empty already.
fn cleared_input(block: &Blk<'_>) -> Option<String> {
    let input = block.head.input?.get();
    if input.trim() == "{}" {
        return None;
    }
    replace_member(block.raw, "input", "{}")
}

/// The object `raw` with member `name`'s value replaced by `value`.
fn replace_member(raw: &str, name: &str, value: &str) -> Option<String> {
    let member = Object::parse(raw)?.get(name)?.value.clone();
    splice(raw, member, value)
}

/// `clear_thinking_20251015` on `text`: the new body and what it did, or `None` when it
/// removes nothing. An assistant message made of thinking blocks only keeps them (an
/// empty message is not allowed, and thinking is never edited).
pub fn clear_thinking(
    text: &str,
    edit: &ClearThinking,
    count: &dyn Fn(&str) -> usize,
) -> Option<(String, AppliedEdit)> {
    let ThinkingKeep::Turns(keep) = edit.keep else { return None };
    let conversation = read(text)?;
    let turns = turns(&conversation.messages);
    let mut thinking_turns: Vec<usize> = Vec::new();
    for (m, turn) in conversation.messages.iter().zip(&turns) {
        if m.blocks().iter().any(Blk::is_thinking) && thinking_turns.last() != Some(turn) {
            thinking_turns.push(*turn);
        }
    }
    let cleared_turns = &thinking_turns[..thinking_turns.len().saturating_sub(keep)];
    let (mut splices, mut tokens, mut done) = (Vec::new(), 0, Vec::new());
    for (m, turn) in conversation.messages.iter().zip(&turns) {
        let blocks = m.blocks();
        if !cleared_turns.contains(turn) || blocks.iter().all(Blk::is_thinking) {
            continue;
        }
        let (removed, kept): (Vec<&Blk<'_>>, Vec<&Blk<'_>>) =
            blocks.iter().partition(|b| b.is_thinking());
        tokens += removed.iter().map(|b| count(b.raw)).sum::<usize>();
        let list = kept.iter().map(|b| b.raw).collect::<Vec<_>>().join(",");
        splices.push(Splice { range: m.content.clone(), text: format!("[{list}]") });
        if done.last() != Some(turn) {
            done.push(*turn);
        }
    }
    if splices.is_empty() {
        return None;
    }
    let body = apply(text, splices)?;
    let applied = AppliedEdit::ClearThinking {
        cleared_thinking_turns: done.len(),
        cleared_input_tokens: tokens,
    };
    Some((body, applied))
}

/// Each message's assistant turn: a turn starts at each user message that is not only
/// tool results (the tool loop that follows belongs to the turn that answers it).
fn turns(messages: &[Msg<'_>]) -> Vec<usize> {
    let mut turn = 0;
    messages
        .iter()
        .map(|m| {
            if !m.assistant && !m.results_only() {
                turn += 1;
            }
            turn
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::api::anthropic_edits::config::ClearInputs;

    fn count(text: &str) -> usize {
        text.len().div_ceil(4)
    }

    fn edit(keep: usize) -> ClearToolUses {
        ClearToolUses {
            trigger: Trigger::InputTokens(100),
            keep,
            clear_at_least: None,
            exclude_tools: vec![],
            clear_tool_inputs: ClearInputs::None,
        }
    }

    /// A tool loop of `n` calls (`read`, then `memory` for the second), odd spacing.
    fn body(n: usize) -> String {
        let mut messages = vec![r#"{"role":"user","content":"start"}"#.to_owned()];
        for i in 0..n {
            let tool = if i == 1 { "memory" } else { "read" };
            messages.push(format!(
                r#"{{"role":"assistant","content":[{{"type":"text","text":"step {i}"}},{{"type":"tool_use","id":"t{i}","name":"{tool}","input":{{"path":"f{i}"}}}}]}}"#
            ));
            messages.push(format!(
                r#"{{"role":"user","content":[ {{"type":"tool_result","tool_use_id":"t{i}","content":"output {i} {}","is_error":false}} ]}}"#,
                "x".repeat(200)
            ));
        }
        format!(r#"{{"model":"m",  "messages":[{}],"max_tokens":5}}"#, messages.join(",\n"))
    }

    fn results(text: &str) -> Vec<Value> {
        let v: Value = serde_json::from_str(text).unwrap();
        let blocks = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default());
        blocks.filter(|b| b["type"] == "tool_result").collect()
    }

    #[test]
    fn old_results_are_cleared_and_pairs_stay() {
        let body = body(5);
        assert!(clear_tool_uses(&body, &edit(3), 100, &count).is_none(), "not past the trigger");
        let (out, applied) = clear_tool_uses(&body, &edit(3), 101, &count).unwrap();
        let r = results(&out);
        assert_eq!(r.len(), 5);
        for (i, result) in r.iter().enumerate() {
            assert_eq!(result["tool_use_id"], format!("t{i}"));
            assert_eq!(result["is_error"], false);
            assert_eq!(result["content"] == CLEARED, i < 2, "{i}");
        }
        let AppliedEdit::ClearToolUses { cleared_tool_uses, cleared_input_tokens } = applied else {
            panic!()
        };
        assert_eq!(cleared_tool_uses, 2);
        assert_eq!(cleared_input_tokens, 2 * (count(&"x".repeat(209)) - count(CLEARED)));
        // Only the cleared contents changed: the rest is byte for byte, inputs too.
        assert!(
            out.starts_with(r#"{"model":"m",  "messages":[{"role":"user","content":"start"},"#)
        );
        assert!(out.ends_with(r#"],"max_tokens":5}"#));
        assert!(out.contains(r#"[ {"type":"tool_result","tool_use_id":"t0","content":"[cleared to save context]","is_error":false} ]"#));
        assert!(
            out.contains(r#"{"type":"tool_use","id":"t0","name":"read","input":{"path":"f0"}}"#)
        );
        assert_eq!(out.len(), body.len() - 2 * (r#"output 0 "#.len() + 200) + 2 * CLEARED.len());
        // Cleared already: nothing more to do; the same input gives the same bytes.
        assert!(clear_tool_uses(&out, &edit(3), 1000, &count).is_none());
        assert_eq!(clear_tool_uses(&body, &edit(3), 101, &count).unwrap().0, out);
    }

    #[test]
    fn excluded_tools_inputs_and_the_minimum() {
        let body = body(5);
        let mut e = edit(1);
        e.exclude_tools = vec!["memory".into()];
        e.clear_tool_inputs = ClearInputs::Tools(vec!["read".into()]);
        let (out, applied) = clear_tool_uses(&body, &e, 1000, &count).unwrap();
        let r = results(&out);
        let cleared: Vec<bool> = r.iter().map(|b| b["content"] == CLEARED).collect();
        assert_eq!(cleared, [true, false, true, true, false]);
        assert!(out.contains(r#"{"type":"tool_use","id":"t0","name":"read","input":{}}"#));
        assert!(out.contains(r#""id":"t1","name":"memory","input":{"path":"f1"}"#));
        assert!(out.contains(r#""id":"t4","name":"read","input":{"path":"f4"}"#), "kept");
        assert!(matches!(applied, AppliedEdit::ClearToolUses { cleared_tool_uses: 3, .. }));

        e.clear_at_least = Some(10_000);
        assert!(clear_tool_uses(&body, &e, 1000, &count).is_none(), "too little to clear");
        e.clear_at_least = Some(50);
        assert!(clear_tool_uses(&body, &e, 1000, &count).is_some());
    }

    #[test]
    fn the_tool_uses_trigger_counts_uses() {
        let mut e = edit(0);
        e.trigger = Trigger::ToolUses(3);
        assert!(clear_tool_uses(&body(3), &e, 0, &count).is_none());
        let (out, _) = clear_tool_uses(&body(4), &e, 0, &count).unwrap();
        assert!(results(&out).iter().all(|b| b["content"] == CLEARED));
    }

    #[test]
    fn bodies_it_does_not_understand_are_left_alone() {
        for body in
            ["", "[]", r#"{"messages":{}}"#, r#"{"messages":[{"role":"system","content":"x"}]}"#]
        {
            assert!(clear_tool_uses(body, &edit(0), 1000, &count).is_none(), "{body}");
            let keep = ClearThinking { keep: ThinkingKeep::Turns(0) };
            assert!(clear_thinking(body, &keep, &count).is_none(), "{body}");
        }
    }

    fn thinking_body() -> String {
        json!({"model": "m", "messages": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "a", "signature": "sa"},
                {"type": "text", "text": "A"}]},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "b", "signature": "sb"},
                {"type": "text", "text": "B"}]},
            {"role": "user", "content": "three"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "only", "signature": "so"}]},
            {"role": "user", "content": "four"},
        ]})
        .to_string()
    }

    #[test]
    fn thinking_of_older_turns_goes_whole() {
        let body = thinking_body();
        let keep = |n| ClearThinking { keep: ThinkingKeep::Turns(n) };
        // Turn 2 (a tool loop of two assistant messages) keeps its thinking with keep 2.
        let (out, applied) = clear_thinking(&body, &keep(2), &count).unwrap();
        assert_eq!(
            applied,
            AppliedEdit::ClearThinking {
                cleared_thinking_turns: 1,
                cleared_input_tokens: count(
                    r#"{"type":"thinking","thinking":"a","signature":"sa"}"#
                )
            }
        );
        assert!(out.contains(r#"{"role":"assistant","content":[{"type":"text","text":"A"}]}"#));
        assert!(out.contains(r#"{"type":"redacted_thinking","data":"opaque"}"#));
        assert!(out.contains(r#"{"type":"thinking","thinking":"b","signature":"sb"}"#));
        // keep 1: turn 2 goes too, both of its messages; a thinking-only message stays.
        let (out, applied) = clear_thinking(&body, &keep(1), &count).unwrap();
        assert!(matches!(applied, AppliedEdit::ClearThinking { cleared_thinking_turns: 2, .. }));
        assert!(!out.contains("opaque") && !out.contains(r#""sb""#) && !out.contains(r#""sa""#));
        assert!(out.contains(r#"{"type":"thinking","thinking":"only","signature":"so"}"#));
        // keep 0 clears nothing more (the last turn's only block stays); "all" nothing.
        assert_eq!(clear_thinking(&body, &keep(0), &count).unwrap().0, out);
        assert!(
            clear_thinking(&body, &ClearThinking { keep: ThinkingKeep::All }, &count).is_none()
        );
        assert!(clear_thinking(&out, &keep(1), &count).is_none());
        assert_eq!(clear_thinking(&body, &keep(1), &count).unwrap().0, out, "deterministic");
    }
}
