//! The LLM summarizer: a model call that writes the digest (a chat completion, or the
//! conversation's own API, see [`SummaryApi`]).
//!
//! [`LlmSummarizer`] is built once at start-up and shared: it owns the pooled client,
//! the concurrency limit, the circuit breakers and the counters. A request's credential
//! and model are known only per request, so the conversation service calls
//! [`LlmSummarizer::bind_for`] and passes the [`BoundSummarizer`] to the engine.
//!
//! Each call is bounded by `summarizer.timeout`, waiting for a concurrency permit
//! included. Each API and model has its own breaker (one model failing does not stop
//! the digests of others): while it is open, calls fail at once with
//! [`SummarizerError::CircuitOpen`] and the engine uses the extractive digest.
//! Credentials never reach logs: only status, reason and duration are logged.

mod api;
mod breaker;
mod client;
mod credential;
pub mod prompt;
mod stats;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::Uri;
use http::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::json;
use tokio::sync::Semaphore;
use tracing::Instrument;

pub use api::SummaryApi;
use api::{answer_text, request_body};
pub use breaker::CircuitState;
use breaker::{Breaker, CallResult};
use client::JsonClient;
pub use client::SUMMARY_HEADER;
pub use credential::Credential;
use stats::Counters;
pub use stats::LlmStats;

use super::{FailureReason, ModelPrompt, Summarizer, SummarizerError, SummaryInput};
use crate::config::{SummarizerConfig, UpstreamConfig};
use crate::model::Message;
use crate::telemetry::span;

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

/// At most this many breakers are kept (one per API and model; model names come from
/// clients): the table is cleared when a new one would exceed it.
const MAX_BREAKERS: usize = 256;

/// The headers of an Anthropic call that come from the client's request.
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// The headers of a client's request that a digest call in its API passes on
/// (Anthropic's `anthropic-version` and `anthropic-beta`), and no other.
#[derive(Debug, Clone, Default)]
pub struct ClientHeaders(HeaderMap);

impl ClientHeaders {
    /// The headers of `request` a digest call passes on.
    pub fn from_request(request: &HeaderMap) -> Self {
        let mut kept = HeaderMap::new();
        for name in [ANTHROPIC_VERSION, ANTHROPIC_BETA] {
            if let Some(value) = request.get(&name) {
                kept.insert(name, value.clone());
            }
        }
        Self(kept)
    }
}

