//! `POST /v1/responses/compact`: forwarded to the upstream that serves it, answered by
//! foldgate for one that does not (`responses.compact`), through the request's exchange
//! like any request of a compacted route (the dialect is
//! [`crate::http::dialect::ResponsesCompact`], the family [`CompactEndpoint`]). foldgate's answer has the
//! documented shape: `object: "response.compaction"`, `output` the messages a fold keeps
//! verbatim (the user's, as sent) followed by one `compaction` item sealing the digest
//! of everything else (see [`crate::api::compaction_item`]), and `usage` (input: the
//! request's prompt tokens; output: the digest's).

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::on_request::{Addition, Concluded};
use super::{CompactionApis, CompactionFamily, FoldAsk, FoldFacts, Prepared, Served};
use crate::api::compaction_item::{self, Sealed, open_items};
use crate::api::{ListWriter, Origins};
use crate::conversation::FoldWhen;
use crate::conversation::WholeFold;
use crate::model::DIGEST_MARKER;
use crate::vocab::CompactionApi;

/// `POST /v1/responses/compact`, the endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct CompactEndpoint;

impl CompactionFamily for CompactEndpoint {
    /// The whole conversation, always.
    fn fold_asked(&self, served: &Served) -> Option<FoldAsk> {
        matches!(served, Served::ResponsesCompact)
            .then_some(FoldAsk { when: FoldWhen::Always, instructions: None })
    }

    /// The `response.compaction` object (see [`answer`]).
    fn conclude(
        &self,
        served: Served,
        fold: Option<WholeFold>,
        request: &FoldFacts<'_>,
        apis: &CompactionApis,
    ) -> Result<Concluded, String> {
        if !matches!(served, Served::ResponsesCompact) {
            return Ok(Concluded::default());
        }
        let body = answer(&apis.sealer, request.body, fold.as_ref())?;
        let addition = Some(Addition::Answer { body, events: false });
        Ok(Concluded { addition, api: Some(CompactionApi::ResponsesCompact), notes: Vec::new() })
    }

    fn api(&self) -> CompactionApi {
        CompactionApi::ResponsesCompact
    }

    /// Opens foldgate's compaction items in `input` (a tampered or foreign one is an
    /// error); when foldgate serves the request, checks that it can.
    fn prepare(
        &self,
        body: &Bytes,
        apis: &CompactionApis,
        serve: bool,
    ) -> Result<Prepared, String> {
        if !serve {
            // Asked of the upstream as received.
            return Ok(Prepared { left_for_upstream: true, ..Prepared::unchanged(body) });
        }
        check(body)?;
        let opened = open_items(body, &apis.sealer).map_err(|e| e.to_string())?;
        let body = opened.map_or_else(|| body.clone(), Bytes::from);
        Ok(Prepared { served: Some(Served::ResponsesCompact), ..Prepared::unchanged(&body) })
    }

    /// An upstream without the endpoint answers 404 or 405.
    fn refuses(&self, status: StatusCode, _: &[u8]) -> bool {
        matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED)
    }

    fn answers_whole(&self) -> bool {
        true
    }
}

/// The fields of a compact request foldgate reads.
#[derive(Deserialize)]
struct CompactRequest<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    previous_response_id: Option<&'a RawValue>,
}

/// Checks that foldgate can answer the compact request `body` itself: an error (a 400)
/// says what is missing or cannot be served.
pub fn check(body: &[u8]) -> Result<(), String> {
    let top: CompactRequest<'_> =
        serde_json::from_slice(body).map_err(|e| format!("the body is not a JSON object: {e}"))?;
    let present = |v: Option<&RawValue>| v.is_some_and(|v| v.get() != "null");
    if present(top.previous_response_id) {
        return Err("previous_response_id cannot be resolved: this gateway compacts for an upstream without /responses/compact and keeps no responses; send the conversation's items in `input` instead".to_owned());
    }
    if !present(top.model) {
        return Err("`model` is required".to_owned());
    }
    if !present(top.input) {
        return Err("`input` is required: the conversation's items to compact".to_owned());
    }
    Ok(())
}

/// foldgate's answer to the compact request `body`, folded as `fold` (`None`: nothing to
/// fold, every message kept and an empty digest sealed).
pub fn answer(
    sealer: &compaction_item::Sealer,
    body: &[u8],
    fold: Option<&WholeFold>,
) -> Result<Vec<u8>, String> {
    let unreadable = || "`input` is not a list of Responses items this gateway can read";
    let (_, origins) = crate::api::responses::parse(body).ok_or_else(|| unreadable().to_owned())?;
    Ok(compaction_object(sealer, body, &origins, fold))
}

/// The `response.compaction` object for `body` (parsed into `origins`) folded as `fold`
/// (`None`: nothing to fold, every message kept and an empty digest sealed).
fn compaction_object(
    sealer: &compaction_item::Sealer,
    body: &[u8],
    origins: &Origins,
    fold: Option<&WholeFold>,
) -> Vec<u8> {
    let kept: Vec<usize> = match fold {
        Some(fold) => fold.kept.clone(),
        None => (0..origins.messages.len()).collect(),
    };
    let mut output = ListWriter::with_capacity(body.len() / 2);
    let text_input = body.get(origins.list.start) == Some(&b'"');
    for origin in kept.iter().filter_map(|&k| origins.messages.get(k)) {
        for i in origin.items.clone() {
            let raw = origins.item(body, i);
            if text_input {
                let text = String::from_utf8_lossy(raw);
                let item = format!(r#"{{"type":"message","role":"user","content":{text}}}"#);
                output.push(item.as_bytes());
            } else {
                output.push(raw);
            }
        }
    }
    let digest = fold.map(|f| f.digest.clone()).unwrap_or_default();
    debug_assert!(digest.is_empty() || digest.starts_with(DIGEST_MARKER));
    let id = format!("cmp_{}", uuid::Uuid::new_v4().simple());
    output.push(compaction_item::item(&id, &sealer.seal(&Sealed { digest })).as_bytes());
    let (input_tokens, output_tokens) =
        fold.map_or((0, 0), |f| (f.report.tokens_before, f.digest_tokens));
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let usage = serde_json::json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    });
    let mut out = format!(
        r#"{{"id":"resp_{}","object":"response.compaction","created_at":{created},"output":"#,
        uuid::Uuid::new_v4().simple()
    )
    .into_bytes();
    out.extend_from_slice(&output.finish());
    out.extend_from_slice(format!(r#","usage":{usage}}}"#).as_bytes());
    out
}
