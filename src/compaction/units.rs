//! Units and turns: where a conversation may be cut.
//!
//! A unit is a run of messages that must stay together: an assistant message that calls
//! tools (or a legacy function) with the tool/function messages right after it that
//! answer it, an assistant message that issued a command as text with the tool output
//! a text-mode agent sent back as `user` ([`is_observation`]), or any other single
//! message. Results are paired with calls by position
//! (the nearest preceding assistant message), never by a global id: agents reuse ids
//! across turns. Every unit boundary is a safe cut. A turn starts at a user message.

use std::sync::Arc;

use crate::model::{Message, Role, is_observation};

/// What a unit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// A `system` or `developer` message.
    Pinned,
    /// A user message written by the user (not a digest).
    User,
    /// An assistant message with calls and the results answering them (or a text-mode
    /// command and its output).
    Calls,
    /// An assistant message without calls.
    Assistant,
    /// A digest written by foldgate that came back in the history.
    Digest,
    /// Anything else (a result without a call, an unknown role).
    Other,
}

/// A run of messages `[start, end)` that is never split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// First message index.
    pub start: usize,
    /// One past the last message index.
    pub end: usize,
    /// What it holds.
    pub kind: UnitKind,
}

/// Splits messages into units.
pub fn units(msgs: &[Arc<Message>]) -> Vec<Unit> {
    // At most one unit per message; sized at once for a long history.
    let mut out = Vec::with_capacity(msgs.len());
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        let role = m.role();
        let (kind, end) = if m.is_digest() {
            (UnitKind::Digest, i + 1)
        } else if role.is_pinned() {
            (UnitKind::Pinned, i + 1)
        } else if role == Role::User {
            // An observation is taken with the command before it, never reached here.
            (UnitKind::User, i + 1)
        } else if m.makes_calls() {
            let mut j = i + 1;
            while j < msgs.len() && msgs[j].role().is_tool_result() {
                j += 1;
            }
            (UnitKind::Calls, j)
        } else if role == Role::Assistant && is_observation(msgs, i + 1) {
            (UnitKind::Calls, i + 2)
        } else if role == Role::Assistant {
            (UnitKind::Assistant, i + 1)
        } else {
            (UnitKind::Other, i + 1)
        };
        out.push(Unit { start: i, end, kind });
        i = end;
    }
    out
}

/// Start of the kept tail: the last `keep_turns` turns, or from the first turn when
/// there are fewer; with no user message at all, the last unit.
pub fn turn_tail_start(units: &[Unit], keep_turns: usize) -> usize {
    let starts: Vec<usize> =
        units.iter().filter(|u| u.kind == UnitKind::User).map(|u| u.start).collect();
    if starts.is_empty() {
        return units.last().map_or(0, |u| u.start);
    }
    let k = keep_turns.max(1);
    if starts.len() >= k { starts[starts.len() - k] } else { starts[0] }
}

/// A deeper tail start inside long live turns: when more than `keep_groups` tool groups
/// follow `from`, the start of the last `keep_groups` of them; otherwise `from`.
pub fn group_tail_start(units: &[Unit], from: usize, keep_groups: usize) -> usize {
    let groups: Vec<usize> = units
        .iter()
        .filter(|u| u.start >= from && u.kind == UnitKind::Calls)
        .map(|u| u.start)
        .collect();
    let k = keep_groups.max(1);
    if groups.len() > k { groups[groups.len() - k] } else { from }
}

/// True if `index` is a unit boundary (0 and `len` included).
pub fn is_boundary(units: &[Unit], index: usize) -> bool {
    index == 0 || units.iter().any(|u| u.end == index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::model::messages_from as msgs;

    fn call(id: &str) -> serde_json::Value {
        json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function","function":{"name":"f","arguments":"{}"}}]})
    }

    #[test]
    fn groups_results_with_the_nearest_call_even_when_ids_repeat() {
        let m = msgs(json!([
            {"role":"system","content":"s"},
            {"role":"user","content":"u1"},
            call("c1"), {"role":"tool","tool_call_id":"c1","content":"r"},
            {"role":"user","content":"u2"},
            call("c1"), {"role":"tool","tool_call_id":"c1","content":"r2"},
            {"role":"assistant","content":"done"}
        ]));
        let u = units(&m);
        let kinds: Vec<UnitKind> = u.iter().map(|u| u.kind).collect();
        use UnitKind::*;
        assert_eq!(kinds, vec![Pinned, User, Calls, User, Calls, Assistant]);
        assert_eq!((u[2].start, u[2].end), (2, 4));
        assert_eq!((u[4].start, u[4].end), (5, 7));
        assert_eq!(turn_tail_start(&u, 1), 4);
        assert_eq!(turn_tail_start(&u, 5), 1);
        assert!(is_boundary(&u, 4) && !is_boundary(&u, 3));
    }

    #[test]
    fn live_turn_keeps_last_groups() {
        let mut v = vec![json!({"role":"user","content":"task"})];
        for i in 0..6 {
            v.push(call(&format!("c{i}")));
            v.push(json!({"role":"tool","tool_call_id":format!("c{i}"),"content":"ok"}));
        }
        let m = msgs(serde_json::Value::Array(v));
        let u = units(&m);
        let t0 = turn_tail_start(&u, 2);
        assert_eq!(t0, 0);
        assert_eq!(group_tail_start(&u, t0, 2), 9);
        assert_eq!(group_tail_start(&u, t0, 6), 0);
    }
}
