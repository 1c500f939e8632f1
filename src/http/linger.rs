//! Lingering close. When foldgate answers before it read the request body to its end (a
//! 413, a 404, an upstream that answered early), the client is often still sending, and
//! most clients read nothing before their upload is done. Closing then makes the kernel
//! reset the connection and the client reports a connection error, not the answer. So,
//! like nginx, such a connection is closed in two steps: the answer, then our FIN; then
//! what the client still sends is read and discarded, for a bounded time and size.
//!
//! [`UnreadBody`] marks such a response (the router sets it), [`Linger`] (one per
//! connection) sees the mark, adds `Connection: close` and arms the connection's
//! [`LingerFlag`], and [`LingerIo`] does the draining when hyper shuts the connection down.
//! An ordinary connection pays for its flag (one allocation) and a look at it when it
//! closes; an ordinary request, a look at its response's extensions.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::header::{CONNECTION, HeaderValue};
use http::{Request, Response, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a lingering close reads at most: long enough for a client on a fast link to
/// finish an upload a little over the limit, short enough that a client that sends
/// forever holds its connection only briefly. (nginx waits up to 5 s for each further
/// read, `lingering_timeout`, and 30 s in all; one bound is simpler and cheaper.)
pub const LINGER_TIME: Duration = Duration::from_secs(5);

/// How many bytes beyond `server.max_body_size` a lingering close reads at most: a body
/// of up to 4 MiB over the limit is drained whole, so its client reads the 413.
pub const LINGER_SLACK: u64 = 4 * 1024 * 1024;

/// Drained bytes are read into a buffer of this size (allocated only when draining).
const DRAIN_CHUNK: usize = 64 * 1024;

/// Response extension: the response goes out while the request body was not read to its
/// end, so the connection must close, lingering.
#[derive(Debug, Clone, Copy)]
pub struct UnreadBody;

/// One connection's switch to a lingering close, shared by its [`Linger`] service and its
/// [`LingerIo`].
#[derive(Debug, Clone, Default)]
pub struct LingerFlag(Arc<AtomicBool>);

impl LingerFlag {
    /// Makes the connection's close linger.
    pub fn arm(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the connection's close lingers.
    pub fn is_armed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Arms its connection's [`LingerFlag`] on an HTTP/1 response marked [`UnreadBody`] and
/// adds `Connection: close` to it (hyper closes such a connection anyway, but does not
/// always say so in the response).
#[derive(Debug, Clone)]
pub struct Linger<S> {
    inner: S,
    flag: LingerFlag,
}

impl<S> Linger<S> {
    /// Wraps `inner`, one connection's service, arming `flag`.
    pub fn new(inner: S, flag: LingerFlag) -> Self {
        Self { inner, flag }
    }
}

impl<S, B, R> tower::Service<Request<B>> for Linger<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // HTTP/2 ends a stream on its own (RST_STREAM) and keeps the connection.
        let http1 = request.version() <= Version::HTTP_11;
        ResponseFuture { inner: self.inner.call(request), flag: http1.then(|| self.flag.clone()) }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`Linger`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        flag: Option<LingerFlag>,
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if response.extensions().get::<UnreadBody>().is_some() {
            if let Some(flag) = this.flag.take() {
                flag.arm();
                response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
        }
        Poll::Ready(Ok(response))
    }
}

/// A connection's IO: plain delegation, except that once its [`LingerFlag`] is armed,
/// shutting it down sends FIN, then reads and discards until EOF, an error,
/// [`LINGER_TIME`] or `max_drain` bytes, whichever comes first.
#[derive(Debug)]
pub struct LingerIo<T> {
    inner: T,
    flag: LingerFlag,
    max_drain: u64,
    drain: Option<Box<Drain>>,
}

impl<T> LingerIo<T> {
    /// Wraps `inner`; an armed close reads at most `max_drain` bytes.
    pub fn new(inner: T, flag: LingerFlag, max_drain: u64) -> Self {
        Self { inner, flag, max_drain, drain: None }
    }
}

/// A lingering close under way.
#[derive(Debug)]
struct Drain {
    deadline: Pin<Box<tokio::time::Sleep>>,
    left: u64,
    buf: Vec<u8>,
    write_closed: bool,
    done: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> LingerIo<T> {
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let max_drain = self.max_drain;
        let drain = self.drain.get_or_insert_with(|| {
            Box::new(Drain {
                deadline: Box::pin(tokio::time::sleep(LINGER_TIME)),
                left: max_drain,
                buf: vec![0; DRAIN_CHUNK],
                write_closed: false,
                done: false,
            })
        });
        if drain.done {
            return Poll::Ready(Ok(()));
        }
        if !drain.write_closed {
            // The answer is flushed: FIN tells the client there is nothing more to read.
            ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            drain.write_closed = true;
        }
        if drain.deadline.as_mut().poll(cx).is_ready() {
            drain.done = true;
            return Poll::Ready(Ok(()));
        }
        while drain.left > 0 {
            let room = usize::try_from(drain.left).unwrap_or(usize::MAX).min(drain.buf.len());
            let mut buf = ReadBuf::new(&mut drain.buf[..room]);
            match ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => drain.left -= buf.filled().len() as u64,
                // EOF: the client is done and has read what it wanted; or it is gone.
                Ok(()) | Err(_) => break,
            }
        }
        drain.done = true;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LingerIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LingerIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.flag.is_armed() {
            self.poll_linger(cx)
        } else {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    fn armed(flag: bool) -> LingerFlag {
        let linger = LingerFlag::default();
        if flag {
            linger.arm();
        }
        linger
    }

    #[tokio::test]
    async fn unarmed_shutdown_is_a_plain_shutdown() {
        let (ours, mut client) = duplex(1024);
        let mut io = LingerIo::new(ours, armed(false), 1024);
        // The client neither sends nor closes: an armed close would wait.
        io.shutdown().await.unwrap();
        assert_eq!(client.read(&mut [0; 8]).await.unwrap(), 0, "FIN sent");
    }

    #[tokio::test]
    async fn armed_shutdown_sends_fin_then_reads_until_eof() {
        let (ours, mut client) = duplex(1024);
        let mut io = LingerIo::new(ours, armed(true), 1024);
        client.write_all(b"rest of the upload").await.unwrap();
        let closing = tokio::spawn(async move { io.shutdown().await });
        assert_eq!(client.read(&mut [0; 8]).await.unwrap(), 0, "FIN before draining");
        client.shutdown().await.unwrap();
        closing.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn armed_shutdown_stops_at_the_byte_bound() {
        let (ours, mut client) = duplex(1024);
        let mut io = LingerIo::new(ours, armed(true), 16);
        client.write_all(&[b'x'; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        io.shutdown().await.unwrap();
        assert!(started.elapsed() < LINGER_TIME, "ended by the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn armed_shutdown_stops_at_the_deadline() {
        let (ours, _client) = duplex(1024);
        let mut io = LingerIo::new(ours, armed(true), 1024);
        let started = tokio::time::Instant::now();
        io.shutdown().await.unwrap();
        assert_eq!(started.elapsed(), LINGER_TIME);
    }
}
