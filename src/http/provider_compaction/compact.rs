//! `POST /v1/responses/compact`: forwarded to the upstream that serves it, answered by
//! foldgate for one that does not (`responses.compact`). foldgate's answer has the
//! documented shape: `object: "response.compaction"`, `output` the messages a fold keeps
//! verbatim (the user's, as sent) followed by one `compaction` item sealing the digest
//! of everything else (see [`crate::api::compaction_item`]), and `usage` (input: the
//! request's prompt tokens; output: the digest's).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::compaction_item::{self, Sealed, open_items};
use crate::api::{ListWriter, Origins};
use crate::config::ServedBy;
use crate::conversation::{FoldWhen, Options, WholeFold};
use crate::http::body::{BodyProgress, ProxyBody, full};
use crate::http::dialect::Responses;
use crate::http::error::ProxyError;
use crate::http::passthrough::{self, build_request, client_response};
use crate::http::request_body;
use crate::http::turn::{Turns, caller, record_untaken};
use crate::http::upstream::Upstream;
use crate::learned::CompactionApi;
use crate::metrics::{Metrics, Route};
use crate::model::DIGEST_MARKER;
use crate::vocab::Outcome;

const API: CompactionApi = CompactionApi::ResponsesCompact;

/// Handles `POST /v1/responses/compact`. Recorded like any request of a compacted route
/// (outcome, inspector entry, `x-foldgate-*` headers): `compacted` when foldgate folded
/// the conversation, `passthrough` when the upstream answered.
pub async fn handle(
    turns: &Turns,
    upstream: &Upstream,
    max_body: u64,
    metrics: &Arc<Metrics>,
    request: Request<Incoming>,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let provider = &turns.provider;
    let conversations = &turns.conversations;
    if provider.served_by(API) == ServedBy::Upstream {
        return passthrough::forward(upstream, max_body, metrics, request, progress).await;
    }
    let (parts, body) = request.into_parts();
    let received = request_body::read(&parts.headers, body, max_body, progress, metrics).await?;
    let body = received.content().cloned();
    if body.is_none() || !provider.foldgate_serves(API, conversations, upstream.name()) {
        // Asked first, as received (a body foldgate cannot decode is only ever forwarded).
        let mut headers = parts.headers.clone();
        let raw = received.raw().clone();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(raw.len()));
        let outgoing =
            build_request(upstream, parts.method.clone(), &parts.uri, headers, full(raw))?;
        let response = upstream.send(outgoing).await?;
        if !matches!(response.status(), StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED) {
            metrics.provider_compaction(API, false);
            let response = client_response(response);
            let turn = body.as_ref().and_then(|body| {
                turns.begin_whole(&Responses, upstream.name(), &parts.headers, body, metrics)
            });
            return Ok(match turn {
                Some(turn) => {
                    let response = turn.finish(response);
                    // The span is the compact request's, not a chat turn's.
                    crate::http::trace::record_compact(turn.model_name(), None);
                    response
                }
                None => {
                    record_untaken(metrics, Route::Responses, Outcome::NotChat);
                    response
                }
            });
        }
        conversations.learn_unserved(API, upstream.name()).await;
    }
    let Some(body) = body else {
        return Err(ProxyError::InvalidRequest(
            "the request body's Content-Encoding could not be decoded".to_owned(),
        ));
    };
    let response = serve(turns, upstream, metrics, &parts.headers, &body).await?;
    metrics.provider_compaction(API, true);
    Ok(response)
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

/// foldgate's own answer to a compact request, recorded as the request's turn.
async fn serve(
    turns: &Turns,
    upstream: &Upstream,
    metrics: &Arc<Metrics>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response<ProxyBody>, ProxyError> {
    let invalid = |m: &str| ProxyError::InvalidRequest(m.to_owned());
    let top: CompactRequest<'_> = serde_json::from_slice(body)
        .map_err(|e| ProxyError::InvalidRequest(format!("the body is not a JSON object: {e}")))?;
    let present = |v: Option<&RawValue>| v.is_some_and(|v| v.get() != "null");
    if present(top.previous_response_id) {
        return Err(invalid(
            "previous_response_id cannot be resolved: this gateway compacts for an upstream without /responses/compact and keeps no responses; send the conversation's items in `input` instead",
        ));
    }
    if !present(top.model) {
        return Err(invalid("`model` is required"));
    }
    if !present(top.input) {
        return Err(invalid("`input` is required: the conversation's items to compact"));
    }
    let provider = &turns.provider;
    let opened = open_items(body, &provider.sealer)
        .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
    let body = opened.map_or_else(|| body.clone(), Bytes::from);
    let unreadable = || invalid("`input` is not a list of Responses items this gateway can read");
    let mut turn = turns
        .begin_whole(&Responses, upstream.name(), headers, &body, metrics)
        .ok_or_else(unreadable)?;
    turn.served(API);
    let (request, _) = turn.parsed().ok_or_else(unreadable)?;
    let request = request.clone();
    let caller = caller(&Responses, headers);
    let fold = turns
        .conversations
        .fold_whole(&request, &caller, &Options::default(), FoldWhen::Always)
        .await
        .map_err(ProxyError::Internal)?;
    if let Some(fold) = &fold {
        turn.folded(fold);
    }
    let (_, origins) = turn.parsed().ok_or_else(unreadable)?;
    let answer = answer(&provider.sealer, &body, origins, fold.as_ref());
    let mut response = Response::new(full(answer));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().insert("x-foldgate-served-by", HeaderValue::from_static("foldgate"));
    let response = turn.finish(response);
    // The span is the compact request's, not a chat turn's.
    let model = request.model().unwrap_or_default();
    crate::http::trace::record_compact(&model, fold.as_ref().map(|f| &f.report));
    Ok(response)
}

/// The `response.compaction` object for `body` (parsed into `origins`) folded as `fold`
/// (`None`: nothing to fold, every message kept and an empty digest sealed).
fn answer(
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
