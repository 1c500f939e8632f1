//! A provider compaction foldgate serves: what the fold made for it adds to the
//! upstream's answer, or foldgate's own answer in its place.

use super::answer::{AnswerKind, Rewrite, WholeJson};
use super::{CompactionApis, FoldFacts};
use crate::api::anthropic_edits::{
    AnswerEdits, AppliedEdit, CompactionAnswer, CompactionInjector, ContextManagement,
    decorate_message, paused_message, paused_stream, summary_message, summary_stream,
};
use crate::api::compaction_item::{self, Sealed};
use crate::api::responses_output::{OutputItemInjector, compaction_answer, insert_output_item};
use crate::conversation::WholeFold;
use crate::model::DIGEST_MARKER;
use crate::vocab::CompactionApi;

/// The most bytes of a JSON answer held to add to it (larger ones go unchanged).
const JSON_LIMIT: usize = 64 * 1024 * 1024;

/// What foldgate adds to the upstream's answer, or answers in its place.
#[derive(Debug, Clone)]
pub enum Addition {
    /// A Responses compaction item (its JSON), first in `output`.
    ResponsesItem(String),
    /// An Anthropic answer's compaction block, `context_management` and iterations.
    Messages(AnswerEdits),
    /// foldgate's whole answer (a request that pauses after compaction, a compact
    /// request): sent instead of the upstream's, which is never asked.
    Answer {
        /// The answer's body.
        body: Vec<u8>,
        /// It is an event stream (the request asked to stream).
        events: bool,
    },
}

impl Addition {
    /// The rewrite that adds this to an answer of `kind`.
    pub fn rewrite(self, kind: AnswerKind) -> Option<Box<dyn Rewrite>> {
        match (self, kind) {
            (Self::ResponsesItem(item), AnswerKind::Json) => Some(Box::new(WholeJson::new(
                move |body: &[u8]| insert_output_item(body, &item),
                JSON_LIMIT,
            ))),
            (Self::ResponsesItem(item), AnswerKind::Events) => {
                Some(Box::new(OutputItemInjector::new(item)))
            }
            (Self::Messages(edits), AnswerKind::Json) => Some(Box::new(WholeJson::new(
                move |body: &[u8]| decorate_message(body, &edits).map(|b| b.to_vec()),
                JSON_LIMIT,
            ))),
            (Self::Messages(edits), AnswerKind::Events) => {
                Some(Box::new(CompactionInjector::new(edits)))
            }
            (Self::Answer { .. }, _) => None,
        }
    }
}

/// What serving a provider compaction came to.
#[derive(Default)]
pub struct Concluded {
    /// What to add to the upstream's answer, or foldgate's whole answer.
    pub addition: Option<Addition>,
    /// The API foldgate served, when it changed the request.
    pub api: Option<CompactionApi>,
    /// Changes made besides the engine's compaction, in a few words each.
    pub notes: Vec<String>,
}

/// What a Responses `context_management` compaction adds: its `compaction` item first in
/// `output`, when the request was folded.
pub(super) fn responses_item(fold: Option<WholeFold>, apis: &CompactionApis) -> Concluded {
    let addition = fold.map(|fold| {
        let id = format!("cmp_{}", uuid::Uuid::new_v4().simple());
        let content = apis.sealer.seal(&Sealed { digest: fold.digest });
        Addition::ResponsesItem(compaction_item::item(&id, &content))
    });
    let api = addition.as_ref().map(|_| CompactionApi::ResponsesContextManagement);
    Concluded { addition, api, notes: Vec::new() }
}

/// foldgate's answer to Codex's `compaction_trigger`: one sealed `compaction` item.
pub(super) fn trigger_answer(
    fold: Option<WholeFold>,
    request: &FoldFacts<'_>,
    apis: &CompactionApis,
) -> Concluded {
    let digest = fold.as_ref().map(|f| f.digest.clone()).unwrap_or_default();
    let id = format!("cmp_{}", uuid::Uuid::new_v4().simple());
    let item = compaction_item::item(&id, &apis.sealer.seal(&Sealed { digest }));
    let usage =
        fold.as_ref().map_or((0, 0), |f| (f.report.tokens_before as u64, f.digest_tokens as u64));
    let events = request.streams;
    let body = compaction_answer(&item, request.model, usage, events);
    let api = Some(CompactionApi::ResponsesCompact);
    Concluded { addition: Some(Addition::Answer { body, events }), api, notes: Vec::new() }
}

/// What Anthropic's `context_management.edits` add to the answer (the clearing edits
/// `applied`, the `compact_20260112` edit made as `fold`), or foldgate's whole answer
/// when it pauses after compaction.
pub(super) fn edits_answer(
    edits: &ContextManagement,
    applied: &[AppliedEdit],
    fold: Option<WholeFold>,
    request: &FoldFacts<'_>,
) -> Concluded {
    let addition = messages_edits(edits, applied, fold, request);
    let compacted = match &addition {
        Addition::Messages(answer) => answer.compaction.is_some() || !applied.is_empty(),
        _ => true,
    };
    let api = compacted.then_some(CompactionApi::MessagesContextManagement);
    let notes = applied.iter().map(AppliedEdit::describe).collect();
    Concluded { addition: Some(addition), api, notes }
}

/// foldgate's answer to Anthropic's on-demand compaction: the `compaction` block alone.
pub(super) fn summary_answer(fold: Option<WholeFold>, request: &FoldFacts<'_>) -> Concluded {
    let summary = fold.as_ref().map_or("", |fold| {
        fold.digest.strip_prefix(DIGEST_MARKER).unwrap_or(&fold.digest).trim_start()
    });
    let compaction = CompactionAnswer {
        summary: summary.to_owned(),
        input_tokens: fold.as_ref().map_or(0, |f| f.report.tokens_before as u64),
        output_tokens: fold.as_ref().map_or(0, |f| f.digest_tokens as u64),
    };
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let events = request.streams;
    let body = match events {
        true => summary_stream(&id, request.model, &compaction),
        false => summary_message(&id, request.model, &compaction),
    };
    let api = Some(CompactionApi::MessagesContextManagement);
    Concluded { addition: Some(Addition::Answer { body, events }), api, notes: Vec::new() }
}

/// The `compact_20260112` edit of `edits`, made as `fold` (when the request passed its
/// trigger), and what the answer reports (`applied`: the clearing edits made on the body).
fn messages_edits(
    edits: &ContextManagement,
    applied: &[AppliedEdit],
    fold: Option<WholeFold>,
    request: &FoldFacts<'_>,
) -> Addition {
    let mut answer = AnswerEdits { compaction: None, applied_edits: Some(applied.to_vec()) };
    let (Some(compact), Some(fold)) = (edits.compact(), fold) else {
        return Addition::Messages(answer);
    };
    let summary = fold.digest.strip_prefix(DIGEST_MARKER).unwrap_or(&fold.digest).trim_start();
    let compaction = CompactionAnswer {
        summary: summary.to_owned(),
        input_tokens: fold.report.tokens_before as u64,
        output_tokens: fold.digest_tokens as u64,
    };
    if compact.pause_after_compaction {
        let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        let events = request.streams;
        let body = if events {
            paused_stream(&id, request.model, &compaction, applied)
        } else {
            paused_message(&id, request.model, &compaction, applied)
        };
        return Addition::Answer { body, events };
    }
    answer.compaction = Some(compaction);
    Addition::Messages(answer)
}
