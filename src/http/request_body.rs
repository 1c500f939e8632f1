//! The body of a request to a compacted route, read once: within `server.max_body_size`
//! as received, and decoded within the same limit when it arrives compressed. What is
//! forwarded is correct for its headers: the body as received when foldgate sends its
//! content unchanged, else the new content identity-encoded.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_ENCODING;

use super::body::{BodyProgress, read_limited};
use super::content_coding::{self, DecodeError, Encoding};
use super::error::ProxyError;
use super::wire::server::ClientBody;
use crate::metrics::DecodeResult;
use crate::vocab::ContentCoding;

/// How a body's `Content-Encoding` was read: the coding applied last (`None`: unknown),
/// and what came of it.
pub type CodingRead = (Option<ContentCoding>, DecodeResult);

/// A request body as received, and its content when foldgate can read it.
pub struct ReceivedBody {
    /// The bytes as they arrived.
    raw: Bytes,
    /// The content: `raw` itself when not compressed, else decoded; `None` when the
    /// coding is unknown or the bytes are not valid for it.
    content: Option<Bytes>,
    /// The body arrived with a `Content-Encoding` foldgate decoded.
    decoded: bool,
}

impl ReceivedBody {
    /// A body read some other way, not encoded.
    pub fn identity(body: Bytes) -> Self {
        Self { content: Some(body.clone()), raw: body, decoded: false }
    }

    /// The body's content, when foldgate can read it.
    pub fn content(&self) -> Option<&Bytes> {
        self.content.as_ref()
    }

    /// What foldgate reads: the content when it can read it, else the bytes as
    /// received.
    pub fn readable(&self) -> &Bytes {
        self.content.as_ref().unwrap_or(&self.raw)
    }

    /// The bytes as received.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The bytes to send for `body` (the content to forward) and the headers that go
    /// with them: the body as received, headers unchanged, when `body` is the decoded
    /// content unchanged; else `body` identity-encoded, `Content-Encoding` removed.
    /// (`Content-Length` is set by the sender.)
    pub fn outgoing(&self, body: Bytes, headers: &mut HeaderMap) -> Bytes {
        match &self.content {
            Some(content) if self.decoded => {
                if body == content {
                    return self.raw.clone();
                }
                headers.remove(CONTENT_ENCODING);
                body
            }
            _ => body,
        }
    }
}

/// Reads the body of a request with `headers`, which grows past `limit` is refused
/// (a declared length over it was refused before any handler), and decodes a compressed
/// body with its output bounded by `limit` (413 past it); also how its coding was read.
pub async fn read(
    body: ClientBody,
    limit: u64,
    headers: &HeaderMap,
    progress: Arc<BodyProgress>,
) -> (Result<ReceivedBody, ProxyError>, Option<CodingRead>) {
    let raw = match read_limited(body, limit, progress).await {
        Ok(raw) => raw,
        Err(error) => return (Err(error.into()), None),
    };
    let codings = match content_coding::encoding(headers) {
        Encoding::Identity => {
            return (Ok(ReceivedBody { content: Some(raw.clone()), raw, decoded: false }), None);
        }
        Encoding::Unknown(token) => {
            tracing::debug!(encoding = %token, "unknown Content-Encoding: forwarded as received");
            let read = Some((None, DecodeResult::Unreadable));
            return (Ok(ReceivedBody { raw, content: None, decoded: false }), read);
        }
        Encoding::Coded(codings) => codings,
    };
    let label = codings.last().copied();
    match content_coding::decode(&raw, &codings, limit) {
        Ok(decoded) => {
            let body = ReceivedBody { raw, content: Some(Bytes::from(decoded)), decoded: true };
            (Ok(body), Some((label, DecodeResult::Decoded)))
        }
        Err(DecodeError::TooLarge { limit }) => {
            (Err(ProxyError::DecodedBodyTooLarge { limit }), Some((label, DecodeResult::TooLarge)))
        }
        Err(e @ DecodeError::Invalid { .. }) => {
            tracing::debug!(error = %e, "undecodable request body: forwarded as received");
            let body = ReceivedBody { raw, content: None, decoded: false };
            (Ok(body), Some((label, DecodeResult::Unreadable)))
        }
    }
}