/// The shared LLM summarizer: endpoints, pooled client, limits, breakers and counters.
pub struct LlmSummarizer {
    client: JsonClient,
    /// `<summarizer.url or upstream.url>/chat/completions`.
    endpoint: Uri,
    /// `<summarizer.url or upstream.url>/responses`.
    responses_endpoint: Uri,
    /// `<upstream.anthropic_url>/v1/messages`.
    messages_endpoint: Uri,
    model: String,
    /// `Bearer <summarizer.api_key>`, when a key is configured.
    api_key: Option<HeaderValue>,
    timeout: Duration,
    max_input_tokens: usize,
    /// Send the conversation's forwarded prefix instead of a rendering of the region.
    share_prefix: bool,
    permits: Semaphore,
    failure_threshold: u32,
    cooldown: Duration,
    breakers: Mutex<HashMap<(SummaryApi, String), Arc<Breaker>>>,
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
    /// Builds the summarizer: `<summarizer.url or upstream.url>/chat/completions` (and
    /// `/responses` beside it, and `<upstream.anthropic_url>/v1/messages`), a pooled
    /// client with the upstream's connect timeout and TLS roots.
    pub fn new(
        cfg: &SummarizerConfig,
        upstream: &UpstreamConfig,
    ) -> Result<Arc<Self>, LlmSetupError> {
        let base = if cfg.url.is_empty() { &upstream.url } else { &cfg.url };
        let endpoint = endpoint_at(base, "chat/completions")?;
        let responses_endpoint = endpoint_at(base, "responses")?;
        let messages_endpoint = endpoint_at(&upstream.anthropic_url, "v1/messages")?;
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
            responses_endpoint,
            messages_endpoint,
            model: cfg.model.clone(),
            api_key,
            timeout: cfg.timeout,
            max_input_tokens: cfg.max_input_tokens,
            share_prefix: cfg.shares_prefix(),
            permits: Semaphore::new(cfg.max_concurrency.max(1)),
            failure_threshold: cfg.failure_threshold,
            cooldown: cfg.cooldown,
            breakers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }))
    }

    /// A chat-completions summarizer for one request: its client's `credential` (used
    /// only when no `summarizer.api_key` is configured) and its model (used only when no
    /// `summarizer.model` is configured).
    pub fn bind(
        self: &Arc<Self>,
        credential: Option<Credential>,
        request_model: &str,
    ) -> BoundSummarizer {
        self.bind_to(credential, request_model, SummaryApi::ChatCompletions, &HeaderMap::new())
    }

    /// A summarizer for one request of a conversation that speaks `api`, with the
    /// request's `headers` (an Anthropic call takes the client's `anthropic-version` and
    /// `anthropic-beta`). With `summarizer.api_key`, calls are chat completions to the
    /// configured endpoint, whatever the conversation's API. With the client's
    /// credential, they speak the conversation's API to its provider, except that a
    /// Responses conversation with `summarizer.model` set asks that (chat) model.
    pub fn bind_to(
        self: &Arc<Self>,
        credential: Option<Credential>,
        request_model: &str,
        api: SummaryApi,
        headers: &HeaderMap,
    ) -> BoundSummarizer {
        let api = match api {
            _ if self.api_key.is_some() => SummaryApi::ChatCompletions,
            SummaryApi::Responses if !self.model.is_empty() => SummaryApi::ChatCompletions,
            api => api,
        };
        let model = match api {
            SummaryApi::ChatCompletions if !self.model.is_empty() => &self.model,
            _ => request_model,
        };
        let mut extra = Vec::new();
        if api == SummaryApi::Messages {
            let version = headers.get(ANTHROPIC_VERSION).cloned();
            extra.push((
                ANTHROPIC_VERSION,
                version.unwrap_or(HeaderValue::from_static("2023-06-01")),
            ));
            extra.extend(headers.get(ANTHROPIC_BETA).map(|beta| (ANTHROPIC_BETA, beta.clone())));
        }
        BoundSummarizer {
            inner: Arc::clone(self),
            credential: if self.api_key.is_some() { None } else { credential },
            model: model.to_owned(),
            api,
            extra,
        }
    }

    /// [`Self::bind_to`] for a conversation whose client's credential may be used in
    /// `api`, or must not be used at all (`None`): then only a summarizer with a key of
    /// its own (`summarizer.api_key`) serves it, and `None` is returned without one.
    pub fn bind_for(
        self: &Arc<Self>,
        credential: Option<Credential>,
        request_model: &str,
        api: Option<SummaryApi>,
        headers: &ClientHeaders,
    ) -> Option<BoundSummarizer> {
        let api = api.or(self.api_key.is_some().then_some(SummaryApi::ChatCompletions))?;
        Some(self.bind_to(credential, request_model, api, &headers.0))
    }

    /// The URL summarization calls go to.
    pub fn endpoint(&self) -> &Uri {
        &self.endpoint
    }

    /// The URL of `api`'s calls.
    fn endpoint_of(&self, api: SummaryApi) -> &Uri {
        match api {
            SummaryApi::ChatCompletions => &self.endpoint,
            SummaryApi::Responses => &self.responses_endpoint,
            SummaryApi::Messages => &self.messages_endpoint,
        }
    }

    /// A snapshot of the counters; the circuit is the most open of the breakers.
    pub fn stats(&self) -> LlmStats {
        let now = Instant::now();
        let states = self.breakers.lock().map_or_else(
            |_| Vec::new(),
            |b| b.values().map(|breaker| breaker.state(now)).collect(),
        );
        let circuit = [CircuitState::Open, CircuitState::HalfOpen]
            .into_iter()
            .find(|s| states.contains(s))
            .unwrap_or(CircuitState::Closed);
        self.counters.snapshot(circuit)
    }

    /// The breaker of `api` calls to `model`.
    fn breaker(&self, api: SummaryApi, model: &str) -> Arc<Breaker> {
        let fresh = || Arc::new(Breaker::new(self.failure_threshold, self.cooldown));
        let Ok(mut breakers) = self.breakers.lock() else { return fresh() };
        let key = (api, model.to_owned());
        if let Some(breaker) = breakers.get(&key) {
            return breaker.clone();
        }
        if breakers.len() >= MAX_BREAKERS {
            breakers.clear();
        }
        breakers.entry(key).or_insert_with(fresh).clone()
    }

    async fn summarize(
        &self,
        bound: &BoundSummarizer,
        input: SummaryInput<'_>,
    ) -> Result<String, SummarizerError> {
        let started = Instant::now();
        let (credential, model, api) = (bound.credential.as_ref(), &bound.model, bound.api);
        let breaker = self.breaker(api, model);
        let result = if breaker.admit(started) {
            let auth = match (&self.api_key, credential) {
                (Some(key), _) => Some((&AUTHORIZATION, key)),
                (None, Some(c)) => Some(c.header()),
                (None, None) => None,
            };
            // Traces exported: the model call is a span, and its request names it.
            let span = span::model_call(api.provider(), model);
            let call = self.call(auth, bound, input);
            let result = tokio::time::timeout(self.timeout, call)
                .instrument(span.clone())
                .await
                .unwrap_or(Err(SummarizerError::Timeout));
            if let Err(e) = &result {
                span::summarizer_failed(
                    &span,
                    e.reason().unwrap_or(FailureReason::InvalidResponse),
                );
            }
            let outcome = match &result {
                Ok(_) => CallResult::Success,
                // The client's own key was refused: says nothing about the model path.
                Err(SummarizerError::Status { status: 401 | 403, .. })
                    if self.api_key.is_none() =>
                {
                    CallResult::Neutral
                }
                Err(_) => CallResult::Failure,
            };
            breaker.record(Instant::now(), outcome);
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
                    api = api.as_str(),
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
        bound: &BoundSummarizer,
        input: SummaryInput<'_>,
    ) -> Result<String, SummarizerError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SummarizerError::Transport("summarizer closed".to_owned()))?;
        let prompt = self.prompt_for(&input, bound.api);
        let body = request_body(bound.api, &bound.model, &prompt, input.max_tokens)
            .map_err(|e| SummarizerError::Failed(format!("cannot build the request: {e}")))?;
        let endpoint = self.endpoint_of(bound.api);
        let answer = self.client.post_json(endpoint, auth, &bound.extra, body).await?;
        digest_from(bound.api, &answer)
    }
}

