//! `[session]` and `[summarizer]`: where conversation state lives and who writes digests.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Secret, SecretUrl};
use crate::vocab::SummarizerKind;

/// `[session]`: how requests are grouped into conversations and how long state is kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    /// Request headers naming the conversation, the first present wins; without any, a
    /// fingerprint is used. A string (names comma-separated) or a list.
    pub header: HeaderNames,
    /// State of a conversation not seen for this long is dropped.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// At most this many conversations are kept; the least recently used go first.
    pub max_sessions: usize,
    /// Where conversation state lives: `memory` (this process) or `redis` (shared by
    /// every replica that uses the same Redis or Valkey).
    pub store: StoreKind,
    /// The Redis server when `store = "redis"`: `redis://[user:password@]host:port/db`,
    /// `rediss://` for TLS, `unix:///path/to/socket`; in cluster and sentinel mode
    /// several seed URLs, comma-separated (cluster nodes, or the sentinels). Printed with
    /// passwords masked.
    pub redis_url: SecretUrl,
    /// How Redis is deployed: `standalone` (one server, or a proxy in front of many),
    /// `cluster` (Redis Cluster: sharded, redirections followed) or `sentinel` (a
    /// primary found through Redis Sentinel, followed through failovers).
    pub redis_mode: RedisMode,
    /// The name of the primary the sentinels watch (`sentinel` mode).
    pub redis_sentinel_master: String,
    /// Prefix of every key foldgate writes to Redis.
    pub redis_key_prefix: String,
    /// Time allowed for one Redis operation; past it the request goes on without stored
    /// state (and the failure is counted).
    #[serde(with = "humantime_serde")]
    pub redis_timeout: Duration,
}

/// Header names, in the order they are looked up: written as one string (names
/// separated by commas, as the environment overlay gives it) or as a list. Matched
/// lower-cased.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeaderNames(pub Vec<String>);

impl HeaderNames {
    /// The names, in order.
    pub fn names(&self) -> &[String] {
        &self.0
    }
}

impl Default for HeaderNames {
    /// The headers today's agents name their conversation in: foldgate's own
    /// `x-session-id`, then Codex CLI's `thread-id` and `session-id` (older releases:
    /// `session_id`).
    fn default() -> Self {
        Self(["x-session-id", "thread-id", "session-id", "session_id"].map(str::to_owned).to_vec())
    }
}

impl<'de> Deserialize<'de> for HeaderNames {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let names = match Raw::deserialize(d)? {
            Raw::One(names) => names.split(',').map(str::to_owned).collect(),
            Raw::Many(names) => names,
        };
        Ok(Self(
            names.iter().map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()).collect(),
        ))
    }
}

/// How Redis is deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One server (or a proxy in front of several).
    #[default]
    Standalone,
    /// Redis Cluster.
    Cluster,
    /// A primary and its replicas under Redis Sentinel.
    Sentinel,
}

/// Where conversation state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In this process: each replica keeps its own conversations.
    Memory,
    /// In Redis (or Valkey): replicas share conversations.
    Redis,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            header: HeaderNames::default(),
            ttl: Duration::from_secs(3600),
            max_sessions: 10_000,
            store: StoreKind::Memory,
            redis_url: SecretUrl::default(),
            redis_mode: RedisMode::Standalone,
            redis_sentinel_master: String::new(),
            redis_key_prefix: "foldgate:".to_owned(),
            redis_timeout: Duration::from_millis(200),
        }
    }
}

/// `[summarizer]`: the model call that writes digests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizerConfig {
    /// `llm` or `extractive`.
    pub kind: SummarizerKind,
    /// OpenAI base URL for summarization calls; empty: `upstream.url`.
    pub url: String,
    /// Model for summarization calls; empty: the model of the request being compacted.
    pub model: String,
    /// API key for summarization calls; empty: the client's own credential.
    pub api_key: Secret,
    /// Time allowed for one summarization call.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// At most this many summarization calls run at once (others wait).
    pub max_concurrency: usize,
    /// After this many consecutive failures the model path is skipped for `cooldown`.
    pub failure_threshold: u32,
    /// How long the model path is skipped once `failure_threshold` is reached.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// The text sent to the model is cut to about this many tokens.
    pub max_input_tokens: usize,
    /// Send the conversation as last forwarded (same `tools`, same messages) with the
    /// instruction as its last message, so the provider's prompt cache serves most of the
    /// call; unset: on when neither `model` nor `url` names a separate summarizer.
    pub share_prefix: Option<bool>,
    /// Compaction instructions for every conversation: the model summarizer follows
    /// them before its own guide, the extractive digest keeps their bullet lines among
    /// its standing facts. A conversation's "Compact instructions" section and the
    /// `x-foldgate-compact-instructions` header follow them.
    pub instructions: String,
}

