//! The LLM summarizer: a chat completion that writes the digest.
//!
//! [`LlmSummarizer`] is built once at start-up and shared: it owns the pooled client,
//! the concurrency limit, the circuit breaker and the counters. A request's credential
//! and model are known only per request, so the chat handler calls
//! [`LlmSummarizer::bind`] and passes the [`BoundSummarizer`] to the engine.
//!
//! Each call is bounded by `summarizer.timeout`, waiting for a concurrency permit
//! included. While the breaker is open, calls fail at once with
//! [`SummarizerError::CircuitOpen`] and the engine uses the extractive digest.
//! Credentials never reach logs: only status, reason and duration are logged.

mod breaker;
mod client;
mod credential;
pub mod prompt;
mod stats;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::Uri;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::json;
use tokio::sync::Semaphore;

pub use breaker::CircuitState;
use breaker::{Breaker, Outcome};
use client::JsonClient;
pub use client::SUMMARY_HEADER;
pub use credential::Credential;
use stats::Counters;
pub use stats::LlmStats;

use super::{FailureReason, ModelPrompt, Summarizer, SummarizerError, SummaryInput};
use crate::config::{SummarizerConfig, UpstreamConfig};
use crate::model::{Message, content_text, write_messages};

/// Why the LLM summarizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LlmSetupError {
    /// The base URL (`summarizer.url`, else `upstream.url`) is not usable.
    #[error("summarizer endpoint: {0}")]
    Url(String),
    /// The TLS roots could not be loaded.
    #[error("summarizer TLS roots: {0}")]
    Tls(String),
    /// `summarizer.api_key` cannot be sent in a header (the value is not shown).
    #[error("summarizer.api_key: not a valid header value")]
    ApiKey,
}

/// The shared LLM summarizer: endpoint, pooled client, limits, breaker and counters.
pub struct LlmSummarizer {
    client: JsonClient,
    endpoint: Uri,
    model: String,
    /// `Bearer <summarizer.api_key>`, when a key is configured.
    api_key: Option<HeaderValue>,
    timeout: Duration,
    max_input_tokens: usize,
    /// Send the conversation's forwarded prefix instead of a rendering of the region.
    share_prefix: bool,
    permits: Semaphore,
    breaker: Breaker,
    counters: Counters,
}

impl fmt::Debug for LlmSummarizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmSummarizer")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "********"))
            .finish_non_exhaustive()
    }
}

impl LlmSummarizer {
    /// Builds the summarizer: `<summarizer.url or upstream.url>/chat/completions`, a
    /// pooled client with the upstream's connect timeout and TLS roots.
    pub fn new(
        cfg: &SummarizerConfig,
        upstream: &UpstreamConfig,
    ) -> Result<Arc<Self>, LlmSetupError> {
        let base = if cfg.url.is_empty() { &upstream.url } else { &cfg.url };
        let endpoint: Uri = format!("{}/chat/completions", base.trim_end_matches('/'))
            .parse()
            .map_err(|e| LlmSetupError::Url(format!("{e}")))?;
        if endpoint.scheme().is_none() || endpoint.authority().is_none() {
            return Err(LlmSetupError::Url(format!("`{base}` has no scheme or host")));
        }
        let api_key = if cfg.api_key.is_empty() {
            None
        } else {
            let mut v = HeaderValue::try_from(format!("Bearer {}", cfg.api_key.expose()))
                .map_err(|_| LlmSetupError::ApiKey)?;
            v.set_sensitive(true);
            Some(v)
        };
        Ok(Arc::new(Self {
            client: JsonClient::new(upstream)?,
            endpoint,
            model: cfg.model.clone(),
            api_key,
            timeout: cfg.timeout,
            max_input_tokens: cfg.max_input_tokens,
            share_prefix: cfg.shares_prefix(),
            permits: Semaphore::new(cfg.max_concurrency.max(1)),
            breaker: Breaker::new(cfg.failure_threshold, cfg.cooldown),
            counters: Counters::default(),
        }))
    }

    /// A summarizer for one request: its client's `credential` (used only when no
    /// `summarizer.api_key` is configured) and its model (used only when no
    /// `summarizer.model` is configured).
    pub fn bind(
        self: &Arc<Self>,
        credential: Option<Credential>,
        request_model: &str,
    ) -> BoundSummarizer {
        let model = if self.model.is_empty() { request_model } else { &self.model };
        BoundSummarizer {
            inner: Arc::clone(self),
            credential: if self.api_key.is_some() { None } else { credential },
            model: model.to_owned(),
        }
    }

