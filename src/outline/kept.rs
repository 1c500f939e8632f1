//! Scans kept for the bodies that follow them.
//!
//! An agent sends its conversation again with every turn: a request's body starts with
//! the bytes of the one before, up to the end of its last message, and adds messages
//! after them. Each connection thread keeps the last bodies it scanned with their
//! outlines ([`KEPT`] of them, at most [`KEPT_BYTES`] of body in all). A body that
//! starts with the same bytes as a kept one, up to the end of that one's last message
//! (compared with `memcmp`, many times cheaper than a scan), takes that outline's fields
//! and messages as they are and is scanned only from there; a body that differs
//! anywhere before that point (an edited message, another conversation) is scanned
//! whole. The kept bodies are the requests' own buffers (shared, not copied), held
//! only in memory, until a later body takes their place.
//!
//! A kept outline also holds one [`Memo`]: a value its caller derived from the body's
//! first bytes (the session key's fingerprint of the first messages), which holds for
//! every body that continues it.

use std::cell::RefCell;
use std::ops::Range;

use bytes::Bytes;

use super::{MessageOutline, Outline};

/// Outlines kept per thread.
pub const KEPT: usize = 16;
/// Body bytes kept per thread, at most.
pub const KEPT_BYTES: usize = 8 << 20;
/// Bodies longer than this are not kept.
pub const MAX_KEPT_BODY: usize = 2 << 20;
/// Bodies with more messages than this are not kept (their outline would be large).
pub const MAX_KEPT_MESSAGES: usize = 8192;
/// Bodies shorter than this are scanned whole: the scan costs about what keeping does.
const MIN_KEPT_BYTES: usize = 512;

/// A value derived from a body's first `upto` bytes and from `inputs` (a digest of
/// whatever else it depends on), kept with the body's outline (see
/// [`Outline::memoized`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memo {
    /// The bytes of the body it depends on: `body[..upto]`.
    pub upto: usize,
    /// A digest of its other inputs.
    pub inputs: u128,
    /// The value.
    pub value: u128,
}

/// Where an outline was kept: its slot, while no other body took it.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeptAt {
    slot: usize,
    generation: u64,
}

/// A body and its outline, kept.
struct Kept {
    /// The body.
    body: Bytes,
    /// Where its last message ends.
    end: usize,
    /// Where its `messages` array's value starts (its `[`).
    opened: usize,
    /// The top-level fields before `messages`: where each key's text and value lie.
    fields: Vec<(Range<usize>, Range<usize>)>,
    /// Its messages.
    messages: Vec<MessageOutline>,
    /// A value derived from its first bytes, if one was.
    memo: Option<Memo>,
    /// Which body this is on its thread (see [`KeptAt`]).
    generation: u64,
}

impl Kept {
    /// A slot that matches no body (its end is past any).
    fn empty() -> Self {
        Self {
            body: Bytes::new(),
            end: usize::MAX,
            opened: 0,
            fields: Vec::new(),
            messages: Vec::new(),
            memo: None,
            generation: 0,
        }
    }
}

/// What a body takes from a kept outline (see [`resume`]).
pub(super) struct Resumed {
    /// The top-level fields before `messages`: where each key's text and value lie.
    pub fields: Vec<(Range<usize>, Range<usize>)>,
    /// Where the `messages` array's value starts.
    pub opened: usize,
    /// Where the last message taken ends: the scan goes on from here.
    pub end: usize,
    /// The messages taken.
    pub messages: Vec<MessageOutline>,
    /// The kept outline's memo: it holds for this body's first `end` bytes too.
    pub memo: Option<Memo>,
}

#[derive(Default)]
struct Thread {
    kept: Vec<Kept>,
    /// The slot the next new outline takes.
    next: usize,
    /// The slot the scan under way resumed from (its outline is replaced by the new one).
    resumed_from: Option<usize>,
    /// Scans resumed on this thread.
    resumes: u64,
    /// Bodies kept on this thread.
    generations: u64,
}

impl Thread {
    fn bytes(&self) -> usize {
        self.kept.iter().map(|k| k.body.len()).sum()
    }
}

/// Scans resumed from a kept outline on this thread so far.
#[cfg(test)]
pub fn resumes() -> u64 {
    THREAD.with(|thread| thread.borrow().resumes)
}

thread_local! {
    static THREAD: RefCell<Thread> = RefCell::new(Thread::default());
}

