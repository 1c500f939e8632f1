//! Tier 2: folding a range of the history into a new fold block.

use std::sync::Arc;

use serde_json::json;
use serde_json::value::RawValue;

use super::blocks::{FoldBlock, range_hash};
use super::keep::{Keep, UserClass};
use super::plan::Forwarded;
use crate::model::{DIGEST_MARKER, Message, ModelError};
use crate::summarizer::artifacts::{self, Artifact};
use crate::summarizer::extractive;
use crate::summarizer::{DigestKind, SharedPrefix, Summarizer, SummarizerError, SummaryInput};

/// How a new block is made.
#[derive(Debug, Clone, Copy)]
pub struct FoldRules {
    /// The digest body should stay within about this many tokens.
    pub max_tokens: usize,
    /// Artifacts the digest missed are appended within about this many tokens.
    pub artifact_tokens: usize,
    /// Which messages stay verbatim.
    pub keep: Keep,
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
/// absorbs. `None` when the summarizer deferred the fold.
pub async fn fold_after(
    blocks: &[FoldBlock],
    absorb: bool,
    region: Region<'_>,
    summarizer: &dyn Summarizer,
    rules: FoldRules,
) -> Result<Option<Folded>, ModelError> {
    let absorb = absorb || rules.kind == DigestKind::GoalBatch;
    let Region { msgs, tokens, start, end, tools, forwarded } = region;
    let stored = emitted(blocks)?;
    let (mut input, prior) = if absorb {
        (stored, None)
    } else {
        (Vec::new(), stored.last().filter(|m| m.is_digest()).map(|m| m.text()))
    };
    input.extend_from_slice(&msgs[start..end]);
    // The conversation as last forwarded, whole: the provider has it cached (it is the
    // previous request, and what the client added since), and the instruction names
    // where the region ends in it. When the last request cut the region's last message,
    // the summarizer renders the region instead.
    let stretch = forwarded.before(end);
    let last = end.checked_sub(1).map(|i| msgs[i].hash());
    let kept = stretch.checked_sub(1).map(|i| forwarded.messages[i].hash());
    let shared = (last.is_some() && kept == last).then_some(SharedPrefix {
        messages: &forwarded.messages,
        end: stretch,
        tools,
        whole: absorb,
    });
    let summary = SummaryInput {
        messages: &input,
        prior_digest: prior.as_deref(),
        max_tokens: rules.max_tokens,
        kind: rules.kind,
        shared,
    };
    let fallback = |input: &[Arc<Message>]| match rules.kind {
        DigestKind::Fold => extractive::digest(input, rules.max_tokens),
        DigestKind::GoalBatch => extractive::goal_history(input, rules.max_tokens),
    };
    let (body, name, error) = match summarizer.summarize(summary).await {
        Err(SummarizerError::Deferred) => return Ok(None),
        Ok(text) if !text.trim().is_empty() => (text, summarizer.name(), None),
        Ok(_) => (fallback(&input), "extractive", Some("empty digest".to_owned())),
        Err(e) => (fallback(&input), "extractive", Some(e.to_string())),
    };
    let body = clip_chars(body.trim(), rules.max_tokens * 4);
    let found = artifacts::extract(&input);
    let missing = artifacts::missing(&found, &body);
    let recall =
        (!found.is_empty()).then(|| (found.len() - missing.len()) as f64 / found.len() as f64);
    let body = append_artifacts(body, &missing, rules.artifact_tokens * 3);
    let digest = json!({"role": "assistant", "content": format!("{DIGEST_MARKER}\n{body}")});

    // What stays verbatim: in a fold, the absorbed blocks' verbatim messages and the
    // region's (`rules.keep`); in a goal batch, pinned messages, the task statement and
    // the small user messages the guarantee covers: the others (past the floor) live on
    // in its human direction.
    let block_start = if absorb { blocks.first().map_or(start, |b| b.start) } else { start };
    let stays = |i: usize| match rules.kind {
        DigestKind::Fold => rules.keep.is_verbatim(msgs, tokens, i),
        DigestKind::GoalBatch => {
            msgs[i].role().is_pinned()
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
    };
    Ok(Some(Folded { block, error }))
}

fn clip_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Appends missing artifacts to the digest's "Key artifacts" section (creating it at the
/// end if the digest does not end with one), within `max_chars`.
fn append_artifacts(mut body: String, missing: &[&Artifact], max_chars: usize) -> String {
    if missing.is_empty() {
        return body;
    }
    let ends_with_artifacts =
        body.rfind("\n## ").map_or(body.starts_with("## Key artifacts"), |i| {
            body[i..].starts_with("\n## Key artifacts")
        });
    if !ends_with_artifacts {
        body.push_str("\n\n## Key artifacts");
    }
    // One line per kind, in the order the kinds first appear, within `max_chars`.
    let mut kinds: Vec<_> = Vec::new();
    for a in missing {
        if !kinds.contains(&a.kind) {
            kinds.push(a.kind);
        }
    }
    let mut used = 0;
    for kind in kinds {
        let mut line = format!("\n- {}:", kind.label());
        let mut any = false;
        for a in missing.iter().filter(|a| a.kind == kind) {
            let item = format!(" {}{}", if any { "| " } else { "" }, a.text);
            if used + line.len() + item.len() > max_chars {
                break;
            }
            line.push_str(&item);
            any = true;
        }
        if any {
            used += line.len();
            body.push_str(&line);
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarizer::artifacts::ArtifactKind;

    #[test]
    fn appends_into_existing_section_or_a_new_one() {
        let a = Artifact { kind: ArtifactKind::Path, text: "src/a.rs".into() };
        let out = append_artifacts(
            "## Milestones\n- x\n\n## Key artifacts\n- Files: b.rs".into(),
            &[&a],
            100,
        );
        assert_eq!(out.matches("## Key artifacts").count(), 1);
        assert!(out.ends_with("- Files: src/a.rs"));
        let out = append_artifacts("## Milestones\n- x".into(), &[&a], 100);
        assert!(out.ends_with("## Key artifacts\n- Files: src/a.rs"));
        let out = append_artifacts("x".into(), &[&a], 5);
        assert!(!out.contains("src/a.rs"));
        let b = Artifact { kind: ArtifactKind::Path, text: "src/b.rs".into() };
        let t = Artifact { kind: ArtifactKind::Test, text: "test_x".into() };
        let out = append_artifacts("x".into(), &[&a, &t, &b], 200);
        assert!(out.ends_with("- Files: src/a.rs | src/b.rs\n- Tests: test_x"), "{out}");
    }
}
