//! The APIs a summarization call speaks: the body each takes for a digest prompt, and
//! where each answer keeps the digest's text. A conversation's digest is asked of its
//! own provider in its own API when the call uses the client's credential: a model that
//! only the Responses API serves (the Codex models) cannot answer a chat completion, and
//! an Anthropic key is good only at Anthropic.

use serde_json::{Value, json};

use crate::model::{content_text, write_messages};
use crate::summarizer::{ModelPrompt, SummarizerError};

/// The API of a summarization call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SummaryApi {
    /// `POST <summarizer.url or upstream.url>/chat/completions`.
    ChatCompletions,
    /// `POST <summarizer.url or upstream.url>/responses`, not stored.
    Responses,
    /// `POST <upstream.anthropic_url>/v1/messages`.
    Messages,
}

impl SummaryApi {
    /// Whose API it is (`gen_ai.provider.name` of a call's span).
    pub fn provider(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::Responses => "openai",
            Self::Messages => "anthropic",
        }
    }

    /// A short name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat",
            Self::Responses => "responses",
            Self::Messages => "messages",
        }
    }

    /// Whether the call can carry the conversation's forwarded messages as they are (the
    /// shared-prefix prompt); the other APIs get the digest prompt over a rendering.
    pub fn carries_neutral_messages(self) -> bool {
        self == Self::ChatCompletions
    }
}

/// The body of a call of `api` to `model` for `prompt`, answering in at most
/// `max_tokens` tokens (reasoning models get room beyond the digest for their hidden
/// reasoning).
pub fn request_body(
    api: SummaryApi,
    model: &str,
    prompt: &ModelPrompt,
    max_tokens: usize,
) -> Result<Vec<u8>, serde_json::Error> {
    match api {
        SummaryApi::ChatCompletions => chat_body(model, prompt, max_tokens),
        SummaryApi::Responses => {
            let (system, user) = system_and_user(prompt);
            let mut body = json!({"model": model, "instructions": system,
                "input": [{"role": "user", "content": user}], "store": false, "stream": false});
            if is_reasoning_model(model) {
                body["max_output_tokens"] = json!(reasoning_budget(max_tokens));
            } else {
                body["max_output_tokens"] = json!(max_tokens);
                body["temperature"] = json!(0);
            }
            serde_json::to_vec(&body)
        }
        SummaryApi::Messages => {
            let (system, user) = system_and_user(prompt);
            serde_json::to_vec(&json!({"model": model, "system": system,
                "messages": [{"role": "user", "content": user}],
                "max_tokens": max_tokens, "temperature": 0, "stream": false}))
        }
    }
}

/// The text of an answer of `api`: the chat message's content, the Responses output
/// messages' `output_text`, or the Messages `text` blocks.
pub fn answer_text(api: SummaryApi, answer: &[u8]) -> Result<String, SummarizerError> {
    let value: Value = serde_json::from_slice(answer)
        .map_err(|e| SummarizerError::InvalidResponse(format!("not JSON: {e}")))?;
    let missing = |what: &str| SummarizerError::InvalidResponse(format!("no {what}"));
    match api {
        SummaryApi::ChatCompletions => {
            let content = value
                .pointer("/choices/0/message/content")
                .ok_or_else(|| missing("choices[0].message.content"))?;
            Ok(content_text(Some(content)).into_owned())
        }
        SummaryApi::Responses => {
            let output = value.get("output").and_then(Value::as_array).ok_or(missing("output"))?;
            let texts = output
                .iter()
                .filter(|item| item["type"] == "message")
                .filter_map(|item| item["content"].as_array())
                .flatten()
                .filter(|part| part["type"] == "output_text")
                .filter_map(|part| part["text"].as_str());
            Ok(texts.collect())
        }
        SummaryApi::Messages => {
            let content =
                value.get("content").and_then(Value::as_array).ok_or(missing("content"))?;
            let texts = content
                .iter()
                .filter(|block| block["type"] == "text")
                .filter_map(|block| block["text"].as_str());
            Ok(texts.collect())
        }
    }
}

