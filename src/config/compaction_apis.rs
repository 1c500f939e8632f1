//! `[responses]` and `[messages]`: the providers' own compaction APIs, served by foldgate
//! for upstreams that lack them (OpenAI's `POST /v1/responses/compact` and
//! `context_management` on `/v1/responses`; Anthropic's `context_management.edits`).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::Secret;

/// Who serves one of the providers' compaction APIs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServedBy {
    /// The upstream, until it answers that it does not know the API (a 404/405 for an
    /// endpoint, an unknown-parameter error for a field): foldgate then serves it, and
    /// remembers that per upstream (shared through the session store).
    #[default]
    Auto,
    /// Always the upstream: foldgate forwards the request as it is.
    Upstream,
    /// Always foldgate: the upstream never sees the API.
    Foldgate,
}

impl ServedBy {
    /// The value as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Upstream => "upstream",
            Self::Foldgate => "foldgate",
        }
    }
}

/// Whether foldgate serves the Responses API's WebSocket mode (`GET /v1/responses` with
/// `Upgrade: websocket`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebSocketMode {
    /// foldgate accepts the upgrade and serves each `response.create` frame as a request.
    #[default]
    Auto,
    /// The upgrade is answered 426, which clients read as "use HTTP".
    Off,
}

/// `[responses]`: OpenAI's Responses compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// Who answers `POST /v1/responses/compact`.
    pub compact: ServedBy,
    /// Who honours `context_management: [{"type": "compaction", ...}]` on `/v1/responses`.
    pub context_management: ServedBy,
    /// The key that seals foldgate's compaction items (32 bytes, base64): the same on
    /// every replica. Unset: a key is generated at start, and items sealed by one
    /// process cannot be opened by another (or after a restart). Never printed.
    pub compaction_key: Secret,
    /// The WebSocket mode: `auto` (served) or `off` (426).
    pub websocket: WebSocketMode,
    /// A WebSocket connection with no frame for this long is closed.
    #[serde(with = "humantime_serde")]
    pub websocket_idle_timeout: std::time::Duration,
    /// The most WebSocket connections one process holds; past it, an upgrade gets 503.
    pub websocket_max_connections: usize,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            compact: ServedBy::default(),
            context_management: ServedBy::default(),
            compaction_key: Secret::default(),
            websocket: WebSocketMode::default(),
            websocket_idle_timeout: std::time::Duration::from_secs(600),
            websocket_max_connections: 1024,
        }
    }
}

/// `[messages]`: Anthropic's context management.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MessagesConfig {
    /// Who applies `context_management.edits` on `/v1/messages`.
    pub context_management: ServedBy,
}

/// The length of a compaction key in bytes.
pub const COMPACTION_KEY_LEN: usize = 32;

impl ResponsesConfig {
    /// The configured compaction key's bytes; `None` when unset.
    pub fn key_bytes(&self) -> Option<Result<[u8; COMPACTION_KEY_LEN], String>> {
        let text = self.compaction_key.expose().trim();
        (!text.is_empty()).then(|| decode_key(text))
    }

    /// Checks what serde cannot.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        match self.key_bytes() {
            Some(Err(message)) => Err(("responses.compaction_key", message)),
            _ => Ok(()),
        }
    }
}

/// The 32 bytes of a key written in base64 (standard or URL-safe, padded or not).
fn decode_key(text: &str) -> Result<[u8; COMPACTION_KEY_LEN], String> {
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    let bytes = engines
        .iter()
        .find_map(|e| e.decode(text).ok())
        .ok_or_else(|| "is not base64 (generate one with `openssl rand -base64 32`)".to_owned())?;
    <[u8; COMPACTION_KEY_LEN]>::try_from(bytes.as_slice())
        .map_err(|_| format!("must decode to {COMPACTION_KEY_LEN} bytes, not {}", bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_from_base64_of_32_bytes() {
        let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let config = ResponsesConfig { compaction_key: Secret::new(key), ..Default::default() };
        assert_eq!(config.key_bytes().unwrap().unwrap(), *b"0123456789abcdef0123456789abcdef");
        for bad in ["short", "MDEy", "!!!"] {
            let config = ResponsesConfig { compaction_key: Secret::new(bad), ..Default::default() };
            assert!(config.validate().is_err(), "{bad}");
        }
        assert!(ResponsesConfig::default().key_bytes().is_none());
    }
}
