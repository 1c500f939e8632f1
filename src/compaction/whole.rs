//! A fold of a whole conversation, as the providers' own compaction APIs ask for it
//! (OpenAI's `responses/compact`, `context_management` compaction, Anthropic's
//! `compact_20260112` edit): every message goes into one digest, written by the same
//! summarizer, with the same work trail, as any fold, except those a fold keeps verbatim
//! (pinned messages, the task statement, small user messages, the last user message).

use std::sync::Arc;

use super::CompactionError;
use super::budget::{Budget, Options};
use super::changes::{Change, ChangeKind, quote};
use super::engine::Engine;
use super::fold::{FoldRules, Folded, Region, fold_after};
use super::keep::Keep;
use super::plan::Forwarded;
use super::report::{Report, Tier};
use super::steer;
use super::tokens::{Counter, REPLY_PRIMING, TokenCache};
use super::units::units;
use crate::model::{ChatRequest, Message, ModelError};
use crate::summarizer::{DigestKind, Summarizer};

/// A whole conversation folded.
#[derive(Debug, Clone)]
pub struct WholeFold {
    /// The original messages kept verbatim, by index, in order.
    pub kept: Vec<usize>,
    /// The digest message's text, [`crate::model::DIGEST_MARKER`] first.
    pub digest: String,
    /// The digest as a neutral message (an assistant message of that text).
    pub message: Arc<Message>,
    /// Tokens of the digest message.
    pub digest_tokens: usize,
    /// The report of the fold, as of any compacted request: tokens before and after,
    /// messages folded, who wrote the digest and the summarizer's error.
    pub report: Report,
}

/// When a whole conversation is folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldWhen {
    /// Whatever its size (a compact request).
    Always,
    /// When its prompt reaches this many tokens, as the provider counts them.
    AtTokens(usize),
    /// When its prompt reaches foldgate's own trigger.
    AtTrigger,
}

impl WholeFold {
    /// `request` as folded: the kept messages, then the digest.
    pub fn request(&self, request: &ChatRequest) -> ChatRequest {
        let msgs = request.messages();
        let mut messages: Vec<Arc<Message>> =
            self.kept.iter().filter_map(|&i| msgs.get(i).cloned()).collect();
        messages.push(self.message.clone());
        request.with_messages(messages)
    }
}

impl Engine {
    /// Folds every message of `request` that a fold does not keep verbatim into one
    /// digest, when its prompt is as large as `when` says. `Ok(None)` when it is not, when
    /// there is nothing to fold (every message is kept), or when the summarizer deferred.
    pub async fn fold_whole(
        &self,
        request: &ChatRequest,
        summarizer: &dyn Summarizer,
        opts: &Options,
        when: FoldWhen,
    ) -> Result<Option<WholeFold>, CompactionError> {
        let cfg = self.config();
        let budget = Budget::of(request, cfg, opts);
        let mut cache = TokenCache::default();
        let mut counter = Counter { encoding: budget.encoding, cache: &mut cache };
        let msgs = request.messages();
        let tokens = counter.messages(msgs);
        let fixed = counter.tools(request.tools_raw()) + REPLY_PRIMING;
        let tokens_before = fixed + tokens.iter().sum::<usize>();
        let provider_tokens = (tokens_before as f64 * budget.token_ratio) as usize;
        let due = match when {
            FoldWhen::Always => true,
            FoldWhen::AtTokens(threshold) => provider_tokens >= threshold,
            FoldWhen::AtTrigger => tokens_before >= budget.trigger,
        };
        if !due {
            return Ok(None);
        }
        request.readable()?;
        let pinned = steer::pinned_units(opts.steer.pins.as_deref(), msgs, &units(msgs));
        let keep = Keep::new(msgs, cfg).with_pins(&pinned);
        let folded = (0..msgs.len()).filter(|&i| !keep.is_verbatim(msgs, &tokens, i)).count();
        if folded == 0 {
            return Ok(None);
        }
        let forwarded = Forwarded::default();
        let region = Region {
            msgs,
            tokens: &tokens,
            start: 0,
            end: msgs.len(),
            tools: request.tools_raw(),
            forwarded: &forwarded,
        };
        let rules = FoldRules {
            max_tokens: cfg.digest_max_tokens,
            trail_tokens: cfg.trail_max_tokens,
            keep,
            kind: DigestKind::Fold,
            goal_keeps: None,
        };
        let steering = opts.steer.instructions(msgs, opts.summary_instructions.as_deref());
        let instructions = steer::merged(&steering);
        let instructions = instructions.as_deref();
        let Some(done) = fold_after(&[], false, region, summarizer, rules, instructions).await?
        else {
            return Ok(None);
        };
        let measured = Measured { budget, fixed, tokens_before, folded, tokens: &tokens };
        let mut whole = whole_fold(measured, done, &mut counter)?;
        let report = &mut whole.report;
        report.rewrite_cost = report.rewritten_tokens as f64 * (1.0 - cfg.cached_price);
        Ok(Some(whole))
    }
}

