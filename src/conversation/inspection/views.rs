//! The JSON the inspection API answers with, from records and stored state.

use serde_json::{Value, json};

use crate::conversation::{FoldBlock, SessionState};
use crate::session::{Record, SessionKey, Summary};

/// `GET /sessions`.
pub fn list(found: &[(SessionKey, Summary)]) -> Value {
    let sessions: Vec<Value> = found.iter().map(|(key, s)| summary(key, s)).collect();
    json!({ "sessions": sessions })
}

fn summary(key: &SessionKey, s: &Summary) -> Value {
    json!({
        "key": key.as_str(),
        "model": s.model,
        "first_seen": s.first_seen,
        "last_seen": s.last_seen,
        "requests": s.requests,
        "tokens_before": s.tokens_before,
        "tokens_after": s.tokens_after,
        "folds": s.folds,
        "drops": s.drops,
        "tiers": s.tiers,
        "provider_compactions": s.provider_compactions,
    })
}

/// `GET /sessions/{key}`: the summary, the fold blocks with their digests (and when
/// each was made, when the record still holds it), the drops and the last requests.
pub fn detail(
    key: &SessionKey,
    record: Record,
    state: Option<&SessionState>,
    history: usize,
) -> Value {
    let mut view = summary(key, &record.summary);
    let first = record.summary.requests.saturating_sub(record.requests.len() as u64) + 1;
    let blocks: Vec<Value> =
        state.map(|s| s.blocks.iter().map(|b| block(b, &record)).collect()).unwrap_or_default();
    let pending = state
        .and_then(|s| s.pending.as_ref())
        .map(|b| json!({"start": b.start, "end": b.end, "summarizer": b.summarizer}));
    let cut: Vec<Value> = state
        .map(|s| {
            s.cut.iter().map(|c| json!({"at": c.pos, "dropped": c.messages.is_none()})).collect()
        })
        .unwrap_or_default();
    let mut requests = Vec::with_capacity(record.requests.len());
    let mut drops = Vec::new();
    // The changes kept belong to the last requests, one each.
    let without_changes = record.requests.len().saturating_sub(record.changes.len());
    let mut changes =
        record.changes.iter().skip(record.changes.len().saturating_sub(record.requests.len()));
    for (i, (n, r)) in (first..).zip(&record.requests).enumerate() {
        if r.dropped > 0 {
            drops.push(json!({"request": n, "at": r.at, "dropped": r.dropped}));
        }
        let mut entry = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut entry {
            map.insert("n".to_owned(), json!(n));
            if let Some(c) = (i >= without_changes).then(|| changes.next()).flatten() {
                map.insert("changes".to_owned(), json!(c.changes));
                map.insert("changes_more".to_owned(), json!(c.more));
            }
        }
        requests.push(entry);
    }
    if let Value::Object(map) = &mut view {
        map.insert("history".to_owned(), json!(history));
        map.insert("messages".to_owned(), json!(record.requests.back().map_or(0, |r| r.messages)));
        map.insert("blocks".to_owned(), Value::Array(blocks));
        map.insert("pending".to_owned(), pending.unwrap_or(Value::Null));
        map.insert("cut".to_owned(), Value::Array(cut));
        map.insert("drops".to_owned(), Value::Array(drops));
        map.insert("recent".to_owned(), Value::Array(requests));
        map.insert("folds_recorded".to_owned(), json!(record.folds));
    }
    view
}

/// One fold block: the range it replaced, its digest, who wrote it and when, and the
/// work trail of the conversation up to its end (one line per entry).
fn block(b: &FoldBlock, record: &Record) -> Value {
    let trail = b.trail.as_ref().map(|t| t.render(None, usize::MAX)).unwrap_or_default();
    let made =
        record.folds.iter().rev().find(|f| f.start as usize == b.start && f.end as usize == b.end);
    json!({
        "start": b.start,
        "end": b.end,
        "digest": b.messages.last().map(|m| digest_text(m.get())).unwrap_or_default(),
        "verbatim": b.verbatim,
        "summarizer": b.summarizer,
        "artifact_recall": b.artifact_recall,
        "trail": trail,
        "folded_at": made.map(|f| f.at),
    })
}

/// The text of a digest message (its `content`, a string or text parts).
fn digest_text(raw: &str) -> String {
    let Ok(message) = serde_json::from_str::<Value>(raw) else { return String::new() };
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_read_from_string_or_parts() {
        assert_eq!(
            digest_text(r#"{"role":"user","content":"[COMPACTED CONTEXT] x"}"#),
            "[COMPACTED CONTEXT] x"
        );
        assert_eq!(
            digest_text(
                r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#
            ),
            "a\nb"
        );
        assert_eq!(digest_text("not json"), "");
    }
}
