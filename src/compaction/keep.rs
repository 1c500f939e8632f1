//! Which original messages stay verbatim when the region holding them is folded.
//!
//! Pinned messages always; user messages up to `user_verbatim_max_tokens`; the task
//! statement (the first user message) up to `task_verbatim_max_tokens`, because coding
//! agents put their instructions and task there and an agent without them is lost; and
//! the last user message, which is the instruction the live turn is working on.
//! Larger user messages (pastes) are folded like work, and so is the tool output that
//! text-mode agents send as `user` messages ([`crate::model::is_observation`]), whatever
//! its size: it is not the user's words.

use std::sync::Arc;

use super::budget::Budget;
use super::check::SmallGuarantee;
use crate::config::CompactionConfig;
use crate::model::{Message, is_user_words};

/// The verbatim rules of one request.
#[derive(Debug, Clone, Copy)]
pub struct Keep<'p> {
    /// Small user messages up to this many tokens.
    pub user_max: usize,
    /// The task statement up to this many tokens.
    pub task_max: usize,
    /// Index of the first user message.
    pub task: Option<usize>,
    /// Index of the last user message.
    pub last_user: Option<usize>,
    /// Messages a pin pattern pins (`compaction.pin`), by index; empty without pins.
    pub pinned: &'p [bool],
}

/// Why a user message is kept verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserClass {
    /// The task statement (first user message), within its cap.
    Task,
    /// A small user message.
    Small,
    /// The last user message (whatever its size).
    Last,
    /// Folded like work.
    Large,
}

impl<'p> Keep<'p> {
    /// The rules for `msgs` under `cfg`, without pins.
    pub fn new(msgs: &[Arc<Message>], cfg: &CompactionConfig) -> Self {
        Self {
            user_max: cfg.user_verbatim_max_tokens,
            task_max: cfg.task_verbatim_max_tokens,
            task: (0..msgs.len()).find(|&i| is_user_words(msgs, i)),
            last_user: (0..msgs.len()).rfind(|&i| is_user_words(msgs, i)),
            pinned: &[],
        }
    }

    /// These rules with the messages pin patterns pin (see [`super::steer::Pins::flags`]).
    pub fn with_pins(self, pinned: &'p [bool]) -> Self {
        Self { pinned, ..self }
    }

    /// True when message `i` is pinned: by its role (system, developer) or a pattern.
    pub fn is_pinned(&self, msgs: &[Arc<Message>], i: usize) -> bool {
        msgs[i].role().is_pinned() || self.pinned.get(i).copied().unwrap_or(false)
    }

    /// What no compaction can take out: `fixed` (tools, priming), the pinned messages
    /// and the last user message.
    pub fn essentials(&self, msgs: &[Arc<Message>], tokens: &[usize], fixed: usize) -> usize {
        let pinned: usize =
            (0..msgs.len()).filter(|&i| self.is_pinned(msgs, i)).map(|i| tokens[i]).sum();
        let last = self.last_user.filter(|&i| !self.is_pinned(msgs, i)).map_or(0, |i| tokens[i]);
        fixed + pinned + last
    }

    /// Tokens of the messages a pattern pins (not those pinned by their role).
    pub fn pattern_pinned_tokens(&self, tokens: &[usize]) -> usize {
        self.pinned.iter().zip(tokens).filter(|(p, _)| **p).map(|(_, t)| t).sum()
    }

    /// How user message `i` (of `tokens` tokens) is treated; `None` if not a user message.
    pub fn class(&self, msgs: &[Arc<Message>], i: usize, tokens: usize) -> Option<UserClass> {
        if !is_user_words(msgs, i) {
            return None;
        }
        Some(if Some(i) == self.task && tokens <= self.task_max.max(self.user_max) {
            UserClass::Task
        } else if tokens <= self.user_max {
            UserClass::Small
        } else if Some(i) == self.last_user {
            UserClass::Last
        } else {
            UserClass::Large
        })
    }

    /// True if message `i` stays verbatim when folded.
    pub fn is_verbatim(&self, msgs: &[Arc<Message>], tokens: &[usize], i: usize) -> bool {
        self.is_pinned(msgs, i)
            || self.class(msgs, i, tokens[i]).is_some_and(|c| c != UserClass::Large)
    }