    /// The URL summarization calls go to.
    pub fn endpoint(&self) -> &Uri {
        &self.endpoint
    }

    /// A snapshot of the counters (cheap: a few atomic loads).
    pub fn stats(&self) -> LlmStats {
        self.counters.snapshot(self.breaker.state(Instant::now()))
    }

    async fn summarize(
        &self,
        credential: Option<&Credential>,
        model: &str,
        input: SummaryInput<'_>,
    ) -> Result<String, SummarizerError> {
        let started = Instant::now();
        let result = if self.breaker.admit(started) {
            let auth = match (&self.api_key, credential) {
                (Some(key), _) => Some((&AUTHORIZATION, key)),
                (None, Some(c)) => Some(c.header()),
                (None, None) => None,
            };
            let call = self.call(auth, model, input);
            let result = tokio::time::timeout(self.timeout, call)
                .await
                .unwrap_or(Err(SummarizerError::Timeout));
            let outcome = match &result {
                Ok(_) => Outcome::Success,
                // The client's own key was refused: says nothing about the model path.
                Err(SummarizerError::Status { status: 401 | 403, .. })
                    if self.api_key.is_none() =>
                {
                    Outcome::Neutral
                }
                Err(_) => Outcome::Failure,
            };
            self.breaker.record(Instant::now(), outcome);
            result
        } else {
            Err(SummarizerError::CircuitOpen)
        };
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis();
        match &result {
            Ok(_) => {
                self.counters.record(elapsed, None);
                tracing::debug!(elapsed_ms, "summarizer call succeeded");
            }
            Err(e) => {
                // Only `Failed` has no reason; this summarizer makes it for an
                // unserializable request, which is a broken request too.
                let reason = e.reason().unwrap_or(FailureReason::InvalidResponse);
                self.counters.record(elapsed, Some(reason));
                let status = match e {
                    SummarizerError::Status { status, .. } => Some(*status),
                    _ => None,
                };
                tracing::debug!(
                    reason = reason.as_str(),
                    status,
                    elapsed_ms,
                    "summarizer call failed"
                );
            }
        }
        result
    }

    /// One call: wait for a permit, POST, read the digest.
    async fn call(
        &self,
        auth: Option<(&HeaderName, &HeaderValue)>,
        model: &str,
        input: SummaryInput<'_>,
    ) -> Result<String, SummarizerError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SummarizerError::Transport("summarizer closed".to_owned()))?;
        let body = request_body(model, &self.prompt_for(&input), input.max_tokens)
            .map_err(|e| SummarizerError::Failed(format!("cannot build the request: {e}")))?;
        let answer = self.client.post_json(&self.endpoint, auth, body).await?;
        digest_from(&answer)
    }
}

impl LlmSummarizer {
    /// The messages and tools a call for `input` sends: with a shared prefix (and
    /// `summarizer.share_prefix`), the conversation as forwarded and the instruction last;
    /// otherwise the digest prompt over a rendering of the region.
    fn prompt_for(&self, input: &SummaryInput<'_>) -> ModelPrompt {
        let message = |role: &str, content: String| {
            Message::from_value(json!({"role": role, "content": content})).map(Arc::new)
        };
        if let Some(shared) = input.shared.filter(|_| self.share_prefix) {
            let mut messages = shared.messages.to_vec();
            messages.extend(message("user", prompt::shared_instruction(input)));
            return ModelPrompt { messages, tools: shared.tools.map(str::to_owned) };
        }
        let messages = [
            message("system", prompt::SYSTEM_PROMPT.to_owned()),
            message("user", prompt::user_prompt(input, self.max_input_tokens)),
        ];
        ModelPrompt { messages: messages.into_iter().flatten().collect(), tools: None }
    }
}

/// The chat-completions body of one call: the prompt's messages (their JSON text as
/// is), its `tools` with `tool_choice: none`, and the answer's size.
fn request_body(
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
        // Reasoning models reject `max_tokens` and `temperature`; their budget covers
        // hidden reasoning too, so it is given room beyond the digest itself.
        let budget = max_tokens.saturating_mul(4).max(4096);
        out.extend_from_slice(format!("\"max_completion_tokens\":{budget}}}").as_bytes());
    } else {
        out.extend_from_slice(
            format!("\"temperature\":0,\"max_tokens\":{max_tokens}}}").as_bytes(),
        );
    }
    Ok(out)
}

