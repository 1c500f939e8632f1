//! OpenAI's `context_management` compaction on `/v1/responses`: foldgate's sealed
//! `compaction` items opened wherever they come back, and (when foldgate serves it) the
//! field taken out of the body; the exchange folds the request past its threshold and the
//! answer gets a `compaction` item first in `output` (see [`super::on_request`]).

use bytes::Bytes;

use super::{CompactionApis, CompactionFamily, Prepared, Served};
use crate::api::compaction_item::{open_items, take_context_management};
use crate::vocab::CompactionApi;

/// Responses `context_management` compaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesContext;

impl CompactionFamily for ResponsesContext {
    fn api(&self) -> CompactionApi {
        CompactionApi::ResponsesContextManagement
    }

    /// Opens foldgate's compaction items (a tampered or foreign one is an error); when
    /// foldgate serves `context_management`, takes it out of the body.
    fn prepare(
        &self,
        body: &Bytes,
        provider: &CompactionApis,
        serve: bool,
    ) -> Result<Prepared, String> {
        let opened = open_items(body, &provider.sealer).map_err(|e| e.to_string())?;
        let body = opened.map_or_else(|| body.clone(), Bytes::from);
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
