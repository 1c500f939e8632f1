//! The Anthropic Messages dialect (`POST /v1/messages`, what Claude Code and the
//! `anthropic` SDKs send, to `upstream.anthropic_url`): bodies convert to and from
//! neutral messages in [`crate::api::messages`]; the overflow error is
//! `prompt is too long: N tokens > M maximum` (`invalid_request_error`); usage is read
//! from the JSON answer or from the `message_start` / `message_delta` events.
//!
//! Claude's tokenizer is not one the engine has: prompts are counted with the engine's
//! encoder, then calibrated from the `usage` the upstream reports (input plus cache read
//! and creation tokens) against what the engine counted for the same forwarded body: per
//! conversation, in its session state (`SessionState::token_ratio`), and per model
//! ([`crate::learned::Calibration`]) for conversations not measured yet. A conversation whose prompts
//! count more than the engine's estimate is planned against a window shrunk by its ratio.
//!
//! The model summarizer asks these conversations' digests of Anthropic, in a Messages
//! call to `upstream.anthropic_url` with the client's credential (never to `upstream.url`:
//! an Anthropic key must not go there), unless `summarizer.api_key` names a summarizer
//! of its own. A Claude subscription's OAuth token is never used for digests.

use std::sync::LazyLock;

use bytes::Bytes;
use http::HeaderMap;
use memchr::memmem::Finder;

use super::Dialect;
use super::overflow::{OverflowSignals, StreamEvent};
use crate::api::{self, Origins};
use crate::conversation::{Measure, Rewritten};
use crate::http::provider_compaction::MessagesContext;
use crate::http::session_key::{
    FingerprintParts, SessionHeaders, fingerprint_part, scope_of, session_key_with,
};
use crate::http::sse::Event;
use crate::metrics::Route;
use crate::model::{ChatRequest, Role};
use crate::outline::Outline;
use crate::session::SessionKey;
use crate::summarizer::llm::SummaryApi;

/// Anthropic's Messages API.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

/// What the scan reads of a Messages body: the outline of its `messages` (the scan of
/// chat bodies reads them, as they are objects with a `role`) and the body, whose other
/// fields (`system`) count too.
#[derive(Debug)]
pub struct MessagesOutline<'a> {
    outline: Outline<'a>,
    body: &'a [u8],
}

impl Dialect for Messages {
    type Outline<'a> = MessagesOutline<'a>;
    type Origins = Origins;
    type Overflow = MessagesOverflow;
    type Compaction = MessagesContext;

    fn route(&self) -> Route {
        Route::Messages
    }

    fn compaction(&self) -> Option<MessagesContext> {
        Some(MessagesContext)
    }

    fn overflow(&self) -> MessagesOverflow {
        MessagesOverflow
    }

    fn outline<'a>(&self, body: &'a Bytes) -> Option<MessagesOutline<'a>> {
        Some(MessagesOutline { outline: Outline::scan_kept(body)?, body })
    }

    fn outline_model(&self, outline: &MessagesOutline<'_>) -> Option<String> {
        outline.outline.model().map(std::borrow::Cow::into_owned)
    }

    /// The whole body's bytes (see [`Measure::Bytes`]); a document block is charged
    /// by its pages, which its bytes do not bound.
    fn measure<'o>(&self, outline: &'o MessagesOutline<'_>) -> Option<Measure<'o>> {
        let scan = &outline.outline;
        // Built once: a searcher's setup costs more than searching a short body.
        static IMAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"image\""));
        static DOCUMENT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"document\""));
        Some(Measure::Bytes {
            body: outline.body,
            image: &IMAGE,
            unbounded: Some(&DOCUMENT),
            tools: scan.tools_raw(),
            messages: scan.messages().len(),
            model: scan.model().map(std::borrow::Cow::into_owned),
            max_reply: scan.max_reply_tokens(),
        })
    }

    fn outline_session_key(
        &self,
        headers: &HeaderMap,
        session_header: &SessionHeaders,
        outline: &MessagesOutline<'_>,
    ) -> Option<SessionKey> {
        let scan = &outline.outline;
        session_key_with(headers, session_header, || {
            // Each made once per text on the thread (Claude Code sends the same system
            // prompt, tens of kilobytes, with every request).
            let part = |what, raw: &[u8], neutral: fn(&str) -> Option<String>| {
                fingerprint_part(what, raw, || neutral(std::str::from_utf8(raw).ok()?))
            };
            // The `system` field, else the first `system` message inside `messages`, as
            // the parsed request has them first.
            let system = match scan.field("system").filter(|raw| raw.trim_ascii() != b"null") {
                Some(raw) => part("messages/system", raw, api::messages::neutral_system),
                None => {
                    scan.messages().iter().filter(|m| m.role == Some(Role::System)).find_map(|m| {
                        let neutral = api::messages::neutral_system_message;
                        part("messages/system message", scan.raw(m), neutral)
                    })
                }
            };
            let user =
                scan.messages().iter().filter(|m| m.role == Some(Role::User)).find_map(|m| {
                    part("messages/user", scan.raw(m), api::messages::neutral_first_user)
                });
            let model = scan.model().unwrap_or_default();
            let scope = scope_of(|k| scan.field(k));
            Some(FingerprintParts { model: model.into_owned(), system, user, scope })
        })
    }

    fn parse(&self, body: &[u8]) -> Option<(ChatRequest, Origins)> {
        api::messages::parse(body)
    }

    fn render(&self, original: &Bytes, origins: &Origins, compacted: &Rewritten) -> Bytes {
        api::messages::render(original, origins, &compacted.request)
    }

    fn calibrated(&self) -> bool {
        true
    }

    /// Anthropic, with the client's key; not with a Claude subscription's OAuth token
    /// (a bearer `sk-ant-oat…`, or an `oauth-` beta), which is meant for its own client
    /// only.
    fn summary_api(&self, headers: &HeaderMap) -> Option<SummaryApi> {
        (!is_subscription_token(headers)).then_some(SummaryApi::Messages)
    }
}

