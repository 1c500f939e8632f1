//! Every change a request's compaction made to its messages, read off the final plan:
//! which original messages were stubbed, folded into a digest or not forwarded at all,
//! their tokens before and after, and the tier each change belongs to. The report
//! carries them so that whoever looks at a request (the inspector, logs) sees what was
//! taken out, not only how much.
//!
//! A tier number means one thing: 1 a tool output stubbed, 2 messages folded into a
//! digest, 3 turns batched into a goal history, 4 messages forwarded in no form.

use std::sync::Arc;

use serde::Serialize;

use super::blocks::FoldBlock;
use super::plan::{Item, Kind, Plan};
use super::tokens::Counter;
use crate::model::Message;
pub use crate::vocab::ChangeKind;
use crate::vocab::Tier;

/// At most this many characters of a stub or digest are quoted in a change.
pub const QUOTE_MAX_CHARS: usize = 240;

/// One change to the original messages `start..end`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// What was done.
    pub kind: ChangeKind,
    /// The tier it belongs to.
    pub tier: Tier,
    /// First original message changed.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Tokens of those messages as the client sent them (for a fold: of the messages
    /// the digest stands for, without those it keeps verbatim).
    pub tokens_before: usize,
    /// Tokens forwarded in their place (the stub, the digest; 0 when dropped).
    pub tokens_after: usize,
    /// The start of the stub or digest forwarded in their place.
    pub text: Option<String>,
}

/// The changes `plan` makes to `msgs` (of `tokens` each), given the fold `blocks` it
/// was built on; in the order of the messages. Consecutive drops are one change.
pub fn changes(
    plan: &Plan,
    blocks: &[FoldBlock],
    msgs: &[Arc<Message>],
    tokens: &[usize],
    counter: &mut Counter<'_>,
) -> Vec<Change> {
    let mut out: Vec<Change> = Vec::new();
    for item in &plan.items {
        match (item.kind, item.dropped) {
            (Kind::Digest, dropped) => {
                let Some(block) = blocks.iter().find(|b| b.start == item.pos) else { continue };
                out.push(digest_change(item, block, tokens, dropped));
            }
            (_, true) if item.originals > 0 => {
                let (start, end) = (item.pos, item.pos + item.originals);
                let before = tokens.get(start..end).map_or(0, |t| t.iter().sum());
                match out.last_mut() {
                    Some(last) if last.kind == ChangeKind::Dropped && last.end == start => {
                        last.end = end;
                        last.tokens_before += before;
                    }
                    _ => out.push(dropped(start, end, before)),
                }
            }
            _ if item.elided > 0 => elisions(item, msgs, tokens, counter, &mut out),
            _ => {}
        }
    }
    out
}

/// The tier a request's cuts reach: 4 when a message went in no form, 1 when a tool
/// output was only stubbed, else 0.
pub fn cut_tier(changes: &[Change]) -> Tier {
    let cut = |kind| changes.iter().any(|c| c.kind == kind);
    if cut(ChangeKind::Dropped) {
        Tier::Fallback
    } else if cut(ChangeKind::Elided) {
        Tier::Elide
    } else {
        Tier::Reuse
    }
}

fn dropped(start: usize, end: usize, tokens_before: usize) -> Change {
    Change {
        kind: ChangeKind::Dropped,
        tier: Tier::Fallback,
        start,
        end,
        tokens_before,
        tokens_after: 0,
        text: None,
    }
}

/// A fold block's digest item: the block's range folded, or, when the fallback dropped
/// the digest, its messages gone.
fn digest_change(item: &Item, block: &FoldBlock, tokens: &[usize], dropped: bool) -> Change {
    let folded: usize =
        block.folded_indices(block.end).map(|i| tokens.get(i).copied().unwrap_or(0)).sum();
    let tier = if block.goal_batch { Tier::GoalBatch } else { Tier::Fold };
    let text = item.msgs.first().map(|m| quote(&m.text()));
    let (kind, tier, tokens_after) = match dropped {
        true => (ChangeKind::Dropped, Tier::Fallback, 0),
        false => (ChangeKind::Folded, tier, item.tokens),
    };
    Change {
        kind,
        tier,
        start: block.start,
        end: block.end,
        tokens_before: folded,
        tokens_after,
        text,
    }
}

/// Each message of `item` forwarded as a stub instead of as sent.
fn elisions(
    item: &Item,
    msgs: &[Arc<Message>],
    tokens: &[usize],
    counter: &mut Counter<'_>,
    out: &mut Vec<Change>,
) {
    for (k, forwarded) in item.msgs.iter().enumerate().take(item.originals) {
        let at = item.pos + k;
        let Some(original) = msgs.get(at) else { break };
        if original.hash() == forwarded.hash() && original.raw() == forwarded.raw() {
            continue;
        }
        out.push(Change {
            kind: ChangeKind::Elided,
            tier: Tier::Elide,
            start: at,
            end: at + 1,
            tokens_before: tokens.get(at).copied().unwrap_or(0),
            tokens_after: counter.message(forwarded),
            text: Some(quote(&forwarded.text())),
        });
    }
}

/// The first [`QUOTE_MAX_CHARS`] characters of `text`, an ellipsis after a cut.
pub(super) fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_MAX_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