/// What was measured of a request before its whole fold.
struct Measured<'a> {
    budget: Budget,
    /// Tokens of the tools and reply priming.
    fixed: usize,
    tokens_before: usize,
    /// Messages going into the digest.
    folded: usize,
    /// Tokens of each message.
    tokens: &'a [usize],
}

/// The whole fold of a request measured as `m`, from the block `done` made.
fn whole_fold(
    m: Measured<'_>,
    done: Folded,
    counter: &mut Counter<'_>,
) -> Result<WholeFold, CompactionError> {
    let block = done.block;
    let digest_raw = block.messages.last().ok_or(ModelError::NoMessages)?.clone();
    let message = Arc::new(Message::from_raw(digest_raw)?);
    let digest_tokens = counter.message(&message);
    let kept_tokens: usize = block.verbatim.iter().map(|&i| m.tokens[i]).sum();
    let tokens_after = m.fixed + kept_tokens + digest_tokens;
    let mut report = Report::new(m.budget, true, m.tokens.len(), 0, 0);
    report.tokens_before = m.tokens_before;
    report.tokens_after = tokens_after;
    report.fits = tokens_after <= report.budget.budget;
    report.tier = Tier::Fold;
    report.kept = block.verbatim.len();
    report.folded = m.folded;
    report.messages_after = block.verbatim.len() + 1;
    report.blocks_new = 1;
    report.summarizer = Some(block.summarizer);
    report.summarizer_error = done.error;
    report.artifact_recall = block.artifact_recall;
    // The prompt is the same up to the first message the fold did not keep in place.
    let common = block.verbatim.iter().enumerate().take_while(|(j, i)| j == *i).count();
    let kept_after: usize = block.verbatim[common..].iter().map(|&i| m.tokens[i]).sum();
    report.rewritten_tokens = kept_after + digest_tokens;
    report.changes = vec![Change {
        kind: ChangeKind::Folded,
        tier: Tier::Fold,
        start: 0,
        end: m.tokens.len(),
        tokens_before: m.tokens_before.saturating_sub(m.fixed + kept_tokens),
        tokens_after: digest_tokens,
        text: Some(quote(&message.text())),
    }];
    Ok(WholeFold {
        report,
        digest: message.text().into_owned(),
        message,
        kept: block.verbatim,
        digest_tokens,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::CompactionConfig;
    use crate::model::DIGEST_MARKER;
    use crate::summarizer::ExtractiveSummarizer;

    fn request() -> ChatRequest {
        let mut messages = vec![
            json!({"role": "system", "content": "Be careful."}),
            json!({"role": "user", "content": "Fix the parser."}),
        ];
        for i in 0..6 {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"),
                "type": "function", "function": {"name": "read", "arguments": format!("{{\"path\":\"src/m{i}.rs\"}}")}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "fn x() {}\n".repeat(50)}));
        }
        messages.push(json!({"role": "user", "content": "Now the tests."}));
        let body = json!({"model": "gpt-4.1", "messages": messages});
        ChatRequest::parse(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn everything_but_what_a_fold_keeps_goes_into_one_digest() {
        let engine = Engine::new(CompactionConfig::default());
        let request = request();
        let (summarizer, opts) = (ExtractiveSummarizer, Options::default());
        let fold = engine.fold_whole(&request, &summarizer, &opts, FoldWhen::Always).await;
        let fold = fold.unwrap().unwrap();
        assert_eq!(fold.kept, vec![0, 1, 14], "system, task and the last user message");
        assert_eq!(fold.report.folded, 12);
        assert!(fold.digest.starts_with(DIGEST_MARKER));
        assert!(fold.digest.contains("src/m5.rs"), "the work trail: {}", fold.digest);
        assert!(fold.report.tokens_after < fold.report.tokens_before);
        let folded = fold.request(&request);
        assert_eq!(folded.messages().len(), 4);
        assert!(folded.messages()[3].is_digest());
        // Below a threshold nothing is folded; the same input folds to the same digest.
        let high = FoldWhen::AtTokens(1_000_000);
        assert!(engine.fold_whole(&request, &summarizer, &opts, high).await.unwrap().is_none());
        let again = engine.fold_whole(&request, &summarizer, &opts, FoldWhen::Always).await;
        assert_eq!(again.unwrap().unwrap().digest, fold.digest);
    }
}
