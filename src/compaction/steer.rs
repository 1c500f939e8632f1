//! What the user asks of folds: compaction instructions, and content that is never
//! folded (pins).
//!
//! Instructions come from three places, merged in this order: the operator's
//! (`summarizer.instructions`), the conversation's own (a "Compact instructions" or
//! "Compaction instructions" section of the system message, the Responses
//! `instructions`, or the first user message) and the request's
//! (`x-foldgate-compact-instructions`). A compaction API's own `instructions` come last.
//! Pins are regular expressions (`compaction.pin`, and per conversation `x-foldgate-pin`):
//! a message whose text matches is forwarded byte for byte at its place, with the tool
//! calls and results it belongs with.

use std::sync::Arc;

use regex::RegexSet;

use super::units::Unit;
use crate::config::pins;
pub use crate::config::pins::{MAX_PIN_BYTES, MAX_PINS, PinError};
use crate::model::{Message, Role};
pub use crate::vocab::InstructionSource;

/// Merged instructions are cut to about this many tokens (about four bytes each).
pub const INSTRUCTIONS_MAX_TOKENS: usize = 1000;

/// One piece of compaction instructions and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Instruction {
    /// Where it came from.
    pub source: InstructionSource,
    /// Its text.
    pub text: String,
}

/// Compiled pin patterns.
#[derive(Debug, Clone)]
pub struct Pins {
    set: RegexSet,
}

impl Pins {
    /// Compiles `patterns`; `None` when there are none.
    pub fn new(patterns: &[String]) -> Result<Option<Self>, PinError> {
        Ok(pins::compile(patterns)?.map(|set| Self { set }))
    }

    /// True when `text` matches a pattern.
    pub fn matches(&self, text: &str) -> bool {
        self.set.is_match(text)
    }

    /// Which of `msgs` a pattern pins: those whose text (or, for a message that only
    /// calls tools, whose call arguments) matches. System and developer messages are
    /// pinned by their role, not here.
    pub fn flags(&self, msgs: &[Arc<Message>]) -> Vec<bool> {
        msgs.iter()
            .map(|m| {
                if m.role().is_pinned() || m.is_digest() {
                    return false;
                }
                let text = m.text();
                if self.matches(&text) {
                    return true;
                }
                m.tool_calls().iter().any(|c| {
                    let args = c.pointer("/function/arguments").and_then(|a| a.as_str());
                    args.is_some_and(|a| self.matches(a))
                })
            })
            .collect()
    }
}

/// The messages `pins` pins in `msgs`, each with the whole unit it belongs to (a call
/// with its results): empty without pins.
pub fn pinned_units(pins: Option<&Pins>, msgs: &[Arc<Message>], units: &[Unit]) -> Vec<bool> {
    let Some(pins) = pins else { return Vec::new() };
    let mut flags = pins.flags(msgs);
    for u in units {
        if flags[u.start..u.end].iter().any(|&p| p) {
            flags[u.start..u.end].iter_mut().for_each(|p| *p = true);
        }
    }
    flags
}

/// What one request steers: the operator's instructions and pins, with what its
/// headers add.
#[derive(Debug, Clone, Default)]
pub struct Steer {
    /// `summarizer.instructions`.
    pub operator: Option<Arc<str>>,
    /// `x-foldgate-compact-instructions`.
    pub header: Option<Arc<str>>,
    /// `compaction.pin` and `x-foldgate-pin`, compiled.
    pub pins: Option<Arc<Pins>>,
    /// The patterns `pins` was compiled from.
    patterns: Arc<[String]>,
}

impl Steer {
    /// The operator's settings: `instructions` and `pin` patterns.
    pub fn new(instructions: &str, patterns: &[String]) -> Result<Self, PinError> {
        let operator = Some(instructions.trim()).filter(|i| !i.is_empty()).map(Arc::from);
        let pins = Pins::new(patterns)?.map(Arc::new);
        Ok(Self { operator, header: None, pins, patterns: patterns.into() })
    }

    /// These settings for one request: `instructions` from its header, and `pins`,
    /// patterns its header adds (one per line, or a JSON array of strings).
    pub fn with_request(
        &self,
        instructions: Option<&str>,
        pins: Option<&str>,
    ) -> Result<Self, PinError> {
        let mut out = self.clone();
        out.header = instructions.map(str::trim).filter(|i| !i.is_empty()).map(Arc::from);
        if let Some(added) = pins.map(header_patterns).filter(|p| !p.is_empty()) {
            let all: Vec<String> = self.patterns.iter().cloned().chain(added).collect();
            out.pins = Pins::new(&all)?.map(Arc::new);
            out.patterns = all.into();
        }
        Ok(out)
    }