/// How Anthropic says a prompt is longer than the window: `prompt is too long: N tokens
/// > M maximum` (`invalid_request_error`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagesOverflow;

impl OverflowSignals for MessagesOverflow {
    /// `prompt is too long`, or an answer that stopped at the context window
    /// (`stop_reason: "model_context_window_exceeded"`, in a JSON answer or its stream's
    /// `message_delta`).
    fn is_overflow(&self, error_body: &[u8]) -> bool {
        stopped_at_window(error_body) || is_prompt_too_long(error_body)
    }

    fn overflows_in_answer(&self) -> bool {
        true
    }

    fn overflows_in_stream(&self) -> bool {
        true
    }

    /// `message_start` and `ping` tell nothing yet; a `message_delta` that stops at the
    /// window, or an `error` event, before any content is a failure to judge.
    fn stream_event(&self, event: &Event<'_>) -> StreamEvent {
        match event.name {
            Some(b"message_start" | b"ping") => StreamEvent::Leading,
            Some(b"error") => StreamEvent::Failed(event.data.to_vec()),
            Some(b"message_delta") if stopped_at_window(&event.data) => {
                StreamEvent::Failed(event.data.to_vec())
            }
            _ => StreamEvent::Other,
        }
    }

    /// A window stated in an error; none for an answer that stopped at the window (its
    /// text is the model's, not a statement of the window).
    fn stated_window(&self, error_body: &[u8]) -> Option<usize> {
        if stopped_at_window(error_body) {
            return None;
        }
        super::overflow::stated_window(error_body)
    }
}

/// True for a Message, or a stream's `message_delta`, whose `stop_reason` is
/// `model_context_window_exceeded`.
fn stopped_at_window(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Stop<'a> {
        #[serde(borrow)]
        stop_reason: Option<&'a str>,
        #[serde(borrow)]
        delta: Option<Box<Stop<'a>>>,
    }
    const WINDOW: &str = "model_context_window_exceeded";
    if memchr::memmem::find(body, WINDOW.as_bytes()).is_none() {
        return false;
    }
    let Ok(stop) = serde_json::from_slice::<Stop<'_>>(body) else { return false };
    let delta = stop.delta.as_ref().and_then(|d| d.stop_reason);
    stop.stop_reason == Some(WINDOW) || delta == Some(WINDOW)
}

/// True when the request is authenticated by a Claude subscription's OAuth token.
fn is_subscription_token(headers: &HeaderMap) -> bool {
    let text = |name: http::header::HeaderName| {
        headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase)
    };
    let bearer = text(http::header::AUTHORIZATION)
        .is_some_and(|v| v.strip_prefix("bearer ").is_some_and(|t| t.starts_with("sk-ant-oat")));
    let oauth_beta = text(http::header::HeaderName::from_static("anthropic-beta"))
        .is_some_and(|v| v.split(',').any(|beta| beta.trim().starts_with("oauth-")));
    bearer || oauth_beta
}

