//! The working plan: the forwarded conversation as a list of items, and the cheap tiers
//! that edit it (elide and the fallback cut: stubs are tier 1, drops tier 4).
//!
//! An item is what is kept or dropped as a whole: a pinned message, a user message, one
//! unit of work (an assistant message with the results answering its calls), or a
//! digest. Dropping whole items can never separate a call from its result.

use std::cmp::Reverse;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

use super::blocks::{CutItem, FoldBlock};
use super::keep::{Keep, UserClass};
use super::tokens::Counter;
use super::units::{Unit, UnitKind};
use crate::model::{Message, ModelError, Role, call_parts};

/// What an item is, for the fallback's order of sacrifice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Pinned: never dropped.
    Pinned,
    /// A small user message (kept verbatim while it fits).
    User,
    /// The task statement (first user message): dropped only after every other user message.
    Task,
    /// The last user message: never dropped.
    LastUser,
    /// A digest of a fold block.
    Digest,
    /// Assistant and tool work, or a large user message.
    Work,
}

/// One item of the plan.
#[derive(Debug, Clone)]
pub struct Item {
    /// The messages it forwards (shared: a plan is cloned for every candidate priced).
    pub msgs: Arc<[Arc<Message>]>,
    /// Their tokens.
    pub tokens: usize,
    /// What it is.
    pub kind: Kind,
    /// Original index of its first message (for block items: of the block's start).
    pub pos: usize,
    /// Original messages it forwards verbatim or elided.
    pub originals: usize,
    /// Of those, how many were elided.
    pub elided: usize,
    /// For a digest: original messages it folds.
    pub folds: usize,
    /// Dropped by the fallback.
    pub dropped: bool,
}

/// The plan: items plus fixed costs (tool definitions, reply priming).
#[derive(Debug, Clone)]
pub struct Plan {
    /// Items in forwarding order.
    pub items: Vec<Item>,
    /// Tokens outside the messages.
    pub fixed: usize,
}

impl Plan {
    /// Builds the plan: stored blocks, then original messages from `from` on, as units.
    pub fn build(
        blocks: &[FoldBlock],
        msgs: &[Arc<Message>],
        units: &[Unit],
        tokens: &[usize],
        fixed: usize,
        keep: &Keep<'_>,
        counter: &mut Counter<'_>,
    ) -> Result<Self, ModelError> {
        // Sized at once (at most one item per block message and per unit): a long
        // history's plan would otherwise be copied as it grows.
        let block_messages: usize = blocks.iter().map(|b| b.messages.len()).sum();
        let mut items = Vec::with_capacity(block_messages + units.len());
        for b in blocks {
            let n_verbatim = b.verbatim.len();
            for (k, raw) in b.messages.iter().enumerate() {
                let pos = b.verbatim.get(k).copied().unwrap_or(b.start);
                // A verbatim message is the original's exact text (the block matched its
                // range): reuse the parsed original and its count instead of parsing and
                // counting the copy again.
                let (m, n) = match msgs.get(pos).filter(|o| k < n_verbatim && o.raw() == raw.get())
                {
                    Some(original) => (original.clone(), tokens[pos]),
                    None => {
                        let m = Arc::new(Message::from_raw(raw.clone())?);
                        let n = counter.message(&m);
                        (m, n)
                    }
                };
                // A verbatim user message is classed by this request's rules: the last
                // user message of an earlier request may be a large one by now.
                let (kind, originals, folds) = if k >= n_verbatim {
                    (Kind::Digest, 0, (b.end - b.start).saturating_sub(n_verbatim))
                } else if keep.is_pinned(msgs, pos) {
                    (Kind::Pinned, 1, 0)
                } else {
                    let kind = match keep.class(msgs, pos, tokens[pos]) {
                        Some(UserClass::Task) => Kind::Task,
                        Some(UserClass::Small) => Kind::User,
                        _ => Kind::Work,
                    };
                    (kind, 1, 0)
                };
                items.push(Item {
                    msgs: Arc::from([m]),
                    tokens: n,
                    kind,
                    pos,
                    originals,
                    elided: 0,
                    folds,
                    dropped: false,
                });
            }
        }
        let from = blocks.last().map_or(0, |b| b.end);
        for u in units.iter().filter(|u| u.start >= from) {
            let kind = match u.kind {
                _ if keep.is_pinned(msgs, u.start) => Kind::Pinned,
                UnitKind::Pinned => Kind::Pinned,
                UnitKind::User => match keep.class(msgs, u.start, tokens[u.start]) {
                    Some(UserClass::Task) => Kind::Task,
                    Some(UserClass::Small) => Kind::User,
                    _ => Kind::Work,
                },
                _ => Kind::Work,
            };
            items.push(Item {
                msgs: Arc::from(&msgs[u.start..u.end]),
                tokens: tokens[u.start..u.end].iter().sum(),
                kind,
                pos: u.start,
                originals: u.end - u.start,
                elided: 0,
                folds: 0,
                dropped: false,
            });
        }
        let mut plan = Self { items, fixed };
        plan.mark_last_user(msgs, keep);
        Ok(plan)
    }

