//! The guarantees of a forwarded request, checked against its original. Used by the
//! property tests and by `foldgate replay`.
//!
//! 1. Valid: every tool/function message answers a call of the assistant message right
//!    before its run of results, and every call is answered.
//! 2. Every user message (the user's words: not a digest, not a text-mode tool output)
//!    of at most `user_verbatim_max_tokens` tokens is present verbatim
//!    and in order, whenever it and every such message no larger than it take at most
//!    `floor_max_ratio` of the budget together and fit beside the pinned messages and the
//!    last user message ([`SmallGuarantee`]).
//! 3. Pinned (`system`/`developer`) messages are unchanged and in order.
//! 4. The forwarded prompt fits `window - reserve` whenever the pinned messages and the
//!    last user message fit.
//! 5. The current turn (the messages from the last user message on) is forwarded intact,
//!    at the end, whenever it fits beside the pinned messages, the tool definitions and
//!    the small user messages that (2) guarantees.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::budget::Budget;
use super::steer::{Pins, pinned_units};
use super::tokens::{Counter, REPLY_PRIMING, TokenCache};
use super::units::units;
use crate::config::CompactionConfig;
use crate::model::{ChatRequest, Message, Role, call_parts, is_user_words};

/// One broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which guarantee (1 to 5).
    pub check: u8,
    /// What is wrong.
    pub detail: String,
}

/// Checks guarantees 1-5 of `forwarded` against `original`.
pub fn verify(
    original: &ChatRequest,
    forwarded: &ChatRequest,
    cfg: &CompactionConfig,
    budget: &Budget,
    cache: &mut TokenCache,
) -> Vec<Violation> {
    verify_pinned(original, forwarded, cfg, budget, cache, None)
}

/// [`verify`] for a request planned with pin patterns: the messages they pin (with
/// their units) are forwarded byte for byte and in order (guarantee 3), and take room
/// like the pinned system messages (guarantees 2 and 5).
pub fn verify_pinned(
    original: &ChatRequest,
    forwarded: &ChatRequest,
    cfg: &CompactionConfig,
    budget: &Budget,
    cache: &mut TokenCache,
    pins: Option<&Pins>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let orig = original.messages();
    let fwd = forwarded.messages();
    let mut counter = Counter { encoding: budget.encoding, cache };

    if validity(orig).is_none() {
        if let Some(detail) = validity(fwd) {
            out.push(Violation { check: 1, detail });
        }
    }
    let pattern = pinned_units(pins, orig, &units(orig));
    let essentials = Essentials::of(original, &pattern, &mut counter);
    let (guaranteed, missing) = check_user_words(orig, fwd, cfg, budget, &essentials, &mut counter);
    out.extend(missing);
    out.extend(check_pinned(fwd, &essentials.pinned));
    let by_pattern: Vec<&Arc<Message>> =
        orig.iter().zip(&pattern).filter(|(_, p)| **p).map(|(m, _)| m).collect();
    if let Some(missing) = first_missing_subsequence(&by_pattern, fwd) {
        out.push(Violation {
            check: 3,
            detail: format!("pinned message {missing} not forwarded byte for byte in order"),
        });
    }
    if let Some(start) = essentials.last_user {
        let besides = essentials.fixed + guaranteed.tokens + essentials.pattern_before(start);
        out.extend(check_current_turn(orig, fwd, start, besides, budget, &mut counter));
    }
    if essentials.tokens <= budget.budget {
        out.extend(check_fits(fwd, essentials.fixed, budget, &mut counter));
    }
    out
}

/// What every forwarded request must hold: the tool definitions and reply priming, the
/// pinned messages and the last user message.
struct Essentials<'o> {
    /// Tokens of the tool definitions and the reply priming.
    fixed: usize,
    /// The original's pinned messages, in order.
    pinned: Vec<&'o Arc<Message>>,
    /// Index of the original's last user message (the user's words), if any.
    last_user: Option<usize>,
    /// Tokens of all of them together (and of the messages pin patterns pin).
    tokens: usize,
    /// Tokens of each message a pin pattern pins, by index (0 for the others).
    pattern: Vec<usize>,
}

