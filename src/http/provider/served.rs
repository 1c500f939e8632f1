//! A provider compaction foldgate serves on a request the upstream answers: the fold
//! made before the request is sent, and what it adds to the answer.

use super::answer::{AnswerKind, Rewrite, WholeJson};
use crate::api::compaction_item::{self, Sealed};
use crate::api::responses_output::{OutputItemInjector, insert_output_item};
use crate::compaction::FoldWhen;
use crate::http::dialect::{Dialect, Served};
use crate::http::served_by::ProviderApis;
use crate::http::turn::Turn;
use crate::metrics::Metrics;
use crate::vocab::ProviderApi;

/// The most bytes of a JSON answer held to add to it (larger ones go unchanged).
const JSON_LIMIT: usize = 64 * 1024 * 1024;

/// What foldgate adds to the upstream's answer.
#[derive(Debug, Clone)]
pub enum Addition {
    /// A Responses compaction item (its JSON), first in `output`.
    ResponsesItem(String),
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
        }
    }
}

/// Serves `served` on `turn`: folds the request when it is due; what to add to the
/// answer, when something was done.
pub async fn serve<D: Dialect>(
    turn: &mut Turn<'_, D>,
    served: &Served,
    provider: &ProviderApis,
    metrics: &Metrics,
) -> Option<Addition> {
    match served {
        Served::ResponsesCompaction(compaction) => {
            let when = compaction.threshold.map_or(FoldWhen::AtTrigger, FoldWhen::AtTokens);
            let fold = turn.fold_whole(when).await?;
            let id = format!("cmp_{}", uuid::Uuid::new_v4().simple());
            let content = provider.sealer.seal(&Sealed { digest: fold.digest });
            metrics.provider_compaction(ProviderApi::ResponsesContextManagement, true);
            Some(Addition::ResponsesItem(compaction_item::item(&id, &content)))
        }
    }
}