impl LlmSummarizer {
    /// The messages and tools a call of `api` for `input` sends: with a shared prefix (and
    /// `summarizer.share_prefix`, and an API that carries the conversation's messages as
    /// they are), the conversation as forwarded and the instruction last; otherwise the
    /// digest prompt over a rendering of the region.
    fn prompt_for(&self, input: &SummaryInput<'_>, api: SummaryApi) -> ModelPrompt {
        let message = |role: &str, content: String| {
            Message::from_value(json!({"role": role, "content": content})).map(Arc::new)
        };
        let shares = self.share_prefix && api.carries_neutral_messages();
        if let Some(shared) = input.shared.filter(|_| shares) {
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

/// `base` joined with `path`, checked to be an absolute URL.
fn endpoint_at(base: &str, path: &str) -> Result<Uri, LlmSetupError> {
    let endpoint: Uri = format!("{}/{path}", base.trim_end_matches('/'))
        .parse()
        .map_err(|e| LlmSetupError::Url(format!("{e}")))?;
    if endpoint.scheme().is_none() || endpoint.authority().is_none() {
        return Err(LlmSetupError::Url(format!("`{base}` has no scheme or host")));
    }
    Ok(endpoint)
}

/// The digest in an answer of `api`, without an echoed digest marker; empty is an error.
fn digest_from(api: SummaryApi, answer: &[u8]) -> Result<String, SummarizerError> {
    let text = answer_text(api, answer)?;
    let digest = prompt::clean_digest(&text);
    if digest.is_empty() {
        return Err(SummarizerError::InvalidResponse("empty content".to_owned()));
    }
    Ok(digest.to_owned())
}

/// The LLM summarizer bound to one request's credential, model and API. Owns what it
/// needs, so it can move into a background (prefetch) task.
#[derive(Clone)]
pub struct BoundSummarizer {
    inner: Arc<LlmSummarizer>,
    credential: Option<Credential>,
    model: String,
    api: SummaryApi,
    /// Headers the call takes from the client's request (not credentials).
    extra: Vec<(HeaderName, HeaderValue)>,
}

impl fmt::Debug for BoundSummarizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundSummarizer")
            .field("model", &self.model)
            .field("api", &self.api)
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Summarizer for BoundSummarizer {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        crate::vocab::SummarizerKind::Llm
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        self.inner.summarize(self, input).await
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<ModelPrompt> {
        Some(self.inner.prompt_for(input, self.api))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_from_reads_strings_and_parts_and_rejects_empty() {
        let ok =
            br###"{"choices":[{"message":{"role":"assistant","content":"## Findings\n- x"}}]}"###;
        assert_eq!(digest_from(SummaryApi::ChatCompletions, ok).unwrap(), "## Findings\n- x");
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"[COMPACTED CONTEXT]\n## Milestones"},{"type":"text","text":"- y"}]}}]}"#;
        assert_eq!(digest_from(SummaryApi::ChatCompletions, parts).unwrap(), "## Milestones\n- y");
        for bad in [
            &br#"{"choices":[{"message":{"content":"  "}}]}"#[..],
            br#"{"choices":[{"message":{"content":null}}]}"#,
            br#"{"choices":[]}"#,
            b"not json",
        ] {
            let e = digest_from(SummaryApi::ChatCompletions, bad).unwrap_err();
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