impl SummarizerConfig {
    /// Whether summarization calls share the conversation's cached prefix.
    pub fn shares_prefix(&self) -> bool {
        self.share_prefix.unwrap_or(self.model.is_empty() && self.url.is_empty())
    }
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        Self {
            kind: SummarizerKind::Llm,
            url: String::new(),
            model: String::new(),
            api_key: Secret::default(),
            timeout: Duration::from_secs(30),
            max_concurrency: 4,
            failure_threshold: 3,
            cooldown: Duration::from_secs(30),
            max_input_tokens: 24_000,
            share_prefix: None,
            instructions: String::new(),
        }
    }
}

impl SessionConfig {
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.header.0.is_empty() {
            return Err((
                "session.header",
                "names no header (the default list is used when the key is absent)".to_owned(),
            ));
        }
        if let Some(bad) = self.header.0.iter().find(|h| !header_name_is_valid(h)) {
            return Err(("session.header", format!("`{bad}` is not a valid header name")));
        }
        if self.redis_timeout.is_zero() {
            return Err(("session.redis_timeout", "must be greater than 0".to_owned()));
        }
        if self.store == StoreKind::Redis || !self.redis_url.is_empty() {
            validate_redis_urls(&self.redis_url, self.redis_mode)
                .map_err(|m| ("session.redis_url", m))?;
        }
        if self.redis_mode == RedisMode::Sentinel && self.redis_sentinel_master.is_empty() {
            return Err((
                "session.redis_sentinel_master",
                "is required when session.redis_mode is \"sentinel\" (the name the sentinels monitor)"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

impl SummarizerConfig {
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self.url.is_empty() {
            super::validate_upstream_url(&self.url).map_err(|m| ("summarizer.url", m))?;
        }
        if self.max_concurrency == 0 {
            return Err(("summarizer.max_concurrency", "must be greater than 0".to_owned()));
        }
        if self.timeout.is_zero() {
            return Err(("summarizer.timeout", "must be greater than 0".to_owned()));
        }
        if self.failure_threshold == 0 {
            return Err(("summarizer.failure_threshold", "must be greater than 0".to_owned()));
        }
        Ok(())
    }
}

/// RFC 9110 token characters, lower case (header names are matched lower-cased).
pub(super) fn header_name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// Checks that `urls` are Redis URLs the client accepts, one in standalone mode, one or
/// more (comma-separated) in the others; messages show them masked.
fn validate_redis_urls(urls: &SecretUrl, mode: RedisMode) -> Result<(), String> {
    if urls.is_empty() {
        return Err(
            "is required when session.store is \"redis\" (e.g. redis://127.0.0.1:6379)".to_owned()
        );
    }
    let parts = urls.parts();
    if mode == RedisMode::Standalone && parts.len() > 1 {
        return Err(format!(
            "`{urls}` names {} servers: several seed URLs need session.redis_mode \"cluster\" or \"sentinel\"",
            parts.len()
        ));
    }
    parts.iter().try_for_each(validate_redis_url)
}

/// Checks that `url` is a Redis URL the client accepts; messages show it masked.
fn validate_redis_url(url: &SecretUrl) -> Result<(), String> {
    let parsed =
        url::Url::parse(url.expose()).map_err(|e| format!("`{url}` is not a valid URL: {e}"))?;
    match parsed.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(format!("`{url}` has no host"));
            }
        }
        "unix" | "redis+unix" | "valkey+unix" => {
            if parsed.path().is_empty() || parsed.path() == "/" {
                return Err(format!("`{url}` has no socket path"));
            }
        }
        other => {
            return Err(format!(
                "`{url}`: scheme `{other}` is not one of redis, rediss, valkey, valkeys, unix"
            ));
        }
    }
    Ok(())
}