    /// Marks the item holding the conversation's last user message (wherever it is).
    fn mark_last_user(&mut self, msgs: &[Arc<Message>], keep: &Keep<'_>) {
        let Some(last) = keep.last_user else { return };
        let hash = msgs[last].hash();
        if let Some(item) = self.items.iter_mut().rev().find(|i| {
            i.msgs.len() == 1 && i.msgs[0].role() == Role::User && i.msgs[0].hash() == hash
        }) {
            item.kind = Kind::LastUser;
        }
    }

    /// Prompt tokens of what is currently planned.
    pub fn total(&self) -> usize {
        self.fixed + self.items.iter().filter(|i| !i.dropped).map(|i| i.tokens).sum::<usize>()
    }

    /// The forwarded messages.
    pub fn messages(&self) -> Vec<Arc<Message>> {
        self.items.iter().filter(|i| !i.dropped).flat_map(|i| i.msgs.iter().cloned()).collect()
    }

    /// The forwarded messages, with the original position each item starts at.
    pub fn forwarded(&self) -> Forwarded {
        let mut forwarded = Forwarded::default();
        for item in self.items.iter().filter(|i| !i.dropped) {
            forwarded.starts.push((item.pos, forwarded.messages.len()));
            forwarded.messages.extend(item.msgs.iter().cloned());
        }
        forwarded
    }

    /// What this plan cuts of the original messages it forwards (units after the
    /// blocks, and the messages the blocks keep verbatim): dropped, or with stubbed
    /// results, to be reapplied by [`Plan::apply_cut`].
    pub fn cut_items(&self, msgs: &[Arc<Message>]) -> Result<Vec<CutItem>, ModelError> {
        let mut out = Vec::new();
        for it in &self.items {
            if it.kind == Kind::Digest && it.dropped {
                out.push(CutItem { pos: it.pos, hash: it.msgs[0].hash(), messages: None });
                continue;
            }
            if it.originals == 0 || !(it.dropped || it.elided > 0) {
                continue;
            }
            let messages = if it.dropped {
                None
            } else {
                let raw: Result<Vec<_>, _> = it
                    .msgs
                    .iter()
                    .map(|m| {
                        RawValue::from_string(m.raw().to_owned()).map_err(ModelError::Serialize)
                    })
                    .collect();
                Some(raw?)
            };
            out.push(CutItem { pos: it.pos, hash: msgs[it.pos].hash(), messages });
        }
        Ok(out)
    }