    /// Where the current turn starts (the last user message) when it must be forwarded
    /// intact: when it fits `budget.budget` beside the tool definitions and priming
    /// (`fixed`), the pinned messages before it, and the small user messages that are
    /// guaranteed ([`SmallGuarantee`]). `None` when there is no user message or the turn
    /// does not fit: then it may be compacted like the rest.
    pub fn protected_turn(
        &self,
        msgs: &[Arc<Message>],
        tokens: &[usize],
        fixed: usize,
        budget: &Budget,
    ) -> Option<usize> {
        let start = self.last_user?;
        let pinned_before: usize =
            (0..start).filter(|&i| self.is_pinned(msgs, i)).map(|i| tokens[i]).sum();
        let small = self.guarantee(msgs, tokens, fixed, budget, true);
        let turn: usize = tokens[start..].iter().sum();
        (fixed + pinned_before + small.tokens + turn <= budget.budget).then_some(start)
    }

    /// The most guarantee (2) can cover of these messages at any later request of the
    /// conversation: as in this request, but with the room a later, smaller last user
    /// message would leave (none of it taken). A goal batch keeps these verbatim, so a
    /// block made now never holds a message a later request must forward.
    pub fn lasting_guarantee(
        &self,
        msgs: &[Arc<Message>],
        tokens: &[usize],
        fixed: usize,
        budget: &Budget,
    ) -> SmallGuarantee {
        self.guarantee(msgs, tokens, fixed, budget, false)
    }

    /// The small user messages guarantee (2) covers: the smallest first, within the
    /// floor and the room beside the tool definitions and priming (`fixed`), the pinned
    /// messages and, with `count_last`, the last user message.
    fn guarantee(
        &self,
        msgs: &[Arc<Message>],
        tokens: &[usize],
        fixed: usize,
        budget: &Budget,
        count_last: bool,
    ) -> SmallGuarantee {
        let last = if count_last { self.last_user.map_or(0, |i| tokens[i]) } else { 0 };
        let mut essentials = fixed + last;
        let mut small = Vec::new();
        for (i, &n) in tokens.iter().enumerate().take(msgs.len()) {
            if self.is_pinned(msgs, i) {
                essentials += n;
            } else if Some(i) != self.last_user && is_user_words(msgs, i) && n <= self.user_max {
                small.push(n);
            }
        }
        let room = budget.budget.saturating_sub(essentials);
        // Pins count against the floor like the small user messages kept verbatim.
        let floor = budget.floor.saturating_sub(self.pattern_pinned_tokens(tokens));
        SmallGuarantee::of(small.into_iter(), floor, room)
    }

    /// Tokens of what folding `[start, end)` would replace.
    pub fn work_tokens(
        &self,
        msgs: &[Arc<Message>],
        tokens: &[usize],
        start: usize,
        end: usize,
    ) -> usize {
        (start..end).filter(|&i| !self.is_verbatim(msgs, tokens, i)).map(|i| tokens[i]).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classes() {
        let msgs: Vec<Arc<Message>> = ["user", "assistant", "user", "user", "system"]
            .iter()
            .map(|r| Arc::new(Message::from_value(json!({"role": r, "content": "x"})).unwrap()))
            .collect();
        let cfg = CompactionConfig {
            user_verbatim_max_tokens: 10,
            task_verbatim_max_tokens: 100,
            ..Default::default()
        };
        let k = Keep::new(&msgs, &cfg);
        assert_eq!(k.class(&msgs, 0, 50), Some(UserClass::Task));
        assert_eq!(k.class(&msgs, 0, 500), Some(UserClass::Large));
        assert_eq!(k.class(&msgs, 2, 5), Some(UserClass::Small));
        assert_eq!(k.class(&msgs, 2, 50), Some(UserClass::Large));
        assert_eq!(k.class(&msgs, 3, 5000), Some(UserClass::Last));
        assert_eq!(k.class(&msgs, 1, 5), None);
        let tokens = [500, 1, 50, 5000, 1];
        assert!(k.is_verbatim(&msgs, &tokens, 4));
        assert_eq!(k.work_tokens(&msgs, &tokens, 0, 5), 500 + 1 + 50);
    }
}