    /// The instructions in force for `msgs`, in merge order, with `request`'s own (a
    /// compaction API's `instructions`) last.
    pub fn instructions(&self, msgs: &[Arc<Message>], request: Option<&str>) -> Vec<Instruction> {
        let mut out = Vec::new();
        let mut add = |source, text: &str| {
            let text = text.trim();
            if !text.is_empty() {
                out.push(Instruction { source, text: text.to_owned() });
            }
        };
        if let Some(text) = &self.operator {
            add(InstructionSource::Config, text);
        }
        if let Some(text) = conversation_section(msgs) {
            add(InstructionSource::Conversation, &text);
        }
        if let Some(text) = &self.header {
            add(InstructionSource::Header, text);
        }
        if let Some(text) = request {
            add(InstructionSource::Request, text);
        }
        out
    }
}

/// `instructions` as one text for a summarizer, within [`INSTRUCTIONS_MAX_TOKENS`]
/// (about four bytes a token; cut at a character boundary). `None` when there are none.
pub fn merged(instructions: &[Instruction]) -> Option<String> {
    if instructions.is_empty() {
        return None;
    }
    let mut text = instructions.iter().map(|i| i.text.as_str()).collect::<Vec<_>>().join("\n\n");
    let max = INSTRUCTIONS_MAX_TOKENS * 4;
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    Some(text)
}

/// Patterns from a header value: a JSON array of strings, or one pattern per line.
fn header_patterns(value: &str) -> Vec<String> {
    let value = value.trim();
    if value.starts_with('[') {
        if let Ok(list) = serde_json::from_str::<Vec<String>>(value) {
            return list.into_iter().filter(|p| !p.is_empty()).collect();
        }
    }
    value.lines().map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect()
}

/// The "Compact instructions" section of the conversation: in a system (or developer)
/// message, where the Responses `instructions` arrive too, else in the first user
/// message. The first one found.
fn conversation_section(msgs: &[Arc<Message>]) -> Option<String> {
    let system = msgs.iter().filter(|m| m.role().is_pinned());
    let first_user = msgs.iter().find(|m| m.role() == Role::User && !m.is_digest());
    system.chain(first_user).find_map(|m| section(&m.text()).map(str::to_owned))
}

/// The body of the first Markdown section of `text` headed "Compact instructions" or
/// "Compaction instructions" (any level, any case): up to the next heading of the same
/// or a higher level. `None` when there is none or it is empty.
pub fn section(text: &str) -> Option<&str> {
    let mut start = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let here = offset;
        offset += line.len();
        let Some((level, title)) = heading(line) else { continue };
        match start {
            None => {
                let title = title.trim().trim_end_matches('#').trim().to_ascii_lowercase();
                if title == "compact instructions" || title == "compaction instructions" {
                    start = Some((level, offset));
                }
            }
            Some((open, from)) if level <= open => {
                return Some(text[from..here].trim()).filter(|s| !s.is_empty());
            }
            Some(_) => {}
        }
    }
    start.and_then(|(_, from)| Some(text[from..].trim()).filter(|s| !s.is_empty()))
}

