//! The upstream client: pooled connections, HTTP/1.1 and HTTP/2, rustls, timeouts,
//! and the mapping from foldgate's `/v1/<rest>` to `<upstream base>/<rest>`.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Response, Uri};

pub use super::connections::UpstreamBody;
use super::connections::{ConnectionPool, SendError};
use super::deadline;
use super::error::ProxyError;
use super::wire::UpstreamRequest;
use crate::client::https_connector;
use crate::config::UpstreamConfig;

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    /// `upstream.url` is not usable.
    #[error("upstream.url: {0}")]
    Url(String),
    /// `upstream.anthropic_url` is not usable.
    #[error("upstream.anthropic_url: {0}")]
    AnthropicUrl(String),
    /// The TLS roots could not be loaded.
    #[error("upstream.tls_roots: {0}")]
    Tls(String),
}

/// The provider foldgate forwards to.
#[derive(Clone)]
pub struct Upstream {
    pool: Arc<ConnectionPool>,
    /// Base path without a trailing slash, e.g. `/v1` or `/api/v1`.
    base_path: String,
    /// Whether foldgate's `/v1` stays in the upstream path (Anthropic's base URL has no
    /// `/v1`; OpenAI's has).
    keep_v1: bool,
    /// `host[:port]/base`, naming the upstream (never its credentials).
    name: String,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

impl Upstream {
    /// Builds the client of `upstream.url` (`/v1/<rest>` → `<url>/<rest>`), with a
    /// connection pool of its own.
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamSetupError> {
        Self::build(config, &config.url, false, UpstreamSetupError::Url)
    }

    /// Builds the client of `upstream.anthropic_url` (`/v1/<rest>` →
    /// `<anthropic_url>/v1/<rest>`, as `ANTHROPIC_BASE_URL` works), with a connection pool
    /// of its own.
    pub fn anthropic(config: &UpstreamConfig) -> Result<Self, UpstreamSetupError> {
        Self::build(config, &config.anthropic_url, true, UpstreamSetupError::AnthropicUrl)
    }

    fn build(
        config: &UpstreamConfig,
        url: &str,
        keep_v1: bool,
        invalid: fn(String) -> UpstreamSetupError,
    ) -> Result<Self, UpstreamSetupError> {
        let uri: Uri = url.parse().map_err(|e| invalid(format!("{e}")))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| invalid("no scheme".into()))?;
        let authority = uri.authority().cloned().ok_or_else(|| invalid("no host".into()))?;
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let host = authority.as_str().rsplit('@').next().unwrap_or_default();
        let name = format!("{host}{base_path}");