    /// This plan with a stored `cut` applied, or `None` when the cut no longer fits the
    /// history (a message it cut changed, is gone or was folded since) or touches the
    /// protected turn (from original index `protect` on).
    pub fn apply_cut(
        &self,
        cut: &[CutItem],
        msgs: &[Arc<Message>],
        protect: Option<usize>,
        counter: &mut Counter<'_>,
    ) -> Result<Option<Self>, ModelError> {
        let mut out = self.clone();
        for c in cut {
            if protect.is_some_and(|p| c.pos >= p) {
                return Ok(None);
            }
            let found = out.items.iter_mut().find(|it| {
                let digest = it.kind == Kind::Digest && it.msgs[0].hash() == c.hash;
                let original =
                    it.originals > 0 && msgs.get(c.pos).is_some_and(|m| m.hash() == c.hash);
                it.pos == c.pos && (digest || original)
            });
            let Some(item) = found else { return Ok(None) };
            match &c.messages {
                None => item.dropped = true,
                Some(raw) => {
                    let new: Vec<Arc<Message>> = raw
                        .iter()
                        .map(|r| Message::from_raw(r.clone()).map(Arc::new))
                        .collect::<Result<_, _>>()?;
                    if new.len() != item.msgs.len() {
                        return Ok(None);
                    }
                    item.elided = new
                        .iter()
                        .zip(item.msgs.iter())
                        .filter(|(a, b)| a.hash() != b.hash())
                        .count();
                    item.tokens = new.iter().map(|m| counter.message(m)).sum();
                    item.msgs = new.into();
                }
            }
        }
        Ok(Some(out))
    }

    /// Tier 1: stubs tool results over `min_tokens` in work items before original index
    /// `before`, oldest first, until `target` is met. Returns whether anything changed.
    pub fn elide_before(
        &mut self,
        before: usize,
        min_tokens: usize,
        target: usize,
        counter: &mut Counter<'_>,
    ) -> Result<bool, ModelError> {
        let mut total = self.total();
        let mut changed = false;
        for i in 0..self.items.len() {
            if total <= target {
                break;
            }
            let it = &self.items[i];
            if it.kind == Kind::Work && it.pos < before && !it.dropped {
                let saved = self.elide_item(i, min_tokens, counter)?;
                changed |= saved.is_some();
                total -= saved.unwrap_or(0);
            }
        }
        Ok(changed)
    }

    /// Replaces the content of every tool result over `min_tokens` in item `i` by a stub.
    /// Returns the tokens saved, or `None` when nothing changed.
    fn elide_item(
        &mut self,
        i: usize,
        min_tokens: usize,
        counter: &mut Counter<'_>,
    ) -> Result<Option<usize>, ModelError> {
        let item = &self.items[i];
        let caller = item.msgs.first().filter(|m| m.makes_calls()).cloned();
        // Copied when the first message is stubbed.
        let mut new_msgs: Option<Vec<Arc<Message>>> = None;
        for (k, m) in item.msgs.iter().enumerate() {
            // Inside a work item, a `user` message after the first is a text-mode tool
            // output (units pair it with its command).
            let result = m.role().is_tool_result() || (k > 0 && m.role() == Role::User);
            if !result || m.text().starts_with(STUB_PREFIX) {
                continue;
            }
            let t = counter.message(m);
            if t <= min_tokens {
                continue;
            }
            let name = tool_name(caller.as_deref(), m, k.saturating_sub(1));
            let stubbed = Arc::new(stub(m, &name, t)?);
            new_msgs.get_or_insert_with(|| item.msgs.to_vec())[k] = stubbed;
        }
        let Some(new_msgs) = new_msgs else { return Ok(None) };
        let elided =
            new_msgs.iter().zip(item.msgs.iter()).filter(|(a, b)| a.hash() != b.hash()).count();
        let tokens: usize = new_msgs.iter().map(|m| counter.message(m)).sum();
        let item = &mut self.items[i];
        let saved = item.tokens.saturating_sub(tokens);
        item.elided += elided;
        item.msgs = new_msgs.into();
        item.tokens = tokens;
        Ok(Some(saved))
    }

    /// Stubs large tool results of the work items `pred` selects, oldest first, until
    /// `goal` is met; `total` is the running prompt size.
    fn elide_where(
        &mut self,
        goal: usize,
        min_tokens: usize,
        total: &mut usize,
        counter: &mut Counter<'_>,
        pred: impl Fn(usize, &Item) -> bool,
    ) -> Result<(), ModelError> {
        for i in 0..self.items.len() {
            if *total <= goal {
                break;
            }
            let it = &self.items[i];
            if it.kind == Kind::Work && !it.dropped && pred(i, it) {
                *total -= self.elide_item(i, min_tokens, counter)?.unwrap_or(0);
            }
        }
        Ok(())
    }