/// OpenAI's reasoning families (o1, o3, o4, gpt-5), which take `max_completion_tokens`
/// and no `temperature`.
fn is_reasoning_model(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let o_series =
        name.strip_prefix('o').is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    o_series || name.starts_with("gpt-5")
}

/// The digest in a chat-completions answer: `choices[0].message.content`, a string or
/// an array of text parts, without an echoed digest marker; empty is an error.
fn digest_from(answer: &[u8]) -> Result<String, SummarizerError> {
    let value: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|e| SummarizerError::InvalidResponse(format!("not JSON: {e}")))?;
    let content = value.pointer("/choices/0/message/content").ok_or_else(|| {
        SummarizerError::InvalidResponse("no choices[0].message.content".to_owned())
    })?;
    let text = content_text(Some(content));
    let digest = prompt::clean_digest(&text);
    if digest.is_empty() {
        return Err(SummarizerError::InvalidResponse("empty content".to_owned()));
    }
    Ok(digest.to_owned())
}

/// The LLM summarizer bound to one request's credential and model. Owns what it needs,
/// so it can move into a background (prefetch) task.
#[derive(Clone)]
pub struct BoundSummarizer {
    inner: Arc<LlmSummarizer>,
    credential: Option<Credential>,
    model: String,
}

impl fmt::Debug for BoundSummarizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundSummarizer")
            .field("model", &self.model)
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Summarizer for BoundSummarizer {
    fn name(&self) -> &'static str {
        "llm"
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        self.inner.summarize(self.credential.as_ref(), &self.model, input).await
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<ModelPrompt> {
        Some(self.inner.prompt_for(input))
    }
}

#[cfg(test)]
mod reasoning_tests {
    use super::is_reasoning_model;

    #[test]
    fn recognises_reasoning_families() {
        for m in ["o1", "o3-mini", "o4-mini-high", "gpt-5", "openai/gpt-5-mini"] {
            assert!(is_reasoning_model(m), "{m}");
        }
        for m in ["gpt-4o", "gpt-4.1-mini", "omni-x", "claude-3-5-sonnet", ""] {
            assert!(!is_reasoning_model(m), "{m}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_from_reads_strings_and_parts_and_rejects_empty() {
        let ok =
            br###"{"choices":[{"message":{"role":"assistant","content":"## Findings\n- x"}}]}"###;
        assert_eq!(digest_from(ok).unwrap(), "## Findings\n- x");
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"[COMPACTED CONTEXT]\n## Milestones"},{"type":"text","text":"- y"}]}}]}"#;
        assert_eq!(digest_from(parts).unwrap(), "## Milestones\n- y");
        for bad in [
            &br#"{"choices":[{"message":{"content":"  "}}]}"#[..],
            br#"{"choices":[{"message":{"content":null}}]}"#,
            br#"{"choices":[]}"#,
            b"not json",
        ] {
            let e = digest_from(bad).unwrap_err();
            assert_eq!(e.reason(), Some(FailureReason::InvalidResponse), "{e}");
        }
    }

    #[test]
    fn setup_uses_summarizer_url_else_upstream_and_hides_the_key() {
        let upstream =
            UpstreamConfig { url: "http://up:9/v1/".to_owned(), ..UpstreamConfig::default() };
        let cfg = SummarizerConfig {
            api_key: crate::config::Secret::new("sk-hidden"),
            ..SummarizerConfig::default()
        };
        let s = LlmSummarizer::new(&cfg, &upstream).unwrap();
        assert_eq!(s.endpoint().to_string(), "http://up:9/v1/chat/completions");
        assert!(!format!("{s:?}").contains("sk-hidden"));
        let cfg = SummarizerConfig { url: "https://sum.example/api/v1".to_owned(), ..cfg };
        let s = LlmSummarizer::new(&cfg, &upstream).unwrap();
        assert_eq!(s.endpoint().to_string(), "https://sum.example/api/v1/chat/completions");
        let bad = SummarizerConfig { url: "not a url".to_owned(), ..SummarizerConfig::default() };
        assert!(LlmSummarizer::new(&bad, &upstream).is_err());
    }
}