impl<'o> Essentials<'o> {
    /// The essentials of `original`, counted, with the messages `pattern` flags.
    fn of(original: &'o ChatRequest, pattern: &[bool], counter: &mut Counter<'_>) -> Self {
        let orig = original.messages();
        let fixed = counter.tools(original.tools_raw()) + REPLY_PRIMING;
        let pinned: Vec<&Arc<Message>> = orig.iter().filter(|m| m.role().is_pinned()).collect();
        let pinned_tokens: usize = pinned.iter().map(|m| counter.message(m)).sum();
        let pattern: Vec<usize> = (orig.iter().zip(pattern))
            .map(|(m, &p)| if p { counter.message(m) } else { 0 })
            .collect();
        let last_user = (0..orig.len()).rfind(|&i| is_user_words(orig, i));
        let last_user_tokens = last_user.map_or(0, |i| counter.message(&orig[i]));
        let tokens = fixed + pinned_tokens + last_user_tokens + pattern.iter().sum::<usize>();
        Self { fixed, pinned, last_user, tokens, pattern }
    }

    /// Tokens of the messages pin patterns pin before message `start`.
    fn pattern_before(&self, start: usize) -> usize {
        self.pattern.iter().take(start).sum()
    }
}

/// Guarantee 2: which small user messages are guaranteed, and the violation when one of
/// them (or the last user message) is not forwarded verbatim and in order.
fn check_user_words(
    orig: &[Arc<Message>],
    fwd: &[Arc<Message>],
    cfg: &CompactionConfig,
    budget: &Budget,
    essentials: &Essentials<'_>,
    counter: &mut Counter<'_>,
) -> (SmallGuarantee, Option<Violation>) {
    let last_user = essentials.last_user;
    let small: Vec<(usize, &Arc<Message>, usize)> = orig
        .iter()
        .enumerate()
        .filter(|(i, _)| is_user_words(orig, *i))
        .map(|(i, m)| (i, m, counter.message(m)))
        .filter(|(_, _, t)| *t <= cfg.user_verbatim_max_tokens)
        .collect();
    let sizes = small.iter().filter(|(i, _, _)| Some(*i) != last_user).map(|(_, _, t)| *t);
    let room = budget.budget.saturating_sub(essentials.tokens);
    let floor = budget.floor.saturating_sub(essentials.pattern.iter().sum::<usize>());
    let guaranteed = SmallGuarantee::of(sizes, floor, room);
    let wanted: Vec<&Arc<Message>> = small
        .iter()
        .filter(|(i, _, t)| Some(*i) == last_user || guaranteed.covers(*t))
        .map(|(_, m, _)| *m)
        .collect();
    let violation = first_missing_subsequence(&wanted, fwd).map(|missing| Violation {
        check: 2,
        detail: format!("user message {missing} not kept verbatim in order"),
    });
    (guaranteed, violation)
}

/// Guarantee 3: the forwarded pinned messages are the original's `pinned`, unchanged and
/// in order.
fn check_pinned(fwd: &[Arc<Message>], pinned: &[&Arc<Message>]) -> Option<Violation> {
    let fwd_pinned: Vec<&Arc<Message>> = fwd.iter().filter(|m| m.role().is_pinned()).collect();
    let same = fwd_pinned.len() == pinned.len()
        && fwd_pinned.iter().zip(pinned).all(|(a, b)| a.raw() == b.raw());
    (!same).then(|| Violation {
        check: 3,
        detail: "pinned messages changed, dropped or reordered".to_owned(),
    })
}

/// Guarantee 5: the current turn (the original's messages from `start`, its last user
/// message, on) ends the forwarded request intact, whenever it fits the budget beside the
/// pinned messages before it and `besides` tokens (tools, priming, guaranteed messages).
fn check_current_turn(
    orig: &[Arc<Message>],
    fwd: &[Arc<Message>],
    start: usize,
    besides: usize,
    budget: &Budget,
    counter: &mut Counter<'_>,
) -> Option<Violation> {
    let turn = &orig[start..];
    // Pinned messages inside the turn are counted once, with the turn.
    let pinned_before: usize =
        orig[..start].iter().filter(|m| m.role().is_pinned()).map(|m| counter.message(m)).sum();
    let turn_tokens: usize = turn.iter().map(|m| counter.message(m)).sum();
    if besides + pinned_before + turn_tokens > budget.budget {
        return None;
    }
    let intact = fwd.len() >= turn.len()
        && fwd[fwd.len() - turn.len()..]
            .iter()
            .zip(turn)
            .all(|(a, b)| a.hash() == b.hash() && a.raw() == b.raw());
    (!intact).then(|| Violation {
        check: 5,
        detail: format!(
            "the current turn ({} messages, {turn_tokens} tokens) was altered",
            turn.len()
        ),
    })
}

