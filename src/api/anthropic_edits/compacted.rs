//! A later request that carries a `compaction` block (in an assistant message, as the
//! answer that compacted gave it) rewritten for an upstream that does not know them:
//! everything before the last such block was compacted into its summary.
//!
//! Before the block, the user's own turns stay (their blocks byte for byte, without
//! `tool_result` blocks, whose calls are gone) and everything else goes (assistant
//! messages, user messages of tool results only); the block becomes a user `text` block
//! `"[COMPACTED CONTEXT]\n<summary>"` (keeping its `cache_control`) at its place; what
//! follows stays. Adjacent messages of one role are merged (a string content becomes a
//! text block), so the result starts with `user` and alternates. A block whose `content`
//! is `null` (a compaction that failed) is removed and changes nothing else; so is a
//! `compaction` block anywhere else. Thinking blocks are never edited.

use std::collections::HashSet;

use serde_json::Value;

use super::layout::{Blk, Content, Head, Msg, read};
use crate::api::{ListWriter, Origins};
use crate::model::DIGEST_MARKER;

/// The body `body` rewritten so that no `compaction` block is left (see the module
/// documentation); every byte outside `messages` as received. `None` when it has no
/// `compaction` block, or is not a Messages body this understands.
pub fn expand_compaction(body: &[u8]) -> Option<bytes::Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    let conversation = read(text)?;
    let messages = &conversation.messages;
    let any = messages.iter().any(|m| m.blocks().iter().any(is_compaction));
    if !any {
        return None;
    }
    let cut = last_summary(messages);
    let mut out: Vec<Piece<'_>> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match &cut {
            Some((at, _, _)) if i < *at => {
                if !m.assistant && !m.results_only() {
                    out.push(piece(m, |b| b.head.kind != "tool_result"));
                }
            }
            Some((at, block, summary)) if i == *at => {
                out.push(Piece::new(false, vec![Part::New(summary.clone())]));
                let rest = m.blocks().iter().skip(block + 1).filter(|b| !is_compaction(b));
                out.push(Piece::new(true, rest.map(|b| Part::Raw(b.raw)).collect()));
            }
            _ => out.push(piece(m, |_| true)),
        }
    }
    let merged = merge(drop_orphans(out));
    let mut list = ListWriter::with_capacity(text.len());
    for p in &merged {
        list.push(p.json().as_bytes());
    }
    let origins = Origins { list: conversation.list.clone(), ..Origins::default() };
    Some(origins.splice(body, &list.finish()))
}

/// A `compaction` block.
fn is_compaction(block: &Blk<'_>) -> bool {
    block.head.kind == "compaction"
}

/// The last `compaction` block with a summary in an assistant message: its message, its
/// index among the message's blocks, and the text block that replaces it.
fn last_summary(messages: &[Msg<'_>]) -> Option<(usize, usize, String)> {
    messages.iter().enumerate().rev().filter(|(_, m)| m.assistant).find_map(|(i, m)| {
        let blocks = m.blocks();
        blocks.iter().enumerate().rev().filter(|(_, b)| is_compaction(b)).find_map(|(j, b)| {
            let summary =
                b.head.content.and_then(|c| serde_json::from_str::<String>(c.get()).ok())?;
            let mut text = serde_json::Map::new();
            text.insert("type".into(), "text".into());
            text.insert("text".into(), format!("{DIGEST_MARKER}\n{summary}").into());
            let block: Value = serde_json::from_str(b.raw).ok()?;
            if let Some(cache) = block.get("cache_control").filter(|c| !c.is_null()) {
                text.insert("cache_control".into(), cache.clone());
            }
            Some((i, j, serde_json::to_string(&text).ok()?))
        })
    })
}

/// A message of the rewritten list: its role and its blocks, or its original text when
/// nothing in it changed.
#[derive(Debug)]
struct Piece<'a> {
    assistant: bool,
    parts: Vec<Part<'a>>,
    /// The original message, when `parts` are all its blocks unchanged.
    whole: Option<&'a str>,
}

