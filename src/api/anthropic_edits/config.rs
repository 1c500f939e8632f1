//! The request's `context_management` field read into typed edits, every default
//! applied, every malformed value an [`EditError`] naming the field.

use serde_json::{Map, Value};

use crate::api::json_text::Object;

/// `clear_tool_uses_20250919`'s default trigger, in input tokens.
pub const DEFAULT_CLEAR_TRIGGER: u64 = 100_000;
/// `clear_tool_uses_20250919`'s default number of recent tool uses kept.
pub const DEFAULT_KEEP_TOOL_USES: usize = 3;
/// `compact_20260112`'s default trigger, in input tokens.
pub const DEFAULT_COMPACT_TRIGGER: u64 = 150_000;

/// A `context_management` field foldgate cannot serve; its text names the field (an
/// HTTP 400 `invalid_request_error` at the edge).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The body is not a JSON object.
    #[error("the request body is not a JSON object")]
    NotAnObject,
    /// A field's value has the wrong shape.
    #[error("{field}: expected {expected}")]
    Invalid {
        /// The field, as a dotted path (`context_management.edits.0.keep.value`).
        field: String,
        /// What it should be.
        expected: &'static str,
    },
    /// An edit `type` foldgate does not know.
    #[error(
        "{field}: unknown edit type `{kind}` (expected clear_tool_uses_20250919, clear_thinking_20251015 or compact_20260112)"
    )]
    UnknownType {
        /// The field, as a dotted path.
        field: String,
        /// The type given.
        kind: String,
    },
    /// A field the object does not take.
    #[error("{field}: extra inputs are not permitted")]
    Extra {
        /// The field, as a dotted path.
        field: String,
    },
}

/// The edits of a request's `context_management`, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextManagement {
    /// The edits, in the order given.
    pub edits: Vec<Edit>,
}

impl ContextManagement {
    /// The `compact_20260112` edit, if any (the last one given).
    pub fn compact(&self) -> Option<&Compact> {
        self.edits.iter().rev().find_map(|e| match e {
            Edit::Compact(c) => Some(c),
            _ => None,
        })
    }
}

/// One edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// `clear_tool_uses_20250919`.
    ClearToolUses(ClearToolUses),
    /// `clear_thinking_20251015`.
    ClearThinking(ClearThinking),
    /// `compact_20260112`.
    Compact(Compact),
}

/// `clear_tool_uses_20250919`: old tool results replaced by a placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearToolUses {
    /// When it applies.
    pub trigger: Trigger,
    /// How many of the most recent tool uses stay untouched.
    pub keep: usize,
    /// Apply only when at least this many input tokens would be cleared.
    pub clear_at_least: Option<u64>,
    /// Tools whose uses are never cleared.
    pub exclude_tools: Vec<String>,
    /// Whose `input` is cleared too.
    pub clear_tool_inputs: ClearInputs,
}

/// When `clear_tool_uses_20250919` applies: once the request has more than this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Input tokens.
    InputTokens(u64),
    /// Tool uses.
    ToolUses(u64),
}

/// Which cleared tool uses also have their `input` replaced by `{}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearInputs {
    /// None (the default).
    None,
    /// All of them.
    All,
    /// Those of these tools.
    Tools(Vec<String>),
}

impl ClearInputs {
    /// True when a cleared use of tool `name` has its input cleared.
    pub fn covers(&self, name: &str) -> bool {
        match self {
            Self::None => false,
            Self::All => true,
            Self::Tools(names) => names.iter().any(|n| n == name),
        }
    }
}

/// `clear_thinking_20251015`: thinking blocks of older assistant turns removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearThinking {
    /// Which turns keep their thinking.
    pub keep: ThinkingKeep,
}

/// Which assistant turns keep their thinking blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingKeep {
    /// The last this many turns that have thinking (default 1).
    Turns(usize),
    /// All of them (the edit changes nothing).
    All,
}

/// `compact_20260112`: the conversation summarized once it passes the trigger (by the
/// caller; this module only reads the settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compact {
    /// Input tokens past which the conversation is compacted.
    pub trigger: u64,
    /// Additional instructions for the summary.
    pub instructions: Option<String>,
    /// Answer with the compaction block alone (`stop_reason` `compaction`).
    pub pause_after_compaction: bool,
}

