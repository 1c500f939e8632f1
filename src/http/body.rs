//! Body types: the boxed body every response uses, a request body with a size limit that
//! records how far it was read, and reading the first bytes of an answer to look at them
//! before the client gets them, unchanged, in front of the rest ([`peek`], [`hold`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

/// Error type of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response foldgate sends: streamed, type-erased.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// Boxes any streamed body into a [`ProxyBody`].
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// How a watched body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Every byte went through.
    Complete,
    /// The stream failed.
    Failed,
    /// Dropped before its end: the client went away or the stream was cut.
    Dropped,
}

/// Sees a response body's data as it passes, and its end, once.
pub trait BodyObserver: Send + Unpin + 'static {
    /// A data frame passed.
    fn data(&mut self, _data: &Bytes) {}
    /// The body ended; called exactly once, where the body ends (at its last poll, or
    /// when the connection drops it), before its last bytes are flushed: it must never wait. A
    /// task spawned for it instead would cost more CPU than the few microseconds it
    /// takes (reading the usage, the metrics, the access line).
    fn end(&mut self, how: BodyEnd);
}

/// A body watched by `O` without a byte changed or delayed.
pub struct Observed<O: BodyObserver> {
    inner: ProxyBody,
    observer: Option<O>,
}

impl<O: BodyObserver> Observed<O> {
    /// Wraps `inner`, reporting to `observer`.
    pub fn new(inner: ProxyBody, observer: O) -> Self {
        Self { inner, observer: Some(observer) }
    }

    fn end(&mut self, how: BodyEnd) {
        if let Some(mut observer) = self.observer.take() {
            observer.end(how);
        }
    }
}

impl<O: BodyObserver> Body for Observed<O> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(observer)) = (frame.data_ref(), self.observer.as_mut()) {
                    observer.data(data);
                }
            }
            Poll::Ready(Some(Err(_))) => self.end(BodyEnd::Failed),
            Poll::Ready(None) => self.end(BodyEnd::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<O: BodyObserver> Drop for Observed<O> {
    fn drop(&mut self) {
        // hyper stops polling once a body reports its end (content-length reached).
        let how = if self.inner.is_end_stream() { BodyEnd::Complete } else { BodyEnd::Dropped };
        self.end(how);
    }
}

/// The request body grew past the configured limit.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {limit} bytes")]
pub struct BodyTooLarge {
    /// The limit in bytes.
    pub limit: u64,
}

/// How far a request body got, shared by the [`Limited`] reading it and whoever answers
/// the request: read to its end, or cut at the limit.
#[derive(Debug, Default)]
pub struct BodyProgress {
    ended: AtomicBool,
    exceeded: AtomicBool,
}

impl BodyProgress {
    /// Every byte of the body was read.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The body grew past the limit (a limit failure, not an upstream one).
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Acquire)
    }
}

pin_project_lite::pin_project! {
    /// Streams a body through while counting; fails once more than `limit` bytes passed.
    /// Records in a [`BodyProgress`] whether the body ended or went over.
    pub struct Limited<B> {
        #[pin]
        inner: B,
        remaining: u64,
        limit: u64,
        progress: Arc<BodyProgress>,
    }
}

impl<B> Limited<B> {
    /// Wraps `inner`, allowing at most `limit` bytes.
    pub fn new(inner: B, limit: u64, progress: Arc<BodyProgress>) -> Self {
        Self { inner, remaining: limit, limit, progress }
    }
}

impl<B> Body for Limited<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > *this.remaining {
                        this.progress.exceeded.store(true, Ordering::Release);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge {
                            limit: *this.limit,
                        }))));
                    }
                    *this.remaining -= len;
                }
                // A reader that knows the length stops polling after the last frame.
                if this.inner.is_end_stream() {
                    this.progress.ended.store(true, Ordering::Release);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.progress.ended.store(true, Ordering::Release);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads a whole request body of at most `limit` bytes, recording in `progress`.
pub async fn read_limited<B>(
    body: B,
    limit: u64,
    progress: Arc<BodyProgress>,
) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(Limited::new(body, limit, progress.clone()));
    // Most bodies come as one frame: it is the body, not copied. Others are joined.
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    loop {
        let frame = match body.as_mut().frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(_)) if progress.exceeded() => return Err(ReadError::TooLarge { limit }),
            Some(Err(e)) => return Err(ReadError::Body(e.to_string())),
        };
        // Trailers are not part of the body's bytes.
        if let Ok(data) = frame.into_data() {
            match (&mut first, &mut joined) {
                (None, None) => first = Some(data),
                (Some(_), None) => {
                    let mut all = bytes::BytesMut::from(first.take().unwrap_or_default());
                    all.extend_from_slice(&data);
                    joined = Some(all);
                }
                (_, Some(all)) => all.extend_from_slice(&data),
            }
        }
        // A body that knows its end is not polled again to hear it.
        if body.is_end_stream() {
            break;
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), bytes::BytesMut::freeze))
}

/// Why a body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Over the limit.
    #[error("body exceeds {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The stream failed (e.g. the client went away).
    #[error("body could not be read: {0}")]
    Body(String),
}

/// Reads up to `limit` bytes of `body`. Returns the whole body when it ended within the
/// limit, else a body that replays what was read and streams the rest.
pub async fn peek<B>(body: B, limit: usize) -> Result<Bytes, ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let held = hold(body, limit, |_| false).await;
    // Trailers end the body; an error body with trailers is replayed as data.
    if held.ended { Ok(held.head) } else { Err(held.replay()) }
}

