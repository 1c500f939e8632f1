//! The summarizer's own HTTP client: one pooled hyper-util client (HTTP/1.1 and HTTP/2,
//! rustls, from `crate::client`), and one JSON POST that classifies what went wrong.

use std::error::Error as _;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Full, Limited};

use super::LlmSetupError;
use crate::client::{HttpsClient, https_client};
use crate::config::UpstreamConfig;
use crate::summarizer::SummarizerError;
use crate::telemetry::{context, span};

/// Largest answer body read; a digest is a few kilobytes.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// The header that marks summarization calls (the proxy never compacts them).
pub const SUMMARY_HEADER: &str = "x-foldgate-summary";

/// A pooled HTTPS/HTTP client for JSON POSTs.
#[derive(Clone)]
pub struct JsonClient {
    client: HttpsClient<Full<Bytes>>,
}

impl JsonClient {
    /// A client with the upstream's connect timeout, pool settings and TLS roots.
    pub fn new(upstream: &UpstreamConfig) -> Result<Self, LlmSetupError> {
        let client = https_client(upstream).map_err(|e| LlmSetupError::Tls(e.to_string()))?;
        Ok(Self { client })
    }

    /// POSTs `body` to `uri` with `auth` (if any) and the `extra` headers (and, traces
    /// exported, the trace context of the current span), and returns the 2xx answer body.
    pub async fn post_json(
        &self,
        uri: &Uri,
        auth: Option<(&HeaderName, &HeaderValue)>,
        extra: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
    ) -> Result<Bytes, SummarizerError> {
        let mut request = Request::post(uri.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(SUMMARY_HEADER, HeaderValue::from_static("1"))
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| SummarizerError::Transport(e.to_string()))?;
        for (name, value) in auth.into_iter().chain(extra.iter().map(|(n, v)| (n, v))) {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let headers = request.headers_mut();
        context::inject(&span::current(), |name, value| {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        });
        let response = self.client.request(request).await.map_err(|e| transport(&e))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map(|c| c.to_bytes());
        if !status.is_success() {
            let code = body.ok().as_deref().and_then(error_code);
            return Err(SummarizerError::Status { status: status.as_u16(), code });
        }
        body.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                SummarizerError::InvalidResponse(format!("answer over {MAX_RESPONSE_BYTES} bytes"))
            } else {
                SummarizerError::Transport(format!("reading the answer: {e}"))
            }
        })
    }
}

/// The error chain of a failed request, without the request itself (no headers).
fn transport(error: &hyper_util::client::legacy::Error) -> SummarizerError {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        source = s.source();
    }
    SummarizerError::Transport(chain)
}

/// The OpenAI error `code` (else `type`) of an error body, when it is a short token;
/// the free-text `message` is never kept (providers echo parts of keys in it).
fn error_code(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k).and_then(serde_json::Value::as_str))
        .find(|c| {
            !c.is_empty()
                && c.len() <= 64
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::error_code;

    #[test]
    fn error_code_keeps_short_tokens_only() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-abc","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert_eq!(error_code(body).as_deref(), Some("invalid_api_key"));
        let body = br#"{"error":{"message":"x","type":"server_error","code":null}}"#;
        assert_eq!(error_code(body).as_deref(), Some("server_error"));
        assert_eq!(error_code(br#"{"error":{"code":"has spaces in it"}}"#), None);
        assert_eq!(error_code(b"<html>"), None);
    }
}