    /// Tier 4: drops and stubs until the prompt fits, keeping pinned messages, the last
    /// user message, the small user messages while they take at most `floor`, and the
    /// current turn (from original index `protect` on) untouched when it is given. In
    /// order, each step stopping once its goal is met:
    /// 1. stub large tool results before the current turn (goal: `target`);
    /// 2. drop work older than the last user message, then, while the small user messages
    ///    take more than `floor`, the largest of them, then digests, oldest first (`target`);
    /// 3. stub every remaining tool result outside the protected turn (goal: `limit`);
    /// 4. drop work after the last user message, oldest first, then the digests there,
    ///    unless protected (`limit`);
    /// 5. drop the task statement if it is larger than `small_max`, then small user
    ///    messages and the task statement, the largest first (`limit`);
    /// 6. steps 3 and 4 without protection (`limit`), which only a turn that was
    ///    wrongly judged to fit can reach.
    ///
    /// Each step is one pass over the items: linear in their number. Returns whether
    /// anything was stubbed or dropped.
    pub fn fallback(
        &mut self,
        goals: Goals,
        protect: Option<usize>,
        counter: &mut Counter<'_>,
    ) -> Result<bool, ModelError> {
        let before = self.cuts();
        let Goals { target, limit, floor, small_max, min_tokens } = goals;
        let n = self.items.len();
        let last_user =
            self.items.iter().position(|i| i.kind == Kind::LastUser).unwrap_or(n.saturating_sub(1));
        let open = |it: &Item| protect.is_none_or(|p| it.pos < p);
        let mut total = self.total();
        self.elide_where(target, min_tokens, &mut total, counter, |i, it| i + 1 < n && open(it))?;
        self.drop_where(target, |i, it| i < last_user && it.kind == Kind::Work);
        // Past the floor, small user messages go before the digests do: the largest
        // first, so that pastes go before short instructions.
        self.drop_largest_first(target, floor, |it| it.kind == Kind::User);
        self.drop_where(target, |i, it| i < last_user && it.kind == Kind::Digest);
        let cut_turn = |plan: &mut Self, counter: &mut Counter<'_>, guarded: bool| {
            let allowed = |it: &Item| !guarded || open(it);
            let mut total = plan.total();
            plan.elide_where(limit, 0, &mut total, counter, |_, it| allowed(it))?;
            // Work before digests: a digest holds the trail of all the work it folded in
            // a few tokens, and it comes first, so dropping it rewrites more of the
            // prompt the provider has cached.
            plan.drop_where(limit, |i, it| i > last_user && it.kind == Kind::Work && allowed(it));
            plan.drop_where(limit, |i, it| i > last_user && it.kind == Kind::Digest && allowed(it));
            Ok::<(), ModelError>(())
        };
        cut_turn(self, counter, true)?;
        // A task statement larger than a small user message is not among the guaranteed
        // ones: it goes first; a small one goes with the small user messages, the
        // largest first.
        self.drop_where(limit, |_, it| it.kind == Kind::Task && it.tokens > small_max);
        self.drop_largest_first(limit, 0, |it| matches!(it.kind, Kind::User | Kind::Task));
        // The protected turn is cut only should the prompt still not fit without it.
        cut_turn(self, counter, false)?;
        Ok(self.cuts() != before)
    }

    /// Items dropped and messages elided so far (the fallback only ever adds to both).
    fn cuts(&self) -> (usize, usize) {
        let dropped = self.items.iter().filter(|i| i.dropped).count();
        (dropped, self.items.iter().map(|i| i.elided).sum())
    }

    /// This plan cut by the fallback to `goals.limit`, if that keeps every user message,
    /// pinned message and digest, and leaves the turn from `protect` on untouched: only
    /// old work and tool results are cut. `None` when the prompt cannot fit that way.
    pub fn cut_to_fit(
        &self,
        goals: Goals,
        protect: Option<usize>,
        counter: &mut Counter<'_>,
    ) -> Result<Option<Self>, ModelError> {
        let mut cut = self.clone();
        cut.fallback(goals, protect, counter)?;
        let kept = self.items.iter().zip(&cut.items).all(|(before, after)| {
            let essential = !matches!(before.kind, Kind::Work);
            let protected = protect.is_some_and(|p| before.pos >= p);
            let touched = after.dropped != before.dropped || after.elided != before.elided;
            !((essential && after.dropped) || (protected && touched))
        });
        Ok((kept && cut.total() <= goals.limit).then_some(cut))
    }

    /// Drops the items `pred` selects, the largest first (the oldest first among equals),
    /// until the prompt meets `goal` or the selected items left take at most `keep`.
    fn drop_largest_first(&mut self, goal: usize, keep: usize, pred: impl Fn(&Item) -> bool) {
        // (tokens, index) of the selected items, sorted by the pair itself: the sort reads
        // no item (on a long plan, each comparison through the items missed the cache).
        let mut order: Vec<(Reverse<usize>, usize)> = (self.items.iter().enumerate())
            .filter(|(_, it)| !it.dropped && pred(it))
            .map(|(i, it)| (Reverse(it.tokens), i))
            .collect();
        let mut selected: usize = order.iter().map(|(Reverse(tokens), _)| tokens).sum();
        let mut total = self.total();
        if selected <= keep || total <= goal {
            return;
        }
        order.sort_unstable();
        for (_, i) in order {
            if selected <= keep || total <= goal {
                break;
            }
            let it = &mut self.items[i];
            it.dropped = true;
            selected -= it.tokens;
            total -= it.tokens;
        }
    }

    fn drop_where(&mut self, goal: usize, pred: impl Fn(usize, &Item) -> bool) {
        let mut total = self.total();
        for (i, it) in self.items.iter_mut().enumerate() {
            if total <= goal {
                break;
            }
            if !it.dropped && pred(i, it) {
                it.dropped = true;
                total -= it.tokens;
            }
        }
    }
}

