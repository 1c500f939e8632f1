//! Tier 2: folding a range of the history into a new fold block.

use std::sync::Arc;

use serde_json::json;
use serde_json::value::RawValue;

use super::blocks::{FoldBlock, range_hash};
use super::keep::{Keep, UserClass};
use super::plan::Forwarded;
use super::trail::{self, Trail};
use crate::model::{DIGEST_MARKER, Message, ModelError};
use crate::summarizer::extractive;
use crate::summarizer::{DigestKind, SharedPrefix, Summarizer, SummarizerError, SummaryInput};

/// How a new block is made.
#[derive(Debug, Clone, Copy)]
pub struct FoldRules<'p> {
    /// The digest body should stay within about this many tokens.
    pub max_tokens: usize,
    /// The work trail written into the digest takes at most about this many tokens.
    pub trail_tokens: usize,
    /// Which messages stay verbatim.
    pub keep: Keep<'p>,
    /// What kind of digest to write.
    pub kind: DigestKind,
    /// In a goal batch, user messages up to this many tokens stay verbatim (those the
    /// small-message guarantee covers).
    pub goal_keeps: Option<usize>,
}

/// A new block and how its digest was made.
pub struct Folded {
    /// The block.
    pub block: FoldBlock,
    /// The summarizer's error when the extractive fallback was used.
    pub error: Option<String>,
}

/// Original messages `[start, end)` and their token counts.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    /// All original messages.
    pub msgs: &'a [Arc<Message>],
    /// Their tokens.
    pub tokens: &'a [usize],
    /// First message of the region (the end of the stored blocks).
    pub start: usize,
    /// One past its last message.
    pub end: usize,
    /// The request's `tools`, as raw JSON.
    pub tools: Option<&'a str>,
    /// The conversation as last forwarded (stored blocks, the last cut) with what the
    /// client added since: what a shared-prefix summarizer sends.
    pub forwarded: &'a Forwarded,
}

/// The messages the stored `blocks` emit, in order.
pub fn emitted(blocks: &[FoldBlock]) -> Result<Vec<Arc<Message>>, ModelError> {
    let mut out = Vec::new();
    for b in blocks {
        out.extend(b.emitted()?);
    }
    Ok(out)
}

/// Folds `region`, which follows the stored `blocks`. With `absorb`, the new block also
/// takes the place of every stored block: it covers the history from message 0, and its
/// digest is written from the blocks' messages (their earlier digests) and the region,
/// so that one digest carries what several did; otherwise the summarizer gets the last
/// block's digest as prior context. A goal batch ([`DigestKind::GoalBatch`]) always
/// absorbs. `instructions`: what the client asked of the digest besides. `None` when the
/// summarizer deferred the fold.
pub async fn fold_after(
    blocks: &[FoldBlock],
    absorb: bool,
    region: Region<'_>,
    summarizer: &dyn Summarizer,
    rules: FoldRules<'_>,
    instructions: Option<&str>,
) -> Result<Option<Folded>, ModelError> {
    let absorb = absorb || rules.kind == DigestKind::GoalBatch;
    let Region { msgs, start, end, .. } = region;
    let stored = emitted(blocks)?;
    let (mut input, prior) = if absorb {
        (stored, None)
    } else {
        (Vec::new(), stored.last().filter(|m| m.is_digest()).map(|m| m.text()))
    };
    input.extend_from_slice(&msgs[start..end]);
    let summary = SummaryInput {
        messages: &input,
        prior_digest: prior.as_deref(),
        max_tokens: rules.max_tokens,
        kind: rules.kind,
        shared: shared_prefix(&region, absorb),
        instructions,
    };
    let Some((body, name, error)) = write_digest(summarizer, summary, &input, rules).await else {
        return Ok(None);
    };
    let body = clip_chars(body.trim(), rules.max_tokens * 4);
    let (body, recall, work) = with_trail(blocks, absorb, &region, &body, rules);
    let digest = json!({"role": "assistant", "content": format!("{DIGEST_MARKER}\n{body}")});
    let block_start = if absorb { blocks.first().map_or(start, |b| b.start) } else { start };
    let (mut messages, verbatim) = verbatim_messages(blocks, absorb, &region, rules)?;
    let text = serde_json::to_string(&digest).map_err(ModelError::Serialize)?;
    messages.push(RawValue::from_string(text).map_err(ModelError::Serialize)?);
    let block = FoldBlock {
        start: block_start,
        end,
        range_hash: range_hash(&msgs[block_start..end]),
        messages,
        verbatim,
        summarizer: name.to_owned(),
        artifact_recall: recall,
        trail: Some(work),
        goal_batch: rules.kind == DigestKind::GoalBatch,
    };
    Ok(Some(Folded { block, error }))
}

