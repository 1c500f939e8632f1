//! Anthropic's compaction on `/v1/messages`: `context_management` (betas
//! `context-management-2025-06-27` and `compact-2026-01-12`: clearing edits applied to the
//! body, a `compact_20260112` edit folded by the exchange, see
//! [`super::Served::MessagesEdits`]) and on-demand compaction (beta `compact-2026-09-04`,
//! the top-level `compaction: {"type": "summarize"}`: foldgate answers with the whole
//! conversation folded into one block, see [`super::Served::MessagesSummarize`]).
//! Compaction blocks sent back are expanded into their summary as user text. The fields
//! are read and written in [`crate::api::anthropic_edits`].

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use memchr::memmem::Finder;

use super::on_request::{self, Concluded};
use super::{
    CompactionApis, CompactionFamily, FoldAsk, FoldFacts, Prepared, Served, rejects_field,
};
use crate::api::anthropic_edits;
use crate::conversation::Encoding;
use crate::conversation::{FoldWhen, WholeFold};
use crate::vocab::CompactionApi;

const ANTHROPIC_BETA: &str = "anthropic-beta";

/// Anthropic Messages `context_management`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagesContext;

/// True when `body` has a member named `quoted` (a JSON string with its quotes) anywhere:
/// the name followed by a colon, not a value (`"type":"compaction"` is a block, not the
/// field).
fn names_field(body: &[u8], quoted: &Finder<'_>) -> bool {
    quoted.find_iter(body).any(|at| {
        let rest = &body[at + quoted.needle().len()..];
        rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b':')
    })
}

// Built once: a searcher's setup costs more than searching a short body.
static CONTEXT_MANAGEMENT: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"context_management\""));
static COMPACTION: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"compaction\""));

impl CompactionFamily for MessagesContext {
    /// A `compact_20260112` edit past its trigger, with its instructions; on-demand
    /// compaction always, with the client's.
    fn fold_asked(&self, served: &Served) -> Option<FoldAsk> {
        match served {
            Served::MessagesEdits { edits, .. } => {
                let compact = edits.compact()?;
                let trigger = usize::try_from(compact.trigger).unwrap_or(usize::MAX);
                let when = FoldWhen::AtTokens(trigger.saturating_add(1));
                Some(FoldAsk { when, instructions: compact.instructions.clone() })
            }
            Served::MessagesSummarize(summarize) => Some(FoldAsk {
                when: FoldWhen::Always,
                instructions: summarize.instructions.clone(),
            }),
            _ => None,
        }
    }

    fn conclude(
        &self,
        served: Served,
        fold: Option<WholeFold>,
        request: &FoldFacts<'_>,
        _: &CompactionApis,
    ) -> Result<Concluded, String> {
        Ok(match served {
            Served::MessagesEdits { edits, applied } => {
                on_request::edits_answer(&edits, &applied, fold, request)
            }
            Served::MessagesSummarize(_) => on_request::summary_answer(fold, request),
            _ => Concluded::default(),
        })
    }

    fn api(&self) -> CompactionApi {
        CompactionApi::MessagesContextManagement
    }

    /// When foldgate serves `context_management`: compaction blocks sent back become
    /// their summary as user text (what they summarized dropped), the clearing edits are
    /// applied (tokens counted with the engine's default encoding over the body's JSON,
    /// an estimate), the field and its beta names are taken off.
    fn prepare(
        &self,
        body: &Bytes,
        _provider: &CompactionApis,
        serve: bool,
    ) -> Result<Prepared, String> {
        let asked = CONTEXT_MANAGEMENT.find(body).is_some();
        if !serve {
            let asked = asked || names_field(body, &COMPACTION);
            return Ok(Prepared { left_for_upstream: asked, ..Prepared::unchanged(body) });
        }
        let expanded = anthropic_edits::expand_compaction(body).unwrap_or_else(|| body.clone());
        if let Some(summarize) =
            anthropic_edits::parse_summarize(&expanded).map_err(|e| e.to_string())?
        {
            let body = anthropic_edits::without_summarize(&expanded).unwrap_or(expanded);
            let served = Some(Served::MessagesSummarize(summarize));
            return Ok(Prepared { served, served_here: true, ..Prepared::unchanged(&body) });
        }
        let Some(edits) = anthropic_edits::parse(&expanded).map_err(|e| e.to_string())? else {
            return Ok(Prepared { served_here: true, ..Prepared::unchanged(&expanded) });
        };
        let body = anthropic_edits::without_context_management(&expanded).unwrap_or(expanded);
        let count = |text: &str| Encoding::O200kBase.count(text);
        let input_tokens = std::str::from_utf8(&body).map_or(0, count);
        let cleared = anthropic_edits::apply_clearing(&body, &edits, input_tokens, &count);
        Ok(Prepared {
            body: cleared.body,
            served: Some(Served::MessagesEdits { edits, applied: cleared.applied }),
            left_for_upstream: false,
            served_here: true,
        })
    }

    /// Without the `anthropic-beta` names of the APIs foldgate serves, when it serves
    /// them (on digest calls too, which take these headers).
    fn forwarded_headers(&self, headers: &HeaderMap, prepared: &Prepared) -> HeaderMap {
        let mut headers = headers.clone();
        if !prepared.served_here {
            return headers;
        }
        let betas: Vec<String> = headers
            .get_all(ANTHROPIC_BETA)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(anthropic_edits::strip_betas)
            .collect();
        headers.remove(ANTHROPIC_BETA);
        for value in betas {
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                headers.append(ANTHROPIC_BETA, value);
            }
        }
        headers
    }

    /// An error naming `context_management`, on-demand `compaction` or one of the betas
    /// that enable them as unknown.
    fn refuses(&self, status: StatusCode, error_body: &[u8]) -> bool {
        let betas = [
            anthropic_edits::CONTEXT_MANAGEMENT_BETA,
            anthropic_edits::COMPACT_BETA,
            anthropic_edits::SUMMARIZE_BETA,
        ];
        let named = ["context_management", "compaction"].into_iter().chain(betas);
        status.is_client_error() && named.into_iter().any(|name| rejects_field(error_body, name))
    }
}