impl Compact {
    /// True when a request of `input_tokens` is past the trigger.
    pub fn triggered(&self, input_tokens: u64) -> bool {
        input_tokens > self.trigger
    }
}

/// Reads the body's `context_management` field: `Ok(None)` when it has none (or `null`).
pub fn parse(body: &[u8]) -> Result<Option<ContextManagement>, EditError> {
    let text = std::str::from_utf8(body).map_err(|_| EditError::NotAnObject)?;
    let object = Object::parse(text).ok_or(EditError::NotAnObject)?;
    let Some(raw) = object.value(text, "context_management") else { return Ok(None) };
    let value: Value = serde_json::from_str(raw).map_err(|_| EditError::NotAnObject)?;
    if value.is_null() {
        return Ok(None);
    }
    let field = "context_management";
    let map = object_of(&value, field)?;
    only(map, field, &["edits"])?;
    let edits = match map.get("edits") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(edits)) => edits
            .iter()
            .enumerate()
            .map(|(i, e)| edit(e, &format!("{field}.edits.{i}")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid(&format!("{field}.edits"), "an array of edits")),
    };
    Ok(Some(ContextManagement { edits }))
}

/// On-demand compaction (`compaction: {"type": "summarize", "instructions"?}`, beta
/// `compact-2026-09-04`): the whole conversation summarized into one `compaction` block,
/// the answer holding that block alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summarize {
    /// The client's summarization instructions; empty or whitespace-only ones count as
    /// absent.
    pub instructions: Option<String>,
}

/// Reads the body's top-level `compaction` field: `Ok(None)` when it has none (or
/// `null`). It cannot be combined with `context_management`.
pub fn parse_summarize(body: &[u8]) -> Result<Option<Summarize>, EditError> {
    let text = std::str::from_utf8(body).map_err(|_| EditError::NotAnObject)?;
    let object = Object::parse(text).ok_or(EditError::NotAnObject)?;
    let Some(raw) = object.value(text, "compaction") else { return Ok(None) };
    let value: Value = serde_json::from_str(raw).map_err(|_| EditError::NotAnObject)?;
    if value.is_null() {
        return Ok(None);
    }
    let field = "compaction";
    let map = object_of(&value, field)?;
    only(map, field, &["type", "instructions"])?;
    match map.get("type") {
        Some(Value::String(kind)) if kind == "summarize" => {}
        Some(Value::String(kind)) => {
            let field = format!("{field}.type");
            return Err(EditError::UnknownType { field, kind: kind.clone() });
        }
        _ => return Err(invalid(&format!("{field}.type"), "\"summarize\"")),
    }
    let instructions = match map.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.trim()).filter(|t| !t.is_empty()).map(str::to_owned),
        Some(_) => return Err(invalid(&format!("{field}.instructions"), "a string")),
    };
    if object.value(text, "context_management").is_some_and(|v| v.trim() != "null") {
        return Err(EditError::Invalid {
            field: "compaction".to_owned(),
            expected: "no `context_management` beside it (they cannot be combined)",
        });
    }
    Ok(Some(Summarize { instructions }))
}

/// One edit of the list (`field`: its path).
fn edit(value: &Value, field: &str) -> Result<Edit, EditError> {
    let map = object_of(value, field)?;
    let kind = match map.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        _ => return Err(invalid(&format!("{field}.type"), "an edit type string")),
    };
    match kind {
        "clear_tool_uses_20250919" => clear_tool_uses(map, field).map(Edit::ClearToolUses),
        "clear_thinking_20251015" => clear_thinking(map, field).map(Edit::ClearThinking),
        "compact_20260112" => compact(map, field).map(Edit::Compact),
        _ => Err(EditError::UnknownType { field: format!("{field}.type"), kind: kind.to_owned() }),
    }
}