/// The kept outline `body` continues, if any: its fields and messages, and where its
/// last message ends.
pub(super) fn resume(body: &[u8]) -> Option<Resumed> {
    THREAD.with(|thread| {
        let mut thread = thread.borrow_mut();
        thread.resumed_from = None;
        if body.len() < MIN_KEPT_BYTES {
            return None;
        }
        let found = thread.kept.iter().position(|k| {
            let end = k.end;
            body.len() > end
                // The last bytes first: most bodies of other conversations differ there.
                && body[end - 1] == k.body[end - 1]
                && body[..end] == k.body[..end]
        })?;
        thread.resumed_from = Some(found);
        thread.resumes += 1;
        let k = &thread.kept[found];
        Some(Resumed {
            fields: k.fields.clone(),
            opened: k.opened,
            end: k.end,
            messages: k.messages.clone(),
            memo: k.memo,
        })
    })
}

/// Keeps `outline` of `shared` (the same bytes), whose `messages` array opened at
/// `opened` after its first `before` fields, for the bodies that continue it, with the
/// memo of the outline it continues (if any); where it was kept.
pub(super) fn keep(
    outline: &Outline<'_>,
    shared: &Bytes,
    opened: usize,
    before: usize,
) -> Option<KeptAt> {
    let body = outline.body;
    let last = outline.messages.last()?;
    let end = last.range.end;
    let kept = MIN_KEPT_BYTES..=MAX_KEPT_BODY;
    if !kept.contains(&body.len())
        || outline.messages.len() > MAX_KEPT_MESSAGES
        || body.as_ptr() != shared.as_ptr()
        || body.len() != shared.len()
    {
        return None;
    }
    // The fields before `messages` are the first ones, and `messages` comes next (not so
    // when a later duplicate key replaced one of them: such a body is not kept).
    let fields = &outline.fields;
    let in_order = fields.get(before).is_some_and(|(k, v)| *k == b"messages" && v.start == opened)
        && fields[..before].iter().all(|(_, v)| v.end <= opened);
    if !in_order {
        return None;
    }
    // Each key where it lies in the body, before its value.
    let base = body.as_ptr() as usize;
    let placed = |(key, value): &(&[u8], Range<usize>)| {
        let at = (key.as_ptr() as usize).checked_sub(base)?;
        (at + key.len() <= value.start).then(|| (at..at + key.len(), value.clone()))
    };
    if !fields[..before].iter().all(|field| placed(field).is_some()) {
        return None;
    }
    let memo = outline.resumed.and_then(|resumed| resumed.memo);
    THREAD.with(|thread| {
        let mut thread = thread.borrow_mut();
        thread.generations += 1;
        let generation = thread.generations;
        let slot = match thread.resumed_from.take() {
            Some(slot) => slot,
            None => {
                let slot = thread.next;
                thread.next = (slot + 1) % KEPT;
                slot
            }
        };
        if slot >= thread.kept.len() {
            thread.kept.push(Kept::empty());
        }
        // The outline it replaces lends its vectors: a body continuing it allocates
        // nothing here.
        let kept = &mut thread.kept[slot];
        kept.messages.clone_from(&outline.messages);
        kept.fields.clear();
        kept.fields.extend(fields[..before].iter().filter_map(placed));
        kept.body = shared.clone();
        (kept.end, kept.opened, kept.memo, kept.generation) = (end, opened, memo, generation);
        // Past the bytes kept, the other outlines go, oldest slot first.
        let mut drop_at = (slot + 1) % KEPT;
        while thread.bytes() > KEPT_BYTES && thread.kept.len() > 1 {
            if drop_at < thread.kept.len() && drop_at != slot {
                thread.kept[drop_at] = Kept::empty();
            }
            drop_at = (drop_at + 1) % KEPT;
            if drop_at == slot {
                break;
            }
        }
        Some(KeptAt { slot, generation })
    })
}

