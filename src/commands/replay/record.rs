//! Reading recorded conversations: a chat record (`messages`, `tools`, `model`), or a
//! request body of another API shape read through that shape's conversion.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::ReplayError;
use crate::api::{self, Api};
use crate::model::{ChatRequest, Message, ModelError};

/// One recorded conversation.
pub struct Conversation {
    /// Its id (or its line number).
    pub id: String,
    /// Its trace family (`meta.family`), empty when not recorded.
    pub family: String,
    /// Top-level request fields: `model` and, if recorded, `tools`.
    pub fields: Map<String, Value>,
    /// The messages.
    pub messages: Vec<Arc<Message>>,
}

impl Conversation {
    /// Reads one record: `messages`, optional `tools`, `model`, `id`, `meta.family`.
    pub fn from_record(
        record: &Value,
        line: usize,
        model: Option<&str>,
    ) -> Result<Self, ReplayError> {
        let err = |message: String| ReplayError::Record { line, message };
        let msgs = record
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| err("no messages".into()))?;
        let messages = msgs
            .iter()
            .map(|m| Message::from_value(m.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, ModelError>>()
            .map_err(|e| err(e.to_string()))?;
        let mut fields = Map::new();
        let model = model
            .map(str::to_owned)
            .or_else(|| record.get("model").and_then(Value::as_str).map(str::to_owned));
        fields.insert("model".into(), Value::String(model.unwrap_or_default()));
        if let Some(tools) = record.get("tools").filter(|t| !t.is_null()) {
            fields.insert("tools".into(), tools.clone());
        }
        let (id, family) = record_names(record, line);
        Ok(Self { id, family, fields, messages })
    }

    /// The conversation of a request another API shape was read into: its neutral
    /// messages, model (or `model`, when given) and tools.
    fn of_neutral(request: &ChatRequest, record: &Value, line: usize, model: Option<&str>) -> Self {
        let mut fields = Map::new();
        let model = model.map(str::to_owned).or_else(|| request.model());
        fields.insert("model".into(), Value::String(model.unwrap_or_default()));
        if let Some(tools) = request.tools() {
            fields.insert("tools".into(), tools);
        }
        let (id, family) = record_names(record, line);
        Self { id, family, fields, messages: request.messages().to_vec() }
    }
}

/// A record's `id` (else `line-N`) and `meta.family` (else empty).
fn record_names(record: &Value, line: usize) -> (String, String) {
    let id = record
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("line-{line}"), str::to_owned);
    let family =
        record.pointer("/meta/family").and_then(Value::as_str).unwrap_or_default().to_owned();
    (id, family)
}

impl Conversation {
    /// Reads one record that is a request body of another API shape (a Responses body:
    /// `input`, `instructions`, `tools`, `model`; an Anthropic Messages body: `system`,
    /// `messages`, `tools`, `model`; with optional `id` and `meta.family`) through that
    /// shape's conversion (`parse`, named `shape`): the conversation is its neutral
    /// messages.
    pub fn from_converted(
        line_text: &str,
        record: &Value,
        line: usize,
        model: Option<&str>,
        shape: &str,
        parse: fn(&[u8]) -> Option<(ChatRequest, api::Origins)>,
    ) -> Result<Self, ReplayError> {
        let err = |message: String| ReplayError::Record { line, message };
        let (request, origins) = parse(line_text.as_bytes())
            .ok_or_else(|| err(format!("not a {shape} request foldgate understands")))?;
        if origins.server_state {
            return Err(err("relies on state the provider keeps (previous_response_id)".into()));
        }
        Ok(Self::of_neutral(&request, record, line, model))
    }
}

impl Conversation {
    /// Reads line `line` (1-based; its text `line_text`) of a file of records of the API
    /// shape `api`: a chat record ([`Self::from_record`]), or a Responses or Anthropic
    /// Messages request body ([`Self::from_converted`]).
    pub(super) fn from_line(
        api: Api,
        line_text: &str,
        line: usize,
        model: Option<&str>,
    ) -> Result<Self, ReplayError> {
        let record: Value = serde_json::from_str(line_text)
            .map_err(|e| ReplayError::Record { line, message: e.to_string() })?;
        match api {
            Api::Responses => {
                let parse = api::responses::parse;
                Self::from_converted(line_text, &record, line, model, "Responses", parse)
            }
            Api::Messages => {
                let parse = api::messages::parse;
                Self::from_converted(line_text, &record, line, model, "Messages", parse)
            }
            Api::Chat => Self::from_record(&record, line, model),
        }
    }
}
