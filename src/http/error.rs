//! The one HTTP-facing error: every error foldgate itself answers with, as OpenAI JSON.

use http::{Response, StatusCode, header};

use super::body::{ProxyBody, ReadError, full};

/// An error foldgate answers itself (upstream errors pass through unchanged).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request body is larger than `server.max_body_size`.
    #[error("request body exceeds the limit of {limit} bytes (server.max_body_size)")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A compressed request body decodes to more than `server.max_body_size`.
    #[error(
        "the decoded request body exceeds the limit of {limit} bytes (server.max_body_size applies to the body after Content-Encoding is undone)"
    )]
    DecodedBodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A WebSocket upgrade on a route foldgate serves over HTTP only: clients that try
    /// a WebSocket first (Codex's Responses transport) read 426 as "use HTTP".
    #[error(
        "this gateway serves {0} over HTTP only: send the request as an HTTP POST (WebSocket upgrade not supported)"
    )]
    UpgradeRequired(&'static str),
    /// The upstream could not be reached or the exchange failed.
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    /// The upstream did not connect or answer in time.
    #[error("upstream timed out: {0}")]
    UpstreamTimeout(String),
    /// The path is not one foldgate serves.
    #[error(
        "no route for {0}: foldgate serves the OpenAI API under /v1/ (set your base URL to http://<host>:<port>/v1)"
    )]
    NotFound(String),
    /// The request body could not be read (e.g. the client went away mid-body).
    #[error("request body could not be read: {0}")]
    ClientBody(String),
    /// The proxy is shutting down.
    #[error("foldgate is shutting down")]
    ShuttingDown,
    /// The session inspector needs a credential the request did not carry (what it
    /// needs is named; the value is never shown).
    #[error("the session inspector needs {0}: send it as `Authorization: Bearer <token>`")]
    Unauthorized(&'static str),
    /// No such session (or not the caller's).
    #[error("no such session")]
    SessionNotFound,
    /// The session store could not answer the session inspector.
    #[error("session store unavailable: {0}")]
    StoreUnavailable(String),
    /// A request foldgate answers itself (one of the providers' compaction APIs) is not
    /// one it can serve; the message says what to change.
    #[error("{0}")]
    InvalidRequest(String),
    /// foldgate failed to answer a request it serves itself.
    #[error("foldgate could not serve the request: {0}")]
    Internal(String),
    /// The request head is not HTTP/1.1 foldgate can read (answered before the
    /// connection closes).
    #[error("{message}")]
    MalformedRequest {
        /// 400, 431 (a head too large) or 505 (another HTTP version).
        status: StatusCode,
        /// What is wrong with it.
        message: String,
    },
    /// A bounded resource is used up (what is named); the client may try again later.
    #[error("too many {0} at once; try again later")]
    Overloaded(&'static str),
}

impl From<ReadError> for ProxyError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::TooLarge { limit } => Self::BodyTooLarge { limit },
            ReadError::Body(message) => Self::ClientBody(message),
        }
    }
}

impl ProxyError {
    /// HTTP status, OpenAI error `type` and `code`.
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::BodyTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large")
            }
            Self::DecodedBodyTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large")
            }
            Self::UpgradeRequired(_) => {
                (StatusCode::UPGRADE_REQUIRED, "invalid_request_error", "websocket_not_supported")
            }
            Self::UpstreamUnreachable(_) => {
                (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_unreachable")
            }
            Self::UpstreamTimeout(_) => {
                (StatusCode::GATEWAY_TIMEOUT, "upstream_error", "upstream_timeout")
            }
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error", "unknown_route"),
            Self::ClientBody(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", "request_body_unreadable")
            }
            Self::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down")
            }
            Self::Unauthorized(_) => {
                (StatusCode::UNAUTHORIZED, "invalid_request_error", "unauthorized")
            }
            Self::SessionNotFound => {
                (StatusCode::NOT_FOUND, "invalid_request_error", "session_not_found")
            }
            Self::StoreUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error", "session_store_unavailable")
            }
            Self::InvalidRequest(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request")
            }
            Self::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error")
            }
            Self::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error", "overloaded"),
            Self::MalformedRequest { status, .. } => {
                (*status, "invalid_request_error", "malformed_request")
            }
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.parts();
        serde_json::json!({
            "error": { "message": self.to_string(), "type": kind, "param": null, "code": code }
        })
    }

    /// The response: status plus [`ProxyError::body`].
    pub fn into_response(self) -> Response<ProxyBody> {
        let (status, body) = (self.status(), self.body());
        let mut response = Response::new(full(body.to_string()));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
        response
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn renders_openai_error_json() {
        let response = ProxyError::BodyTooLarge { limit: 10 }.into_response();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("10 bytes"));
    }
}
