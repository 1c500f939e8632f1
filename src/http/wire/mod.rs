//! HTTP/1.1 exchanges with the upstream, run in the request's own task: the request is
//! written (head and body in one write when the body is whole), the response head read,
//! and the response body read from the socket as the client's side polls it.
//!
//! hyper's client runs a connection task beside the request and passes the request, the
//! response and every body frame between the two through channels, waking one task
//! from the other at each step; nginx, and this module, do the same work in one place.
//! HTTP/2 upstreams keep hyper's client (`super::connections`).

pub mod codec;
pub mod inbound;
mod outgoing;
pub mod server;

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use self::codec::{Decoded, Decoder, Sending, WireError};
use self::outgoing::{LengthMismatch, Outgoing};
use super::body::{BoxError, ProxyBody, prefixed};

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The upstream's answer is not valid HTTP/1.1, or ended early.
    #[error(transparent)]
    Message(#[from] WireError),
    /// Reading or writing the connection failed.
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The request body failed while it was read (the client's stream, or its limit).
    #[error("request body: {0}")]
    Body(BoxError),
    /// The request body's length differs from its `Content-Length`.
    #[error("request body length differs from its content-length")]
    BodyLength,
}

impl From<LengthMismatch> for Error {
    fn from(_: LengthMismatch) -> Self {
        Self::BodyLength
    }
}

/// A request for the upstream, boxed: it passes from the exchange through the deadline
/// and the pool to a connection as a pointer, not as its few hundred bytes.
pub type UpstreamRequest = Box<Request<ProxyBody>>;

/// A failed exchange; `unsent` is the request when not one byte of it was written, so
/// that it can go out on another connection.
pub struct Failed {
    /// What went wrong.
    pub error: Error,
    /// The request, whole, when none of it reached the connection.
    pub unsent: Option<UpstreamRequest>,
}

/// One HTTP/1.1 connection to the upstream, between exchanges.
pub struct Connection<T> {
    io: T,
    /// Bytes read past the last response; none while the connection is idle.
    buf: BytesMut,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// A connection over `io`, open and idle.
    pub fn new(io: T) -> Self {
        Self { io, buf: BytesMut::new() }
    }

    /// Still usable: nothing arrived while it was idle (a close, or bytes no request
    /// asked for). Looks without waiting, and without a system call unless the event
    /// loop saw the socket become readable.
    pub fn is_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io).poll_read(&mut cx, &mut probe).is_pending()
    }

    /// Writes `request` (its URI in origin form, its headers final) and reads the
    /// response head; the body is read as it is polled.
    pub async fn send(
        mut self,
        request: UpstreamRequest,
    ) -> Result<Response<ResponseBody<T>>, Failed> {
        let (mut parts, mut body) = request.into_parts();
        let (framing, length) = codec::request_framing(
            &parts.method,
            &mut parts.headers,
            body.is_end_stream(),
            body.size_hint().exact(),
        );
        let mut head = Vec::with_capacity(256 + parts.headers.len() * 48);
        codec::encode_head(&parts.method, &parts.uri, &parts.headers, length, &mut head);

        // The first frame goes out with the head.
        let mut first = Bytes::new();
        let mut trailers = None;
        let mut ended = framing == Sending::Length(0);
        if !ended {
            match body.frame().await {
                None => ended = true,
                Some(Err(e)) => return Err(Failed { error: Error::Body(e), unsent: None }),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => first = data,
                    Err(frame) => {
                        trailers = frame.into_trailers().ok();
                        ended = true;
                    }
                },
            }
            ended |= body.is_end_stream();
        }
        let mut out = Outgoing::new(framing, Bytes::from(head));
        let queued = out.data(first.clone()).and_then(|()| match ended {
            true => out.end(trailers),
            false => Ok(()),
        });
        if let Err(error) = queued {
            return Err(Failed { error: error.into(), unsent: None });
        }

        let early = poll_fn(|cx| self.poll_write(&mut out, &mut body, &parts.method, cx)).await;
        let early = match early {
            Ok(early) => early,
            Err(error) => {
                // Not a byte written: the request can go out on another connection.
                let unsent = (!out.written).then(|| {
                    let rest = if ended { super::body::full(first) } else { prefixed(first, body) };
                    // The length stated in the head goes with it, as a header.
                    if let Some(length) = length {
                        parts
                            .headers
                            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(length));
                    }
                    Box::new(Request::from_parts(parts, rest))
                });
                return Err(Failed { error, unsent });
            }
        };
        let failed = |error: Error| Failed { error, unsent: None };
        let head = match early {
            // Answered before the request's end (an error, usually): the rest of the
            // request is not sent, and the connection cannot carry another one.
            Some(mut head) => {
                head.keep_alive = false;
                head
            }
            None => {
                self.io.flush().await.map_err(|e| failed(e.into()))?;
                loop {
                    if let Some(head) = codec::parse_head(&mut self.buf, &parts.method)
                        .map_err(|e| failed(e.into()))?
                    {
                        break head;
                    }
                    self.buf.reserve(READ_SIZE);
                    let read =
                        self.io.read_buf(&mut self.buf).await.map_err(|e| failed(e.into()))?;
                    if read == 0 {
                        return Err(failed(WireError::Incomplete.into()));
                    }
                }
            }
        };
        let decoder = Decoder::new(head.framing);
        let body = ResponseBody { conn: Some(self), decoder, keep_alive: head.keep_alive };
        Ok(head.response.map(|()| body))
    }

    /// Writes the queued bytes and the rest of `body`, watching for an answer that
    /// comes before the request's end; `Ok(None)` once the whole request is written.
    fn poll_write(
        &mut self,
        out: &mut Outgoing,
        body: &mut ProxyBody,
        method: &Method,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<codec::Head>, Error>> {
        loop {
            // Nothing can answer a request of which no byte went out.
            if out.written {
                self.buf.reserve(READ_SIZE);
                match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf) {
                    Poll::Ready(Ok(read)) => {
                        if let Some(head) = codec::parse_head(&mut self.buf, method)? {
                            return Poll::Ready(Ok(Some(head)));
                        }
                        if read == 0 {
                            return Poll::Ready(Err(WireError::Incomplete.into()));
                        }
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {}
                }
            }
            if !out.is_empty() {
                let mut slices = [io::IoSlice::new(&[]); 8];
                let count = out.slices(&mut slices);
                match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                    }
                    Poll::Ready(Ok(written)) => {
                        out.advance(written);
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if out.ended {
                return Poll::Ready(Ok(None));
            }
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => out.end(None)?,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Error::Body(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        out.data(data)?;
                        if body.is_end_stream() {
                            out.end(None)?;
                        }
                    }
                    Err(frame) => out.end(frame.into_trailers().ok())?,
                },
            }
        }
    }
}

