//! Reading an upstream's answer as far as it takes to tell whether it reports a context
//! overflow, before any byte of it reaches the client, so that the handler can retry:
//!
//! - an error status that [may be an overflow](OverflowSignals::may_overflow): its body, whole;
//! - for an API whose providers report overflows inside a 200 event stream (the
//!   Responses API: `response.created`, `response.in_progress`, then `response.failed`
//!   with `context_length_exceeded`): the stream's leading events, held while they tell
//!   nothing ([`StreamEvent::Leading`]), up to and including the first that does. Those
//!   few events reach the client late, with that first event, not as they came.
//!
//! - for an API whose successful JSON answers may tell of an overflow (Anthropic's
//!   `stop_reason: "model_context_window_exceeded"`): the answer, whole.
//!
//! Both reads stop at [`OVERFLOW_PEEK_LIMIT`] bytes. An answer that stands (not an
//! overflow, over the limit, ended or failed while read) reaches the client unchanged:
//! every byte read, in order, then the rest as it comes.

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap};
use http::{Response, StatusCode};

use super::body::{ProxyBody, full, hold, peek};
use super::dialect::{OverflowSignals, StreamEvent};
use super::sse::Events;

/// Error bodies, and the leading events of a stream, larger than this are passed through
/// without looking for an overflow.
const OVERFLOW_PEEK_LIMIT: usize = 256 * 1024;

/// An answer read as far as it tells whether it reports an overflow.
pub struct Read {
    /// The answer for the client, should it stand: unchanged.
    pub response: Response<ProxyBody>,
    /// The error it reports, to be judged an overflow or not (see
    /// [`Dialect::is_overflow`]); `None` when it reports none.
    pub error: Option<Bytes>,
}

/// Reads `response` (the first answer to a request whose providers report overflows as
/// `signals` says) as far as it tells whether it may report an overflow. A stream is held only when the request
/// could be retried (`retryable`): an error body is read either way, as the window it
/// states is learned even when the request cannot be sent again.
pub async fn read<O: OverflowSignals>(
    signals: &O,
    response: Response<ProxyBody>,
    retryable: bool,
) -> Read {
    let status = response.status();
    if signals.may_overflow(status) {
        return error_body(response).await;
    }
    if retryable && status == StatusCode::OK && signals.overflows_in_answer() {
        let json = response
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.to_str().is_ok_and(|v| v.starts_with("application/json")));
        if json {
            return error_body(response).await;
        }
    }
    let stream = status == StatusCode::OK && signals.overflows_in_stream();
    if retryable && stream && is_events(response.headers()) {
        return leading_events(signals, response).await;
    }
    Read { response, error: None }
}

/// An error answer's body, whole when it is within the limit.
async fn error_body(response: Response<ProxyBody>) -> Read {
    let (head, body) = response.into_parts();
    match peek(body, OVERFLOW_PEEK_LIMIT).await {
        Ok(bytes) => {
            Read { response: Response::from_parts(head, full(bytes.clone())), error: Some(bytes) }
        }
        Err(replay) => Read { response: Response::from_parts(head, replay), error: None },
    }
}

/// A plain (not compressed) event stream.
fn is_events(headers: &HeaderMap) -> bool {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    content_type.is_some_and(|t| t.starts_with("text/event-stream"))
        && !headers.contains_key(CONTENT_ENCODING)
}

/// A stream's events up to the first that is not [`StreamEvent::Leading`]: the error it
/// reports when it is a failure.
async fn leading_events<O: OverflowSignals>(signals: &O, response: Response<ProxyBody>) -> Read {
    let (head, body) = response.into_parts();
    let mut events = Events::default();
    let mut told = None;
    let held = hold(body, OVERFLOW_PEEK_LIMIT, |read| {
        while let Some(event) = events.next(read) {
            match signals.stream_event(&event) {
                StreamEvent::Leading => {}
                telling => {
                    told = Some(telling);
                    return true;
                }
            }
        }
        false
    })
    .await;
    let error = match told {
        Some(StreamEvent::Failed(error)) => Some(Bytes::from(error)),
        _ => None,
    };
    Read { response: Response::from_parts(head, held.replay()), error }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::BoxError;
    use crate::http::dialect::overflow::OpenAiOverflow;
    use crate::http::dialect::responses::ResponsesOverflow;
    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::BodyExt;

    /// Every byte the client would get of `read`'s answer.
    async fn bytes_of(read: Read) -> Bytes {
        read.response.into_body().collect().await.unwrap().to_bytes()
    }

    const CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\",\"usage\":null}}\n\n";
    const IN_PROGRESS: &str = ": ping\n\nevent: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"status\":\"in_progress\"}}\n\n";
    const FAILED: &str = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model.\"}}}\n\n";
    const DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ok\"}\n\n";

    /// A 200 event stream of `chunks`, each a frame of its own.
    fn stream(chunks: &[&str]) -> Response<ProxyBody> {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            chunks.iter().map(|c| Ok(Frame::data(Bytes::from(c.to_string())))).collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let mut response = Response::new(body.boxed_unsync());
        response.headers_mut().insert(CONTENT_TYPE, "text/event-stream".parse().unwrap());
        response
    }

    #[tokio::test]
    async fn a_failed_stream_reports_its_error_and_is_kept_whole() {
        let chunks = [CREATED, &IN_PROGRESS[..20], &IN_PROGRESS[20..], FAILED];
        let read = read(&ResponsesOverflow, stream(&chunks), true).await;
        let error = read.error.clone().unwrap();
        assert!(ResponsesOverflow.is_overflow(&error), "{}", String::from_utf8_lossy(&error));
        assert_eq!(bytes_of(read).await, chunks.concat());
    }

    #[tokio::test]
    async fn a_stream_under_way_reports_nothing_and_passes_unchanged() {
        let chunks = [CREATED, IN_PROGRESS, DELTA, FAILED];
        let read = read(&ResponsesOverflow, stream(&chunks), true).await;
        assert_eq!(read.error, None);
        assert_eq!(bytes_of(read).await, chunks.concat());
        // Other dialects never hold a stream.
        let read = super::read(&OpenAiOverflow, stream(&[CREATED, FAILED]), true).await;
        assert_eq!(read.error, None);
        // Nor is the stream of a request that cannot be retried.
        let read = super::read(&ResponsesOverflow, stream(&[CREATED, FAILED]), false).await;
        assert_eq!(read.error, None);
    }

    #[tokio::test]
    async fn leading_events_are_held_only_up_to_the_limit() {
        let padding = format!(": {}\n\n", "x".repeat(OVERFLOW_PEEK_LIMIT));
        let chunks = [CREATED, padding.as_str(), FAILED];
        let read = read(&ResponsesOverflow, stream(&chunks), true).await;
        assert_eq!(read.error, None, "the failure came after the limit");
        assert_eq!(bytes_of(read).await, chunks.concat());
    }
}