/// `clear_tool_uses_20250919`'s settings.
fn clear_tool_uses(map: &Map<String, Value>, field: &str) -> Result<ClearToolUses, EditError> {
    const FIELDS: [&str; 6] =
        ["type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"];
    only(map, field, &FIELDS)?;
    let path = |name: &str| format!("{field}.{name}");
    let trigger = match present(map, "trigger") {
        None => Trigger::InputTokens(DEFAULT_CLEAR_TRIGGER),
        Some(v) => match counted(v, &path("trigger"), &["input_tokens", "tool_uses"])? {
            ("tool_uses", n) => Trigger::ToolUses(n),
            (_, n) => Trigger::InputTokens(n),
        },
    };
    let keep = match present(map, "keep") {
        None => DEFAULT_KEEP_TOOL_USES,
        Some(v) => to_usize(counted(v, &path("keep"), &["tool_uses"])?.1),
    };
    let clear_at_least = present(map, "clear_at_least")
        .map(|v| counted(v, &path("clear_at_least"), &["input_tokens"]).map(|(_, n)| n))
        .transpose()?;
    let exclude_tools = match present(map, "exclude_tools") {
        None => Vec::new(),
        Some(v) => names(v, &path("exclude_tools"))?,
    };
    let clear_tool_inputs = match present(map, "clear_tool_inputs") {
        None | Some(Value::Bool(false)) => ClearInputs::None,
        Some(Value::Bool(true)) => ClearInputs::All,
        Some(v) => ClearInputs::Tools(names(v, &path("clear_tool_inputs")).map_err(|_| {
            invalid(&path("clear_tool_inputs"), "a boolean or an array of tool names")
        })?),
    };
    Ok(ClearToolUses { trigger, keep, clear_at_least, exclude_tools, clear_tool_inputs })
}

/// `clear_thinking_20251015`'s settings.
fn clear_thinking(map: &Map<String, Value>, field: &str) -> Result<ClearThinking, EditError> {
    only(map, field, &["type", "keep"])?;
    let path = format!("{field}.keep");
    let keep = match present(map, "keep") {
        None => ThinkingKeep::Turns(1),
        Some(Value::String(all)) if all == "all" => ThinkingKeep::All,
        Some(Value::Object(m)) if m.get("type").and_then(Value::as_str) == Some("all") => {
            only(m, &path, &["type"])?;
            ThinkingKeep::All
        }
        Some(v @ Value::Object(_)) => {
            ThinkingKeep::Turns(to_usize(counted(v, &path, &["thinking_turns"])?.1))
        }
        Some(_) => {
            return Err(invalid(
                &path,
                r#"{"type":"thinking_turns","value":N}, {"type":"all"} or "all""#,
            ));
        }
    };
    Ok(ClearThinking { keep })
}

/// `compact_20260112`'s settings.
fn compact(map: &Map<String, Value>, field: &str) -> Result<Compact, EditError> {
    only(map, field, &["type", "trigger", "instructions", "pause_after_compaction"])?;
    let path = |name: &str| format!("{field}.{name}");
    let trigger = match present(map, "trigger") {
        None => DEFAULT_COMPACT_TRIGGER,
        Some(v) => counted(v, &path("trigger"), &["input_tokens"])?.1,
    };
    let instructions = match present(map, "instructions") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid(&path("instructions"), "a string or null")),
    };
    let pause_after_compaction = match present(map, "pause_after_compaction") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid(&path("pause_after_compaction"), "a boolean")),
    };
    Ok(Compact { trigger, instructions, pause_after_compaction })
}

/// A member that is there and not `null`.
fn present<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).filter(|v| !v.is_null())
}

/// A `{"type": <one of kinds>, "value": <whole number>}` object: its type and value.
fn counted<'k>(value: &Value, field: &str, kinds: &[&'k str]) -> Result<(&'k str, u64), EditError> {
    let map = object_of(value, field)?;
    only(map, field, &["type", "value"])?;
    let given = map.get("type").and_then(Value::as_str);
    let Some(kind) = kinds.iter().find(|k| Some(**k) == given) else {
        let expected = match kinds {
            ["input_tokens"] => r#""input_tokens""#,
            ["tool_uses"] => r#""tool_uses""#,
            ["thinking_turns"] => r#""thinking_turns""#,
            _ => r#""input_tokens" or "tool_uses""#,
        };
        return Err(invalid(&format!("{field}.type"), expected));
    };
    match map.get("value").and_then(Value::as_u64) {
        Some(n) => Ok((kind, n)),
        None => Err(invalid(&format!("{field}.value"), "a non-negative integer")),
    }
}