        let connector =
            https_connector(config).map_err(|e| UpstreamSetupError::Tls(e.to_string()))?;
        let pool = ConnectionPool::new(
            connector,
            scheme,
            authority,
            config.pool_idle_timeout,
            config.pool_max_idle_per_host,
        )
        .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            pool: Arc::new(pool),
            base_path,
            keep_v1,
            name,
            connect_timeout: config.connect_timeout,
            first_byte_timeout: config.first_byte_timeout,
        })
    }

    /// `host[:port]/base`: which upstream this is, for keys (no credentials).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The upstream URI, in origin form (`/base/rest?query`, or `/base/v1/rest?query` for
    /// Anthropic), for a request to foldgate's `path` (which starts with `/v1`).
    pub fn target_uri(&self, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        let rest = if self.keep_v1 { path } else { path.strip_prefix("/v1").unwrap_or(path) };
        let mut target = String::with_capacity(self.base_path.len() + rest.len() + 1);
        target.push_str(&self.base_path);
        target.push_str(rest);
        if target.is_empty() {
            target.push('/');
        }
        if let Some(q) = query {
            target.push('?');
            target.push_str(q);
        }
        // The text becomes the URI's bytes (checked, not copied again).
        let path_and_query = PathAndQuery::from_maybe_shared(bytes::Bytes::from(target))?;
        Ok(Uri::from(path_and_query))
    }

    /// [`Upstream::target_uri`] of a client's request URI: the URI itself (shared, not
    /// built again) when the upstream's path is the client's, as with an upstream whose
    /// base path is `/v1` (OpenAI's) or empty (Anthropic's).
    pub fn target_of(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let path = uri.path();
        let same = if self.keep_v1 { self.base_path.is_empty() } else { self.base_path == "/v1" };
        let origin_form = uri.scheme().is_none() && uri.authority().is_none();
        if same && origin_form && path.starts_with("/v1") {
            return Ok(uri.clone());
        }
        self.target_uri(path, uri.query())
    }

    /// The upstream's URL for foldgate's `path` as a WebSocket URL (`ws://`, or `wss://`
    /// for an `https` upstream).
    pub fn websocket_url(&self, path: &str) -> Option<String> {
        let target = self.target_uri(path, None).ok()?;
        let origin = self.pool.origin();
        let scheme = if origin.scheme_str() == Some("https") { "wss" } else { "ws" };
        Some(format!("{scheme}://{}{target}", origin.authority()?))
    }

    /// Closes idle connections older than `upstream.pool_idle_timeout`.
    pub fn close_expired(&self) {
        self.pool.close_expired();
    }

    /// Sends `request` and waits for the response headers within the first-byte timeout
    /// (on a connection thread, up to a second past it: see [`deadline`]).
    pub async fn send(
        &self,
        request: UpstreamRequest,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        match deadline::timeout(self.first_byte_timeout, self.pool.send(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(format!(
                "no response headers within {} (upstream.first_byte_timeout)",
                humantime::format_duration(self.first_byte_timeout)
            ))),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.classify(&e)),
        }
    }

    fn classify(&self, error: &SendError) -> ProxyError {
        let mut chain = error.to_string();
        let mut timed_out = false;
        let mut source = error.source();
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            if s.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            {
                timed_out = true;
            }
            source = s.source();
        }
        if timed_out && matches!(error, SendError::Connect(_)) {
            ProxyError::UpstreamTimeout(format!(
                "connect timed out after {} (upstream.connect_timeout)",
                humantime::format_duration(self.connect_timeout)
            ))
        } else {
            ProxyError::UpstreamUnreachable(chain)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        Upstream::new(&UpstreamConfig { url: url.to_owned(), ..UpstreamConfig::default() }).unwrap()
    }

    #[test]
    fn maps_v1_rest_onto_the_base_path() {
        let u = upstream("https://openrouter.ai/api/v1");
        assert_eq!(
            u.target_uri("/v1/chat/completions", Some("a=1")).unwrap().to_string(),
            "/api/v1/chat/completions?a=1"
        );
        let u = upstream("http://localhost:11434/v1/");
        assert_eq!(u.target_uri("/v1/models", None).unwrap().to_string(), "/v1/models");
        let u = upstream("http://127.0.0.1:9");
        assert_eq!(u.target_uri("/v1/models", None).unwrap().to_string(), "/models");
        assert_eq!(u.target_uri("/v1", None).unwrap().to_string(), "/");
    }

    #[test]
    fn a_clients_uri_maps_as_its_path_and_query_do() {
        let anthropic = |url: &str| {
            Upstream::anthropic(&UpstreamConfig {
                anthropic_url: url.to_owned(),
                ..UpstreamConfig::default()
            })
            .unwrap()
        };
        let upstreams = [
            upstream("https://api.openai.com/v1"),
            upstream("https://openrouter.ai/api/v1"),
            upstream("http://127.0.0.1:9"),
            upstream("http://127.0.0.1:9/v1/"),
            anthropic("https://api.anthropic.com"),
            anthropic("http://gateway.local/anthropic/"),
        ];
        let uris = [
            "/v1/chat/completions",
            "/v1/responses?stream=true",
            "/v1",
            "/v1x/a",
            "/other",
            "http://foldgate.local/v1/chat/completions?a=1",
        ];
        for u in &upstreams {
            for uri in uris {
                let uri: Uri = uri.parse().unwrap();
                let built = u.target_uri(uri.path(), uri.query()).ok();
                let target = u.target_of(&uri).ok();
                assert_eq!(target, built, "{} {uri}", u.name());
                assert!(target.is_none_or(|t| t.scheme().is_none() && t.authority().is_none()));
            }
        }
    }

    #[test]
    fn anthropic_keeps_v1_after_its_base_path() {
        let config = |url: &str| UpstreamConfig {
            anthropic_url: url.to_owned(),
            ..UpstreamConfig::default()
        };
        let u = Upstream::anthropic(&config("https://api.anthropic.com")).unwrap();
        assert_eq!(u.target_uri("/v1/messages", None).unwrap().to_string(), "/v1/messages");
        assert_eq!(
            u.target_uri("/v1/messages/count_tokens", Some("beta=true")).unwrap().to_string(),
            "/v1/messages/count_tokens?beta=true"
        );
        let u = Upstream::anthropic(&config("http://gateway.local/anthropic/")).unwrap();
        assert_eq!(
            u.target_uri("/v1/messages", None).unwrap().to_string(),
            "/anthropic/v1/messages"
        );
        assert_ne!(u.name(), upstream("http://gateway.local/v1").name());
    }
}