/// The messages a plan forwards, and where among them the items of each original
/// position start.
#[derive(Debug, Clone, Default)]
pub struct Forwarded {
    /// The messages, in order.
    pub messages: Vec<Arc<Message>>,
    /// `(original position, index in messages)` of every forwarded item, in order.
    starts: Vec<(usize, usize)>,
}

impl Forwarded {
    /// How many of the messages come before original message `end` (a unit boundary
    /// at or after the end of the stored blocks).
    pub fn before(&self, end: usize) -> usize {
        self.starts.iter().find(|&&(pos, _)| pos >= end).map_or(self.messages.len(), |&(_, at)| at)
    }
}

/// The goals of the fallback (see [`Plan::fallback`]).
#[derive(Debug, Clone, Copy)]
pub struct Goals {
    /// Aim for this many prompt tokens.
    pub target: usize,
    /// Never forward more than this (`window - reserve`) when avoidable.
    pub limit: usize,
    /// Small user messages are guaranteed up to this many tokens together.
    pub floor: usize,
    /// A user message up to this many tokens is small.
    pub small_max: usize,
    /// Tool results above this many tokens are stubbed first.
    pub min_tokens: usize,
}

/// Every elision stub starts with this.
pub const STUB_PREFIX: &str = "[elided by foldgate:";

/// The name of the tool whose call `result` answers: the caller's call with the same id,
/// else the call at the same position.
fn tool_name(caller: Option<&Message>, result: &Message, position: usize) -> String {
    if result.role() == Role::User {
        return "command".to_owned();
    }
    let Some(caller) = caller else { return "tool".to_owned() };
    let calls: Vec<&Value> = caller.tool_calls().iter().chain(caller.function_call()).collect();
    let by_id = result.tool_call_id().and_then(|id| calls.iter().find(|c| call_parts(c).0 == id));
    by_id
        .or_else(|| calls.get(position))
        .map(|c| call_parts(c).1.to_owned())
        .or_else(|| result.name().map(str::to_owned))
        .unwrap_or_else(|| "tool".to_owned())
}

fn stub(m: &Message, name: &str, tokens: usize) -> Result<Message, ModelError> {
    let text = m.text();
    let first: String = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    let content = format!(
        "{STUB_PREFIX} output of `{name}`, {tokens} tokens, {} lines; first line: {first}]",
        text.lines().count()
    );
    let mut v = m.value().clone();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("content".to_owned(), Value::String(content));
    }
    Message::from_value(v)
}
