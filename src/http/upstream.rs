//! The upstream client: pooled connections, HTTP/1.1 and HTTP/2, rustls, timeouts,
//! and the mapping from foldgate's `/v1/<rest>` to `<upstream base>/<rest>`.

use std::error::Error as _;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;

use super::body::ProxyBody;
use super::error::ProxyError;
use crate::client::{HttpsClient, https_client};
use crate::config::UpstreamConfig;

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    /// `upstream.url` is not usable.
    #[error("upstream.url: {0}")]
    Url(String),
    /// The TLS roots could not be loaded.
    #[error("upstream.tls_roots: {0}")]
    Tls(String),
}

/// The provider foldgate forwards to.
#[derive(Clone)]
pub struct Upstream {
    client: HttpsClient<ProxyBody>,
    scheme: Scheme,
    authority: Authority,
    /// Base path without a trailing slash, e.g. `/v1` or `/api/v1`.
    base_path: String,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

impl Upstream {
    /// Builds the pooled client for `config`.
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamSetupError> {
        let uri: Uri = config.url.parse().map_err(|e| UpstreamSetupError::Url(format!("{e}")))?;
        let scheme =
            uri.scheme().cloned().ok_or_else(|| UpstreamSetupError::Url("no scheme".into()))?;
        let authority =
            uri.authority().cloned().ok_or_else(|| UpstreamSetupError::Url("no host".into()))?;
        let base_path = uri.path().trim_end_matches('/').to_owned();

        let client = https_client(config).map_err(|e| UpstreamSetupError::Tls(e.to_string()))?;
        Ok(Self {
            client,
            scheme,
            authority,
            base_path,
            connect_timeout: config.connect_timeout,
            first_byte_timeout: config.first_byte_timeout,
        })
    }

    /// The upstream URI for a request to foldgate's `path` (which starts with `/v1`).
    pub fn target_uri(&self, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        let rest = path.strip_prefix("/v1").unwrap_or(path);
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
        let path_and_query: PathAndQuery = target.parse()?;
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }

    /// The upstream's `host[:port]`, for the `Host` header.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends `request` and waits for the response headers within the first-byte timeout.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, ProxyError> {
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(format!(
                "no response headers within {} (upstream.first_byte_timeout)",
                humantime::format_duration(self.first_byte_timeout)
            ))),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.classify(&e)),
        }
    }

    fn classify(&self, error: &hyper_util::client::legacy::Error) -> ProxyError {
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
        if timed_out && error.is_connect() {
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
            "https://openrouter.ai/api/v1/chat/completions?a=1"
        );
        let u = upstream("http://localhost:11434/v1/");
        assert_eq!(
            u.target_uri("/v1/models", None).unwrap().to_string(),
            "http://localhost:11434/v1/models"
        );
        let u = upstream("http://127.0.0.1:9");
        assert_eq!(
            u.target_uri("/v1/models", None).unwrap().to_string(),
            "http://127.0.0.1:9/models"
        );
        assert_eq!(u.target_uri("/v1", None).unwrap().to_string(), "http://127.0.0.1:9/");
    }
}