/// An array of tool names.
fn names(value: &Value, field: &str) -> Result<Vec<String>, EditError> {
    let err = || invalid(field, "an array of tool names");
    let items = value.as_array().ok_or_else(err)?;
    items.iter().map(|v| v.as_str().map(str::to_owned).ok_or_else(err)).collect()
}

/// `value` as an object.
fn object_of<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, EditError> {
    value.as_object().ok_or_else(|| invalid(field, "an object"))
}

/// An error for the first member of `map` not in `allowed`.
fn only(map: &Map<String, Value>, field: &str, allowed: &[&str]) -> Result<(), EditError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(extra) => Err(EditError::Extra { field: format!("{field}.{extra}") }),
        None => Ok(()),
    }
}

fn invalid(field: &str, expected: &'static str) -> EditError {
    EditError::Invalid { field: field.to_owned(), expected }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(cm: Value) -> Result<Option<ContextManagement>, EditError> {
        parse(json!({"model": "m", "context_management": cm}).to_string().as_bytes())
    }

    fn error(cm: Value) -> String {
        read(cm).unwrap_err().to_string()
    }

    #[test]
    fn defaults_apply() {
        let cm = read(json!({"edits": [
            {"type": "clear_tool_uses_20250919"},
            {"type": "clear_thinking_20251015"},
            {"type": "compact_20260112"},
        ]}))
        .unwrap()
        .unwrap();
        assert_eq!(
            cm.edits,
            [
                Edit::ClearToolUses(ClearToolUses {
                    trigger: Trigger::InputTokens(100_000),
                    keep: 3,
                    clear_at_least: None,
                    exclude_tools: vec![],
                    clear_tool_inputs: ClearInputs::None,
                }),
                Edit::ClearThinking(ClearThinking { keep: ThinkingKeep::Turns(1) }),
                Edit::Compact(Compact {
                    trigger: 150_000,
                    instructions: None,
                    pause_after_compaction: false
                }),
            ]
        );
        assert!(cm.compact().is_some_and(|c| c.triggered(150_001) && !c.triggered(150_000)));
        assert_eq!(read(json!(null)).unwrap(), None);
        assert_eq!(parse(br#"{"model":"m"}"#).unwrap(), None);
        assert_eq!(read(json!({})).unwrap().unwrap().edits, []);
    }

    /// The SDK's own shapes (anthropic 2.14 `types/beta`), every field given.
    #[test]
    fn reads_the_sdk_shapes() {
        let cm = read(json!({"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
            {"type": "clear_tool_uses_20250919",
             "trigger": {"type": "tool_uses", "value": 5},
             "keep": {"type": "tool_uses", "value": 1},
             "clear_at_least": {"type": "input_tokens", "value": 500},
             "exclude_tools": ["memory"],
             "clear_tool_inputs": ["bash"]},
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 60000},
             "instructions": "Keep file paths.", "pause_after_compaction": true},
        ]}))
        .unwrap()
        .unwrap();
        let Edit::ClearToolUses(clear) = &cm.edits[1] else { panic!("{cm:?}") };
        assert_eq!(clear.trigger, Trigger::ToolUses(5));
        assert_eq!((clear.keep, clear.clear_at_least), (1, Some(500)));
        assert_eq!(clear.exclude_tools, ["memory"]);
        assert!(clear.clear_tool_inputs.covers("bash") && !clear.clear_tool_inputs.covers("x"));
        assert_eq!(
            cm.edits[0],
            Edit::ClearThinking(ClearThinking { keep: ThinkingKeep::Turns(2) })
        );
        let compact = cm.compact().unwrap();
        assert_eq!(compact.trigger, 60000);
        assert_eq!(compact.instructions.as_deref(), Some("Keep file paths."));
        assert!(compact.pause_after_compaction);
        for keep in [json!("all"), json!({"type": "all"})] {
            let cm = read(json!({"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}));
            let want = Edit::ClearThinking(ClearThinking { keep: ThinkingKeep::All });
            assert_eq!(cm.unwrap().unwrap().edits, [want]);
        }
        let all = read(json!({"edits": [{"type": "clear_tool_uses_20250919",
            "clear_tool_inputs": true, "clear_at_least": null, "exclude_tools": null}]}));
        let Edit::ClearToolUses(c) = &all.unwrap().unwrap().edits[0] else { panic!() };
        assert_eq!(c.clear_tool_inputs, ClearInputs::All);
    }

    #[test]
    fn malformed_values_name_their_field() {
        let cases = [
            (json!([]), "context_management: expected an object"),
            (json!({"edits": {}}), "context_management.edits: expected an array of edits"),
            (json!({"edits": [1]}), "context_management.edits.0: expected an object"),
            (json!({"edits": [{}]}), "context_management.edits.0.type: expected an edit type"),
            (json!({"edits": [{"type": "clear_all"}]}), "unknown edit type `clear_all`"),
            (
                json!({"edits": [{"type": "compact_20260112"}, {"type": "compact_20260112", "trigger": {"type": "tool_uses", "value": 3}}]}),
                r#"context_management.edits.1.trigger.type: expected "input_tokens""#,
            ),
            (
                json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]}),
                "context_management.edits.0.keep.value: expected a non-negative integer",
            ),
            (
                json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": 3}]}),
                "context_management.edits.0.keep: expected an object",
            ),
            (
                json!({"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": "bash"}]}),
                "context_management.edits.0.exclude_tools: expected an array of tool names",
            ),
            (
                json!({"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": [1]}]}),
                "context_management.edits.0.clear_tool_inputs: expected a boolean or an array",
            ),
            (
                json!({"edits": [{"type": "clear_thinking_20251015", "keep": 2}]}),
                "context_management.edits.0.keep: expected",
            ),
            (
                json!({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "turns", "value": 2}}]}),
                r#"context_management.edits.0.keep.type: expected "thinking_turns""#,
            ),
            (
                json!({"edits": [{"type": "compact_20260112", "pause_after_compaction": "yes"}]}),
                "context_management.edits.0.pause_after_compaction: expected a boolean",
            ),
            (
                json!({"edits": [{"type": "compact_20260112", "instructions": 1}]}),
                "context_management.edits.0.instructions: expected a string",
            ),
            (
                json!({"edits": [{"type": "compact_20260112", "trigger_at": 1}]}),
                "context_management.edits.0.trigger_at: extra inputs are not permitted",
            ),
            (json!({"edits": [], "mode": 1}), "context_management.mode: extra inputs"),
        ];
        for (cm, want) in cases {
            let got = error(cm.clone());
            assert!(got.starts_with(want) || got.contains(want), "{cm}: {got}");
        }
        assert_eq!(parse(b"[]"), Err(EditError::NotAnObject));
        assert_eq!(parse(b"\xff"), Err(EditError::NotAnObject));
    }

    #[test]
    fn on_demand_compaction_is_read_and_checked() {
        let read = |body: serde_json::Value| super::parse_summarize(body.to_string().as_bytes());
        assert_eq!(read(json!({"messages": []})).unwrap(), None);
        assert_eq!(read(json!({"compaction": null})).unwrap(), None);
        let asked =
            read(json!({"compaction": {"type": "summarize", "instructions": "  Keep ids. "}}));
        assert_eq!(asked.unwrap().unwrap().instructions.as_deref(), Some("Keep ids."));
        let blank = read(json!({"compaction": {"type": "summarize", "instructions": " "}}));
        assert_eq!(blank.unwrap().unwrap().instructions, None, "blank counts as absent");
        assert!(read(json!({"compaction": {"type": "squash"}})).is_err());
        assert!(read(json!({"compaction": {"type": "summarize", "extra": 1}})).is_err());
        assert!(read(json!({"compaction": {"type": "summarize", "instructions": 3}})).is_err());
        let both =
            json!({"compaction": {"type": "summarize"}, "context_management": {"edits": []}});
        assert!(read(both).unwrap_err().to_string().contains("context_management"));
    }
}