/// A response body read from its connection as it is polled; the connection can be
/// taken back for another exchange once the body has ended ([`ResponseBody::reusable`]).
pub struct ResponseBody<T> {
    conn: Option<Connection<T>>,
    decoder: Decoder,
    keep_alive: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ResponseBody<T> {
    /// The connection, once the body has ended and the connection may carry another
    /// exchange; the body then reports its end.
    pub fn reusable(&mut self) -> Option<Connection<T>> {
        let clean = self.conn.as_ref().is_some_and(|c| c.buf.is_empty());
        if self.decoder.is_done() && self.keep_alive && clean { self.conn.take() } else { None }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Body for ResponseBody<T> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            let decoded = match this.decoder.decode(&mut conn.buf) {
                Ok(Decoded::More) => {
                    conn.buf.reserve(READ_SIZE);
                    let read =
                        tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf);
                    match read {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(0)) => this.decoder.closed(),
                        Poll::Ready(Ok(_)) => continue,
                        Poll::Ready(Err(e)) => {
                            this.conn = None;
                            return Poll::Ready(Some(Err(e.into())));
                        }
                    }
                }
                decoded => decoded,
            };
            return match decoded {
                Ok(Decoded::Data(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::Trailers(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                Ok(Decoded::End) => {
                    if !this.keep_alive || !conn.buf.is_empty() {
                        this.conn = None;
                    }
                    Poll::Ready(None)
                }
                Ok(Decoded::More) => continue,
                Err(e) => {
                    this.conn = None;
                    Poll::Ready(Some(Err(e.into())))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