/// A block of a rewritten message.
#[derive(Debug, Clone)]
enum Part<'a> {
    /// A block as received.
    Raw(&'a str),
    /// A string content as received (its JSON string), written as a text block.
    Text(&'a str),
    /// A block written here.
    New(String),
}

impl<'a> Piece<'a> {
    fn new(assistant: bool, parts: Vec<Part<'a>>) -> Self {
        Self { assistant, parts, whole: None }
    }

    /// The message's JSON text.
    fn json(&self) -> String {
        if let Some(whole) = self.whole {
            return whole.to_owned();
        }
        let role = if self.assistant { "assistant" } else { "user" };
        let blocks: Vec<String> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Raw(raw) => (*raw).to_owned(),
                Part::Text(string) => format!(r#"{{"type":"text","text":{string}}}"#),
                Part::New(block) => block.clone(),
            })
            .collect();
        format!(r#"{{"role":"{role}","content":[{}]}}"#, blocks.join(","))
    }
}

/// Message `m` with the blocks `keep` accepts and no `compaction` block; its original
/// text when that is all of it.
fn piece<'a>(m: &Msg<'a>, keep: impl Fn(&Blk<'a>) -> bool) -> Piece<'a> {
    let parts: Vec<Part<'a>> = match &m.body {
        Content::Text("\"\"") => Vec::new(),
        Content::Text(string) => vec![Part::Text(string)],
        Content::Blocks(blocks) => blocks
            .iter()
            .filter(|b| keep(b) && !is_compaction(b))
            .map(|b| Part::Raw(b.raw))
            .collect(),
    };
    let all = match &m.body {
        Content::Text(_) => true,
        Content::Blocks(blocks) => parts.len() == blocks.len(),
    };
    Piece { assistant: m.assistant, parts, whole: all.then_some(m.raw) }
}

/// `pieces` without the `tool_result` blocks whose `tool_use` is not kept.
fn drop_orphans(mut pieces: Vec<Piece<'_>>) -> Vec<Piece<'_>> {
    let mut calls: HashSet<String> = HashSet::new();
    for p in pieces.iter_mut() {
        let before = p.parts.len();
        p.parts.retain(|part| {
            let Part::Raw(raw) = part else { return true };
            let Some(h) = head(raw) else { return true };
            if h.kind == "tool_use" {
                calls.extend(h.id.map(|id| id.into_owned()));
            }
            h.kind != "tool_result" || h.tool_use_id.is_some_and(|id| calls.contains(&*id))
        });
        if p.parts.len() != before {
            p.whole = None;
        }
    }
    pieces
}

/// The members of a block the rewrite reads.
fn head(raw: &str) -> Option<Head<'_>> {
    serde_json::from_str(raw).ok()
}

/// `pieces` without empty ones, adjacent ones of one role merged.
fn merge(pieces: Vec<Piece<'_>>) -> Vec<Piece<'_>> {
    let mut out: Vec<Piece<'_>> = Vec::new();
    for p in pieces.into_iter().filter(|p| !p.parts.is_empty()) {
        match out.last_mut() {
            Some(last) if last.assistant == p.assistant => {
                last.parts.extend(p.parts);
                last.whole = None;
            }
            _ => out.push(p),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn expand(body: &Value) -> Value {
        let out = expand_compaction(body.to_string().as_bytes()).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    /// `user` first, roles alternating, every `tool_result` after its `tool_use`, no
    /// `compaction` block left.
    fn assert_valid(value: &Value) {
        let messages = value["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "user", "{value:#}");
        for pair in messages.windows(2) {
            assert_ne!(pair[0]["role"], pair[1]["role"], "{value:#}");
        }
        let mut calls = Vec::new();
        for m in messages {
            for b in m["content"].as_array().into_iter().flatten() {
                assert_ne!(b["type"], "compaction");
                if b["type"] == "tool_use" {
                    calls.push(b["id"].clone());
                }
                if b["type"] == "tool_result" {
                    assert!(calls.contains(&b["tool_use_id"]), "{value:#}");
                }
            }
        }
    }

    fn summary(text: &str) -> Value {
        json!({"type": "text", "text": format!("{DIGEST_MARKER}\n{text}")})
    }

    #[test]
    fn user_turns_stay_and_the_summary_takes_the_blocks_place() {
        let body = json!({"model": "m", "system": "s", "messages": [
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s1"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "read it"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "late"},
                {"type": "text", "text": "small note"}]},
            {"role": "assistant", "content": [
                {"type": "compaction", "content": "SUM", "cache_control": {"type": "ephemeral"}},
                {"type": "thinking", "thinking": "u", "signature": "s2"},
                {"type": "text", "text": "answer"}]},
            {"role": "user", "content": "next"},
        ], "stream": false});
        let out = expand(&body);
        assert_valid(&out);
        let mut digest = summary("SUM");
        digest["cache_control"] = json!({"type": "ephemeral"});
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "task"},
                    {"type": "text", "text": "small note"},
                    digest]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "u", "signature": "s2"},
                    {"type": "text", "text": "answer"}]},
                {"role": "user", "content": "next"},
            ])
        );
        for field in ["model", "system", "stream"] {
            assert_eq!(out[field], body[field]);
        }
    }

    #[test]
    fn without_small_user_turns_the_summary_opens_the_conversation() {
        let text = r#"{"model":"m","messages":[
  {"role":"user","content":[{"type":"text","text":"task"}]},
  {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"a","input":{}}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]},
  {"role":"assistant","content":[{"type":"compaction","content":"S"},{"type":"tool_use","id":"t2","name":"a","input":{}}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"r2"}]}
], "max_tokens": 10}"#;
        let out = expand_compaction(text.as_bytes()).unwrap();
        let out = std::str::from_utf8(&out).unwrap();
        assert_eq!(
            out,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"task"},{"type":"text","text":"[COMPACTED CONTEXT]\nS"}]},{"role":"assistant","content":[{"type":"tool_use","id":"t2","name":"a","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"r2"}]}], "max_tokens": 10}"#
        );
        assert_eq!(expand_compaction(text.as_bytes()).unwrap(), out.as_bytes(), "deterministic");
        // With no user turn at all before it, the summary alone opens the conversation.
        let only_tools = text.replace(
            r#"{"role":"user","content":[{"type":"text","text":"task"}]},"#,
            r#"{"role":"user","content":[]},"#,
        );
        let out: Value =
            serde_json::from_slice(&expand_compaction(only_tools.as_bytes()).unwrap()).unwrap();
        assert_valid(&out);
        assert_eq!(out["messages"][0]["content"], json!([summary("S")]));
    }

    #[test]
    fn a_null_compaction_block_is_only_removed() {
        let body = json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [
                {"type": "compaction", "content": null}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": [{"type": "compaction", "content": null}]},
            {"role": "user", "content": "d"},
        ]});
        let out = expand(&body);
        assert_valid(&out);
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
            ])
        );
        // The summary is the last block that has one; a later null one changes nothing.
        let body = json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [{"type": "compaction", "content": "S1"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": [{"type": "compaction", "content": "S2"}, {"type": "text", "text": "e"}]},
            {"role": "user", "content": "f"},
            {"role": "assistant", "content": [{"type": "compaction", "content": null}, {"type": "text", "text": "g"}]},
            {"role": "user", "content": "h"},
        ]});
        let out = expand(&body);
        assert_valid(&out);
        let first = &out["messages"][0]["content"];
        assert_eq!(
            *first,
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "c"}, summary("S2")])
        );
        assert_eq!(out["messages"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn bodies_without_compaction_are_not_rewritten() {
        let plain = br#"{"messages":[{"role":"user","content":"a"}]}"#;
        assert!(expand_compaction(plain).is_none());
        assert!(expand_compaction(b"{").is_none());
        assert!(expand_compaction(br#"{"messages":[{"role":"user","content":[7]}]}"#).is_none());
        // Text that only mentions a compaction block is not one.
        let mention = br#"{"messages":[{"role":"user","content":"{\"type\":\"compaction\"}"}]}"#;
        assert!(expand_compaction(mention).is_none());
    }
}
