//! A provider compaction foldgate serves on a request the upstream answers: the fold
//! made before the request is sent, and what it adds to the answer.

use super::answer::{AnswerKind, Rewrite, WholeJson};
use crate::api::anthropic_edits::{
    AnswerEdits, AppliedEdit, CompactionAnswer, CompactionInjector, ContextManagement,
    decorate_message, paused_message, paused_stream,
};
use crate::api::compaction_item::{self, Sealed};
use crate::api::responses_output::{OutputItemInjector, insert_output_item};
use crate::conversation::FoldWhen;
use crate::http::compaction_apis::CompactionApis;
use crate::http::dialect::{Dialect, Served};
use crate::http::turn::Turn;
use crate::metrics::Metrics;
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
    /// The whole answer of a request that pauses after compaction: sent instead of the
    /// upstream's, which is never asked.
    Paused {
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
            (Self::Paused { .. }, _) => None,
        }
    }
}

/// Serves `served` on `turn`: folds the request when it is due; what to add to the
/// answer, when something was done.
pub async fn serve<D: Dialect>(
    turn: &mut Turn<'_, D>,
    served: &Served,
    provider: &CompactionApis,
    metrics: &Metrics,
) -> Option<Addition> {
    match served {
        Served::ResponsesCompaction(compaction) => {
            let when = compaction.threshold.map_or(FoldWhen::AtTrigger, FoldWhen::AtTokens);
            let fold = turn.fold_whole(when, None).await?;
            let id = format!("cmp_{}", uuid::Uuid::new_v4().simple());
            let content = provider.sealer.seal(&Sealed { digest: fold.digest });
            metrics.provider_compaction(CompactionApi::ResponsesContextManagement, true);
            turn.served(CompactionApi::ResponsesContextManagement);
            Some(Addition::ResponsesItem(compaction_item::item(&id, &content)))
        }
        Served::MessagesEdits { edits, applied } => {
            let addition = messages_edits(turn, edits, applied).await;
            let compacted = match &addition {
                Addition::Messages(answer) => answer.compaction.is_some() || !applied.is_empty(),
                _ => true,
            };
            if compacted {
                metrics.provider_compaction(CompactionApi::MessagesContextManagement, true);
                turn.served(CompactionApi::MessagesContextManagement);
            }
            for edit in applied {
                turn.note(edit.describe());
            }
            Some(addition)
        }
    }
}

/// Makes the `compact_20260112` edit of `edits` when the request passed its trigger;
/// what the answer reports (`applied`: the clearing edits made on the body).
async fn messages_edits<D: Dialect>(
    turn: &mut Turn<'_, D>,
    edits: &ContextManagement,
    applied: &[AppliedEdit],
) -> Addition {
    let mut answer = AnswerEdits { compaction: None, applied_edits: Some(applied.to_vec()) };
    let Some(compact) = edits.compact() else { return Addition::Messages(answer) };
    let trigger = usize::try_from(compact.trigger).unwrap_or(usize::MAX);
    let when = FoldWhen::AtTokens(trigger.saturating_add(1));
    let Some(fold) = turn.fold_whole(when, compact.instructions.clone()).await else {
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
        let model = turn.model_name().to_owned();
        let events = turn.streams();
        let body = if events {
            paused_stream(&id, &model, &compaction, applied)
        } else {
            paused_message(&id, &model, &compaction, applied)
        };
        return Addition::Paused { body, events };
    }
    answer.compaction = Some(compaction);
    Addition::Messages(answer)
}