/// Guarantee 4: the forwarded prompt (its messages and `fixed` tokens) fits the budget.
fn check_fits(
    fwd: &[Arc<Message>],
    fixed: usize,
    budget: &Budget,
    counter: &mut Counter<'_>,
) -> Option<Violation> {
    let after = fixed + fwd.iter().map(|m| counter.message(m)).sum::<usize>();
    (after > budget.budget).then(|| Violation {
        check: 4,
        detail: format!("{after} tokens exceed the budget of {}", budget.budget),
    })
}

/// Which small user messages guarantee (2) covers: the smallest ones first, as many as
/// take at most the floor together and fit the room left beside the essentials. A
/// message is covered when every small user message no larger than it fits with it, so
/// a few large pastes that pass the floor never take the guarantee from short messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmallGuarantee {
    /// Messages up to this many tokens are covered (`None`: none is).
    pub max_tokens: Option<usize>,
    /// Tokens of the covered messages together.
    pub tokens: usize,
}

impl SmallGuarantee {
    /// The guarantee over small user messages of `sizes` tokens (the last user message
    /// excluded), under `floor` and within `room`.
    pub fn of(sizes: impl Iterator<Item = usize>, floor: usize, room: usize) -> Self {
        let mut sizes: Vec<usize> = sizes.collect();
        sizes.sort_unstable();
        let cap = floor.min(room);
        let mut out = Self::default();
        let mut sum = 0;
        let mut i = 0;
        while i < sizes.len() {
            let size = sizes[i];
            while i < sizes.len() && sizes[i] == size {
                sum += size;
                i += 1;
            }
            if sum > cap {
                break;
            }
            out = Self { max_tokens: Some(size), tokens: sum };
        }
        out
    }

    /// True when a small user message of `tokens` tokens is covered.
    pub fn covers(&self, tokens: usize) -> bool {
        self.max_tokens.is_some_and(|max| tokens <= max)
    }
}

/// The first message of `wanted` (by index in `wanted`) that is not found, in order and
/// verbatim, in `haystack`.
fn first_missing_subsequence(wanted: &[&Arc<Message>], haystack: &[Arc<Message>]) -> Option<usize> {
    let mut it = haystack.iter();
    for (k, w) in wanted.iter().enumerate() {
        if !it.any(|h| h.hash() == w.hash() && h.raw() == w.raw()) {
            return Some(k);
        }
    }
    None
}

/// Why `msgs` is not a valid tool-call sequence, or `None` if it is.
pub fn validity(msgs: &[Arc<Message>]) -> Option<String> {
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        if m.role().is_tool_result() {
            return Some(format!("message {i} answers no call"));
        }
        if m.makes_calls() {
            let mut open: HashMap<&str, usize> = HashMap::new();
            for call in m.tool_calls() {
                *open.entry(call_parts(call).0).or_default() += 1;
            }
            let legacy = m.function_call().is_some();
            let mut function_answered = false;
            let mut j = i + 1;
            while j < msgs.len() && msgs[j].role().is_tool_result() {
                let r = &msgs[j];
                if r.role() == Role::Function {
                    if !legacy || function_answered {
                        return Some(format!("message {j} answers no function call"));
                    }
                    function_answered = true;
                } else {
                    let id = r.tool_call_id().unwrap_or("");
                    match open.get_mut(id) {
                        Some(n) if *n > 0 => *n -= 1,
                        _ => return Some(format!("message {j} answers no call of message {i}")),
                    }
                }
                j += 1;
            }
            if open.values().any(|&n| n > 0) || (legacy && !function_answered) {
                return Some(format!("a call of message {i} is not answered"));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    None
}
