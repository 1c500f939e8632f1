//! OpenAI's `context_management` compaction on `/v1/responses`: foldgate's sealed
//! `compaction` items opened wherever they come back, and (when foldgate serves it) the
//! field taken out of the body; the exchange folds the request past its threshold and the
//! answer gets a `compaction` item first in `output` (see [`super::on_request`]). A
//! request whose last input item is Codex's `compaction_trigger` asks for
//! `responses.compact` instead: served by foldgate, it is answered with one `compaction`
//! item sealing the whole conversation folded, the trigger never forwarded.

use bytes::Bytes;

use http::StatusCode;

use super::on_request::{self, Concluded};
use super::{
    CompactionApis, CompactionFamily, FoldAsk, FoldFacts, Prepared, Served, rejects_field,
};
use crate::api::compaction_item::{open_items, take_context_management, take_trigger};
use crate::conversation::{FoldWhen, WholeFold};
use crate::vocab::CompactionApi;

/// Responses `context_management` compaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesContext;

impl CompactionFamily for ResponsesContext {
    /// Folded at its `compact_threshold` (foldgate's trigger without one); for the
    /// trigger, always.
    fn fold_asked(&self, served: &Served) -> Option<FoldAsk> {
        let when = match served {
            Served::ResponsesCompaction(compaction) => {
                compaction.threshold.map_or(FoldWhen::AtTrigger, FoldWhen::AtTokens)
            }
            Served::ResponsesTrigger => FoldWhen::Always,
            _ => return None,
        };
        Some(FoldAsk { when, instructions: None })
    }

    fn conclude(
        &self,
        served: Served,
        fold: Option<WholeFold>,
        request: &FoldFacts<'_>,
        apis: &CompactionApis,
    ) -> Result<Concluded, String> {
        Ok(match served {
            Served::ResponsesCompaction(_) => on_request::responses_item(fold, apis),
            Served::ResponsesTrigger => on_request::trigger_answer(fold, request, apis),
            _ => Concluded::default(),
        })
    }

    /// An unknown `context_management` field, or a client error naming the
    /// `compaction_trigger` item.
    fn refuses(&self, status: StatusCode, error_body: &[u8]) -> bool {
        let trigger = memchr::memmem::find(error_body, b"compaction_trigger").is_some();
        rejects_field(error_body, "context_management") || (status.is_client_error() && trigger)
    }

    fn api(&self) -> CompactionApi {
        CompactionApi::ResponsesContextManagement
    }

    /// `responses.compact` for a request ending with `compaction_trigger`.
    fn api_for(&self, body: &[u8]) -> CompactionApi {
        match take_trigger(body) {
            Some(_) => CompactionApi::ResponsesCompact,
            None => self.api(),
        }
    }

    /// Opens foldgate's compaction items (a tampered or foreign one is an error); when
    /// foldgate serves `context_management`, takes it out of the body; when it serves
    /// `responses.compact` for a request ending with `compaction_trigger`, takes the
    /// trigger out and answers itself.
    fn prepare(
        &self,
        body: &Bytes,
        provider: &CompactionApis,
        serve: bool,
    ) -> Result<Prepared, String> {
        let opened = open_items(body, &provider.sealer).map_err(|e| e.to_string())?;
        let body = opened.map_or_else(|| body.clone(), Bytes::from);
        if let Some(without) = take_trigger(&body) {
            if !serve {
                return Ok(Prepared { left_for_upstream: true, ..Prepared::unchanged(&body) });
            }
            let served = Some(Served::ResponsesTrigger);
            return Ok(Prepared { served, ..Prepared::unchanged(&Bytes::from(without)) });
        }
        let asked = memchr::memmem::find(&body, b"\"context_management\"").is_some();
        if !asked {
            return Ok(Prepared::unchanged(&body));
        }
        if !serve {
            return Ok(Prepared { left_for_upstream: true, ..Prepared::unchanged(&body) });
        }
        match take_context_management(&body)? {
            Some((stripped, compaction)) => Ok(Prepared {
                body: Bytes::from(stripped),
                served: Some(Served::ResponsesCompaction(compaction)),
                left_for_upstream: false,
                served_here: false,
            }),
            None => Ok(Prepared::unchanged(&body)),
        }
    }
}
