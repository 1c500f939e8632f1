//! Answers changed on their way to the client, for a providers' compaction API foldgate
//! served on a request the upstream answered: a Responses answer gets the compaction
//! item, an Anthropic one its compaction block, applied edits and iterations. The change
//! is made by a [`Rewrite`] fed the body's bytes as they arrive (an event stream), or
//! the whole body (JSON), never touching an error answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http_body::{Body, Frame, SizeHint};

use crate::http::body::{BoxError, ProxyBody, boxed};

/// Rewrites a body from its bytes as they arrive.
pub trait Rewrite: Send + Unpin + 'static {
    /// The bytes to send for `chunk` (possibly none yet, possibly more than it).
    fn push(&mut self, chunk: &[u8]) -> Vec<u8>;
    /// The bytes still to send at the body's end.
    fn finish(&mut self) -> Vec<u8>;
}

/// A JSON answer rewritten whole, by `F`, at its end (unchanged when `F` gives `None`),
/// never holding more than `limit` bytes (past it, the answer goes on unchanged).
pub struct WholeJson<F> {
    held: Vec<u8>,
    change: Option<F>,
    limit: usize,
}

impl<F: FnOnce(&[u8]) -> Option<Vec<u8>>> WholeJson<F> {
    /// Rewrites a whole JSON answer with `change`.
    pub fn new(change: F, limit: usize) -> Self {
        Self { held: Vec::new(), change: Some(change), limit }
    }
}

impl<F> Rewrite for WholeJson<F>
where
    F: FnOnce(&[u8]) -> Option<Vec<u8>> + Send + Unpin + 'static,
{
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.change.is_none() {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        if self.held.len() > self.limit {
            self.change = None;
            return std::mem::take(&mut self.held);
        }
        Vec::new()
    }

    fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        match self.change.take() {
            Some(change) => change(&held).unwrap_or(held),
            None => held,
        }
    }
}

/// `inner` rewritten by `R`.
struct Rewritten<R> {
    inner: ProxyBody,
    rewrite: R,
    ended: bool,
}

impl<R: Rewrite> Body for Rewritten<R> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        while !this.ended {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.rewrite.push(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.ended = true;
                    let out = this.rewrite.finish();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What kind of body an answer has, for choosing its rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// A JSON document.
    Json,
    /// A server-sent event stream.
    Events,
}

impl Rewrite for crate::api::responses_output::OutputItemInjector {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.push(chunk)
    }

    fn finish(&mut self) -> Vec<u8> {
        self.finish()
    }
}

impl Rewrite for crate::api::anthropic_edits::CompactionInjector {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.push(chunk)
    }

    fn finish(&mut self) -> Vec<u8> {
        self.finish()
    }
}

impl Rewrite for Box<dyn Rewrite> {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        (**self).push(chunk)
    }

    fn finish(&mut self) -> Vec<u8> {
        (**self).finish()
    }
}

/// `response` with its body rewritten by the rewrite `choose` picks for its kind; a
/// response that is not a success, is compressed, or is neither JSON nor an event
/// stream, goes unchanged.
pub fn rewrite(
    response: Response<ProxyBody>,
    choose: impl FnOnce(AnswerKind) -> Option<Box<dyn Rewrite>>,
) -> Response<ProxyBody> {
    let headers = response.headers();
    if !response.status().is_success() || headers.contains_key(CONTENT_ENCODING) {
        return response;
    }
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let kind = if content_type.starts_with("text/event-stream") {
        AnswerKind::Events
    } else if content_type.starts_with("application/json") {
        AnswerKind::Json
    } else {
        return response;
    };
    let Some(rewrite) = choose(kind) else { return response };
    let (mut parts, inner) = response.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(parts, boxed(Rewritten { inner, rewrite, ended: false }))
}

/// An answer foldgate gives itself: `body`, an event stream when `events`, else JSON.
pub fn local(body: Vec<u8>, events: bool) -> Response<ProxyBody> {
    let content_type = if events { "text/event-stream" } else { "application/json" };
    let mut response = Response::new(crate::http::body::full(body));
    response.headers_mut().insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}