/// What a shared-prefix summarizer sends: the conversation as last forwarded, whole (the
/// provider has it cached: it is the previous request, and what the client added
/// since), with where the region ends in it; `None` when the last request cut the
/// region's last message (the summarizer renders the region instead).
fn shared_prefix<'r>(region: &Region<'r>, absorb: bool) -> Option<SharedPrefix<'r>> {
    let Region { msgs, end, tools, forwarded, .. } = *region;
    let stretch = forwarded.before(end);
    let last = end.checked_sub(1).map(|i| msgs[i].hash());
    let kept = stretch.checked_sub(1).map(|i| forwarded.messages[i].hash());
    (last.is_some() && kept == last).then_some(SharedPrefix {
        messages: &forwarded.messages,
        end: stretch,
        tools,
        whole: absorb,
    })
}

/// The digest body of `summary` (made of `input`), the summarizer that wrote it, and the
/// summarizer's error when the extractive digest stands in for an empty or failed one;
/// `None` when the summarizer deferred the fold.
async fn write_digest(
    summarizer: &dyn Summarizer,
    summary: SummaryInput<'_>,
    input: &[Arc<Message>],
    rules: FoldRules<'_>,
) -> Option<(String, &'static str, Option<String>)> {
    let asked = summary.instructions;
    let fallback = |input: &[Arc<Message>]| {
        let body = match rules.kind {
            DigestKind::Fold => extractive::digest(input, rules.max_tokens),
            DigestKind::GoalBatch => extractive::goal_history(input, rules.max_tokens),
        };
        extractive::with_instruction_facts(body, rules.kind, asked)
    };
    Some(match summarizer.summarize(summary).await {
        Err(SummarizerError::Deferred) => return None,
        Ok(text) if !text.trim().is_empty() => (text, summarizer.name(), None),
        Ok(_) => (fallback(input), "extractive", Some("empty digest".to_owned())),
        Err(e) => (fallback(input), "extractive", Some(e.to_string())),
    })
}

/// The digest `body` completed with the work trail up to the region's end, the recall
/// of the trail's files in the body, and the trail. The trail is the stored blocks'
/// (rebuilt from the originals for blocks stored without one) with the region's actions
/// merged in; a digest that takes the place of the stored ones carries all of it, one
/// written after them only what changed since theirs.
fn with_trail(
    blocks: &[FoldBlock],
    absorb: bool,
    region: &Region<'_>,
    body: &str,
    rules: FoldRules<'_>,
) -> (String, Option<f64>, Trail) {
    let Region { msgs, start, end, .. } = *region;
    let base = match blocks.last() {
        None => Trail::default(),
        Some(last) => last.trail.clone().unwrap_or_else(|| Trail::of(msgs, last.end)),
    };
    let mut work = base.clone();
    work.record(msgs, start, end);
    let since = (!absorb && !blocks.is_empty()).then_some(&base);
    let lines = work.render(since, rules.trail_tokens * TRAIL_CHARS_PER_TOKEN);
    let recall = trail::recall(&work, since, body);
    let body = trail::complete(body, &work, &lines);
    (body, recall, work)
}

/// The messages that stay verbatim in the new block, in order, with their indices. In
/// a fold: the absorbed blocks' verbatim messages and the region's (`rules.keep`); in a
/// goal batch: pinned messages, the task statement and the small user messages the
/// guarantee covers (the others, past the floor, live on in its human direction).
fn verbatim_messages(
    blocks: &[FoldBlock],
    absorb: bool,
    region: &Region<'_>,
    rules: FoldRules<'_>,
) -> Result<(Vec<Box<RawValue>>, Vec<usize>), ModelError> {
    let Region { msgs, tokens, start, end, .. } = *region;
    let stays = |i: usize| match rules.kind {
        DigestKind::Fold => rules.keep.is_verbatim(msgs, tokens, i),
        DigestKind::GoalBatch => {
            rules.keep.is_pinned(msgs, i)
                || match rules.keep.class(msgs, i, tokens[i]) {
                    Some(UserClass::Task) => true,
                    Some(UserClass::Small) => rules.goal_keeps.is_some_and(|max| tokens[i] <= max),
                    _ => false,
                }
        }
    };
    let mut messages = Vec::new();
    let mut verbatim = Vec::new();
    let absorbed: Vec<usize> = if absorb {
        blocks.iter().flat_map(|b| b.verbatim.iter().copied()).collect()
    } else {
        Vec::new()
    };
    // A fold that absorbs the stored blocks keeps every message they kept, also one no
    // longer kept by the rules of this request (the last user message of then, a paste
    // now): the prefix before the first digest stays as it was forwarded.
    let carried = if rules.kind == DigestKind::Fold { absorbed.len() } else { 0 };
    for (k, i) in absorbed.into_iter().chain(start..end).enumerate() {
        if k < carried || stays(i) {
            messages.push(
                RawValue::from_string(msgs[i].raw().to_owned()).map_err(ModelError::Serialize)?,
            );
            verbatim.push(i);
        }
    }
    Ok((messages, verbatim))
}

/// Characters per token assumed when sizing the trail (paths and commands tokenize
/// densely).
const TRAIL_CHARS_PER_TOKEN: usize = 3;

fn clip_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