/// A Markdown ATX heading: its level and title.
fn heading(line: &str) -> Option<(usize, &str)> {
    let line = line.trim_end_matches(['\n', '\r']);
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.bytes().take_while(|&b| b == b'#').count();
    let rest = &trimmed[level..];
    ((1..=6).contains(&level) && (rest.is_empty() || rest.starts_with([' ', '\t'])))
        .then_some((level, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(v: serde_json::Value) -> Arc<Message> {
        Arc::new(Message::from_value(v).unwrap())
    }

    #[test]
    fn the_section_ends_at_the_next_heading_of_its_level_or_higher() {
        let text = "# Project\nIntro\n## Compact Instructions\n- keep test names\n### Detail\n\
                    - and ids\n## Style\nTabs\n";
        assert_eq!(section(text), Some("- keep test names\n### Detail\n- and ids"));
        assert_eq!(section("### compaction instructions ###\nkeep X"), Some("keep X"));
        assert_eq!(section("# Compact instructions\n\n# Next\n"), None);
        assert_eq!(section("Compact instructions\nkeep X"), None);
        assert_eq!(section("#Compact instructions\nkeep X"), None);
        assert_eq!(section("    # Compact instructions\nkeep X"), None);
    }

    #[test]
    fn instructions_merge_config_then_conversation_then_header_then_request() {
        let steer = Steer::new("operator rule", &[]).unwrap();
        let steer = steer.with_request(Some(" header rule "), None).unwrap();
        let msgs = vec![
            msg(
                serde_json::json!({"role": "system", "content": "Be brief.\n## Compact instructions\n- keep the failing test names\n## Other\nx"}),
            ),
            msg(
                serde_json::json!({"role": "user", "content": "# Compact instructions\nignored: the system message has one"}),
            ),
        ];
        let got = steer.instructions(&msgs, Some("api rule"));
        let sources: Vec<_> = got.iter().map(|i| i.source).collect();
        use InstructionSource::*;
        assert_eq!(sources, [Config, Conversation, Header, Request]);
        assert_eq!(got[1].text, "- keep the failing test names");
        assert_eq!(got[2].text, "header rule");
        let text = merged(&got).unwrap();
        assert!(text.starts_with("operator rule\n\n- keep the failing"), "{text}");
        assert!(merged(&[]).is_none());
    }

    #[test]
    fn the_first_user_message_holds_the_section_when_no_system_message_does() {
        let msgs = vec![
            msg(serde_json::json!({"role": "system", "content": "You are a coder."})),
            msg(
                serde_json::json!({"role": "user", "content": "Fix it.\n# Compaction instructions\n* keep ids"}),
            ),
        ];
        let got = Steer::default().instructions(&msgs, None);
        assert_eq!(
            got,
            [Instruction { source: InstructionSource::Conversation, text: "* keep ids".into() }]
        );
    }

    #[test]
    fn merged_instructions_are_capped_at_a_character_boundary() {
        let long = "é".repeat(INSTRUCTIONS_MAX_TOKENS * 4);
        let text =
            merged(&[Instruction { source: InstructionSource::Header, text: long }]).unwrap();
        assert!(text.len() <= INSTRUCTIONS_MAX_TOKENS * 4);
    }

    #[test]
    fn bad_pins_are_refused_with_the_pattern_named() {
        let err = Pins::new(&["ok".into(), "(unclosed".into()]).unwrap_err().to_string();
        assert!(err.contains("(unclosed"), "{err}");
        assert!(matches!(
            Pins::new(&["x".repeat(MAX_PIN_BYTES + 1)]),
            Err(PinError::TooLong { .. })
        ));
        let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
        assert!(matches!(Pins::new(&many), Err(PinError::TooMany(65))));
        assert!(Steer::new("", &[]).unwrap().with_request(None, Some("[\"a(\"]")).is_err());
    }

    #[test]
    fn a_header_adds_patterns_to_the_operator_s() {
        let steer = Steer::new("", &["SPEC-1".into()]).unwrap();
        let both = steer.with_request(None, Some("[\"SPEC-2\"]")).unwrap();
        let pins = both.pins.unwrap();
        assert!(pins.matches("see SPEC-1") && pins.matches("see SPEC-2"));
        let lines = steer.with_request(None, Some("SPEC-3\nSPEC-4")).unwrap().pins.unwrap();
        assert!(lines.matches("SPEC-4") && lines.matches("SPEC-1"));
    }

    #[test]
    fn pins_match_text_and_call_arguments_but_not_system_messages() {
        let pins = Pins::new(&["constraints\\.md".into()]).unwrap().unwrap();
        let msgs = vec![
            msg(serde_json::json!({"role": "system", "content": "constraints.md"})),
            msg(
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"constraints.md\"}"}}]}),
            ),
            msg(
                serde_json::json!({"role": "tool", "tool_call_id": "c", "content": "never use unwrap"}),
            ),
        ];
        assert_eq!(pins.flags(&msgs), [false, true, false]);
    }

    proptest::proptest! {
        #[test]
        fn parsing_any_text_never_panics(text in "(?s)[#* \\-+0-9.)\n\r\ta-zé]{0,200}") {
            if let Some(body) = section(&text) {
                proptest::prop_assert!(text.contains(body));
            }
            let _ = header_patterns(&text);
            let _ = Steer::default().with_request(Some(&text), Some(&text));
        }
    }
}