/// The first bytes of a body, read by [`hold`], and the rest of it.
pub struct Held {
    /// The bytes read, in order.
    pub head: Bytes,
    /// True when the body ended within them (trailers, if any, are in the rest).
    pub ended: bool,
    rest: ProxyBody,
}

impl Held {
    /// The whole body again, unchanged: the bytes read, then the rest as it comes (its
    /// trailers or its error included).
    pub fn replay(self) -> ProxyBody {
        prefixed(self.head, self.rest)
    }
}

/// Reads `body` frame by frame until `enough` (given every byte read so far, after each
/// frame) says it has what it needs, more than `limit` bytes were read, or the body ends
/// or fails. Nothing is lost: [`Held::replay`] gives the body back whole.
pub async fn hold<B, F>(mut body: B, limit: usize, mut enough: F) -> Held
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    F: FnMut(&[u8]) -> bool,
{
    let mut read = bytes::BytesMut::new();
    let (ended, rest) = loop {
        match body.frame().await {
            None => break (true, full(Bytes::new())),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    read.extend_from_slice(&data);
                    if enough(&read) || read.len() > limit {
                        break (false, boxed(body));
                    }
                }
                Err(trailers) => break (true, followed(trailers, body)),
            },
            Some(Err(e)) => {
                let failed = futures_util::stream::iter([Err::<Frame<Bytes>, _>(e.into())]);
                break (false, http_body_util::StreamBody::new(failed).boxed_unsync());
            }
        }
    };
    Held { head: read.freeze(), ended, rest }
}

/// `rest` after a frame already taken from it.
fn followed<B>(frame: Frame<Bytes>, rest: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    use futures_util::StreamExt;
    let first = futures_util::stream::once(async move { Ok::<_, BoxError>(frame) });
    let rest = http_body_util::BodyStream::new(rest.map_err(Into::into));
    http_body_util::StreamBody::new(first.chain(rest)).boxed_unsync()
}

/// `head` as a data frame in front of `rest` (nothing in front when it is empty).
/// `head`, then `rest` as it comes: a body whose first bytes were taken off it.
pub fn prefixed<B>(head: Bytes, rest: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    if head.is_empty() {
        return boxed(rest);
    }
    followed(Frame::data(head), rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limited_passes_small_bodies_and_flags_large_ones() {
        let progress = Arc::new(BodyProgress::default());
        let ok = Limited::new(Full::new(Bytes::from_static(b"abc")), 3, progress.clone());
        assert_eq!(ok.collect().await.unwrap().to_bytes(), "abc");
        assert!(progress.ended() && !progress.exceeded());

        let progress = Arc::new(BodyProgress::default());
        let too_big = Limited::new(Full::new(Bytes::from_static(b"abcd")), 3, progress.clone());
        assert!(too_big.collect().await.is_err());
        assert!(progress.exceeded() && !progress.ended());
    }

    #[tokio::test]
    async fn limited_records_the_end_without_a_final_poll() {
        // hyper stops polling a body of known length once it reports its end.
        let progress = Arc::new(BodyProgress::default());
        let mut body = Limited::new(Full::new(Bytes::from_static(b"abc")), 3, progress.clone());
        assert!(!progress.ended());
        body.frame().await.unwrap().unwrap();
        assert!(progress.ended());
    }

    #[tokio::test]
    async fn peek_returns_small_bodies_and_replays_large_ones() {
        let small = peek(Full::new(Bytes::from_static(b"small")), 10).await.unwrap();
        assert_eq!(small, "small");
        let chunks = futures_util::stream::iter(
            ["aaaa", "bbbb", "cccc", "dddd"]
                .map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c)))),
        );
        let large = peek(http_body_util::StreamBody::new(chunks), 6).await.unwrap_err();
        assert_eq!(large.collect().await.unwrap().to_bytes(), "aaaabbbbccccdddd");
    }

    fn frames(items: Vec<Result<Frame<Bytes>, BoxError>>) -> ProxyBody {
        http_body_util::StreamBody::new(futures_util::stream::iter(items)).boxed_unsync()
    }

    fn data(text: &'static str) -> Result<Frame<Bytes>, BoxError> {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    #[tokio::test]
    async fn hold_stops_when_it_has_enough_and_replays_every_byte() {
        let body = frames(vec![data("ab"), data("cd"), data("ef"), data("gh")]);
        let held = hold(body, 100, |read| read.ends_with(b"cd")).await;
        assert_eq!(held.head, "abcd");
        assert!(!held.ended);
        assert_eq!(held.replay().collect().await.unwrap().to_bytes(), "abcdefgh");

        let held = hold(frames(vec![data("ab"), data("cd")]), 100, |_| false).await;
        assert!(held.ended);
        assert_eq!(held.replay().collect().await.unwrap().to_bytes(), "abcd");
    }

    #[tokio::test]
    async fn hold_replays_trailers_and_errors_after_the_bytes_read() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-end", http::HeaderValue::from_static("1"));
        let body = frames(vec![data("ab"), Ok(Frame::trailers(trailers.clone()))]);
        let held = hold(body, 100, |_| false).await;
        assert!(held.ended);
        let collected = held.replay().collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "ab");

        let body = frames(vec![data("ab"), Err("cut".into())]);
        let held = hold(body, 100, |_| false).await;
        assert!(!held.ended);
        let mut replay = held.replay();
        let first = replay.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "ab");
        assert!(replay.frame().await.unwrap().is_err(), "the error comes after the bytes");
    }
}