/// True for Anthropic's overflow error: `invalid_request_error` with
/// `prompt is too long: N tokens > M maximum` (or another provider's wording of it).
pub fn is_prompt_too_long(body: &[u8]) -> bool {
    super::overflow::is_context_overflow(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::{Engine, Options};

    #[test]
    fn a_body_with_a_document_is_always_counted() {
        let engine = Engine::new(crate::config::CompactionConfig::default());
        let small = br#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}"#;
        let small = Bytes::from_static(small);
        let outline = Messages.outline(&small).unwrap();
        assert!(
            crate::conversation::below(
                &engine,
                Messages.measure(&outline).unwrap(),
                &Options::default()
            )
            .is_some()
        );
        // A PDF's pages can cost more than its bytes: the quick bound does not hold.
        let pdf = br#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}}]}]}"#;
        let pdf = Bytes::from_static(pdf);
        let outline = Messages.outline(&pdf).unwrap();
        assert!(
            crate::conversation::below(
                &engine,
                Messages.measure(&outline).unwrap(),
                &Options::default()
            )
            .is_none()
        );
    }

    #[test]
    fn a_subscription_token_is_never_used_for_digests() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.insert(*k, v.parse().unwrap());
            }
            Messages.summary_api(&headers)
        };
        assert_eq!(with(&[("x-api-key", "sk-ant-api03-k")]), Some(SummaryApi::Messages));
        assert_eq!(with(&[("authorization", "Bearer sk-ant-api03-k")]), Some(SummaryApi::Messages));
        assert_eq!(with(&[("authorization", "Bearer sk-ant-oat01-t")]), None);
        let oauth = [
            ("authorization", "Bearer other"),
            ("anthropic-beta", "claude-code-20250219,oauth-2025-04-20"),
        ];
        assert_eq!(with(&oauth), None);
    }

    #[test]
    fn the_outline_s_session_key_is_the_parsed_request_s() {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", "sk-ant-a".parse().unwrap());
        let bodies = [
            r#"{"model":"claude-sonnet-4-5","system":"Be careful.","messages":[{"role":"user","content":"Fix it."}]}"#,
            r#"{"model":"claude-sonnet-4-5","system":"Be careful.","metadata":{"user_id":"user_1_account_2_session_3"},"messages":[{"role":"user","content":"Fix it."}]}"#,
            r#"{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"Be careful."}],"messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"Fix it."}]}]}"#,
            r#"{"model":"m","metadata":{"user_id":null},"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]},{"role":"assistant","content":"a"},{"role":"user","content":"u"}]}"#,
            // System messages inside `messages` (Claude Code, for a model id it does not
            // know): the first names the conversation when there is no `system` field.
            r#"{"model":"gateway-claude","messages":[{"role":"system","content":"<env>cwd: /a</env>"},{"role":"user","content":"Fix it."},{"role":"system","content":"later"}]}"#,
            r#"{"model":"gateway-claude","system":"Be careful.","messages":[{"role":"system","content":"<env>cwd: /a</env>"},{"role":"user","content":"Fix it."}]}"#,
            // Cache breakpoints, as Claude Code marks its system blocks and newest message.
            r#"{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"Be careful.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"Fix it.","cache_control":{"type":"ephemeral"}}]}]}"#,
            r#"{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"Be careful."}],"messages":[{"role":"user","content":[{"type":"text","text":"Fix it."}]}]}"#,
        ];
        let mut keys = Vec::new();
        for body in bodies {
            let shared = Bytes::copy_from_slice(body.as_bytes());
            let outline = Messages.outline(&shared).unwrap();
            let (request, _) = Messages.parse(body.as_bytes()).unwrap();
            let parsed = Messages.session_key(&headers, &SessionHeaders::default(), &request);
            // Twice: the second time the thread has the fingerprint's parts made.
            for _ in 0..2 {
                let outlined =
                    Messages.outline_session_key(&headers, &SessionHeaders::default(), &outline);
                assert_eq!(outlined, Some(parsed.clone()), "{body}");
            }
            keys.push(parsed);
        }
        // The breakpoints do not name another conversation.
        assert_eq!(keys[6], keys[7]);
        // Claude Code's session in `metadata.user_id` splits sessions that start alike.
        assert_ne!(keys[0], keys[1]);
    }

    #[test]
    fn recognises_anthropic_overflow_errors() {
        assert!(is_prompt_too_long(
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#
        ));
        assert!(!is_prompt_too_long(
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}"#
        ));
        assert_eq!(
            MessagesOverflow.stated_window(
                br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#
            ),
            Some(200_000)
        );
    }

    #[test]
    fn an_answer_stopped_at_the_window_is_an_overflow_without_a_stated_window() {
        let stopped = br#"{"type":"message","content":[{"type":"text","text":"1 > 200000 maximum"}],"stop_reason":"model_context_window_exceeded"}"#;
        assert!(MessagesOverflow.is_overflow(stopped));
        assert_eq!(MessagesOverflow.stated_window(stopped), None, "the text is the model's");
        let ended = br#"{"type":"message","content":[{"type":"text","text":"model_context_window_exceeded"}],"stop_reason":"end_turn"}"#;
        assert!(!MessagesOverflow.is_overflow(ended), "named in the text only");
        let delta =
            br#"{"type":"message_delta","delta":{"stop_reason":"model_context_window_exceeded"}}"#;
        let event = |name: &'static [u8], data: &'static [u8]| Event {
            name: Some(name),
            data: std::borrow::Cow::Borrowed(data),
        };
        assert_eq!(
            MessagesOverflow.stream_event(&event(b"message_start", b"{}")),
            StreamEvent::Leading
        );
        assert_eq!(MessagesOverflow.stream_event(&event(b"ping", b"{}")), StreamEvent::Leading);
        assert_eq!(
            MessagesOverflow.stream_event(&event(b"message_delta", delta)),
            StreamEvent::Failed(delta.to_vec())
        );
        assert!(MessagesOverflow.is_overflow(delta));
        let text = br#"{"type":"content_block_start","index":0}"#;
        assert_eq!(
            MessagesOverflow.stream_event(&event(b"content_block_start", text)),
            StreamEvent::Other
        );
    }
}