/// The chat-completions body: the prompt's messages (their JSON text as is), its
/// `tools` with `tool_choice: none`, and the answer's size.
fn chat_body(
    model: &str,
    prompt: &ModelPrompt,
    max_tokens: usize,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut out =
        Vec::with_capacity(prompt.messages.iter().map(|m| m.raw().len() + 1).sum::<usize>() + 256);
    out.extend_from_slice(b"{\"model\":");
    serde_json::to_writer(&mut out, model)?;
    out.extend_from_slice(b",\"messages\":");
    write_messages(&mut out, &prompt.messages);
    if let Some(tools) = &prompt.tools {
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools.as_bytes());
        out.extend_from_slice(b",\"tool_choice\":\"none\"");
    }
    out.extend_from_slice(b",\"stream\":false,");
    if is_reasoning_model(model) {
        // Reasoning models reject `max_tokens` and `temperature`.
        let budget = reasoning_budget(max_tokens);
        out.extend_from_slice(format!("\"max_completion_tokens\":{budget}}}").as_bytes());
    } else {
        out.extend_from_slice(
            format!("\"temperature\":0,\"max_tokens\":{max_tokens}}}").as_bytes(),
        );
    }
    Ok(out)
}

/// The system and user texts of a digest prompt (its system messages, then the rest).
fn system_and_user(prompt: &ModelPrompt) -> (String, String) {
    let (mut system, mut user) = (String::new(), String::new());
    for message in &prompt.messages {
        let text = content_text(message.content());
        let into = if message.value()["role"] == "system" { &mut system } else { &mut user };
        if !into.is_empty() {
            into.push_str("\n\n");
        }
        into.push_str(&text);
    }
    (system, user)
}

/// The output budget of a reasoning model's call: its hidden reasoning counts too.
fn reasoning_budget(max_tokens: usize) -> usize {
    max_tokens.saturating_mul(4).max(4096)
}

/// OpenAI's reasoning families (o1, o3, o4, gpt-5, the Codex models), which take no
/// `temperature` and count hidden reasoning in their output budget.
pub fn is_reasoning_model(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let o_series =
        name.strip_prefix('o').is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    o_series || name.starts_with("gpt-5") || name.starts_with("codex")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::Message;

    fn prompt() -> ModelPrompt {
        let message = |role: &str, text: &str| {
            Arc::new(Message::from_value(json!({"role": role, "content": text})).unwrap())
        };
        ModelPrompt {
            messages: vec![message("system", "Write a digest."), message("user", "The region.")],
            tools: None,
        }
    }

    fn body(api: SummaryApi, model: &str) -> Value {
        serde_json::from_slice(&request_body(api, model, &prompt(), 500).unwrap()).unwrap()
    }

    #[test]
    fn recognises_reasoning_families() {
        for m in ["o1", "o3-mini", "o4-mini-high", "gpt-5", "openai/gpt-5-mini", "gpt-5-codex"] {
            assert!(is_reasoning_model(m), "{m}");
        }
        for m in ["gpt-4o", "gpt-4.1-mini", "omni-x", "claude-3-5-sonnet", ""] {
            assert!(!is_reasoning_model(m), "{m}");
        }
    }

    #[test]
    fn each_api_gets_its_own_body() {
        let chat = body(SummaryApi::ChatCompletions, "gpt-4o");
        assert_eq!(chat["messages"][0]["role"], "system");
        assert_eq!(chat["max_tokens"], 500);
        let responses = body(SummaryApi::Responses, "gpt-5-codex");
        assert_eq!(responses["instructions"], "Write a digest.");
        assert_eq!(responses["input"][0]["content"], "The region.");
        assert_eq!(responses["store"], false);
        assert_eq!(responses["max_output_tokens"], 4096);
        assert!(responses.get("temperature").is_none(), "reasoning models take none");
        let messages = body(SummaryApi::Messages, "claude-sonnet-4-5");
        assert_eq!(messages["system"], "Write a digest.");
        assert_eq!(messages["messages"][0]["role"], "user");
        assert_eq!(messages["messages"][0]["content"], "The region.");
        assert_eq!(messages["max_tokens"], 500);
    }

    #[test]
    fn each_api_s_answer_gives_its_text() {
        let chat = br###"{"choices":[{"message":{"role":"assistant","content":"## A"}}]}"###;
        assert_eq!(answer_text(SummaryApi::ChatCompletions, chat).unwrap(), "## A");
        let responses = br###"{"output":[{"type":"reasoning","id":"rs_1","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"## B","annotations":[]}]}]}"###;
        assert_eq!(answer_text(SummaryApi::Responses, responses).unwrap(), "## B");
        let messages = br###"{"type":"message","content":[{"type":"thinking","thinking":"x","signature":"s"},{"type":"text","text":"## C"}]}"###;
        assert_eq!(answer_text(SummaryApi::Messages, messages).unwrap(), "## C");
        let wrong = br#"{"choices":[]}"#;
        assert!(answer_text(SummaryApi::Responses, wrong).is_err());
        assert!(answer_text(SummaryApi::Messages, b"not json").is_err());
    }
}