/// Keeps `memo` with the outline kept `at`, if no other body took its slot since and
/// the memo depends only on bytes its continuations share.
pub(super) fn remember(at: KeptAt, memo: Memo) {
    THREAD.with(|thread| {
        let mut thread = thread.borrow_mut();
        if let Some(kept) = thread.kept.get_mut(at.slot) {
            if kept.generation == at.generation && memo.upto <= kept.end {
                kept.memo = Some(memo);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::Outline;
    use serde_json::json;

    fn body(turns: usize, model_first: bool) -> Vec<u8> {
        let mut messages = vec![json!({"role": "system", "content": "You are a careful agent."})];
        for turn in 0..turns {
            messages.push(json!({"role": "user", "content": format!("step {turn}: read the file and \"fix\" it")}));
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{turn}"), "type": "function",
                 "function": {"name": "read", "arguments": "{\"path\":\"src/a.rs\"}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{turn}"),
                "content": [{"type": "text", "text": "fn main() {}"}, {"type": "image_url", "image_url": {"url": "x"}}]}));
        }
        let text = serde_json::to_string(&messages).unwrap();
        let tools = r#"[{"type":"function","function":{"name":"read","parameters":{}}}]"#;
        let out = if model_first {
            format!(r#"{{"model":"gpt-4o","max_tokens":50,"messages":{text},"tools":{tools}}}"#)
        } else {
            format!(r#"{{"messages":{text},"tools":{tools},"model":"gpt-4o","max_tokens":50}}"#)
        };
        out.into_bytes()
    }

    /// `body` scanned as a request's body is.
    fn scan(body: &[u8]) -> Option<String> {
        let body = bytes::Bytes::copy_from_slice(body);
        Outline::scan_kept(&body).map(|o| seen(&o))
    }

    /// What a fresh scan gives, in a form to compare.
    fn seen(outline: &Outline<'_>) -> String {
        format!("{:?} {:?} {:?}", outline.fields, outline.messages, outline.model())
    }

    /// The outline of a body scanned on a thread that kept nothing.
    fn fresh(body: &[u8]) -> String {
        let body = body.to_vec();
        seen(&Outline::scan(&body).unwrap())
    }

    #[test]
    fn a_continued_body_gets_the_outline_a_fresh_scan_gives() {
        let resumed = super::resumes();
        for model_first in [true, false] {
            let bodies: Vec<Vec<u8>> = (3..9).map(|turns| body(turns, model_first)).collect();
            for b in &bodies {
                // Each body continues the one before; each is also sent twice.
                for _ in 0..2 {
                    assert_eq!(scan(b).unwrap(), fresh(b));
                }
            }
            // An edited early message: the kept outlines do not apply.
            let mut edited = bodies[5].clone();
            let at = memchr::memmem::find(&edited, b"step 1").unwrap();
            edited[at] = b'S';
            assert_eq!(scan(&edited).unwrap(), fresh(&edited));
            // A shorter body (a conversation compacted by the client) and a broken one.
            assert_eq!(scan(&bodies[0]).unwrap(), fresh(&bodies[0]));
            let broken = &bodies[5][..bodies[5].len() - 1];
            assert!(scan(broken).is_none());
        }
        // Every body after the first continued one kept before, or was sent again.
        assert!(super::resumes() - resumed >= 20, "{}", super::resumes() - resumed);
    }

    #[test]
    fn the_bodies_kept_stay_within_their_bytes() {
        // Bodies of about 1.5 MiB: no more than five fit the bytes kept.
        for i in 0..12 {
            let text = format!("{i:02}") + &"x".repeat(1_500_000);
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]}}"#);
            assert!(scan(body.as_bytes()).is_some());
            let held = super::THREAD.with(|t| t.borrow().bytes());
            assert!(held <= super::KEPT_BYTES, "{held}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Bodies that grow a message at a time (texts with quotes, backslashes and
        /// brackets; an edit here and there) get what a fresh scan gives.
        #[test]
        fn growing_bodies_get_fresh_outlines(
            texts in proptest::collection::vec("[a-z \\\\\"\\[\\]{}:,é]{0,80}", 1..24),
            edit in proptest::option::of(0usize..24),
            trailing in proptest::bool::ANY,
        ) {
            let mut messages = vec![json!({"role": "system", "content": "x".repeat(600)})];
            for (i, text) in texts.iter().enumerate() {
                let role = ["user", "assistant", "tool"][i % 3];
                let mut text = text.clone();
                if edit == Some(i) {
                    text.push('!');
                }
                messages.push(json!({"role": role, "content": text}));
                let list = serde_json::to_string(&messages).unwrap();
                let body = if trailing {
                    format!(r#"{{"messages":{list},"model":"m{i}"}}"#)
                } else {
                    format!(r#"{{"model":"m","messages":{list}}}"#)
                };
                proptest::prop_assert_eq!(scan(body.as_bytes()), Some(fresh(body.as_bytes())));
            }
        }
    }

    #[test]
    fn a_body_that_only_starts_alike_is_scanned_whole() {
        let b = body(6, true);
        scan(&b).unwrap();
        // The same start, then bytes a scan must refuse after the kept messages.
        let end = memchr::memmem::rfind(&b, b"]}]").unwrap() + 2;
        let mut odd = b[..end].to_vec();
        odd.extend_from_slice(b", 7]}");
        let resumed = super::resumes();
        assert!(scan(&odd).is_none());
        let mut more = b[..end].to_vec();
        more.extend_from_slice(br#", {"role":"user","content":"more"}], "model": "o3"}"#);
        assert_eq!(scan(&more).unwrap(), fresh(&more));
        assert!(scan(&more).unwrap().ends_with("Some(\"o3\")"));
        assert_eq!(super::resumes() - resumed, 3);
    }
}
